//! Logging to stderr, as text or JSON; level from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber; if one is already set, says so on stderr
/// and goes on.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colours_wanted());
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let Err(err) = result {
        eprintln!("bucketmap-sidecar: cannot initialise logging: {err}");
    }
}

/// Terminal colours only on a terminal, and not under `NO_COLOR`: a log
/// file or a collector reading a pipe gets plain text, not escape codes.
fn colours_wanted() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}
