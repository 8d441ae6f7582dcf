//! The check after all Ready: every resource's status is what a fresh
//! reconcile writes. Faults paused and the replicas quiet, the statuses
//! are recorded; an operator that has seen nothing of the run (its own
//! caches, no memory of earlier writes) reconciles every resource once;
//! any status it changed was not what the state called for: a write from
//! a stale view that landed, or a condition left behind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bucketmap::controller::{self, OperatorConfig};
use bucketmap::gcs::{GcsClient, GcsConfig};
use bucketmap::metrics::Metrics;
use kube::api::{Api, ListParams};
use serde_json::Value;

use super::Run;
use super::check::Violation;

/// How long the statuses must stay unchanged to count as settled.
const QUIET: Duration = Duration::from_secs(3);
/// How long the check waits for quiet, or for the fresh operator.
const PATIENCE: Duration = Duration::from_secs(120);

/// A resource's status as a reconcile decides it: without the times of
/// its conditions' last transitions (a rewrite of the same condition
/// keeps them anyway).
fn decided(g: &bucketmap::crd::Gcs) -> Value {
    let mut status = serde_json::to_value(&g.status).unwrap_or(Value::Null);
    if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if let Some(c) = c.as_object_mut() {
                c.remove("lastTransitionTime");
            }
        }
    }
    status
}

/// Every resource of the run: its resourceVersion and decided status.
async fn statuses(w: &Run) -> anyhow::Result<BTreeMap<String, (String, Value)>> {
    let mut out = BTreeMap::new();
    for ns in &w.namespaces {
        let api: Api<bucketmap::crd::Gcs> = Api::namespaced(w.client.clone(), ns);
        for g in api.list(&ListParams::default()).await? {
            let version = g.metadata.resource_version.clone().unwrap_or_default();
            out.insert(
                format!("{ns}/{}", kube::ResourceExt::name_any(&g)),
                (version, decided(&g)),
            );
        }
    }
    Ok(out)
}

/// The statuses once no resource changed for [`QUIET`].
async fn settled(w: &Run) -> anyhow::Result<BTreeMap<String, (String, Value)>> {
    let deadline = Instant::now() + PATIENCE;
    let mut last = statuses(w).await?;
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = statuses(w).await?;
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= QUIET {
            return Ok(now);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the statuses did not settle within {PATIENCE:?}"
        );
    }
}

/// The settings of the run's replicas, for an operator of the test's own.
async fn config(w: &Run, policy: &std::path::Path) -> anyhow::Result<OperatorConfig> {
    let (cluster_id, _) =
        bucketmap::cluster_id::resolve(&w.client, None, &w.lease_namespace).await?;
    Ok(OperatorConfig {
        cluster_id,
        bucket_ops_interval: None,
        tenancy: Arc::new(bucketmap::tenancy::Policy::from_file(policy)?),
        operator_namespace: w.lease_namespace.clone(),
        ..OperatorConfig::default()
    })
}

/// Runs a fresh operator until it has reconciled `resources` times and
/// the statuses are quiet again.
async fn reconcile_all(w: &Run, policy: &std::path::Path, resources: usize) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let gcs_config = GcsConfig {
        endpoint: Some(w.mock.endpoint()),
        anonymous: true,
    };
    let gcs = GcsClient::connect(&gcs_config, metrics.clone()).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(controller::run(
        w.env.client().await?,
        gcs,
        metrics.clone(),
        config(w, policy).await?,
        || {},
        async {
            let _ = stopped.await;
        },
    ));
    let deadline = Instant::now() + PATIENCE;
    while metrics.reconcile_ended_count() < resources as u64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "a fresh operator reconciled {} of {resources} resources within {PATIENCE:?}",
            metrics.reconcile_ended_count()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    settled(w).await?;
    let _ = stop.send(());
    operator.await?;
    Ok(())
}

/// The resources whose status a fresh operator's reconcile changed.
pub async fn check(w: &Run, policy: &std::path::Path) -> anyhow::Result<Vec<Violation>> {
    let before = settled(w).await?;
    reconcile_all(w, policy, before.len()).await?;
    let after = statuses(w).await?;
    let mut violations = Vec::new();
    for (key, (_, was)) in &before {
        match after.get(key) {
            Some((_, now)) if now == was => {}
            Some((_, now)) => violations.push(format!(
                "{key}: its status was not what a fresh reconcile writes: was {was}, a fresh reconcile wrote {now}"
            )),
            None => violations.push(format!("{key}: gone during the fresh reconcile")),
        }
    }
    Ok(violations)
}
