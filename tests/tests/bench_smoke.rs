//! The benchmark runs and produces sane output (`sluice-bench --quick`).
//! No timing is asserted: this only guards the benchmark against rot.

use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use sluice_tests::{netns::unique_name, require_root};

/// A positive, finite number at `path` in `v`.
fn positive(v: &Value, path: &[&str]) -> Result<f64> {
    let mut cur = v;
    for key in path {
        cur = &cur[*key];
    }
    let x = cur
        .as_f64()
        .with_context(|| format!("{} is not a number: {cur}", path.join(".")))?;
    if !x.is_finite() || x <= 0.0 {
        bail!("{} = {x}, expected a positive number", path.join("."));
    }
    Ok(x)
}

#[test]
fn quick_bench_runs_and_reports_every_variant() -> Result<()> {
    require_root()?;
    let out = std::env::temp_dir().join(unique_name("bench"));
    let status = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .arg("--quick")
        .arg("--out")
        .arg(&out)
        .status()
        .context("running sluice-bench")?;
    assert!(status.success(), "sluice-bench --quick failed ({status})");

    let text = std::fs::read_to_string(out.join("results.json"))?;
    assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
    let results: Value = serde_json::from_str(&text)?;
    assert_eq!(results["complete"], true);
    let sizes = results["sizes"].as_array().context("no sizes")?;
    assert!(sizes.len() >= 2, "quick mode measures at least two sizes");
    for size in sizes {
        let n = size["services"].as_u64().context("services")?;
        let variants = size["variants"].as_array().context("variants")?;
        let names: Vec<&str> = variants
            .iter()
            .filter_map(|v| v["variant"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "direct",
                "direct-again",
                "sluice",
                "sluice-sock",
                "sluice-host-routing",
                "sluice-passthrough",
                "sluice-sock-passthrough",
                "tc-floor",
                "sock-floor",
                "iptables-legacy",
                "iptables-nft",
                "nftables"
            ],
            "at {n} services"
        );
        for v in variants {
            assert!(v["error"].is_null(), "at {n} services: {v}");
            for path in [
                &["connect_last", "rate", "median"][..],
                &["connect_last", "latency", "p50_us"],
                &["connect_last", "latency", "p99_us"],
                &["connect_random", "rate", "median"],
                &["rr", "rate", "median"],
                &["bulk_gbit", "median"],
            ] {
                positive(v, path).with_context(|| format!("{} at {n} services", v["variant"]))?;
            }
            // Every block's rate is kept, one per block of every round
            // (the ratios against direct pair them).
            let blocks = results["config"]["connect_blocks_per_round"]
                .as_u64()
                .context("connect_blocks_per_round")?;
            let rounds = results["config"]["rounds"].as_u64().context("rounds")?;
            let samples = v["connect_last"]["rate"]["samples"]
                .as_array()
                .context("samples")?;
            assert_eq!(samples.len() as u64, blocks * rounds, "{}", v["variant"]);
        }
        let programming = size["control"]["programming"]
            .as_object()
            .context("programming")?;
        for key in ["sluice-reconciler", "iptables-legacy-restore", "nftables"] {
            let m = &programming[key];
            assert!(
                m["seconds"].as_f64().is_some_and(f64::is_finite) || m["not_measured"].is_string(),
                "{key} at {n} services: {m}"
            );
        }
        positive(size, &["control", "agent", "start_to_ready", "seconds"])?;
        // The endpoint-change series under background churn (API agent;
        // it needs other services than the target to churn).
        if n >= 3 {
            let rates = size["control"]["agent"]["churn_rates"]
                .as_array()
                .context("churn_rates")?;
            let first = rates.first().context("no churn rate measured")?;
            assert!(first["error"].is_null(), "at {n} services: {first}");
            positive(first, &["achieved"])?;
            positive(first, &["latency", "p50_us"])?;
        }
        // Per-program costs of both sluice variants: the TC programs ran
        // for service and non-service traffic, and alone (test run).
        let costs = size["prog_costs"].as_array().context("prog_costs")?;
        for variant in ["sluice", "sluice-sock"] {
            for traffic in ["service", "non-service", "non-service (test run)"] {
                let found = costs.iter().any(|c| {
                    c["variant"] == variant
                        && c["program"] == "sl_ingress"
                        && c["traffic"] == traffic
                        && c["runs"].as_u64().is_some_and(|r| r > 0)
                        && c["ns_per_run"].as_f64().is_some_and(|ns| ns > 0.0)
                });
                assert!(
                    found,
                    "{variant} sl_ingress {traffic} at {n} services: {costs:?}"
                );
            }
        }
        // The empty program of tc-floor ran on every hook, for pod traffic
        // and alone.
        for traffic in ["non-service", "non-service (test run)"] {
            assert!(
                costs.iter().any(|c| c["variant"] == "tc-floor"
                    && c["program"] == "tc_floor"
                    && c["traffic"] == traffic
                    && c["runs"].as_u64().is_some_and(|r| r > 0)
                    && c["ns_per_run"].as_f64().is_some_and(|ns| ns > 0.0)),
                "tc-floor {traffic} at {n} services: {costs:?}"
            );
        }
        // The TC path's packets timed alone, one test run each (the bench
        // checks that each left translated, or untouched for a pod).
        for traffic in [
            "service SYN (test run)",
            "service ACK (test run)",
            "pod ACK (test run)",
        ] {
            assert!(
                costs.iter().any(|c| c["variant"] == "sluice"
                    && c["program"] == "sl_ingress"
                    && c["traffic"] == traffic
                    && c["runs"].as_u64() == Some(400)
                    && c["ns_per_run"].as_f64().is_some_and(|ns| ns > 0.0)),
                "sluice sl_ingress {traffic} at {n} services: {costs:?}"
            );
        }
        // sock-floor's empty socket programs ran for the client's pod
        // connections: connect and release once per connection.
        for program in ["floor_connect4", "floor_release"] {
            assert!(
                costs.iter().any(|c| c["variant"] == "sock-floor"
                    && c["program"] == program
                    && c["traffic"] == "non-service"
                    && c["runs"].as_u64().is_some_and(|r| r > 0)),
                "sock-floor {program} at {n} services: {costs:?}"
            );
        }
        // With socket balancing the client's connections are balanced at
        // connect(): sl_connect4 ran once per service connection.
        assert!(
            costs.iter().any(|c| c["variant"] == "sluice-sock"
                && c["program"] == "sl_connect4"
                && c["traffic"] == "service"
                && c["runs"].as_u64().is_some_and(|r| r > 0)),
            "at {n} services: {costs:?}"
        );
    }
    // The source-line profile (perf, which setup installs): the TC path's
    // sl_ingress and the socket path's sl_connect4 took samples, each
    // named by source lines that hold no more than the program's samples.
    for size in sizes {
        let profiles = size["profiles"].as_array().context("profiles")?;
        for (variant, program) in [("sluice", "sl_ingress"), ("sluice-sock", "sl_connect4")] {
            let p = profiles
                .iter()
                .find(|p| p["variant"] == variant && p["program"] == program)
                .with_context(|| format!("no profile of {variant} {program}: {profiles:?}"))?;
            let samples = p["samples"].as_u64().context("samples")?;
            let lines = p["lines"].as_array().context("lines")?;
            let in_lines: u64 = lines.iter().filter_map(|l| l[1].as_u64()).sum();
            assert!(samples > 0 && !lines.is_empty(), "{p}");
            assert!(in_lines <= samples, "{p}");
            assert!(
                lines
                    .iter()
                    .all(|l| l[0].as_str().is_some_and(|s| s.contains(".rs:"))),
                "{p}"
            );
        }
    }
    // The TC path's new flows, counted by how they started: the rounds'
    // connections all went through sl_ingress, a SYN each.
    for size in sizes {
        let flows = size["flows"].as_array().context("flows")?;
        let f = flows
            .iter()
            .find(|f| f["variant"] == "sluice")
            .with_context(|| format!("no flow counts of sluice: {flows:?}"))?;
        let count = |k: &str| f[k].as_u64().unwrap_or(0);
        assert!(count("fresh") > 0, "{f}");
        assert!(count("taken_over") <= count("reselected"), "{f}");
    }
    // North-south: every variant forwarded through the NIC-like wire to
    // the sink, and sl_xdp dropped every denied source at the driver.
    let ns = &results["north_south"];
    assert!(ns["error"].is_null(), "north-south: {ns}");
    let forwarded = ns["forwarded"].as_array().context("north-south rows")?;
    assert_eq!(forwarded.len(), 5, "{ns}");
    for v in forwarded {
        assert!(v["error"].is_null(), "north-south: {v}");
        positive(v, &["delivered_pps", "median"])?;
        positive(v, &["node_ns_per_packet", "median"])?;
    }
    let denied = ns["denied"].as_array().context("denied rows")?;
    let share = |name: &str| {
        denied
            .iter()
            .find(|d| d["variant"] == name)
            .and_then(|d| d["xdp_share"].as_f64())
    };
    assert_eq!(share("sluice-xdp"), Some(1.0), "{ns}");
    assert_eq!(share("sluice-tc"), Some(0.0), "{ns}");
    for d in denied {
        positive(d, &["dropped_pps", "median"])?;
    }
    let svg = std::fs::read_to_string(out.join("connect.svg"))?;
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    let report = std::fs::read_to_string(out.join("report.md"))?;
    assert!(report.contains("| sluice |"));
    assert!(report.contains("| sluice-sock | sl_connect4 |"));
    assert!(report.contains("Where the programs' time goes"));
    assert!(report.contains("non-service traffic within 1% of no sluice"));
    assert!(report.contains("(sluice-sock-passthrough: the default --socket-lb=all"));
    assert!(
        report.contains("| the A/A control: direct-again"),
        "the A/A control's row"
    );
    // The programs' time per connection, against their floors, for every
    // path the run measured.
    for path in [
        "| pod to ClusterIP, socket path |",
        "| pod to ClusterIP, TC path |",
        "| pod to ClusterIP, TC path, host routing |",
        "| pod to pod, TC path (sluice-passthrough) |",
    ] {
        assert!(report.contains(path), "no row {path}");
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}
