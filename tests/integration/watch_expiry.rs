//! An expired watch (410 Gone, what the API server sends once etcd has
//! compacted the watch's resourceVersion away) is recovered by re-listing.
//!
//! The operator talks to the real API server through a plain-HTTP proxy in
//! the test. The proxy forwards every request with the fixture's admin
//! client, except the first watch of `Gcs` resources from a resourceVersion:
//! that one gets the API server's post-compaction answer, a `200` whose only
//! event is `ERROR` with a `410 Expired` Status. It logs the `Gcs` lists and
//! watches it sees, so the test can tell a re-list from a re-watch.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use common::api_proxy::{self, is_watch_of};
use common::{Fixture, physical};

type TestResult = anyhow::Result<()>;

/// The event the API server streams when a watch's resourceVersion was
/// compacted away.
const EXPIRED_EVENT: &str = concat!(
    r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"#,
    r#""status":"Failure","message":"too old resource version: 1 (2)","#,
    r#""reason":"Expired","code":410}}"#,
    "\n"
);

/// What the proxy saw of the `Gcs` collection, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    List,
    Watch,
    /// A watch answered with [`EXPIRED_EVENT`] instead of being forwarded.
    Expired,
}

/// The proxy's view of the `Gcs` collection.
#[derive(Default)]
struct Proxy {
    expired_once: AtomicBool,
    seen: Mutex<Vec<Seen>>,
}

impl Proxy {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn record(&self, what: Seen) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(what);
        }
    }

    /// Answers the first resuming `Gcs` watch with [`EXPIRED_EVENT`] and
    /// lets everything else through, recording the `Gcs` lists and watches.
    fn intercept(&self, req: &Request) -> Option<Response> {
        let seen = classify(req)?;
        if seen == Seen::Watch && resumes(req) && !self.expired_once.swap(true, Ordering::SeqCst) {
            self.record(Seen::Expired);
            let answer = ([(header::CONTENT_TYPE, "application/json")], EXPIRED_EVENT);
            return Some(answer.into_response());
        }
        self.record(seen);
        None
    }
}

/// Classifies a request on the `Gcs` collection (`None`: anything else).
fn classify(req: &Request) -> Option<Seen> {
    let path = req.uri().path();
    if req.method() != axum::http::Method::GET
        || !path.starts_with("/apis/storage.bucketmap.dev/")
        || !path.ends_with("/gcs")
    {
        return None;
    }
    Some(if is_watch_of(req, "/gcs") {
        Seen::Watch
    } else {
        Seen::List
    })
}

/// True for a watch resuming from a resourceVersion (the one a compaction
/// can expire).
fn resumes(req: &Request) -> bool {
    let query = req.uri().query().unwrap_or_default();
    query
        .split('&')
        .any(|p| p.starts_with("resourceVersion=") && p != "resourceVersion=")
}

/// Waits until the proxy has seen a `Gcs` watch after the expired one
/// (or fails after `timeout`).
async fn wait_rewatch(proxy: &Proxy, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = proxy.seen();
        let expired = seen.iter().position(|s| *s == Seen::Expired);
        if expired.is_some_and(|i| seen[i..].contains(&Seen::Watch)) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no Gcs watch after an expired one within {timeout:?}; seen: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The watch expires once; the operator re-lists, watches again, and a
/// `Gcs` created afterwards reaches it through the new watch (no further
/// list) and is reconciled to Ready, the operator still running.
#[tokio::test]
async fn an_expired_gcs_watch_is_recovered_by_relisting() -> TestResult {
    let f = Fixture::new().await?;
    let proxy = Arc::new(Proxy::default());
    let seen_by = proxy.clone();
    let addr = api_proxy::start(&f, Arc::new(move |req| seen_by.intercept(req))).await?;
    let operator = api_proxy::start_operator_via(&f, addr).await?;
    wait_rewatch(&proxy, Duration::from_secs(30)).await?;

    f.create(
        "after-expiry",
        serde_json::json!({"bucketName": "after-expiry"}),
    )
    .await?;
    let g = f.wait_ready("after-expiry").await?;
    let bucket = physical(&g);
    assert!(
        f.gcs.bucket(&bucket).is_some(),
        "bucket {bucket} is missing from the mock GCS"
    );
    assert_eq!(
        proxy.seen(),
        [Seen::List, Seen::Expired, Seen::List, Seen::Watch],
        "list, watch expired, re-list, watch again"
    );
    assert!(
        !operator.is_finished(),
        "the operator stopped after the expired watch"
    );
    operator.abort();
    Ok(())
}
