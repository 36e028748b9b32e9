use std::{io::IsTerminal, process::ExitCode};

use clap::Parser;
use sluice::{
    cleanup,
    cli::{CleanupArgs, Cli, Command, CtCommand, LbCommand},
    inspect, monitor, run,
};
use tracing_subscriber::EnvFilter;

/// `sluice cleanup`: prints what it removed.
fn clean(args: &CleanupArgs) -> anyhow::Result<()> {
    let report = cleanup::run(&cleanup::Options {
        bpf_root: args.bpf.bpf_root.clone(),
        cgroup_root: args.cgroup_root.clone(),
        force: args.force,
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

// `--features system-alloc`: glibc's malloc, for heap profilers that
// intercept it (heaptrack; docs/performance.md).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static HEAP: sluice::heap::Allocator = sluice::heap::Allocator {};

fn main() -> ExitCode {
    sluice::heap::configure();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(sluice_main()),
        Err(e) => {
            eprintln!("sluice: starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn sluice_main() -> ExitCode {
    let cli = Cli::parse();
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // The programs' own logs, at the level `--datapath-log-level` asks for.
    if let Command::Agent(args) = &cli.command {
        if let Some(directive) = args.datapath_log_level.directive() {
            if let Ok(d) = directive.parse() {
                filter = filter.add_directive(d);
            }
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.command {
        Command::Agent(args) => run::agent(*args).await,
        Command::Lb(LbCommand::List(args)) => inspect::lb_list(&args),
        Command::Ct(CtCommand::List(args)) => inspect::ct_list(&args),
        Command::Status(args) => inspect::status(&args),
        Command::Monitor(args) => monitor::run(&args).await,
        Command::Cleanup(args) => clean(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            ExitCode::FAILURE
        }
    }
}
