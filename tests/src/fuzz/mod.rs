//! Fuzzing the datapath with `BPF_PROG_TEST_RUN`: generated and mutated
//! frames ([`gen`]) run through the loaded `sl_ingress` and `sl_egress`
//! (their IPv6 halves by tail call), with invariants checked after every
//! packet and every batch ([`Harness`]). See docs/fuzzing.md.

pub mod gen;
pub mod packet;
pub mod testrun;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    path::Path,
};

use anyhow::{Context, Result};
use sluice::datapath::Maps;
use sluice_common::{
    conntrack::CT_F_SNAT, Affinity4Key, Affinity6Key, Ct4Key, Ct6Key, CtEntry, CtKind, Stat,
};

use gen::{Known, Packet, Target};
use packet::{checksums_ok, forwardable, hex, layout, lenient_tuple, quoted_tuple, Tuple};
use testrun::{run_skb, run_xdp, Program};

/// TC verdicts sluice returns: `TC_ACT_UNSPEC` (carry on), `TC_ACT_SHOT`,
/// `TC_ACT_REDIRECT`.
pub const UNSPEC: u32 = u32::MAX;
pub const SHOT: u32 = 2;
pub const REDIRECT: u32 = 7;

/// XDP verdicts (`enum xdp_action`); `XDP_ABORTED` (0) is a program error.
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

/// Counters that must never move, whatever the input.
const NEVER: [Stat; 6] = [
    Stat::Dangling,
    Stat::TailCallFailed,
    Stat::NatFailed,
    Stat::RejectFailed,
    Stat::CtInsertFailed,
    // `sl_xdp` rewrote a frame it then could not send.
    Stat::XdpAborted,
];

/// Conntrack is emptied when it holds more entries than this, to keep
/// the per-batch comparison cheap.
const CT_LIMIT: usize = 3000;

/// A broken invariant, with the packet that broke it when one did.
#[derive(Debug)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
    pub packet: Option<Packet>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant '{}' broken: {}", self.invariant, self.detail)?;
        if let Some(p) = &self.packet {
            write!(
                f,
                "\n  packet ({}, {}, ifindex {}): {}",
                p.kind,
                if p.ingress { "ingress" } else { "egress" },
                p.ifindex,
                hex(&p.data)
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}

fn violation(invariant: &'static str, detail: String, packet: Option<&Packet>) -> anyhow::Error {
    Violation {
        invariant,
        detail,
        packet: packet.cloned(),
    }
    .into()
}

/// What a run did and checked.
#[derive(Debug, Default)]
pub struct Report {
    pub packets: u64,
    pub ingress: u64,
    pub egress: u64,
    /// Frames run through `sl_xdp` (arriving on a device it is attached
    /// to); those it passed went on to `sl_ingress`.
    pub xdp: u64,
    pub batches: u64,
    pub verdicts: BTreeMap<&'static str, u64>,
    pub xdp_verdicts: BTreeMap<&'static str, u64>,
    pub modified: u64,
    /// Invariant name -> how many times it was checked.
    pub checks: BTreeMap<&'static str, u64>,
    pub ct_created: u64,
    pub aff_created: u64,
    pub ct_flushes: u64,
    /// Frames the kernel's test-run refused (too short for their
    /// network header), not run.
    pub refused: u64,
}

impl Report {
    fn check(&mut self, name: &'static str) {
        *self.checks.entry(name).or_default() += 1;
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} packets ({} ingress, {} egress) in {} batches; {} rewritten; verdicts {:?}",
            self.packets, self.ingress, self.egress, self.batches, self.modified, self.verdicts
        )?;
        writeln!(
            f,
            "{} frames through sl_xdp first; its verdicts {:?}",
            self.xdp, self.xdp_verdicts
        )?;
        writeln!(
            f,
            "conntrack entries created {}, affinity entries {}, conntrack flushes {}, refused by test-run {}",
            self.ct_created, self.aff_created, self.ct_flushes, self.refused
        )?;
        write!(f, "invariants checked:")?;
        for (name, n) in &self.checks {
            write!(f, "\n  {name}: {n}")?;
        }
        Ok(())
    }
}

#[derive(Default)]
struct Snapshot {
    ct4: HashMap<Ct4Key, CtEntry>,
    ct6: HashMap<Ct6Key, CtEntry>,
    aff4: HashSet<Affinity4Key>,
    aff6: HashSet<Affinity6Key>,
}

/// The loaded programs and maps of one datapath instance, and what it was
/// configured with. Must be used from a thread inside the node's network
/// namespace (test-run resolves the ifindex there).
pub struct Harness {
    ingress: Program,
    egress: Program,
    /// `sl_xdp`, when `target.xdp_ifindexes` names devices.
    xdp: Option<Program>,
    maps: Maps,
    pub target: Target,
    pub report: Report,
    before: Snapshot,
}

fn tuple4(t: &Tuple) -> Option<Ct4Key> {
    Some(Ct4Key::new(
        t.src.clone().try_into().ok()?,
        t.dst.clone().try_into().ok()?,
        t.sport,
        t.dport,
        t.proto,
    ))
}

fn tuple6(t: &Tuple) -> Option<Ct6Key> {
    Some(Ct6Key::new(
        t.src.clone().try_into().ok()?,
        t.dst.clone().try_into().ok()?,
        t.sport,
        t.dport,
        t.proto,
    ))
}

fn tuple_of4(k: &Ct4Key) -> Tuple {
    Tuple {
        src: k.src.to_vec(),
        dst: k.dst.to_vec(),
        sport: k.sport,
        dport: k.dport,
        proto: k.proto,
    }
}

fn tuple_of6(k: &Ct6Key) -> Tuple {
    Tuple {
        src: k.src.to_vec(),
        dst: k.dst.to_vec(),
        sport: k.sport,
        dport: k.dport,
        proto: k.proto,
    }
}

fn xdp_verdict_name(v: u32) -> &'static str {
    match v {
        XDP_DROP => "drop",
        XDP_PASS => "pass",
        XDP_TX => "tx",
        XDP_REDIRECT => "redirect",
        0 => "aborted",
        _ => "unexpected",
    }
}

/// What the XDP runs of one batch returned, by verdict.
#[derive(Default)]
struct XdpTally {
    runs: u64,
    drop: u64,
    pass: u64,
    tx: u64,
    redirect: u64,
}

fn verdict_name(v: u32) -> &'static str {
    match v {
        UNSPEC => "unspec",
        SHOT => "shot",
        REDIRECT => "redirect",
        _ => "unexpected",
    }
}

/// The destination (`dst`) or source address of an IP frame, read raw.
fn raw_addr(f: &[u8], dst: bool) -> Option<&[u8]> {
    match u16::from_be_bytes([*f.get(12)?, *f.get(13)?]) {
        packet::ETH_P_IP => f.get(if dst { 30..34 } else { 26..30 }),
        packet::ETH_P_IPV6 => f.get(if dst { 38..54 } else { 22..38 }),
        _ => None,
    }
}

fn is_icmp(f: &[u8]) -> bool {
    match u16::from_be_bytes([f[12], f[13]]) {
        packet::ETH_P_IP => f.get(23) == Some(&packet::ICMP),
        packet::ETH_P_IPV6 => f.get(20) == Some(&packet::ICMPV6),
        _ => false,
    }
}

impl Harness {
    pub fn new(root: &Path, target: Target) -> Result<Self> {
        let mut progs = testrun::open_programs(root, &["sl_ingress", "sl_egress"])?.into_iter();
        let (Some(ingress), Some(egress)) = (progs.next(), progs.next()) else {
            anyhow::bail!("programs missing");
        };
        let xdp = if target.xdp_ifindexes.is_empty() {
            None
        } else {
            testrun::open_programs(root, &["sl_xdp"])?
                .into_iter()
                .next()
        };
        let maps = Maps::open_pinned(root)?;
        let mut h = Self {
            ingress,
            egress,
            xdp,
            maps,
            target,
            report: Report::default(),
            before: Snapshot::default(),
        };
        h.before = h.snapshot()?;
        Ok(h)
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let mut s = Snapshot::default();
        for kv in self.maps.conntrack_v4.iter() {
            let (k, v) = kv?;
            s.ct4.insert(k, v);
        }
        for kv in self.maps.conntrack_v6.iter() {
            let (k, v) = kv?;
            s.ct6.insert(k, v);
        }
        for k in self.maps.affinity_v4.keys() {
            s.aff4.insert(k?);
        }
        for k in self.maps.affinity_v6.keys() {
            s.aff6.insert(k?);
        }
        Ok(s)
    }

    fn stats(&self) -> Result<BTreeMap<Stat, u64>> {
        Stat::ALL
            .iter()
            .map(|s| Ok((*s, self.maps.stat(*s).context("reading counters")?)))
            .collect()
    }

    fn ct_entry(&self, t: &Tuple) -> Option<CtEntry> {
        if t.src.len() == 16 {
            self.maps.conntrack_v6.get(&tuple6(t)?, 0).ok()
        } else {
            self.maps.conntrack_v4.get(&tuple4(t)?, 0).ok()
        }
    }

    /// Empties conntrack and affinity (no agent runs its GC here).
    fn flush(&mut self) -> Result<()> {
        let k4: Vec<Ct4Key> = self.maps.conntrack_v4.keys().collect::<Result<_, _>>()?;
        for k in k4 {
            let _ = self.maps.conntrack_v4.remove(&k);
        }
        let k6: Vec<Ct6Key> = self.maps.conntrack_v6.keys().collect::<Result<_, _>>()?;
        for k in k6 {
            let _ = self.maps.conntrack_v6.remove(&k);
        }
        let a4: Vec<Affinity4Key> = self.maps.affinity_v4.keys().collect::<Result<_, _>>()?;
        for k in a4 {
            let _ = self.maps.affinity_v4.remove(&k);
        }
        let a6: Vec<Affinity6Key> = self.maps.affinity_v6.keys().collect::<Result<_, _>>()?;
        for k in a6 {
            let _ = self.maps.affinity_v6.remove(&k);
        }
        self.before = self.snapshot()?;
        self.report.ct_flushes += 1;
        Ok(())
    }

    /// Runs one packet and checks the per-packet invariants. Returns
    /// (verdict, modified, output).
    fn run_one(&mut self, pkt: &Packet) -> Result<(u32, bool, Vec<u8>)> {
        let prog = if pkt.ingress {
            &self.ingress
        } else {
            &self.egress
        };
        let out = match run_skb(prog, &pkt.data, pkt.ifindex) {
            Ok(out) => out,
            // The kernel refuses an IPv4/IPv6 frame too short for its
            // network header before any program runs.
            Err(e)
                if e.raw_os_error() == Some(libc::EINVAL)
                    && pkt.data.len() < packet::ETH_LEN + 40 =>
            {
                self.report.refused += 1;
                return Ok((UNSPEC, false, pkt.data.clone()));
            }
            Err(e) => {
                return Err(violation(
                    "test-run succeeds",
                    format!("{}: {e}", prog.name),
                    Some(pkt),
                ))
            }
        };
        let r = &mut self.report;
        r.packets += 1;
        if pkt.ingress {
            r.ingress += 1;
        } else {
            r.egress += 1;
        }
        *r.verdicts.entry(verdict_name(out.retval)).or_default() += 1;
        r.check("verdict is unspec/shot/redirect");
        if !matches!(out.retval, UNSPEC | SHOT | REDIRECT) {
            return Err(violation(
                "verdict is unspec/shot/redirect",
                format!("returned {}", out.retval as i32),
                Some(pkt),
            ));
        }
        let modified = out.data != pkt.data;
        if modified {
            r.modified += 1;
        }
        // Not service traffic: passes untouched.
        let t = &self.target;
        let untouched_expected = if pkt.ingress {
            // ICMP errors quoting an SNATed flow are its traffic,
            // wherever they go (as Linux conntrack relates them).
            raw_addr(&pkt.data, true).is_none_or(|d| !t.is_frontend_addr(d) && !t.is_node_addr(d))
                && !is_icmp(&pkt.data)
        } else {
            raw_addr(&pkt.data, false).is_none_or(|s| !t.is_backend_addr(s)) && !is_icmp(&pkt.data)
        };
        if untouched_expected {
            r.check("non-service traffic passes untouched");
            if modified || out.retval != UNSPEC {
                return Err(violation(
                    "non-service traffic passes untouched",
                    format!(
                        "verdict {}, output {}",
                        verdict_name(out.retval),
                        hex(&out.data)
                    ),
                    Some(pkt),
                ));
            }
        }
        if out.retval == SHOT {
            return Ok((out.retval, modified, out.data));
        }
        if modified && checksums_ok(&pkt.data) == Some(true) {
            r.check("rewritten packets keep valid checksums");
            if checksums_ok(&out.data) != Some(true) {
                return Err(violation(
                    "rewritten packets keep valid checksums",
                    format!("output {}", hex(&out.data)),
                    Some(pkt),
                ));
            }
        }
        self.check_reply_addresses(pkt, &out.data)?;
        Ok((out.retval, modified, out.data))
    }

    /// Runs one frame through `sl_xdp` as received by its device, and
    /// checks the per-packet invariants of the XDP hook: a verdict of
    /// drop, pass, TX or redirect; a passed frame untouched (the program
    /// hands TC what it does not decide before changing anything);
    /// non-service traffic passed; a sent frame with valid checksums and
    /// no untranslated reply tuple. Returns the verdict.
    fn run_xdp_one(&mut self, pkt: &Packet) -> Result<u32> {
        let Some(prog) = &self.xdp else {
            return Ok(XDP_PASS);
        };
        let out = run_xdp(prog, &pkt.data, pkt.ifindex)
            .map_err(|e| violation("XDP test-run succeeds", format!("sl_xdp: {e}"), Some(pkt)))?;
        let r = &mut self.report;
        r.xdp += 1;
        *r.xdp_verdicts
            .entry(xdp_verdict_name(out.retval))
            .or_default() += 1;
        let inv = "XDP verdict is drop/pass/tx/redirect";
        r.check(inv);
        if !matches!(out.retval, XDP_DROP | XDP_PASS | XDP_TX | XDP_REDIRECT) {
            return Err(violation(
                inv,
                format!("returned {}", out.retval as i32),
                Some(pkt),
            ));
        }
        let modified = out.data != pkt.data;
        if out.retval == XDP_PASS {
            let inv = "XDP passes only frames it left untouched";
            r.check(inv);
            if modified {
                return Err(violation(
                    inv,
                    format!("output {}", hex(&out.data)),
                    Some(pkt),
                ));
            }
        }
        let t = &self.target;
        let service = raw_addr(&pkt.data, true)
            .is_some_and(|d| t.is_frontend_addr(d) || t.is_node_addr(d))
            || is_icmp(&pkt.data);
        if !service {
            let inv = "non-service traffic passes XDP";
            r.check(inv);
            if out.retval != XDP_PASS {
                return Err(violation(
                    inv,
                    format!("verdict {}", xdp_verdict_name(out.retval)),
                    Some(pkt),
                ));
            }
        }
        if matches!(out.retval, XDP_TX | XDP_REDIRECT) {
            // The node's stack would have dropped anything else; `sl_xdp`
            // must not send it on in its stead.
            let inv = "XDP sends only frames a router would forward";
            r.check(inv);
            if !forwardable(&pkt.data) {
                return Err(violation(
                    inv,
                    format!("verdict {}", xdp_verdict_name(out.retval)),
                    Some(pkt),
                ));
            }
            if modified && checksums_ok(&pkt.data) == Some(true) {
                let inv = "frames XDP sends keep valid checksums";
                r.check(inv);
                if checksums_ok(&out.data) != Some(true) {
                    return Err(violation(
                        inv,
                        format!("output {}", hex(&out.data)),
                        Some(pkt),
                    ));
                }
            }
            self.check_reply_addresses(pkt, &out.data)?;
        }
        Ok(out.retval)
    }

    /// A reply never leaves with the backend's address where its client
    /// expects the frontend: not as the packet's own tuple, not in the
    /// quote of an ICMP error addressed to the client.
    fn check_reply_addresses(&mut self, pkt: &Packet, out: &[u8]) -> Result<()> {
        // Egress: DNATed flows (reverse NAT on the way out); ingress:
        // SNATed flows (turned back on the way in).
        let untranslated = |e: &CtEntry| {
            e.kind == CtKind::Reply as u8 && ((e.flags & CT_F_SNAT != 0) == pkt.ingress)
        };
        if let Some(t) = lenient_tuple(out) {
            self.report.check("replies leave with the frontend address");
            if let Some(e) = self.ct_entry(&t) {
                if untranslated(&e) {
                    return Err(violation(
                        "replies leave with the frontend address",
                        format!("output {} is the reply tuple {t:?}", hex(out)),
                        Some(pkt),
                    ));
                }
            }
        }
        if let (Some(q), Some(l)) = (quoted_tuple(out), layout(out)) {
            if l.dst == q.src {
                self.report
                    .check("ICMP errors quote the frontend to the client");
                if let Some(e) = self.ct_entry(&q.reversed()) {
                    if untranslated(&e) {
                        return Err(violation(
                            "ICMP errors quote the frontend to the client",
                            format!("output {} quotes {q:?}", hex(out)),
                            Some(pkt),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs a batch and checks the batch invariants: every new conntrack
    /// and affinity entry belongs to a packet of the batch sent to a
    /// frontend, and the counters move as the packets explain.
    pub fn run_batch(&mut self, batch: &[Packet]) -> Result<Vec<Known>> {
        let stats_before = self.stats()?;
        let mut frontend_tuples: HashSet<Tuple> = HashSet::new();
        let (mut untouched_passed, mut egress_modified, mut ingress_sent) = (0u64, 0u64, 0u64);
        let mut xdp = XdpTally::default();
        for pkt in batch {
            if pkt.ingress {
                if let Some(t) = lenient_tuple(&pkt.data) {
                    if self.target.is_frontend(&t) {
                        frontend_tuples.insert(t);
                    }
                }
                // On a device with `sl_xdp`, the frame meets it first; TC
                // sees only what it passes.
                if self.xdp.is_some() && self.target.xdp_ifindexes.contains(&pkt.ifindex) {
                    let verdict = self.run_xdp_one(pkt)?;
                    xdp.runs += 1;
                    match verdict {
                        XDP_DROP => xdp.drop += 1,
                        XDP_TX => xdp.tx += 1,
                        XDP_REDIRECT => xdp.redirect += 1,
                        _ => xdp.pass += 1,
                    }
                    if verdict != XDP_PASS {
                        ingress_sent += 1;
                        continue;
                    }
                }
            }
            let (verdict, modified, _) = self.run_one(pkt)?;
            if !modified && verdict == UNSPEC {
                untouched_passed += 1;
            }
            if !pkt.ingress && modified {
                egress_modified += 1;
            }
            // Counted before the send, which drops a packet whose TTL
            // would expire (as a router does).
            if pkt.ingress && verdict != UNSPEC {
                ingress_sent += 1;
            }
        }
        self.report.batches += 1;
        let after = self.snapshot()?;
        let mut learned = Vec::new();
        let mut new_forward = 0u64;
        let inv = "state only from service traffic";
        let mut judge = |t: Tuple, e: &CtEntry, fwd: Tuple, report: &mut Report| -> Result<()> {
            report.check(inv);
            report.ct_created += 1;
            if !frontend_tuples.contains(&fwd) {
                // The frames that may have made it: those of the batch
                // that carry its client's address anywhere.
                let suspects: Vec<String> = batch
                    .iter()
                    .filter(|p| {
                        p.data
                            .windows(fwd.src.len())
                            .any(|w| w == fwd.src.as_slice())
                    })
                    .map(|p| format!("{} ifindex {}: {}", p.kind, p.ifindex, hex(&p.data)))
                    .collect();
                return Err(violation(
                    inv,
                    format!(
                        "conntrack entry {t:?} ({e:?}) of the flow {fwd:?} belongs to no packet of the batch sent to a frontend; frames of the batch with its client's address: {suspects:#?}"
                    ),
                    None,
                ));
            }
            if e.kind == CtKind::Reply as u8 {
                learned.push(Known {
                    reply: t,
                    snat: e.flags & CT_F_SNAT != 0,
                });
            } else {
                new_forward += 1;
            }
            Ok(())
        };
        for (k, e) in &after.ct4 {
            if !self.before.ct4.contains_key(k) {
                let fwd = if e.kind == CtKind::Reply as u8 {
                    tuple_of4(&e.forward_key_of_reply(k.proto))
                } else {
                    tuple_of4(k)
                };
                judge(tuple_of4(k), e, fwd, &mut self.report)?;
            }
        }
        for (k, e) in &after.ct6 {
            if !self.before.ct6.contains_key(k) {
                let fwd = if e.kind == CtKind::Reply as u8 {
                    tuple_of6(&e.forward_key6_of_reply(k.proto))
                } else {
                    tuple_of6(k)
                };
                judge(tuple_of6(k), e, fwd, &mut self.report)?;
            }
        }
        let affinity_ok = |client: &[u8], frontend: &[u8], port: u16, proto: u8| {
            frontend_tuples.iter().any(|t| {
                t.src == client && t.dst == frontend && t.dport == port && t.proto == proto
            })
        };
        for k in after.aff4.difference(&self.before.aff4) {
            self.report.check(inv);
            self.report.aff_created += 1;
            if !affinity_ok(&k.client, &k.frontend, k.port, k.proto) {
                return Err(violation(inv, format!("affinity entry {k:?}"), None));
            }
        }
        for k in after.aff6.difference(&self.before.aff6) {
            self.report.check(inv);
            self.report.aff_created += 1;
            if !affinity_ok(&k.client, &k.frontend, k.port, k.proto) {
                return Err(violation(inv, format!("affinity entry {k:?}"), None));
            }
        }

        // Counters.
        let after_stats = self.stats()?;
        let delta = |s: Stat| {
            after_stats
                .get(&s)
                .copied()
                .unwrap_or_default()
                .wrapping_sub(stats_before.get(&s).copied().unwrap_or_default())
        };
        let inv = "counters add up";
        self.report.check(inv);
        for s in NEVER {
            if delta(s) != 0 {
                return Err(violation(
                    inv,
                    format!("{} moved by {} in this batch", s.name(), delta(s)),
                    None,
                ));
            }
        }
        let explain = |what: String, moved: u64, bound: u64| -> Result<()> {
            if moved > bound {
                return Err(violation(inv, format!("{what}: {moved} > {bound}"), None));
            }
            Ok(())
        };
        explain(
            "truncated <= packets passed untouched".into(),
            delta(Stat::Truncated),
            untouched_passed,
        )?;
        let flows = delta(Stat::NewFlow) + delta(Stat::Reselected);
        explain(
            "new forward entries <= new_flow + reselected".into(),
            new_forward,
            flows,
        )?;
        // A frame starts at most one flow, in `sl_xdp` or in `sl_ingress`.
        explain(
            "new_flow + reselected <= ingress frames".into(),
            flows,
            batch.iter().filter(|p| p.ingress).count() as u64,
        )?;
        // `sl_xdp` counts each verdict it returns, once.
        for (stat, returned) in [
            (Stat::XdpTx, xdp.tx),
            (Stat::XdpRedirect, xdp.redirect),
            (Stat::XdpDrop, xdp.drop),
        ] {
            if delta(stat) != returned {
                return Err(violation(
                    inv,
                    format!(
                        "{} moved by {} for {returned} such XDP verdicts",
                        stat.name(),
                        delta(stat)
                    ),
                    None,
                ));
            }
        }
        explain(
            "xdp_pass <= frames XDP passed".into(),
            delta(Stat::XdpPass),
            xdp.pass,
        )?;
        explain(
            "reply_nat + icmp_translated <= rewritten egress packets".into(),
            delta(Stat::ReplyNat) + delta(Stat::IcmpTranslated),
            egress_modified,
        )?;
        explain(
            "snat_reply + icmp_snat_translated <= redirected or dropped ingress packets".into(),
            delta(Stat::SnatReply) + delta(Stat::IcmpSnatTranslated),
            ingress_sent,
        )?;

        if after.ct4.len() + after.ct6.len() > CT_LIMIT {
            self.flush()?;
            learned.clear();
            learned.push(Known {
                reply: Tuple {
                    src: Vec::new(),
                    dst: Vec::new(),
                    sport: 0,
                    dport: 0,
                    proto: 0,
                },
                snat: false,
            });
        } else {
            self.before = after;
        }
        Ok(learned)
    }
}

/// Runs `packets` generated packets from `seed` in batches of `batch`,
/// checking every invariant. The generator learns the flows conntrack
/// tracks after each batch.
pub fn fuzz(h: &mut Harness, seed: u64, packets: u64, batch: usize) -> Result<()> {
    let mut g = gen::Generator::new(seed, h.target.clone());
    let mut done = 0u64;
    while done < packets {
        let mut pkts = Vec::with_capacity(batch + 4);
        while pkts.len() < batch {
            pkts.extend(g.generate());
        }
        done += pkts.len() as u64;
        let learned = h
            .run_batch(&pkts)
            .with_context(|| format!("seed {seed:#x}, batch ending at packet {done}"))?;
        if learned.iter().any(|k| k.reply.src.is_empty()) {
            // Conntrack was flushed: forget the flows.
            g.known.clear();
        } else {
            g.learn(learned);
        }
    }
    Ok(())
}

/// One corpus line: `ingress|egress <device> <hex> [# note]`.
pub fn parse_corpus_line(
    line: &str,
    ifindex: impl Fn(&str) -> Option<u32>,
) -> Option<Result<Packet>> {
    let line = line.split('#').next().unwrap_or("").trim();
    if line.is_empty() {
        return None;
    }
    let mut f = line.split_whitespace();
    let parsed = (|| -> Result<Packet> {
        let hook = f.next().context("no hook")?;
        let dev = f.next().context("no device")?;
        let data = packet::unhex(f.next().context("no packet")?).context("bad hex")?;
        anyhow::ensure!(data.len() >= packet::ETH_LEN, "shorter than Ethernet");
        Ok(Packet {
            ingress: match hook {
                "ingress" => true,
                "egress" => false,
                other => anyhow::bail!("hook {other}"),
            },
            ifindex: ifindex(dev).with_context(|| format!("no device {dev}"))?,
            data,
            kind: "corpus",
        })
    })();
    Some(parsed)
}
