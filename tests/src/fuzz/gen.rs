//! The packet generator: structure-aware frames towards the configured
//! frontends, backends, SNAT ports and random addresses, then byte-level
//! mutations of a fraction. Seeded: a seed gives the same packets again.

use std::net::IpAddr;

use super::packet::{self as p, octets, Tuple};

/// xorshift64*: small, fast, reproducible from its seed.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// What the datapath under test is configured with.
#[derive(Clone, Debug, Default)]
pub struct Target {
    /// (address, port, IP protocol) of every frontend.
    pub frontends: Vec<(IpAddr, u16, u8)>,
    pub backends: Vec<(IpAddr, u16)>,
    /// The node's own addresses (SNAT sources, node ports).
    pub nodes: Vec<IpAddr>,
    /// Client pods and hosts outside the cluster.
    pub clients: Vec<IpAddr>,
    pub snat_ports: (u16, u16),
    /// The node devices packets arrive on / leave by.
    pub ifindexes: Vec<u32>,
    /// Those of them with `sl_xdp` attached: a frame arriving there meets
    /// it before `sl_ingress`.
    pub xdp_ifindexes: Vec<u32>,
}

impl Target {
    pub fn is_frontend(&self, t: &Tuple) -> bool {
        self.frontends
            .iter()
            .any(|(a, port, proto)| octets(*a) == t.dst && *port == t.dport && *proto == t.proto)
    }

    pub fn is_frontend_addr(&self, a: &[u8]) -> bool {
        self.frontends.iter().any(|(f, _, _)| octets(*f) == a)
    }

    pub fn is_node_addr(&self, a: &[u8]) -> bool {
        self.nodes.iter().any(|n| octets(*n) == a)
    }

    pub fn is_backend_addr(&self, a: &[u8]) -> bool {
        self.backends.iter().any(|(b, _)| octets(*b) == a)
    }
}

/// One frame for one program.
#[derive(Clone, Debug)]
pub struct Packet {
    pub ingress: bool,
    pub ifindex: u32,
    pub data: Vec<u8>,
    /// Which generator rule made it (for reports).
    pub kind: &'static str,
}

/// A flow the datapath tracks, as its reply direction (backend -> client,
/// or backend -> node:SNAT port).
#[derive(Clone, Debug)]
pub struct Known {
    pub reply: Tuple,
    pub snat: bool,
}

pub struct Generator {
    pub rng: Rng,
    pub target: Target,
    pub known: Vec<Known>,
}

const MAX_KNOWN: usize = 512;

fn v6(a: &IpAddr) -> bool {
    a.is_ipv6()
}

impl Generator {
    pub fn new(seed: u64, target: Target) -> Self {
        Self {
            rng: Rng::new(seed),
            target,
            known: Vec::new(),
        }
    }

    /// Remembers tracked flows the harness read back from conntrack.
    pub fn learn(&mut self, flows: impl IntoIterator<Item = Known>) {
        for k in flows {
            if self.known.len() < MAX_KNOWN {
                self.known.push(k);
            } else {
                let i = self.rng.below(MAX_KNOWN);
                self.known[i] = k;
            }
        }
    }

    fn addr(&mut self, family6: bool) -> IpAddr {
        let t = &self.target;
        let pool: Vec<IpAddr> = match self.rng.below(6) {
            0 => t.frontends.iter().map(|f| f.0).collect(),
            1 => t.backends.iter().map(|b| b.0).collect(),
            2 => t.nodes.clone(),
            3 => t.clients.clone(),
            _ => Vec::new(),
        };
        let pool: Vec<IpAddr> = pool.into_iter().filter(|a| v6(a) == family6).collect();
        if !pool.is_empty() && self.rng.chance(85) {
            return *self.rng.pick(&pool);
        }
        let b = self.rng.bytes(16);
        if family6 {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b);
            if self.rng.chance(50) {
                o[0] = 0xfd;
                o[1] = 0;
            }
            IpAddr::from(o)
        } else {
            IpAddr::from([b[0], b[1], b[2], b[3]])
        }
    }

    fn port(&mut self) -> u16 {
        let (lo, hi) = self.target.snat_ports;
        match self.rng.below(6) {
            0 => self.rng.pick(&self.target.frontends).1,
            1 => self.rng.pick(&self.target.backends).1,
            2 => lo + (self.rng.below(usize::from(hi - lo) + 1) as u16),
            3 => *self.rng.pick(&[0, 1, 53, 80, 443, lo - 1, hi, lo]),
            _ => self.rng.next_u64() as u16,
        }
    }

    fn ifindex(&mut self) -> u32 {
        *self.rng.pick(&self.target.ifindexes)
    }

    /// The next packets: usually one, a train for fragments.
    pub fn generate(&mut self) -> Vec<Packet> {
        let family6 = self.rng.chance(40);
        let mut out = match self.rng.below(20) {
            0..=5 => vec![self.towards_frontend(family6)],
            6..=8 => self.known_flow(),
            9..=10 => self.icmp_about_known(),
            11..=12 => self.fragment_train(family6),
            13 => vec![self.non_ip()],
            _ => vec![self.random(family6)],
        };
        for pkt in &mut out {
            if self.rng.chance(20) {
                self.mutate(&mut pkt.data);
                pkt.kind = "mutated";
            }
        }
        out
    }

    fn packet(&mut self, ingress: bool, data: Vec<u8>, kind: &'static str) -> Packet {
        let ifindex = self.ifindex();
        Packet {
            ingress,
            ifindex,
            data,
            kind,
        }
    }

    fn towards_frontend(&mut self, family6: bool) -> Packet {
        let fes: Vec<(IpAddr, u16, u8)> = self
            .target
            .frontends
            .iter()
            .filter(|f| v6(&f.0) == family6)
            .copied()
            .collect();
        let (dst, mut dport, mut proto) = *self.rng.pick(&fes);
        if self.rng.chance(10) {
            proto = if proto == p::TCP { p::UDP } else { p::TCP };
        }
        if self.rng.chance(10) {
            dport = self.port();
        }
        let src = if self.rng.chance(15) {
            let bs: Vec<IpAddr> = self
                .target
                .backends
                .iter()
                .map(|b| b.0)
                .filter(|a| v6(a) == family6)
                .collect();
            *self.rng.pick(&bs)
        } else if self.rng.chance(80) {
            let cs: Vec<IpAddr> = self
                .target
                .clients
                .iter()
                .copied()
                .filter(|a| v6(a) == family6)
                .collect();
            *self.rng.pick(&cs)
        } else {
            self.addr(family6)
        };
        let sport = self.rng.next_u64() as u16 | 1024;
        let data = self.ip_packet(src, dst, proto, sport, dport);
        self.packet(true, data, "to-frontend")
    }

    /// A packet of a tracked flow: its reply (egress, or ingress for an
    /// SNATed one) or, reversed, its forward direction.
    fn known_flow(&mut self) -> Vec<Packet> {
        if self.known.is_empty() {
            let v6 = self.rng.chance(40);
            return vec![self.towards_frontend(v6)];
        }
        let k = self.rng.pick(&self.known).clone();
        let t = k.reply;
        let (src, dst) = (ip_of(&t.src), ip_of(&t.dst));
        let data = self.ip_packet(src, dst, t.proto, t.sport, t.dport);
        let ingress = k.snat || self.rng.chance(10);
        vec![self.packet(ingress, data, if k.snat { "snat-reply" } else { "reply" })]
    }

    /// An ICMP error quoting a tracked flow's packet towards the backend
    /// (egress to the client; ingress to the node for an SNATed one).
    fn icmp_about_known(&mut self) -> Vec<Packet> {
        if self.known.is_empty() {
            let v6 = self.rng.chance(40);
            return vec![self.random(v6)];
        }
        let k = self.rng.pick(&self.known).clone();
        let q = k.reply.reversed();
        let (qsrc, qdst) = (ip_of(&q.src), ip_of(&q.dst));
        let inner = self.ip_packet(qsrc, qdst, q.proto, q.sport, q.dport);
        let mut quote = inner[p::ETH_LEN..].to_vec();
        let cut = match self.rng.below(4) {
            0 => quote.len(),
            1 => (if qsrc.is_ipv6() { 40 } else { 20 }) + 8,
            _ => self.rng.below(quote.len() + 1),
        };
        quote.truncate(cut);
        let router = if self.rng.chance(50) {
            qdst
        } else {
            self.addr(qsrc.is_ipv6())
        };
        let six = qsrc.is_ipv6();
        let (ty, code) = if six {
            *self.rng.pick(&[(1u8, 4u8), (2, 0), (3, 0), (4, 0), (1, 0)])
        } else {
            *self
                .rng
                .pick(&[(3u8, 3u8), (3, 4), (11, 0), (12, 0), (3, 1)])
        };
        let rest = if ty == 2 || (ty == 3 && code == 4) {
            1280
        } else {
            0
        };
        let data = self.icmp_packet(router, qsrc, ty, code, rest, &quote);
        let ingress = k.snat || self.rng.chance(10);
        vec![self.packet(
            ingress,
            data,
            if k.snat { "icmp-snat" } else { "icmp-reply" },
        )]
    }

    fn non_ip(&mut self) -> Packet {
        let et = *self
            .rng
            .pick(&[0x0806u16, 0x8100, 0x88a8, 0x0000, 0xffff, 0x86dd, 0x0800]);
        let mut data = p::eth(et);
        let n = self.rng.below(60);
        data.extend(self.rng.bytes(n));
        let ingress = self.rng.chance(50);
        self.packet(ingress, data, "non-ip")
    }

    fn random(&mut self, family6: bool) -> Packet {
        let src = self.addr(family6);
        let dst = self.addr(family6);
        let proto = *self.rng.pick(&[
            p::TCP,
            p::TCP,
            p::UDP,
            p::UDP,
            p::ICMP,
            p::ICMPV6,
            p::SCTP,
            0,
            255,
            47,
        ]);
        let (sport, dport) = (self.port(), self.port());
        let data = if proto == p::ICMP || proto == p::ICMPV6 {
            let inner_src = self.addr(family6);
            let inner_dst = self.addr(family6);
            let ip = *self.rng.pick(&[p::TCP, p::UDP, p::ICMP, p::SCTP]);
            let inner = self.ip_packet(inner_src, inner_dst, ip, sport, dport);
            let mut quote = inner[p::ETH_LEN..].to_vec();
            let cut = self.rng.below(quote.len() + 1);
            quote.truncate(cut);
            let ty = self.rng.next_u64() as u8 % 16;
            let code = self.rng.next_u64() as u8 % 6;
            self.icmp_packet(src, dst, ty, code, 0, &quote)
        } else {
            self.ip_packet(src, dst, proto, sport, dport)
        };
        let ingress = self.rng.chance(50);
        self.packet(ingress, data, "random")
    }

    /// The L4 payload of `proto`, with a valid checksum.
    fn l4(&mut self, src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
        let (s, d) = (octets(src), octets(dst));
        let n = if self.rng.chance(70) {
            self.rng.below(32)
        } else {
            self.rng.below(600)
        };
        let payload = self.rng.bytes(n);
        match proto {
            p::TCP => {
                let flags = self.rng.next_u64() as u8;
                let flags = match self.rng.below(4) {
                    0 => 0x02,
                    1 => 0x10 | (flags & 0x09),
                    _ => flags,
                };
                let doff = if self.rng.chance(85) {
                    5 + self.rng.below(3) as u8
                } else {
                    self.rng.below(16) as u8
                };
                p::tcp(&s, &d, sport, dport, flags, doff, &payload)
            }
            p::UDP => {
                let mut u = p::udp(
                    &s,
                    &d,
                    sport,
                    dport,
                    &payload,
                    !dst.is_ipv6() && self.rng.chance(10),
                );
                if self.rng.chance(8) {
                    // Length mismatch (the checksum then covers a lie).
                    let len = self.rng.next_u64() as u16;
                    u[4..6].copy_from_slice(&len.to_be_bytes());
                }
                u
            }
            p::ICMP | p::ICMPV6 => {
                let ty = *self.rng.pick(&[0u8, 8, 128, 129, 3, 1]);
                p::icmp(
                    proto == p::ICMPV6,
                    &s,
                    &d,
                    ty,
                    0,
                    self.rng.next_u64() as u32,
                    &payload,
                )
            }
            _ => {
                let mut b = Vec::new();
                b.extend_from_slice(&sport.to_be_bytes());
                b.extend_from_slice(&dport.to_be_bytes());
                b.extend(payload);
                b
            }
        }
    }

    /// An Ethernet frame of one IP packet carrying `proto`.
    fn ip_packet(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
        sport: u16,
        dport: u16,
    ) -> Vec<u8> {
        let l4 = self.l4(src, dst, proto, sport, dport);
        self.wrap(src, dst, proto, &l4, 0, false, 0)
    }

    fn icmp_packet(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        ty: u8,
        code: u8,
        rest: u32,
        body: &[u8],
    ) -> Vec<u8> {
        let six = src.is_ipv6();
        let m = p::icmp(six, &octets(src), &octets(dst), ty, code, rest, body);
        self.wrap(
            src,
            dst,
            if six { p::ICMPV6 } else { p::ICMP },
            &m,
            0,
            false,
            0,
        )
    }

    /// Ethernet + IP header(s) around `l4`. `frag`: (offset in bytes, MF)
    /// when `fragment` is set, with identification `id`.
    #[allow(clippy::too_many_arguments)]
    fn wrap(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
        l4: &[u8],
        offset: usize,
        more: bool,
        id: u32,
    ) -> Vec<u8> {
        let fragment = more || offset != 0;
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let opts = if self.rng.chance(10) {
                    let n = self.rng.below(41);
                    if self.rng.chance(50) {
                        vec![1u8; n]
                    } else {
                        self.rng.bytes(n)
                    }
                } else {
                    Vec::new()
                };
                let ttl = *self.rng.pick(&[64u8, 64, 64, 1, 0, 255]);
                let mut frag_off = if fragment {
                    (offset / 8) as u16 | if more { 0x2000 } else { 0 }
                } else if self.rng.chance(30) {
                    0x4000
                } else {
                    0
                };
                if !fragment && self.rng.chance(2) {
                    frag_off |= 0x8000;
                }
                let id = if fragment {
                    id as u16
                } else {
                    self.rng.next_u64() as u16
                };
                let mut f = p::eth(p::ETH_P_IP);
                f.extend(p::ipv4_header(
                    s.octets(),
                    d.octets(),
                    proto,
                    l4.len(),
                    &opts,
                    ttl,
                    id,
                    frag_off,
                ));
                f.extend_from_slice(l4);
                f
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                // Extension headers before the upper layer.
                let mut chain: Vec<(u8, Vec<u8>)> = Vec::new();
                if !fragment && self.rng.chance(15) {
                    for _ in 0..1 + self.rng.below(3) {
                        let ty = *self.rng.pick(&[0u8, 43, 60, 44, 51, 135]);
                        let body = match ty {
                            44 => {
                                let off = if self.rng.chance(50) {
                                    0
                                } else {
                                    self.rng.next_u64() as u16 & 0xfff8
                                };
                                let mut b = vec![0u8; 6];
                                b[0..2].copy_from_slice(
                                    &(off | u16::from(self.rng.chance(50))).to_be_bytes(),
                                );
                                b[2..6]
                                    .copy_from_slice(&(self.rng.next_u64() as u32).to_be_bytes());
                                b
                            }
                            _ => {
                                let words = self.rng.below(3);
                                let mut b = vec![words as u8];
                                b.extend(vec![1u8; 5 + words * 8]);
                                if ty == 43 {
                                    b[1] = *self.rng.pick(&[0u8, 2, 4]);
                                    b[2] = 0;
                                }
                                b
                            }
                        };
                        chain.push((ty, body));
                    }
                }
                if fragment {
                    let mut b = vec![0u8; 6];
                    b[0..2].copy_from_slice(
                        &((offset as u16 & 0xfff8) | u16::from(more)).to_be_bytes(),
                    );
                    b[2..6].copy_from_slice(&id.to_be_bytes());
                    chain.push((44, b));
                }
                let mut ext = Vec::new();
                let first = chain.first().map_or(proto, |c| c.0);
                for (i, (_, body)) in chain.iter().enumerate() {
                    let next = chain.get(i + 1).map_or(proto, |c| c.0);
                    ext.push(next);
                    ext.extend_from_slice(body);
                }
                let mut f = p::eth(p::ETH_P_IPV6);
                f.extend(p::ipv6_header(
                    s.octets(),
                    d.octets(),
                    first,
                    ext.len() + l4.len(),
                ));
                f.extend(ext);
                f.extend_from_slice(l4);
                f
            }
            _ => p::eth(0x0800),
        }
    }

    /// A datagram cut into fragments (first, later ones), sometimes out
    /// of order or with the first missing.
    fn fragment_train(&mut self, family6: bool) -> Vec<Packet> {
        let t = if self.rng.chance(70) {
            self.towards_frontend(family6)
        } else {
            self.random(family6)
        };
        let Some(l) = p::layout(&t.data) else {
            return vec![t];
        };
        let (src, dst) = (ip_of(&l.src), ip_of(&l.dst));
        let mut l4 = t.data[l.l4..l.end].to_vec();
        if l4.len() < 48 {
            let more = self.rng.bytes(64);
            l4.extend(more);
            // Checksum no longer covers it: the fragments carry it anyway.
        }
        let id = self.rng.next_u64() as u32 & if self.rng.chance(50) { 0xff } else { u32::MAX };
        let cut = 8 * (1 + self.rng.below((l4.len() - 1) / 8).max(1) - 1).max(1);
        let cut = cut.min(l4.len() - 1) & !7;
        let cut = cut.max(8);
        let ingress = t.ingress;
        let first = self.wrap(src, dst, l.proto, &l4[..cut], 0, true, id);
        let later = self.wrap(src, dst, l.proto, &l4[cut..], cut, false, id);
        let mut train = vec![
            Packet {
                ingress,
                ifindex: t.ifindex,
                data: first,
                kind: "fragment",
            },
            Packet {
                ingress,
                ifindex: t.ifindex,
                data: later,
                kind: "fragment",
            },
        ];
        match self.rng.below(4) {
            0 => train.reverse(),
            1 => {
                train.remove(0);
            }
            _ => {}
        }
        train
    }

    /// Byte-level damage: bit flips, truncation, extension, interesting
    /// bytes in the headers.
    pub fn mutate(&mut self, data: &mut Vec<u8>) {
        for _ in 0..1 + self.rng.below(3) {
            match self.rng.below(5) {
                0 if data.len() > p::ETH_LEN => {
                    let n = p::ETH_LEN + self.rng.below(data.len() - p::ETH_LEN);
                    data.truncate(n);
                }
                1 => {
                    let n = self.rng.below(64);
                    let b = self.rng.bytes(n);
                    data.extend(b);
                }
                2 => {
                    let i = self.rng.below(data.len().min(96));
                    data[i] = *self.rng.pick(&[
                        0u8, 1, 4, 5, 6, 0x0f, 0x45, 0x46, 0x4f, 0x60, 0x7f, 0x80, 0xff, 17, 44, 58,
                    ]);
                }
                _ => {
                    let i = self.rng.below(data.len().min(128));
                    data[i] ^= 1 << self.rng.below(8);
                }
            }
        }
        if data.len() < p::ETH_LEN {
            data.resize(p::ETH_LEN, 0);
        }
        data.truncate(super::testrun::MAX_PACKET);
    }
}

fn ip_of(b: &[u8]) -> IpAddr {
    if b.len() == 16 {
        let mut o = [0u8; 16];
        o.copy_from_slice(b);
        IpAddr::from(o)
    } else {
        IpAddr::from([b[0], b[1], b[2], b[3]])
    }
}
