//! `cargo dev bench`: the operator as it ships (its finalizer webhook,
//! bucket map and binding Secrets included) at scale against the mock GCS.
//!
//! Each shape (N resources over K namespaces) gets a fresh control plane and
//! mock GCS. First the baseline: the API server alone stores the same N
//! objects over K namespaces (nobody reconciles; they are then deleted).
//! Then the floor: the API server alone stores them and writes each one's
//! Ready status once, as the operator does: the least work that any
//! operator reporting Ready makes the API server do.
//! Then the operator runs as a separate process watching every namespace and
//! serving the Gcs finalizer webhook (installed as `deploy/webhook.yaml`
//! ships it), as it does when installed, so its peak RSS is its own: `bucketmap operator`'s
//! entry point (`bucketmap::cli::run`), started through this binary's hidden
//! `operator` command so that it is always the current code (its extra,
//! untouched code pages do not count in the RSS); the N
//! resources are created again and the bench waits until all are Ready.
//! Every figure is printed next to its baseline from the same run. The API
//! server's own metrics count the writes per resource and its CPU seconds.
//!
//! SIGTERM or ctrl-c stops the bench and everything it started: children are
//! killed when their handles drop, and die with the bench if it is killed.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::CustomResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use bucketmap::crd::Gcs;
use bucketmap_testkit::mock_gcs::{MockGcs, MockHandle};
use bucketmap_testkit::testenv::{self, GoGc, TestEnv};

/// N resources spread evenly over K namespaces, written `NxK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub resources: usize,
    pub namespaces: usize,
}

impl FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (n, k) = s.split_once('x').unwrap_or((s, "1"));
        let parse = |v: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| format!("{s:?} is not N or NxK with positive whole numbers"))
        };
        Ok(Shape {
            resources: parse(n)?,
            namespaces: parse(k)?,
        })
    }
}

/// Options of `cargo dev bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Shapes to measure: N resources over K namespaces as NxK (N alone: one namespace).
    #[arg(long, value_delimiter = ',', default_value = "1000x1,5000x1,5000x100")]
    pub shapes: Vec<Shape>,
    /// Resync period given to the operator for the steady-state measurement.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub resync: Duration,
    /// Skip the steady-state measurement (two resync periods per shape).
    #[arg(long)]
    pub no_steady_state: bool,
    /// Concurrent creates sent to the API server.
    #[arg(long, default_value_t = 16)]
    pub create_parallelism: usize,
    /// Give up (and fail) when not all resources are Ready within this time.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub ready_timeout: Duration,
    /// Give every other resource every bucket setting that can be kept in
    /// sync (encryption, CORS, website, billing, logging, holds, autoclass,
    /// lifecycle, retention, soft delete, IP filter, labels, notifications):
    /// the steady state must still write nothing, and read each bucket once
    /// (and its notifications once).
    #[arg(long)]
    pub settings_on_half: bool,
    /// Measure this `bucketmap` binary (run as `BIN operator ...`) instead of
    /// this binary's own `operator` command: the shipped binary, or a build
    /// of another commit to compare against.
    #[arg(long)]
    pub operator_bin: Option<std::path::PathBuf>,
}

pub mod copy;
mod measure;
pub mod watchers;

use measure::{ApiCounters, Operator, wait_until};

/// What one shape measured.
struct Report {
    shape: Shape,
    baseline: ApiOnly,
    floor: ApiOnly,
    to_ready: Duration,
    reconciles: f64,
    writes: BTreeMap<&'static str, f64>,
    /// Namespace GETs and LISTs per resource by all Ready.
    namespace_reads: f64,
    api_time: Vec<(String, f64)>,
    apiserver_cpu: f64,
    create_calls: usize,
    steady: Option<(f64, usize)>,
    peak_rss: u64,
    idle_rss: u64,
    operator_cpu: f64,
    events_after_ready: Option<Duration>,
}

/// Runs the benchmark and prints a report; stops everything on SIGTERM/ctrl-c.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    tokio::select! {
        result = run(args) => result,
        signal = bucketmap::termination_signal() => {
            // Returning drops the run: its children are killed on drop.
            anyhow::bail!("{signal}: benchmark interrupted; stopped everything it started")
        }
    }
}

async fn run(args: BenchArgs) -> anyhow::Result<()> {
    println!("# bucketmap operator benchmark");
    println!(
        "the operator as shipped (all namespaces, finalizer webhook, bucket map, binding Secrets), pacing off, mock GCS on loopback, resync {:?}\n",
        args.resync
    );
    if args.settings_on_half {
        println!(
            "every other resource has every bucket setting kept in sync (--settings-on-half)\n"
        );
    }
    let mut all_ready = true;
    for &shape in &args.shapes {
        let report = measure_shape(&args, shape).await?;
        print_report(&report);
        all_ready &= report.to_ready < args.ready_timeout;
    }
    anyhow::ensure!(all_ready, "not every shape reached all Ready");
    Ok(())
}

async fn measure_shape(args: &BenchArgs, shape: Shape) -> anyhow::Result<Report> {
    eprintln!(
        "{}x{}: starting a local control plane and the mock GCS...",
        shape.resources, shape.namespaces
    );
    let floor = measure_floor(args, shape).await?;
    let (env, client) = control_plane().await?;
    let mock = MockGcs::start().await?;
    mock.handle().add_topic(BENCH_TOPIC);
    let baseline = measure_api_only(args, shape, &client, Writes::Create).await?;
    let webhook_port = bucketmap_testkit::free_port()?;
    measure::install_finalizer_webhook(&client, webhook_port).await?;
    let operator = Operator::start(&env, &mock.endpoint(), webhook_port, args).await?;
    measure::wait_finalizer_webhook(&client).await?;
    let report = measure_operator(args, shape, &client, &mock.handle(), &operator).await?;
    operator.stop().await;
    mock.shutdown().await;
    drop(env);
    Ok(Report {
        baseline,
        floor,
        ..report
    })
}

/// What the API server alone does for a shape, with nobody reconciling.
#[derive(Debug, Clone, Copy, Default)]
struct ApiOnly {
    /// Time to do every resource's writes.
    time: Duration,
    /// The API server's CPU seconds meanwhile.
    cpu: f64,
}

/// The writes made for each resource when nobody reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writes {
    /// The create only: the baseline.
    Create,
    /// The create, then the Ready status the operator writes (server-side
    /// apply on the status subresource): the floor.
    CreateAndReadyStatus,
}

/// The floor, on a control plane of its own: the operator's run then
/// follows the baseline's on the same server, as before the floor was
/// measured, rather than the floor's far larger deletions.
async fn measure_floor(args: &BenchArgs, shape: Shape) -> anyhow::Result<ApiOnly> {
    let (_env, client) = control_plane().await?;
    measure_api_only(args, shape, &client, Writes::CreateAndReadyStatus).await
}

/// A fresh local control plane with the `Gcs` CRD installed; its API
/// server collects garbage as a cluster's does, since the bench measures
/// its CPU.
async fn control_plane() -> anyhow::Result<(TestEnv, kube::Client)> {
    let env = TestEnv::start_with(GoGc::GoDefault).await?;
    let client = env.client().await?;
    bucketmap_testkit::testenv::install_crd(&client, &Gcs::crd()).await?;
    Ok((env, client))
}

/// The API server alone does `writes` for each of the shape's objects
/// (nobody reconciles), which are then deleted.
async fn measure_api_only(
    args: &BenchArgs,
    shape: Shape,
    client: &kube::Client,
    writes: Writes,
) -> anyhow::Result<ApiOnly> {
    let before = ApiCounters::read(client).await?;
    let prefix = match writes {
        Writes::Create => "bench-base",
        Writes::CreateAndReadyStatus => "bench-floor",
    };
    let base_ns = namespaces(client, prefix, shape.namespaces).await?;
    let time = create_many(
        client,
        &base_ns,
        shape.resources,
        args.create_parallelism,
        args.settings_on_half,
        writes,
    )
    .await?;
    let cpu = ApiCounters::read(client).await?.cpu - before.cpu;
    for ns in &base_ns {
        let api: Api<Gcs> = Api::namespaced(client.clone(), ns);
        api.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .with_context(|| format!("delete the objects of {ns}"))?;
    }
    measure::settle(client).await?;
    Ok(ApiOnly { time, cpu })
}

/// The running operator brings the shape's objects to Ready; the report's
/// baseline and floor are left at zero for the caller.
async fn measure_operator(
    args: &BenchArgs,
    shape: Shape,
    client: &kube::Client,
    gcs: &MockHandle,
    operator: &Operator,
) -> anyhow::Result<Report> {
    let idle_rss = operator.rss()?;
    let idle_cpu = operator.cpu_seconds()?;
    let namespaces = namespaces(client, "bench", shape.namespaces).await?;
    gcs.reset_calls();
    let before = ApiCounters::read(client).await?;
    let started = Instant::now();
    create_many(
        client,
        &namespaces,
        shape.resources,
        args.create_parallelism,
        args.settings_on_half,
        Writes::Create,
    )
    .await?;
    wait_all_ready(client, shape.resources, args.ready_timeout).await?;
    let to_ready = started.elapsed();
    let after = ApiCounters::read(client).await?;
    let operator_cpu = operator.cpu_seconds()? - idle_cpu;
    let reconciles = operator.reconciles().await?;
    let events_after_ready = events_written(client, &before, shape.resources).await?;
    let create_calls = gcs.calls().len();
    let steady = match args.no_steady_state {
        true => None,
        false => Some(steady_state(gcs, shape.resources, args.resync).await),
    };
    Ok(Report {
        shape,
        baseline: ApiOnly::default(),
        floor: ApiOnly::default(),
        to_ready,
        reconciles,
        writes: after.writes_since(&before, shape.resources),
        namespace_reads: (after.namespace_reads - before.namespace_reads) / shape.resources as f64,
        api_time: after.time_since(&before, 6),
        apiserver_cpu: after.cpu - before.cpu,
        create_calls,
        steady,
        peak_rss: operator.peak_rss()?,
        idle_rss,
        operator_cpu,
        events_after_ready,
    })
}

/// How long after all Ready the last of the `n` resources' `Created`
/// events was written (the operator writes events in the background, after
/// the writes that make resources Ready); `None` if not within two minutes.
async fn events_written(
    client: &kube::Client,
    before: &ApiCounters,
    n: usize,
) -> anyhow::Result<Option<Duration>> {
    let started = Instant::now();
    let all = async || {
        let now = ApiCounters::read(client).await?;
        let per_resource = now.writes_since(before, n).get("events").copied();
        anyhow::Ok(per_resource.unwrap_or(0.0) >= 1.0)
    };
    match wait_until(Duration::from_secs(120), "all events written", all).await {
        Ok(()) => Ok(Some(started.elapsed())),
        Err(_) => Ok(None),
    }
}

async fn namespaces(client: &kube::Client, prefix: &str, k: usize) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        out.push(testenv::create_namespace(client, prefix).await?);
    }
    Ok(out)
}

/// The Pub/Sub topic of [`every_setting`]'s notification; the mock has it.
const BENCH_TOPIC: &str = "projects/bench-p/topics/objects";

/// GCS calls that only read: what a steady-state resync may make.
const READS: [&str; 2] = ["GetBucket", "ListNotificationConfigs"];

/// Adds to `spec` every setting the operator keeps in sync on an existing
/// bucket, each set away from GCS's default (but versioning, which GCS
/// refuses beside the retention policy).
fn every_setting(spec: &mut serde_json::Value) {
    let settings = serde_json::json!({
        "location": "US",
        "labels": {"team": "bench", "tier": "gold"},
        "lifecycleRules": [
            {"action": {"type": "Delete"}, "condition": {"ageDays": 365, "matchesPrefix": ["tmp/"]}},
            {"action": {"type": "AbortIncompleteMultipartUpload"}, "condition": {"ageDays": 7}}
        ],
        "retentionPolicy": {"retentionPeriodSeconds": 3600},
        "softDeletePolicy": {"retentionDurationSeconds": 0},
        "encryption": {"defaultKmsKeyName": "projects/kms/locations/us/keyRings/r/cryptoKeys/k"},
        "cors": [{"origin": ["https://bench.example.com"], "method": ["GET"], "maxAgeSeconds": 60}],
        "website": {"mainPageSuffix": "index.html", "notFoundPage": "404.html"},
        "billing": {"requesterPays": true},
        "logging": {"logBucket": "bench-logs", "logObjectPrefix": "bench/"},
        "defaultEventBasedHold": true,
        "autoclass": {"enabled": true, "terminalStorageClass": "ARCHIVE"},
        "rpo": "DEFAULT",
        "notifications": [{"topic": BENCH_TOPIC, "eventTypes": ["OBJECT_FINALIZE"]}],
        "ipFilter": {"mode": "Enabled",
            "publicNetworkSource": {"allowedIpCidrRanges": ["203.0.113.0/24"]},
            "vpcNetworkSources": [{"network": "projects/net/global/networks/bench",
                                   "allowedIpCidrRanges": ["10.8.0.0/14"]}]}
    });
    if let (Some(spec), serde_json::Value::Object(settings)) = (spec.as_object_mut(), settings) {
        spec.extend(settings);
    }
}

/// Creates `n` resources spread round-robin over `namespaces`, every
/// other one with [`every_setting`] when `settings_on_half`, and makes the
/// other `writes` for each.
async fn create_many(
    client: &kube::Client,
    namespaces: &[String],
    n: usize,
    parallelism: usize,
    settings_on_half: bool,
    writes: Writes,
) -> anyhow::Result<Duration> {
    use futures::{StreamExt, TryStreamExt};
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api: Api<Gcs> = Api::namespaced(client.clone(), &namespaces[i % namespaces.len()]);
            async move {
                let name = format!("g{i:05}");
                let mut spec = serde_json::json!({"bucketName": name});
                if settings_on_half && i % 2 == 1 {
                    every_setting(&mut spec);
                }
                let obj: Gcs = serde_json::from_value(serde_json::json!({
                    "apiVersion": "storage.bucketmap.dev/v1alpha1",
                    "kind": "Gcs",
                    "metadata": {"name": name},
                    "spec": spec,
                }))?;
                api.create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("create {name}"))?;
                if writes == Writes::CreateAndReadyStatus {
                    let apply = PatchParams::apply(bucketmap::FIELD_MANAGER).force();
                    api.patch_status(&name, &apply, &Patch::Apply(ready_status(&name)))
                        .await
                        .with_context(|| format!("write the status of {name}"))?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(parallelism.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(started.elapsed())
}

/// The status the operator writes when resource `name` is Ready (with a
/// binding Secret, in its first name attempt).
fn ready_status(name: &str) -> serde_json::Value {
    use bucketmap::conditions::{READY, reason};
    use kube::Resource as _;
    let physical = format!("{name}-k3x9q2mw");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    serde_json::json!({
        "apiVersion": Gcs::api_version(&()),
        "kind": Gcs::kind(&()),
        "status": {
            "bucketFullName": physical,
            "bucketName": name,
            "projectID": "bench-project",
            "url": format!("gs://{physical}"),
            "nameAttempt": 0,
            "createTime": now,
            "binding": {"name": bucketmap::publish::binding_secret_name(name)},
            "conditions": [{
                "type": READY,
                "status": "True",
                "reason": reason::BUCKET_READY,
                "message": format!("Bucket {physical} is ready in project bench-project"),
                "lastTransitionTime": now,
                "observedGeneration": 1,
            }],
            "observedGeneration": 1,
        },
    })
}

async fn wait_all_ready(client: &kube::Client, n: usize, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<Gcs> = Api::all(client.clone());
    let (reader, writer) = kube::runtime::reflector::store::<Gcs>();
    let watch = kube::runtime::reflector(
        writer,
        kube::runtime::watcher(api, kube::runtime::watcher::Config::default()),
    );
    let watch_task = tokio::spawn(futures::StreamExt::for_each(watch, |_| async {}));
    let result = async {
        reader
            .wait_until_ready()
            .await
            .context("watch did not sync")?;
        wait_until(timeout, "all Ready", async || {
            let state = reader.state();
            let ready = state.iter().filter(|g| g.is_ready()).count();
            Ok(ready >= n)
        })
        .await
        .map_err(|e| {
            let state = reader.state();
            let ready = state.iter().filter(|g| g.is_ready()).count();
            e.context(format!("{ready} of {n} Ready"))
        })
    }
    .await;
    watch_task.abort();
    result
}

/// GCS calls per bucket per resync, and writes, over two whole periods.
async fn steady_state(gcs: &MockHandle, n: usize, resync: Duration) -> (f64, usize) {
    tokio::time::sleep(resync / 2).await;
    gcs.reset_calls();
    let window = resync * 2;
    tokio::time::sleep(window).await;
    let calls = gcs.calls();
    let per_bucket = calls.len() as f64 / n as f64 / 2.0;
    let writes = calls
        .iter()
        .filter(|c| !READS.contains(&c.method.as_str()))
        .count();
    (per_bucket, writes)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The API writes per resource by all Ready, and when the events followed.
fn print_writes(r: &Report) {
    let writes: Vec<String> = r
        .writes
        .iter()
        .map(|(what, per)| format!("{what} {per:.3}"))
        .collect();
    println!(
        "- API writes per resource by all Ready: {}",
        writes.join(", ")
    );
    println!(
        "- namespace reads per resource by all Ready: {:.3} (a new bucket's project is read \
         from its namespace; reads shared by the reconciles waiting at once)",
        r.namespace_reads
    );
    match r.events_after_ready {
        Some(d) => println!(
            "- events: every resource's written {:.1} s after all Ready (they queue behind the work)",
            d.as_secs_f64()
        ),
        None => println!("- events: not all written within 120 s after all Ready"),
    }
}

fn print_report(r: &Report) {
    let (n, k) = (r.shape.resources, r.shape.namespaces);
    let to_ready = r.to_ready.as_secs_f64();
    let (base, floor) = (r.baseline.time.as_secs_f64(), r.floor.time.as_secs_f64());
    println!("## N = {n} over {k} namespace(s)");
    println!(
        "- time to all Ready: {to_ready:.1} s ({:.2}x the API-server-only baseline of {base:.1} s \
         to store N objects; {:.2}x the floor of {floor:.1} s to store them and write each \
         one's Ready status, {:.2}x the baseline)",
        to_ready / base,
        to_ready / floor,
        floor / base,
    );
    println!(
        "- reconciles: {:.0} ({:.2} per resource, {:.0}/s)",
        r.reconciles,
        r.reconciles / n as f64,
        r.reconciles / r.to_ready.as_secs_f64()
    );
    print_writes(r);
    let time: Vec<String> = r
        .api_time
        .iter()
        .map(|(kind, s)| format!("{kind} {s:.1} s"))
        .collect();
    println!("- API server request time, top kinds: {}", time.join(", "));
    let (base_cpu, floor_cpu) = (r.baseline.cpu.max(0.001), r.floor.cpu.max(0.001));
    println!(
        "- API server CPU: {:.1} s ({:.2}x the baseline's {:.1} s; {:.2}x the floor's {:.1} s)",
        r.apiserver_cpu,
        r.apiserver_cpu / base_cpu,
        r.baseline.cpu,
        r.apiserver_cpu / floor_cpu,
        r.floor.cpu,
    );
    println!(
        "- operator CPU: {:.1} s ({:.2} ms per resource)",
        r.operator_cpu,
        r.operator_cpu * 1000.0 / n as f64
    );
    println!(
        "- GCS calls per bucket on create: {:.2}",
        r.create_calls as f64 / n as f64
    );
    if let Some((per_bucket, writes)) = r.steady {
        println!(
            "- GCS calls per bucket per steady-state resync: {per_bucket:.2} (target 1, and 1 more for a bucket with notifications: 1.5 with --settings-on-half), writes: {writes} (target 0)"
        );
    }
    println!(
        "- operator peak RSS: {:.1} MiB ({:.2}x its idle RSS of {:.1} MiB; target < 64 MiB at N = 5000)\n",
        mib(r.peak_rss),
        r.peak_rss as f64 / r.idle_rss as f64,
        mib(r.idle_rss)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        assert_eq!(
            "5000x100".parse(),
            Ok(Shape {
                resources: 5000,
                namespaces: 100
            })
        );
        assert_eq!(
            "300".parse(),
            Ok(Shape {
                resources: 300,
                namespaces: 1
            })
        );
        assert!("0x1".parse::<Shape>().is_err());
        assert!("axb".parse::<Shape>().is_err());
    }
}
