//! The training run of the shipped sidecar's profile-guided build
//! (`BUCKETMAP_BENCH_PHASES=train`, run by `tools/pgo/train.sh` with an
//! instrumented build as `BUCKETMAP_BENCH_SIDECAR_BIN`).
//!
//! It sends the sidecar the work it does in production, in about the
//! proportions it gets it: metadata GETs above all (closed loops at one and
//! sixteen connections, and an open loop, whose idle gaps between requests
//! are the shape the latency figures measure), uploads and downloads, one at
//! a time and sixteen at once, and every other kind of request a client
//! sends (listings, bucket reads, multipart and resumable uploads, copies,
//! deletes, the XML API, batches, names the sidecar refuses), so that no
//! path is left out of the profile and compiled as if it never ran. In front
//! of the plain upstream, the TLS upstream with each HTTP version, and the
//! mock GCS over gRPC. Each sidecar is stopped with SIGTERM, as the kubelet
//! stops it, and must exit cleanly: an instrumented build writes its
//! profile as it exits. Nothing is measured.

use super::*;

/// Requests per kind of the mix, per sidecar.
const MIX_ROUNDS: u32 = 100;

/// How long a stopped sidecar may take to exit before the run fails.
const EXIT_GRACE: Duration = Duration::from_secs(20);

/// Runs the training workload through the sidecar `sidecar_bin()`.
pub(crate) async fn train(settings: &Settings, dir: &Path) -> Result<()> {
    let tls = Tls::new(dir)?;
    let client = new_client(tls.client.clone());
    let chunk = pattern_chunk();
    let plain = start_in_process_upstream(settings, &chunk, None)?;
    let secure = start_in_process_upstream(settings, &chunk, Some(tls.server.clone()))?;
    let ca = tls.ca_file.display().to_string();
    let runs: [(&str, String, Vec<&str>); 3] = [
        ("plain", format!("http://{plain}"), vec![]),
        (
            "tls-h1",
            format!("https://{secure}"),
            vec!["--upstream-ca-file", &ca, "--upstream-http", "1.1"],
        ),
        (
            "tls-h2",
            format!("https://{secure}"),
            vec!["--upstream-ca-file", &ca, "--upstream-http", "2"],
        ),
    ];
    for (tag, upstream, extra) in &runs {
        eprintln!("[train] HTTP through the sidecar, upstream {tag}");
        let (mut proc, addr) =
            start_sidecar_to(&client, upstream, extra, dir, tag, Launch::Plain).await?;
        let endpoint = Endpoint::plain("sidecar", addr, LOGICAL);
        http_work(settings, &client, &endpoint, &chunk).await?;
        proc.terminate(EXIT_GRACE).await?;
    }
    eprintln!("[train] gRPC through the sidecar");
    let mock = start_mock_gcs(settings.grpc_big, &chunk)?;
    let (mut proc, addr) = start_grpc_sidecar(&client, plain, mock, dir, false).await?;
    grpc_work(settings, addr, &chunk).await?;
    proc.terminate(EXIT_GRACE).await?;
    Ok(())
}

/// Metadata GETs, transfers and the mix of other requests, through `endpoint`.
async fn http_work(
    settings: &Settings,
    client: &HttpClient,
    endpoint: &Endpoint,
    chunk: &Bytes,
) -> Result<()> {
    let length = Duration::from_secs(3);
    for connections in [1, 16] {
        let (done, failed) = closed_loop(client, endpoint, connections, length).await;
        ensure_answered("metadata GETs", done, failed)?;
    }
    let (mut samples, mut errors) = (Vec::new(), Vec::new());
    open_loop(
        client,
        endpoint,
        settings.rate,
        length,
        &mut samples,
        &mut errors,
    )
    .await;
    if let Some(error) = errors.first() {
        bail!("the open loop failed: {error}");
    }
    for _ in 0..2 {
        upload(client, endpoint, "big", settings.big, chunk).await?;
        download(client, endpoint, "big", settings.big).await?;
    }
    for direction in [Direction::Upload, Direction::Download] {
        concurrent(client, endpoint, direction, 16, settings.stream_size, chunk).await?;
    }
    for _ in 0..MIX_ROUNDS {
        for request in mix(endpoint)? {
            send_any(client, request).await?;
        }
    }
    Ok(())
}

fn ensure_answered(what: &str, done: u64, failed: u64) -> Result<()> {
    if done == 0 || failed > 0 {
        bail!("{what}: {done} answered, {failed} failed");
    }
    Ok(())
}

/// The requests of the mix: one of each kind a client sends besides
/// metadata GETs and media transfers. The in-process upstream answers some
/// and not others, and the sidecar refuses some: every one still runs
/// through its routing and rewriting, which is what the profile is for.
fn mix(endpoint: &Endpoint) -> Result<Vec<Request<BenchBody>>> {
    let base = format!("http://{}", endpoint.addr);
    let b = endpoint.bucket;
    let json = "application/json";
    let multipart = concat!(
        "--sep\r\ncontent-type: application/json\r\n\r\n",
        r#"{"name":"m","bucket":"photos","metadata":{"k":"v"}}"#,
        "\r\n--sep\r\ncontent-type: text/plain\r\n\r\nhello\r\n--sep--\r\n"
    );
    let batch = concat!(
        "--batch\r\ncontent-type: application/http\r\ncontent-id: 1\r\n\r\n",
        "GET /storage/v1/b/photos/o/x HTTP/1.1\r\n\r\n",
        "--batch--\r\n"
    );
    let requests: Vec<(Method, String, Option<&str>, &str)> = vec![
        (Method::GET, format!("/storage/v1/b/{b}"), None, ""),
        (
            Method::GET,
            format!("/storage/v1/b/{b}/o?prefix=a&maxResults=10"),
            None,
            "",
        ),
        (Method::GET, "/storage/v1/b?project=p".into(), None, ""),
        (Method::GET, format!("/storage/v1/b/{b}/o/x/acl"), None, ""),
        (Method::GET, format!("/storage/v1/b/{b}/iam"), None, ""),
        (
            Method::PATCH,
            format!("/storage/v1/b/{b}/o/x"),
            Some(json),
            r#"{"metadata":{"k":"v"}}"#,
        ),
        (
            Method::POST,
            format!("/storage/v1/b/{b}/o/x/copyTo/b/{b}/o/y"),
            Some(json),
            "{}",
        ),
        (
            Method::POST,
            format!("/storage/v1/b/{b}/o/x/rewriteTo/b/{b}/o/y"),
            Some(json),
            "{}",
        ),
        (
            Method::POST,
            format!("/storage/v1/b/{b}/o/c/compose"),
            Some(json),
            r#"{"sourceObjects":[{"name":"x"}],"destination":{"bucket":"photos"}}"#,
        ),
        (Method::DELETE, format!("/storage/v1/b/{b}/o/y"), None, ""),
        (
            Method::POST,
            format!("/upload/storage/v1/b/{b}/o?uploadType=multipart"),
            Some("multipart/related; boundary=sep"),
            multipart,
        ),
        (
            Method::POST,
            format!("/upload/storage/v1/b/{b}/o?uploadType=resumable&name=r"),
            Some(json),
            r#"{"name":"r"}"#,
        ),
        (
            Method::POST,
            "/batch/storage/v1".into(),
            Some("multipart/mixed; boundary=batch"),
            batch,
        ),
        (Method::GET, format!("/{b}/x"), None, ""),
        (Method::HEAD, format!("/{b}/x"), None, ""),
        (Method::PUT, format!("/{b}/y"), Some("text/plain"), "hello"),
        (Method::GET, format!("/{b}?list-type=2&prefix=a"), None, ""),
        (Method::GET, "/storage/v1/b/unmapped/o/x".into(), None, ""),
        (
            Method::GET,
            format!("/storage/v1/b/{b}/o/x?alt=unknown"),
            None,
            "",
        ),
    ];
    requests
        .into_iter()
        .map(|(method, path, content_type, body)| {
            let mut request = Request::builder()
                .method(method)
                .uri(format!("{base}{path}"));
            if let Some(content_type) = content_type {
                request = request.header(header::CONTENT_TYPE, content_type);
            }
            let body = Full::new(Bytes::from(body.to_owned())).boxed();
            request.body(body).context("a request of the mix")
        })
        .collect()
}

/// Sends `request` and reads its answer, whatever its status.
async fn send_any(client: &HttpClient, request: Request<BenchBody>) -> Result<()> {
    let what = format!("{} {}", request.method(), request.uri());
    let work = async {
        let response = client.request(request).await?;
        response.into_body().collect().await?;
        anyhow::Ok(())
    };
    tokio::time::timeout(METADATA_TIMEOUT, work)
        .await
        .map_err(|_| anyhow!("{what} timed out"))?
        .with_context(|| format!("{what} got no answer"))
}

/// Unary GetObject calls, a ReadObject and a WriteObject through the
/// sidecar at `addr`.
async fn grpc_work(settings: &Settings, addr: SocketAddr, chunk: &Bytes) -> Result<()> {
    let mut grpc = grpc_client(addr)?;
    for _ in 0..settings.grpc_calls {
        grpc_get(&mut grpc, LOGICAL).await?;
    }
    for _ in 0..2 {
        grpc_read(&mut grpc, LOGICAL, settings.grpc_big).await?;
        grpc_write(&mut grpc, LOGICAL, settings.grpc_big, chunk).await?;
    }
    Ok(())
}
