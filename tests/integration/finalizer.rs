//! The operator adds its finalizer without reporting a failure, also when
//! it reconciles a cached copy of the resource older than its own
//! finalizer write: a reconcile queued by another watch (a ServiceAccount
//! that `spec.access` names, applied right after the resource, as `cargo
//! dev` does) runs before the resource's watch brings the write back.
//!
//! To make that lag certain, the operator talks to the API server through
//! the test's proxy, which answers every watch of `Gcs` resources with a
//! stream that stays open and never sends an event: the operator's cache
//! keeps the resource as first listed, without the finalizer.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::Request;
use bucketmap::crd::{FINALIZER, Gcs};
use common::Fixture;
use common::api_proxy::{self, is_watch_of, silent_watch};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;

type TestResult = anyhow::Result<()>;

/// Waits until a reconcile started after `started` reconciles, and every
/// reconcile started so far has ended.
async fn wait_until_ended_after(f: &Fixture, started: u64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let now = f.metrics.reconcile_count();
        if now > started && f.metrics.reconcile_ended_count() == now {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no reconcile after the ServiceAccount ended: {} started before it, {now} since, {} ended",
            started,
            f.metrics.reconcile_ended_count()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn create_service_account(f: &Fixture, name: &str) -> anyhow::Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(f.client.clone(), &f.ns);
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": f.ns},
    }))?;
    api.create(&PostParams::default(), &sa).await?;
    Ok(())
}

#[tokio::test]
async fn a_reconcile_of_a_copy_older_than_the_finalizer_write_is_no_failure() -> TestResult {
    let f = Fixture::new().await?;
    let silenced = Arc::new(AtomicUsize::new(0));
    let count = silenced.clone();
    let intercept = Arc::new(move |req: &Request| {
        is_watch_of(req, "/gcs").then(|| {
            count.fetch_add(1, Ordering::SeqCst);
            silent_watch()
        })
    });
    // Created before the operator starts: its first list has it, without
    // the finalizer (no finalizer webhook here), and no watch event follows.
    f.create(
        "logs",
        serde_json::json!({
            "bucketName": "logs",
            "access": [{"serviceAccount": "app", "role": "objectViewer"}],
        }),
    )
    .await?;
    let addr = api_proxy::start(&f, intercept).await?;
    let _operator = api_proxy::start_operator_via(&f, addr).await?;
    f.wait_for(
        "logs",
        std::time::Duration::from_secs(60),
        "the finalizer",
        |g| g.finalizers().iter().any(|x| x == FINALIZER),
    )
    .await?;
    let reconciles = f.metrics.reconcile_count();
    // The ServiceAccount makes the operator reconcile its stale copy.
    create_service_account(&f, "app").await?;
    let g = f.wait_ready("logs").await?;
    assert_eq!(g.finalizers(), [FINALIZER], "the finalizer is there once");
    assert!(
        silenced.load(Ordering::SeqCst) > 0,
        "the operator's Gcs watch did not go through the proxy"
    );
    // Ready may have come from the first reconcile: wait for the one the
    // ServiceAccount caused to end, its outcome counted.
    wait_until_ended_after(&f, reconciles).await?;
    assert_eq!(
        f.metrics.reconcile_failure_count(),
        0,
        "no reconcile failed: {}",
        f.metrics.encode()?
    );
    Ok(())
}

/// The control: kube-runtime's finalizer helper, given the cached copy from
/// before its own write (what the operator's second reconcile saw), meets
/// the API server's 422, which the operator reported as a failure.
#[tokio::test]
async fn the_stock_finalizer_helper_fails_on_a_copy_older_than_its_own_write() -> TestResult {
    let f = Fixture::new().await?;
    let stale = Arc::new(
        f.create("logs", serde_json::json!({"bucketName": "logs"}))
            .await?,
    );
    assert!(stale.finalizers().is_empty());
    let api: Api<Gcs> = f.api();
    let noop = |_| async { Ok::<_, std::io::Error>(Action::await_change()) };
    kube::runtime::finalizer::finalizer(&api, FINALIZER, stale.clone(), noop).await?;
    let again = kube::runtime::finalizer::finalizer(&api, FINALIZER, stale, noop).await;
    match again {
        Err(kube::runtime::finalizer::Error::AddFinalizer(kube::Error::Api(status))) => {
            assert_eq!(status.code, 422, "{status:?}");
        }
        other => panic!("expected the 422 of a failed JSON patch test, got {other:?}"),
    }
    assert_eq!(f.get("logs").await?.finalizers(), [FINALIZER]);
    Ok(())
}
