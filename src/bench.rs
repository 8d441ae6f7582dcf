//! `bucketmap bench`: the operator at scale against the mock GCS.
//!
//! The operator runs as a separate process (`bucketmap operator`), so its
//! peak RSS is its own. Every figure is printed next to a baseline measured
//! in the same run: creating the N objects through the API server alone (no
//! operator work), and the idle operator's RSS.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::{Api, PostParams};

use crate::crd::Gcs;
use crate::mock_gcs::MockGcs;
use crate::testenv::{self, TestEnv};

/// Options of `bucketmap bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Numbers of Gcs resources to create, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    pub counts: Vec<usize>,
    /// Resync period given to the operator for the steady-state measurement.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub resync: Duration,
    /// Concurrent creates sent to the API server.
    #[arg(long, default_value_t = 16)]
    pub create_parallelism: usize,
}

struct Operator {
    child: tokio::process::Child,
    metrics_addr: String,
}

impl Operator {
    async fn start(
        env: &TestEnv,
        gcs_endpoint: &str,
        namespace: &str,
        resync: Duration,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find the bucketmap binary")?;
        let port = crate::demo::free_port()?;
        let child = tokio::process::Command::new(exe)
            .args([
                "operator",
                "--gcs-anonymous",
                "--default-project",
                "bench-project",
            ])
            .args(["--gcs-endpoint", gcs_endpoint])
            .args(["--namespace", namespace])
            .args(["--bucket-ops-interval", "0s"])
            .args(["--resync", &humantime::format_duration(resync).to_string()])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", env.kubeconfig_path())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the operator process")?;
        Ok(Operator {
            child,
            metrics_addr: format!("127.0.0.1:{port}"),
        })
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("operator exited")
    }

    /// Peak resident set size (VmHWM) in bytes.
    fn peak_rss(&self) -> anyhow::Result<u64> {
        proc_status_kib(self.pid()?, "VmHWM").map(|k| k * 1024)
    }

    fn rss(&self) -> anyhow::Result<u64> {
        proc_status_kib(self.pid()?, "VmRSS").map(|k| k * 1024)
    }

    async fn reconciles(&self) -> anyhow::Result<f64> {
        let (_, text) = crate::demo::http(&self.metrics_addr, "GET", "/metrics", "").await?;
        Ok(text
            .lines()
            .find(|l| l.starts_with("bucketmap_reconciles_total "))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0))
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

fn proc_status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("cannot read /proc status")?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

async fn wait_until(
    timeout: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !check().await? {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what} not reached within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

async fn create_many(
    api: &Api<Gcs>,
    prefix: &str,
    n: usize,
    parallelism: usize,
) -> anyhow::Result<Duration> {
    use futures::{StreamExt, TryStreamExt};
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("{prefix}{i:05}");
                let obj: Gcs = serde_json::from_value(serde_json::json!({
                    "apiVersion": "storage.bucketmap.dev/v1alpha1",
                    "kind": "Gcs",
                    "metadata": {"name": name},
                    "spec": {"bucketName": name},
                }))?;
                api.create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("create {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(parallelism)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(started.elapsed())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Runs the benchmark and prints a report.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    eprintln!("starting a local control plane and the mock GCS...");
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    crate::dev::install_crd(&client).await?;
    let mock = MockGcs::start().await?;
    let gcs = mock.handle();

    println!("# bucketmap operator benchmark");
    println!(
        "resync {:?}, pacing off, mock GCS on loopback\n",
        args.resync
    );
    for &n in &args.counts {
        // Baseline: the API server alone stores N objects (nobody reconciles).
        let base_ns = testenv::create_namespace(&client, "bench-base").await?;
        let base_api: Api<Gcs> = Api::namespaced(client.clone(), &base_ns);
        let baseline = create_many(&base_api, "b", n, args.create_parallelism).await?;

        let ns = testenv::create_namespace(&client, "bench").await?;
        let api: Api<Gcs> = Api::namespaced(client.clone(), &ns);
        let operator = Operator::start(&env, &mock.endpoint(), &ns, args.resync).await?;
        wait_until(Duration::from_secs(60), "operator metrics", async || {
            Ok(
                crate::demo::http(&operator.metrics_addr, "GET", "/metrics", "")
                    .await
                    .is_ok(),
            )
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle_rss = operator.rss()?;
        gcs.reset_calls();

        let started = Instant::now();
        create_many(&api, "g", n, args.create_parallelism).await?;
        let (reader, writer) = kube::runtime::reflector::store::<Gcs>();
        let watch = kube::runtime::reflector(
            writer,
            kube::runtime::watcher(api.clone(), Default::default()),
        );
        let watch_task = tokio::spawn(futures::StreamExt::for_each(watch, |_| async {}));
        reader
            .wait_until_ready()
            .await
            .context("watch did not sync")?;
        wait_until(Duration::from_secs(1800), "all Ready", async || {
            Ok(reader.state().iter().filter(|g| g.is_ready()).count() >= n)
        })
        .await?;
        let to_ready = started.elapsed();
        let reconciles = operator.reconciles().await?;
        let create_calls = gcs.calls().len();

        // Steady state: count calls over whole resync periods.
        tokio::time::sleep(args.resync / 2).await;
        gcs.reset_calls();
        let window = args.resync * 2;
        tokio::time::sleep(window).await;
        let steady = gcs.calls();
        let periods = window.as_secs_f64() / args.resync.as_secs_f64();
        let per_bucket_per_resync = steady.len() as f64 / n as f64 / periods;
        let steady_writes = steady.iter().filter(|c| c.method != "GetBucket").count();
        let peak = operator.peak_rss()?;
        watch_task.abort();
        drop(reader);
        operator.stop().await;

        println!("## N = {n}");
        println!(
            "- time to all Ready: {:.1} s ({:.2}x the API-server-only baseline of {:.1} s to store N objects)",
            to_ready.as_secs_f64(),
            to_ready.as_secs_f64() / baseline.as_secs_f64(),
            baseline.as_secs_f64()
        );
        println!(
            "- reconciles per second: {:.0} ({reconciles:.0} reconciles)",
            reconciles / to_ready.as_secs_f64()
        );
        println!(
            "- GCS calls per bucket on create: {:.2}",
            create_calls as f64 / n as f64
        );
        println!(
            "- GCS calls per bucket per steady-state resync: {per_bucket_per_resync:.2} (target 1), writes: {steady_writes} (target 0)"
        );
        println!(
            "- operator peak RSS: {:.1} MiB ({:.2}x its idle RSS of {:.1} MiB; target < 64 MiB at N = 5000)\n",
            mib(peak),
            peak as f64 / idle_rss as f64,
            mib(idle_rss)
        );
    }
    mock.shutdown().await;
    drop(env);
    Ok(())
}
