//! The `bucketmap` command: the operator, and the CRD it serves. Developer
//! tooling (the local control plane, the benchmark, the mock GCS) lives in
//! `devtools/` (`cargo dev`) and is not part of this binary.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kube::CustomResourceExt;

use bucketmap::cli::{self, OperatorArgs};
use bucketmap::crd::Gcs;
use bucketmap::telemetry::{self, LogFormat};

#[derive(Parser, Debug)]
#[command(
    name = "bucketmap",
    version,
    about = "Google Cloud Storage buckets from Kubernetes, one logical name everywhere"
)]
struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "BUCKETMAP_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the operator against the cluster of the current kubeconfig (or in-cluster).
    Operator(Box<OperatorArgs>),
    /// Print the CustomResourceDefinition (deploy/crd.yaml is this output).
    Crd,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    bucketmap::install_crypto_provider();
    match cli.command {
        Command::Operator(args) => cli::run(*args).await,
        Command::Crd => {
            let yaml = serde_yaml::to_string(&Gcs::crd()).context("cannot render the CRD")?;
            print!("{yaml}");
            Ok(())
        }
    }
}
