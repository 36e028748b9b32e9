//! The kernel programs' developer logs (aya-log, `--datapath-log-level`),
//! forwarded into the agent's tracing output under the target
//! `sluice_ebpf` (the agent's filter admits that target at the chosen
//! level, whatever `RUST_LOG` says of the rest).
//!
//! aya-log writes its records into `AYA_LOGS`, a ring buffer of each
//! program generation, not pinned: the agent that loaded the programs reads
//! it; after a restart the new generation logs into its own. The level is
//! fixed at load (the programs' `AYA_LOG_LEVEL` global): off, the
//! programs' log calls return at once (and they sit on rare paths only).

use aya_log::EbpfLogger;
use tokio::{
    io::{unix::AsyncFd, Interest},
    sync::watch,
};
use tracing::warn;

/// The tracing target of the programs' logs.
pub const TARGET: &str = "sluice_ebpf";

/// `--datapath-log-level`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum LogLevel {
    /// No logs (the default).
    #[default]
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The tracing filter directive that shows this level of the
    /// programs' logs (`None`: off).
    pub fn directive(self) -> Option<String> {
        let level = match self {
            LogLevel::Off => return None,
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        };
        Some(format!("{TARGET}={level}"))
    }

    /// The value of the programs' `AYA_LOG_LEVEL` (aya-log's levels are
    /// 1 error .. 5 trace; 0 disables every call).
    pub fn aya(self) -> u8 {
        self as u8
    }
}

/// Re-emits aya-log's records as tracing events of target `TARGET`.
pub struct Forward;

impl log::Log for Forward {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let module = record.module_path().unwrap_or("");
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: TARGET, module, "{message}"),
            log::Level::Warn => tracing::warn!(target: TARGET, module, "{message}"),
            log::Level::Info => tracing::info!(target: TARGET, module, "{message}"),
            log::Level::Debug => tracing::debug!(target: TARGET, module, "{message}"),
            log::Level::Trace => tracing::trace!(target: TARGET, module, "{message}"),
        }
    }

    fn flush(&self) {}
}

/// The reader of a program generation's log records.
pub type Logger = EbpfLogger<Forward>;

/// Forwards records until shutdown.
pub async fn forward(logger: Logger, mut shutdown: watch::Receiver<bool>) {
    // SAFETY: the logger owns its ring buffer's fd for as long as the
    // `AsyncFd` holds it, and always returns that fd.
    let mut fd = match unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            warn!(error = %e, "cannot poll the datapath's log ring buffer: no datapath logs");
            return;
        }
    };
    loop {
        tokio::select! {
            guard = fd.readable_mut() => {
                let Ok(mut guard) = guard else { return };
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
            _ = shutdown.changed() => return,
        }
    }
}
