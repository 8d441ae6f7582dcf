//! `tools/envtest/install.sh` fetching the envtest release archive
//! (`tools/envtest/archive.sh`), against a loopback HTTP server, never the
//! internet. Each test runs the script from a copy of `tools/` whose
//! `archives.tsv` lists the archive the test built, with a cache of its
//! own and a fake `go` that fails at once, so that a fallback to the build
//! shows in the output instead of building for minutes.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Output,
    sync::{Arc, Mutex},
};

use std::fmt::Write as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpListener;

use super::*;
use crate::repo_path;

/// What the fake `go` prints: the script fell back to building.
const FAKE_GO: &str = "fake go: no build in this test";

/// How the server answers a path.
#[derive(Clone)]
enum Reply {
    /// The whole body.
    Whole(Vec<u8>),
    /// A `Content-Length` of the whole body, this many of its bytes, then
    /// the connection is closed: an interrupted download.
    Cut(Vec<u8>, usize),
}

/// A loopback HTTP/1.1 server answering each path in its routes (404
/// otherwise), recording the paths asked for.
struct Server {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(routes: HashMap<String, Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let routes = Arc::new(routes);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream, routes.clone(), seen.clone()));
            }
        });
        Server {
            url,
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// Reads one request and answers it from `routes`.
async fn answer(
    stream: tokio::net::TcpStream,
    routes: Arc<HashMap<String, Reply>>,
    seen: Arc<Mutex<Vec<String>>>,
) {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    stream.read_line(&mut line).await.unwrap();
    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
    loop {
        let mut header = String::new();
        if stream.read_line(&mut header).await.unwrap() == 0 || header == "\r\n" {
            break;
        }
    }
    seen.lock().unwrap().push(path.clone());
    let (status, body, sent) = match routes.get(&path) {
        Some(Reply::Whole(body)) => ("200 OK", body.as_slice(), body.len()),
        Some(Reply::Cut(body, sent)) => ("200 OK", body.as_slice(), *sent),
        None => ("404 Not Found", &b""[..], 0),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/gzip\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let stream = stream.get_mut();
    stream.write_all(head.as_bytes()).await.unwrap();
    // The client may give up early (a refused answer); that is its right.
    let _ = stream.write_all(&body[..sent]).await;
    let _ = stream.shutdown().await;
}

/// The fake binaries of an archive: name and what `--version` prints.
fn fake_binaries(apiserver: &str, etcd: &str) -> Vec<(&'static str, String)> {
    vec![
        ("kube-apiserver", apiserver.to_owned()),
        (
            "etcd",
            format!(
                "etcd Version: {}\\nGit SHA: fake",
                etcd.trim_start_matches('v')
            ),
        ),
        ("kubectl", "kubectl: fake".to_owned()),
    ]
}

/// The pinned versions, as an archive of them reports them.
fn pinned_binaries() -> Vec<(&'static str, String)> {
    let (kubernetes, etcd) = pinned_versions(TOOLS_GO_MOD).unwrap();
    fake_binaries(&format!("Kubernetes {kubernetes}"), &etcd)
}

/// A gzipped tar laid out like an envtest release archive
/// (`controller-tools/envtest/<binary>`), holding scripts that print
/// their version, made with the system's `tar`, as the release is.
fn archive(binaries: &[(&str, String)]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("controller-tools/envtest");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, version) in binaries {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\nprintf '{version}\\n'\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = dir.path().join("archive.tar.gz");
    let status = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&out)
        .arg("-C")
        .arg(dir.path())
        .arg("controller-tools/envtest")
        .status()
        .unwrap();
    assert!(status.success(), "tar: {status}");
    std::fs::read(out).unwrap()
}

fn sha512_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha512::digest(bytes)
        .iter()
        .fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

/// A copy of `tools/lib.sh` and `tools/envtest/` whose table lists
/// `rows` (version, sha512) for this host, a cache and a fake `go`.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(rows: &[(&str, &str)]) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let envtest = dir.path().join("tools/envtest");
        std::fs::create_dir_all(envtest.join("oldest")).unwrap();
        std::fs::copy(repo_path("tools/lib.sh"), dir.path().join("tools/lib.sh")).unwrap();
        for file in [
            "install.sh",
            "archive.sh",
            "archives.sh",
            "go.mod",
            "oldest/go.mod",
        ] {
            std::fs::copy(
                repo_path(&format!("tools/envtest/{file}")),
                envtest.join(file),
            )
            .unwrap();
        }
        let mut table = std::fs::read_to_string(repo_path("tools/envtest/archives.tsv")).unwrap();
        for (version, sha512) in rows {
            let _ = writeln!(table, "{version}\t{}\t{sha512}", platform());
        }
        std::fs::write(envtest.join("archives.tsv"), table).unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::write(
            bin.join("go"),
            format!("#!/bin/sh\necho '{FAKE_GO}' >&2\nexit 1\n"),
        )
        .unwrap();
        std::fs::set_permissions(bin.join("go"), std::fs::Permissions::from_mode(0o755)).unwrap();
        Fixture { dir }
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// The directory install.sh fills for `kubernetes` (pinned etcd).
    fn assets(&self, kubernetes: &str) -> PathBuf {
        let (_, etcd) = pinned_versions(TOOLS_GO_MOD).unwrap();
        self.cache()
            .join(format!("envtest/k8s-{kubernetes}-etcd-{etcd}"))
    }

    /// Runs the copy of install.sh with `args`, fetching from `url`.
    async fn install(&self, url: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.dir.path().join("bin")];
        paths.extend(std::env::split_paths(&path));
        let output = Command::new("bash")
            .arg(self.dir.path().join("tools/envtest/install.sh"))
            .args(args)
            .env_remove("KUBEBUILDER_ASSETS")
            .env_remove("BUCKETMAP_ENVTEST_FETCH")
            .env("BUCKETMAP_CACHE_DIR", self.cache())
            .env("BUCKETMAP_ENVTEST_ARCHIVE_URL", url)
            .env("PATH", std::env::join_paths(paths).unwrap())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        Run::from(output)
    }

    /// What the envtest cache holds besides the lock files: the published
    /// directories, and any temporary one a run left behind.
    fn cache_entries(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.cache().join("envtest")) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| !name.ends_with(".lock"))
            .collect();
        names.sort();
        names
    }
}

/// An install.sh run.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Run {
    /// Asserts that the run fell back to the (fake) build because of
    /// `reason`, and so failed.
    fn assert_fell_back(&self, reason: &str) {
        assert!(!self.success, "{}", self.stderr);
        let because = "building from the pinned Go modules because ";
        let line = self
            .stderr
            .lines()
            .find(|l| l.contains(because))
            .unwrap_or_else(|| panic!("no fallback said: {}", self.stderr));
        assert!(line.contains(reason), "{reason:?} not in {line:?}");
        assert!(self.stderr.contains(FAKE_GO), "{}", self.stderr);
        assert!(
            !self.stderr.contains("fetched the envtest archive"),
            "{}",
            self.stderr
        );
    }
}

/// The path the script asks the server for, for `version`.
fn archive_path(version: &str) -> String {
    format!("/envtest-{version}/envtest-{version}-{}.tar.gz", platform())
}

fn pinned_kubernetes() -> String {
    pinned_versions(TOOLS_GO_MOD).unwrap().0
}

/// `dir/name --version`, first line.
fn version_of(dir: &Path, name: &str) -> String {
    let out = std::process::Command::new(dir.join(name))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success(), "{name}: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn the_listed_archive_is_fetched_verified_and_installed() {
    let kubernetes = pinned_kubernetes();
    let body = archive(&pinned_binaries());
    let fixture = Fixture::new(&[(&kubernetes, &sha512_hex(&body))]);
    let routes = HashMap::from([(archive_path(&kubernetes), Reply::Whole(body))]);
    let server = Server::start(routes).await;

    let run = fixture.install(&server.url, &[], &[]).await;

    assert!(run.success, "{}", run.stderr);
    let assets = fixture.assets(&kubernetes);
    assert_eq!(run.stdout.lines().last(), Some(assets.to_str().unwrap()));
    assert!(missing_binaries(&assets).is_empty(), "{}", run.stderr);
    assert_eq!(
        version_of(&assets, "kube-apiserver"),
        format!("Kubernetes {kubernetes}")
    );
    let mut installed: Vec<String> = std::fs::read_dir(&assets)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    installed.sort();
    assert_eq!(
        installed,
        ["etcd", "kube-apiserver"],
        "only what the tests run"
    );
    assert!(
        run.stderr.contains("fetched the envtest archive"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("sha512 verified"), "{}", run.stderr);
    assert!(!run.stderr.contains(FAKE_GO), "{}", run.stderr);
    assert_eq!(server.requests(), [archive_path(&kubernetes)]);
    assert_eq!(
        fixture.cache_entries(),
        [assets.file_name().unwrap().to_str().unwrap()]
    );
}

#[tokio::test]
async fn an_archive_with_another_checksum_is_refused_and_nothing_installed() {
    let kubernetes = pinned_kubernetes();
    let body = archive(&pinned_binaries());
    // The table lists the checksum of another archive: one byte more.
    let mut other = body.clone();
    other.push(0);
    let fixture = Fixture::new(&[(&kubernetes, &sha512_hex(&other))]);
    let routes = HashMap::from([(archive_path(&kubernetes), Reply::Whole(body.clone()))]);
    let server = Server::start(routes).await;

    let run = fixture.install(&server.url, &[], &[]).await;

    run.assert_fell_back(&format!(
        "has sha512 {}, not the {}",
        sha512_hex(&body),
        sha512_hex(&other)
    ));
    assert_eq!(
        server.requests(),
        [archive_path(&kubernetes)],
        "it was fetched"
    );
    assert!(
        fixture.cache_entries().is_empty(),
        "{:?}",
        fixture.cache_entries()
    );
}

#[tokio::test]
async fn an_interrupted_download_is_refused_and_nothing_installed() {
    let kubernetes = pinned_kubernetes();
    let body = archive(&pinned_binaries());
    let fixture = Fixture::new(&[(&kubernetes, &sha512_hex(&body))]);
    let half = body.len() / 2;
    let routes = HashMap::from([(archive_path(&kubernetes), Reply::Cut(body, half))]);
    let server = Server::start(routes).await;

    let run = fixture.install(&server.url, &[], &[]).await;

    run.assert_fell_back("failed: curl: (18)");
    assert_eq!(server.requests(), [archive_path(&kubernetes)]);
    assert!(
        fixture.cache_entries().is_empty(),
        "{:?}",
        fixture.cache_entries()
    );
}

#[tokio::test]
async fn a_listed_archive_that_is_truncated_or_lacks_etcd_is_refused() {
    let kubernetes = pinned_kubernetes();
    let whole = archive(&pinned_binaries());
    let truncated = whole[..whole.len() / 2].to_vec();
    let without_etcd = archive(&[pinned_binaries()[0].clone()]);
    for (body, reason) in [
        (truncated, "the archive cannot be unpacked"),
        (
            without_etcd,
            "lacks controller-tools/envtest/kube-apiserver controller-tools/envtest/etcd",
        ),
    ] {
        let fixture = Fixture::new(&[(&kubernetes, &sha512_hex(&body))]);
        let routes = HashMap::from([(archive_path(&kubernetes), Reply::Whole(body))]);
        let server = Server::start(routes).await;

        let run = fixture.install(&server.url, &[], &[]).await;

        run.assert_fell_back(reason);
        assert_eq!(server.requests().len(), 1);
        assert!(
            fixture.cache_entries().is_empty(),
            "{:?}",
            fixture.cache_entries()
        );
    }
}

#[tokio::test]
async fn binaries_of_other_versions_are_refused() {
    let kubernetes = pinned_kubernetes();
    let (_, etcd) = pinned_versions(TOOLS_GO_MOD).unwrap();
    for binaries in [
        fake_binaries("Kubernetes v1.0.0", &etcd),
        fake_binaries(&format!("Kubernetes {kubernetes}"), "v3.0.0"),
    ] {
        let body = archive(&binaries);
        let fixture = Fixture::new(&[(&kubernetes, &sha512_hex(&body))]);
        let routes = HashMap::from([(archive_path(&kubernetes), Reply::Whole(body))]);
        let server = Server::start(routes).await;

        let run = fixture.install(&server.url, &[], &[]).await;

        run.assert_fell_back("the archive's binaries are not the pinned versions");
        assert!(run.stderr.contains("reports"), "{}", run.stderr);
        assert!(
            fixture.cache_entries().is_empty(),
            "{:?}",
            fixture.cache_entries()
        );
    }
}

#[tokio::test]
async fn an_unlisted_version_or_a_fetch_turned_off_asks_nothing() {
    let kubernetes = pinned_kubernetes();
    let body = archive(&pinned_binaries());
    let routes = HashMap::from([(archive_path(&kubernetes), Reply::Whole(body.clone()))]);
    let server = Server::start(routes).await;

    let unlisted = Fixture::new(&[("v0.0.1", &sha512_hex(&body))]);
    let run = unlisted.install(&server.url, &[], &[]).await;
    run.assert_fell_back(&format!(
        "lists no envtest archive of Kubernetes {kubernetes} for {}",
        platform()
    ));

    let listed = Fixture::new(&[(&kubernetes, &sha512_hex(&body))]);
    let run = listed
        .install(&server.url, &[], &[("BUCKETMAP_ENVTEST_FETCH", "0")])
        .await;
    run.assert_fell_back("BUCKETMAP_ENVTEST_FETCH=0");

    assert_eq!(server.requests(), Vec::<String>::new());
    assert!(unlisted.cache_entries().is_empty());
    assert!(listed.cache_entries().is_empty());
}

#[tokio::test]
async fn the_oldest_release_takes_its_apiserver_from_its_archive_and_the_pinned_etcd() {
    let kubernetes = pinned_kubernetes();
    let oldest = pinned_version_in(&repo_path("tools/envtest/oldest/go.mod"));
    let pinned = archive(&pinned_binaries());
    // The oldest release's archive has an etcd of its own, not the pinned one.
    let old = archive(&fake_binaries(&format!("Kubernetes {oldest}"), "v3.5.0"));
    let fixture = Fixture::new(&[
        (&kubernetes, &sha512_hex(&pinned)),
        (&oldest, &sha512_hex(&old)),
    ]);
    let routes = HashMap::from([
        (archive_path(&kubernetes), Reply::Whole(pinned)),
        (archive_path(&oldest), Reply::Whole(old)),
    ]);
    let server = Server::start(routes).await;

    let run = fixture.install(&server.url, &["--oldest"], &[]).await;

    assert!(run.success, "{}", run.stderr);
    let assets = fixture.assets(&oldest);
    assert_eq!(run.stdout.lines().last(), Some(assets.to_str().unwrap()));
    assert_eq!(
        version_of(&assets, "kube-apiserver"),
        format!("Kubernetes {oldest}")
    );
    let (_, etcd) = pinned_versions(TOOLS_GO_MOD).unwrap();
    assert_eq!(
        version_of(&assets, "etcd"),
        format!("etcd Version: {}", etcd.trim_start_matches('v'))
    );
    assert_eq!(
        server.requests(),
        [archive_path(&kubernetes), archive_path(&oldest)]
    );
    assert_eq!(
        fixture.cache_entries().len(),
        2,
        "{:?}",
        fixture.cache_entries()
    );
}

/// The Kubernetes version the go.mod at `path` pins.
fn pinned_version_in(path: &Path) -> String {
    let go_mod = std::fs::read_to_string(path).unwrap();
    go_mod
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find_map(|words| match words.as_slice() {
            ["k8s.io/kubernetes", v, ..] if v.starts_with('v') => Some((*v).to_owned()),
            _ => None,
        })
        .unwrap()
}

/// The base URL archive.sh fetches from, as it sets it.
fn archive_base_url() -> String {
    let script = std::fs::read_to_string(repo_path("tools/envtest/archive.sh")).unwrap();
    let line = script
        .lines()
        .find_map(|l| l.strip_prefix("envtest_archive_base_url=\""))
        .unwrap();
    line.trim_end_matches('"').to_owned()
}

/// An index entry as the release index writes it, linked at `base`.
fn index_entry(version: &str, platform: &str, hash: &str, base: &str) -> String {
    let name = format!("envtest-{version}-{platform}.tar.gz");
    format!("    {name}:\n      hash: {hash}\n      selfLink: {base}/envtest-{version}/{name}\n")
}

#[test]
fn the_table_rows_come_from_the_release_index() {
    let base = archive_base_url();
    let base = base.as_str();
    let kubernetes = pinned_kubernetes();
    let oldest = pinned_version_in(&repo_path("tools/envtest/oldest/go.mod"));
    let platforms = ["linux-amd64", "linux-arm64", "darwin-amd64", "darwin-arm64"];
    let hash = |v: &str, p: &str| sha512_hex(format!("{v} {p}").as_bytes());
    let index = |versions: &[&str], moved: Option<&str>| {
        let mut yaml = "releases:\n  v1.0.0:\n".to_owned();
        yaml += &index_entry("v1.0.0", "linux-amd64", &hash("v1.0.0", "x"), base);
        for v in versions {
            let _ = writeln!(yaml, "  {v}:");
            for p in platforms {
                let base = if moved == Some(p) {
                    "https://elsewhere.test/d"
                } else {
                    base
                };
                yaml += &index_entry(v, p, &hash(v, p), base);
            }
        }
        yaml
    };
    let fixture = Fixture::new(&[]);
    let run = |yaml: String| {
        let path = fixture.dir.path().join("index.yaml");
        std::fs::write(&path, yaml).unwrap();
        let out = std::process::Command::new("bash")
            .arg(fixture.dir.path().join("tools/envtest/archives.sh"))
            .arg(&path)
            .output()
            .unwrap();
        Run::from(out)
    };

    let complete = run(index(&[&kubernetes, &oldest], None));
    assert!(complete.success, "{}", complete.stderr);
    let expected: Vec<String> = [&kubernetes, &oldest]
        .iter()
        .flat_map(|v| platforms.map(|p| format!("{v}\t{p}\t{}", hash(v, p))))
        .collect();
    assert_eq!(complete.stdout.lines().collect::<Vec<_>>(), expected);

    let partial = run(index(&[&kubernetes], Some("darwin-arm64")));
    assert!(!partial.success, "{}", partial.stdout);
    assert_eq!(partial.stdout.lines().collect::<Vec<_>>(), expected[..3]);
    assert!(
        partial.stderr.contains("not where archive.sh fetches it"),
        "{}",
        partial.stderr
    );
    for p in platforms {
        let name = format!("the index has no envtest-{oldest}-{p}.tar.gz");
        assert!(partial.stderr.contains(&name), "{}", partial.stderr);
    }
}
