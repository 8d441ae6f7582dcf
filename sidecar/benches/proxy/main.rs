//! Benchmark of `bucketmap-sidecar` against what a user would run instead:
//! the same requests sent straight to an upstream, through a plain TCP
//! relay (the floor), through nginx (plain, and rewriting bucket names as
//! the sidecar does) and through the sidecar as the image ships it (built
//! first by `tools/pgo/build.sh`: the `dist-sidecar` profile, optimised
//! with the profile of its training run), in one run, every figure
//! printed next to its ratio to direct and to nginx-rewrite.
//! It is not a test: the targets (issue 12) are reported (met / MISSED),
//! never asserted.
//!
//! ```sh
//! cargo bench -p bucketmap-sidecar --bench proxy
//! BUCKETMAP_BENCH_QUICK=1 cargo bench -p bucketmap-sidecar --bench proxy   # smoke run, small sizes
//! BUCKETMAP_BENCH_SIDECAR_BIN=/path/to/bucketmap-sidecar cargo bench ...    # another build
//! BUCKETMAP_BENCH_SIDECAR_BIN=bench cargo bench ...    # cargo's bench build (unwinds on a panic)
//! BUCKETMAP_BENCH_SIDECAR_BIN_B=/path/to/bucketmap-sidecar cargo bench ...  # another second build (default: cargo build --release; `none`)
//! NGINX_BIN=/usr/sbin/nginx cargo bench ...    # another nginx than tools/nginx/install.sh's
//! BUCKETMAP_BENCH_PHASES=memory cargo bench ...    # some of latency,rps,streaming,memory,instructions,grpc,tls
//! BUCKETMAP_BENCH_PHASES=train cargo bench ...     # the training run of the profile (tools/pgo/train.sh)
//! BUCKETMAP_SIDECAR_WORKER_THREADS=2 cargo bench ...    # the sidecar on two threads
//! BUCKETMAP_BENCH_ASLR=on cargo bench ...    # keep address randomisation (off by default: setarch -R)
//! ```
//!
//! Upstreams:
//! - an in-process hyper server on loopback (its own thread and
//!   single-threaded runtime) that answers as fast as it can: a canned object
//!   resource for metadata GETs, upload bodies read and discarded, download
//!   bodies generated from one shared buffer. What differs between the direct
//!   and the proxied figures is then the proxy's own cost. It is served twice:
//!   plain HTTP/1.1, and over TLS with a throwaway CA ([`tls`]) offering
//!   HTTP/2 and HTTP/1.1 by ALPN, as GCS does (the `tls` phase);
//! - fake-gcs-server (memory backend), the realistic upstream the integration
//!   tests use, from `tools/fake-gcs-server/install.sh`. Its figures are
//!   skipped, with a note, when it cannot be had.
//!
//! Paths (proxies run as child processes; the sidecar with
//! `--no-auth --map photos=photos-k3x9q2mw`; requests name the physical
//! bucket except through nginx-rewrite and the sidecar, which get the
//! logical one):
//! - direct: client to upstream (over TLS itself on the TLS upstream);
//! - TCP relay (plain upstreams): this binary again, as a child process,
//!   copying bytes between two sockets with no HTTP at all. It pays what any
//!   user-space proxy pays here (one more process, two more sockets, their
//!   wake-ups and copies), so it is the floor;
//! - TLS relay (TLS upstream): the same, but speaking TLS to the upstream
//!   (HTTP/1.1 by ALPN) while taking plaintext, as the sidecar does: the
//!   floor of any proxy in that position, TLS and copies and nothing else;
//! - HTTP relay (plain upstreams, [`hyper_relay`]): this binary forwarding
//!   each request with the sidecar's HTTP machinery (hyper server, the
//!   sidecar's upstream client, one tokio thread) and no logic: the floor of
//!   any proxy built on hyper;
//! - nginx and nginx-rewrite ([`nginx`]; Debian's nginx 1.22 from
//!   `tools/nginx/install.sh`, skipped with a note when it cannot be had);
//! - sidecar; on the TLS upstream twice, `--upstream-http 2` (one
//!   multiplexed HTTP/2 connection) and `--upstream-http 1.1` (a keep-alive
//!   pool), both trusting the CA with `--upstream-ca-file`.
//!
//! Measurements:
//! 1. metadata latency: `GET /storage/v1/b/B/o/x` (JSON, rewritten by the
//!    sidecar) at a fixed rate, open loop (requests are sent on schedule
//!    whatever the answers do), in blocks that take turns between the paths
//!    so that background load hits all alike; latency percentiles and the
//!    latency each proxy adds;
//! 2. requests per second and CPU per request, the headline: metadata GETs
//!    in closed loops at 1 and 16 connections for a fixed time, the paths
//!    taking turns, each process's CPU time as the kernel accounts it
//!    (`utime + stime`, every thread), and the sidecars' RSS afterwards;
//! 3. streaming throughput of one large `uploadType=media` upload and one
//!    `alt=media` download, the paths taking turns, median of the
//!    repetitions;
//! 4. the sidecar's memory: a fresh sidecar's idle RSS, then its peak RSS
//!    (`VmHWM`) after 64 concurrent downloads and after 64 concurrent uploads,
//!    with the aggregate throughput of those streams direct and proxied; in
//!    front of the plain upstream and of the TLS one with either HTTP version;
//! 5. instructions per metadata request through the relay, the HTTP relay
//!    (hyper, no logic: `hyper_relay.rs`), nginx-rewrite and the sidecar,
//!    and with `tls` also through the TLS relay, nginx-rewrite and the
//!    sidecar with each upstream HTTP version in front of the TLS upstream,
//!    counted by callgrind (skipped with a note without
//!    valgrind): the one figure the machine's load does not move, and the
//!    user-space work the sidecar does beyond its peer's;
//! 6. gRPC (`google.storage.v2` over h2c): the in-repo mock GCS in this
//!    process (own thread and runtime) directly and through a sidecar with
//!    `--grpc-upstream` pointing at it: unary `GetObject` latency
//!    percentiles (closed loop, the paths taking turns in blocks), one
//!    `WriteObject` and one `ReadObject` of `grpc_big` bytes per repetition
//!    and path, and that sidecar's idle and peak RSS. A sidecar without the
//!    gRPC path leaves a note instead of the figures.
//!    `BUCKETMAP_BENCH_GRPC_PHYSICAL=1` sends the physical name through a
//!    sidecar with `--allow-physical-names` (no name to rewrite).
//!
//! With the latency, requests-per-second and streaming figures goes the CPU
//! time (from `/proc/PID/task/*/schedstat`) each path cost: the client's
//! plus the upstream's for direct requests, the proxy process's otherwise
//! (nginx runs as one process, `master_process off`).
//!
//! The load client is a hyper-util pooled HTTP/1.1 client (rustls for the
//! direct TLS path) on the bench's own single-threaded runtime; latencies
//! run from the moment a request is handed to the client to the last byte
//! of the response body. The targets are judged in [`targets`].

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
use std::sync::{Arc, OnceLock};
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
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use bucketmap_testkit::mock_gcs::{MockGcs, proto};
use proto::storage_client::StorageClient;

mod bodies;
mod client;
mod figures;
mod grpc;
mod hyper_relay;
mod nginx;
mod phases;
mod procs;
mod report;
mod targets;
mod tls;
mod train;
mod upstream;

use bodies::*;
use client::*;
use figures::*;
use grpc::*;
use hyper_relay::*;
use nginx::*;
use phases::*;
use procs::*;
use report::*;
use tls::*;
use upstream::*;

pub(crate) const SIDECAR_BIN: &str = env!("CARGO_BIN_EXE_bucketmap-sidecar");
const SIDECAR_BIN_ENV: &str = "BUCKETMAP_BENCH_SIDECAR_BIN";
/// The shipped build's path, handed to the bench's re-run under `setarch`
/// (which then neither builds it again nor takes it for a build named by
/// hand).
const SHIPPED_ENV: &str = "BUCKETMAP_BENCH_SHIPPED_BIN";

/// The shipped build, when [`build_shipped_sidecar`] made it.
static SHIPPED: OnceLock<PathBuf> = OnceLock::new();

/// The sidecar under test: `BUCKETMAP_BENCH_SIDECAR_BIN` (`bench`: the one
/// cargo built for this bench), or else the shipped build.
pub(crate) fn sidecar_bin() -> PathBuf {
    match std::env::var_os(SIDECAR_BIN_ENV) {
        Some(bin) if bin == "bench" => PathBuf::from(SIDECAR_BIN),
        Some(bin) => PathBuf::from(bin),
        None => SHIPPED
            .get()
            .cloned()
            .unwrap_or_else(|| PathBuf::from(SIDECAR_BIN)),
    }
}

/// Builds the sidecar as the image ships it (`tools/pgo/build.sh`: the
/// `dist-sidecar` profile, optimised with the profile of its training
/// run), unless `BUCKETMAP_BENCH_SIDECAR_BIN` names a build: cargo's bench
/// build unwinds on a panic and has no profile, so it would measure code
/// the image does not ship (docs/BENCHMARKS.md: what the profile is
/// worth). Its path is in [`SHIPPED`].
fn build_shipped_sidecar() -> Result<()> {
    if std::env::var_os(SIDECAR_BIN_ENV).is_some() {
        return Ok(());
    }
    if let Some(built) = std::env::var_os(SHIPPED_ENV) {
        let _ = SHIPPED.set(PathBuf::from(built));
        return Ok(());
    }
    eprintln!("bench: building the shipped sidecar (tools/pgo/build.sh)");
    let root = workspace_root()?;
    let mut build = Command::new("bash");
    for name in bucketmap_testkit::package_env_vars() {
        build.env_remove(name);
    }
    let out = build
        .arg(root.join("tools/pgo/build.sh"))
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run tools/pgo/build.sh to build the shipped sidecar")?;
    anyhow::ensure!(out.status.success(), "building the shipped sidecar failed");
    let _ = SHIPPED.set(built_executable(&out.stdout)?);
    Ok(())
}

/// The second sidecar build, `BUCKETMAP_BENCH_SIDECAR_BIN_B`, measured as
/// one more path on the plain upstreams, in the same interleaved run as the
/// first, to compare two builds under the same load. Unset: the plain
/// release build (`cargo build --release`, what `cargo install` gives,
/// [`RELEASE`]), labelled [`SIDECAR_RELEASE`]; `none`: no second build;
/// a path: that build, labelled "sidecar B".
pub(crate) fn sidecar_bin_b() -> Option<(PathBuf, &'static str)> {
    match std::env::var_os(SIDECAR_BIN_B_ENV) {
        Some(v) if v == "none" => None,
        Some(v) => Some((PathBuf::from(v), "sidecar B")),
        None => RELEASE.get().map(|bin| (bin.clone(), SIDECAR_RELEASE)),
    }
}

const SIDECAR_BIN_B_ENV: &str = "BUCKETMAP_BENCH_SIDECAR_BIN_B";
/// The plain release build's path, handed to the re-run under `setarch`.
const RELEASE_ENV: &str = "BUCKETMAP_BENCH_RELEASE_BIN";
/// The label of the plain release build's path.
pub(crate) const SIDECAR_RELEASE: &str = "sidecar release";

/// The plain release build, when [`build_release_sidecar`] made it.
static RELEASE: OnceLock<PathBuf> = OnceLock::new();

/// Builds the sidecar as `cargo build --release` does, the build a user
/// gets from `cargo install`, unless `BUCKETMAP_BENCH_SIDECAR_BIN_B` names
/// another second build (or `none`). Its path is in [`RELEASE`].
fn build_release_sidecar() -> Result<()> {
    let settings = Settings::from_env();
    let plain_paths = settings.latency || settings.rps || settings.streaming;
    if std::env::var_os(SIDECAR_BIN_B_ENV).is_some() || settings.train || !plain_paths {
        return Ok(());
    }
    if let Some(built) = std::env::var_os(RELEASE_ENV) {
        let _ = RELEASE.set(PathBuf::from(built));
        return Ok(());
    }
    eprintln!("bench: building the plain release sidecar (cargo build --release)");
    let mut build = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for name in bucketmap_testkit::package_env_vars() {
        build.env_remove(name);
    }
    let out = build
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "bucketmap-sidecar",
            "--bin",
        ])
        .arg("bucketmap-sidecar")
        .arg("--message-format=json-render-diagnostics")
        .current_dir(workspace_root()?)
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo build --release for the sidecar")?;
    anyhow::ensure!(out.status.success(), "building the release sidecar failed");
    let _ = RELEASE.set(built_executable(&out.stdout)?);
    Ok(())
}

/// The directory of the workspace's Cargo.toml.
fn workspace_root() -> Result<&'static Path> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the sidecar crate has no parent directory")
}

/// The `bucketmap-sidecar` executable named in cargo's JSON messages.
fn built_executable(stdout: &[u8]) -> Result<PathBuf> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|msg| {
            msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "bucketmap-sidecar"
        })
        .and_then(|msg| msg["executable"].as_str().map(PathBuf::from))
        .context("cargo named no bucketmap-sidecar executable")
}

/// The report's line on the sidecar builds measured.
fn measured_builds() -> String {
    let bin = sidecar_bin();
    let main = if SHIPPED.get() == Some(&bin) {
        format!(
            "the shipped build (`dist-sidecar` profile, profile-guided), `{}`",
            bin.display()
        )
    } else if bin == Path::new(SIDECAR_BIN) {
        "cargo's bench build (it unwinds on a panic and has no profile; the image ships tools/pgo/build.sh's)"
            .to_owned()
    } else {
        format!("`{}`", bin.display())
    };
    match sidecar_bin_b() {
        Some((b, label)) => format!("Sidecar: {main}; {label}: `{}`.", b.display()),
        None => format!("Sidecar: {main}."),
    }
}
pub(crate) const LOGICAL: &str = "photos";
pub(crate) const PHYSICAL: &str = "photos-k3x9q2mw";
pub(crate) const MIB: u64 = 1 << 20;
/// Size of the buffer generated bodies are sliced from (one frame each).
pub(crate) const CHUNK: usize = 128 * 1024;
pub(crate) const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const STREAM_TIMEOUT: Duration = Duration::from_secs(180);
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

// Targets (reported, not asserted), against nginx-rewrite in the same run.
/// The label of the path the targets compare the sidecar with.
pub(crate) const NGINX_REWRITE: &str = "nginx-rewrite";
/// CPU per proxied metadata request in the closed loops, as the kernel
/// accounts the process, times nginx-rewrite's: the shipped build ...
pub(crate) const TARGET_CPU_SHIPPED: f64 = 0.8;
/// ... and any other build (the plain release build: `cargo install`'s).
pub(crate) const TARGET_CPU_OTHER: f64 = 1.0;
/// The sidecar's RSS once the closed loop at 16 connections is over ...
pub(crate) const TARGET_LOADED_IDLE_RSS_KIB: u64 = 6 * 1024;
/// ... and its peak (`VmHWM`) by then.
pub(crate) const TARGET_LOADED_PEAK_RSS_KIB: u64 = 8 * 1024;
/// Streaming through the sidecar from the TLS upstream, share of direct TLS.
pub(crate) const TARGET_TLS_STREAM_RATIO: f64 = 0.90;
pub(crate) const TARGET_IDLE_RSS_KIB: u64 = 8 * 1024;
pub(crate) const TARGET_PEAK_RSS_KIB: u64 = 20 * 1024;

/// What one run does.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// Metadata requests per second (open loop).
    pub(crate) rate: u64,
    /// Length of one open-loop block; blocks alternate direct and proxied.
    pub(crate) block: Duration,
    /// Blocks per path and upstream.
    pub(crate) blocks: u32,
    /// Closed-loop warm-up requests per path before measuring.
    pub(crate) warmup: u32,
    /// Single-stream object size, in-process upstream.
    pub(crate) big: u64,
    /// Single-stream object size, fake-gcs-server.
    pub(crate) fake_big: u64,
    /// Repetitions of each single-stream transfer per path.
    pub(crate) reps: u32,
    /// Length of one closed-loop requests-per-second block.
    pub(crate) rps_block: Duration,
    /// Blocks per path and connection count.
    pub(crate) rps_blocks: u32,
    /// Concurrent streams in the memory phase.
    pub(crate) streams: usize,
    /// Bytes per concurrent stream.
    pub(crate) stream_size: u64,
    /// Unary gRPC GetObject calls per path (closed loop).
    pub(crate) grpc_calls: u32,
    /// Size of the gRPC ReadObject and WriteObject transfers.
    pub(crate) grpc_big: u64,
    /// Phases to run (`BUCKETMAP_BENCH_PHASES=latency,rps,streaming,memory,instructions,grpc,tls`,
    /// all by default).
    pub(crate) latency: bool,
    pub(crate) streaming: bool,
    pub(crate) memory: bool,
    pub(crate) instructions: bool,
    pub(crate) grpc: bool,
    pub(crate) rps: bool,
    pub(crate) tls: bool,
    /// The training run of the profile-guided build instead of any
    /// measurement (`train`, [`train`]).
    pub(crate) train: bool,
}

impl Settings {
    pub(crate) fn from_env() -> Self {
        let quick = std::env::var_os("BUCKETMAP_BENCH_QUICK").is_some_and(|v| v != "0");
        let phases = std::env::var("BUCKETMAP_BENCH_PHASES")
            .unwrap_or_else(|_| "latency,rps,streaming,memory,instructions,grpc,tls".into());
        let phase = |name: &str| phases.split(',').any(|p| p.trim() == name);
        let (latency, streaming, memory) = (phase("latency"), phase("streaming"), phase("memory"));
        let (instructions, grpc) = (phase("instructions"), phase("grpc"));
        let (rps, tls) = (phase("rps"), phase("tls"));
        let train = phase("train");
        if quick || train {
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
                rps_block: Duration::from_secs(1),
                rps_blocks: 1,
                streams: 64,
                stream_size: 2 * MIB,
                latency,
                streaming,
                memory,
                instructions,
                grpc,
                rps,
                tls,
                train,
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
                // Six turns: enough for "blocks held" to tell a decided
                // target from a split one; two seconds each, so that a
                // block's CPU time is hundreds of the kernel's ticks.
                rps_block: Duration::from_secs(2),
                rps_blocks: 6,
                streams: 64,
                stream_size: 16 * MIB,
                latency,
                streaming,
                memory,
                instructions,
                grpc,
                rps,
                tls,
                train,
            }
        }
    }

    pub(crate) fn per_path(&self) -> Duration {
        self.block * self.blocks
    }
}

/// An upstream for the latency, requests-per-second and single-stream runs.
struct Upstream {
    name: &'static str,
    addr: SocketAddr,
    /// When it is another process.
    pid: Option<u32>,
    /// Size of the single-stream transfers.
    size: u64,
    /// Served over TLS (the bench's CA).
    tls: bool,
}

/// The proxies of one upstream's runs, kept running while they last.
struct Proxies {
    paths: Paths,
    procs: Vec<Proc>,
    /// Index in `procs` of the first sidecar.
    sidecar: usize,
}

/// What the proxies in front of an upstream need besides it: nginx's
/// binary (none when it cannot be had) and the TLS upstream's CA.
#[derive(Clone, Copy)]
struct Peers<'a> {
    nginx: Option<&'a Path>,
    tls: &'a Tls,
}

/// Starts the paths to `upstream`: direct, the TCP or TLS relay, the HTTP
/// relay (plain upstreams), nginx plain and rewrite (when `nginx` is given), the sidecar (on a TLS
/// upstream twice: `--upstream-http 2` and `1.1`).
async fn start_proxies(
    client: &HttpClient,
    upstream: &Upstream,
    peers: Peers<'_>,
    dir: &Path,
) -> Result<Proxies> {
    let Peers { nginx, tls } = peers;
    let mut endpoints = vec![Endpoint {
        tls: upstream.tls,
        ..Endpoint::plain("direct", upstream.addr, PHYSICAL)
    }];
    let mut meters = vec![CpuMeter::of(upstream.pid.as_slice(), true)];
    let mut procs = Vec::new();
    let tag = upstream.name;
    let mut add = |label, bucket, (proc, addr): (Proc, SocketAddr)| {
        endpoints.push(Endpoint::plain(label, addr, bucket));
        meters.push(CpuMeter::of(&[proc.pid()], false));
        procs.push(proc);
    };
    let (relay, ca_file) = if upstream.tls {
        (TLS_RELAY, Some(tls.ca_file.as_path()))
    } else {
        ("TCP relay", None)
    };
    add(
        relay,
        PHYSICAL,
        start_relay(client, upstream.addr, ca_file, dir, tag, Launch::Plain).await?,
    );
    if !upstream.tls {
        let started = start_http_relay(client, upstream.addr, dir, tag, Launch::Plain).await?;
        add(HTTP_RELAY, PHYSICAL, started);
    }
    if let Some(bin) = nginx {
        let target = NginxUpstream {
            addr: upstream.addr,
            ca_file: upstream.tls.then_some(tls.ca_file.as_path()),
        };
        for (label, mode, bucket) in [
            ("nginx", NginxMode::Plain, PHYSICAL),
            (NGINX_REWRITE, NginxMode::Rewrite, LOGICAL),
        ] {
            add(
                label,
                bucket,
                start_nginx(client, bin, mode, &target, dir, tag, Launch::Plain).await?,
            );
        }
    }
    // The relays and the two nginx come first.
    let relays = if upstream.tls { 1 } else { 2 };
    let sidecar = relays + if nginx.is_some() { 2 } else { 0 };
    if upstream.tls {
        let url = format!("https://{}", upstream.addr);
        let ca = tls.ca_file.to_string_lossy();
        for (label, version) in [("sidecar h2", "2"), ("sidecar h1.1", "1.1")] {
            let extra = ["--upstream-ca-file", &ca, "--upstream-http", version];
            let tag = format!("{tag}-{version}");
            let started = start_sidecar_to(client, &url, &extra, dir, &tag, Launch::Plain).await?;
            add(label, LOGICAL, started);
        }
    } else {
        add(
            "sidecar",
            LOGICAL,
            start_sidecar(client, upstream.addr, dir, tag, Launch::Plain).await?,
        );
        if let Some((bin, label)) = sidecar_bin_b() {
            let url = format!("http://{}", upstream.addr);
            let tag = format!("{tag}-b");
            let started =
                start_sidecar_bin_to(&bin, client, &url, &[], dir, &tag, Launch::Plain).await?;
            add(label, LOGICAL, started);
        }
    }
    Ok(Proxies {
        paths: Paths {
            upstream: upstream.name,
            endpoints,
            meters,
        },
        procs,
        sidecar,
    })
}

/// The latency, requests-per-second and single-stream runs against one
/// upstream, through proxies of their own; returns the (first) sidecar's
/// peak RSS in KiB.
async fn upstream_runs(
    settings: &Settings,
    client: &HttpClient,
    upstream: Upstream,
    peers: Peers<'_>,
    dir: &Path,
    chunk: &Bytes,
    report: &mut Report,
) -> Result<u64> {
    let Proxies {
        paths,
        mut procs,
        sidecar,
    } = start_proxies(client, &upstream, peers, dir).await?;
    if settings.latency {
        report
            .metadata
            .push(metadata_phase(settings, client, &paths).await?);
    }
    if settings.rps {
        report
            .throughput
            .push(throughput_phase(settings, client, &paths).await);
    }
    if settings.streaming {
        report
            .streams
            .extend(streaming_phase(settings, client, &paths, upstream.size, chunk).await?);
    }
    for proc in &mut procs {
        proc.check_running()?;
    }
    Ok(memory_kib(procs[sidecar].pid())?.hwm_kib)
}

fn new_report(settings: Settings) -> Report {
    Report {
        settings,
        date: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "?".into()),
        builds: measured_builds(),
        main_is_shipped: SHIPPED.get() == Some(&sidecar_bin()),
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
        randomised: address_randomisation_off() != Some(true),
        load_before: loadavg(),
        load_after: String::new(),
        elapsed: Duration::ZERO,
        metadata: Vec::new(),
        throughput: Vec::new(),
        streams: Vec::new(),
        memory: Vec::new(),
        instructions: Vec::new(),
        grpc: None,
        main_sidecar_hwm_kib: None,
        notes: Vec::new(),
    }
}

/// The memory phase against the plain upstream and, with `tls`, against
/// the TLS upstream with both HTTP versions.
async fn memory_runs(
    settings: &Settings,
    client: &HttpClient,
    upstreams: (SocketAddr, Option<SocketAddr>),
    tls: &Tls,
    dir: &Path,
    chunk: &Bytes,
) -> Result<Vec<MemoryFigures>> {
    let (plain, tls_upstream) = upstreams;
    let mut targets = vec![MemoryTarget {
        label: "plain upstream",
        direct: Endpoint::plain("direct", plain, PHYSICAL),
        upstream: format!("http://{plain}"),
        extra: Vec::new(),
    }];
    if let Some(addr) = tls_upstream {
        let ca = tls.ca_file.to_string_lossy().into_owned();
        for (label, version) in [("TLS upstream, h2", "2"), ("TLS upstream, h1.1", "1.1")] {
            targets.push(MemoryTarget {
                label,
                direct: Endpoint {
                    tls: true,
                    ..Endpoint::plain("direct", addr, PHYSICAL)
                },
                upstream: format!("https://{addr}"),
                extra: vec![
                    "--upstream-ca-file".into(),
                    ca.clone(),
                    "--upstream-http".into(),
                    version.into(),
                ],
            });
        }
    }
    let mut out = Vec::new();
    for target in &targets {
        out.push(memory_phase(settings, client, target, dir, chunk).await?);
    }
    Ok(out)
}

async fn run(settings: Settings, fake_bin: Result<PathBuf>, dir: &Path) -> Result<Report> {
    let started = Instant::now();
    let tls = Tls::new(dir)?;
    let client = new_client(tls.client.clone());
    let chunk = pattern_chunk();
    let mut report = new_report(settings);
    eprintln!("sidecar binary: {}", sidecar_bin().display());
    let nginx = match nginx_bin() {
        Ok(bin) => Some(bin),
        Err(e) => {
            let note = format!(
                "nginx unavailable, its paths are missing (the targets against nginx-rewrite cannot be judged): {e:#}"
            );
            eprintln!("{note}");
            report.notes.push(note);
            None
        }
    };
    let peers = Peers {
        nginx: nginx.as_deref(),
        tls: &tls,
    };
    let per_upstream = settings.latency || settings.rps || settings.streaming;

    // In-process upstream, plain and TLS.
    let upstream = start_in_process_upstream(&settings, &chunk, None)?;
    let tls_upstream = if settings.tls {
        Some(start_in_process_upstream(
            &settings,
            &chunk,
            Some(tls.server.clone()),
        )?)
    } else {
        None
    };
    if per_upstream {
        let target = Upstream {
            name: "in-process",
            addr: upstream,
            pid: None,
            size: settings.big,
            tls: false,
        };
        let hwm =
            upstream_runs(&settings, &client, target, peers, dir, &chunk, &mut report).await?;
        report.main_sidecar_hwm_kib = Some(hwm);
        if let Some(addr) = tls_upstream {
            let target = Upstream {
                name: "in-process TLS",
                addr,
                pid: None,
                size: settings.big,
                tls: true,
            };
            upstream_runs(&settings, &client, target, peers, dir, &chunk, &mut report).await?;
        }
    }

    // fake-gcs-server.
    if per_upstream {
        match fake_bin {
            Ok(bin) => {
                let (mut fake, fake_addr) = start_fake_gcs(&client, &bin, dir).await?;
                let target = Upstream {
                    name: "fake-gcs-server",
                    addr: fake_addr,
                    pid: Some(fake.pid()),
                    size: settings.fake_big,
                    tls: false,
                };
                upstream_runs(&settings, &client, target, peers, dir, &chunk, &mut report).await?;
                fake.check_running()?;
            }
            Err(e) => report.notes.push(format!(
                "fake-gcs-server unavailable, its figures are missing: {e:#}"
            )),
        }
    }

    // Memory under concurrent streams.
    if settings.memory {
        let upstreams = (upstream, tls_upstream);
        report.memory = memory_runs(&settings, &client, upstreams, &tls, dir, &chunk).await?;
    }

    // Instruction counts.
    if settings.instructions {
        if callgrind_available() {
            let tls_upstream = tls_upstream.map(|addr| (addr, tls.ca_file.as_path()));
            report.instructions =
                instructions_phase(&client, upstream, tls_upstream, nginx.as_deref(), dir).await?;
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

/// `BUCKETMAP_BENCH_ASLR=on` keeps address-space randomisation on.
const ASLR_ENV: &str = "BUCKETMAP_BENCH_ASLR";

/// Set in the environment of the bench run again under `setarch -R`.
const RERUN_ENV: &str = "BUCKETMAP_BENCH_RERUN_NO_ASLR";

/// Whether this process runs without address-space randomisation
/// (`ADDR_NO_RANDOMIZE` in its personality, which its children inherit);
/// `None` when the personality cannot be read.
fn address_randomisation_off() -> Option<bool> {
    const ADDR_NO_RANDOMIZE: u32 = 0x0040000;
    let personality = std::fs::read_to_string("/proc/self/personality").ok()?;
    let flags = u32::from_str_radix(personality.trim(), 16).ok()?;
    Some(flags & ADDR_NO_RANDOMIZE != 0)
}

/// Runs the bench again under `setarch ARCH -R`, so that it and every
/// process it starts (the proxies, the upstreams) run without address-space
/// randomisation, and answers with that run's exit code. With it on, two
/// processes of one binary differ in CPU per request by more than the
/// differences the bench is there to show (their code, heap and stacks land
/// at different addresses); with it off they do not. `None`
/// (run here) when randomisation is already off, was asked for, cannot be
/// read, or `setarch` cannot run; the report then says it was on.
fn rerun_without_address_randomisation() -> Option<std::process::ExitCode> {
    if address_randomisation_off() != Some(false)
        || std::env::var_os(ASLR_ENV).is_some_and(|v| v == "on")
        || std::env::var_os(RERUN_ENV).is_some()
    {
        return None;
    }
    // A container may refuse the personality change: then run here.
    let works = Command::new("setarch")
        .args([std::env::consts::ARCH, "-R", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !works {
        eprintln!("bench: setarch -R cannot run here: address-space randomisation stays on");
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let status = Command::new("setarch")
        .arg(std::env::consts::ARCH)
        .arg("-R")
        .arg(&exe)
        .args(std::env::args_os().skip(1))
        .env(RERUN_ENV, "1")
        .envs(SHIPPED.get().map(|bin| (SHIPPED_ENV, bin)))
        .envs(RELEASE.get().map(|bin| (RELEASE_ENV, bin)))
        .status();
    match status {
        Ok(status) => {
            let code = status
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .unwrap_or(1);
            Some(std::process::ExitCode::from(code))
        }
        Err(e) => {
            eprintln!("bench: cannot run setarch ({e}): address-space randomisation stays on");
            None
        }
    }
}

fn main() -> std::process::ExitCode {
    if let Ok(spec) = std::env::var(RELAY_ENV) {
        return relay_main(&spec);
    }
    if let Ok(spec) = std::env::var(HTTP_RELAY_ENV) {
        return http_relay_main(&spec);
    }
    if let Ok(spec) = std::env::var(H2_RELAY_ENV) {
        return h2_relay_main(&spec);
    }
    if let Err(e) = build_shipped_sidecar().and_then(|()| build_release_sidecar()) {
        eprintln!("bench: {e:#}");
        return std::process::ExitCode::FAILURE;
    }
    if let Some(code) = rerun_without_address_randomisation() {
        return code;
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
    if settings.train {
        return match runtime.block_on(train::train(&settings, dir.path())) {
            Ok(()) => {
                eprintln!("[train] done: every sidecar exited cleanly");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                let kept = dir.keep();
                eprintln!(
                    "bench: training failed: {e:#}\n(logs kept in {})",
                    kept.display()
                );
                std::process::ExitCode::FAILURE
            }
        };
    }
    match runtime.block_on(run(settings, fake_bin, dir.path())) {
        Ok(report) => {
            println!("{}", report.render());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            // Kept for the logs of the processes (nginx's error.log and others).
            let kept = dir.keep();
            eprintln!("bench failed: {e:#}\n(logs kept in {})", kept.display());
            std::process::ExitCode::FAILURE
        }
    }
}
