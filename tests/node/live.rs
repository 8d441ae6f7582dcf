//! Scenario (b): the map reaches a running sidecar through its watch on the
//! API server, and a restart of the API server or of the kubelet loses
//! nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use bucketmap::crd::Gcs;
use bucketmap_testkit::node::netns::Forwarder;
use bucketmap_testkit::node::product::kubectl_apply;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt as _};

use crate::cluster::Cluster;
use crate::scenarios::ready_pod;

/// The sidecar's admin port on the pod IP (probes and /metrics).
const ADMIN_PORT: u16 = 9024;
/// How many new Gcs the scenario applies, one after the other.
const NEW_GCS: usize = 20;
/// How long anything here may take.
const PATIENCE: Duration = Duration::from_secs(180);

/// The running sidecar's `/metrics`, through a forwarder to its pod IP.
struct Sidecar {
    forwarder: Forwarder,
}

impl Sidecar {
    async fn of(c: &Cluster, pod: &Pod) -> Result<Sidecar> {
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .context("pod without an IP")?;
        let forwarder = c
            .node
            .forward_to(format!("{ip}:{ADMIN_PORT}").parse()?)
            .await?;
        Ok(Sidecar { forwarder })
    }

    /// A sample of the sidecar's `/metrics`.
    async fn metric(&self, name: &str) -> Result<f64> {
        let addr = self.forwarder.local_addr().to_string();
        let (code, body) = bucketmap_testkit::http::request(&addr, "GET", "/metrics", "").await?;
        ensure!(code == 200, "/metrics: {code}");
        body.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no {name} in /metrics"))
    }

    async fn entries(&self) -> Result<u64> {
        Ok(self.metric("bucketmap_sidecar_mapping_entries").await? as u64)
    }

    /// Polls every 50 ms until the sidecar's map holds `want` entries.
    async fn until_entries(&self, want: u64) -> Result<()> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let now = self.entries().await;
            if now.as_ref().is_ok_and(|n| *n == want) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the sidecar's map never held {want} entries (last: {now:?})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Polls every 50 ms until the Gcs is Ready.
async fn until_ready(c: &Cluster, name: &str) -> Result<()> {
    let api: Api<Gcs> = Api::namespaced(c.client.clone(), "staging");
    let deadline = Instant::now() + PATIENCE;
    while !api.get_opt(name).await?.is_some_and(|g| g.is_ready()) {
        ensure!(Instant::now() < deadline, "Gcs staging/{name} never Ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Polls every 50 ms until every Gcs in `staging` is Ready (the examples
/// apply more than one, and the first scenario waits for one of them), and
/// returns how many there are: the map the running sidecar must hold before
/// anything new is applied.
async fn settled(c: &Cluster) -> Result<u64> {
    let api: Api<Gcs> = Api::namespaced(c.client.clone(), "staging");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let all = api.list(&Default::default()).await?.items;
        if !all.is_empty() && all.iter().all(Gcs::is_ready) {
            return Ok(all.len() as u64);
        }
        let waiting: Vec<_> = all
            .iter()
            .filter(|g| !g.is_ready())
            .map(|g| g.name_any())
            .collect();
        ensure!(
            Instant::now() < deadline,
            "Gcs in staging never Ready: {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The p-th percentile (0-100) of sorted durations, nearest rank.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// (b) Twenty new Gcs applied while the app runs each reach its running
/// sidecar, without a restart, through the sidecar's watch of the map (not
/// the kubelet's sync of the volume). The API server is killed and started
/// again after a third of them, the kubelet after two thirds: every entry
/// still arrives, the sidecar never restarts, its map is confirmed again,
/// and deleting them all empties the map of them. Prints the time from
/// Ready to the entry in the running sidecar, p50 and max.
pub async fn new_gcs_reach_the_running_sidecar(c: Arc<Cluster>) -> Result<()> {
    let pod = ready_pod(&c, "staging", "app=photo-app").await?;
    let sidecar = Sidecar::of(&c, &pod).await?;
    let base = settled(&c).await?;
    sidecar.until_entries(base).await?;
    let (mut took, mut whole) = (Vec::new(), Vec::new());
    for i in 0..NEW_GCS {
        if i == NEW_GCS / 3 {
            c.node.restart("kube-apiserver").await?;
        }
        if i == 2 * NEW_GCS / 3 {
            c.node.restart("kubelet").await?;
        }
        let name = format!("album-{i}");
        let applied = Instant::now();
        kubectl_apply(
            &c.node,
            &format!(
                "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\n\
                 metadata: {{name: {name}, namespace: staging}}\nspec: {{bucketName: {name}}}\n"
            ),
        )
        .await?;
        until_ready(&c, &name).await?;
        let ready = Instant::now();
        sidecar.until_entries(base + i as u64 + 1).await?;
        took.push(ready.elapsed());
        whole.push(applied.elapsed());
    }
    unchanged(&c, &pod).await?;
    let age = sidecar.metric("bucketmap_sidecar_map_age_seconds").await?;
    ensure!(age < 60.0, "the map was last confirmed {age} s ago");
    took.sort();
    whole.sort();
    println!(
        "{NEW_GCS} new Gcs (kube-apiserver and kubelet restarted on the way), polled every \
         50 ms: Ready to the running sidecar's map p50 {:.2} s, max {:.2} s; kubectl apply \
         to the running sidecar's map p50 {:.2} s, max {:.2} s",
        percentile(&took, 50).as_secs_f64(),
        percentile(&took, 100).as_secs_f64(),
        percentile(&whole, 50).as_secs_f64(),
        percentile(&whole, 100).as_secs_f64()
    );
    let api: Api<Gcs> = Api::namespaced(c.client.clone(), "staging");
    for i in 0..NEW_GCS {
        api.delete(&format!("album-{i}"), &DeleteParams::default())
            .await?;
    }
    sidecar.until_entries(base).await
}

/// The pod is the same one and its containers never restarted.
async fn unchanged(c: &Cluster, pod: &Pod) -> Result<()> {
    let now = ready_pod(c, "staging", "app=photo-app").await?;
    ensure!(
        now.metadata.uid == pod.metadata.uid,
        "the pod was replaced instead of updated"
    );
    let status = now.status.unwrap_or_default();
    let restarts: i32 = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .map(|s| s.restart_count)
        .sum();
    ensure!(restarts == 0, "containers restarted {restarts} times");
    Ok(())
}
