//! Just enough of a BTF reader to know what a map's key and value look
//! like: field names, offsets and sizes. Both sides of a migration are
//! read this way (the pinned map's BTF from the kernel, the new layout from
//! the embedded object), so an agent can convert maps written by a release
//! it has never seen, newer or older, field by field.
//!
//! Format: `include/uapi/linux/btf.h` (a header, a type section of
//! variable-length records, a string section; type ids start at 1).

use std::collections::HashMap;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("BTF blob too short or misaligned at byte {0}")]
    Truncated(usize),
    #[error("not BTF (magic {0:#06x})")]
    Magic(u16),
    #[error("unknown BTF kind {0}")]
    Kind(u32),
    #[error("BTF type id {0} does not exist")]
    NoType(u32),
    #[error("BTF type chain too deep at id {0}")]
    TooDeep(u32),
    #[error("no map `{0}` in the object's `.maps` section")]
    NoMap(String),
}

/// One parsed BTF type, reduced to what layouts need.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Type {
    Void,
    Int {
        size: u32,
    },
    Ptr {
        target: u32,
    },
    Array {
        elem: u32,
        len: u32,
    },
    Struct {
        size: u32,
        members: Vec<Member>,
    },
    Enum {
        size: u32,
    },
    /// Typedef, const, volatile, restrict, type tag: look through.
    Alias {
        target: u32,
    },
    Var {
        name: String,
        target: u32,
    },
    DataSec {
        name: String,
        vars: Vec<u32>,
    },
    /// Anything a map layout cannot contain (functions, forward decls).
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Member {
    name: String,
    ty: u32,
    bit_offset: u32,
}

/// A parsed BTF blob.
#[derive(Debug)]
pub struct Btf {
    types: Vec<Type>,
}

/// The shape of a key or value: what a migration copies field by field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Plain bytes (integers, enums, floats): copied when the size matches.
    Scalar {
        size: u32,
    },
    Array {
        elem: Box<Layout>,
        len: u32,
    },
    Struct {
        size: u32,
        fields: Vec<Field>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// Byte offset within the parent.
    pub offset: u32,
    pub layout: Layout,
}

impl Layout {
    pub fn size(&self) -> u32 {
        match self {
            Layout::Scalar { size } | Layout::Struct { size, .. } => *size,
            Layout::Array { elem, len } => elem.size() * len,
        }
    }

    /// A canonical one-line rendering: sizes, offsets and field names, no
    /// type names (a rename of a Rust type is not a layout change).
    pub fn render(&self) -> String {
        match self {
            Layout::Scalar { size } => format!("u{}", size * 8),
            Layout::Array { elem, len } => format!("[{};{len}]", elem.render()),
            Layout::Struct { size, fields } => {
                let fields: Vec<String> = fields
                    .iter()
                    .map(|f| format!("{}@{}:{}", f.name, f.offset, f.layout.render()))
                    .collect();
                format!("{{{}}}{size}", fields.join(","))
            }
        }
    }
}

/// Key and value layout of one map declared in an object's `.maps`
/// section, with its declared type and capacity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapDef {
    pub map_type: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub key: Layout,
    pub value: Layout,
}

const MAGIC: u16 = 0xeb9f;
const MAX_DEPTH: usize = 32;

struct Reader<'a> {
    data: &'a [u8],
}

impl Reader<'_> {
    fn u32(&self, at: usize) -> Result<u32, BtfError> {
        let b = self.data.get(at..at + 4).ok_or(BtfError::Truncated(at))?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&self, at: usize) -> String {
        let tail = self.data.get(at..).unwrap_or_default();
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        String::from_utf8_lossy(&tail[..end]).into_owned()
    }
}

impl Btf {
    /// Parses a little-endian BTF blob (the kernel's `BPF_OBJ_GET_INFO_BY_FD`
    /// output or an object's `.BTF` section).
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let r = Reader { data };
        let head = data.get(0..2).ok_or(BtfError::Truncated(0))?;
        let magic = u16::from_le_bytes([head[0], head[1]]);
        if magic != MAGIC {
            return Err(BtfError::Magic(magic));
        }
        let hdr_len = r.u32(4)? as usize;
        let type_off = r.u32(8)? as usize;
        let type_len = r.u32(12)? as usize;
        let str_off = r.u32(16)? as usize;
        let strings = hdr_len + str_off;
        let name = |off: u32| r.string(strings + off as usize);

        let mut types = vec![Type::Void];
        let mut at = hdr_len + type_off;
        let end = at + type_len;
        while at < end {
            let name_off = r.u32(at)?;
            let info = r.u32(at + 4)?;
            let size_or_type = r.u32(at + 8)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            at += 12;
            let ty = match kind {
                1 => {
                    at += 4;
                    Type::Int { size: size_or_type }
                }
                2 => Type::Ptr {
                    target: size_or_type,
                },
                3 => {
                    let t = Type::Array {
                        elem: r.u32(at)?,
                        len: r.u32(at + 8)?,
                    };
                    at += 12;
                    t
                }
                4 | 5 => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let raw = r.u32(at + 8)?;
                        members.push(Member {
                            name: name(r.u32(at)?),
                            ty: r.u32(at + 4)?,
                            bit_offset: if kind_flag { raw & 0xff_ffff } else { raw },
                        });
                        at += 12;
                    }
                    if kind == 4 {
                        Type::Struct {
                            size: size_or_type,
                            members,
                        }
                    } else {
                        // A union is copied as bytes.
                        Type::Int { size: size_or_type }
                    }
                }
                6 => {
                    at += 8 * vlen;
                    Type::Enum { size: size_or_type }
                }
                19 => {
                    at += 12 * vlen;
                    Type::Enum { size: size_or_type }
                }
                16 => Type::Int { size: size_or_type },
                8..=11 | 18 => Type::Alias {
                    target: size_or_type,
                },
                7 | 12 => Type::Other,
                13 => {
                    at += 8 * vlen;
                    Type::Other
                }
                14 => {
                    at += 4;
                    Type::Var {
                        name: name(name_off),
                        target: size_or_type,
                    }
                }
                15 => {
                    let mut vars = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        vars.push(r.u32(at)?);
                        at += 12;
                    }
                    Type::DataSec {
                        name: name(name_off),
                        vars,
                    }
                }
                17 => {
                    at += 4;
                    Type::Other
                }
                k => return Err(BtfError::Kind(k)),
            };
            types.push(ty);
        }
        Ok(Self { types })
    }

    fn get(&self, id: u32) -> Result<&Type, BtfError> {
        self.types.get(id as usize).ok_or(BtfError::NoType(id))
    }

    /// Follows typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Result<(u32, &Type), BtfError> {
        for _ in 0..MAX_DEPTH {
            match self.get(id)? {
                Type::Alias { target } => id = *target,
                t => return Ok((id, t)),
            }
        }
        Err(BtfError::TooDeep(id))
    }

    /// The layout of type `id`.
    pub fn layout(&self, id: u32) -> Result<Layout, BtfError> {
        self.layout_at(id, 0)
    }

    fn layout_at(&self, id: u32, depth: usize) -> Result<Layout, BtfError> {
        if depth > MAX_DEPTH {
            return Err(BtfError::TooDeep(id));
        }
        let (id, ty) = self.resolve(id)?;
        Ok(match ty {
            Type::Int { size } | Type::Enum { size } => Layout::Scalar { size: *size },
            Type::Ptr { .. } => Layout::Scalar { size: 8 },
            Type::Array { elem, len } => Layout::Array {
                elem: Box::new(self.layout_at(*elem, depth + 1)?),
                len: *len,
            },
            Type::Struct { size, members } => Layout::Struct {
                size: *size,
                fields: members
                    .iter()
                    .map(|m| {
                        Ok(Field {
                            name: m.name.clone(),
                            offset: m.bit_offset / 8,
                            layout: self.layout_at(m.ty, depth + 1)?,
                        })
                    })
                    .collect::<Result<_, BtfError>>()?,
            },
            Type::Void
            | Type::Alias { .. }
            | Type::Var { .. }
            | Type::DataSec { .. }
            | Type::Other => return Err(BtfError::NoType(id)),
        })
    }

    /// The maps an object declares in its `.maps` section (libbpf's BTF map
    /// convention, which aya-ebpf's `#[btf_map]` follows: a struct whose
    /// `type` and `max_entries` members point to arrays of that many
    /// elements and whose `key` and `value` members point to the types).
    pub fn object_maps(&self) -> Result<HashMap<String, MapDef>, BtfError> {
        let mut maps = HashMap::new();
        for ty in &self.types {
            let Type::DataSec { name, vars } = ty else {
                continue;
            };
            if name != ".maps" {
                continue;
            }
            for var in vars {
                let Type::Var { name, target } = self.get(*var)? else {
                    continue;
                };
                let (_, Type::Struct { members, .. }) = self.resolve(*target)? else {
                    continue;
                };
                let mut def = MapDef {
                    map_type: 0,
                    max_entries: 0,
                    map_flags: 0,
                    key: Layout::Scalar { size: 0 },
                    value: Layout::Scalar { size: 0 },
                };
                for m in members {
                    let (_, Type::Ptr { target }) = self.resolve(m.ty)? else {
                        continue;
                    };
                    match m.name.as_str() {
                        "type" | "max_entries" | "map_flags" => {
                            let (_, Type::Array { len, .. }) = self.resolve(*target)? else {
                                continue;
                            };
                            match m.name.as_str() {
                                "type" => def.map_type = *len,
                                "max_entries" => def.max_entries = *len,
                                _ => def.map_flags = *len,
                            }
                        }
                        "key" => def.key = self.layout(*target)?,
                        "value" => def.value = self.layout(*target)?,
                        _ => {}
                    }
                }
                maps.insert(name.clone(), def);
            }
        }
        Ok(maps)
    }
}

/// A BTF blob for tests: `types` are raw records after the header.
#[cfg(test)]
pub(crate) fn blob(types: &[u32], strings: &[u8]) -> Vec<u8> {
    let type_len = (types.len() * 4) as u32;
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&[1, 0]);
    for v in [24u32, 0, type_len, type_len, strings.len() as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for t in types {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(strings);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const INT: u32 = 1 << 24;
    const ARRAY: u32 = 3 << 24;
    const STRUCT: u32 = 4 << 24;
    const TYPEDEF: u32 = 8 << 24;

    /// struct { u32 a; u8 b[2]; typedef u16 c; } with strings "\0a\0b\0c\0t\0".
    fn sample() -> Vec<u8> {
        blob(
            &[
                // 1: u32
                0,
                INT,
                4,
                32, // 2: u8
                0,
                INT,
                1,
                8, // 3: u8[2]
                0,
                ARRAY,
                0,
                2,
                1,
                2, // 4: u16
                0,
                INT,
                2,
                16, // 5: typedef t = u16
                7,
                TYPEDEF,
                4, // 6: struct, 3 members
                0,
                STRUCT | 3,
                8,
                1,
                1,
                0,
                3,
                3,
                32,
                5,
                5,
                48,
            ],
            b"\0a\0b\0c\0t\0",
        )
    }

    #[test]
    fn parses_a_struct_with_arrays_and_typedefs() {
        let btf = Btf::parse(&sample()).unwrap();
        let layout = btf.layout(6).unwrap();
        assert_eq!(layout.size(), 8);
        assert_eq!(layout.render(), "{a@0:u32,b@4:[u8;2],c@6:u16}8");
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert_eq!(Btf::parse(&[1, 2]).unwrap_err(), BtfError::Magic(0x0201));
        assert!(Btf::parse(&[]).is_err());
        let mut bad = sample();
        bad.truncate(40);
        assert!(Btf::parse(&bad).is_err());
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.layout(99).unwrap_err(), BtfError::NoType(99));
    }
}
