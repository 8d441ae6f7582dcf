//! `cargo dev bench-map-watchers`: what the sidecars following their bucket
//! maps live (`bucketmap_sidecar::live`) cost the API server.
//!
//! Each size N gets a fresh control plane (its API server collecting
//! garbage as a cluster's does) holding N namespaces as bucketmap leaves
//! them for their pods: the `bucketmap` ConfigMap with a few entries, a
//! ServiceAccount, the Role granting `get`, `list` and `watch` on that one
//! ConfigMap bound to the namespace's ServiceAccounts, and a TokenRequest
//! token laid out as the injected projected volume (`token`, `ca.crt`,
//! `namespace`).
//!
//! Two windows of the same length follow on that control plane. The
//! baseline: nobody follows; every map is changed once. Then N followers
//! start in this process, one per namespace, each with its own token: the
//! sidecar's own loop (`live::run`, its configuration derived from the
//! sidecar's flags by `live::config_of`), started one after another over a
//! relist period so that their relists spread as pods' do. Once every one
//! has confirmed its map, the second window measures the same changes with
//! them. The figures are the API server process's, as the kernel accounts
//! them (`/proc/PID/stat`, `VmRSS`, `VmHWM` reset at each window's start),
//! and its requests by verb (`apiserver_request_total`); the followers'
//! own CPU is this process's and is printed only as context. Each change's
//! delivery is timed from the API server's answer to the patch to the
//! follower's store holding the new entry. Across sizes, the increments
//! over the baseline are fitted by a line and extrapolated.
//!
//! SIGTERM or ctrl-c stops the bench and everything it started.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use bucketmap_sidecar::live;
use bucketmap_sidecar::mapping::MappingStore;
use bucketmap_sidecar::metrics::Metrics;
use bucketmap_testkit::testenv::{self, GoGc, TestEnv};

use super::measure;

/// The ConfigMap each follower follows, as the operator names it.
const MAP: &str = "bucketmap";
/// The ServiceAccount of each namespace's pods.
const ACCOUNT: &str = "app";
/// The entry each change moves to another physical bucket.
const MOVED: &str = "bucket-0";

/// Options of `cargo dev bench-map-watchers`.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchersArgs {
    /// Numbers of followers (pods, each in a namespace of its own) to
    /// measure, each on a fresh control plane.
    #[arg(long, value_delimiter = ',', default_value = "100,300,1000", value_parser = positive)]
    pub sizes: Vec<usize>,
    /// Length of each measured window, the baseline's and the followers'
    /// (several relist periods; shorter for a smoke run).
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// The sidecars' `--max-map-age` (by default the one the webhook
    /// injects); they relist four times per bound.
    #[arg(long, default_value = bucketmap::webhook::inject::MAX_MAP_AGE, value_parser = humantime::parse_duration)]
    pub max_map_age: Duration,
    /// Entries in each namespace's map.
    #[arg(long, default_value_t = 3, value_parser = positive)]
    pub entries: usize,
    /// Concurrent requests while setting up the namespaces and changing the maps.
    #[arg(long, default_value_t = 16, value_parser = positive)]
    pub parallelism: usize,
    /// The number of pods the measured increments are extrapolated to.
    #[arg(long, default_value_t = 10_000, value_parser = positive)]
    pub extrapolate_to: usize,
}

/// A whole number of at least 1.
fn positive(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?} is not a positive whole number"))
}

/// Runs the benchmark and prints a report; stops everything on SIGTERM/ctrl-c.
pub async fn run(args: WatchersArgs) -> anyhow::Result<()> {
    tokio::select! {
        result = bench(args) => result,
        signal = bucketmap::termination_signal() => {
            // Returning drops the run: its children are killed on drop.
            anyhow::bail!("{signal}: benchmark interrupted; stopped everything it started")
        }
    }
}

async fn bench(args: WatchersArgs) -> anyhow::Result<()> {
    println!("# the live bucket map's cost to the API server");
    println!(
        "per size N: N namespaces, each with its map ({} entries), ServiceAccount, Role and \
         RoleBinding, and one follower (`live::run`) with its own token; --max-map-age {:?}; \
         two windows of {:?} on one control plane, the baseline (no followers) first; every \
         map changed once in each window\n",
        args.entries, args.max_map_age, args.window,
    );
    let mut measured = Vec::new();
    for &n in &args.sizes {
        let size = measure_size(&args, n).await?;
        print_size(&size);
        measured.push(size);
    }
    print_extrapolation(&measured, args.extrapolate_to);
    let lost: usize = measured.iter().map(|s| s.undelivered).sum();
    anyhow::ensure!(lost == 0, "{lost} changes never reached their follower");
    Ok(())
}

/// The sidecar's own configuration of its live map, from the flags the
/// webhook gives it, reading its credentials from `dir`.
fn follower_config(args: &WatchersArgs, api: &str, dir: &Path) -> anyhow::Result<live::LiveConfig> {
    use clap::Parser as _;
    let flags = [
        "bucketmap-sidecar".to_owned(),
        format!("--map-configmap={MAP}"),
        format!("--kube-api={api}"),
        format!("--kube-credentials-dir={}", dir.display()),
        format!("--max-map-age={}s", args.max_map_age.as_secs()),
    ];
    let config = bucketmap_sidecar::config::Config::try_parse_from(flags)
        .context("the followers' sidecar flags")?;
    config.validate().map_err(anyhow::Error::msg)?;
    live::config_of(&config)?.context("the flags name no ConfigMap to follow")
}

/// What one size measured.
struct Size {
    n: usize,
    baseline: Window,
    followers: Window,
    /// Each delivered change's latency, shortest first.
    latencies: Vec<Duration>,
    undelivered: usize,
    /// The mean interval between two checks of the followers' stores.
    resolution: Duration,
    /// The followers' relist period.
    relist: Duration,
}

/// One size on a fresh control plane: setup, baseline, followers.
async fn measure_size(args: &WatchersArgs, n: usize) -> anyhow::Result<Size> {
    eprintln!("N = {n}: starting a local control plane...");
    let env = TestEnv::start_with(GoGc::GoDefault).await?;
    let client = env.client().await?;
    let server = ApiServer {
        pid: env.pids().1.context("the API server has no pid")?,
        port: env
            .server_url()
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .context("the API server's URL has no port")?,
        client: client.clone(),
    };
    let dir = tempfile::tempdir().context("cannot create the credentials directory")?;
    eprintln!("N = {n}: {n} namespaces, their maps, accounts, grants and tokens...");
    let namespaces = setup(&env, &client, dir.path(), n, args).await?;
    measure::settle(&client).await?;
    eprintln!("N = {n}: the baseline window ({:?})...", args.window);
    let (baseline, _) = window(&server, &namespaces, args, 1, None).await?;
    eprintln!("N = {n}: starting {n} followers...");
    let followers = Followers::start(&env, &namespaces, dir.path(), args).await?;
    eprintln!("N = {n}: the followers' window ({:?})...", args.window);
    let (with, delivery) = window(&server, &namespaces, args, 2, Some(&followers)).await?;
    let relist = followers.relist;
    followers.stop().await;
    let delivery = delivery.context("no deliveries measured")?;
    Ok(Size {
        n,
        baseline,
        followers: with,
        undelivered: n - delivery.latencies.len(),
        latencies: delivery.latencies,
        resolution: delivery.resolution,
        relist,
    })
}

/// Creates the `n` namespaces with what each follower needs; their names.
async fn setup(
    env: &TestEnv,
    client: &kube::Client,
    dir: &Path,
    n: usize,
    args: &WatchersArgs,
) -> anyhow::Result<Vec<String>> {
    let ca = env.ca_pem()?;
    futures::stream::iter(0..n)
        .map(|_| namespace(client, dir, &ca, args.entries))
        .buffer_unordered(args.parallelism)
        .try_collect()
        .await
}

/// One namespace as bucketmap leaves it for its pods, and the credentials
/// of its ServiceAccount in `dir/<namespace>/`, as the injected volume
/// holds them.
async fn namespace(
    client: &kube::Client,
    dir: &Path,
    ca: &str,
    entries: usize,
) -> anyhow::Result<String> {
    let ns = testenv::create_namespace(client, "watch").await?;
    let pp = PostParams::default();
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ACCOUNT}}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(&pp, &account)
        .await
        .with_context(|| format!("cannot create the ServiceAccount of {ns}"))?;
    grant_map_reading(client, &ns).await?;
    let data: BTreeMap<String, String> = (0..entries)
        .map(|i| (format!("bucket-{i}"), format!("bucket-{i}-k3x9q2mw")))
        .collect();
    let map: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": MAP}, "data": data,
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&pp, &map)
        .await
        .with_context(|| format!("cannot create the bucket map of {ns}"))?;
    let creds = dir.join(&ns);
    std::fs::create_dir(&creds).with_context(|| format!("cannot create {}", creds.display()))?;
    let token = token(client, &ns).await?;
    for (file, contents) in [
        ("token", token.as_str()),
        ("ca.crt", ca),
        ("namespace", &ns),
    ] {
        let path = creds.join(file);
        std::fs::write(&path, contents)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(ns)
}

/// What bucketmap grants a namespace's ServiceAccounts: `get`, `list`,
/// `watch` on the ConfigMap `bucketmap`, by name.
async fn grant_map_reading(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let pp = PostParams::default();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bucketmap-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": [MAP], "verbs": ["get", "list", "watch"]}]
    }))?;
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&pp, &role)
        .await
        .with_context(|| format!("cannot create the Role of {ns}"))?;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bucketmap-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "bucketmap-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": format!("system:serviceaccounts:{ns}")}]
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&pp, &binding)
        .await
        .with_context(|| format!("cannot create the RoleBinding of {ns}"))?;
    Ok(())
}

/// A token of the namespace's ServiceAccount (TokenRequest, for the API
/// server's audience, an hour: longer than any run).
async fn token(client: &kube::Client, ns: &str) -> anyhow::Result<String> {
    testenv::service_account_token(client, ns, ACCOUNT, 3600).await
}

/// The physical bucket the moved entry points at after change `round`.
fn moved_to(round: usize) -> String {
    format!("{MOVED}-moved{round}")
}

/// N followers in this process, one per namespace.
struct Followers {
    stores: Vec<Arc<MappingStore>>,
    tasks: JoinSet<()>,
    shutdown: tokio::sync::watch::Sender<bool>,
    relist: Duration,
}

impl Followers {
    /// Starts one follower per namespace, spread over a relist period, and
    /// waits until each has confirmed the map of the baseline's change.
    async fn start(
        env: &TestEnv,
        namespaces: &[String],
        dir: &Path,
        args: &WatchersArgs,
    ) -> anyhow::Result<Followers> {
        let metrics = Arc::new(Metrics::new());
        let (shutdown, stop) = tokio::sync::watch::channel(false);
        let mut followers = Followers {
            stores: Vec::with_capacity(namespaces.len()),
            tasks: JoinSet::new(),
            shutdown,
            relist: Duration::ZERO,
        };
        for ns in namespaces {
            let config = follower_config(args, &env.server_url(), &dir.join(ns))?;
            followers.relist = config.relist;
            let store = Arc::new(MappingStore::new(None, Vec::new()).following(args.max_map_age));
            let run = live::run(config, store.clone(), metrics.clone(), stop.clone());
            followers.tasks.spawn(run);
            followers.stores.push(store);
            tokio::time::sleep(followers.relist / namespaces.len() as u32).await;
        }
        let expected = moved_to(1);
        let all_confirmed = async || {
            Ok(followers
                .stores
                .iter()
                .all(|s| s.staleness().is_none() && holds(s, &expected)))
        };
        measure::wait_until(args.max_map_age * 2, "every follower's map", all_confirmed).await?;
        // One more relist period: each follower's first watch has ended
        // and been followed by its next list, as in a steady cluster.
        tokio::time::sleep(followers.relist).await;
        Ok(followers)
    }

    async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Whether the store's map points the moved entry at `physical`.
fn holds(store: &MappingStore, physical: &str) -> bool {
    store
        .current()
        .is_some_and(|m| m.physical(MOVED) == Some(physical))
}

/// The API server measured: its process, port and an admin client.
struct ApiServer {
    pid: u32,
    port: u16,
    client: kube::Client,
}

/// The API server process and its counters at one moment.
struct Snapshot {
    at: Instant,
    cpu: f64,
    /// This process's CPU seconds (the followers' own, for context).
    own_cpu: f64,
    rss_kib: u64,
    hwm_kib: u64,
    /// TCP connections open to the API server's port.
    connections: usize,
    metrics: String,
    load: String,
}

impl Snapshot {
    async fn take(server: &ApiServer) -> anyhow::Result<Snapshot> {
        let metrics = measure::metrics_text(&server.client).await?;
        let load = std::fs::read_to_string("/proc/loadavg").context("cannot read /proc/loadavg")?;
        let tcp = std::fs::read_to_string("/proc/net/tcp").context("cannot read /proc/net/tcp")?;
        let pid = server.pid;
        Ok(Snapshot {
            connections: connections_to(&tcp, server.port),
            at: Instant::now(),
            cpu: measure::process_cpu_seconds(pid)?,
            own_cpu: measure::process_cpu_seconds(std::process::id())?,
            rss_kib: measure::proc_status_kib(pid, "VmRSS")?,
            hwm_kib: measure::proc_status_kib(pid, "VmHWM")?,
            metrics,
            load: load
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        })
    }
}

/// What one window measured on the API server.
struct Window {
    seconds: f64,
    cpu: f64,
    own_cpu: f64,
    /// `VmRSS` at the window's end.
    rss_kib: u64,
    /// `VmHWM` over the window (reset at its start).
    hwm_kib: u64,
    /// Requests by verb during the window.
    requests: BTreeMap<String, f64>,
    /// ConfigMap watches open at the window's end.
    watches: f64,
    /// TCP connections open to the API server at the window's end.
    connections: usize,
    /// The load average (1, 5, 15 minutes) at the window's start and end.
    load: (String, String),
}

impl Window {
    fn between(start: &Snapshot, end: &Snapshot) -> Window {
        let before = requests_by_verb(&start.metrics);
        let mut requests = requests_by_verb(&end.metrics);
        for (verb, count) in &mut requests {
            *count -= before.get(verb).copied().unwrap_or(0.0);
        }
        Window {
            seconds: (end.at - start.at).as_secs_f64(),
            cpu: end.cpu - start.cpu,
            own_cpu: end.own_cpu - start.own_cpu,
            rss_kib: end.rss_kib,
            hwm_kib: end.hwm_kib,
            requests,
            watches: open_watches(&end.metrics, "configmaps"),
            connections: end.connections,
            load: (start.load.clone(), end.load.clone()),
        }
    }

    /// API server CPU seconds per minute.
    fn cpu_per_minute(&self) -> f64 {
        self.cpu * 60.0 / self.seconds
    }
}

/// How fast the window's changes reached the followers.
struct Delivery {
    latencies: Vec<Duration>,
    resolution: Duration,
}

/// One window: changes every map once (the moved entry to
/// [`moved_to`]`(round)`), spread over its middle half, and measures the
/// API server over it; with `followers`, times each change's delivery.
async fn window(
    server: &ApiServer,
    namespaces: &[String],
    args: &WatchersArgs,
    round: usize,
    followers: Option<&Followers>,
) -> anyhow::Result<(Window, Option<Delivery>)> {
    let clear_refs = format!("/proc/{}/clear_refs", server.pid);
    // "5" resets the process's peak RSS (VmHWM) to its current RSS.
    std::fs::write(&clear_refs, "5").with_context(|| format!("cannot write {clear_refs}"))?;
    let start = Snapshot::take(server).await?;
    let t0 = start.at;
    let (acks, acked) = mpsc::unbounded_channel();
    let first = t0 + args.window / 4;
    let changes = change_all(
        &server.client,
        namespaces,
        round,
        first,
        args.window / 2,
        args,
        acks,
    );
    let physical = moved_to(round);
    let deadline = t0 + args.window + args.max_map_age;
    let deliveries = async {
        match followers {
            Some(f) => Some(deliveries(&f.stores, &physical, acked, deadline).await),
            None => None,
        }
    };
    let end = async {
        tokio::time::sleep_until((t0 + args.window).into()).await;
        Snapshot::take(server).await
    };
    let (changed, delivery, end) = tokio::join!(changes, deliveries, end);
    changed?;
    Ok((Window::between(&start, &end?), delivery))
}

/// Moves every namespace's entry to [`moved_to`]`(round)`, one change
/// every `span / N` from `first` on (JSON merge patches, as the operator's
/// are writes of the map); sends each namespace's index and the instant
/// its patch was answered.
async fn change_all(
    client: &kube::Client,
    namespaces: &[String],
    round: usize,
    first: Instant,
    span: Duration,
    args: &WatchersArgs,
    acks: mpsc::UnboundedSender<(usize, Instant)>,
) -> anyhow::Result<()> {
    let gap = span / namespaces.len() as u32;
    let patch = serde_json::json!({"data": {MOVED: moved_to(round)}});
    futures::stream::iter(namespaces.iter().enumerate())
        .map(|(i, ns)| {
            let (acks, patch) = (acks.clone(), &patch);
            async move {
                tokio::time::sleep_until((first + gap * i as u32).into()).await;
                Api::<ConfigMap>::namespaced(client.clone(), ns)
                    .patch(MAP, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .with_context(|| format!("cannot change the map of {ns}"))?;
                // The receiver is gone only once the deliveries gave up.
                let _ = acks.send((i, Instant::now()));
                anyhow::Ok(())
            }
        })
        .buffered(args.parallelism)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Checks the stores of the changes acknowledged so far every millisecond
/// until each holds its change or `deadline` passes: each delivery's
/// latency, from the answer to the patch to the first check that saw it.
async fn deliveries(
    stores: &[Arc<MappingStore>],
    physical: &str,
    mut acked: mpsc::UnboundedReceiver<(usize, Instant)>,
    deadline: Instant,
) -> Delivery {
    let mut pending: Vec<(usize, Instant)> = Vec::new();
    let mut latencies = Vec::with_capacity(stores.len());
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut open, mut checks, mut checking) = (true, 0u32, Duration::ZERO);
    while (open || !pending.is_empty()) && Instant::now() < deadline {
        let waited = Instant::now();
        tick.tick().await;
        loop {
            match acked.try_recv() {
                Ok(ack) => pending.push(ack),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let now = Instant::now();
        if !pending.is_empty() {
            checks += 1;
            checking += now - waited;
        }
        pending.retain(|(i, at)| match stores.get(*i) {
            Some(store) if holds(store, physical) => {
                latencies.push(now.saturating_duration_since(*at));
                false
            }
            _ => true,
        });
    }
    latencies.sort();
    Delivery {
        latencies,
        resolution: checking.checked_div(checks).unwrap_or_default(),
    }
}

/// `apiserver_request_total` summed by verb.
fn requests_by_verb(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let (Some(verb), Ok(count)) = (measure::label(labels, "verb"), value.trim().parse::<f64>())
        else {
            continue;
        };
        *out.entry(verb).or_insert(0.0) += count;
    }
    out
}

/// Established connections to loopback `port` in a `/proc/net/tcp` table
/// (each connection's client side: its remote address is the port).
fn connections_to(table: &str, port: u16) -> usize {
    let remote = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace().skip(2);
            let rem = fields.next().unwrap_or_default();
            // State 01 is ESTABLISHED.
            rem.ends_with(&remote) && fields.next() == Some("01")
        })
        .count()
}

/// Watches of `resource` open now (`apiserver_longrunning_requests`).
fn open_watches(text: &str, resource: &str) -> f64 {
    measure::sample(text, "apiserver_longrunning_requests", |labels| {
        measure::label(labels, "verb").as_deref() == Some("WATCH")
            && measure::label(labels, "resource").as_deref() == Some(resource)
    })
}

/// The `p`th percentile (0–100) of `sorted` by the nearest-rank method.
fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    let n = sorted.len();
    let rank = (p / 100.0 * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n.max(1)) - 1).copied()
}

/// A least-squares line `y = intercept + slope * x`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Line {
    intercept: f64,
    slope: f64,
}

impl Line {
    /// The line through `points`: least squares over two sizes or more,
    /// through the origin from one; `None` from none.
    fn fit(points: &[(f64, f64)]) -> Option<Line> {
        let n = points.len() as f64;
        let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
        let spread: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
        match points {
            [] => None,
            [(x, y)] if *x != 0.0 => Some(Line {
                intercept: 0.0,
                slope: y / x,
            }),
            _ if spread > 0.0 => {
                let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
                let slope = covariance / spread;
                Some(Line {
                    intercept: mean_y - slope * mean_x,
                    slope,
                })
            }
            _ => None,
        }
    }

    fn at(&self, x: f64) -> f64 {
        self.intercept + self.slope * x
    }
}

fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

/// One size's figures against its baseline.
fn print_size(s: &Size) {
    let (b, f) = (&s.baseline, &s.followers);
    let n = s.n as f64;
    println!(
        "## N = {} followers (each relisting every {:?})",
        s.n, s.relist
    );
    println!(
        "- load average (1, 5, 15 min) at the windows' start and end: baseline {} → {}, \
         followers {} → {}",
        b.load.0, b.load.1, f.load.0, f.load.1
    );
    let (cpu_b, cpu_f) = (b.cpu_per_minute(), f.cpu_per_minute());
    println!(
        "- API server CPU: {cpu_f:.2} s per minute against the baseline's {cpu_b:.2}: \
         {:.2}x; +{:.2} s/min, {:.2} ms per minute per follower",
        cpu_f / cpu_b.max(1e-9),
        cpu_f - cpu_b,
        (cpu_f - cpu_b) * 1000.0 / n,
    );
    println!(
        "- API server RSS at the window's end: {:.1} MiB against the baseline's {:.1}: {:.2}x; \
         {:+.1} MiB, {:+.1} KiB per follower; peak in the window (VmHWM) {:.1} against {:.1} MiB",
        mib(f.rss_kib as f64),
        mib(b.rss_kib as f64),
        f.rss_kib as f64 / b.rss_kib as f64,
        mib(f.rss_kib as f64 - b.rss_kib as f64),
        (f.rss_kib as f64 - b.rss_kib as f64) / n,
        mib(f.hwm_kib as f64),
        mib(b.hwm_kib as f64),
    );
    print_requests(s);
    print_latencies(s);
    println!(
        "- the followers' own CPU (this process, context only): {:.2} s per minute, {:.2} in the baseline\n",
        f.own_cpu * 60.0 / f.seconds,
        b.own_cpu * 60.0 / b.seconds,
    );
}

/// Requests per second by verb, against the baseline's.
fn print_requests(s: &Size) {
    let (b, f) = (&s.baseline, &s.followers);
    let verbs: Vec<String> = f
        .requests
        .iter()
        .filter(|(_, count)| **count > 0.0)
        .map(|(verb, count)| {
            let base = b.requests.get(verb).copied().unwrap_or(0.0) / b.seconds;
            format!("{verb} {:.2} ({base:.2})", count / f.seconds)
        })
        .collect();
    println!(
        "- requests per second by verb, with followers (baseline): {}; ConfigMap watches open \
         at the end: {:.0} ({:.0}); TCP connections to the API server: {} ({}), {:.2} per \
         follower",
        verbs.join(", "),
        f.watches,
        b.watches,
        f.connections,
        b.connections,
        (f.connections as f64 - b.connections as f64) / s.n as f64,
    );
}

fn print_latencies(s: &Size) {
    let ms = |p: f64| percentile(&s.latencies, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    println!(
        "- a changed map reaching the follower's store (from the API server's answer to the \
         patch; {} of {} delivered, checked every {:.1} ms): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        s.latencies.len(),
        s.n,
        s.resolution.as_secs_f64() * 1000.0,
        ms(50.0),
        ms(99.0),
        ms(100.0),
    );
}

/// The increments over the baseline fitted by a line across the sizes, at
/// `pods`.
fn print_extrapolation(sizes: &[Size], pods: usize) {
    let points = |f: &dyn Fn(&Size) -> f64| -> Vec<(f64, f64)> {
        sizes.iter().map(|s| (s.n as f64, f(s))).collect()
    };
    let cpu = points(&|s| s.followers.cpu_per_minute() - s.baseline.cpu_per_minute());
    let rss = points(&|s| mib(s.followers.rss_kib as f64 - s.baseline.rss_kib as f64));
    let (Some(cpu), Some(rss)) = (Line::fit(&cpu), Line::fit(&rss)) else {
        return;
    };
    let from = sizes
        .iter()
        .map(|s| s.n.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let how = match sizes {
        [_] => format!("the increment over the baseline at N = {from}, in proportion"),
        _ => format!("a least-squares line through the increments over the baseline at N = {from}"),
    };
    let x = pods as f64;
    println!("## Extrapolated to {pods} pods (not measured: {how})");
    println!(
        "- API server CPU: +{:.1} s per minute ({:.2} cores); fit {:.2} s/min + {:.3} ms/min × N",
        cpu.at(x),
        cpu.at(x) / 60.0,
        cpu.intercept,
        cpu.slope * 1000.0,
    );
    println!(
        "- API server RSS: {:+.0} MiB; fit {:.1} MiB + {:.1} KiB × N",
        rss.at(x),
        rss.intercept,
        rss.slope * 1024.0,
    );
    if let Some(largest) = sizes.iter().max_by_key(|s| s.n) {
        print_requests_at(largest, pods);
    }
}

/// The requests per second the followers add, per follower at `s` times `pods`.
fn print_requests_at(s: &Size, pods: usize) {
    let (b, f) = (&s.baseline, &s.followers);
    let added: Vec<String> = f
        .requests
        .iter()
        .filter_map(|(verb, count)| {
            let base = b.requests.get(verb).copied().unwrap_or(0.0) / b.seconds;
            let per_follower = (count / f.seconds - base) / s.n as f64;
            (per_follower * pods as f64 >= 0.05)
                .then(|| format!("{verb} {:.1}", per_follower * pods as f64))
        })
        .collect();
    println!(
        "- requests per second added (the rate per follower at N = {} times {pods}): {}\n",
        s.n,
        added.join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_positive_whole_numbers() {
        assert_eq!(positive("300"), Ok(300));
        assert_eq!(positive(" 1000 "), Ok(1000));
        assert!(positive("0").is_err());
        assert!(positive("-1").is_err());
        assert!(positive("1k").is_err());
    }

    #[test]
    fn requests_are_summed_by_verb_and_watches_counted_by_resource() {
        let text = "# HELP apiserver_request_total x\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",resource=\"configmaps\",verb=\"LIST\"} 40\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",resource=\"secrets\",verb=\"LIST\"} 2\n\
            apiserver_request_total{code=\"200\",resource=\"configmaps\",verb=\"WATCH\"} 39\n\
            apiserver_request_total{code=\"200\",resource=\"configmaps\",verb=\"PATCH\"} 1.5e+01\n\
            apiserver_request_total_other{verb=\"LIST\"} 1000\n\
            apiserver_longrunning_requests{component=\"apiserver\",resource=\"configmaps\",scope=\"namespace\",subresource=\"\",verb=\"WATCH\"} 98\n\
            apiserver_longrunning_requests{component=\"apiserver\",resource=\"configmaps\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\"} 2\n\
            apiserver_longrunning_requests{component=\"apiserver\",resource=\"secrets\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\"} 5\n";
        let by_verb = requests_by_verb(text);
        assert_eq!(by_verb.len(), 3, "{by_verb:?}");
        assert_eq!(by_verb.get("LIST"), Some(&42.0));
        assert_eq!(by_verb.get("WATCH"), Some(&39.0));
        assert_eq!(by_verb.get("PATCH"), Some(&15.0));
        assert_eq!(open_watches(text, "configmaps"), 100.0);
        assert_eq!(open_watches(text, "pods"), 0.0);
    }

    #[test]
    fn established_connections_to_a_port_are_counted() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue\n\
            0: 0100007F:9D0B 00000000:0000 0A 00000000:00000000\n\
            1: 0100007F:C350 0100007F:9D0B 01 00000000:00000000\n\
            2: 0100007F:C351 0100007F:9D0B 01 00000000:00000000\n\
            3: 0100007F:C352 0100007F:9D0B 06 00000000:00000000\n\
            4: 0100007F:9D0B 0100007F:C350 01 00000000:00000000\n\
            5: 0100007F:C353 0100007F:19D0B 01 00000000:00000000\n";
        // 0x9D0B = 40203: two established, one in TIME_WAIT, one the
        // server's side, one another port.
        assert_eq!(connections_to(table, 40203), 2);
        assert_eq!(connections_to(table, 1), 0);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let ms = |v: u64| Duration::from_millis(v);
        let sorted: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&sorted, 50.0), Some(ms(50)));
        assert_eq!(percentile(&sorted, 99.0), Some(ms(99)));
        assert_eq!(percentile(&sorted, 100.0), Some(ms(100)));
        assert_eq!(percentile(&sorted, 0.0), Some(ms(1)));
        let three = [ms(5), ms(7), ms(9)];
        assert_eq!(percentile(&three, 50.0), Some(ms(7)));
        assert_eq!(percentile(&three, 99.0), Some(ms(9)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn the_fit_is_least_squares_and_through_the_origin_from_one_size() {
        let line = Line::fit(&[(100.0, 3.0), (300.0, 7.0), (1000.0, 21.0)]);
        let line = line.expect("three sizes fit a line");
        // Exact for points on y = 1 + 0.02 x.
        assert!((line.slope - 0.02).abs() < 1e-12, "{line:?}");
        assert!((line.intercept - 1.0).abs() < 1e-9, "{line:?}");
        assert!((line.at(10_000.0) - 201.0).abs() < 1e-6);
        let scattered = Line::fit(&[(0.0, 0.0), (1.0, 2.0), (2.0, 1.0)]).expect("a line");
        assert!((scattered.slope - 0.5).abs() < 1e-12, "{scattered:?}");
        assert!((scattered.intercept - 0.5).abs() < 1e-12, "{scattered:?}");
        let one = Line::fit(&[(100.0, 5.0)]).expect("through the origin");
        assert_eq!((one.intercept, one.at(10_000.0)), (0.0, 500.0));
        assert_eq!(Line::fit(&[]), None);
        assert_eq!(Line::fit(&[(100.0, 1.0), (100.0, 2.0)]), None);
    }
}
