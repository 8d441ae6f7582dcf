//! What a user does on the node, each a test.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use bucketmap::crd::Gcs;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};

use crate::cluster::Cluster;
use crate::lifecycle;
use crate::live;
use crate::more;

type Scenario = fn(Arc<Cluster>) -> Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// Every scenario, in the order they run.
pub const ALL: &[(&str, Scenario)] = &[
    (
        "a_example_app_writes_photos_through_the_injected_sidecar",
        |c| Box::pin(example_app_writes_through_the_injected_sidecar(c)),
    ),
    (
        "b_new_gcs_reach_the_running_sidecar_through_restarts",
        |c| Box::pin(live::new_gcs_reach_the_running_sidecar(c)),
    ),
    ("c_a_restricted_namespace_runs_the_injected_pod", |c| {
        Box::pin(more::a_restricted_namespace_runs_the_injected_pod(c))
    }),
    ("d_the_sidecar_outlives_the_app_at_pod_deletion", |c| {
        Box::pin(more::the_sidecar_outlives_the_app_at_pod_deletion(c))
    }),
    (
        "e_the_standby_operator_takes_over_from_a_deleted_leader",
        |c| Box::pin(more::the_standby_operator_takes_over(c)),
    ),
    (
        "f_unlabelled_pods_are_left_alone_and_host_network_refused",
        |c| Box::pin(more::unlabelled_left_alone_host_network_refused(c)),
    ),
    (
        "g_the_platform_teams_helm_lifecycle_keeps_every_bucket",
        |c| Box::pin(lifecycle::the_helm_lifecycle_keeps_every_bucket(c)),
    ),
];

/// How long the node may take for anything a user waits on.
const PATIENCE: Duration = Duration::from_secs(180);

/// Polls `check` until it answers `Some`, for [`PATIENCE`]; the error names
/// `what` and the last thing `check` said.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut last;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => last = "not yet".to_owned(),
            Err(e) => last = format!("{e:#}"),
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{what}: not within {PATIENCE:?} (last: {last})");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The Gcs once Ready: its physical bucket name.
pub(crate) async fn ready_bucket(c: &Cluster, namespace: &str, name: &str) -> Result<String> {
    let api: Api<Gcs> = Api::namespaced(c.client.clone(), namespace);
    eventually(&format!("Gcs {namespace}/{name} Ready"), || async {
        let gcs = api.get(name).await?;
        let ready = gcs.is_ready();
        Ok(gcs
            .status
            .and_then(|s| s.bucket_full_name)
            .filter(|_| ready))
    })
    .await
}

/// The one Ready pod of `selector`.
pub(crate) async fn ready_pod(c: &Cluster, namespace: &str, selector: &str) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), namespace);
    eventually(
        &format!("a Ready pod {selector} in {namespace}"),
        || async {
            let pods = api.list(&ListParams::default().labels(selector)).await?;
            Ok(pods.items.into_iter().find(|pod| {
                pod.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            }))
        },
    )
    .await
}

fn started_at(status: &ContainerStatus) -> Option<k8s_openapi::jiff::Timestamp> {
    status
        .state
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map(|t| t.0)
}

/// (a) The examples on the node: the app's pod is scheduled, the injected
/// native sidecar starts (its startup probe passes) before the app, the
/// pod turns Ready, and the app's `photos/hello.txt` is in the namespace's
/// physical bucket.
async fn example_app_writes_through_the_injected_sidecar(c: Arc<Cluster>) -> Result<()> {
    let physical = ready_bucket(&c, "staging", "photos").await?;
    ensure!(physical.starts_with("photos-"), "physical name {physical}");
    let pod = ready_pod(&c, "staging", "app=photo-app").await?;
    let status = pod.status.clone().context("pod without status")?;
    let sidecars = status.init_container_statuses.unwrap_or_default();
    ensure!(sidecars.len() == 1, "init containers: {sidecars:?}");
    let sidecar = &sidecars[0];
    ensure!(
        sidecar.name == "bucketmap-sidecar",
        "injected: {}",
        sidecar.name
    );
    ensure!(
        sidecar.started == Some(true),
        "sidecar not started: {sidecar:?}"
    );
    let apps = status.container_statuses.unwrap_or_default();
    ensure!(apps.len() == 1, "containers: {apps:?}");
    let (sidecar_start, app_start) = (started_at(sidecar), started_at(&apps[0]));
    ensure!(
        sidecar_start.is_some() && sidecar_start <= app_start,
        "the sidecar started at {sidecar_start:?}, the app at {app_start:?}"
    );

    app_wrote_hello(&c, &pod, &physical).await
}

/// The app in `pod` logged its write, and `hello.txt` is in `physical`.
pub(crate) async fn app_wrote_hello(c: &Cluster, pod: &Pod, physical: &str) -> Result<()> {
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .context("pod without namespace")?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &namespace);
    let name = pod.metadata.name.clone().context("pod without name")?;
    eventually("the app's log line", || async {
        let params = LogParams {
            container: Some("app".to_owned()),
            ..LogParams::default()
        };
        let logs = pods.logs(&name, &params).await?;
        Ok(logs.contains("wrote hello.txt to photos").then_some(()))
    })
    .await?;
    let path = format!("/storage/v1/b/{physical}/o/hello.txt");
    let addr = c.product.fake_gcs.local_addr().to_string();
    let (code, body) = bucketmap_testkit::http::request(&addr, "GET", &path, "").await?;
    ensure!(code == 200, "hello.txt in {physical}: {code} {body}");
    Ok(())
}
