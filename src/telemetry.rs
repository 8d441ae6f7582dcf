//! Structured logging with `tracing`.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

/// Installs the global subscriber; `RUST_LOG` overrides the default level
/// (`info`, with the noisy HTTP/gRPC internals at `warn`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,hyper=warn,h2=warn,tower=warn,kube_client=warn,tonic=warn")
    });
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(colours_wanted()),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init(),
    };
    if let Err(e) = result {
        eprintln!("logging was already initialised: {e}");
    }
}

/// Terminal colours only on a terminal, and not under `NO_COLOR`: a log
/// file or a collector reading a pipe gets plain text, not escape codes.
fn colours_wanted() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}
