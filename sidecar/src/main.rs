//! `bucketmap-sidecar`: rewrites logical bucket names to physical ones.

use std::process::ExitCode;

use bucketmap_sidecar::config::Config;
use bucketmap_sidecar::{server, telemetry};
use clap::Parser;

fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(message) = config.validate() {
        eprintln!("bucketmap-sidecar: {message}");
        return ExitCode::from(2);
    }
    telemetry::init(config.log_format);
    // The provider google-cloud-auth signs with and every TLS client uses:
    // ring, the one crypto library linked (tests/product.rs).
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        tracing::debug!("a rustls crypto provider was already installed");
    }
    let mut builder = if config.worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(config.worker_threads);
        builder
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("bucketmap-sidecar: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(server::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "bucketmap-sidecar failed");
            eprintln!("bucketmap-sidecar: {err:#}");
            ExitCode::FAILURE
        }
    }
}
