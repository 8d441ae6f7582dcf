//! What the benchmark reads: the operator process (RSS, reconciles) and the
//! API server's own metrics (writes by resource, CPU seconds).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use bucketmap_testkit::testenv::{self, TestEnv};

use super::BenchArgs;

/// The environment the image gives the operator (`ENV` in the Dockerfile),
/// so that the bench measures it as it runs when installed.
pub const IMAGE_ENV: [(&str, &str); 1] = [("MALLOC_ARENA_MAX", "1")];

/// The operator's namespace (its webhook certificate Secret lives there).
const OPERATOR_NAMESPACE: &str = "bucketmap-system";
/// The MutatingWebhookConfiguration the bench installs, as deploy/ names it.
const WEBHOOK_CONFIG: &str = "bucketmap";

/// Installs the Gcs finalizer webhook as `deploy/webhook.yaml` ships it,
/// calling the operator on loopback `port`; the operator writes its CA into
/// it when it starts.
pub async fn install_finalizer_webhook(client: &kube::Client, port: u16) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, PostParams};
    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": OPERATOR_NAMESPACE},
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .context("cannot create the operator's namespace")?;
    let url = format!("https://127.0.0.1:{port}/mutate-gcs");
    let hook = bucketmap_testkit::shipped_finalizer_webhook(&url, None)?;
    let config: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": WEBHOOK_CONFIG},
        "webhooks": [hook],
    }))?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .context("cannot install the finalizer webhook")?;
    Ok(())
}

/// Waits until the API server gets the finalizer from the operator's
/// webhook (a dry-run create), so that the run measures the operator with it.
pub async fn wait_finalizer_webhook(client: &kube::Client) -> anyhow::Result<()> {
    use bucketmap::crd::{FINALIZER, Gcs};
    use kube::api::{Api, PostParams};
    let api: Api<Gcs> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let probe: Gcs = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.bucketmap.dev/v1alpha1",
        "kind": "Gcs",
        "metadata": {"name": "webhook-probe"},
        "spec": {"bucketName": "webhook-probe"},
    }))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_until(
        Duration::from_secs(60),
        "the finalizer webhook",
        async || {
            let created = api.create(&dry_run, &probe).await;
            Ok(created.is_ok_and(|g| {
                g.metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == FINALIZER)
            }))
        },
    )
    .await
}

/// `bucketmap operator` as a child process, watching every namespace.
pub struct Operator {
    child: tokio::process::Child,
    metrics_addr: String,
}

impl Operator {
    /// Starts the operator, serving its webhooks on loopback `webhook_port`,
    /// and waits until it serves its metrics.
    pub async fn start(
        env: &TestEnv,
        gcs_endpoint: &str,
        webhook_port: u16,
        args: &BenchArgs,
    ) -> anyhow::Result<Self> {
        // By default this binary's hidden `operator` command, which runs
        // `bucketmap operator`'s entry point, so the operator measured is
        // always the current code.
        let exe = match &args.operator_bin {
            Some(bin) => bin.clone(),
            None => std::env::current_exe().context("cannot find this binary")?,
        };
        let port = bucketmap_testkit::free_port()?;
        let mut command = tokio::process::Command::new(exe);
        command
            .args(["operator", "--gcs-anonymous"])
            .args(["--default-project", "bench-project"])
            .args(["--gcs-endpoint", gcs_endpoint])
            .args(["--bucket-ops-interval", "0s"])
            .args([
                "--resync",
                &humantime::format_duration(args.resync).to_string(),
            ])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .args(["--webhook-addr", &format!("127.0.0.1:{webhook_port}")])
            .args(["--webhook-host", "127.0.0.1"])
            .args(["--webhook-config-name", WEBHOOK_CONFIG])
            .args(["--leader-election-namespace", OPERATOR_NAMESPACE])
            .env("KUBECONFIG", env.kubeconfig_path())
            .env("RUST_LOG", "warn")
            .envs(IMAGE_ENV)
            .stdout(Stdio::null())
            .kill_on_drop(true);
        // Killed with the bench, even by SIGKILL.
        testenv::die_with_parent(&mut command);
        let child = command
            .spawn()
            .context("cannot start the operator process")?;
        let operator = Operator {
            child,
            metrics_addr: format!("127.0.0.1:{port}"),
        };
        wait_until(Duration::from_secs(60), "operator metrics", async || {
            Ok(operator.metrics().await.is_ok())
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(operator)
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("operator exited")
    }

    /// Peak resident set size (VmHWM) in bytes.
    pub fn peak_rss(&self) -> anyhow::Result<u64> {
        proc_status_kib(self.pid()?, "VmHWM").map(|k| k * 1024)
    }

    pub fn rss(&self) -> anyhow::Result<u64> {
        proc_status_kib(self.pid()?, "VmRSS").map(|k| k * 1024)
    }

    /// CPU seconds (user + system) the operator has used so far.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        process_cpu_seconds(self.pid()?)
    }

    async fn metrics(&self) -> anyhow::Result<String> {
        let (status, text) = bucketmap_testkit::http::get(&self.metrics_addr, "/metrics").await?;
        anyhow::ensure!(status == 200, "operator metrics answered {status}");
        Ok(text)
    }

    pub async fn reconciles(&self) -> anyhow::Result<f64> {
        Ok(sample(
            &self.metrics().await?,
            "bucketmap_reconciles_total",
            |_| true,
        ))
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// `USER_HZ`: 100 on every Linux architecture the operator is built for.
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds (user + system) process `pid` has used so far, as the
/// kernel accounts them.
pub fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    proc_stat_cpu_ticks(&stat)
        .map(|ticks| ticks as f64 / CLOCK_TICKS_PER_SECOND)
        .with_context(|| format!("malformed /proc/{pid}/stat"))
}

/// utime + stime of a `/proc/PID/stat` line. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted after its last `)`.
fn proc_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`), in KiB.
pub fn proc_status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("cannot read /proc status")?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Sums the samples of `metric` whose label set passes `labels`.
pub fn sample(text: &str, metric: &str, labels: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(metric)?;
            let (labelset, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            labels(labelset).then(|| value.split_whitespace().next()?.parse::<f64>().ok())?
        })
        .sum()
}

/// Resources whose writes the report counts.
const WRITTEN: [(&str, &str); 4] = [
    ("bucket maps (configmaps)", "resource=\"configmaps\""),
    ("binding secrets", "resource=\"secrets\""),
    ("events", "resource=\"events\""),
    (
        "gcs (the create itself, finalizer, status)",
        "resource=\"gcs\"",
    ),
];

/// Waits (at most 30 s) until the API server is idle: under a fifth of a
/// core for a second. A phase's deletions and the compaction after them
/// must not be billed to the next phase.
pub async fn settle(client: &kube::Client) -> anyhow::Result<()> {
    let mut before = ApiCounters::read(client).await?.cpu;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = ApiCounters::read(client).await?.cpu;
        if now - before < 0.2 {
            break;
        }
        before = now;
    }
    Ok(())
}

/// The API server's counters at one moment.
pub struct ApiCounters {
    pub cpu: f64,
    /// GETs and LISTs of namespaces (the operator reads the namespace's
    /// project annotation when it chooses a new bucket's project).
    pub namespace_reads: f64,
    writes: BTreeMap<&'static str, f64>,
    /// Seconds the API server spent on requests, by `resource verb`.
    time: BTreeMap<String, f64>,
}

impl ApiCounters {
    pub async fn read(client: &kube::Client) -> anyhow::Result<Self> {
        let text = metrics_text(client).await?;
        let is_write = |labels: &str| {
            // The metric's verbs: POST creates, PUT updates, APPLY is server-side apply.
            ["POST", "PUT", "PATCH", "APPLY", "DELETE"]
                .iter()
                .any(|verb| labels.contains(&format!("verb=\"{verb}\"")))
        };
        let writes = WRITTEN
            .iter()
            .map(|(what, resource)| {
                let n = sample(&text, "apiserver_request_total", |l| {
                    l.contains(resource) && is_write(l)
                });
                (*what, n)
            })
            .collect();
        Ok(ApiCounters {
            cpu: sample(&text, "process_cpu_seconds_total", |_| true),
            namespace_reads: sample(&text, "apiserver_request_total", |l| {
                l.contains("resource=\"namespaces\"")
                    && (l.contains("verb=\"GET\"") || l.contains("verb=\"LIST\""))
            }),
            writes,
            time: request_seconds(&text),
        })
    }

    /// Writes per resource since `before`.
    pub fn writes_since(&self, before: &ApiCounters, n: usize) -> BTreeMap<&'static str, f64> {
        self.writes
            .iter()
            .map(|(what, now)| {
                let then = before.writes.get(what).copied().unwrap_or(0.0);
                (*what, (now - then) / n as f64)
            })
            .collect()
    }
}

impl ApiCounters {
    /// The `top` request kinds by API server time since `before`, longest first.
    pub fn time_since(&self, before: &ApiCounters, top: usize) -> Vec<(String, f64)> {
        let mut spent: Vec<(String, f64)> = self
            .time
            .iter()
            .map(|(kind, now)| {
                let then = before.time.get(kind).copied().unwrap_or(0.0);
                (kind.clone(), now - then)
            })
            .filter(|(_, s)| *s > 0.0)
            .collect();
        spent.sort_by(|a, b| b.1.total_cmp(&a.1));
        spent.truncate(top);
        spent
    }
}

/// The API server's `/metrics` (Prometheus text).
pub async fn metrics_text(client: &kube::Client) -> anyhow::Result<String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .context("cannot build the metrics request")?;
    client
        .request_text(request)
        .await
        .context("cannot read the API server's metrics")
}

/// The value of label `name` in a sample's label set (`a="x",b="y"`).
pub fn label(labels: &str, name: &str) -> Option<String> {
    // `,name="` so that `resource` does not match inside `subresource`.
    let labels = format!(",{labels}");
    let start = labels.find(&format!(",{name}=\""))? + name.len() + 3;
    let end = labels[start..].find('"')? + start;
    Some(labels[start..end].to_owned())
}

/// `apiserver_request_duration_seconds_sum` by resource and verb (watches
/// left out: they last as long as the connection).
fn request_seconds(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_duration_seconds_sum{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let (Some(resource), Some(verb), Ok(seconds)) = (
            label(labels, "resource"),
            label(labels, "verb"),
            value.trim().parse::<f64>(),
        ) else {
            continue;
        };
        if verb != "WATCH" {
            *out.entry(format!("{resource} {verb}")).or_insert(0.0) += seconds;
        }
    }
    out
}

/// Polls `check` every 250 ms until it holds or `timeout` passes.
pub async fn wait_until(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_gives_the_operator_the_images_environment() -> anyhow::Result<()> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile");
        let dockerfile = std::fs::read_to_string(path)?;
        for (name, value) in IMAGE_ENV {
            let line = format!("ENV {name}={value}");
            assert!(
                dockerfile.lines().any(|l| l.trim() == line),
                "the Dockerfile does not set {line}"
            );
        }
        Ok(())
    }

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let stat =
            "4242 (bucket map) op) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 9 0 1 2 3";
        assert_eq!(proc_stat_cpu_ticks(stat), Some(281));
        assert_eq!(proc_stat_cpu_ticks("4242 (x) S 1"), None);
    }

    #[test]
    fn samples_are_summed_by_label() {
        let text = "# HELP x\n\
            apiserver_request_total{code=\"201\",resource=\"configmaps\",verb=\"APPLY\"} 3\n\
            apiserver_request_total{code=\"409\",resource=\"configmaps\",verb=\"APPLY\"} 2\n\
            apiserver_request_total{code=\"200\",resource=\"configmaps\",verb=\"GET\"} 7\n\
            process_cpu_seconds_total 12.5\n";
        let applies = sample(text, "apiserver_request_total", |l| l.contains("APPLY"));
        assert_eq!(applies, 5.0);
        assert_eq!(sample(text, "process_cpu_seconds_total", |_| true), 12.5);
        assert_eq!(sample(text, "missing_total", |_| true), 0.0);
        let durations = "apiserver_request_duration_seconds_sum{component=\"apiserver\",subresource=\"status\",resource=\"gcs\",verb=\"APPLY\"} 2.5\n\
            apiserver_request_duration_seconds_sum{resource=\"gcs\",subresource=\"\",verb=\"APPLY\"} 0.5\n\
            apiserver_request_duration_seconds_sum{resource=\"gcs\",verb=\"WATCH\"} 99\n";
        let seconds = request_seconds(durations);
        assert_eq!(seconds.get("gcs APPLY"), Some(&3.0));
        assert_eq!(seconds.len(), 1, "watches are left out");
    }
}
