//! Child processes: the sidecar, the TCP relay, fake-gcs-server; their CPU time and memory.

use super::*;

/// A child process, killed when dropped.
pub(crate) struct Proc {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(name: &'static str, cmd: &mut Command, log: PathBuf) -> Result<Proc> {
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

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process with SIGTERM, as the kubelet stops a container, and
    /// waits up to `grace` for it to exit; fails unless it exits cleanly (an
    /// instrumented build writes its profile as it exits). It waits on the
    /// bench's runtime, whose tasks (an HTTP/2 client answering the
    /// sidecar's GOAWAY) must go on running meanwhile.
    pub(crate) async fn terminate(&mut self, grace: Duration) -> Result<()> {
        let pid = self.pid().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("cannot run kill")?;
        anyhow::ensure!(sent.success(), "kill -TERM {pid} failed");
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::ensure!(
                    status.success(),
                    "{} exited with {status} after SIGTERM\n{}",
                    self.name,
                    log_tail(&self.log, 20)
                );
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} did not exit within {grace:?} of SIGTERM", self.name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn check_running(&mut self) -> Result<()> {
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

pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    format!("--- {} ---\n{}", path.display(), all[start..].join("\n"))
}

pub(crate) fn free_port() -> Result<u16> {
    let listener = StdTcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// Polls `path` until it answers 200; fails if the process exits (a port
/// lost to a race makes it exit, and the answer may then come from another
/// process, hence the second look after the first 200).
pub(crate) async fn wait_ready(
    client: &HttpClient,
    proc: &mut Proc,
    addr: SocketAddr,
    path: &str,
) -> Result<()> {
    let uri: Uri = format!("http://{addr}{path}").parse()?;
    poll_until(proc, addr, async || {
        let probe = Request::get(uri.clone()).body(empty())?;
        Ok(matches!(
            tokio::time::timeout(Duration::from_secs(2), client.request(probe)).await,
            Ok(Ok(response)) if response.status() == StatusCode::OK
        ))
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proc.check_running()
}

/// Calls `probe` until it answers true; fails if it fails, if `proc` exits
/// first or if [`READY_TIMEOUT`] passes.
pub(crate) async fn poll_until(
    proc: &mut Proc,
    addr: SocketAddr,
    mut probe: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        proc.check_running()?;
        if probe().await? {
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
pub(crate) enum Launch<'a> {
    Plain,
    Callgrind(&'a Path),
}

impl Launch<'_> {
    pub(crate) fn command(self, program: &Path) -> Command {
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

/// Starts the sidecar under test in front of `upstream` (plain HTTP).
pub(crate) async fn start_sidecar(
    client: &HttpClient,
    upstream: SocketAddr,
    dir: &Path,
    tag: &str,
    launch: Launch<'_>,
) -> Result<(Proc, SocketAddr)> {
    let upstream = format!("http://{upstream}");
    start_sidecar_to(client, &upstream, &[], dir, tag, launch).await
}

/// Starts the sidecar under test in front of the upstream URL
/// `upstream`, with the further arguments `extra`.
pub(crate) async fn start_sidecar_to(
    client: &HttpClient,
    upstream: &str,
    extra: &[&str],
    dir: &Path,
    tag: &str,
    launch: Launch<'_>,
) -> Result<(Proc, SocketAddr)> {
    let bin = sidecar_bin();
    start_sidecar_bin_to(&bin, client, upstream, extra, dir, tag, launch).await
}

/// [`start_sidecar_to`] with the sidecar binary `bin`.
pub(crate) async fn start_sidecar_bin_to(
    bin: &Path,
    client: &HttpClient,
    upstream: &str,
    extra: &[&str],
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
            let mut cmd = launch.command(bin);
            cmd.args(["--listen", &addr.to_string()])
                .args(["--upstream", upstream])
                .arg("--no-auth")
                .args(["--map", &format!("{LOGICAL}={PHYSICAL}")])
                .args(extra)
                .env("RUST_LOG", "info")
                .env("NO_COLOR", "1")
                // The image's environment (Dockerfile): one malloc arena.
                .env("MALLOC_ARENA_MAX", "1");
            cmd
        },
    )
    .await
}

/// Starts a child process listening on a free loopback port (the command
/// `command(addr)`), its output in `LOG-<attempt>.log`, and waits until
/// `probe` answers 200 there; a port lost to a race makes it try again.
pub(crate) async fn start_on_free_port(
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

/// Environment variable that turns this bench binary into the relay:
/// `LISTEN_ADDR,UPSTREAM_ADDR` (TCP relay), or
/// `LISTEN_ADDR,UPSTREAM_ADDR,CA_FILE` (TLS relay: TLS to the upstream,
/// trusting the CA in `CA_FILE`).
pub(crate) const RELAY_ENV: &str = "BUCKETMAP_BENCH_RELAY";
/// Copy buffer of the relay, each way: the sidecar's read buffers are
/// bounded at 64 KiB too.
pub(crate) const RELAY_BUFFER: usize = 64 * 1024;
/// The TLS relay's label in the figures.
pub(crate) const TLS_RELAY: &str = "TLS relay";

/// What the relay process is told to do.
struct RelaySpec {
    listen: SocketAddr,
    upstream: SocketAddr,
    /// TLS to the upstream, trusting this configuration's CA only.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl RelaySpec {
    fn parse(spec: &str) -> Result<RelaySpec> {
        let mut parts = spec.splitn(3, ',');
        let (Some(listen), Some(upstream)) = (parts.next(), parts.next()) else {
            bail!("{RELAY_ENV} must be LISTEN_ADDR,UPSTREAM_ADDR[,CA_FILE], not {spec:?}");
        };
        let tls = parts.next().map(relay_tls).transpose()?;
        Ok(RelaySpec {
            listen: listen.parse().context("the relay's listen address")?,
            upstream: upstream.parse().context("the relay's upstream address")?,
            tls,
        })
    }
}

/// The TLS relay's client configuration: trusts the CA in `ca_file` only and
/// offers HTTP/1.1 by ALPN (it relays the bench client's plaintext HTTP/1.1).
fn relay_tls(ca_file: &str) -> Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file)
        .with_context(|| format!("cannot read the relay's CA file {ca_file}"))?
    {
        roots.add(cert.context("a certificate of the relay's CA file")?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The relay process: each accepted connection is joined to a new one to
/// the upstream and bytes are copied both ways, with no HTTP at all. It pays
/// what any user-space proxy pays on this machine (one more process, two
/// more sockets, their wake-ups and copies) and nothing else, so it is the
/// floor against which the sidecar's own cost shows. The TLS relay also
/// speaks TLS to the upstream: the floor of any proxy that takes plaintext
/// from the application and sends TLS on, as the sidecar does.
pub(crate) fn relay_main(spec: &str) -> std::process::ExitCode {
    let spec = match RelaySpec::parse(spec) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("relay: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("relay runtime");
    let listen = spec.listen;
    // It serves until killed: only an error ends it.
    let served: std::io::Result<()> = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(spec.listen).await?;
        loop {
            let (inbound, _) = listener.accept().await?;
            tokio::spawn(relay_connection(inbound, spec.upstream, spec.tls.clone()));
        }
    });
    if let Err(e) = served {
        eprintln!("relay on {listen}: {e}");
    }
    std::process::ExitCode::FAILURE
}

/// Joins `inbound` to a new connection to `upstream` (over TLS with `tls`).
async fn relay_connection(
    mut inbound: tokio::net::TcpStream,
    upstream: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
) {
    let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let Some(tls) = tls else {
        return copy_both_ways(&mut inbound, &mut outbound).await;
    };
    let Ok(name) = rustls::pki_types::ServerName::try_from(TLS_NAME) else {
        return;
    };
    let connector = tokio_rustls::TlsConnector::from(tls);
    let Ok(mut outbound) = connector.connect(name, outbound).await else {
        return;
    };
    copy_both_ways(&mut inbound, &mut outbound).await;
}

/// Copies bytes both ways until either side ends, with the relay's buffers.
async fn copy_both_ways<A, B>(a: &mut A, b: &mut B)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ = tokio::io::copy_bidirectional_with_sizes(a, b, RELAY_BUFFER, RELAY_BUFFER).await;
}

/// Starts the relay to `upstream` (a TLS relay when `ca_file` is given) on
/// a free port; ready once a metadata GET passes through it.
pub(crate) async fn start_relay(
    client: &HttpClient,
    upstream: SocketAddr,
    ca_file: Option<&Path>,
    dir: &Path,
    tag: &str,
    launch: Launch<'_>,
) -> Result<(Proc, SocketAddr)> {
    let log = dir.join(format!("relay-{tag}"));
    let spec = |addr: SocketAddr| match ca_file {
        Some(ca_file) => format!("{addr},{upstream},{}", ca_file.to_string_lossy()),
        None => format!("{addr},{upstream}"),
    };
    start_bench_child(client, "relay", (RELAY_ENV, spec), &log, launch).await
}

/// Starts this bench binary again as the child `name` on a free port, told
/// what to be by the environment variable `env.0` (set to `env.1` of the
/// port's address); ready once a metadata GET of the physical bucket passes
/// through it. The TCP, TLS and HTTP relays start this way.
pub(crate) async fn start_bench_child(
    client: &HttpClient,
    name: &'static str,
    env: (&str, impl Fn(SocketAddr) -> String),
    log: &Path,
    launch: Launch<'_>,
) -> Result<(Proc, SocketAddr)> {
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    let probe = format!("/storage/v1/b/{PHYSICAL}/o/x");
    let (var, spec) = env;
    start_on_free_port(client, name, &probe, log, |addr| {
        let mut cmd = launch.command(&exe);
        cmd.env(var, spec(addr));
        cmd
    })
    .await
}

/// The fake-gcs-server binary from the repository's install script.
pub(crate) fn fake_gcs_server_bin() -> Result<PathBuf> {
    tool_bin("FAKE_GCS_SERVER_BIN", "fake-gcs-server")
}

/// A tool's binary: the variable `env`'s value, else the last line printed
/// by `tools/TOOL/install.sh` (which fetches or builds it once). An `env`
/// naming no file is an error, which the callers report as the tool being
/// unavailable.
pub(crate) fn tool_bin(env: &str, tool: &str) -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(env) {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            bail!("{env}={} names no file", bin.display());
        }
        return Ok(bin);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tools/{tool}/install.sh"));
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
pub(crate) async fn start_fake_gcs(
    client: &HttpClient,
    bin: &Path,
    dir: &Path,
) -> Result<(Proc, SocketAddr)> {
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
pub(crate) fn cpu_ns(pid: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU time a process (`"self"` or a pid) has used so far as the kernel
/// accounts it, in nanoseconds: `utime + stime` of `/proc/PID/stat`, which
/// count every thread the process ever had (what `top` and `ps` show), in
/// clock ticks, so a reading is exact to a tick (10 ms).
pub(crate) fn accounted_cpu_ns(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name, in parentheses, may hold spaces: count after it.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    ticks * 1_000_000_000 / clock_ticks_per_second()
}

/// `getconf CLK_TCK`: the unit of `/proc/PID/stat`'s times (100 on Linux).
fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        command_output("getconf", &["CLK_TCK"])
            .and_then(|t| t.trim().parse().ok())
            .filter(|&t| t > 0)
            .unwrap_or(100)
    })
}

/// Sums the CPU time of a set of processes: the sidecar, or the direct
/// baseline's client and upstream (this process, plus fake-gcs-server when
/// it is the upstream).
#[derive(Clone, Debug)]
pub(crate) struct CpuMeter {
    pub(crate) pids: Vec<String>,
}

impl CpuMeter {
    pub(crate) fn of(pids: &[u32], with_self: bool) -> Self {
        let mut all: Vec<String> = pids.iter().map(u32::to_string).collect();
        if with_self {
            all.push("self".into());
        }
        CpuMeter { pids: all }
    }

    /// The live threads' CPU time, to the nanosecond ([`cpu_ns`]): for
    /// short intervals, where a tick is too coarse.
    pub(crate) fn read(&self) -> u64 {
        self.pids.iter().map(|pid| cpu_ns(pid)).sum()
    }

    /// The processes' CPU time as the kernel accounts it
    /// ([`accounted_cpu_ns`]): the headline figures.
    pub(crate) fn read_accounted(&self) -> u64 {
        self.pids.iter().map(|pid| accounted_cpu_ns(pid)).sum()
    }

    /// The first process's pid, unless it is this process.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.pids.first()?.parse().ok()
    }
}

/// A process's memory as the kernel accounts it, in KiB.
#[derive(Clone, Copy)]
pub(crate) struct Memory {
    /// Resident now (`VmRSS`): its own memory and the pages of its binary
    /// and libraries that are mapped.
    pub(crate) rss_kib: u64,
    /// The peak of `rss_kib` since it started (`VmHWM`).
    pub(crate) hwm_kib: u64,
    /// The part of `rss_kib` that is the process's own (`RssAnon`: heap,
    /// stacks, buffers); the rest is file pages, shared with every process
    /// that maps the same files.
    pub(crate) anon_kib: u64,
}

/// The memory of process `pid` (`/proc/PID/status`).
pub(crate) fn memory_kib(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))
    };
    Ok(Memory {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
        anon_kib: field("RssAnon:")?,
    })
}
