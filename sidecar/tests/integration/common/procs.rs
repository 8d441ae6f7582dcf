//! The processes a test runs: fake-gcs-server (the upstream), the sidecar, and
//! the installed client programs.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use super::http::{Request, encode};

/// The repository root (the sidecar crate is `sidecar/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sidecar/ has a parent")
        .to_path_buf()
}

/// Run an install script and return the last line of its stdout.
fn run_install(script: &Path, args: &[&str]) -> Result<String> {
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} {:?} failed with {}", script.display(), args, out.status);
    }
    let stdout = String::from_utf8(out.stdout).context("install script printed non-UTF-8")?;
    if started.elapsed() > Duration::from_secs(5) {
        eprintln!(
            "{} {args:?} took {:.1?}",
            script.display(),
            started.elapsed()
        );
    }
    Ok(stdout.trim_end().to_owned())
}

/// The binary a `tools/NAME/install.sh` script prints, installed once per
/// test process (`cell` keeps it).
pub fn tool_bin(cell: &OnceLock<Result<PathBuf, String>>, name: &str) -> Result<PathBuf> {
    cell.get_or_init(|| {
        let script = repo_root().join(format!("tools/{name}/install.sh"));
        run_install(&script, &[])
            .map(|out| PathBuf::from(out.lines().last().unwrap_or_default()))
            .map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// The fake-gcs-server binary, built once from tools/fake-gcs-server.
pub fn fake_gcs_server_bin() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    tool_bin(&BIN, "fake-gcs-server")
}

/// Installed client programs: `python` (venv interpreter), `go` (scenario
/// binary), `node` (node_modules directory).
pub fn clients() -> Result<BTreeMap<String, PathBuf>> {
    static CLIENTS: OnceLock<Result<BTreeMap<String, PathBuf>, String>> = OnceLock::new();
    CLIENTS
        .get_or_init(|| {
            let script = repo_root().join("sidecar/tests/clients/install.sh");
            let out = run_install(&script, &[]).map_err(|e| format!("{e:#}"))?;
            Ok(out
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), PathBuf::from(v)))
                .collect())
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// The last `lines` lines of a log file, for failure messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            format!(
                "--- {} (last {} lines) ---\n{}",
                path.display(),
                all.len() - start,
                all[start..].join("\n")
            )
        }
        Err(e) => format!("--- {}: {e} ---", path.display()),
    }
}

/// A child process killed when dropped.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> Result<Proc> {
        let file =
            File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// Fail if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited with {status}\n{}",
                self.name,
                log_tail(&self.log, 40)
            );
        }
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `url_path` on `addr` until it answers 200, the process dies, or `timeout`.
fn wait_ready(proc: &mut Proc, addr: SocketAddr, path: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        proc.check_running()?;
        match Request::get(path).send(addr) {
            Ok(resp) if resp.status == 200 => return Ok(()),
            Ok(resp) => last = resp.summary(),
            Err(e) => last = format!("{e:#}"),
        }
        thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "{} at {addr} not ready after {timeout:?} (GET {path}: {last})\n{}",
        proc.name,
        log_tail(&proc.log, 40)
    )
}

/// (bucket, object) → (generation, metageneration, size).
pub type Snapshot = BTreeMap<(String, String), (String, String, String)>;

/// fake-gcs-server on a loopback port, memory backend.
pub struct FakeGcs {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl FakeGcs {
    /// Start it, retrying on a port lost to a race, and create `buckets`.
    pub fn start(log_dir: &Path, buckets: &[&str]) -> Result<FakeGcs> {
        let bin = fake_gcs_server_bin()?;
        let mut last_err = None;
        for attempt in 0..3 {
            let port = free_port()?;
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let mut cmd = Command::new(&bin);
            // -public-host and -external-url name the address clients reach
            // it on, so the links and session URLs it returns are usable, and
            // the XML API (path style) answers requests whose Host is exactly
            // this address — as GCS wants Host: storage.googleapis.com.
            cmd.args([
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-backend",
                "memory",
                "-log-level",
                "info",
            ])
            .args(["-port", &port.to_string()])
            .args(["-public-host", &addr.to_string()])
            .args(["-external-url", &format!("http://{addr}")]);
            let log = log_dir.join(format!("fake-gcs-server-{attempt}.log"));
            let mut proc = Proc::spawn("fake-gcs-server", &mut cmd, log)?;
            match wait_ready(
                &mut proc,
                addr,
                "/_internal/healthcheck",
                Duration::from_secs(20),
            ) {
                Ok(()) => {
                    let fake = FakeGcs { proc, addr };
                    for bucket in buckets {
                        fake.create_bucket(bucket)?;
                    }
                    return Ok(fake);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow!("fake-gcs-server did not start")))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn create_bucket(&self, name: &str) -> Result<()> {
        let resp = Request::new("POST", "/storage/v1/b")
            .json(&json!({ "name": name }))
            .send(self.addr)?;
        if resp.status != 200 {
            bail!(
                "cannot create bucket {name} in fake-gcs-server: {}",
                resp.summary()
            );
        }
        Ok(())
    }

    pub fn bucket_names(&self) -> Result<Vec<String>> {
        let resp = Request::get("/storage/v1/b").send(self.addr)?;
        let body = resp.json()?;
        let mut names: Vec<String> = body["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|b| b["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        Ok(names)
    }

    /// Every object resource in a bucket, straight from fake-gcs-server.
    pub fn objects(&self, bucket: &str) -> Result<BTreeMap<String, Value>> {
        let mut out = BTreeMap::new();
        let mut token: Option<String> = None;
        loop {
            let mut target = format!("/storage/v1/b/{}/o?maxResults=1000", encode(bucket));
            if let Some(t) = &token {
                target.push_str(&format!("&pageToken={}", encode(t)));
            }
            let resp = Request::get(target).send(self.addr)?;
            if resp.status != 200 {
                bail!(
                    "cannot list {bucket} in fake-gcs-server: {}",
                    resp.summary()
                );
            }
            let body = resp.json()?;
            for item in body["items"].as_array().into_iter().flatten() {
                if let Some(name) = item["name"].as_str() {
                    out.insert(name.to_owned(), item.clone());
                }
            }
            match body["nextPageToken"].as_str() {
                Some(t) if !t.is_empty() => token = Some(t.to_owned()),
                _ => return Ok(out),
            }
        }
    }

    /// An object's bytes, straight from fake-gcs-server.
    pub fn content(&self, bucket: &str, object: &str) -> Result<Vec<u8>> {
        let target = format!(
            "/download/storage/v1/b/{}/o/{}?alt=media",
            encode(bucket),
            encode(object)
        );
        let resp = Request::get(target).send(self.addr)?;
        if resp.status != 200 {
            bail!(
                "cannot read {bucket}/{object} from fake-gcs-server: {}",
                resp.summary()
            );
        }
        Ok(resp.body)
    }

    /// Upload an object straight to fake-gcs-server.
    pub fn put(&self, bucket: &str, object: &str, data: &[u8]) -> Result<()> {
        let target = format!(
            "/upload/storage/v1/b/{}/o?uploadType=media&name={}",
            encode(bucket),
            encode(object)
        );
        let resp = Request::new("POST", target)
            .header("Content-Type", "application/octet-stream")
            .body(data.to_vec())
            .send(self.addr)?;
        if resp.status != 200 {
            bail!(
                "cannot write {bucket}/{object} to fake-gcs-server: {}",
                resp.summary()
            );
        }
        Ok(())
    }

    /// (bucket, object) → (generation, metageneration, size) of everything
    /// upstream: two equal snapshots mean nothing was written in between.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let mut out = BTreeMap::new();
        for bucket in self.bucket_names()? {
            for (name, item) in self.objects(&bucket)? {
                let field = |k: &str| item[k].as_str().unwrap_or_default().to_owned();
                out.insert(
                    (bucket.clone(), name),
                    (field("generation"), field("metageneration"), field("size")),
                );
            }
        }
        Ok(out)
    }
}

/// The sidecar under test.
pub struct Sidecar {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl Sidecar {
    /// Readiness on the proxy listener (under `/_bucketmap/`: a plain
    /// `/readyz` would shadow a bucket named "readyz" in the XML API).
    pub const READYZ: &'static str = "/_bucketmap/readyz";

    /// The binary under test: `BUCKETMAP_SIDECAR_BIN` when set (CI runs
    /// the loopback tests against the shipped build of
    /// `tools/pgo/build.sh` too), otherwise cargo's build of this package.
    pub fn bin() -> std::ffi::OsString {
        std::env::var_os("BUCKETMAP_SIDECAR_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_bucketmap-sidecar").into())
    }

    /// Liveness on the proxy listener.
    pub const HEALTHZ: &'static str = "/_bucketmap/healthz";

    /// Start `bucketmap-sidecar --listen 127.0.0.1:PORT --upstream URL --no-auth ARGS...`
    /// and wait until it is ready (a map is loaded).
    pub fn start(log_dir: &Path, upstream: &str, args: &[String]) -> Result<Sidecar> {
        Self::start_until(log_dir, upstream, args, Self::READYZ, None)
    }

    /// Like [`Sidecar::start`], but only wait until it serves (ready or not).
    pub fn start_unready(log_dir: &Path, upstream: &str, args: &[String]) -> Result<Sidecar> {
        Self::start_until(log_dir, upstream, args, Self::HEALTHZ, None)
    }

    /// Like [`Sidecar::start`], but with Application Default Credentials
    /// from the file `credentials` (`GOOGLE_APPLICATION_CREDENTIALS`)
    /// instead of `--no-auth`.
    pub fn start_with_credentials(
        log_dir: &Path,
        upstream: &str,
        args: &[String],
        credentials: &Path,
    ) -> Result<Sidecar> {
        Self::start_until(log_dir, upstream, args, Self::READYZ, Some(credentials))
    }

    fn start_until(
        log_dir: &Path,
        upstream: &str,
        args: &[String],
        probe: &str,
        credentials: Option<&Path>,
    ) -> Result<Sidecar> {
        let mut last_err = None;
        for attempt in 0..3 {
            let port = free_port()?;
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let mut cmd = Command::new(Self::bin());
            cmd.args(["--listen", &addr.to_string(), "--upstream", upstream]);
            match credentials {
                Some(file) => {
                    cmd.env("GOOGLE_APPLICATION_CREDENTIALS", file);
                    // The token endpoint is on loopback: no proxy in between.
                    for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                        cmd.env_remove(var);
                    }
                }
                None => {
                    cmd.arg("--no-auth");
                }
            }
            cmd.args(args);
            cmd.env("NO_COLOR", "1");
            if std::env::var_os("RUST_LOG").is_none() {
                // With credentials, every line a library may log too: a
                // token must not show even there.
                cmd.env(
                    "RUST_LOG",
                    if credentials.is_some() {
                        "debug"
                    } else {
                        "info"
                    },
                );
            }
            let log = log_dir.join(format!("sidecar-{attempt}.log"));
            let mut proc = Proc::spawn("bucketmap-sidecar", &mut cmd, log)?;
            match wait_ready(&mut proc, addr, probe, Duration::from_secs(20)) {
                Ok(()) => return Ok(Sidecar { proc, addr }),
                Err(e) => {
                    // A port lost to a race shows as an early exit; anything else is final.
                    let exited = proc.child.try_wait()?.is_some();
                    last_err = Some(e);
                    if !exited {
                        break;
                    }
                }
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow!("bucketmap-sidecar did not start")))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Wait until `/_bucketmap/readyz` answers 200.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        wait_ready(&mut self.proc, self.addr, Self::READYZ, timeout)
    }
}

/// Run a command with a time limit, capturing stdout and stderr.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let stdout = child.stdout.take().map(|mut s| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut s, &mut buf).map(|_| buf)
        })
    });
    let stderr = child.stderr.take().map(|mut s| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut s, &mut buf).map(|_| buf)
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} did not finish within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(50));
    };
    let join = |h: Option<thread::JoinHandle<std::io::Result<Vec<u8>>>>| -> Result<Vec<u8>> {
        match h {
            Some(h) => Ok(h.join().map_err(|_| anyhow!("reader thread panicked"))??),
            None => Ok(Vec::new()),
        }
    };
    Ok(Output {
        status,
        stdout: join(stdout)?,
        stderr: join(stderr)?,
    })
}
