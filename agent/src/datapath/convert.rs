//! Converting a key or value from one layout to another, field by field
//! and by name: a field the new layout adds starts zeroed, a field it
//! drops is reported, padding (`_`-prefixed fields) is never copied. The
//! plan is computed once per map; applying it is a list of byte copies.

use super::btf::Layout;

/// Byte copies that turn a value of one layout into another.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// (source offset, destination offset, length).
    ops: Vec<(usize, usize, usize)>,
    pub src_size: usize,
    pub dst_size: usize,
    /// Source fields with no counterpart (or an incompatible one).
    pub dropped: Vec<String>,
    /// Destination fields nothing fills (they start zeroed).
    pub added: Vec<String>,
}

impl Plan {
    /// The plan from `from` to `to`.
    pub fn new(from: &Layout, to: &Layout) -> Self {
        let mut plan = Plan {
            src_size: from.size() as usize,
            dst_size: to.size() as usize,
            ..Plan::default()
        };
        plan.walk(from, 0, to, 0, "");
        plan.merge();
        plan
    }

    /// Plain bytes of equal size on both sides (layouts unknown).
    pub fn bytes(size: usize) -> Self {
        Plan {
            ops: vec![(0, 0, size)],
            src_size: size,
            dst_size: size,
            ..Plan::default()
        }
    }

    /// Whether the conversion is a plain copy.
    #[cfg(test)]
    pub fn is_identity(&self) -> bool {
        self.src_size == self.dst_size && self.ops == [(0, 0, self.src_size)]
    }

    fn walk(&mut self, from: &Layout, src: usize, to: &Layout, dst: usize, path: &str) {
        match (from, to) {
            (Layout::Struct { fields: a, .. }, Layout::Struct { fields: b, .. }) => {
                for f in b.iter().filter(|f| !f.name.starts_with('_')) {
                    let sub = join(path, &f.name);
                    match a.iter().find(|g| g.name == f.name) {
                        Some(g) => self.walk(
                            &g.layout,
                            src + g.offset as usize,
                            &f.layout,
                            dst + f.offset as usize,
                            &sub,
                        ),
                        None => self.added.push(sub),
                    }
                }
                for g in a.iter().filter(|g| !g.name.starts_with('_')) {
                    if !b.iter().any(|f| f.name == g.name) {
                        self.dropped.push(join(path, &g.name));
                    }
                }
            }
            (Layout::Array { elem: a, len: n }, Layout::Array { elem: b, len: m }) => {
                let (sa, sb) = (a.size() as usize, b.size() as usize);
                for i in 0..(*n).min(*m) as usize {
                    self.walk(a, src + i * sa, b, dst + i * sb, path);
                }
                if n > m {
                    self.dropped.push(format!("{path}[{m}..{n}]"));
                }
            }
            (Layout::Scalar { size: a }, Layout::Scalar { size: b }) if a <= b => {
                // Same width, or a widened little-endian integer.
                self.ops.push((src, dst, *a as usize));
            }
            (a, b) if a.size() == b.size() && a.render() == b.render() => {
                self.ops.push((src, dst, a.size() as usize));
            }
            _ => self.dropped.push(path.to_owned()),
        }
    }

    /// Coalesces adjacent copies.
    fn merge(&mut self) {
        let mut out: Vec<(usize, usize, usize)> = Vec::with_capacity(self.ops.len());
        for op in self.ops.drain(..) {
            match out.last_mut() {
                Some(last) if last.0 + last.2 == op.0 && last.1 + last.2 == op.1 => last.2 += op.2,
                _ => out.push(op),
            }
        }
        self.ops = out;
    }

    /// Writes the conversion of `src` into `dst` (which starts zeroed).
    pub fn apply(&self, src: &[u8], dst: &mut [u8]) {
        dst.fill(0);
        for &(s, d, n) in &self.ops {
            if let (Some(from), Some(to)) = (src.get(s..s + n), dst.get_mut(d..d + n)) {
                to.copy_from_slice(from);
            }
        }
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::btf::Field;

    fn scalar(size: u32) -> Layout {
        Layout::Scalar { size }
    }

    fn field(name: &str, offset: u32, layout: Layout) -> Field {
        Field {
            name: name.into(),
            offset,
            layout,
        }
    }

    fn bytes(len: u32) -> Layout {
        Layout::Array {
            elem: Box::new(scalar(1)),
            len,
        }
    }

    /// The 0.1.0 `Backend`: addr[16], port, family, state, svc_id.
    fn backend_v4() -> Layout {
        Layout::Struct {
            size: 24,
            fields: vec![
                field("addr", 0, bytes(16)),
                field("port", 16, scalar(2)),
                field("family", 18, scalar(1)),
                field("state", 19, scalar(1)),
                field("svc_id", 20, scalar(4)),
            ],
        }
    }

    /// The probe build's `Backend`: a u32 in front moves every field.
    fn backend_probe() -> Layout {
        Layout::Struct {
            size: 28,
            fields: vec![
                field("probe", 0, scalar(4)),
                field("addr", 4, bytes(16)),
                field("port", 20, scalar(2)),
                field("family", 22, scalar(1)),
                field("state", 23, scalar(1)),
                field("svc_id", 24, scalar(4)),
            ],
        }
    }

    fn sample_v4() -> Vec<u8> {
        let mut v = vec![0u8; 24];
        v[..4].copy_from_slice(&[10, 20, 0, 2]);
        v[16..18].copy_from_slice(&8080u16.to_le_bytes());
        v[18] = 4;
        v[19] = 2;
        v[20..24].copy_from_slice(&7u32.to_le_bytes());
        v
    }

    #[test]
    fn identical_layouts_are_one_copy() {
        let plan = Plan::new(&backend_v4(), &backend_v4());
        assert!(plan.is_identity());
        assert!(plan.dropped.is_empty() && plan.added.is_empty());
    }

    #[test]
    fn a_field_in_front_moves_the_others_and_back_again() {
        let up = Plan::new(&backend_v4(), &backend_probe());
        assert_eq!(up.added, vec!["probe".to_owned()]);
        assert!(up.dropped.is_empty());
        let mut probe = vec![0xffu8; 28];
        up.apply(&sample_v4(), &mut probe);
        assert_eq!(&probe[..4], &[0, 0, 0, 0], "new field starts zeroed");
        assert_eq!(&probe[4..8], &[10, 20, 0, 2]);
        assert_eq!(u16::from_le_bytes([probe[20], probe[21]]), 8080);
        assert_eq!((probe[22], probe[23]), (4, 2));
        assert_eq!(probe[24..28], 7u32.to_le_bytes());

        let down = Plan::new(&backend_probe(), &backend_v4());
        assert_eq!(down.dropped, vec!["probe".to_owned()]);
        let mut back = vec![0u8; 24];
        down.apply(&probe, &mut back);
        assert_eq!(back, sample_v4(), "a round trip loses nothing both know");
    }

    #[test]
    fn padding_is_not_copied_and_widening_keeps_the_value() {
        let from = Layout::Struct {
            size: 4,
            fields: vec![field("port", 0, scalar(2)), field("_pad", 2, bytes(2))],
        };
        let to = Layout::Struct {
            size: 8,
            fields: vec![field("port", 0, scalar(4)), field("_pad", 4, bytes(4))],
        };
        let plan = Plan::new(&from, &to);
        let mut out = vec![0u8; 8];
        plan.apply(&[0x90, 0x1f, 0xaa, 0xbb], &mut out);
        assert_eq!(out, [0x90, 0x1f, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn incompatible_fields_are_dropped_not_garbled() {
        let from = Layout::Struct {
            size: 8,
            fields: vec![field("a", 0, scalar(8))],
        };
        let to = Layout::Struct {
            size: 4,
            fields: vec![field("a", 0, bytes(4))],
        };
        let plan = Plan::new(&from, &to);
        assert_eq!(plan.dropped, vec!["a".to_owned()]);
        let mut out = vec![9u8; 4];
        plan.apply(&[1; 8], &mut out);
        assert_eq!(out, [0; 4]);
    }
}
