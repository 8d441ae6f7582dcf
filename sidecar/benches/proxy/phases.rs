//! The phases over HTTP: metadata latency, streaming, memory, instruction counts.

use super::*;

/// One upstream, reached directly, through the relay and through its sidecar.
pub(crate) struct Paths {
    pub(crate) upstream: &'static str,
    /// Per path, direct first.
    pub(crate) endpoints: Vec<Endpoint>,
    /// What each path's CPU is: client + upstream (direct), the proxy's.
    pub(crate) meters: Vec<CpuMeter>,
}

impl Paths {
    pub(crate) fn labels(&self) -> Vec<&'static str> {
        self.endpoints.iter().map(|e| e.label).collect()
    }

    /// The order of the paths in turn `turn`: rotated, and backwards every
    /// other turn, so that no path always follows the same one (rotation
    /// alone kept each path behind its neighbour in the list).
    pub(crate) fn turn(&self, turn: usize) -> impl Iterator<Item = usize> {
        let n = self.endpoints.len();
        let backwards = turn % 2 == 1;
        (0..n).map(move |i| (turn + if backwards { n - 1 - i } else { i }) % n)
    }
}

pub(crate) async fn metadata_phase(
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
    let mut runs: Vec<PathRun> = paths.endpoints.iter().map(|_| PathRun::default()).collect();
    for block in 0..settings.blocks as usize {
        for index in paths.turn(block) {
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
            let cpu_ns = meter.read().saturating_sub(before);
            run.cpu_ns += cpu_ns;
            let block = Latencies::new(run.samples[first..].to_vec(), Vec::new(), Vec::new());
            run.block_p99.push(block.percentile(99.0));
            run.blocks.push(BlockFigures {
                p50: block.percentile(50.0),
                p99: block.percentile(99.0),
            });
        }
    }
    Ok(MetadataFigures {
        upstream,
        labels: paths.labels(),
        cpu_ns: runs.iter().map(|r| r.cpu_ns).collect(),
        blocks: runs.iter().map(|r| r.blocks.clone()).collect(),
        latencies: runs.into_iter().map(PathRun::into_latencies).collect(),
    })
}

/// What one path (direct or proxied) collects over the blocks.
#[derive(Default)]
pub(crate) struct PathRun {
    pub(crate) samples: Vec<Duration>,
    pub(crate) errors: Vec<String>,
    pub(crate) cpu_ns: u64,
    pub(crate) block_p99: Vec<Duration>,
    pub(crate) blocks: Vec<BlockFigures>,
}

impl PathRun {
    pub(crate) fn into_latencies(self) -> Latencies {
        Latencies::new(self.samples, self.errors, self.block_p99)
    }
}

pub(crate) async fn streaming_phase(
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
            labels: paths.labels(),
            rates: vec![Vec::new(); paths.endpoints.len()],
            cpu_ns: vec![0; paths.endpoints.len()],
        };
        for rep in 0..settings.reps as usize {
            for index in paths.turn(rep) {
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

/// Connections of the closed-loop requests-per-second runs.
pub(crate) const CONNECTIONS: [usize; 2] = [1, 16];

/// Requests per second of metadata GETs on every path, closed loop at 1 and
/// 16 connections, the paths taking turns in blocks.
pub(crate) async fn throughput_phase(
    settings: &Settings,
    client: &HttpClient,
    paths: &Paths,
) -> ThroughputFigures {
    let upstream = paths.upstream;
    eprintln!(
        "[{upstream}] requests per second: {:?} per path and connection count in {} blocks",
        settings.rps_block * settings.rps_blocks,
        settings.rps_blocks
    );
    let mut figures = ThroughputFigures {
        upstream,
        labels: paths.labels(),
        rows: Vec::new(),
        errors: 0,
        memory_after: Vec::new(),
    };
    for connections in CONNECTIONS {
        let row = throughput_row(settings, client, paths, connections, &mut figures.errors).await;
        figures.rows.push(row);
    }
    figures.memory_after = paths
        .endpoints
        .iter()
        .zip(&paths.meters)
        .map(|(endpoint, meter)| {
            let pid = meter.pid().filter(|_| is_sidecar(endpoint.label))?;
            memory_kib(pid).ok()
        })
        .collect();
    figures
}

/// One connection count's closed loops over every path, in blocks.
async fn throughput_row(
    settings: &Settings,
    client: &HttpClient,
    paths: &Paths,
    connections: usize,
    errors: &mut u64,
) -> ThroughputRow {
    let n = paths.endpoints.len();
    let (mut done, mut cpu_ns) = (vec![0u64; n], vec![0u64; n]);
    let (mut block_rps, mut block_cpu_us) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    for block in 0..settings.rps_blocks as usize {
        for index in paths.turn(block) {
            let meter = &paths.meters[index];
            let before = meter.read_accounted();
            let (ok, failed) = closed_loop(
                client,
                &paths.endpoints[index],
                connections,
                settings.rps_block,
            )
            .await;
            let used = meter.read_accounted().saturating_sub(before);
            cpu_ns[index] += used;
            done[index] += ok;
            block_rps[index].push(ok as f64 / settings.rps_block.as_secs_f64());
            block_cpu_us[index].push(used as f64 / 1000.0 / ok.max(1) as f64);
            *errors += failed;
        }
    }
    let seconds = (settings.rps_block * settings.rps_blocks).as_secs_f64();
    ThroughputRow {
        connections,
        rps: done.iter().map(|&d| d as f64 / seconds).collect(),
        cpu_us: cpu_ns
            .iter()
            .zip(&done)
            .map(|(&ns, &d)| ns as f64 / 1000.0 / d.max(1) as f64)
            .collect(),
        block_rps,
        block_cpu_us,
    }
}

/// The sidecar the memory phase measures: in front of `direct`'s upstream
/// (`upstream`, a URL), with the arguments `extra`.
pub(crate) struct MemoryTarget {
    pub(crate) label: &'static str,
    pub(crate) direct: Endpoint,
    pub(crate) upstream: String,
    pub(crate) extra: Vec<String>,
}

pub(crate) async fn memory_phase(
    settings: &Settings,
    client: &HttpClient,
    target: &MemoryTarget,
    dir: &Path,
    chunk: &Bytes,
) -> Result<MemoryFigures> {
    let extra: Vec<&str> = target.extra.iter().map(String::as_str).collect();
    let tag = format!("memory-{}", target.label.replace([' ', ','], "-"));
    let (mut sidecar, addr) =
        start_sidecar_to(client, &target.upstream, &extra, dir, &tag, Launch::Plain).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss_kib = memory_kib(sidecar.pid())?.rss_kib;
    let direct = target.direct;
    let via = Endpoint::plain("sidecar", addr, LOGICAL);
    let mut rows = Vec::new();
    for direction in [Direction::Download, Direction::Upload] {
        eprintln!(
            "[memory: {}] {} concurrent {}s of {} MiB each, direct then via a fresh sidecar",
            target.label,
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
        let hwm = memory_kib(sidecar.pid())?.hwm_kib;
        rows.push(MemoryRow {
            direction,
            direct: mib_per_s(total, direct_time),
            via: mib_per_s(total, via_time),
            hwm_after_kib: hwm,
        });
    }
    Ok(MemoryFigures {
        label: target.label.to_owned(),
        idle_rss_kib,
        rows,
    })
}

/// Metadata requests counted per path under callgrind (after a warm-up).
pub(crate) const COUNTED_REQUESTS: u64 = 2000;

/// Instructions per proxied metadata request in front of one upstream, per
/// path: the floor first (the TCP or TLS relay), then the HTTP relay (plain
/// upstream), nginx-rewrite (when nginx is installed) and the sidecar(s).
pub(crate) struct InstructionFigures {
    pub(crate) upstream: &'static str,
    pub(crate) rows: Vec<(&'static str, u64)>,
}

impl InstructionFigures {
    pub(crate) fn nginx_rewrite(&self) -> Option<u64> {
        self.rows
            .iter()
            .find_map(|(label, n)| (*label == NGINX_REWRITE).then_some(*n))
    }
}

/// Counts the instructions the relay, the HTTP relay, nginx-rewrite and the
/// sidecar execute per metadata request (sequential GETs through each, in
/// front of the in-process upstream), with callgrind; on the TLS upstream
/// (`tls`: its address and the CA file), the TLS relay, nginx-rewrite and
/// the sidecar with each upstream HTTP version, the production shape.
/// Unlike times, these counts do not move with whatever else the machine
/// runs, so they show changes in the proxy's own work exactly, and how much
/// more user-space work the sidecar does than the peer that does its job
/// off the shelf (the kernel's share, the same two sockets per request for
/// both, is not counted).
pub(crate) async fn instructions_phase(
    client: &HttpClient,
    upstream: SocketAddr,
    tls: Option<(SocketAddr, &Path)>,
    nginx: Option<&Path>,
    dir: &Path,
) -> Result<Vec<InstructionFigures>> {
    let mut figures = vec![count_plain(client, upstream, nginx, dir).await?];
    if let Some((addr, ca_file)) = tls {
        figures.push(count_tls(client, addr, ca_file, nginx, dir).await?);
    }
    Ok(figures)
}

async fn count_plain(
    client: &HttpClient,
    upstream: SocketAddr,
    nginx: Option<&Path>,
    dir: &Path,
) -> Result<InstructionFigures> {
    let mut rows = vec![(
        "TCP relay",
        count_relay(client, upstream, None, dir, "").await?,
    )];
    let out = dir.join("callgrind-http-relay.out");
    let launch = Launch::Callgrind(&out);
    let (proc, addr) = start_http_relay(client, upstream, dir, "callgrind", launch).await?;
    rows.push((
        HTTP_RELAY,
        count_instructions(client, proc, addr, PHYSICAL, &out).await?,
    ));
    if let Some(bin) = nginx {
        rows.push((
            NGINX_REWRITE,
            count_nginx(client, bin, upstream, None, dir, "").await?,
        ));
    }
    let out = dir.join("callgrind-sidecar.out");
    let (sidecar, addr) =
        start_sidecar(client, upstream, dir, "callgrind", Launch::Callgrind(&out)).await?;
    rows.push((
        "sidecar",
        count_instructions(client, sidecar, addr, LOGICAL, &out).await?,
    ));
    Ok(InstructionFigures {
        upstream: "in-process",
        rows,
    })
}

async fn count_tls(
    client: &HttpClient,
    upstream: SocketAddr,
    ca_file: &Path,
    nginx: Option<&Path>,
    dir: &Path,
) -> Result<InstructionFigures> {
    let mut rows = vec![(
        TLS_RELAY,
        count_relay(client, upstream, Some(ca_file), dir, "-tls").await?,
    )];
    let tag = "callgrind-tls";
    if let Some(bin) = nginx {
        let count = count_nginx(client, bin, upstream, Some(ca_file), dir, "-tls").await?;
        rows.push((NGINX_REWRITE, count));
    }
    let url = format!("https://{upstream}");
    let ca = ca_file.to_string_lossy();
    for (label, version) in [("sidecar h2", "2"), ("sidecar h1.1", "1.1")] {
        let out = dir.join(format!("callgrind-sidecar-tls-h{version}.out"));
        let extra = ["--upstream-ca-file", &ca, "--upstream-http", version];
        let tag = format!("{tag}-{version}");
        let launch = Launch::Callgrind(&out);
        let (proc, addr) = start_sidecar_to(client, &url, &extra, dir, &tag, launch).await?;
        rows.push((
            label,
            count_instructions(client, proc, addr, LOGICAL, &out).await?,
        ));
    }
    Ok(InstructionFigures {
        upstream: "in-process TLS",
        rows,
    })
}

/// The TCP relay's (TLS relay's, when `ca_file` is given) instructions per
/// metadata request in front of `upstream`.
async fn count_relay(
    client: &HttpClient,
    upstream: SocketAddr,
    ca_file: Option<&Path>,
    dir: &Path,
    suffix: &str,
) -> Result<u64> {
    let out = dir.join(format!("callgrind{suffix}-relay.out"));
    let tag = format!("callgrind{suffix}");
    let launch = Launch::Callgrind(&out);
    let (relay, addr) = start_relay(client, upstream, ca_file, dir, &tag, launch).await?;
    count_instructions(client, relay, addr, PHYSICAL, &out).await
}

/// nginx-rewrite's instructions per metadata request in front of `upstream`
/// (over TLS when `ca_file` is given).
async fn count_nginx(
    client: &HttpClient,
    bin: &Path,
    upstream: SocketAddr,
    ca_file: Option<&Path>,
    dir: &Path,
    suffix: &str,
) -> Result<u64> {
    let out = dir.join(format!("callgrind-nginx-rewrite{suffix}.out"));
    let target = NginxUpstream {
        addr: upstream,
        ca_file,
    };
    let tag = format!("callgrind{suffix}");
    let launch = Launch::Callgrind(&out);
    let (proc, addr) =
        start_nginx(client, bin, NginxMode::Rewrite, &target, dir, &tag, launch).await?;
    count_instructions(client, proc, addr, LOGICAL, &out).await
}

/// Instructions per metadata GET of `proc`, a proxy at `addr` running under
/// callgrind (counts in `out`), reaching the object through `bucket`.
pub(crate) async fn count_instructions(
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
    let endpoint = Endpoint::plain(proc.name, addr, bucket);
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
    keep_dump(&dump)?;
    let total: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("summary:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| anyhow!("no summary line in {}", dump.display()))?;
    Ok(total / COUNTED_REQUESTS)
}

/// Copies a callgrind dump into `BUCKETMAP_BENCH_CALLGRIND_OUT` when set,
/// for `callgrind_annotate` (the bench's own directory is removed at exit).
fn keep_dump(dump: &Path) -> Result<()> {
    let Some(dir) = std::env::var_os("BUCKETMAP_BENCH_CALLGRIND_OUT") else {
        return Ok(());
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = dump
        .file_name()
        .context("a callgrind dump has a file name")?;
    let to = dir.join(name);
    std::fs::copy(dump, &to)
        .with_context(|| format!("cannot copy the dump to {}", to.display()))?;
    eprintln!("[instructions] callgrind dump kept: {}", to.display());
    Ok(())
}

pub(crate) fn callgrind_control(args: &[&str]) -> Result<()> {
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
pub(crate) fn callgrind_available() -> bool {
    command_output("valgrind", &["--version"]).is_some()
        && command_output("callgrind_control", &["--version"]).is_some()
}
