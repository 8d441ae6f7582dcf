//! Streaming: bodies that only complete if the proxy forwards them piece by
//! piece, and bounded memory for 1 GiB each way.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use serde_json::json;
use tokio::sync::watch;

use bucketmap_sidecar::body::{BoxError, ProxyBody, empty};

use super::harness::*;

/// Upload: the client sends the second half only after the upstream has
/// received the first. A proxy that buffers the request body deadlocks.
async fn upload_interlocked(
    target: &str,
    content_type: &str,
    first: Bytes,
    second: Bytes,
) -> (Answer, Vec<u8>) {
    let received = Arc::new(AtomicUsize::new(0));
    let (got_first_tx, got_first_rx) = watch::channel(0usize);
    let got_first_tx = Arc::new(got_first_tx);
    let all = Arc::new(Mutex::new(Vec::new()));
    let (count, all_upstream) = (received.clone(), all.clone());
    let upstream = Upstream::start(handler(move |req: Request<Incoming>| {
        let (count, notify, all) = (count.clone(), got_first_tx.clone(), all_upstream.clone());
        async move {
            let mut body = req.into_body();
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    let total = count.fetch_add(data.len(), Ordering::SeqCst) + data.len();
                    all.lock().expect("lock").extend_from_slice(&data);
                    let _ = notify.send(total);
                }
            }
            json_response(
                StatusCode::OK,
                object("https://storage.googleapis.com", PHYSICAL, "x", "x"),
            )
        }
    }))
    .await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let (mut tx, body) = channel_body();
    let mut req = request(Method::POST, &sidecar.url(target), body);
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).expect("ct"),
    );
    let sent = tokio::spawn(send(req));
    let first_len = first.len();
    tx.send(Ok(Frame::data(first))).await.expect("send first");
    let mut watcher = got_first_rx;
    tokio::time::timeout(
        Duration::from_secs(20),
        watcher.wait_for(|n| *n >= first_len.saturating_sub(200)),
    )
    .await
    .expect("the upstream got the first half before the client sent the rest: the proxy streams")
    .expect("watch");
    tx.send(Ok(Frame::data(second))).await.expect("send second");
    drop(tx);
    let answer = sent.await.expect("join");
    let data = all.lock().expect("lock").clone();
    (answer, data)
}

#[tokio::test]
async fn media_uploads_stream() {
    let first = Bytes::from(vec![b'a'; 300_000]);
    let second = Bytes::from(vec![b'b'; 300_000]);
    let (answer, data) = upload_interlocked(
        "/upload/storage/v1/b/photos/o?uploadType=media&name=x",
        "application/octet-stream",
        first,
        second,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.json()["bucket"], "photos");
    assert_eq!(data.len(), 600_000);
}

#[tokio::test]
async fn multipart_uploads_rewrite_the_metadata_and_stream_the_data() {
    let mut first = b"--BOUNDARY\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{\"name\":\"photos\",\"bucket\":\"photos\"}\r\n--BOUNDARY\r\nContent-Type: application/octet-stream\r\n\r\n".to_vec();
    first.extend(vec![b'm'; 300_000]);
    let first_len = first.len();
    let mut second = vec![b'n'; 300_000];
    second.extend_from_slice(b"\r\n--BOUNDARY--\r\n");
    let (answer, data) = upload_interlocked(
        "/upload/storage/v1/b/photos/o?uploadType=multipart",
        "multipart/related; boundary=BOUNDARY",
        Bytes::from(first),
        Bytes::from(second),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let head = String::from_utf8_lossy(&data[..200]);
    assert!(head.contains("\"bucket\":\"photos-k3x9q2mw\""), "{head}");
    assert!(head.contains("\"name\":\"photos\""), "{head}");
    let delta = PHYSICAL.len() - "photos".len();
    assert_eq!(
        data.len(),
        first_len + 300_000 + "\r\n--BOUNDARY--\r\n".len() + delta
    );
    assert!(data.ends_with(b"\r\n--BOUNDARY--\r\n"));
}

/// Download: the upstream sends the second half only after the client has
/// received the first. A proxy that buffers the response deadlocks.
#[tokio::test]
async fn downloads_stream() {
    let (client_got_first_tx, client_got_first_rx) = watch::channel(false);
    let gate = Arc::new(Mutex::new(Some(client_got_first_rx)));
    let upstream = Upstream::start(handler(move |_req| {
        let gate = gate.clone();
        async move {
            let mut gate = gate.lock().expect("lock").take();
            let (mut tx, body) = channel_body();
            tokio::spawn(async move {
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from(vec![b'a'; 200_000]))))
                    .await;
                if let Some(gate) = gate.as_mut() {
                    let _ = gate.wait_for(|got| *got).await;
                }
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from(vec![b'b'; 200_000]))))
                    .await;
            });
            let mut response = Response::new(body);
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
    }))
    .await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let req = request(
        Method::GET,
        &sidecar.url("/download/storage/v1/b/photos/o/data.json?alt=media"),
        empty(),
    );
    let response = tokio::time::timeout(TIMEOUT, client().request(req))
        .await
        .expect("no timeout")
        .expect("response");
    let mut body = response.into_body();
    let mut total = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while let Some(frame) = tokio::time::timeout_at(deadline, body.frame())
        .await
        .expect("the proxy streams the download")
    {
        let frame = frame.expect("frame");
        if let Ok(data) = frame.into_data() {
            total += data.len();
            if total >= 200_000 {
                let _ = client_got_first_tx.send(true);
            }
        }
    }
    assert_eq!(
        total, 400_000,
        "media bodies (even JSON-typed objects) pass untouched"
    );
    assert_eq!(
        upstream.seen()[0].target,
        "/download/storage/v1/b/photos-k3x9q2mw/o/data.json?alt=media"
    );
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Samples the RSS until dropped; returns the peak growth over the start.
struct RssProbe {
    peak: Arc<AtomicU64>,
    start: u64,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl RssProbe {
    fn start() -> Self {
        let start = rss_bytes().unwrap_or(0);
        let peak = Arc::new(AtomicU64::new(start));
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let probe = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Some(rss) = rss_bytes() {
                    probe.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        });
        Self {
            peak,
            start,
            stop: Some(stop),
        }
    }

    fn growth(mut self) -> u64 {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rss) = rss_bytes() {
            self.peak.fetch_max(rss, Ordering::Relaxed);
        }
        self.peak.load(Ordering::Relaxed).saturating_sub(self.start)
    }
}

/// What the issue asks to stream with flat memory: 1 GiB each way.
const BIG: u64 = 1024 * 1024 * 1024;
static CHUNK: [u8; 64 * 1024] = [7u8; 64 * 1024];

fn big_body() -> ProxyBody {
    let chunks = (BIG / CHUNK.len() as u64) as usize;
    let stream = futures::stream::iter(
        (0..chunks).map(|_| Ok::<_, BoxError>(Frame::data(Bytes::from_static(&CHUNK)))),
    );
    BodyExt::boxed(StreamBody::new(stream))
}

/// An upstream serving `BIG` bytes on GET and reading uploads slowly,
/// answering their size.
fn big_object_upstream() -> Handler {
    handler(|req: Request<Incoming>| async move {
        if req.method() == Method::GET {
            let mut response = Response::new(big_body());
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(BIG));
            return response;
        }
        let mut body = req.into_body();
        let mut total = 0u64;
        let mut frames = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            total += frame.into_data().map(|d| d.len() as u64).unwrap_or(0);
            frames += 1;
            if frames.is_multiple_of(4) {
                // A slow reader: nothing may pile up in the proxy meanwhile.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        json_response(
            StatusCode::OK,
            json!({"kind": "storage#object", "bucket": PHYSICAL, "size": total.to_string()}),
        )
    })
}

/// Set in the process of its own the gibibyte test runs in.
const OWN_PROCESS: &str = "BUCKETMAP_LOOPBACK_GIBIBYTE_PROCESS";

/// The RSS read is the process's, and the other loopback tests run on
/// threads of this one (their buffers would count as the sidecar's): the
/// test re-runs itself in a process of its own, where `OWN_PROCESS` is set,
/// and measures that process, which holds only this test's sidecar, client
/// and upstream.
#[test]
fn a_gibibyte_each_way_keeps_memory_flat() {
    if std::env::var_os(OWN_PROCESS).is_some() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(a_gibibyte_each_way());
        return;
    }
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, m)| m);
    let name = format!("{module}::a_gibibyte_each_way_keeps_memory_flat");
    let exe = std::env::current_exe().expect("the test binary");
    let output = std::process::Command::new(exe)
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS, "1")
        .output()
        .expect("run the test in a process of its own");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "the gibibyte test failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the gibibyte test did not run:\n{stdout}"
    );
}

async fn a_gibibyte_each_way() {
    let upstream = Upstream::start(big_object_upstream()).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let probe = RssProbe::start();

    let mut req = request(
        Method::POST,
        &sidecar.url("/upload/storage/v1/b/photos/o?uploadType=media&name=big"),
        big_body(),
    );
    req.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(BIG));
    let answer = send(req).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.json()["size"], BIG.to_string());
    assert_eq!(answer.json()["bucket"], "photos");
    eprintln!(
        "after upload: {} MiB",
        rss_bytes().unwrap_or(0).saturating_sub(probe.start) / (1024 * 1024)
    );

    let req = request(Method::GET, &sidecar.url("/photos/big"), empty());
    let response = tokio::time::timeout(TIMEOUT, client().request(req))
        .await
        .expect("no timeout")
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut total = 0u64;
    let mut frames = 0u64;
    while let Some(frame) = body.frame().await {
        total += frame
            .expect("frame")
            .into_data()
            .map(|d| d.len() as u64)
            .unwrap_or(0);
        frames += 1;
        if frames.is_multiple_of(4) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    assert_eq!(total, BIG);
    let growth = probe.growth();
    eprintln!("peak RSS growth: {} MiB", growth / (1024 * 1024));
    assert!(
        growth < 64 * 1024 * 1024,
        "RSS grew by {} MiB moving 2 GiB",
        growth / (1024 * 1024)
    );
}
