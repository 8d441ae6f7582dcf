//! A bucket is created in the project its namespace's annotation names when
//! the resource is created, even when the operator's namespace cache has
//! not caught up with the annotation (a namespace created or annotated just
//! before its resources, as `kubectl apply -f` of one file does): a bucket
//! created in the wrong project cannot be moved.
//!
//! The operator talks to the API server through the test's proxy, which
//! answers every namespace watch with a stream that stays open and never
//! sends an event: the operator's cache keeps the namespace as first listed,
//! without the annotation.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::Request;
use bucketmap::controller::PROJECT_ANNOTATION;
use common::api_proxy::{self, is_watch_of, silent_watch};
use common::{Fixture, PROJECT, physical};

type TestResult = anyhow::Result<()>;

fn project_of(g: &bucketmap::crd::Gcs) -> Option<String> {
    g.status.as_ref().and_then(|s| s.project_id.clone())
}

#[tokio::test]
async fn a_new_bucket_goes_to_the_annotated_project_though_the_cache_missed_the_annotation()
-> TestResult {
    let f = Fixture::new().await?;
    let silenced = Arc::new(AtomicUsize::new(0));
    let (listed, got) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (count, lists, gets) = (silenced.clone(), listed.clone(), got.clone());
    let intercept = Arc::new(move |req: &Request| {
        if is_watch_of(req, "/api/v1/namespaces") {
            count.fetch_add(1, Ordering::SeqCst);
            return Some(silent_watch());
        }
        let query = req.uri().query().unwrap_or_default();
        match req.uri().path() {
            "/api/v1/namespaces" if query.contains("labelSelector=") => {
                lists.fetch_add(1, Ordering::SeqCst)
            }
            path if path.starts_with("/api/v1/namespaces/")
                && !path["/api/v1/namespaces/".len()..].contains('/') =>
            {
                gets.fetch_add(1, Ordering::SeqCst)
            }
            _ => 0,
        };
        None
    });
    let addr = api_proxy::start(&f, intercept).await?;
    let operator = api_proxy::start_operator_via(&f, addr).await?;

    // Ready proves the operator has listed the namespace (its caches synced).
    f.create("before", serde_json::json!({"bucketName": "before"}))
        .await?;
    let before = f.wait_ready("before").await?;
    assert_eq!(project_of(&before).as_deref(), Some(PROJECT));
    assert!(
        silenced.load(Ordering::SeqCst) > 0,
        "the operator's namespace watch did not go through the proxy"
    );

    f.annotate_namespace(PROJECT_ANNOTATION, "team-project")
        .await?;
    f.create("after", serde_json::json!({"bucketName": "after"}))
        .await?;
    let after = f.wait_ready("after").await?;
    assert_eq!(project_of(&after).as_deref(), Some("team-project"));
    assert_eq!(
        f.gcs.bucket_project(&physical(&after)).as_deref(),
        Some("team-project"),
        "the bucket was created in another project than the namespace's"
    );
    // A later reconcile finds the bucket recorded and the cache still
    // without the annotation: it reads the namespace again rather than
    // report the project changed.
    f.merge_spec("after", serde_json::json!({"labels": {"touched": "yes"}}))
        .await?;
    let generation = after.metadata.generation.map(|g| g + 1);
    f.wait_for(
        "after",
        Duration::from_secs(60),
        "Ready=True at the new generation",
        |g| g.is_ready() && g.status.as_ref().and_then(|s| s.observed_generation) == generation,
    )
    .await?;
    // The reads selected the namespace by its name label (one consistent
    // LIST per round), with no GET needed as a fallback.
    assert!(listed.load(Ordering::SeqCst) >= 2, "{listed:?}");
    assert_eq!(got.load(Ordering::SeqCst), 0);
    operator.abort();
    Ok(())
}
