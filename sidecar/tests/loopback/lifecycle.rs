//! Life of the proxy: readiness, the upstream timeout, map reloads with
//! requests in flight, the watched mapping directory, graceful drain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::SinkExt;
use http::{Method, Request, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;
use tokio::sync::watch;

use bucketmap_sidecar::body::full;
use bucketmap_sidecar::mapping::{Mapping, MappingStore};
use bucketmap_sidecar::metrics::Metrics;

use super::harness::*;

#[tokio::test]
async fn an_upstream_slower_than_the_upstream_timeout_gets_a_gcs_style_504() {
    // The upstream answers after 30 s; the sidecar waits 200 ms for it.
    let upstream = Upstream::start(handler(|_req: Request<Incoming>| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        json_response(StatusCode::OK, json!({}))
    }))
    .await;
    let options = Options {
        upstream_timeout: Some(Duration::from_millis(200)),
        ..Options::default()
    };
    let sidecar = Sidecar::start(&upstream, options).await;
    let answer = sidecar.get("/storage/v1/b/photos/o/x").await;
    assert_eq!(
        answer.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{}",
        answer.text()
    );
    let doc = answer.json();
    assert_eq!(doc["error"]["code"], 504);
    assert_eq!(doc["error"]["errors"][0]["reason"], "backendError");
    assert_eq!(upstream.seen().len(), 1, "the request was forwarded");
    let labels = bucketmap_sidecar::metrics::RequestLabels {
        operation: "objects.get",
        status: 504,
    };
    assert_eq!(sidecar.metrics.requests.get_or_create(&labels).get(), 1);
    assert_eq!(sidecar.metrics.in_flight.get(), 0);
}

#[tokio::test]
async fn not_ready_until_a_mapping_is_loaded() {
    let upstream = Upstream::start(echo_object_handler()).await;
    let sidecar = Sidecar::start(
        &upstream,
        Options {
            mapping: None,
            ..Options::default()
        },
    )
    .await;
    let ready = sidecar.get("/_bucketmap/readyz").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    let answer = sidecar.get("/storage/v1/b/photos/o").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    // An empty mapping (the namespace has no Ready Gcs yet) is read: ready,
    // and a bucket name gets a GCS-style 404 that names it.
    sidecar.store.set(Mapping::default());
    let ready = sidecar.get("/_bucketmap/readyz").await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    let answer = sidecar.get("/storage/v1/b/photos/o").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert!(
        answer.text().contains("'photos'") && answer.text().contains("Ready Gcs"),
        "{}",
        answer.text()
    );
    sidecar.store.set(mapping(PHYSICAL));
    let ready = sidecar.get("/_bucketmap/readyz").await;
    assert_eq!(ready.status, StatusCode::OK);
    let health = sidecar.get("/_bucketmap/healthz").await;
    assert_eq!(health.status, StatusCode::OK);
    let metrics = sidecar.get("/_bucketmap/metrics").await;
    assert!(
        metrics.text().contains("bucketmap_sidecar_requests_total"),
        "{}",
        metrics.text()
    );
    assert!(upstream.seen().is_empty());
}

/// An upload upstream: reads the whole body, then answers an object in the
/// bucket the upload named.
fn object_in_the_named_bucket() -> Handler {
    handler(|req: Request<Incoming>| async move {
        let bucket = req
            .uri()
            .path()
            .split('/')
            .nth(5)
            .unwrap_or_default()
            .to_owned();
        let mut body = req.into_body();
        while let Some(Ok(_)) = body.frame().await {}
        json_response(
            StatusCode::OK,
            object("https://storage.googleapis.com", &bucket, "x", "x"),
        )
    })
}

#[tokio::test]
async fn a_map_reload_does_not_disturb_requests_in_flight() {
    let upstream = Upstream::start(object_in_the_named_bucket()).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let (mut tx, body) = channel_body();
    let req = request(
        Method::POST,
        &sidecar.url("/upload/storage/v1/b/photos/o?uploadType=media&name=x"),
        body,
    );
    let in_flight = tokio::spawn(send(req));
    tx.send(Ok(Frame::data(Bytes::from_static(b"first half"))))
        .await
        .expect("send");
    upstream.wait_for_a_request().await;

    // The operator moved the bucket: a new physical name.
    sidecar.store.set(mapping("photos-newnewnw"));
    let after = send(request(
        Method::POST,
        &sidecar.url("/upload/storage/v1/b/photos/o?uploadType=media&name=y"),
        full("y"),
    ))
    .await;
    assert_eq!(after.status, StatusCode::OK);
    assert_eq!(after.json()["bucket"], "photos");

    tx.send(Ok(Frame::data(Bytes::from_static(b"second half"))))
        .await
        .expect("send");
    drop(tx);
    let answer = in_flight.await.expect("join");
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(
        answer.json()["bucket"],
        "photos",
        "answered with the mapping it started with"
    );
    let targets: Vec<String> = upstream.seen().into_iter().map(|s| s.target).collect();
    assert!(
        targets[0].starts_with("/upload/storage/v1/b/photos-k3x9q2mw/o"),
        "{targets:?}"
    );
    assert!(
        targets[1].starts_with("/upload/storage/v1/b/photos-newnewnw/o"),
        "{targets:?}"
    );
}

#[tokio::test]
async fn the_mapping_directory_is_watched() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("photos"), "photos-k3x9q2mw\n").expect("write");
    let store = Arc::new(MappingStore::new(Some(dir.path().to_owned()), Vec::new()));
    let metrics = Arc::new(Metrics::new());
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(bucketmap_sidecar::watch::run(
        store.clone(),
        metrics.clone(),
        Duration::from_millis(200),
        None,
        stopped,
    ));
    let physical = |store: &MappingStore| {
        store
            .current()
            .and_then(|m| m.physical("photos").map(str::to_owned))
    };
    let eventually = |want: &'static str| {
        let store = store.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(10), async {
                while physical(&store).as_deref() != Some(want) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .is_ok()
        }
    };
    assert!(eventually("photos-k3x9q2mw").await);
    std::fs::write(dir.path().join("photos"), "photos-22222222").expect("write");
    assert!(eventually("photos-22222222").await);
    // A bad update (duplicate physical) keeps the last good map.
    std::fs::write(dir.path().join("other"), "photos-22222222").expect("write");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(physical(&store).as_deref(), Some("photos-22222222"));
    assert!(
        store
            .current()
            .is_some_and(|m| m.physical("other").is_none())
    );
    assert!(metrics.encode().contains("result=\"failure\""));
    let _ = stop.send(true);
    let _ = task.await;
}

#[tokio::test]
async fn shutdown_drains_requests_in_flight() {
    let upstream = Upstream::start(handler(|req: Request<Incoming>| async move {
        let mut body = req.into_body();
        while let Some(Ok(_)) = body.frame().await {}
        json_response(
            StatusCode::OK,
            object("https://storage.googleapis.com", PHYSICAL, "x", "x"),
        )
    }))
    .await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let (mut tx, body) = channel_body();
    let in_flight = tokio::spawn(send(request(
        Method::POST,
        &sidecar.url("/upload/storage/v1/b/photos/o?uploadType=media&name=x"),
        body,
    )));
    tx.send(Ok(Frame::data(Bytes::from_static(b"part one"))))
        .await
        .expect("send");
    upstream.wait_for_a_request().await;
    let _ = sidecar.stop.send(true);
    // No new connections once draining: wait (a deadline at most) until a
    // connection is refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match tokio::net::TcpStream::connect(sidecar.addr).await {
            Err(_) => break true,
            Ok(accepted) if Instant::now() < deadline => drop(accepted),
            Ok(_) => break false,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(refused, "the listener is closed");
    tx.send(Ok(Frame::data(Bytes::from_static(b"part two"))))
        .await
        .expect("send");
    drop(tx);
    let answer = in_flight.await.expect("join");
    assert_eq!(answer.status, StatusCode::OK);
    let served = tokio::time::timeout(Duration::from_secs(20), sidecar.task)
        .await
        .expect("drained in time");
    assert!(matches!(served, Ok(Ok(()))));
    let _ = &sidecar.proxy;
}
