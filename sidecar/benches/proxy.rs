//! Benchmark of `bucketmap-sidecar`: the same requests sent straight to an
//! upstream, through a plain TCP relay and through the release-built
//! sidecar, in one run, every figure printed next to its ratio to the direct
//! baseline. It is not a test: the targets are reported (met / MISSED),
//! never asserted.
//!
//! ```sh
//! cargo bench -p bucketmap-sidecar --bench proxy
//! BUCKETMAP_BENCH_QUICK=1 cargo bench -p bucketmap-sidecar --bench proxy   # smoke run, small sizes
//! BUCKETMAP_BENCH_SIDECAR_BIN=/path/to/bucketmap-sidecar cargo bench ...    # another build
//! BUCKETMAP_BENCH_PHASES=memory cargo bench ...    # some of latency,streaming,memory,instructions,grpc
//! BUCKETMAP_SIDECAR_WORKER_THREADS=2 cargo bench ...    # the sidecar on two threads
//! ```
//!
//! Upstreams:
//! - an in-process hyper HTTP/1.1 server on loopback (its own thread and
//!   single-threaded runtime) that answers as fast as it can: a canned object
//!   resource for metadata GETs, upload bodies read and discarded, download
//!   bodies generated from one shared buffer. What differs between the direct
//!   and the proxied figures is then the proxy's own cost;
//! - fake-gcs-server (memory backend), the realistic upstream the integration
//!   tests use, from `tools/fake-gcs-server/install.sh`. Its figures are
//!   skipped, with a note, when it cannot be had.
//!
//! Paths (the sidecar runs as a child process with
//! `--no-auth --map photos=photos-k3x9q2mw`; direct and relayed requests
//! name the physical bucket, proxied ones the logical bucket):
//! - direct: client to upstream;
//! - via TCP relay: this binary again, as a child process, copying bytes
//!   between two sockets with no HTTP at all. It pays what any user-space
//!   proxy pays here (one more process, two more sockets, their wake-ups and
//!   copies), so it is the floor against which the sidecar's own cost shows;
//! - via sidecar.
//!
//! Measurements:
//! 1. metadata latency: `GET /storage/v1/b/B/o/x` (JSON, rewritten by the
//!    sidecar) at a fixed rate, open loop (requests are sent on schedule
//!    whatever the answers do), in blocks that take turns between the paths
//!    so that background load hits all alike; latency percentiles and the
//!    latency each proxy adds;
//! 2. streaming throughput of one large `uploadType=media` upload and one
//!    `alt=media` download, the paths taking turns, median of the
//!    repetitions;
//! 3. the sidecar's memory: a fresh sidecar's idle RSS, then its peak RSS
//!    (`VmHWM`) after 64 concurrent downloads and after 64 concurrent uploads,
//!    with the aggregate throughput of those streams direct and proxied;
//! 4. instructions per metadata request through the relay and the sidecar,
//!    counted by callgrind (skipped with a note without valgrind): the one
//!    figure the machine's load does not move;
//! 5. gRPC (`google.storage.v2` over h2c): the in-repo mock GCS in this
//!    process (own thread and runtime) directly and through a sidecar with
//!    `--grpc-upstream` pointing at it: unary `GetObject` latency
//!    percentiles (closed loop, the paths taking turns in blocks), one
//!    `WriteObject` and one `ReadObject` of `grpc_big` bytes per repetition
//!    and path, and that sidecar's idle and peak RSS. A sidecar without the
//!    gRPC path leaves a note instead of the figures.
//!    `BUCKETMAP_BENCH_GRPC_PHYSICAL=1` sends the physical name through a
//!    sidecar with `--allow-physical-names` (no name to rewrite).
//!
//! With the latency and streaming figures goes the CPU time (from
//! `/proc/PID/task/*/schedstat`) each path cost: the client's plus the
//! upstream's for direct requests, the relay's, the sidecar's.
//!
//! The load client is a hyper-util pooled client on the bench's own
//! single-threaded runtime; latencies run from the moment a request is
//! handed to the client to the last byte of the response body.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use std::convert::Infallible;
use std::fmt::Write as _;
use std::fs::File;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, Uri, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use bucketmap_testkit::mock_gcs::{MockGcs, proto};
use proto::storage_client::StorageClient;

const SIDECAR_BIN: &str = env!("CARGO_BIN_EXE_bucketmap-sidecar");

/// The sidecar under test: the one cargo built for this bench, or
/// `BUCKETMAP_BENCH_SIDECAR_BIN` (to compare another build).
fn sidecar_bin() -> PathBuf {
    std::env::var_os("BUCKETMAP_BENCH_SIDECAR_BIN")
        .map_or_else(|| PathBuf::from(SIDECAR_BIN), PathBuf::from)
}
const LOGICAL: &str = "photos";
const PHYSICAL: &str = "photos-k3x9q2mw";
const MIB: u64 = 1 << 20;
/// Size of the buffer generated bodies are sliced from (one frame each).
const CHUNK: usize = 128 * 1024;
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
const STREAM_TIMEOUT: Duration = Duration::from_secs(180);
const READY_TIMEOUT: Duration = Duration::from_secs(30);

// Targets (reported, not asserted).
const TARGET_ADDED_P50: Duration = Duration::from_micros(100);
const TARGET_ADDED_P99: Duration = Duration::from_millis(1);
const TARGET_THROUGHPUT_RATIO: f64 = 0.90;
const TARGET_PEAK_RSS_KIB: u64 = 20 * 1024;

/// What one run does.
#[derive(Clone, Copy, Debug)]
struct Settings {
    /// Metadata requests per second (open loop).
    rate: u64,
    /// Length of one open-loop block; blocks alternate direct and proxied.
    block: Duration,
    /// Blocks per path and upstream.
    blocks: u32,
    /// Closed-loop warm-up requests per path before measuring.
    warmup: u32,
    /// Single-stream object size, in-process upstream.
    big: u64,
    /// Single-stream object size, fake-gcs-server.
    fake_big: u64,
    /// Repetitions of each single-stream transfer per path.
    reps: u32,
    /// Concurrent streams in the memory phase.
    streams: usize,
    /// Bytes per concurrent stream.
    stream_size: u64,
    /// Unary gRPC GetObject calls per path (closed loop).
    grpc_calls: u32,
    /// Size of the gRPC ReadObject and WriteObject transfers.
    grpc_big: u64,
    /// Phases to run (`BUCKETMAP_BENCH_PHASES=latency,streaming,memory,instructions,grpc`,
    /// all by default).
    latency: bool,
    streaming: bool,
    memory: bool,
    instructions: bool,
    grpc: bool,
}

impl Settings {
    fn from_env() -> Self {
        let quick = std::env::var_os("BUCKETMAP_BENCH_QUICK").is_some_and(|v| v != "0");
        let phases = std::env::var("BUCKETMAP_BENCH_PHASES")
            .unwrap_or_else(|_| "latency,streaming,memory,instructions,grpc".into());
        let phase = |name: &str| phases.split(',').any(|p| p.trim() == name);
        let (latency, streaming, memory) = (phase("latency"), phase("streaming"), phase("memory"));
        let (instructions, grpc) = (phase("instructions"), phase("grpc"));
        if quick {
            Settings {
                rate: 500,
                block: Duration::from_secs(1),
                blocks: 2,
                warmup: 50,
                big: 32 * MIB,
                fake_big: 32 * MIB,
                grpc_calls: 400,
                grpc_big: 32 * MIB,
                reps: 1,
                streams: 64,
                stream_size: 2 * MIB,
                latency,
                streaming,
                memory,
                instructions,
                grpc,
            }
        } else {
            Settings {
                rate: 500,
                block: Duration::from_secs(2),
                blocks: 5,
                warmup: 200,
                big: 256 * MIB,
                fake_big: 256 * MIB,
                grpc_calls: 2000,
                grpc_big: 256 * MIB,
                reps: 5,
                streams: 64,
                stream_size: 16 * MIB,
                latency,
                streaming,
                memory,
                instructions,
                grpc,
            }
        }
    }

    fn per_path(&self) -> Duration {
        self.block * self.blocks
    }
}

// ---------------------------------------------------------------------------
// Bodies

/// A body of `remaining` bytes sliced from one shared buffer (no copies).
struct Generated {
    remaining: u64,
    chunk: Bytes,
}

impl Generated {
    fn new(size: u64, chunk: &Bytes) -> Self {
        Generated {
            remaining: size,
            chunk: chunk.clone(),
        }
    }
}

impl Body for Generated {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(self.chunk.len() as u64) as usize;
        self.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

type BenchBody = BoxBody<Bytes, Infallible>;

fn empty() -> BenchBody {
    Empty::new().boxed()
}

fn pattern_chunk() -> Bytes {
    (0..CHUNK)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

// ---------------------------------------------------------------------------
// In-process upstream

struct Canned {
    addr: SocketAddr,
    big: u64,
    stream_size: u64,
    metadata: Bytes,
    chunk: Bytes,
}

impl Canned {
    /// An object resource shaped like GCS's (links on the upstream's address).
    fn object_json(&self, bucket: &str, name: &str, size: u64) -> String {
        let addr = self.addr;
        let generation = "1764417600000000";
        format!(
            concat!(
                r#"{{"kind":"storage#object","id":"{b}/{n}/{g}","#,
                r#""selfLink":"http://{a}/storage/v1/b/{b}/o/{n}","#,
                r#""mediaLink":"http://{a}/download/storage/v1/b/{b}/o/{n}?generation={g}&alt=media","#,
                r#""name":"{n}","bucket":"{b}","generation":"{g}","metageneration":"1","#,
                r#""contentType":"application/octet-stream","storageClass":"STANDARD","size":"{s}","#,
                r#""md5Hash":"XUFAKrxLKna5cZ2REBfFkg==","crc32c":"mnG7TA==","etag":"CIDg4pCOkJEDEAE=","#,
                r#""timeCreated":"2025-11-29T12:00:00.000Z","updated":"2025-11-29T12:00:00.000Z","#,
                r#""timeStorageClassUpdated":"2025-11-29T12:00:00.000Z"}}"#
            ),
            a = addr,
            b = bucket,
            n = name,
            g = generation,
            s = size,
        )
    }
}

fn json_response(body: impl Into<Bytes>) -> Response<BenchBody> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    response
}

fn status_response(status: StatusCode) -> Response<BenchBody> {
    let mut response = Response::new(empty());
    *response.status_mut() = status;
    response
}

fn query_param<'q>(query: Option<&'q str>, key: &str) -> Option<&'q str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

async fn upstream_handle(
    req: Request<Incoming>,
    canned: Arc<Canned>,
) -> Result<Response<BenchBody>, Infallible> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let media = query_param(query.as_deref(), "alt") == Some("media");
    if req.method() == Method::POST && path.starts_with("/upload/storage/v1/b/") {
        let bucket = path["/upload/storage/v1/b/".len()..]
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let name = query_param(query.as_deref(), "name")
            .unwrap_or("object")
            .to_owned();
        let mut body = req.into_body();
        let mut received = 0u64;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        received += data.len() as u64;
                    }
                }
                Err(_) => return Ok(status_response(StatusCode::BAD_REQUEST)),
            }
        }
        return Ok(json_response(canned.object_json(&bucket, &name, received)));
    }
    if req.method() == Method::GET && path.starts_with("/storage/v1/b/") {
        if !media {
            return Ok(json_response(canned.metadata.clone()));
        }
        let size = if path.ends_with("/o/big") {
            canned.big
        } else {
            canned.stream_size
        };
        let mut response = Response::new(Generated::new(size, &canned.chunk).boxed());
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/octet-stream"),
        );
        headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(size));
        return Ok(response);
    }
    Ok(status_response(StatusCode::NOT_FOUND))
}

/// Starts the in-process upstream on its own thread and runtime.
fn start_in_process_upstream(settings: &Settings, chunk: &Bytes) -> Result<SocketAddr> {
    let listener = StdTcpListener::bind("127.0.0.1:0").context("cannot bind the upstream")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let mut canned = Canned {
        addr,
        big: settings.big,
        stream_size: settings.stream_size,
        metadata: Bytes::new(),
        chunk: chunk.clone(),
    };
    canned.metadata = canned.object_json(PHYSICAL, "x", 595).into();
    let canned = Arc::new(canned);
    std::thread::Builder::new()
        .name("bench-upstream".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("upstream runtime");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("upstream listener");
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let canned = canned.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req| upstream_handle(req, canned.clone()));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        })
        .context("cannot start the upstream thread")?;
    Ok(addr)
}

// ---------------------------------------------------------------------------
// Child processes

/// A child process, killed when dropped.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, cmd: &mut Command, log: PathBuf) -> Result<Proc> {
        let file =
            File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        Ok(Proc { name, child, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited with {status}\n{}",
                self.name,
                log_tail(&self.log, 20)
            );
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    format!("--- {} ---\n{}", path.display(), all[start..].join("\n"))
}

fn free_port() -> Result<u16> {
    let listener = StdTcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// Polls `path` until it answers 200; fails if the process exits (a port
/// lost to a race makes it exit, and the answer may then come from another
/// process, hence the second look after the first 200).
async fn wait_ready(
    client: &HttpClient,
    proc: &mut Proc,
    addr: SocketAddr,
    path: &str,
) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let uri: Uri = format!("http://{addr}{path}").parse()?;
    loop {
        proc.check_running()?;
        let probe = Request::get(uri.clone()).body(empty())?;
        if let Ok(Ok(response)) =
            tokio::time::timeout(Duration::from_secs(2), client.request(probe)).await
            && response.status() == StatusCode::OK
        {
            tokio::time::sleep(Duration::from_millis(300)).await;
            proc.check_running()?;
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} at {addr} not ready after {READY_TIMEOUT:?}\n{}",
                proc.name,
                log_tail(&proc.log, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How a child process is started: as it is, or under callgrind writing
/// its counts to the given file.
#[derive(Clone, Copy, Debug)]
enum Launch<'a> {
    Plain,
    Callgrind(&'a Path),
}

impl Launch<'_> {
    fn command(self, program: &Path) -> Command {
        match self {
            Launch::Plain => Command::new(program),
            Launch::Callgrind(out) => {
                let mut cmd = Command::new("valgrind");
                cmd.arg("--tool=callgrind")
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(program);
                cmd
            }
        }
    }
}

/// Starts the release-built sidecar in front of `upstream`.
async fn start_sidecar(
    client: &HttpClient,
    upstream: SocketAddr,
    dir: &Path,
    tag: &str,
    launch: Launch<'_>,
) -> Result<(Proc, SocketAddr)> {
    let log = dir.join(format!("sidecar-{tag}"));
    start_on_free_port(
        client,
        "bucketmap-sidecar",
        "/_bucketmap/readyz",
        &log,
        |addr| {
            let mut cmd = launch.command(&sidecar_bin());
            cmd.args(["--listen", &addr.to_string()])
                .args(["--upstream", &format!("http://{upstream}")])
                .arg("--no-auth")
                .args(["--map", &format!("{LOGICAL}={PHYSICAL}")])
                .env("RUST_LOG", "info")
                .env("NO_COLOR", "1");
            cmd
        },
    )
    .await
}

/// Starts a child process listening on a free loopback port (the command
/// `command(addr)`), its output in `LOG-<attempt>.log`, and waits until
/// `probe` answers 200 there; a port lost to a race makes it try again.
async fn start_on_free_port(
    client: &HttpClient,
    name: &'static str,
    probe: &str,
    log: &Path,
    command: impl Fn(SocketAddr) -> Command,
) -> Result<(Proc, SocketAddr)> {
    let mut last = None;
    for attempt in 0..3 {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let log = PathBuf::from(format!("{}-{attempt}.log", log.display()));
        let mut proc = Proc::spawn(name, &mut command(addr), log)?;
        match wait_ready(client, &mut proc, addr, probe).await {
            Ok(()) => return Ok((proc, addr)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("{name} did not start")))
}

/// Environment variable that turns this bench binary into the TCP relay:
/// `LISTEN_ADDR,UPSTREAM_ADDR`.
const RELAY_ENV: &str = "BUCKETMAP_BENCH_RELAY";
/// Copy buffer of the relay, each way: the sidecar's read buffers are
/// bounded at 64 KiB too.
const RELAY_BUFFER: usize = 64 * 1024;

/// The relay process: each accepted connection is joined to a new one to
/// the upstream and bytes are copied both ways, with no HTTP at all. It pays
/// what any user-space proxy pays on this machine (one more process, two
/// more sockets, their wake-ups and copies) and nothing else, so it is the
/// floor against which the sidecar's own cost shows.
fn relay_main(spec: &str) -> std::process::ExitCode {
    let parsed = spec.split_once(',').and_then(|(listen, upstream)| {
        Some((
            listen.parse::<SocketAddr>().ok()?,
            upstream.parse::<SocketAddr>().ok()?,
        ))
    });
    let Some((listen, upstream)) = parsed else {
        eprintln!("relay: {RELAY_ENV} must be LISTEN_ADDR,UPSTREAM_ADDR, not {spec:?}");
        return std::process::ExitCode::FAILURE;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("relay runtime");
    // It serves until killed: only an error ends it.
    let served: std::io::Result<()> = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        loop {
            let (mut inbound, _) = listener.accept().await?;
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional_with_sizes(
                    &mut inbound,
                    &mut outbound,
                    RELAY_BUFFER,
                    RELAY_BUFFER,
                )
                .await;
            });
        }
    });
    if let Err(e) = served {
        eprintln!("relay on {listen}: {e}");
    }
    std::process::ExitCode::FAILURE
}

/// Starts the relay (this binary again) in front of `upstream`.
async fn start_relay(
    client: &HttpClient,
    upstream: SocketAddr,
    dir: &Path,
    tag: &str,
    launch: Launch<'_>,
) -> Result<(Proc, SocketAddr)> {
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    let probe = format!("/storage/v1/b/{PHYSICAL}/o/x");
    let log = dir.join(format!("relay-{tag}"));
    start_on_free_port(client, "relay", &probe, &log, |addr| {
        let mut cmd = launch.command(&exe);
        cmd.env(RELAY_ENV, format!("{addr},{upstream}"));
        cmd
    })
    .await
}

/// The fake-gcs-server binary from the repository's install script.
fn fake_gcs_server_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("FAKE_GCS_SERVER_BIN") {
        return Ok(bin.into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/fake-gcs-server/install.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed with {}", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default().trim();
    if last.is_empty() {
        bail!("{} printed no path", script.display());
    }
    Ok(PathBuf::from(last))
}

/// fake-gcs-server (memory backend) holding the physical bucket and object `x`.
async fn start_fake_gcs(client: &HttpClient, bin: &Path, dir: &Path) -> Result<(Proc, SocketAddr)> {
    let mut last = None;
    for attempt in 0..3 {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let mut cmd = Command::new(bin);
        cmd.args([
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-backend",
            "memory",
            "-log-level",
            "error",
        ])
        .args(["-port", &addr.port().to_string()])
        .args(["-public-host", &addr.to_string()])
        .args(["-external-url", &format!("http://{addr}")]);
        let log = dir.join(format!("fake-gcs-server-{attempt}.log"));
        let mut proc = Proc::spawn("fake-gcs-server", &mut cmd, log)?;
        let started = async {
            wait_ready(client, &mut proc, addr, "/_internal/healthcheck").await?;
            // A fresh server has no bucket: a 409 means the port belongs to
            // someone else's fake-gcs-server, which must not be touched.
            let create = Request::post(format!("http://{addr}/storage/v1/b"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(format!(r#"{{"name":"{PHYSICAL}"}}"#))).boxed())?;
            let response = client.request(create).await?;
            if response.status() != StatusCode::OK {
                bail!("creating bucket {PHYSICAL} answered {}", response.status());
            }
            let _ = response.into_body().collect().await;
            proc.check_running()?;
            let object = Full::new(Bytes::from(vec![b'x'; 595])).boxed();
            let upload = Request::post(format!(
                "http://{addr}/upload/storage/v1/b/{PHYSICAL}/o?uploadType=media&name=x"
            ))
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(object)?;
            let response = client.request(upload).await?;
            if response.status() != StatusCode::OK {
                bail!("uploading object x answered {}", response.status());
            }
            let _ = response.into_body().collect().await;
            Ok(())
        };
        match started.await {
            Ok(()) => return Ok((proc, addr)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("fake-gcs-server did not start")))
}

/// CPU time used so far by the live threads of a process (`"self"` or a
/// pid), in nanoseconds: the first field of `/proc/PID/task/*/schedstat`.
fn cpu_ns(pid: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Sums the CPU time of a set of processes: the sidecar, or the direct
/// baseline's client and upstream (this process, plus fake-gcs-server when
/// it is the upstream).
#[derive(Clone, Debug)]
struct CpuMeter {
    pids: Vec<String>,
}

impl CpuMeter {
    fn of(pids: &[u32], with_self: bool) -> Self {
        let mut all: Vec<String> = pids.iter().map(u32::to_string).collect();
        if with_self {
            all.push("self".into());
        }
        CpuMeter { pids: all }
    }

    fn read(&self) -> u64 {
        self.pids.iter().map(|pid| cpu_ns(pid)).sum()
    }
}

/// The ways a request goes, in the order of every per-path array: straight
/// to the upstream, through the TCP relay, through the sidecar.
const PATHS: [&str; 3] = ["direct", "via TCP relay", "via sidecar"];
const DIRECT: usize = 0;
const RELAY: usize = 1;
const SIDECAR: usize = 2;

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

// ---------------------------------------------------------------------------
// Load client

type HttpClient = Client<HttpConnector, BenchBody>;

fn new_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(connector)
}

/// Where requests go: straight to the upstream (physical name) or through
/// the sidecar (logical name).
#[derive(Clone, Copy, Debug)]
struct Endpoint {
    label: &'static str,
    addr: SocketAddr,
    bucket: &'static str,
}

impl Endpoint {
    fn metadata(&self) -> Uri {
        let Endpoint { addr, bucket, .. } = self;
        format!("http://{addr}/storage/v1/b/{bucket}/o/x")
            .parse()
            .expect("metadata URI")
    }

    fn upload(&self, name: &str) -> Uri {
        let Endpoint { addr, bucket, .. } = self;
        format!("http://{addr}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}")
            .parse()
            .expect("upload URI")
    }

    fn download(&self, name: &str) -> Uri {
        let Endpoint { addr, bucket, .. } = self;
        format!("http://{addr}/storage/v1/b/{bucket}/o/{name}?alt=media")
            .parse()
            .expect("download URI")
    }
}

/// One metadata GET: (latency to the last byte, body).
async fn get_metadata(client: &HttpClient, uri: Uri) -> Result<(Duration, Bytes)> {
    let request = Request::get(uri).body(empty())?;
    let started = Instant::now();
    let response = client.request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let elapsed = started.elapsed();
    if status != StatusCode::OK {
        bail!(
            "metadata GET answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok((elapsed, body))
}

/// Checks the object resource names `bucket` (so proxied answers really
/// were rewritten).
fn check_bucket_field(body: &[u8], bucket: &str) -> Result<()> {
    let value: serde_json::Value = serde_json::from_slice(body).context("metadata is not JSON")?;
    if value["bucket"] != bucket {
        bail!(
            "metadata names bucket {} instead of {bucket}",
            value["bucket"]
        );
    }
    Ok(())
}

/// One open-loop block: `rate` requests per second for `length`, each sent
/// on schedule in its own task whatever the earlier ones are doing.
async fn open_loop(
    client: &HttpClient,
    endpoint: &Endpoint,
    rate: u64,
    length: Duration,
    samples: &mut Vec<Duration>,
    errors: &mut Vec<String>,
) {
    let count = (rate as f64 * length.as_secs_f64()).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let uri = endpoint.metadata();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(count as usize);
    for i in 0..count {
        tokio::time::sleep_until(start + interval.mul_f64(i as f64)).await;
        let client = client.clone();
        let uri = uri.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::timeout(METADATA_TIMEOUT, get_metadata(&client, uri)).await
        }));
    }
    for task in tasks {
        match task.await {
            Ok(Ok(Ok((latency, _)))) => samples.push(latency),
            Ok(Ok(Err(e))) => errors.push(format!("{e:#}")),
            Ok(Err(_)) => errors.push(format!("timed out after {METADATA_TIMEOUT:?}")),
            Err(e) => errors.push(format!("task failed: {e}")),
        }
    }
}

/// One `uploadType=media` upload of `size` generated bytes; returns the time
/// to the end of the response.
async fn upload(
    client: &HttpClient,
    endpoint: &Endpoint,
    name: &str,
    size: u64,
    chunk: &Bytes,
) -> Result<Duration> {
    let request = Request::post(endpoint.upload(name))
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, size)
        .body(Generated::new(size, chunk).boxed())?;
    let started = Instant::now();
    let work = async {
        let response = client.request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    let (status, body) = tokio::time::timeout(STREAM_TIMEOUT, work)
        .await
        .map_err(|_| anyhow!("upload timed out after {STREAM_TIMEOUT:?}"))??;
    let elapsed = started.elapsed();
    if status != StatusCode::OK {
        bail!(
            "upload via {} answered {status}: {}",
            endpoint.label,
            String::from_utf8_lossy(&body)
        );
    }
    let value: serde_json::Value =
        serde_json::from_slice(&body).context("upload response is not JSON")?;
    let stored = value["size"]
        .as_u64()
        .or_else(|| value["size"].as_str()?.parse().ok());
    if stored != Some(size) || value["bucket"] != endpoint.bucket {
        bail!(
            "upload via {} stored {} bytes in {} (expected {size} in {})",
            endpoint.label,
            value["size"],
            value["bucket"],
            endpoint.bucket
        );
    }
    Ok(elapsed)
}

/// One `alt=media` download, every byte read and counted; returns the time
/// to the last byte.
async fn download(
    client: &HttpClient,
    endpoint: &Endpoint,
    name: &str,
    size: u64,
) -> Result<Duration> {
    let request = Request::get(endpoint.download(name)).body(empty())?;
    let started = Instant::now();
    let work = async {
        let response = client.request(request).await?;
        let status = response.status();
        let mut body = response.into_body();
        if status != StatusCode::OK {
            let text = body.collect().await?.to_bytes();
            bail!(
                "download via {} answered {status}: {}",
                endpoint.label,
                String::from_utf8_lossy(&text)
            );
        }
        let mut received = 0u64;
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame?.data_ref() {
                received += data.len() as u64;
            }
        }
        anyhow::Ok(received)
    };
    let received = tokio::time::timeout(STREAM_TIMEOUT, work)
        .await
        .map_err(|_| anyhow!("download timed out after {STREAM_TIMEOUT:?}"))??;
    let elapsed = started.elapsed();
    if received != size {
        bail!(
            "download via {} got {received} bytes, expected {size}",
            endpoint.label
        );
    }
    Ok(elapsed)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Upload,
    Download,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
        }
    }
}

/// `count` concurrent transfers of `size` bytes each; returns the wall time
/// until all are done.
async fn concurrent(
    client: &HttpClient,
    endpoint: &Endpoint,
    direction: Direction,
    count: usize,
    size: u64,
    chunk: &Bytes,
) -> Result<Duration> {
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let client = client.clone();
        let endpoint = *endpoint;
        let chunk = chunk.clone();
        tasks.push(tokio::spawn(async move {
            match direction {
                Direction::Upload => {
                    upload(&client, &endpoint, &format!("stream-{i}"), size, &chunk).await
                }
                Direction::Download => download(&client, &endpoint, "stream", size).await,
            }
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| anyhow!("stream task failed: {e}"))??;
    }
    Ok(started.elapsed())
}

// ---------------------------------------------------------------------------
// Figures

struct Latencies {
    sorted: Vec<Duration>,
    errors: Vec<String>,
    /// p99 of each open-loop block, sorted.
    block_p99: Vec<Duration>,
}

impl Latencies {
    fn new(mut samples: Vec<Duration>, errors: Vec<String>, mut block_p99: Vec<Duration>) -> Self {
        samples.sort_unstable();
        block_p99.sort_unstable();
        Latencies {
            sorted: samples,
            errors,
            block_p99,
        }
    }

    /// The median of the blocks' p99s: the tail of a typical block, less
    /// swayed than the overall p99 by one block that met a stall of the
    /// (shared) machine.
    fn median_block_p99(&self) -> Duration {
        self.block_p99
            .get(self.block_p99.len() / 2)
            .copied()
            .unwrap_or_default()
    }

    fn percentile(&self, p: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p / 100.0 * (self.sorted.len() - 1) as f64).round() as usize;
        self.sorted[rank.min(self.sorted.len() - 1)]
    }

    fn max(&self) -> Duration {
        self.sorted.last().copied().unwrap_or_default()
    }
}

const PERCENTILES: [(&str, f64); 4] =
    [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9)];

struct MetadataFigures {
    upstream: &'static str,
    /// Per path (see [`PATHS`]).
    latencies: [Latencies; 3],
    /// CPU ns per path during its blocks: client + upstream (direct), the
    /// relay, the sidecar.
    cpu_ns: [u64; 3],
}

struct StreamFigures {
    upstream: &'static str,
    size: u64,
    direction: Direction,
    /// MiB/s per repetition, per path.
    rates: [Vec<f64>; 3],
    /// CPU ns per path over its repetitions, as in [`MetadataFigures`].
    cpu_ns: [u64; 3],
}

struct MemoryFigures {
    idle_rss_kib: u64,
    rows: Vec<MemoryRow>,
}

struct MemoryRow {
    direction: Direction,
    direct: f64,
    via: f64,
    hwm_after_kib: u64,
}

fn fmt_duration(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10_000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

fn fmt_added(via: Duration, direct: Duration) -> String {
    let us = (via.as_secs_f64() - direct.as_secs_f64()) * 1e6;
    if us.abs() < 10_000.0 {
        format!("{us:+.0} µs")
    } else {
        format!("{:+.2} ms", us / 1000.0)
    }
}

fn ratio(via: f64, direct: f64) -> f64 {
    if direct > 0.0 { via / direct } else { f64::NAN }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / MIB as f64 / elapsed.as_secs_f64()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

// ---------------------------------------------------------------------------
// Phases

/// One upstream, reached directly, through the relay and through its sidecar.
struct Paths {
    upstream: &'static str,
    /// Per path (see [`PATHS`]).
    endpoints: [Endpoint; 3],
    /// What each path's CPU is: client + upstream, the relay, the sidecar.
    meters: [CpuMeter; 3],
}

async fn metadata_phase(
    settings: &Settings,
    client: &HttpClient,
    paths: &Paths,
) -> Result<MetadataFigures> {
    let upstream = paths.upstream;
    eprintln!(
        "[{upstream}] metadata: warm-up, then {} req/s for {:?} per path in {} blocks per path",
        settings.rate,
        settings.per_path(),
        settings.blocks
    );
    for endpoint in &paths.endpoints {
        for _ in 0..settings.warmup {
            let (_, body) = get_metadata(client, endpoint.metadata())
                .await
                .with_context(|| format!("warm-up GET via {}", endpoint.label))?;
            check_bucket_field(&body, endpoint.bucket)?;
        }
    }
    let mut runs: [PathRun; 3] = Default::default();
    for block in 0..settings.blocks as usize {
        // The order turns each block, so that no path always follows the same one.
        for turn in 0..PATHS.len() {
            let index = (block + turn) % PATHS.len();
            let (endpoint, meter, run) = (
                &paths.endpoints[index],
                &paths.meters[index],
                &mut runs[index],
            );
            let before = meter.read();
            let first = run.samples.len();
            open_loop(
                client,
                endpoint,
                settings.rate,
                settings.block,
                &mut run.samples,
                &mut run.errors,
            )
            .await;
            run.cpu_ns += meter.read().saturating_sub(before);
            let block = Latencies::new(run.samples[first..].to_vec(), Vec::new(), Vec::new());
            run.block_p99.push(block.percentile(99.0));
        }
    }
    let cpu_ns = [runs[0].cpu_ns, runs[1].cpu_ns, runs[2].cpu_ns];
    Ok(MetadataFigures {
        upstream,
        latencies: runs.map(PathRun::into_latencies),
        cpu_ns,
    })
}

/// What one path (direct or proxied) collects over the blocks.
#[derive(Default)]
struct PathRun {
    samples: Vec<Duration>,
    errors: Vec<String>,
    cpu_ns: u64,
    block_p99: Vec<Duration>,
}

impl PathRun {
    fn into_latencies(self) -> Latencies {
        Latencies::new(self.samples, self.errors, self.block_p99)
    }
}

async fn streaming_phase(
    settings: &Settings,
    client: &HttpClient,
    paths: &Paths,
    size: u64,
    chunk: &Bytes,
) -> Result<Vec<StreamFigures>> {
    let upstream = paths.upstream;
    let mut out = Vec::new();
    for direction in [Direction::Upload, Direction::Download] {
        eprintln!(
            "[{upstream}] streaming: {} of {} MiB, {} repetition(s) per path",
            direction.as_str(),
            size / MIB,
            settings.reps
        );
        let mut figures = StreamFigures {
            upstream,
            size,
            direction,
            rates: Default::default(),
            cpu_ns: [0; 3],
        };
        for rep in 0..settings.reps as usize {
            for turn in 0..PATHS.len() {
                let index = (rep + turn) % PATHS.len();
                let (endpoint, meter) = (&paths.endpoints[index], &paths.meters[index]);
                let before = meter.read();
                let elapsed = match direction {
                    Direction::Upload => upload(client, endpoint, "big", size, chunk).await?,
                    Direction::Download => download(client, endpoint, "big", size).await?,
                };
                figures.cpu_ns[index] += meter.read().saturating_sub(before);
                let rate = mib_per_s(size, elapsed);
                eprintln!(
                    "  {} {}: {rate:.0} MiB/s ({elapsed:.2?})",
                    direction.as_str(),
                    endpoint.label
                );
                figures.rates[index].push(rate);
            }
        }
        out.push(figures);
    }
    Ok(out)
}

async fn memory_phase(
    settings: &Settings,
    client: &HttpClient,
    upstream: SocketAddr,
    dir: &Path,
    chunk: &Bytes,
) -> Result<MemoryFigures> {
    let (mut sidecar, addr) = start_sidecar(client, upstream, dir, "memory", Launch::Plain).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle_rss_kib, _) = memory_kib(sidecar.pid())?;
    let direct = Endpoint {
        label: "direct",
        addr: upstream,
        bucket: PHYSICAL,
    };
    let via = Endpoint {
        label: "sidecar",
        addr,
        bucket: LOGICAL,
    };
    let mut rows = Vec::new();
    for direction in [Direction::Download, Direction::Upload] {
        eprintln!(
            "[memory] {} concurrent {}s of {} MiB each, direct then via a fresh sidecar",
            settings.streams,
            direction.as_str(),
            settings.stream_size / MIB
        );
        let total = settings.stream_size * settings.streams as u64;
        let direct_time = concurrent(
            client,
            &direct,
            direction,
            settings.streams,
            settings.stream_size,
            chunk,
        )
        .await?;
        let via_time = concurrent(
            client,
            &via,
            direction,
            settings.streams,
            settings.stream_size,
            chunk,
        )
        .await?;
        sidecar.check_running()?;
        let (_, hwm) = memory_kib(sidecar.pid())?;
        rows.push(MemoryRow {
            direction,
            direct: mib_per_s(total, direct_time),
            via: mib_per_s(total, via_time),
            hwm_after_kib: hwm,
        });
    }
    Ok(MemoryFigures { idle_rss_kib, rows })
}

/// Metadata requests counted per path under callgrind (after a warm-up).
const COUNTED_REQUESTS: u64 = 2000;

/// Instructions per proxied metadata request, relay and sidecar.
struct InstructionFigures {
    relay: u64,
    sidecar: u64,
}

/// Counts the instructions the relay and the sidecar execute per metadata
/// request (sequential GETs through each, in front of the in-process
/// upstream), with callgrind. Unlike times, these counts do not move with
/// whatever else the machine runs, so they show changes in the proxy's own
/// work exactly.
async fn instructions_phase(
    client: &HttpClient,
    upstream: SocketAddr,
    dir: &Path,
) -> Result<InstructionFigures> {
    let out = dir.join("callgrind-relay.out");
    let (relay, addr) =
        start_relay(client, upstream, dir, "callgrind", Launch::Callgrind(&out)).await?;
    let relay = count_instructions(client, relay, addr, PHYSICAL, &out).await?;
    let out = dir.join("callgrind-sidecar.out");
    let (sidecar, addr) =
        start_sidecar(client, upstream, dir, "callgrind", Launch::Callgrind(&out)).await?;
    let sidecar = count_instructions(client, sidecar, addr, LOGICAL, &out).await?;
    Ok(InstructionFigures { relay, sidecar })
}

/// Instructions per metadata GET of `proc`, a proxy at `addr` running under
/// callgrind (counts in `out`), reaching the object through `bucket`.
async fn count_instructions(
    client: &HttpClient,
    mut proc: Proc,
    addr: SocketAddr,
    bucket: &'static str,
    out: &Path,
) -> Result<u64> {
    eprintln!(
        "[instructions] {COUNTED_REQUESTS} metadata GETs via {} under callgrind",
        proc.name
    );
    let endpoint = Endpoint {
        label: proc.name,
        addr,
        bucket,
    };
    for _ in 0..200 {
        get_metadata(client, endpoint.metadata()).await?;
    }
    callgrind_control(&["-z", &proc.pid().to_string()])?;
    for i in 0..COUNTED_REQUESTS {
        let (_, body) = get_metadata(client, endpoint.metadata()).await?;
        if i == 0 {
            check_bucket_field(&body, endpoint.bucket)?;
        }
    }
    callgrind_control(&["-d", &proc.pid().to_string()])?;
    proc.check_running()?;
    let dump = PathBuf::from(format!("{}.1", out.display()));
    let text = std::fs::read_to_string(&dump)
        .with_context(|| format!("cannot read the callgrind dump {}", dump.display()))?;
    let total: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("summary:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| anyhow!("no summary line in {}", dump.display()))?;
    Ok(total / COUNTED_REQUESTS)
}

fn callgrind_control(args: &[&str]) -> Result<()> {
    let out = Command::new("callgrind_control")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run callgrind_control")?;
    if !out.status.success() {
        bail!(
            "callgrind_control {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Whether valgrind's callgrind can be used here.
fn callgrind_available() -> bool {
    command_output("valgrind", &["--version"]).is_some()
        && command_output("callgrind_control", &["--version"]).is_some()
}

// ---------------------------------------------------------------------------
// gRPC: google.storage.v2 over h2c, the in-repo mock GCS direct and via the sidecar

/// The generated `google.storage.v2.Storage` client over a plain hyper h2c
/// client (no tonic `Channel`: nothing between the call and the wire but
/// what any gRPC client does).
type GrpcClient = StorageClient<Client<HttpConnector, tonic::body::Body>>;
/// Bytes per WriteObject data message and per mock read chunk.
const GRPC_CHUNK: usize = 2 * MIB as usize;
/// Unary calls per block; the blocks alternate between the paths.
const GRPC_BLOCK: u32 = 100;

fn grpc_client(addr: SocketAddr) -> Result<GrpcClient> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let transport = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    let origin: Uri = format!("http://{addr}").parse()?;
    Ok(StorageClient::with_origin(transport, origin)
        .max_decoding_message_size(4 * GRPC_CHUNK)
        .max_encoding_message_size(4 * GRPC_CHUNK))
}

/// `message` with the routing header Google's clients send for `bucket`.
fn routed<T>(message: T, bucket: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = format!("bucket=projects%2F_%2Fbuckets%2F{bucket}").parse() {
        request
            .metadata_mut()
            .insert("x-goog-request-params", value);
    }
    request
}

fn grpc_bucket(bucket: &str) -> String {
    format!("projects/_/buckets/{bucket}")
}

/// The mock GCS on its own thread and single-threaded runtime (as the HTTP
/// upstream), holding the physical bucket, object `x` (595 bytes) and
/// object `big` (`size` bytes). Serves until the bench exits.
fn start_mock_gcs(size: u64, chunk: &Bytes) -> Result<SocketAddr> {
    let mut data = Vec::with_capacity(usize::try_from(size)?);
    while (data.len() as u64) < size {
        data.extend_from_slice(chunk);
    }
    data.truncate(usize::try_from(size)?);
    let (tx, rx) = std::sync::mpsc::channel::<Result<SocketAddr>>();
    std::thread::Builder::new()
        .name("bench-mock-gcs".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("mock GCS runtime");
            runtime.block_on(async move {
                let started = async {
                    let mock = MockGcs::start().await?;
                    let handle = mock.handle();
                    let bucket = proto::Bucket {
                        bucket_id: PHYSICAL.to_owned(),
                        ..Default::default()
                    };
                    handle.insert_bucket("bench", bucket)?;
                    handle.put_object_data(PHYSICAL, "x", vec![b'x'; 595])?;
                    handle.put_object_data(PHYSICAL, "big", data)?;
                    anyhow::Ok(mock)
                };
                match started.await {
                    Ok(mock) => {
                        let _ = tx.send(Ok(mock.addr()));
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })
        .context("cannot start the mock GCS thread")?;
    rx.recv()
        .context("the mock GCS thread ended before it started")?
}

/// Starts the sidecar with its gRPC upstream the mock at `mock` (the HTTP
/// upstream is the in-process one, unused here).
async fn start_grpc_sidecar(
    client: &HttpClient,
    upstream: SocketAddr,
    mock: SocketAddr,
    dir: &Path,
    allow_physical: bool,
) -> Result<(Proc, SocketAddr)> {
    let log = dir.join("sidecar-grpc");
    start_on_free_port(
        client,
        "bucketmap-sidecar",
        "/_bucketmap/readyz",
        &log,
        |addr| {
            let mut cmd = Command::new(sidecar_bin());
            if allow_physical {
                cmd.arg("--allow-physical-names");
            }
            cmd.args(["--listen", &addr.to_string()])
                .args(["--upstream", &format!("http://{upstream}")])
                .args(["--grpc-upstream", &format!("http://{mock}")])
                .arg("--no-auth")
                .args(["--map", &format!("{LOGICAL}={PHYSICAL}")])
                .env("RUST_LOG", "info")
                .env("NO_COLOR", "1");
            cmd
        },
    )
    .await
}

/// One unary GetObject of `x`: its latency, after checking the answer
/// names `bucket` (so the sidecar's answers really were rewritten).
async fn grpc_get(client: &mut GrpcClient, bucket: &str) -> Result<Duration> {
    let request = proto::GetObjectRequest {
        bucket: grpc_bucket(bucket),
        object: "x".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let object = tokio::time::timeout(METADATA_TIMEOUT, client.get_object(routed(request, bucket)))
        .await
        .map_err(|_| anyhow!("GetObject timed out after {METADATA_TIMEOUT:?}"))??
        .into_inner();
    let elapsed = started.elapsed();
    if object.bucket != grpc_bucket(bucket) || object.size != 595 {
        bail!(
            "GetObject answered {} ({} bytes)",
            object.bucket,
            object.size
        );
    }
    Ok(elapsed)
}

/// One ReadObject of `big`, every byte counted; the time to the last one.
async fn grpc_read(client: &mut GrpcClient, bucket: &str, size: u64) -> Result<Duration> {
    let request = proto::ReadObjectRequest {
        bucket: grpc_bucket(bucket),
        object: "big".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let work = async {
        let mut stream = client
            .read_object(routed(request, bucket))
            .await?
            .into_inner();
        let mut received = 0u64;
        while let Some(message) = stream.message().await? {
            if let Some(data) = message.checksummed_data {
                received += data.content.len() as u64;
            }
        }
        anyhow::Ok(received)
    };
    let received = tokio::time::timeout(STREAM_TIMEOUT, work)
        .await
        .map_err(|_| anyhow!("ReadObject timed out after {STREAM_TIMEOUT:?}"))??;
    if received != size {
        bail!("ReadObject got {received} bytes, expected {size}");
    }
    Ok(started.elapsed())
}

/// One WriteObject of `size` bytes in 2 MiB messages, generated as the
/// transport asks for them; the time to the answer.
async fn grpc_write(
    client: &mut GrpcClient,
    bucket: &str,
    size: u64,
    chunk: &Bytes,
) -> Result<Duration> {
    use proto::write_object_request::{Data, FirstMessage};
    let spec = proto::WriteObjectSpec {
        resource: Some(proto::Object {
            name: "written".into(),
            bucket: grpc_bucket(bucket),
            ..Default::default()
        }),
        object_size: i64::try_from(size).ok(),
        ..Default::default()
    };
    let message: Vec<u8> = chunk.iter().copied().cycle().take(GRPC_CHUNK).collect();
    let count = size.div_ceil(GRPC_CHUNK as u64);
    let messages = futures::stream::iter((0..count).map(move |i| {
        let offset = i * GRPC_CHUNK as u64;
        let len = (size - offset).min(GRPC_CHUNK as u64) as usize;
        proto::WriteObjectRequest {
            write_offset: offset as i64,
            first_message: (i == 0).then(|| FirstMessage::WriteObjectSpec(spec.clone())),
            data: Some(Data::ChecksummedData(proto::ChecksummedData {
                content: message[..len].to_vec(),
                crc32c: None,
            })),
            finish_write: i + 1 == count,
            ..Default::default()
        }
    }));
    let started = Instant::now();
    let response = tokio::time::timeout(
        STREAM_TIMEOUT,
        client.write_object(routed(messages, bucket)),
    )
    .await
    .map_err(|_| anyhow!("WriteObject timed out after {STREAM_TIMEOUT:?}"))??
    .into_inner();
    let elapsed = started.elapsed();
    match response.write_status {
        Some(proto::write_object_response::WriteStatus::Resource(object))
            if object.size as u64 == size && object.bucket == grpc_bucket(bucket) =>
        {
            Ok(elapsed)
        }
        other => bail!("WriteObject answered {other:?}"),
    }
}

/// The gRPC figures: direct to the mock GCS, and via the sidecar.
struct GrpcFigures {
    calls: u32,
    size: u64,
    /// Unary GetObject latency, direct and via the sidecar.
    latencies: [Latencies; 2],
    /// MiB/s per repetition, direct and via the sidecar, per direction.
    rates: Vec<(Direction, [Vec<f64>; 2])>,
    idle_rss_kib: u64,
    hwm_kib: u64,
    /// The sidecar was sent physical names (`BUCKETMAP_BENCH_GRPC_PHYSICAL`).
    physical: bool,
}

/// GetObject latency and ReadObject / WriteObject throughput, direct to
/// the mock GCS and via a sidecar of its own, the paths taking turns.
async fn grpc_phase(
    settings: &Settings,
    client: &HttpClient,
    upstream: SocketAddr,
    dir: &Path,
    chunk: &Bytes,
) -> Result<GrpcFigures> {
    let size = settings.grpc_big;
    let mock = start_mock_gcs(size, chunk)?;
    let physical = std::env::var_os("BUCKETMAP_BENCH_GRPC_PHYSICAL").is_some_and(|v| v != "0");
    let (mut sidecar, sidecar_addr) =
        start_grpc_sidecar(client, upstream, mock, dir, physical).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle_rss_kib, _) = memory_kib(sidecar.pid())?;
    let mut paths = [
        (grpc_client(mock)?, PHYSICAL),
        (
            grpc_client(sidecar_addr)?,
            if physical { PHYSICAL } else { LOGICAL },
        ),
    ];
    eprintln!(
        "[grpc] GetObject: {} calls per path in blocks of {GRPC_BLOCK}, closed loop",
        settings.grpc_calls
    );
    for (client, bucket) in &mut paths {
        for _ in 0..GRPC_BLOCK {
            grpc_get(client, bucket).await?;
        }
    }
    let mut samples: [Vec<Duration>; 2] = Default::default();
    for block in 0..settings.grpc_calls.div_ceil(GRPC_BLOCK) as usize {
        for turn in 0..2 {
            let index = (block + turn) % 2;
            let (client, bucket) = &mut paths[index];
            for _ in 0..GRPC_BLOCK {
                samples[index].push(grpc_get(client, bucket).await?);
            }
        }
    }
    let latencies = samples.map(|s| Latencies::new(s, Vec::new(), Vec::new()));
    let mut rates = Vec::new();
    for direction in [Direction::Upload, Direction::Download] {
        let what = match direction {
            Direction::Upload => "WriteObject",
            Direction::Download => "ReadObject",
        };
        eprintln!(
            "[grpc] {what} of {} MiB, {} repetition(s) per path",
            size / MIB,
            settings.reps
        );
        let mut per_path: [Vec<f64>; 2] = Default::default();
        for rep in 0..settings.reps as usize {
            for turn in 0..2 {
                let index = (rep + turn) % 2;
                let (client, bucket) = &mut paths[index];
                let elapsed = match direction {
                    Direction::Upload => grpc_write(client, bucket, size, chunk).await?,
                    Direction::Download => grpc_read(client, bucket, size).await?,
                };
                let rate = mib_per_s(size, elapsed);
                eprintln!(
                    "  {what} {}: {rate:.0} MiB/s ({elapsed:.2?})",
                    ["direct", "sidecar"][index]
                );
                per_path[index].push(rate);
            }
        }
        rates.push((direction, per_path));
    }
    sidecar.check_running()?;
    let (_, hwm_kib) = memory_kib(sidecar.pid())?;
    Ok(GrpcFigures {
        calls: settings.grpc_calls.div_ceil(GRPC_BLOCK) * GRPC_BLOCK,
        size,
        latencies,
        rates,
        idle_rss_kib,
        hwm_kib,
        physical,
    })
}

impl GrpcFigures {
    fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n### gRPC (google.storage.v2 over h2c, the in-repo mock GCS)\n\nThe mock runs in the bench process on its own thread; the client is the generated tonic client over hyper h2c. Unary `GetObject` of a 595-byte object: {} sequential calls per path (closed loop) in blocks of {GRPC_BLOCK}, the paths taking turns. `WriteObject` (2 MiB messages) and `ReadObject` (the mock's 2 MiB chunks) of {} MiB: median MiB/s (range) of the repetitions. Ratios are via the sidecar against direct.\n",
            self.calls,
            self.size / MIB
        );
        if self.physical {
            let _ = writeln!(
                out,
                "Via the sidecar with `--allow-physical-names`, physical names: no name was rewritten.\n"
            );
        }
        let _ = writeln!(out, "| GetObject | p50 | p90 | p99 | max |");
        let _ = writeln!(out, "|---|---|---|---|---|");
        let [direct, via] = &self.latencies;
        for (label, lat) in [("direct", direct), ("via sidecar", via)] {
            let mut row = format!("| {label} |");
            for p in [50.0, 90.0, 99.0] {
                let value = lat.percentile(p);
                let _ = write!(row, " {}", fmt_duration(value));
                if std::ptr::eq(lat, via) {
                    let base = direct.percentile(p);
                    let _ = write!(
                        row,
                        " ({:.2}×, {})",
                        ratio(value.as_secs_f64(), base.as_secs_f64()),
                        fmt_added(value, base)
                    );
                }
                row.push_str(" |");
            }
            let _ = writeln!(out, "{row} {} |", fmt_duration(lat.max()));
        }
        let _ = writeln!(
            out,
            "\n| transfer | direct | via sidecar | ratio | target ≥ {:.0} % |",
            TARGET_THROUGHPUT_RATIO * 100.0
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for (direction, rates) in &self.rates {
            let what = match direction {
                Direction::Upload => "WriteObject",
                Direction::Download => "ReadObject",
            };
            let cell = |values: &[f64]| {
                let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = values.iter().copied().fold(0.0, f64::max);
                if values.len() > 1 {
                    format!("{:.0} MiB/s ({lo:.0}–{hi:.0})", median(values))
                } else {
                    format!("{:.0} MiB/s", median(values))
                }
            };
            let r = ratio(median(&rates[1]), median(&rates[0]));
            let _ = writeln!(
                out,
                "| {what} {} MiB | {} | {} | {:.1} % | {} |",
                self.size / MIB,
                cell(&rates[0]),
                cell(&rates[1]),
                r * 100.0,
                verdict(r >= TARGET_THROUGHPUT_RATIO)
            );
        }
        let _ = writeln!(
            out,
            "\nThe gRPC sidecar's RSS: {} idle, peak (`VmHWM`) {} after all of the above.",
            mib(self.idle_rss_kib),
            mib(self.hwm_kib)
        );
    }
}

// ---------------------------------------------------------------------------
// Report

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

struct Report {
    settings: Settings,
    date: String,
    commit: String,
    cores: usize,
    load_before: String,
    load_after: String,
    elapsed: Duration,
    metadata: Vec<MetadataFigures>,
    streams: Vec<StreamFigures>,
    memory: Option<MemoryFigures>,
    instructions: Option<InstructionFigures>,
    grpc: Option<GrpcFigures>,
    main_sidecar_hwm_kib: Option<u64>,
    notes: Vec<String>,
}

impl Report {
    fn render(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(out, "## bucketmap-sidecar benchmark\n");
        let _ = writeln!(
            out,
            "{}, commit {}, {} cores, load average {} before / {} after, {:.0?} in all.\n",
            self.date, self.commit, self.cores, self.load_before, self.load_after, self.elapsed
        );

        if !self.metadata.is_empty() {
            let _ = writeln!(
                out,
                "### Metadata latency\n\n`GET /storage/v1/b/B/o/x` (JSON object resource), open loop at {} req/s, {:?} per path in {} blocks of {:?}, the three paths taking turns. Ratios are against direct. Added latency is a path's percentile minus the direct one; \"median block p99\" compares the median of the blocks' p99s, which one stall of the machine sways less. The TCP relay is the floor of any user-space proxy here (one more process and two more sockets, no HTTP): \"sidecar beyond relay\" is what the sidecar's own work adds. CPU per request is the client's plus the upstream's (direct), the relay's or the sidecar's, each during its own blocks.\n",
                s.rate,
                s.per_path(),
                s.blocks as usize * PATHS.len(),
                s.block
            );
            let _ = writeln!(
                out,
                "| upstream | path | requests | errors | p50 | p90 | p99 | p99.9 | max |"
            );
            let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
            for m in &self.metadata {
                let direct = &m.latencies[DIRECT];
                for (label, lat) in PATHS.iter().zip(&m.latencies) {
                    let mut row = format!(
                        "| {} | {label} | {} | {} |",
                        m.upstream,
                        lat.sorted.len(),
                        lat.errors.len()
                    );
                    for (_, p) in PERCENTILES {
                        let value = lat.percentile(p);
                        if std::ptr::eq(lat, direct) {
                            let _ = write!(row, " {} |", fmt_duration(value));
                        } else {
                            let base = direct.percentile(p);
                            let _ = write!(
                                row,
                                " {} ({:.2}×) |",
                                fmt_duration(value),
                                ratio(value.as_secs_f64(), base.as_secs_f64())
                            );
                        }
                    }
                    let _ = write!(row, " {} |", fmt_duration(lat.max()));
                    let _ = writeln!(out, "{row}");
                }
            }
            let _ = writeln!(
                out,
                "\n| upstream | relay added p50 | sidecar added p50 | target ≤ {} | sidecar beyond relay p50 | relay added p99 | sidecar added p99 | target ≤ {} | sidecar added median block p99 | CPU per request: client + upstream / relay / sidecar |",
                fmt_duration(TARGET_ADDED_P50),
                fmt_duration(TARGET_ADDED_P99)
            );
            let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
            for m in &self.metadata {
                let [direct, relay, via] = &m.latencies;
                let p = |lat: &Latencies, q: f64| lat.percentile(q);
                let ok = m.latencies.iter().all(|l| l.errors.is_empty());
                let cpu_us: Vec<String> = m
                    .cpu_ns
                    .iter()
                    .zip(&m.latencies)
                    .map(|(ns, lat)| {
                        let count = (lat.sorted.len() + lat.errors.len()).max(1);
                        format!("{:.0}", *ns as f64 / 1000.0 / count as f64)
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} µs |",
                    m.upstream,
                    fmt_added(p(relay, 50.0), p(direct, 50.0)),
                    fmt_added(p(via, 50.0), p(direct, 50.0)),
                    verdict(ok && p(via, 50.0).saturating_sub(p(direct, 50.0)) <= TARGET_ADDED_P50),
                    fmt_added(p(via, 50.0), p(relay, 50.0)),
                    fmt_added(p(relay, 99.0), p(direct, 99.0)),
                    fmt_added(p(via, 99.0), p(direct, 99.0)),
                    verdict(ok && p(via, 99.0).saturating_sub(p(direct, 99.0)) <= TARGET_ADDED_P99),
                    fmt_added(via.median_block_p99(), direct.median_block_p99()),
                    cpu_us.join(" / "),
                );
            }
            for m in &self.metadata {
                for (label, lat) in PATHS.iter().zip(&m.latencies) {
                    if let Some(first) = lat.errors.first() {
                        let _ = writeln!(
                            out,
                            "\n{} {label}: {} errors, first: {first}",
                            m.upstream,
                            lat.errors.len()
                        );
                    }
                }
            }
        }

        if !self.streams.is_empty() {
            let _ = writeln!(
                out,
                "\n### Streaming throughput\n\nOne `POST /upload/storage/v1/b/B/o?uploadType=media&name=big` and one `GET /storage/v1/b/B/o/big?alt=media`, {} repetition(s) per path, the paths taking turns; median MiB/s (range) and the ratio to direct. The relay's ratio is the ceiling of a user-space proxy copying bytes on this machine. CPU per GiB moved is the client's plus the upstream's (direct), the relay's or the sidecar's.\n",
                s.reps
            );
            let _ = writeln!(
                out,
                "| upstream | transfer | direct | via TCP relay | via sidecar | target ≥ {:.0} % | sidecar vs relay | CPU per GiB: client + upstream / relay / sidecar |",
                TARGET_THROUGHPUT_RATIO * 100.0
            );
            let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
            for f in &self.streams {
                let range = |values: &[f64]| {
                    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = values.iter().copied().fold(0.0, f64::max);
                    if values.len() > 1 {
                        format!(" ({lo:.0}–{hi:.0})")
                    } else {
                        String::new()
                    }
                };
                let medians = [0, 1, 2].map(|i| median(&f.rates[i]));
                let cell = |i: usize| {
                    let mut text = format!("{:.0} MiB/s{}", medians[i], range(&f.rates[i]));
                    if i != DIRECT {
                        let _ = write!(
                            text,
                            ", {:.1} %",
                            ratio(medians[i], medians[DIRECT]) * 100.0
                        );
                    }
                    text
                };
                let cpu_ms: Vec<String> = (0..PATHS.len())
                    .map(|i| {
                        let gib = (f.size * f.rates[i].len() as u64) as f64 / (1u64 << 30) as f64;
                        format!("{:.0}", f.cpu_ns[i] as f64 / 1e6 / gib)
                    })
                    .collect();
                let r = ratio(medians[SIDECAR], medians[DIRECT]);
                let _ = writeln!(
                    out,
                    "| {} | {} {} MiB | {} | {} | {} | {} | {:.1} % | {} ms |",
                    f.upstream,
                    f.direction.as_str(),
                    f.size / MIB,
                    cell(DIRECT),
                    cell(RELAY),
                    cell(SIDECAR),
                    verdict(r >= TARGET_THROUGHPUT_RATIO),
                    ratio(medians[SIDECAR], medians[RELAY]) * 100.0,
                    cpu_ms.join(" / "),
                );
            }
        }

        if let Some(m) = &self.memory {
            let _ = writeln!(
                out,
                "\n### Sidecar memory under {} concurrent streams\n\nA fresh sidecar in front of the in-process upstream: idle RSS after start, then {} concurrent downloads, then {} concurrent uploads, {} MiB each, one connection per stream. Peak RSS is `VmHWM` (peak since start) read after each batch; the direct run of each batch goes first, for the throughput baseline.\n",
                s.streams,
                s.streams,
                s.streams,
                s.stream_size / MIB
            );
            let _ = writeln!(
                out,
                "| batch | direct aggregate | via sidecar aggregate | ratio | sidecar peak RSS | vs idle RSS ({}) | target ≤ {} |",
                mib(m.idle_rss_kib),
                mib(TARGET_PEAK_RSS_KIB)
            );
            let _ = writeln!(out, "|---|---|---|---|---|---|---|");
            for row in &m.rows {
                let _ = writeln!(
                    out,
                    "| {} × {} | {:.0} MiB/s | {:.0} MiB/s | {:.1} % | {} | {:.2}× | {} |",
                    s.streams,
                    row.direction.as_str(),
                    row.direct,
                    row.via,
                    ratio(row.via, row.direct) * 100.0,
                    mib(row.hwm_after_kib),
                    ratio(row.hwm_after_kib as f64, m.idle_rss_kib as f64),
                    verdict(row.hwm_after_kib <= TARGET_PEAK_RSS_KIB),
                );
            }
        }
        if let Some(counts) = &self.instructions {
            let _ = writeln!(
                out,
                "\n### Instructions per metadata request\n\nCounted by callgrind over {COUNTED_REQUESTS} sequential `GET /storage/v1/b/B/o/x` through each proxy (in front of the in-process upstream, after a warm-up): every instruction of the process, runtime and libc included, the kernel's excluded. These counts do not depend on the machine's load.\n"
            );
            let _ = writeln!(out, "| path | instructions per request | vs relay |");
            let _ = writeln!(out, "|---|---|---|");
            let _ = writeln!(out, "| via TCP relay | {} | 1.00× |", counts.relay);
            let _ = writeln!(
                out,
                "| via sidecar | {} | {:.2}× |",
                counts.sidecar,
                ratio(counts.sidecar as f64, counts.relay as f64)
            );
        }
        if let Some(grpc) = &self.grpc {
            grpc.render(&mut out);
        }
        if let Some(hwm) = self.main_sidecar_hwm_kib {
            let _ = writeln!(
                out,
                "\nPeak RSS of the sidecar that served the latency and single-stream runs (in-process upstream): {}.",
                mib(hwm)
            );
        }
        for note in &self.notes {
            let _ = writeln!(out, "\nNote: {note}");
        }
        out
    }
}

// ---------------------------------------------------------------------------

/// An upstream for the latency and single-stream runs.
struct Upstream {
    name: &'static str,
    addr: SocketAddr,
    /// When it is another process.
    pid: Option<u32>,
    /// Size of the single-stream transfers.
    size: u64,
}

/// The latency and single-stream runs against one upstream, through a
/// sidecar of their own; returns that sidecar's peak RSS in KiB.
async fn upstream_runs(
    settings: &Settings,
    client: &HttpClient,
    upstream: Upstream,
    dir: &Path,
    chunk: &Bytes,
    report: &mut Report,
) -> Result<u64> {
    let (mut sidecar, sidecar_addr) =
        start_sidecar(client, upstream.addr, dir, upstream.name, Launch::Plain).await?;
    let (mut relay, relay_addr) =
        start_relay(client, upstream.addr, dir, upstream.name, Launch::Plain).await?;
    let paths = Paths {
        upstream: upstream.name,
        endpoints: [
            Endpoint {
                label: "direct",
                addr: upstream.addr,
                bucket: PHYSICAL,
            },
            Endpoint {
                label: "relay",
                addr: relay_addr,
                bucket: PHYSICAL,
            },
            Endpoint {
                label: "sidecar",
                addr: sidecar_addr,
                bucket: LOGICAL,
            },
        ],
        meters: [
            CpuMeter::of(upstream.pid.as_slice(), true),
            CpuMeter::of(&[relay.pid()], false),
            CpuMeter::of(&[sidecar.pid()], false),
        ],
    };
    if settings.latency {
        report
            .metadata
            .push(metadata_phase(settings, client, &paths).await?);
    }
    if settings.streaming {
        report
            .streams
            .extend(streaming_phase(settings, client, &paths, upstream.size, chunk).await?);
    }
    relay.check_running()?;
    sidecar.check_running()?;
    Ok(memory_kib(sidecar.pid())?.1)
}

async fn run(settings: Settings, fake_bin: Result<PathBuf>, dir: &Path) -> Result<Report> {
    let started = Instant::now();
    let client = new_client();
    let chunk = pattern_chunk();
    let mut report = Report {
        settings,
        date: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "?".into()),
        commit: {
            let head = command_output("git", &["rev-parse", "--short", "HEAD"])
                .unwrap_or_else(|| "?".into());
            let dirty = command_output("git", &["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{head} (with uncommitted changes)")
            } else {
                head
            }
        },
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_before: loadavg(),
        load_after: String::new(),
        elapsed: Duration::ZERO,
        metadata: Vec::new(),
        streams: Vec::new(),
        memory: None,
        instructions: None,
        grpc: None,
        main_sidecar_hwm_kib: None,
        notes: Vec::new(),
    };
    eprintln!("sidecar binary: {}", sidecar_bin().display());

    // In-process upstream.
    let upstream = start_in_process_upstream(&settings, &chunk)?;
    if settings.latency || settings.streaming {
        let target = Upstream {
            name: "in-process",
            addr: upstream,
            pid: None,
            size: settings.big,
        };
        let hwm = upstream_runs(&settings, &client, target, dir, &chunk, &mut report).await?;
        report.main_sidecar_hwm_kib = Some(hwm);
    }

    // fake-gcs-server.
    if settings.latency || settings.streaming {
        match fake_bin {
            Ok(bin) => {
                let (mut fake, fake_addr) = start_fake_gcs(&client, &bin, dir).await?;
                let target = Upstream {
                    name: "fake-gcs-server",
                    addr: fake_addr,
                    pid: Some(fake.pid()),
                    size: settings.fake_big,
                };
                upstream_runs(&settings, &client, target, dir, &chunk, &mut report).await?;
                fake.check_running()?;
            }
            Err(e) => report.notes.push(format!(
                "fake-gcs-server unavailable, its figures are missing: {e:#}"
            )),
        }
    }

    // Memory under concurrent streams.
    if settings.memory {
        report.memory = Some(memory_phase(&settings, &client, upstream, dir, &chunk).await?);
    }

    // Instruction counts.
    if settings.instructions {
        if callgrind_available() {
            report.instructions = Some(instructions_phase(&client, upstream, dir).await?);
        } else {
            report.notes.push(
                "valgrind (callgrind) is not installed: no instruction counts (apt install valgrind)."
                    .into(),
            );
        }
    }

    // gRPC, direct to the mock GCS and via the sidecar.
    if settings.grpc {
        match grpc_phase(&settings, &client, upstream, dir, &chunk).await {
            Ok(figures) => report.grpc = Some(figures),
            Err(e) => report.notes.push(format!(
                "the gRPC phase failed, its figures are missing: {e:#}"
            )),
        }
    }

    report.load_after = loadavg();
    report.elapsed = started.elapsed();
    Ok(report)
}

fn main() -> std::process::ExitCode {
    if let Ok(spec) = std::env::var(RELAY_ENV) {
        return relay_main(&spec);
    }
    // `cargo bench` passes `--bench`; this harness takes no arguments.
    let settings = Settings::from_env();
    let fake_bin = fake_gcs_server_bin();
    let dir = match tempfile::Builder::new()
        .prefix("bucketmap-bench-")
        .tempdir()
    {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("bench: cannot create a temporary directory: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("bench runtime");
    match runtime.block_on(run(settings, fake_bin, dir.path())) {
        Ok(report) => {
            println!("{}", report.render());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
