//! `bucketmap-dev` (`cargo dev`): the developer tooling of bucketmap, kept
//! out of the shipped operator. With no command it runs the embedded
//! default: a local control plane, the mock GCS, the operator in-process,
//! `examples/` and the sidecar demo.

mod bench;
mod chaos;
mod crd;
mod demo;
mod dev;
mod grpc_schema;
mod module_cycles;
mod node;

use std::net::SocketAddr;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "bucketmap-dev",
    about = "bucketmap's developer tooling: the embedded default (`cargo dev`), the benchmark, the mock GCS",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Options of the default command (`up`).
    #[command(flatten)]
    up: dev::DevArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The embedded default (what `cargo dev` alone runs): a local control
    /// plane (or --existing-cluster), mock GCS, the operator, examples/ and
    /// the sidecar demo.
    Up(dev::DevArgs),
    /// Measure the operator at scale against the mock GCS on a local control plane.
    Bench(bench::BenchArgs),
    /// Measure what the sidecars following their bucket maps live cost the
    /// API server (CPU, RSS, requests, delivery of a change) at N pods.
    BenchMapWatchers(bench::watchers::WatchersArgs),
    /// Measure a move's copy pass on the mock GCS: many small objects and a
    /// few large ones, against the floor of the same rewrites.
    BenchCopy(bench::copy::CopyArgs),
    /// Create and delete hundreds of resources while operator replicas are
    /// killed, the mock GCS fails at random and the API server restarts;
    /// then check that nothing was lost, duplicated or wrongly deleted.
    Chaos(chaos::ChaosArgs),
    /// Serve the in-memory mock GCS (google.storage.v2 gRPC) until interrupted.
    MockGcs {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: SocketAddr,
    },
    /// The operator itself, exactly as `bucketmap operator` (the same library
    /// entry point): the benchmark runs it in its own process from this
    /// binary, which is always built from the current sources.
    #[command(hide = true)]
    Operator(Box<bucketmap::cli::OperatorArgs>),
    /// Write the CRD generated from the Rust types to deploy/crd/crd.yaml and
    /// the Helm chart's files/crd.yaml (or, with --check, fail if either is
    /// stale).
    Crd(crd::CrdArgs),
    /// Write the sidecar's gRPC bucket-name table (sidecar-core/src/grpc/schema.rs)
    /// derived from the vendored protos (after tools/grpc/fetch.sh).
    GrpcSchema,
    /// Fail if a module of the sidecar's crates imports a module that
    /// imports it back, directly or through others.
    ModuleCycles(module_cycles::ModuleCyclesArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    bucketmap::telemetry::init(bucketmap::telemetry::LogFormat::Text);
    bucketmap::install_crypto_provider();
    match cli.command {
        None => dev::run(cli.up).await,
        Some(Command::Up(args)) => dev::run(args).await,
        Some(Command::Bench(args)) => bench::bench(args).await,
        Some(Command::BenchMapWatchers(args)) => bench::watchers::run(args).await,
        Some(Command::BenchCopy(args)) => bench::copy::run(args).await,
        Some(Command::Chaos(args)) => chaos::chaos(args).await,
        Some(Command::Crd(args)) => crd::run(&args),
        Some(Command::GrpcSchema) => grpc_schema::run(),
        Some(Command::ModuleCycles(args)) => module_cycles::run(&args),
        Some(Command::Operator(args)) => bucketmap::cli::run(*args).await,
        Some(Command::MockGcs { listen }) => {
            let mock = bucketmap_testkit::mock_gcs::MockGcs::start_on(listen).await?;
            println!("mock GCS listening on {}", mock.endpoint());
            let signal = bucketmap::termination_signal().await;
            tracing::info!(signal, "shutting down");
            mock.shutdown().await;
            Ok(())
        }
    }
}
