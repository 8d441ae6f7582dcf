//! Scenarios (c) to (f): Pod Security, shutdown order, operator failover,
//! and the pods the webhook leaves alone or refuses.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use bucketmap_testkit::node::product::kubectl_apply;
use futures::{AsyncBufReadExt as _, TryStreamExt as _};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, LogParams, PostParams};

use bucketmap_testkit::node::product::SYSTEM_NAMESPACE;

use crate::cluster::Cluster;
use crate::scenarios::{app_wrote_hello, eventually, ready_bucket, ready_pod};

/// The example app's Deployment, its ServiceAccount and a `photos` Gcs in
/// `namespace`.
fn example_app_in(namespace: &str) -> Result<String> {
    let app = std::fs::read_to_string(bucketmap_testkit::repo_path("examples/photo-app.yaml"))?;
    ensure!(
        app.contains("namespace: staging"),
        "examples/photo-app.yaml moved"
    );
    Ok(format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: photo-app, namespace: {namespace}}}\n\
         ---\napiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\n\
         metadata: {{name: photos, namespace: {namespace}}}\nspec: {{bucketName: photos}}\n---\n{}",
        app.replace("namespace: staging", &format!("namespace: {namespace}"))
    ))
}

/// (c) A namespace that enforces the `restricted` Pod Security Standard
/// admits and runs the injected pod.
pub async fn a_restricted_namespace_runs_the_injected_pod(c: Arc<Cluster>) -> Result<()> {
    let namespace = "restricted";
    kubectl_apply(
        &c.node,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: restricted\n"
        ),
    )
    .await?;
    kubectl_apply(&c.node, &example_app_in(namespace)?).await?;
    let physical = ready_bucket(&c, namespace, "photos").await?;
    let pod = ready_pod(&c, namespace, "app=photo-app").await?;
    app_wrote_hello(&c, &pod, &physical).await
}

/// Attaches to the log of `container` in `pod` (the API server has
/// answered when this returns) and follows it in a task until it ends; its
/// lines with the kubelet's timestamps.
async fn follow_log(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
) -> Result<tokio::task::JoinHandle<Result<Vec<String>>>> {
    let params = LogParams {
        container: Some(container.to_owned()),
        follow: true,
        timestamps: true,
        ..LogParams::default()
    };
    let stream = pods.log_stream(pod, &params).await?;
    Ok(tokio::spawn(async move {
        Ok(stream.lines().try_collect().await?)
    }))
}

/// (d) Deleting the app's pod: the kubelet stops the app first; the app
/// keeps using GCS while it drains and no request fails; the sidecar stops
/// after it.
pub async fn the_sidecar_outlives_the_app_at_pod_deletion(c: Arc<Cluster>) -> Result<()> {
    let pod = ready_pod(&c, "staging", "app=photo-app").await?;
    let name = pod.metadata.name.clone().context("pod without name")?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "staging");
    // Both streams are attached before the pod goes.
    let app_log = follow_log(&pods, &name, "app").await?;
    let sidecar_log = follow_log(&pods, &name, "bucketmap-sidecar").await?;
    pods.delete(&name, &DeleteParams::default()).await?;
    let app = tokio::time::timeout(Duration::from_secs(120), app_log).await???;
    let sidecar = tokio::time::timeout(Duration::from_secs(120), sidecar_log).await???;
    let summary = app
        .iter()
        .rev()
        .find(|l| l.contains("requests="))
        .with_context(|| format!("the app logged no summary: {app:?}"))?;
    ensure!(
        summary.contains("failures=0"),
        "the app saw failures: {summary}"
    );
    ensure!(
        !summary.contains("drained=0 "),
        "the app made no request while it drained: {summary}"
    );
    let last = |lines: &[String]| {
        lines
            .last()
            .and_then(|l| l.split(' ').next())
            .map(str::to_owned)
    };
    let (app_end, sidecar_end) = (last(&app), last(&sidecar));
    ensure!(
        app_end.is_some() && sidecar_end >= app_end,
        "the sidecar's log ended at {sidecar_end:?}, the app's at {app_end:?}"
    );
    // The Deployment brings the app back for the scenarios after this one.
    ready_pod(&c, "staging", "app=photo-app").await.map(drop)
}

/// (e) Deleting the operator pod that holds the Lease: the standby takes
/// it, and a Gcs applied meanwhile becomes Ready.
pub async fn the_standby_operator_takes_over(c: Arc<Cluster>) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), SYSTEM_NAMESPACE);
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    let leader = eventually("a leader", || async {
        Ok(leases.get_opt("bucketmap-operator").await?.and_then(holder))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), SYSTEM_NAMESPACE);
    pods.delete(&leader, &DeleteParams::default()).await?;
    kubectl_apply(
        &c.node,
        "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\n\
         metadata: {name: failover, namespace: staging}\nspec: {bucketName: failover}\n",
    )
    .await?;
    ready_bucket(&c, "staging", "failover").await?;
    let successor = eventually("a new leader", || async {
        let now = leases.get_opt("bucketmap-operator").await?.and_then(holder);
        Ok(now.filter(|h| *h != leader))
    })
    .await?;
    ensure!(
        pods.get_opt(&successor).await?.is_some(),
        "the new leader {successor} is no operator pod"
    );
    Ok(())
}

fn plain_pod(name: &str, inject: bool, host_network: bool) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": if inject { serde_json::json!({"bucketmap.dev/inject": "true"}) }
                      else { serde_json::json!({}) },
        },
        "spec": {
            "hostNetwork": host_network,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))?)
}

/// (f) A pod without the label is admitted unchanged; a labelled
/// hostNetwork pod is refused with the documented reason.
pub async fn unlabelled_left_alone_host_network_refused(c: Arc<Cluster>) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "staging");
    let plain = pods
        .create(&PostParams::default(), &plain_pod("plain", false, false)?)
        .await?;
    let spec = plain.spec.context("pod without spec")?;
    ensure!(
        spec.init_containers.unwrap_or_default().is_empty(),
        "a sidecar was injected"
    );
    ensure!(
        spec.containers.len() == 1,
        "containers: {:?}",
        spec.containers
    );
    let refused = pods
        .create(&PostParams::default(), &plain_pod("host", true, true)?)
        .await;
    let err = refused
        .err()
        .context("a labelled hostNetwork pod was admitted")?;
    ensure!(
        err.to_string().contains("hostNetwork"),
        "refused for another reason: {err}"
    );
    pods.delete("plain", &DeleteParams::default()).await?;
    Ok(())
}
