//! Faults (issue 13): a reset in the middle of a body, either way; rate
//! limiting (429/503 with `Retry-After`) passed through; the drain with 64
//! transfers in flight; descriptors and memory flat over a long run in which
//! one client in ten aborts.
//!
//! A cut body must never look complete: the proxy ends its side of the
//! exchange without the missing bytes or the terminating chunk, so the next
//! hop (the app's client, or GCS) sees an error, never a shorter object.
//!
//! Map reloads during transfers are proved by `tests/integration/reload.rs`
//! (`map_reload_with_requests_in_flight`: uploads, reads and a slow upload
//! and download straddling two updates, none failing) and
//! `lifecycle.rs` (`a_map_reload_does_not_disturb_requests_in_flight`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::SinkExt;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use bucketmap_sidecar::body::{ProxyBody, empty, full};

use super::harness::*;

/// The length an object claims in the reset tests.
const TOTAL: usize = 1_000_000;
/// What is sent of it before the reset.
const SENT: usize = 300_000;

// ---------------------------------------------------------------- raw HTTP/1

/// Reads a request or response head from `tcp`; the bytes after it.
async fn read_head(tcp: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(buf.split_off(end + 4));
        }
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// How a raw peer leaves a connection.
#[derive(Clone, Copy, Debug)]
enum End {
    /// A TCP reset (`SO_LINGER` 0), as a crashed peer or a middlebox.
    Reset,
    /// A clean FIN, in the middle of the body all the same.
    Close,
}

async fn leave(mut tcp: TcpStream, end: End) {
    match end {
        End::Reset => {
            let _ = tcp.set_zero_linger();
        }
        End::Close => {
            let _ = tcp.shutdown().await;
        }
    }
    drop(tcp);
}

/// One chunk in the chunked transfer coding.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

// ------------------------------------------------- a. reset mid-download

/// An upstream answering every request with `head` and `partial`, then
/// leaving (`end`) without the rest.
async fn cutting_upstream(head: String, partial: Vec<u8>, end: End) -> Upstream {
    let answer = Arc::new((head, partial));
    Upstream::start_raw(move |mut tcp| {
        let answer = answer.clone();
        async move {
            if read_head(&mut tcp).await.is_err() {
                return;
            }
            let _ = tcp.write_all(answer.0.as_bytes()).await;
            let _ = tcp.write_all(&answer.1).await;
            let _ = tcp.flush().await;
            // The proxy reads (and forwards) what was sent before the end.
            tokio::time::sleep(Duration::from_millis(300)).await;
            leave(tcp, end).await;
        }
    })
    .await
}

/// What the app's hyper client makes of a GET through the sidecar.
#[derive(Debug)]
struct Downloaded {
    status: StatusCode,
    bytes: usize,
    /// How the body ended: `Ok` for a clean end, the client's error otherwise.
    end: Result<(), String>,
}

async fn download(sidecar: &Sidecar, target: &str) -> Downloaded {
    let req = request(Method::GET, &sidecar.url(target), empty());
    let response = tokio::time::timeout(TIMEOUT, client().request(req))
        .await
        .expect("no timeout")
        .expect("a response head");
    let status = response.status();
    let mut body = response.into_body();
    let mut bytes = 0;
    let end = loop {
        match tokio::time::timeout(TIMEOUT, body.frame()).await {
            Err(_) => panic!("the body neither ended nor failed within {TIMEOUT:?}"),
            Ok(None) => break Ok(()),
            Ok(Some(Err(e))) => break Err(format!("{e:?}")),
            Ok(Some(Ok(frame))) => bytes += frame.into_data().map(|d| d.len()).unwrap_or(0),
        }
    };
    Downloaded { status, bytes, end }
}

#[tokio::test]
async fn an_upstream_cut_in_the_middle_of_a_download_is_an_error_for_the_client() {
    let media = "/download/storage/v1/b/photos/o/x?alt=media";
    let with_length = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {TOTAL}\r\n\r\n"
    );
    let chunked = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned();
    let data = vec![b'd'; SENT];
    let cases = [
        (
            "Content-Length, reset",
            with_length.clone(),
            data.clone(),
            End::Reset,
        ),
        ("Content-Length, FIN", with_length, data.clone(), End::Close),
        ("chunked, reset", chunked.clone(), chunk(&data), End::Reset),
        ("chunked, FIN", chunked, chunk(&data), End::Close),
    ];
    for (name, head, partial, end) in cases {
        let upstream = cutting_upstream(head, partial, end).await;
        let sidecar = Sidecar::start(&upstream, Options::default()).await;
        let seen = download(&sidecar, media).await;
        eprintln!("{name}: {seen:?}");
        assert_eq!(seen.status, StatusCode::OK, "{name}: the head went through");
        assert!(
            seen.end.is_err(),
            "{name}: {} of {TOTAL} bytes reported as a complete object",
            seen.bytes
        );
        assert!(seen.bytes <= SENT, "{name}: {seen:?}");
        assert_eq!(sidecar.metrics.in_flight.get(), 0, "{name}");
    }
}

#[tokio::test]
async fn an_upstream_cut_in_the_middle_of_metadata_is_a_complete_502() {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n";
    let partial = br#"{"kind":"storage#object","bucket":"photos-k3x9q2mw","name":"#.to_vec();
    for end in [End::Reset, End::Close] {
        let upstream = cutting_upstream(head.to_owned(), partial.clone(), end).await;
        let sidecar = Sidecar::start(&upstream, Options::default()).await;
        let seen = download(&sidecar, "/storage/v1/b/photos/o/x").await;
        assert_eq!(seen.status, StatusCode::BAD_GATEWAY, "{end:?}: {seen:?}");
        assert_eq!(seen.end, Ok(()), "{end:?}: the 502 itself is whole");
    }
}

// --------------------------------------------------- b. reset mid-upload

/// How an upload body ended at the upstream.
#[derive(Debug)]
struct Received {
    bytes: usize,
    /// The body ended cleanly: the upstream would have committed it.
    clean: bool,
}

/// An upstream reading upload bodies, publishing the bytes received so far
/// and, at the end, how each body ended.
fn receiving_upstream() -> (Handler, watch::Receiver<usize>, Arc<Mutex<Vec<Received>>>) {
    let (progress_tx, progress) = watch::channel(0usize);
    let progress_tx = Arc::new(progress_tx);
    let ended = Arc::new(Mutex::new(Vec::new()));
    let record = ended.clone();
    let handler = handler(move |req: Request<Incoming>| {
        let (progress_tx, record) = (progress_tx.clone(), record.clone());
        async move {
            let mut body = req.into_body();
            let mut bytes = 0;
            let clean = loop {
                match body.frame().await {
                    None => break true,
                    Some(Err(_)) => break false,
                    Some(Ok(frame)) => {
                        bytes += frame.into_data().map(|d| d.len()).unwrap_or(0);
                        let _ = progress_tx.send(bytes);
                    }
                }
            };
            record.lock().expect("lock").push(Received { bytes, clean });
            json_response(StatusCode::OK, json!({"kind": "storage#object"}))
        }
    });
    (handler, progress, ended)
}

struct Upload {
    name: &'static str,
    target: &'static str,
    /// Header lines after the request line, framing included.
    headers: String,
    /// What the client sends before it dies.
    sent: Vec<u8>,
}

fn uploads() -> Vec<Upload> {
    let media = "/upload/storage/v1/b/photos/o?uploadType=media&name=x";
    let multipart = "/upload/storage/v1/b/photos/o?uploadType=multipart";
    let octets = "Content-Type: application/octet-stream\r\n";
    let related = "Content-Type: multipart/related; boundary=B\r\n";
    let mut first = b"--B\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{\"name\":\"x\",\"bucket\":\"photos\"}\r\n--B\r\nContent-Type: application/octet-stream\r\n\r\n".to_vec();
    first.extend(vec![b'm'; SENT]);
    let data = vec![b'u'; SENT];
    let length = format!("Content-Length: {TOTAL}\r\n");
    let chunked = "Transfer-Encoding: chunked\r\n";
    vec![
        Upload {
            name: "media, Content-Length",
            target: media,
            headers: format!("{octets}{length}"),
            sent: data.clone(),
        },
        Upload {
            name: "media, chunked",
            target: media,
            headers: format!("{octets}{chunked}"),
            sent: chunk(&data),
        },
        Upload {
            name: "multipart, Content-Length",
            target: multipart,
            headers: format!("{related}{length}"),
            sent: first.clone(),
        },
        Upload {
            name: "multipart, chunked",
            target: multipart,
            headers: format!("{related}{chunked}"),
            sent: chunk(&first),
        },
    ]
}

#[tokio::test]
async fn a_client_dying_in_the_middle_of_an_upload_never_commits_a_shorter_object() {
    for end in [End::Reset, End::Close] {
        for upload in uploads() {
            let (handler, mut progress, ended) = receiving_upstream();
            let upstream = Upstream::start(handler).await;
            let sidecar = Sidecar::start(&upstream, Options::default()).await;
            let name = format!("{}, {end:?}", upload.name);
            let mut tcp = TcpStream::connect(sidecar.addr).await.expect("connect");
            let head = format!(
                "POST {} HTTP/1.1\r\nHost: {}\r\n{}\r\n",
                upload.target, sidecar.addr, upload.headers
            );
            tcp.write_all(head.as_bytes()).await.expect("head");
            tcp.write_all(&upload.sent).await.expect("body");
            // The upstream has most of it: the proxy forwards as it reads.
            tokio::time::timeout(TIMEOUT, progress.wait_for(|n| *n >= SENT / 2))
                .await
                .expect("the upload reached the upstream")
                .expect("progress");
            leave(tcp, end).await;
            let received = tokio::time::timeout(TIMEOUT, async {
                loop {
                    if let Some(r) = ended.lock().expect("lock").pop() {
                        return r;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .expect("the upstream's body ended");
            eprintln!("{name}: {received:?}");
            assert!(
                !received.clean,
                "{name}: the upstream got a clean end after {} bytes",
                received.bytes
            );
            assert!(received.bytes < TOTAL, "{name}: {received:?}");
        }
    }
}

#[tokio::test]
async fn an_upstream_cut_in_the_middle_of_an_upload_is_not_a_success() {
    for end in [End::Reset, End::Close] {
        let upstream = Upstream::start_raw(move |mut tcp| async move {
            if let Ok(after_head) = read_head(&mut tcp).await {
                let mut got = after_head.len();
                let mut buf = vec![0u8; 64 * 1024];
                while got < SENT {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                leave(tcp, end).await;
            }
        })
        .await;
        let sidecar = Sidecar::start(&upstream, Options::default()).await;
        let chunks = (0..TOTAL / 10_000).map(|_| {
            Ok::<_, bucketmap_sidecar::body::BoxError>(Frame::data(Bytes::from(vec![b'u'; 10_000])))
        });
        let body: ProxyBody = BodyExt::boxed(http_body_util::StreamBody::new(
            futures::stream::iter(chunks),
        ));
        let mut req = request(
            Method::POST,
            &sidecar.url("/upload/storage/v1/b/photos/o?uploadType=media&name=x"),
            body,
        );
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(TOTAL));
        let outcome = tokio::time::timeout(TIMEOUT, client().request(req))
            .await
            .expect("no timeout");
        match outcome {
            Err(e) => eprintln!("{end:?}: the client saw {e}"),
            Ok(response) => {
                let status = response.status();
                eprintln!("{end:?}: the client saw {status}");
                assert_eq!(status, StatusCode::BAD_GATEWAY, "{end:?}");
            }
        }
    }
}

// ---------------------------------------------- c. 429/503, Retry-After

/// An upstream answering every request `status` with `Retry-After` and a body.
async fn limiting_upstream(
    status: StatusCode,
    retry_after: &'static str,
    content_type: &'static str,
    body: &'static str,
) -> Upstream {
    Upstream::start(handler(move |req: Request<Incoming>| async move {
        drop(req);
        let mut response = Response::new(full(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static(retry_after));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    }))
    .await
}

/// Rate limiting as GCS answers it: request, status, `Retry-After`,
/// `Content-Type`, body.
type Limited = (
    Method,
    &'static str,
    u16,
    &'static str,
    &'static str,
    &'static str,
);

fn rate_limited_cases() -> [Limited; 5] {
    let json = "application/json; charset=UTF-8";
    let rate = r#"{"error":{"code":429,"message":"The object exceeded the rate limit for object mutation operations (create, update, and delete). Please reduce your request rate.","errors":[{"message":"Please reduce your request rate.","domain":"usageLimits","reason":"rateLimitExceeded"}]}}"#;
    let backend = r#"{"error":{"code":503,"message":"We encountered an internal error. Please try again.","errors":[{"message":"We encountered an internal error. Please try again.","domain":"global","reason":"backendError"}]}}"#;
    let slow_down = "<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
    let date = "Wed, 21 Oct 2026 07:28:00 GMT";
    let media = "/storage/v1/b/photos/o/x?alt=media";
    let upload = "/upload/storage/v1/b/photos/o?uploadType=media&name=x";
    let xml = "application/xml; charset=UTF-8";
    let html = "text/html; charset=UTF-8";
    [
        (
            Method::GET,
            "/storage/v1/b/photos/o/x",
            429,
            "7",
            json,
            rate,
        ),
        (Method::GET, media, 503, date, json, backend),
        (Method::POST, upload, 503, "30", json, backend),
        (Method::GET, "/photos/x", 429, "5", xml, slow_down),
        (
            Method::GET,
            "/photos/x",
            503,
            date,
            html,
            "<html>unavailable</html>",
        ),
    ]
}

#[tokio::test]
async fn rate_limiting_passes_through_unchanged() {
    for (method, target, status, retry_after, content_type, body) in rate_limited_cases() {
        let status = StatusCode::from_u16(status).expect("status");
        let upstream = limiting_upstream(status, retry_after, content_type, body).await;
        let sidecar = Sidecar::start(&upstream, Options::default()).await;
        let case = format!("{method} {target} → {status}");
        let sent = match method {
            Method::POST => full("data"),
            _ => empty(),
        };
        let answer = send(request(method, &sidecar.url(target), sent)).await;
        assert_eq!(
            upstream.seen().len(),
            1,
            "{case}: forwarded once, not retried"
        );
        assert_eq!(answer.status, status, "{case}");
        assert_eq!(
            answer.headers.get(header::RETRY_AFTER),
            Some(&HeaderValue::from_static(retry_after)),
            "{case}"
        );
        assert_eq!(
            answer.headers.get(header::CONTENT_TYPE),
            Some(&HeaderValue::from_static(content_type)),
            "{case}"
        );
        assert_eq!(answer.text(), body, "{case}");
    }
}

// ------------------------------------------- d. the drain under load

const HALF: usize = 256 * 1024;
const TRANSFERS: usize = 64;

/// Uploads are read whole and answered their size; downloads send half,
/// wait for `gate`, then send the rest.
fn gated_upstream(gate: watch::Receiver<bool>) -> Handler {
    handler(move |req: Request<Incoming>| {
        let mut gate = gate.clone();
        async move {
            if req.method() == Method::GET {
                let (mut tx, body) = channel_body();
                tokio::spawn(async move {
                    let _ = tx
                        .send(Ok(Frame::data(Bytes::from(vec![b'a'; HALF]))))
                        .await;
                    let _ = gate.wait_for(|open| *open).await;
                    let _ = tx
                        .send(Ok(Frame::data(Bytes::from(vec![b'b'; HALF]))))
                        .await;
                });
                let mut response = Response::new(body);
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(2 * HALF));
                return response;
            }
            let mut body = req.into_body();
            let mut size = 0;
            while let Some(Ok(frame)) = body.frame().await {
                size += frame.into_data().map(|d| d.len()).unwrap_or(0);
            }
            json_response(
                StatusCode::OK,
                json!({"kind": "storage#object", "size": size}),
            )
        }
    })
}

type BodySender =
    futures::channel::mpsc::Sender<Result<Frame<Bytes>, bucketmap_sidecar::body::BoxError>>;

/// A whole answer's body, or what went wrong, as a string.
async fn whole(response: Response<Incoming>) -> Result<(StatusCode, Bytes), String> {
    let status = response.status();
    let body = response.into_body().collect().await;
    let bytes = body
        .map_err(|e| format!("{status}, body: {e:?}"))?
        .to_bytes();
    Ok((status, bytes))
}

/// An upload through the sidecar; the size the upstream received.
async fn upload_through(url: String, body: ProxyBody) -> Result<usize, String> {
    let req = request(Method::POST, &url, body);
    let response = client().request(req).await.map_err(|e| format!("{e:?}"))?;
    let (status, bytes) = whole(response).await?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    match (status, doc["size"].as_u64()) {
        (StatusCode::OK, Some(size)) => Ok(size as usize),
        _ => Err(format!("{status}: {}", String::from_utf8_lossy(&bytes))),
    }
}

/// A download through the sidecar; its size.
async fn download_through(url: String) -> Result<usize, String> {
    let response = client()
        .request(request(Method::GET, &url, empty()))
        .await
        .map_err(|e| format!("{e:?}"))?;
    match whole(response).await? {
        (StatusCode::OK, bytes) => Ok(bytes.len()),
        (status, _) => Err(status.to_string()),
    }
}

/// Starts `TRANSFERS / 2` uploads (their first half sent) and as many
/// downloads: the senders of the uploads' second halves, and every
/// transfer's task.
async fn start_transfers(
    sidecar: &Sidecar,
) -> (
    Vec<BodySender>,
    Vec<tokio::task::JoinHandle<Result<usize, String>>>,
) {
    let (mut senders, mut tasks) = (Vec::new(), Vec::new());
    for i in 0..TRANSFERS / 2 {
        let (mut tx, body) = channel_body();
        let url = sidecar.url(&format!(
            "/upload/storage/v1/b/photos/o?uploadType=media&name={i}"
        ));
        tasks.push(tokio::spawn(upload_through(url, body)));
        tx.send(Ok(Frame::data(Bytes::from(vec![b'u'; HALF]))))
            .await
            .expect("first half");
        senders.push(tx);
        let url = sidecar.url(&format!("/storage/v1/b/photos/o/{i}?alt=media"));
        tasks.push(tokio::spawn(download_through(url)));
    }
    (senders, tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_finishes_64_transfers_in_flight_and_refuses_new_connections() {
    let (open, gate) = watch::channel(false);
    let upstream = Upstream::start(gated_upstream(gate)).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let (senders, tasks) = start_transfers(&sidecar).await;
    tokio::time::timeout(Duration::from_secs(20), async {
        while upstream.seen().len() < TRANSFERS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("all transfers reached the upstream");

    let stopped_at = tokio::time::Instant::now();
    let _ = sidecar.stop.send(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        TcpStream::connect(sidecar.addr).await.is_err(),
        "a new connection was accepted while draining"
    );
    let unfinished = tasks.iter().filter(|t| !t.is_finished()).count();
    assert_eq!(unfinished, TRANSFERS, "in flight when the drain began");

    let _ = open.send(true);
    for mut tx in senders {
        tx.send(Ok(Frame::data(Bytes::from(vec![b'v'; HALF]))))
            .await
            .expect("second half");
    }
    let drain = settings().drain_timeout;
    for (i, task) in tasks.into_iter().enumerate() {
        let done = tokio::time::timeout_at(stopped_at + drain, task)
            .await
            .unwrap_or_else(|_| panic!("transfer {i} still running at the end of the drain"))
            .expect("join");
        assert_eq!(done, Ok(2 * HALF), "transfer {i}");
    }
    let served = tokio::time::timeout_at(stopped_at + drain, sidecar.task)
        .await
        .expect("the sidecar stopped within the drain period");
    assert!(matches!(served, Ok(Ok(()))), "{served:?}");
    eprintln!(
        "{TRANSFERS} transfers drained in {:?}",
        stopped_at.elapsed()
    );
}

// --------------------------------------------------------- f. long run

/// Set in the process of its own the long run runs in.
const CHILD: &str = "BUCKETMAP_FAULTS_LONG_RUN";
/// Overrides [`LONG_RUN`].
const REQUESTS_VAR: &str = "BUCKETMAP_FAULTS_REQUESTS";
/// Requests of the long run (a multiple of 20), as the issue asks: about
/// 45 s in a debug build on two idle cores (2,400 a second; some 1,000 a
/// second while a build runs beside it). `BUCKETMAP_FAULTS_REQUESTS`
/// overrides it for a quicker or longer run by hand (refused under
/// `CI=true`).
const LONG_RUN: usize = 100_000;
const WARM_UP: usize = 2_000;
const WORKERS: usize = 16;
/// Sockets that may come and go with the pools (idle connections, each
/// two sockets, in the app's pool and the sidecar's upstream pool).
const SOCKET_SLACK: usize = 2 * WORKERS;
const MIB: u64 = 1024 * 1024;
static CHUNK: [u8; 16 * 1024] = [7u8; 16 * 1024];
const SMALL: usize = 4096;

/// Metadata for any GET, data for `alt=media` (`…/big`: 256 KiB in 16 KiB
/// frames, otherwise 4 KiB), uploads read whole.
fn long_run_upstream() -> Handler {
    handler(|req: Request<Incoming>| async move {
        let gcs = "https://storage.googleapis.com";
        if req.method() == Method::POST {
            let mut body = req.into_body();
            while let Some(Ok(_)) = body.frame().await {}
            return json_response(StatusCode::OK, object(gcs, PHYSICAL, "x", "x"));
        }
        if req.uri().query() != Some("alt=media") {
            return json_response(StatusCode::OK, object(gcs, PHYSICAL, "x", "x"));
        }
        let (frames, size) = match req.uri().path().ends_with("/big") {
            true => (16, CHUNK.len()),
            false => (1, SMALL),
        };
        let data = (0..frames).map(move |_| {
            Ok::<_, bucketmap_sidecar::body::BoxError>(Frame::data(Bytes::from_static(
                &CHUNK[..size],
            )))
        });
        let mut response = Response::new(BodyExt::boxed(http_body_util::StreamBody::new(
            futures::stream::iter(data),
        )));
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(frames * size));
        response
    })
}

type AppClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    ProxyBody,
>;

/// The app reads the head and one frame of a 256 KiB download, then drops it.
async fn drop_response_midway(app: &AppClient, base: &str) -> Result<(), String> {
    let url = format!("{base}/storage/v1/b/photos/o/big?alt=media");
    let response = app.request(request(Method::GET, &url, empty())).await;
    let response = response.map_err(|e| format!("big download: {e:?}"))?;
    let mut body = response.into_body();
    match body.frame().await {
        Some(Ok(_)) => Ok(()),
        other => Err(format!("big download, first frame: {other:?}")),
    }
}

/// The app dies with a connection open: halfway through an upload (reset),
/// or right after sending a GET (FIN).
async fn drop_connection(addr: SocketAddr, i: usize) -> Result<(), String> {
    let mut tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (head, body, end) = match i % 40 < 20 {
        true => (
            "POST /upload/storage/v1/b/photos/o?uploadType=media&name=y HTTP/1.1\r\nHost: s\r\nContent-Length: 65536\r\n\r\n",
            &CHUNK[..],
            End::Reset,
        ),
        false => (
            "GET /storage/v1/b/photos/o/x HTTP/1.1\r\nHost: s\r\n\r\n",
            &CHUNK[..0],
            End::Close,
        ),
    };
    let written = async {
        tcp.write_all(head.as_bytes()).await?;
        tcp.write_all(body).await
    };
    written.await.map_err(|e| format!("write: {e}"))?;
    leave(tcp, end).await;
    Ok(())
}

/// A complete request: metadata, a small download or a small upload.
async fn complete_request(app: &AppClient, base: &str, i: usize) -> Result<(), String> {
    let (method, target, body) = match i % 4 {
        0 | 2 => (Method::GET, "/storage/v1/b/photos/o/x", empty()),
        1 => (Method::GET, "/storage/v1/b/photos/o/x?alt=media", empty()),
        _ => (
            Method::POST,
            "/upload/storage/v1/b/photos/o?uploadType=media&name=x",
            full(Bytes::from_static(&CHUNK[..SMALL])),
        ),
    };
    let url = format!("{base}{target}");
    let response = app.request(request(method, &url, body)).await;
    let (status, bytes) = whole(response.map_err(|e| format!("{target}: {e:?}"))?).await?;
    let good = match i % 4 {
        1 => bytes.len() == SMALL,
        _ => serde_json::from_slice::<serde_json::Value>(&bytes)
            .is_ok_and(|doc| doc["bucket"] == "photos"),
    };
    match (status, good) {
        (StatusCode::OK, true) => Ok(()),
        _ => Err(format!("{target}: {status}, {} bytes", bytes.len())),
    }
}

/// Request `i` of a run: one in ten aborted (`Ok(true)`).
async fn one_request(app: &AppClient, addr: SocketAddr, i: usize) -> Result<bool, String> {
    let base = format!("http://{addr}");
    match i % 20 {
        0 => drop_response_midway(app, &base).await.map(|()| true),
        1 => drop_connection(addr, i).await.map(|()| true),
        _ => complete_request(app, &base, i).await.map(|()| false),
    }
}

/// What a run of requests came to.
#[derive(Debug, Default)]
struct Tally {
    complete: usize,
    aborted: usize,
    failed: usize,
    /// The first few failures.
    failures: Vec<String>,
}

impl Tally {
    fn add(&mut self, outcome: Result<bool, String>) {
        match outcome {
            Ok(true) => self.aborted += 1,
            Ok(false) => self.complete += 1,
            Err(e) => {
                self.failed += 1;
                if self.failures.len() < 5 {
                    self.failures.push(e);
                }
            }
        }
    }
}

/// Requests `range`, `WORKERS` at a time, each under a 20 s timeout.
async fn run_load(app: &AppClient, addr: SocketAddr, range: std::ops::Range<usize>) -> Tally {
    let next = Arc::new(AtomicUsize::new(range.start));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (app, next, end) = (app.clone(), next.clone(), range.end);
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return tally;
                }
                let outcome =
                    tokio::time::timeout(Duration::from_secs(20), one_request(&app, addr, i)).await;
                tally.add(outcome.unwrap_or_else(|_| Err(format!("request {i} timed out"))));
            }
        }));
    }
    let mut total = Tally::default();
    for worker in workers {
        let tally = worker.await.expect("join");
        total.complete += tally.complete;
        total.aborted += tally.aborted;
        total.failed += tally.failed;
        total.failures.extend(tally.failures);
    }
    total
}

/// The process's descriptors, those that are TCP sockets on `ports`, and RSS.
#[derive(Clone, Copy, Debug)]
struct Usage {
    fds: usize,
    sockets: usize,
    rss: u64,
}

/// The inodes of TCP sockets with an end on one of `ports`.
fn socket_inodes(ports: &[u16]) -> std::collections::HashSet<String> {
    let mut inodes = std::collections::HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |field: usize| {
                fields
                    .get(field)
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            };
            let ours = [port(1), port(2)]
                .into_iter()
                .any(|p| p.is_some_and(|p| ports.contains(&p)));
            if ours && let Some(inode) = fields.get(9) {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    inodes
}

fn usage(ports: &[u16]) -> Usage {
    let inodes = socket_inodes(ports);
    let links: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .map(|link| link.display().to_string())
        .collect();
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    Usage {
        fds: links.len(),
        sockets: links.iter().filter(|l| inodes.contains(*l)).count(),
        rss: rss_kib * 1024,
    }
}

/// Usage once nothing is in flight and the sockets have settled to at most
/// `base` plus the slack (or after 10 s).
async fn settled(sidecar: &Sidecar, ports: &[u16], base: Option<Usage>) -> Usage {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = usage(ports);
        let quiet = sidecar.metrics.in_flight.get() == 0
            && base.is_none_or(|b| now.sockets <= b.sockets + SOCKET_SLACK);
        if quiet || Instant::now() > deadline {
            // Connections closing right now: let them finish.
            tokio::time::sleep(Duration::from_millis(200)).await;
            return usage(ports);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// Usage after the warm-up, halfway and at the end, and the two halves' tallies.
struct LongRun {
    usage: [Usage; 3],
    halves: [Tally; 2],
}

async fn long_run_of(requests: usize) -> LongRun {
    let upstream = Upstream::start_unrecorded(long_run_upstream()).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let ports = [sidecar.addr.port(), upstream.addr.port()];
    let app = client();
    let warm_up = run_load(&app, sidecar.addr, 0..WARM_UP).await;
    assert_eq!(warm_up.failed, 0, "warm-up: {warm_up:?}");
    let base = settled(&sidecar, &ports, None).await;
    let started = Instant::now();
    let middle = WARM_UP + requests / 2;
    let first = run_load(&app, sidecar.addr, WARM_UP..middle).await;
    let half = settled(&sidecar, &ports, Some(base)).await;
    let second = run_load(&app, sidecar.addr, middle..WARM_UP + requests).await;
    let took = started.elapsed();
    let end = settled(&sidecar, &ports, Some(base)).await;
    assert_eq!(
        sidecar.metrics.in_flight.get(),
        0,
        "requests left in flight"
    );
    eprintln!(
        "long run: {requests} requests in {took:?} ({:.0}/s)",
        requests as f64 / took.as_secs_f64()
    );
    LongRun {
        usage: [base, half, end],
        halves: [first, second],
    }
}

async fn long_run() {
    // A switch for a quicker run by hand, refused in CI (testkit's switches).
    let requests = bucketmap_testkit::switches::number(REQUESTS_VAR, LONG_RUN);
    let LongRun { usage, halves } = long_run_of(requests).await;
    let [base, half, end] = usage;
    eprintln!(
        "{halves:?}\ndescriptors {} → {} → {} (sockets of the test {} → {} → {}); RSS {:.1} → {:.1} → {:.1} MiB",
        base.fds,
        half.fds,
        end.fds,
        base.sockets,
        half.sockets,
        end.sockets,
        mib(base.rss),
        mib(half.rss),
        mib(end.rss)
    );
    for run in &halves {
        assert_eq!(run.failed, 0, "{run:?}");
        assert_eq!(run.aborted * 10, run.complete + run.aborted, "{run:?}");
    }
    let done: usize = halves.iter().map(|h| h.complete + h.aborted).sum();
    assert_eq!(done, requests);
    assert!(
        end.sockets <= base.sockets + SOCKET_SLACK,
        "sockets leaked: {base:?} → {end:?}"
    );
    assert!(
        end.fds <= base.fds + SOCKET_SLACK,
        "descriptors leaked: {base:?} → {end:?}"
    );
    assert!(
        end.rss <= base.rss + RSS_SLACK,
        "RSS grew by {:.1} MiB: {base:?} → {end:?}",
        mib(end.rss.saturating_sub(base.rss))
    );
    assert!(
        end.rss <= half.rss + RSS_SLACK / 2,
        "RSS still growing in the second half: {half:?} → {end:?}"
    );
}

/// Growth of the RSS allowed over the long run (allocator caches).
const RSS_SLACK: u64 = 16 * MIB;

/// File descriptors and RSS are the process's, and the other tests run on
/// threads of this one: the long run re-runs this test in a process of its
/// own, where `CHILD` is set.
#[test]
fn descriptors_and_memory_stay_flat_over_a_long_run_with_aborted_clients() {
    if std::env::var_os(CHILD).is_some() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(long_run());
        return;
    }
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, m)| m);
    let name =
        format!("{module}::descriptors_and_memory_stay_flat_over_a_long_run_with_aborted_clients");
    let exe = std::env::current_exe().expect("the test binary");
    let output = std::process::Command::new(exe)
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("run the long run in a process of its own");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "the long run failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the long run did not run:\n{stdout}"
    );
}
