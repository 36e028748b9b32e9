//! The benchmark's outputs: a text table, a Markdown report, the raw JSON
//! and an SVG chart of connect latency and connection rate against the
//! number of services.

use std::{fmt::Write as _, fs, path::Path};

use anyhow::{Context, Result};

use super::{
    churn::RatePoint,
    control::Churn,
    stats::{relative, Rate},
    Measure, Results, SizeResult, VariantResult,
};

pub fn measure_text(m: &Measure) -> String {
    match (&m.seconds, &m.not_measured) {
        (Some(s), _) => {
            let mut t = seconds(*s);
            if let Some(note) = &m.note {
                let _ = write!(t, " ({note})");
            }
            t
        }
        (None, Some(why)) => format!("not measured: {why}"),
        (None, None) => "-".into(),
    }
}

fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn short_measure(m: Option<&Measure>) -> String {
    match m {
        Some(Measure {
            seconds: Some(s), ..
        }) => seconds(*s),
        Some(Measure {
            not_measured: Some(_),
            ..
        }) => "not measured*".into(),
        _ => "-".into(),
    }
}

pub fn churn_text(c: &Churn) -> String {
    match (&c.latency, &c.not_measured) {
        (Some(l), _) => {
            let mut t = format!(
                "p50 {} / p99 {} ({} changes)",
                ms(l.p50_us),
                ms(l.p99_us),
                l.samples
            );
            if let Some(mean) = c.agent_update_to_datapath_mean_ms {
                let _ = write!(t, "; agent-internal mean {mean:.2} ms");
            }
            if let Some(a) = &c.agent_internal {
                let _ = write!(
                    t,
                    ", p50 {} / p99 {} / max {}",
                    ms(a.p50_us),
                    ms(a.p99_us),
                    ms(a.max_us)
                );
            }
            t
        }
        (None, Some(why)) => format!("not measured: {why}"),
        _ => "-".into(),
    }
}

/// One background churn rate, for the log.
pub fn rate_text(p: &RatePoint) -> String {
    if let Some(e) = &p.error {
        return format!("{}/s: failed: {e}", p.rate);
    }
    format!(
        "{}/s (published {:.0}/s): target change {}; last background change lag {}{}",
        p.rate,
        p.achieved,
        p.latency.as_ref().map_or("-".into(), |l| format!(
            "p50 {} / p99 {} ({})",
            ms(l.p50_us),
            ms(l.p99_us),
            l.samples
        )),
        p.lag_ms.map_or("-".into(), |l| format!("{l:.1} ms")),
        if p.sustained() { "" } else { " (not kept up)" }
    )
}

/// Endpoint-change latency of the API-fed agent under background churn.
fn churn_rate_table(r: &Results) -> String {
    let mut t = String::new();
    if !r.sizes.iter().any(|s| {
        s.control
            .agent
            .as_ref()
            .is_some_and(|a| !a.churn_rates.is_empty())
    }) {
        return t;
    }
    let _ = writeln!(
        t,
        "| services | background changes/s (published) | target change p50 / p99 (changes) | last background change lag | kept up |"
    );
    let _ = writeln!(t, "|--:|--:|--:|--:|--|");
    for s in &r.sizes {
        let Some(a) = &s.control.agent else { continue };
        for p in &a.churn_rates {
            let _ = writeln!(
                t,
                "| {} | {} ({:.0}) | {} | {} | {} |",
                s.services,
                p.rate,
                p.achieved,
                p.latency.as_ref().map_or_else(
                    || p.error.clone().unwrap_or_else(|| "-".into()),
                    |l| format!("{} / {} ({})", ms(l.p50_us), ms(l.p99_us), l.samples)
                ),
                p.lag_ms.map_or("-".into(), |l| format!("{l:.1} ms")),
                if p.sustained() { "yes" } else { "**no**" }
            );
        }
        let _ = writeln!(
            t,
            "| {} | sustained (p99 < {} ms, lag < {} ms) | {} | | |",
            s.services,
            super::churn::GOAL_P99_MS,
            super::churn::BACKLOG_MS,
            super::churn::sustained_rate(&a.churn_rates)
                .map_or("none of the rates".into(), |r| format!("**{r}/s**"))
        );
    }
    t
}

fn ms(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1e3)
    }
}

/// `a` relative to `b` pair by pair (`stats::paired`), with its 95%
/// interval; the ratio of the medians where there are no pairs.
fn ratio_of(a: &Rate, b: &Rate) -> String {
    match super::stats::paired(a, b) {
        Some(p) => format!("{:.2}x ({:.2}-{:.2})", p.median, p.low, p.high),
        None => ratio(a.median, b.median),
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

fn n_label(n: usize) -> String {
    match n {
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

fn find<'a>(size: &'a SizeResult, name: &str) -> Option<&'a VariantResult> {
    size.variants
        .iter()
        .find(|v| v.variant == name && v.error.is_none())
}

/// The data-plane table of one size, as Markdown.
fn data_table(size: &SizeResult) -> String {
    let mut t = String::new();
    let direct = find(size, "direct");
    let legacy = find(size, "iptables-legacy");
    let _ = writeln!(
        t,
        "| variant | ruleset | conn/s last | vs direct | vs legacy | connect p50 / p99 last | conn/s random | vs direct | connect p50 / p99 random | RR/s | vs direct | Gbit/s | vs direct | other CPU max (repeats) |"
    );
    let _ = writeln!(
        t,
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for v in &size.variants {
        if let Some(err) = &v.error {
            let _ = writeln!(
                t,
                "| {} | {} | failed: {} ||||||||||||",
                v.variant,
                v.ruleset.as_deref().unwrap_or("-"),
                err.replace('|', "/")
            );
            continue;
        }
        let d =
            |f: fn(&VariantResult) -> &Rate| direct.map_or("-".into(), |d| ratio_of(f(v), f(d)));
        let l =
            |f: fn(&VariantResult) -> &Rate| legacy.map_or("-".into(), |l| ratio_of(f(v), f(l)));
        let _ = writeln!(
            t,
            "| {} | {} | {:.0} | {} | {} | {:.1} / {:.1} µs | {:.0} | {} | {:.1} / {:.1} µs | {:.0} | {} | {:.2} | {} | {:.0}% ({}) |",
            v.variant,
            v.ruleset.as_deref().unwrap_or("-"),
            v.connect_last.rate.median,
            d(|v| &v.connect_last.rate),
            l(|v| &v.connect_last.rate),
            v.connect_last.latency.p50_us,
            v.connect_last.latency.p99_us,
            v.connect_random.rate.median,
            d(|v| &v.connect_random.rate),
            v.connect_random.latency.p50_us,
            v.connect_random.latency.p99_us,
            v.rr.rate.median,
            d(|v| &v.rr.rate),
            v.bulk_gbit.median,
            d(|v| &v.bulk_gbit),
            v.foreign_cpu.iter().copied().fold(0.0, f64::max) * 100.0,
            v.repeated_rounds,
        );
    }
    t
}

fn control_table(r: &Results) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| services | sluice reconciler | agent start→ready: manifest dir / API | agent first-sync reconcile (API) | agent (API) VmHWM after first sync / after changes | agent B/service (VmHWM / N) | agent B/service (marginal) | iptables-legacy --noflush | iptables-legacy restore | iptables-nft --noflush | iptables-nft restore | nft -f |"
    );
    let _ = writeln!(t, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for s in &r.sizes {
        let p = |k: &str| short_measure(s.control.programming.get(k));
        let agent = s.control.agent.as_ref();
        let start_to_ready = format!(
            "{} / {}",
            short_measure(s.control.agent_dir.as_ref().map(|a| &a.start_to_ready)),
            short_measure(agent.map(|a| &a.start_to_ready))
        );
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.services,
            p("sluice-reconciler"),
            start_to_ready,
            short_measure(agent.map(|a| &a.first_sync_reconcile)),
            agent.map_or("-".into(), |a| format!(
                "{} / {}",
                mb(a.vm_hwm_ready_kb),
                mb(a.vm_hwm_kb)
            )),
            agent
                .and_then(|a| a.bytes_per_service)
                .map_or("-".into(), |b| format!("{b:.0}")),
            marginal_bytes(r, s).map_or("-".into(), |b| format!("{b:.0}")),
            p("iptables-legacy-noflush"),
            p("iptables-legacy-restore"),
            p("iptables-nft-noflush"),
            p("iptables-nft-restore"),
            p("nftables"),
        );
    }
    t
}

/// A `/proc` `kB` figure (KiB) in MiB, so named.
fn mb(kb: Option<u64>) -> String {
    kb.map_or("-".into(), |kb| format!("{:.0} MiB", kb as f64 / 1024.0))
}

/// Agent memory per service beyond the smallest size of the run:
/// (VmHWM(N) - VmHWM(N0)) / (N - N0).
fn marginal_bytes(r: &Results, s: &SizeResult) -> Option<f64> {
    let base = r.sizes.first()?;
    if base.services >= s.services {
        return None;
    }
    let hwm = |s: &SizeResult| s.control.agent.as_ref().and_then(|a| a.vm_hwm_kb);
    let (b, v) = (hwm(base)?, hwm(s)?);
    Some((v as f64 - b as f64) * 1024.0 / (s.services - base.services) as f64)
}

fn not_measured_notes(r: &Results) -> String {
    let mut t = String::new();
    for s in &r.sizes {
        for (k, m) in &s.control.programming {
            if let Some(why) = &m.not_measured {
                let _ = writeln!(t, "- {} services, {k}: not measured: {why}", s.services);
            }
        }
        for (src, a) in [
            ("API", &s.control.agent),
            ("manifest dir", &s.control.agent_dir),
        ] {
            let Some(a) = a else { continue };
            for (k, m) in [
                (format!("agent ({src}) start→ready"), &a.start_to_ready),
                (format!("agent ({src}) first sync"), &a.first_sync_reconcile),
            ] {
                if let Some(why) = &m.not_measured {
                    let _ = writeln!(t, "- {} services, {k}: not measured: {why}", s.services);
                }
            }
        }
        for v in &s.variants {
            if v.ruleset.as_deref() == Some("collapsed") {
                let _ = writeln!(
                    t,
                    "- {} services, {}: data plane measured on the collapsed ruleset (complete KUBE-SERVICES chain / service-ips map, one shared chain for non-target services)",
                    s.services, v.variant
                );
            }
        }
    }
    t
}

fn churn_table(r: &Results) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| services | in-process reconciler p50 / p99 (changes) | agent via API p50 / p99 (changes) | agent via API, its own part (update→datapath) p50 / p99 | agent via manifest directory p50 / p99 (changes) |"
    );
    let _ = writeln!(t, "|--:|--:|--:|--:|--:|");
    for s in &r.sizes {
        let cell = |c: Option<&Churn>| match c {
            Some(Churn {
                latency: Some(l), ..
            }) => format!("{} / {} ({})", ms(l.p50_us), ms(l.p99_us), l.samples),
            Some(Churn {
                not_measured: Some(_),
                ..
            }) => "not measured".into(),
            _ => "-".into(),
        };
        let agent = s.control.agent.as_ref().map(|a| &a.churn);
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} |",
            s.services,
            cell(s.control.reconciler_churn.as_ref()),
            cell(agent),
            agent.map_or("-".into(), agent_internal_cell),
            cell(s.control.agent_dir.as_ref().map(|a| &a.churn)),
        );
    }
    t
}

/// The agent's own part of an endpoint change: per change when measured
/// so (API source), else the mean.
fn agent_internal_cell(c: &Churn) -> String {
    match (&c.agent_internal, c.agent_update_to_datapath_mean_ms) {
        (Some(a), _) => format!(
            "{} / {} (mean {:.2} ms)",
            ms(a.p50_us),
            ms(a.p99_us),
            a.mean_us / 1e3
        ),
        (None, Some(m)) => format!("{m:.2} ms"),
        (None, None) => "-".into(),
    }
}

struct Goal {
    what: String,
    target: String,
    measured: String,
    met: Option<bool>,
}

/// " (95% interval a-b)" of `a` relative to `b`, or nothing without
/// pairs.
fn interval(a: &Rate, b: &Rate) -> String {
    super::stats::paired(a, b).map_or(String::new(), |p| {
        format!(" (95% interval {:.3}-{:.3})", p.low, p.high)
    })
}

fn goals(r: &Results) -> Vec<Goal> {
    let mut out = Vec::new();
    let rate = |s: &SizeResult, v: &str| find(s, v).map(|v| v.connect_last.rate.median);
    let size = |n: usize| r.sizes.iter().find(|s| s.services == n);
    let first = r.sizes.first();
    let last = r.sizes.last();

    // Flat: sluice's connect rate and p50 at the largest N vs the smallest,
    // each relative to direct in the same size (machine conditions drift
    // between sizes; the ratio within one size does not).
    if let (Some(a), Some(b)) = (first, last) {
        if let (Some(sa), Some(sb), Some(da), Some(db)) = (
            find(a, "sluice"),
            find(b, "sluice"),
            find(a, "direct"),
            find(b, "direct"),
        ) {
            let rel_rate = |s: &VariantResult, d: &VariantResult| {
                relative(&s.connect_last.rate, &d.connect_last.rate)
            };
            let rel_p50 = |s: &VariantResult, d: &VariantResult| {
                s.connect_last.latency.p50_us / d.connect_last.latency.p50_us
            };
            let r_rate = rel_rate(sb, db) / rel_rate(sa, da);
            let r_p50 = rel_p50(sb, db) / rel_p50(sa, da);
            out.push(Goal {
                what: format!("sluice flat from {} to {} services", a.services, b.services),
                target: "no loss of conn/s or p50 beyond 5% (relative to direct)".into(),
                measured: format!(
                    "conn/s {:.0} -> {:.0}, {:.3}x -> {:.3}x direct ({:+.1}%); p50 {:.1} -> {:.1} µs, {:.3}x -> {:.3}x direct ({:+.1}%)",
                    sa.connect_last.rate.median,
                    sb.connect_last.rate.median,
                    rel_rate(sa, da),
                    rel_rate(sb, db),
                    (r_rate - 1.0) * 100.0,
                    sa.connect_last.latency.p50_us,
                    sb.connect_last.latency.p50_us,
                    rel_p50(sa, da),
                    rel_p50(sb, db),
                    (r_p50 - 1.0) * 100.0
                ),
                met: Some(r_rate >= 0.95 && r_p50 <= 1.05),
            });
        }
    }
    // Within 5% of direct, at every N: the TC path routed by the stack,
    // and with host routing.
    for (variant, what) in [
        (
            "sluice",
            "sluice within 5% of direct (connections/s, every N)",
        ),
        (
            "sluice-host-routing",
            "sluice-host-routing (TC path, --host-routing) within 5% of direct (every N)",
        ),
    ] {
        let mut worst: Option<(usize, f64, f64, String)> = None;
        for s in &r.sizes {
            if let (Some(sl), Some(d)) = (find(s, variant), find(s, "direct")) {
                let rr = relative(&sl.connect_last.rate, &d.connect_last.rate);
                let lr = sl.connect_last.latency.p50_us / d.connect_last.latency.p50_us;
                if worst.as_ref().is_none_or(|(_, w, _, _)| rr < *w) {
                    let ci = interval(&sl.connect_last.rate, &d.connect_last.rate);
                    worst = Some((s.services, rr, lr, ci));
                }
            }
        }
        if let Some((n, rr, lr, ci)) = worst {
            out.push(Goal {
                what: what.into(),
                target: ">= 0.95x direct".into(),
                measured: format!(
                    "worst {rr:.3}x{ci} conn/s at {n} services (p50 {lr:.3}x direct)"
                ),
                met: Some(rr >= 0.95),
            });
        }
    }
    // A variant's conn/s against direct with both targets pooled (for
    // the variants whose targets are both the pods).
    let pooled = |v: &VariantResult, d: &VariantResult| {
        (relative(&v.connect_last.rate, &d.connect_last.rate)
            + relative(&v.connect_random.rate, &d.connect_random.rate))
            / 2.0
    };
    // Connect p50 (both targets averaged), relative to direct: steadier
    // than the rates on a shared machine.
    let p50 = |v: &VariantResult, d: &VariantResult| {
        (v.connect_last.latency.p50_us + v.connect_random.latency.p50_us)
            / (d.connect_last.latency.p50_us + d.connect_random.latency.p50_us)
    };
    // What empty programs on the same hooks cost (`floor` variant), as a
    // note for the goals whose variant uses those hooks.
    let floor_note = |floor: &str, hooks: &str| {
        let mut worst: Option<(f64, f64)> = None;
        for s in &r.sizes {
            if let (Some(d), Some(f)) = (find(s, "direct"), find(s, floor)) {
                let (wc, wl) = worst.unwrap_or((f64::MAX, f64::MIN));
                worst = Some((wc.min(pooled(f, d)), wl.max(p50(f, d))));
            }
        }
        worst.map_or(String::new(), |(f, fl)| {
            format!(
                "; empty programs on {hooks} ({floor}): worst {f:.3}x conn/s, connect p50 {fl:.3}x"
            )
        })
    };
    // The A/A control: a second setup identical to direct's. How far it
    // reads from 1.00x is the least difference this run can tell.
    let mut aa: Option<(f64, f64)> = None;
    for s in &r.sizes {
        if let (Some(d), Some(a)) = (find(s, "direct"), find(s, "direct-again")) {
            let c = pooled(a, d);
            let (lo, hi) = aa.unwrap_or((f64::MAX, f64::MIN));
            aa = Some((lo.min(c), hi.max(c)));
        }
    }
    if let Some((lo, hi)) = aa {
        out.push(Goal {
            what: "the A/A control: direct-again (a second direct setup) against direct (every N)"
                .into(),
            target: "1.00x (what it misses by is the bench's own resolution)".into(),
            measured: format!("{lo:.3}x to {hi:.3}x conn/s"),
            met: None,
        });
    }
    let tc_floor = floor_note("tc-floor", "the TC hooks");
    let sock_floor = floor_note("sock-floor", "the TC and socket hooks");
    // Socket balancing: at least 0.98x direct on new connections and 0.99x
    // on request/response and bulk, at every N (the worst of each).
    let mut worst_sock: Option<((f64, String), f64, f64)> = None;
    for s in &r.sizes {
        if let (Some(sk), Some(d)) = (find(s, "sluice-sock"), find(s, "direct")) {
            let c = relative(&sk.connect_last.rate, &d.connect_last.rate);
            let q = relative(&sk.rr.rate, &d.rr.rate);
            let b = relative(&sk.bulk_gbit, &d.bulk_gbit);
            let (wc, wq, wb) =
                worst_sock.unwrap_or(((f64::MAX, String::new()), f64::MAX, f64::MAX));
            let wc = if c < wc.0 {
                (c, interval(&sk.connect_last.rate, &d.connect_last.rate))
            } else {
                wc
            };
            worst_sock = Some((wc, wq.min(q), wb.min(b)));
        }
    }
    if let Some(((c, ci), q, b)) = worst_sock {
        out.push(Goal {
            what: "sluice-sock (socket balancing) near direct (every N)".into(),
            target: ">= 0.98x conn/s, >= 0.99x rr/s and bulk".into(),
            measured: format!("worst {c:.3}x{ci} conn/s, {q:.3}x rr/s, {b:.3}x bulk{sock_floor}"),
            met: Some(c >= 0.98 && q >= 0.99 && b >= 0.99),
        });
    }
    // Non-service traffic within 1% of no sluice: the client connecting
    // to the pods with sluice attached and programmed, against direct
    // (both targets pooled: both are the pods), with what empty programs
    // on the same hooks cost beside it.
    for (variant, config, floor) in [
        (
            "sluice-sock-passthrough",
            "the default --socket-lb=all",
            &sock_floor,
        ),
        ("sluice-passthrough", "the TC path alone", &tc_floor),
    ] {
        let mut worst: Option<(f64, f64, f64, f64)> = None;
        for s in &r.sizes {
            let (Some(d), Some(p)) = (find(s, "direct"), find(s, variant)) else {
                continue;
            };
            let c = pooled(p, d);
            let q = relative(&p.rr.rate, &d.rr.rate);
            let b = relative(&p.bulk_gbit, &d.bulk_gbit);
            let l = p50(p, d);
            let (wc, wq, wb, wl) = worst.unwrap_or((f64::MAX, f64::MAX, f64::MAX, f64::MIN));
            worst = Some((wc.min(c), wq.min(q), wb.min(b), wl.max(l)));
        }
        if let Some((c, q, b, l)) = worst {
            out.push(Goal {
                what: format!(
                    "non-service traffic within 1% of no sluice ({variant}: {config}, every N)"
                ),
                target: ">= 0.99x direct conn/s, rr/s and bulk; connect p50 <= 1.01x".into(),
                measured: format!(
                    "worst {c:.3}x conn/s, {q:.3}x rr/s, {b:.3}x bulk, connect p50 {l:.3}x{floor}"
                ),
                met: Some(c >= 0.99 && q >= 0.99 && b >= 0.99 && l <= 1.01),
            });
        }
    }
    if let Some(s) = size(10_000) {
        for (v, want) in [("iptables-legacy", 2.5), ("iptables-nft", 5.0)] {
            if let (Some(sl), Some(o)) = (rate(s, "sluice"), rate(s, v)) {
                let random = find(s, "sluice")
                    .zip(find(s, v))
                    .map(|(a, b)| a.connect_random.rate.median / b.connect_random.rate.median)
                    .unwrap_or(0.0);
                out.push(Goal {
                    what: format!("connections/s vs {v} at 10,000 services"),
                    target: format!(">= {want}x"),
                    measured: format!(
                        "{:.2}x (last service), {random:.2}x (random service)",
                        sl / o
                    ),
                    met: Some(sl / o >= want),
                });
            }
        }
        let prog = s
            .control
            .programming
            .get("sluice-reconciler")
            .and_then(|m| m.seconds);
        let agent = s
            .control
            .agent
            .as_ref()
            .and_then(|a| a.start_to_ready.seconds);
        let agent_sync = s
            .control
            .agent
            .as_ref()
            .and_then(|a| a.first_sync_reconcile.seconds);
        if let Some(p) = prog {
            out.push(Goal {
                what: "programming 10,000 services x 10 endpoints from empty".into(),
                target: "< 0.5 s".into(),
                measured: format!(
                    "reconciler {}; agent first-sync reconcile {}; agent start→ready {}",
                    seconds(p),
                    agent_sync.map_or("-".into(), seconds),
                    agent.map_or("-".into(), seconds)
                ),
                met: Some(p < 0.5 && agent_sync.is_none_or(|a| a < 0.5)),
            });
        }
        if let Some(l) = s
            .control
            .reconciler_churn
            .as_ref()
            .and_then(|c| c.latency.as_ref())
        {
            let agent_l = s
                .control
                .agent
                .as_ref()
                .and_then(|a| a.churn.latency.as_ref());
            out.push(Goal {
                what: "endpoint change to datapath at 10,000 services".into(),
                target: "p99 < 5 ms".into(),
                measured: format!(
                    "in-process reconciler p99 {}; agent via API p99 {}",
                    ms(l.p99_us),
                    agent_l.map_or("-".into(), |a| ms(a.p99_us))
                ),
                met: Some(l.p99_us < 5000.0 && agent_l.is_none_or(|a| a.p99_us < 5000.0)),
            });
        }
    }
    if let Some(s) = last {
        if let Some(b) = s.control.agent.as_ref().and_then(|a| a.bytes_per_service) {
            let marginal = marginal_bytes(r, s);
            let ready = s
                .control
                .agent
                .as_ref()
                .and_then(|a| a.vm_hwm_ready_kb)
                .map(|kb| kb as f64 * 1024.0 / s.services as f64);
            out.push(Goal {
                what: format!("agent memory per service at {} services", s.services),
                target: "< 1 kB/service (VmHWM / services)".into(),
                measured: format!(
                    "{} B/service after the first sync, {b:.0} B/service after the endpoint changes ({} B/service marginal)",
                    ready.map_or("-".into(), |m| format!("{m:.0}")),
                    marginal.map_or("-".into(), |m| format!("{m:.0}"))
                ),
                met: Some(b < 1024.0),
            });
        }
    }
    if let Some(s) = r.sizes.iter().find(|s| s.services == 100_000) {
        out.extend(issue17_goals(s));
    }
    out
}

/// The control-plane goals at 100,000 services (API-fed agent).
fn issue17_goals(s: &SizeResult) -> Vec<Goal> {
    let mut out = Vec::new();
    let Some(a) = &s.control.agent else {
        return out;
    };
    if let Some(kb) = a.vm_hwm_kb {
        // `/proc` counts in KiB; the goal is in decimal megabytes.
        let bytes = kb as f64 * 1024.0;
        out.push(Goal {
            what: "agent memory at 100,000 services".into(),
            target: "<= 100 MB (VmHWM; 95.4 MiB)".into(),
            measured: format!("{:.0} MiB ({:.0} MB)", bytes / 1048576.0, bytes / 1e6),
            met: Some(bytes <= 100e6),
        });
    }
    if let (Some(ready), first) = (a.start_to_ready.seconds, a.first_sync_reconcile.seconds) {
        out.push(Goal {
            what: "start to ready at 100,000 services (API)".into(),
            target: "< 5 s, first reconcile < 1 s".into(),
            measured: format!(
                "{}, first reconcile {}",
                seconds(ready),
                first.map_or("-".into(), seconds)
            ),
            met: Some(ready < 5.0 && first.is_some_and(|f| f < 1.0)),
        });
    }
    if let Some(p) = &s.control.agent_prealloc {
        if let (Some(ready), first) = (p.start_to_ready.seconds, p.first_sync_reconcile.seconds) {
            out.push(Goal {
                what: "start to ready at 100,000 services (API), `--preallocate-maps`".into(),
                target: "< 5 s, first reconcile < 1 s".into(),
                measured: format!(
                    "{}, first reconcile {}; VmHWM {}",
                    seconds(ready),
                    first.map_or("-".into(), seconds),
                    mb(p.vm_hwm_kb)
                ),
                met: Some(ready < 5.0 && first.is_some_and(|f| f < 1.0)),
            });
        }
    }
    if let Some(r) = &a.relist {
        out.push(Goal {
            what: "a relist at 100,000 services (API), nothing changed".into(),
            target: "no more memory than the first list (VmHWM), no map write".into(),
            measured: relist_text(r),
            met: Some(
                r.writes == 0.0
                    && matches!((r.vm_hwm_before_kb, r.vm_hwm_after_kb), (Some(b), Some(a)) if a <= b),
            ),
        });
    }
    if let Some(l) = &a.churn.latency {
        out.push(Goal {
            what: "one endpoint change to datapath at 100,000 services (API)".into(),
            target: "p99 < 2 ms".into(),
            measured: format!("p50 {} / p99 {}", ms(l.p50_us), ms(l.p99_us)),
            met: Some(l.p99_us < 2000.0),
        });
    }
    if !a.churn_rates.is_empty() {
        let sustained = super::churn::sustained_rate(&a.churn_rates);
        let at_1000 = a.churn_rates.iter().find(|p| p.rate == 1000);
        out.push(Goal {
            what: "endpoint change under 1,000 changes/s at 100,000 services (API)".into(),
            target: "p99 < 5 ms, no backlog".into(),
            measured: format!(
                "{}; sustained up to {}",
                at_1000
                    .and_then(|p| p.latency.as_ref())
                    .map_or("-".into(), |l| format!("p99 {} at 1000/s", ms(l.p99_us))),
                sustained.map_or("none of the rates".into(), |r| format!("{r}/s"))
            ),
            met: Some(sustained.is_some_and(|r| r >= 1000)),
        });
    }
    out
}

/// The source-line profile: per variant and program, its samples and its
/// hottest lines, each as a share of the program's samples.
pub fn profile_table(profiles: &[super::profile::ProgProfile]) -> String {
    let mut t = String::from(
        "| variant | program | samples (share of all) | source line | share of the program |\n|---|---|--:|---|--:|\n",
    );
    for p in profiles
        .iter()
        .filter(|p| p.samples >= super::profile::MIN_SAMPLES)
    {
        for (i, (line, n)) in p.lines.iter().enumerate() {
            let (variant, program, samples) = if i == 0 {
                (
                    p.variant.as_str(),
                    p.program.as_str(),
                    format!(
                        "{} ({:.2}%)",
                        p.samples,
                        100.0 * p.samples as f64 / p.total.max(1) as f64
                    ),
                )
            } else {
                ("", "", String::new())
            };
            let _ = writeln!(
                t,
                "| {variant} | {program} | {samples} | `{}` | {:.1}% |",
                line.replace('|', "\\|").replace('`', "'"),
                100.0 * *n as f64 / p.samples as f64
            );
        }
    }
    t
}

/// The full Markdown report.
/// What each program costs per run, service and non-service traffic side
/// by side, one row per variant and program.
pub fn prog_cost_table(costs: &[super::progcost::ProgCost]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| variant | program | service: ns/run | runs | non-service: ns/run | runs | non-service, test run: ns/run (pod reply) | one test run each, median ns: service SYN / service ACK / pod ACK |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---|---|");
    // Programs that did not run on traffic (the IPv6 halves, the socket
    // programs of `sluice`, the egress program a variant did not attach)
    // are left out; a test run alone does not make a row.
    let mut rows: Vec<(&str, &str)> = costs
        .iter()
        .filter(|c| c.runs > 0 && !c.traffic.ends_with("(test run)"))
        .map(|c| (c.variant.as_str(), c.program.as_str()))
        .collect();
    rows.sort();
    rows.dedup();
    for (variant, program) in rows {
        let cell = |traffic: &str| {
            costs
                .iter()
                .find(|c| c.variant == variant && c.program == program && c.traffic == traffic)
                .map_or(("-".to_owned(), "-".to_owned()), |c| {
                    (format!("{:.0}", c.ns_per_run), c.runs.to_string())
                })
        };
        let (s, sr) = cell("service");
        let (n, nr) = cell("non-service");
        let (i, _) = cell("non-service (test run)");
        let i = match cell("pod reply (test run)") {
            (r, _) if r != "-" => format!("{i} ({r})"),
            _ => i,
        };
        let (syn, _) = cell("service SYN (test run)");
        let (ack, _) = cell("service ACK (test run)");
        let (pod, _) = cell("pod ACK (test run)");
        let paths = if syn == "-" && ack == "-" {
            "-".to_owned()
        } else {
            format!("{syn} / {ack} / {pod}")
        };
        let _ = writeln!(
            t,
            "| {variant} | {program} | {s} | {sr} | {n} | {nr} | {i} | {paths} |"
        );
    }
    t
}

/// The paths whose programs the per-connection table adds up: (what,
/// variant, its traffic, the floor variant with empty programs on the same
/// hooks). A floor ran pod traffic only: the same packets on the same
/// hooks as a service connection.
const PATHS: [(&str, &str, &str, &str); 5] = [
    (
        "pod to ClusterIP, socket path",
        "sluice-sock",
        "service",
        "sock-floor",
    ),
    ("pod to ClusterIP, TC path", "sluice", "service", "tc-floor"),
    (
        "pod to ClusterIP, TC path, host routing",
        "sluice-host-routing",
        "service",
        "tc-floor",
    ),
    (
        "pod to pod, socket path (sluice-sock-passthrough)",
        "sluice-sock",
        "non-service",
        "sock-floor",
    ),
    (
        "pod to pod, TC path (sluice-passthrough)",
        "sluice",
        "non-service",
        "tc-floor",
    ),
];

/// Nanoseconds the programs of `variant` ran per connection of `traffic`
/// (every program, every packet of `progcost::CONNECTS` connections).
fn per_connection_ns(
    costs: &[super::progcost::ProgCost],
    variant: &str,
    traffic: &str,
) -> Option<f64> {
    let runs: Vec<_> = costs
        .iter()
        .filter(|c| c.variant == variant && c.traffic == traffic && c.runs > 0)
        .collect();
    if runs.is_empty() {
        return None;
    }
    let total: f64 = runs.iter().map(|c| c.ns_per_run * c.runs as f64).sum();
    Some(total / super::progcost::CONNECTS as f64)
}

/// What the programs of each path cost per connection, from the run-time
/// statistics (which time the programs, not the machine's noise), against
/// the empty programs on the same hooks and against a direct connection
/// (the median time per connection of `direct` to the last target in this
/// run): `bound` is the rate the path would read against its floor if the
/// programs' extra time were all it added.
/// How the sluice variants' new flows started during the rounds: which
/// path of a new flow the rates measured.
pub fn flows_line(flows: &[super::FlowCounts]) -> String {
    if flows.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = flows
        .iter()
        .map(|f| {
            let all = (f.fresh + f.reselected).max(1);
            format!(
                "{} {} fresh, {} on a finished flow's tuple ({:.0}%), {} of them taken over in place",
                f.variant,
                f.fresh,
                f.reselected,
                f.reselected as f64 * 100.0 / all as f64,
                f.taken_over
            )
        })
        .collect();
    format!(
        "New flows on the TC path in the rounds (the client resets each connection and reuses its ports; no agent collects closed entries): {}.\n\n",
        parts.join("; ")
    )
}

pub fn per_connection_table(size: &SizeResult) -> String {
    let mut t = String::new();
    let direct_ns = find(size, "direct")
        .map(|d| d.connect_last.rate.median)
        .filter(|r| *r > 0.0)
        .map(|r| 1e9 / r);
    let mut rows = Vec::new();
    for (what, variant, traffic, floor) in PATHS {
        let (Some(programs), Some(empty)) = (
            per_connection_ns(&size.prog_costs, variant, traffic),
            per_connection_ns(&size.prog_costs, floor, "non-service"),
        ) else {
            continue;
        };
        let above = programs - empty;
        let (share, bound) = match direct_ns {
            Some(d) => (
                format!("{:.1}%", 100.0 * above / d),
                format!("{:.3}x", d / (d + above.max(0.0))),
            ),
            None => ("-".to_owned(), "-".to_owned()),
        };
        rows.push(format!(
            "| {what} | {programs:.0} | {empty:.0} ({floor}) | {above:.0} | {share} | {bound} |"
        ));
    }
    if rows.is_empty() {
        return t;
    }
    let _ = writeln!(
        t,
        "| path | programs, ns per connection | empty programs, same hooks | above them | share of a direct connection ({}) | bound vs its floor |",
        direct_ns.map_or("-".to_owned(), |d| format!("{:.1} µs", d / 1000.0))
    );
    let _ = writeln!(t, "|---|--:|--:|--:|--:|--:|");
    for row in rows {
        let _ = writeln!(t, "{row}");
    }
    t
}

pub fn markdown(r: &Results) -> String {
    let mut t = String::new();
    let m = &r.machine;
    let _ = writeln!(
        t,
        "Machine: {} CPUs, {}, kernel {}, {:.1} GB RAM; {}; {}. Load average {} at start, {} at end. Run took {:.0} s{}.\n",
        m.cpus,
        m.cpu_model,
        m.kernel,
        m.mem_total_kb as f64 / 1048576.0,
        m.iptables,
        m.nft,
        m.loadavg_start,
        m.loadavg_end,
        r.seconds,
        if r.config.quick { " (--quick)" } else { "" }
    );
    let c = &r.config;
    let blocks = c.connect_blocks_per_round.max(1);
    let _ = writeln!(
        t,
        "Samples: {} recorded rounds (after {} unrecorded warm-up round(s)), each in {} block(s), every variant in turn within each block pass; per round and variant {} recorded connects per target service (after {} warm-up connects), {:.1} s of request/response, {:.1} s of bulk transfer, shared out among the blocks. Connect percentiles pool {} samples per variant and target; rates are the median of the {} per-block rates. \"Other CPU\" is the CPU time other processes (and hypervisor steal) used during a block, as a share of one CPU; a block above {:.0}% is measured again, at most twice.\n",
        c.rounds,
        c.warmup_rounds,
        blocks,
        c.connects_per_target_per_round,
        c.warmup_connects,
        c.rr_seconds_per_round,
        c.bulk_seconds_per_round,
        c.rounds * c.connects_per_target_per_round,
        c.rounds * blocks,
        c.foreign_limit * 100.0
    );
    for s in r.sizes.iter().filter(|_| !c.control_only) {
        let _ = writeln!(
            t,
            "### {} services x {} endpoints (last = #{}, random = #{})\n",
            s.services, c.endpoints_per_service, s.last_index, s.random_index
        );
        t.push_str(&data_table(s));
        t.push('\n');
        if !s.prog_costs.is_empty() {
            let _ = writeln!(t, "Per-program cost (kernel BPF run-time statistics):\n");
            t.push_str(&prog_cost_table(&s.prog_costs));
            t.push('\n');
            let per_connection = per_connection_table(s);
            if !per_connection.is_empty() {
                let _ = writeln!(
                    t,
                    "Programs per connection (every program's run time on every packet of {} connections, over the connections):\n",
                    super::progcost::CONNECTS
                );
                t.push_str(&per_connection);
                t.push('\n');
            }
        }
        t.push_str(&flows_line(&s.flows));
        if !s.profiles.is_empty() {
            let _ = writeln!(
                t,
                "Where the programs' time goes ({}connections to the service under `perf record -e cpu-clock -a -g`, samples in each program's JITed code by source line, and in the helpers and kernel functions it called by the line of the call (`-> function`); a cache miss shows on the line of its load or the next):\n",
                match s.profiles[0].connects {
                    0 => String::new(),
                    n => format!("{n} "),
                }
            );
            t.push_str(&profile_table(&s.profiles));
            t.push('\n');
        }
    }
    let _ = writeln!(
        t,
        "### Control plane: programming N services x 10 endpoints from empty\n"
    );
    t.push_str(&control_table(r));
    let notes = not_measured_notes(r);
    if !notes.is_empty() {
        let _ = writeln!(t, "\n{notes}");
    }
    if let Some(w) = &r.map_writes {
        let _ = writeln!(t, "\n### Map writes: the kernel's cost per entry\n");
        t.push_str(&map_writes_table(w));
    }
    let _ = writeln!(t, "\n### Endpoint change to datapath (sluice)\n");
    t.push_str(&churn_table(r));
    if let Some(e) = &r.events {
        let _ = writeln!(t, "\n### Datapath events (`sluice monitor`)\n");
        t.push_str(&events_table(e));
    }
    let rates = churn_rate_table(r);
    if !rates.is_empty() {
        let _ = writeln!(
            t,
            "\n### Endpoint change to datapath under churn (agent via API)\n"
        );
        t.push_str(&rates);
    }
    let _ = writeln!(t, "\n### Goals\n");
    let _ = writeln!(t, "| goal | target | measured | met |");
    let _ = writeln!(t, "|---|---|---|---|");
    for g in goals(r) {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} |",
            g.what,
            g.target,
            g.measured,
            match g.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            }
        );
    }
    t
}

/// One line on a relist: time, writes, VmHWM before and after.
pub fn relist_text(r: &super::control::Relist) -> String {
    format!(
        "{} to relist and settle, {} map writes, VmHWM {} before / {} after",
        seconds(r.seconds),
        r.writes,
        mb(r.vm_hwm_before_kb),
        mb(r.vm_hwm_after_kb)
    )
}

fn map_writes_table(w: &super::mapwrites::MapWriteCost) -> String {
    let mut t = format!(
        "{} entries (`u32` key, 24-byte value, as `sl_backends`) written into a fresh map, one `bpf()` call per batch.\n\n| map | entries per call | ns per entry | 100,000 services x 10 endpoints (2.1 M entries) |\n|---|--:|--:|--:|\n",
        w.entries
    );
    for c in &w.cases {
        let _ = writeln!(
            t,
            "| {} | {} | {:.0} | {} |",
            c.map,
            c.batch,
            c.ns_per_entry,
            seconds(c.ns_per_entry * 2.1e6 / 1e9)
        );
    }
    t.push_str("\nThe last column is the kernel time alone that programming 100,000 services from empty needs at that cost (1 M backends, 1.1 M masters and slots); the agent writes a unit's backends and a frontend's slots as one batch of about 10.\n");
    t
}

fn events_table(e: &super::events::EventsCost) -> String {
    let mut t = format!(
        "`sl_ingress` run time per packet (kernel BPF statistics), median of {} rounds.\n\n| case | packets per round | ns per packet |\n|---|---|---|\n",
        e.rounds
    );
    for c in &e.cases {
        let _ = writeln!(
            t,
            "| {} | {} | {:.1} |",
            c.case, c.packets_per_round, c.ns_per_packet
        );
    }
    t
}

const COLORS: [(&str, &str); 12] = [
    ("direct", "#555555"),
    ("direct-again", "#aaaaaa"),
    ("sluice", "#1f77b4"),
    ("sluice-sock", "#17becf"),
    ("sluice-host-routing", "#393b79"),
    ("sluice-passthrough", "#9467bd"),
    ("sluice-sock-passthrough", "#c5b0d5"),
    ("tc-floor", "#8c564b"),
    ("sock-floor", "#c49c94"),
    ("iptables-legacy", "#d62728"),
    ("iptables-nft", "#ff7f0e"),
    ("nftables", "#2ca02c"),
];

struct Axis {
    lo: f64,
    hi: f64,
}

/// 1, 2, 5, 10, 20, 50, ...
fn steps(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut e = lo.log10().floor() as i32 - 1;
    while 10f64.powi(e) <= hi * 10.0 {
        for m in [1.0, 2.0, 5.0] {
            out.push(m * 10f64.powi(e));
        }
        e += 1;
    }
    out
}

impl Axis {
    /// A log axis from the largest 1-2-5 step below the smallest value to
    /// the smallest step above the largest, with some room.
    fn log(values: impl Iterator<Item = f64>) -> Self {
        let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
        for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            return Self { lo: 0.0, hi: 1.0 };
        }
        let grid = steps(lo, hi);
        let bottom = grid
            .iter()
            .copied()
            .filter(|s| *s <= lo / 1.15)
            .fold(lo / 1.15, |_, s| s);
        let top = grid
            .iter()
            .copied()
            .find(|s| *s >= hi * 1.15)
            .unwrap_or(hi * 1.15);
        Self {
            lo: bottom.log10(),
            hi: top.log10(),
        }
    }

    fn pos(&self, v: f64, len: f64) -> f64 {
        let span = (self.hi - self.lo).max(1e-9);
        (v.max(1e-12).log10() - self.lo) / span * len
    }

    fn ticks(&self) -> Vec<f64> {
        let (lo, hi) = (10f64.powf(self.lo), 10f64.powf(self.hi));
        steps(lo, hi)
            .into_iter()
            .filter(|t| *t >= lo * 0.999 && *t <= hi * 1.001)
            .collect()
    }
}

fn tick_label(v: f64) -> String {
    if v >= 1000.0 {
        let k = v / 1000.0;
        if k.fract() == 0.0 {
            format!("{k:.0}k")
        } else {
            format!("{k:.1}k")
        }
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

#[allow(clippy::too_many_arguments)]
fn panel(
    out: &mut String,
    r: &Results,
    x0: f64,
    title: &str,
    unit: &str,
    value: fn(&VariantResult, bool) -> f64,
) {
    let (w, h, top, left) = (400.0, 300.0, 50.0, 60.0);
    let sizes: Vec<usize> = r.sizes.iter().map(|s| s.services).collect();
    let xmax = sizes.iter().copied().max().unwrap_or(1).max(10) as f64;
    let xpos = |n: usize| x0 + left + (n as f64).log10() / xmax.log10() * w;
    let axis = Axis::log(
        r.sizes
            .iter()
            .flat_map(|s| s.variants.iter())
            .filter(|v| v.error.is_none())
            .flat_map(|v| [value(v, true), value(v, false)]),
    );
    let ypos = |v: f64| top + h - axis.pos(v, h);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="30" font-size="15" font-weight="bold">{title}</text>"#,
        x0 + left
    );
    let _ = writeln!(
        out,
        r##"<rect x="{:.1}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>"##,
        x0 + left
    );
    for t in axis.ticks() {
        let y = ypos(t);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            x0 + left,
            x0 + left + w,
            x0 + left - 5.0,
            y + 4.0,
            tick_label(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" transform="rotate(-90 {:.1} {:.1})" text-anchor="middle">{unit}</text>"#,
        x0 + 15.0,
        top + h / 2.0,
        x0 + 15.0,
        top + h / 2.0
    );
    for &n in &sizes {
        let x = xpos(n);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            top + h,
            top + h + 16.0,
            n_label(n)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">services (10 endpoints each, log scale)</text>"#,
        x0 + left + w / 2.0,
        top + h + 36.0
    );
    for (name, color) in COLORS {
        for last in [true, false] {
            let points: Vec<(f64, f64, bool)> = r
                .sizes
                .iter()
                .filter_map(|s| {
                    let v = s
                        .variants
                        .iter()
                        .find(|v| v.variant == name && v.error.is_none())?;
                    let y = value(v, last);
                    (y > 0.0).then(|| {
                        (
                            xpos(s.services),
                            ypos(y),
                            v.ruleset.as_deref() == Some("collapsed"),
                        )
                    })
                })
                .collect();
            if points.is_empty() {
                continue;
            }
            let path: Vec<String> = points
                .iter()
                .map(|(x, y, _)| format!("{x:.1},{y:.1}"))
                .collect();
            let dash = if last {
                ""
            } else {
                r#" stroke-dasharray="5,4" opacity="0.6""#
            };
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                path.join(" ")
            );
            for (x, y, collapsed) in points {
                let fill = if collapsed { "white" } else { color };
                let _ = writeln!(
                    out,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{fill}" stroke="{color}" stroke-width="1.5"/>"#
                );
            }
        }
    }
}

/// The chart: connect latency p50 and connections/s against N.
pub fn svg(r: &Results) -> String {
    let mut out = String::new();
    let (width, height) = (1000.0, 490.0);
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>"#
    );
    panel(
        &mut out,
        r,
        0.0,
        "Connect latency, p50",
        "µs (log scale)",
        |v, last| {
            if last {
                v.connect_last.latency.p50_us
            } else {
                v.connect_random.latency.p50_us
            }
        },
    );
    panel(
        &mut out,
        r,
        500.0,
        "New TCP connections per second",
        "connections/s (log scale)",
        |v, last| {
            if last {
                v.connect_last.rate.median
            } else {
                v.connect_random.rate.median
            }
        },
    );
    let mut x = 60.0;
    let y = 440.0;
    for (name, color) in COLORS {
        if !r.config.variants.iter().any(|v| v == name) {
            continue;
        }
        let _ = writeln!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{:.0}" y2="{y}" stroke="{color}" stroke-width="3"/><text x="{:.0}" y="{:.0}" font-size="12">{name}</text>"#,
            x + 20.0,
            x + 25.0,
            y + 4.0
        );
        x += 40.0 + name.len() as f64 * 7.0;
    }
    let _ = writeln!(
        out,
        r##"<text x="60" y="462" font-size="11" fill="#444">solid: last service (end of KUBE-SERVICES); dashed: random service; hollow marker: collapsed ruleset (see docs/performance.md)</text><text x="60" y="478" font-size="11" fill="#444">{} CPUs, {}, kernel {}; one run, variants interleaved round by round</text>"##,
        r.machine.cpus,
        r.machine
            .cpu_model
            .replace('&', "&amp;")
            .replace('<', "&lt;"),
        r.machine.kernel
    );
    out.push_str("</svg>\n");
    out
}

/// Writes results.json, report.md and connect.svg under `dir`, and prints
/// the report to stdout once the run is complete.
pub fn write_all(r: &Results, dir: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(r)?;
    fs::write(dir.join("results.json"), json).context("writing results.json")?;
    let mut md = markdown(r);
    if let Some(ns) = &r.north_south {
        md.push_str(&super::north_south::markdown(ns));
        fs::write(dir.join("north_south.svg"), super::north_south::svg(ns))
            .context("writing north_south.svg")?;
    }
    fs::write(dir.join("report.md"), &md).context("writing report.md")?;
    fs::write(dir.join("connect.svg"), svg(r)).context("writing connect.svg")?;
    if r.complete {
        println!("{md}");
        println!(
            "Wrote {0}/results.json, {0}/report.md and {0}/connect.svg",
            dir.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{progcost::ProgCost, stats::Rate, SizeResult, VariantResult};
    use super::*;

    fn cost(variant: &str, program: &str, traffic: &str, ns: f64, per_connection: u64) -> ProgCost {
        ProgCost {
            variant: variant.into(),
            program: program.into(),
            traffic: traffic.into(),
            runs: per_connection * super::super::progcost::CONNECTS as u64,
            ns_per_run: ns,
        }
    }

    #[test]
    fn per_connection_adds_every_program_and_weighs_the_rest_against_direct() {
        let mut size = SizeResult::default();
        let mut direct = VariantResult {
            variant: "direct".into(),
            ..VariantResult::default()
        };
        // 40,000 connections per second: 25 µs each.
        direct.connect_last.rate = Rate {
            median: 40_000.0,
            ..Rate::default()
        };
        size.variants.push(direct);
        size.prog_costs = vec![
            cost("sluice-sock", "sl_connect4", "service", 400.0, 1),
            cost("sluice-sock", "sl_ingress", "service", 100.0, 4),
            cost("sluice-sock", "sl_ingress", "service (test run)", 1.0e6, 4),
            cost("sock-floor", "floor_connect4", "non-service", 50.0, 1),
            cost("sock-floor", "tc_floor", "non-service", 50.0, 4),
        ];
        let t = per_connection_table(&size);
        // 400 + 4 x 100 = 800 ns against 250: 550 ns above, 2.2% of 25 µs.
        assert!(
            t.contains(
                "| pod to ClusterIP, socket path | 800 | 250 (sock-floor) | 550 | 2.2% | 0.978x |"
            ),
            "{t}"
        );
        assert!(t.contains("(25.0 µs)"), "{t}");
        // No row for a path whose variant did not run.
        assert!(!t.contains("TC path"), "{t}");
        size.prog_costs.clear();
        assert!(per_connection_table(&size).is_empty());
    }

    #[test]
    fn the_flows_line_says_which_path_the_new_flows_took() {
        assert!(flows_line(&[]).is_empty());
        let t = flows_line(&[super::super::FlowCounts {
            variant: "sluice".into(),
            fresh: 250,
            reselected: 750,
            taken_over: 700,
        }]);
        assert!(
            t.contains("sluice 250 fresh, 750 on a finished flow's tuple (75%), 700 of them taken over in place"),
            "{t}"
        );
    }

    #[test]
    fn the_profile_names_each_program_once_and_shares_its_own_samples() {
        let p = super::super::profile::ProgProfile {
            variant: "sluice-sock".into(),
            program: "sl_connect4".into(),
            samples: 200,
            total: 10_000,
            connects: 40_000,
            lines: vec![
                ("maps.rs:485  a | b".into(), 50),
                ("sock.rs:1  `x`".into(), 20),
            ],
        };
        let t = profile_table(&[p]);
        let rows: Vec<&str> = t.lines().skip(2).collect();
        assert_eq!(rows.len(), 2, "{t}");
        assert_eq!(
            rows[0],
            "| sluice-sock | sl_connect4 | 200 (2.00%) | `maps.rs:485  a \\| b` | 25.0% |"
        );
        assert_eq!(rows[1], "|  |  |  | `sock.rs:1  'x'` | 10.0% |");
    }
}
