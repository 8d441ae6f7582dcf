//! An expired watch (410 Gone, what the API server sends once etcd has
//! compacted the watch's resourceVersion away) is recovered by re-listing.
//!
//! The operator talks to the real API server through a plain-HTTP proxy in
//! the test. The proxy forwards every request with the fixture's admin
//! client, except the first watch of `Gcs` resources from a resourceVersion:
//! that one gets the API server's post-compaction answer, a `200` whose only
//! event is `ERROR` with a `410 Expired` Status. It logs the `Gcs` lists and
//! watches it sees, so the test can tell a re-list from a re-watch.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bucketmap::controller;
use bucketmap::gcs::{GcsClient, GcsConfig};
use common::{Fixture, physical};
use tokio::task::JoinHandle;

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

/// The fault-injecting proxy's state.
struct Proxy {
    upstream: kube::Client,
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
    let query = req.uri().query().unwrap_or_default();
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    Some(if watch { Seen::Watch } else { Seen::List })
}

/// True for a watch resuming from a resourceVersion (the one a compaction
/// can expire).
fn resumes(req: &Request) -> bool {
    let query = req.uri().query().unwrap_or_default();
    query
        .split('&')
        .any(|p| p.starts_with("resourceVersion=") && p != "resourceVersion=")
}

/// Answers the first resuming `Gcs` watch with [`EXPIRED_EVENT`] and
/// forwards everything else.
async fn handle(State(proxy): State<Arc<Proxy>>, req: Request) -> Response {
    let seen = classify(&req);
    if seen == Some(Seen::Watch)
        && resumes(&req)
        && !proxy.expired_once.swap(true, Ordering::SeqCst)
    {
        proxy.record(Seen::Expired);
        return ([(header::CONTENT_TYPE, "application/json")], EXPIRED_EVENT).into_response();
    }
    if let Some(seen) = seen {
        proxy.record(seen);
    }
    match forward(&proxy.upstream, req).await {
        Ok(response) => response,
        Err(e) => (StatusCode::BAD_GATEWAY, format!("{e:#}")).into_response(),
    }
}

/// Sends `req` to the API server with the admin client; the response body
/// streams back (watches stay open).
async fn forward(upstream: &kube::Client, req: Request) -> anyhow::Result<Response> {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 16 << 20)
        .await
        .context("cannot read the request body")?;
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut out = axum::http::Request::builder()
        .method(parts.method)
        .uri(&path)
        .body(kube::client::Body::from(body.to_vec()))
        .context("cannot build the upstream request")?;
    for (name, value) in &parts.headers {
        if name != header::HOST && name != header::CONNECTION {
            out.headers_mut().append(name, value.clone());
        }
    }
    let response = upstream
        .send(out)
        .await
        .with_context(|| format!("cannot forward {path}"))?;
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts.headers.remove(header::CONNECTION);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Starts the proxy on a free loopback port.
async fn start_proxy(upstream: kube::Client) -> anyhow::Result<(SocketAddr, Arc<Proxy>)> {
    let proxy = Arc::new(Proxy {
        upstream,
        expired_once: AtomicBool::new(false),
        seen: Mutex::default(),
    });
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(proxy.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, proxy))
}

/// The operator in-process, its API calls going through the proxy at `addr`.
async fn start_operator_via(f: &Fixture, addr: SocketAddr) -> anyhow::Result<JoinHandle<()>> {
    let config = kube::Config::new(format!("http://{addr}").parse()?);
    let client = kube::Client::try_from(config).context("cannot build the proxied client")?;
    let gcs = GcsClient::connect(
        &GcsConfig {
            endpoint: Some(f.mock.endpoint()),
            anonymous: true,
        },
        f.metrics.clone(),
    )
    .await?;
    Ok(tokio::spawn(controller::run(
        client,
        gcs,
        f.metrics.clone(),
        f.config.clone(),
        || {},
        std::future::pending(),
    )))
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
    let (addr, proxy) = start_proxy(f.env.client().await?).await?;
    let operator = start_operator_via(&f, addr).await?;
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
