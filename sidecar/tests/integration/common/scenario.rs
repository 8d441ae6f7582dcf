//! The client scenario: the spec the test writes for the client programs
//! (bucket and object names, the files to upload) and the run of a client
//! program, which prints a JSON report of what it observed.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::procs::{clients, run_with_timeout};

pub const MIB: usize = 1024 * 1024;

/// The resumable upload chunk size the clients are told to use.
pub const CHUNK_SIZE: usize = 8 * MIB;

/// Larger than two chunks and not a multiple of the chunk size: three PUTs,
/// the last one short.
pub const LARGE_SIZE: usize = 20 * MIB + 12_345;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Python,
    Go,
    Node,
    /// Google's Java client (google-cloud-storage), default settings: gzipped request bodies.
    Java,
    /// The Rust SDK's `Storage` (crate google-cloud-storage): object reads and
    /// writes only; the rest of its API (`StorageControl`) is gRPC.
    Rust,
}

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Client::Python => "python",
            Client::Go => "go",
            Client::Node => "node",
            Client::Java => "java",
            Client::Rust => "rust",
        }
    }

    /// The steps the client program must report.
    pub fn steps(self) -> BTreeSet<&'static str> {
        if self == Client::Rust {
            return [
                "small_upload",
                "large_upload",
                "tree_upload",
                "download_full",
                "download_range",
                "not_found",
            ]
            .into();
        }
        let mut steps: BTreeSet<&str> = [
            "get_bucket",
            "small_upload",
            "large_upload",
            "tree_upload",
            "download_full",
            "download_range",
            "list_delimited",
            "list_prefix",
            "copy",
            "rewrite",
            "compose",
            "metadata_patch",
            "delete",
            "not_found",
        ]
        .into();
        match self {
            Client::Python => steps.extend(["resumable_session", "batch_delete"]),
            Client::Go => steps.extend(["download_full_json_api"]),
            Client::Node => steps.extend(["resumable_session", "env_only_client"]),
            Client::Java | Client::Rust => {}
        }
        steps
    }

    fn uses_session_url(self) -> bool {
        self.steps().contains("resumable_session")
    }

    /// Whether the client's scenario copies, rewrites and composes (all but
    /// the Rust SDK's `Storage`, which has no such calls).
    pub fn copies(self) -> bool {
        self.steps().contains("copy")
    }
}

/// What one client run is asked to do, with the data it uploads.
pub struct Scenario {
    pub spec_path: PathBuf,
    pub small: Vec<u8>,
    pub large: Vec<u8>,
    pub range: (usize, usize),
    pub tree: Vec<(String, String)>,
    pub compose_sources: Vec<String>,
    pub compose_destination: String,
    pub metadata: BTreeMap<String, String>,
    pub objects: BTreeMap<&'static str, String>,
    pub batch: Vec<String>,
    pub list_prefix: String,
}

/// Deterministic bytes that do not compress and have no repeating period.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Lowercase hex SHA-256, computed by coreutils' `sha256sum`.
pub fn sha256_hex(data: &[u8]) -> Result<String> {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run sha256sum (coreutils)")?;
    child
        .stdin
        .take()
        .context("sha256sum stdin")?
        .write_all(data)?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("sha256sum failed with {}", out.status);
    }
    let text = String::from_utf8(out.stdout)?;
    Ok(text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned())
}

impl Scenario {
    /// Write the spec and the files to upload into `dir`. `physical` is the
    /// physical name of each logical bucket (used as metadata values that
    /// must come back untouched).
    pub fn write(dir: &Path, physical: &BTreeMap<String, String>) -> Result<Scenario> {
        let small = "bucketmap small object: photos and videos, ü and 日本\n"
            .repeat(7)
            .into_bytes();
        let large = pseudo_random(LARGE_SIZE, 0x5eed_b0c4_e7a9_0001);
        let small_file = dir.join("small.txt");
        let large_file = dir.join("large.bin");
        std::fs::write(&small_file, &small)?;
        std::fs::write(&large_file, &large)?;

        let photos_physical = physical.get("photos").cloned().unwrap_or_default();
        let videos_physical = physical.get("videos").cloned().unwrap_or_default();
        let tree: Vec<(String, String)> = vec![
            ("tree/a/1.txt".into(), "first part\n".into()),
            ("tree/a/2.txt".into(), "second part\n".into()),
            ("tree/b/1.txt".into(), "b one".into()),
            ("tree/top.txt".into(), "top".into()),
            // Names that must survive encoding and must not be mistaken for buckets.
            ("tree/with space & ü+%.txt".into(), "odd name".into()),
            (
                "tree/literal%2Fslash.txt".into(),
                "percent-2F is part of this name".into(),
            ),
            ("tree/photos".into(), "named like the logical bucket".into()),
            (
                format!("tree/{videos_physical}.txt"),
                "named like a physical bucket".into(),
            ),
        ];
        let metadata: BTreeMap<String, String> = [
            ("color".to_owned(), "blue".to_owned()),
            ("logical-bucket".to_owned(), "photos".to_owned()),
            ("physical-bucket".to_owned(), photos_physical),
        ]
        .into();
        let objects: BTreeMap<&'static str, String> = [
            ("small", "docs/small.txt"),
            ("large", "media/large.bin"),
            ("session", "docs/session.txt"),
            ("copy", "copies/small.txt"),
            ("rewrite", "media/rewritten.bin"),
            ("missing", "does/not/exist.txt"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        let batch: Vec<String> = (0..3).map(|i| format!("batch/{i}.txt")).collect();
        let range = (CHUNK_SIZE - 1000, 3 * MIB + 7);
        let compose_sources = vec!["tree/a/1.txt".to_owned(), "tree/a/2.txt".to_owned()];
        let compose_destination = "composed/a.txt".to_owned();
        let list_prefix = "tree/".to_owned();

        let spec = json!({
            "buckets": { "photos": "photos", "videos": "videos" },
            "small_file": small_file,
            "large_file": large_file,
            "chunk_size": CHUNK_SIZE,
            "range": { "start": range.0, "length": range.1 },
            "tree": tree.iter().map(|(n, c)| json!({ "name": n, "content": c })).collect::<Vec<_>>(),
            "list_prefix": list_prefix,
            "compose": { "sources": compose_sources, "destination": compose_destination },
            "metadata": metadata,
            "objects": objects,
            "batch": { "prefix": "batch/", "delete": batch },
        });
        let spec_path = dir.join("spec.json");
        std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec)?)?;
        Ok(Scenario {
            spec_path,
            small,
            large,
            range,
            tree,
            compose_sources,
            compose_destination,
            metadata,
            objects,
            batch,
            list_prefix,
        })
    }

    pub fn object(&self, key: &str) -> &str {
        self.objects
            .get(key)
            .map(String::as_str)
            .unwrap_or_default()
    }

    pub fn tree_content(&self, name: &str) -> &[u8] {
        self.tree
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.as_bytes())
            .unwrap_or_default()
    }

    /// `prefix`/`delimiter` listing of the tree, computed from the names.
    pub fn expected_listing(&self, delimited: bool) -> (BTreeSet<String>, BTreeSet<String>) {
        let mut items = BTreeSet::new();
        let mut prefixes = BTreeSet::new();
        for (name, _) in &self.tree {
            let Some(rest) = name.strip_prefix(&self.list_prefix) else {
                continue;
            };
            match rest.find('/') {
                Some(i) if delimited => {
                    prefixes.insert(format!("{}{}/", self.list_prefix, &rest[..i]));
                }
                _ => {
                    items.insert(name.clone());
                }
            }
        }
        (items, prefixes)
    }

    /// logical bucket → object → expected bytes, once `client` has finished.
    pub fn expected_objects(
        &self,
        client: Client,
    ) -> BTreeMap<&'static str, BTreeMap<String, Vec<u8>>> {
        let mut photos: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        photos.insert(self.object("small").to_owned(), self.small.clone());
        photos.insert(self.object("large").to_owned(), self.large.clone());
        if client.uses_session_url() {
            photos.insert(self.object("session").to_owned(), self.small.clone());
        }
        for (name, content) in &self.tree {
            photos.insert(name.clone(), content.clone().into_bytes());
        }
        // The composed object is deleted by the `delete` step, the batch objects by `batch_delete`.
        let mut videos = BTreeMap::new();
        if client.copies() {
            videos.insert(self.object("copy").to_owned(), self.small.clone());
            videos.insert(self.object("rewrite").to_owned(), self.large.clone());
        }
        [("photos", photos), ("videos", videos)].into()
    }
}

/// Run a client program against `endpoint` (`http://127.0.0.1:PORT`) and parse its report.
/// `direct`: the endpoint is fake-gcs-server itself (the baseline runs).
pub fn run_client(
    client: Client,
    endpoint: &str,
    scenario: &Scenario,
    out_dir: &Path,
    direct: bool,
) -> Result<Value> {
    let installed = clients()?;
    let here = super::procs::repo_root().join("sidecar/tests/clients");
    let host_port = endpoint.trim_start_matches("http://");
    let path = |key: &str| {
        installed
            .get(key)
            .cloned()
            .with_context(|| format!("install.sh printed no {key}="))
    };
    let mut cmd = match client {
        Client::Python => {
            let mut cmd = Command::new(path("python")?);
            cmd.arg(here.join("python/scenario.py"))
                .env("STORAGE_EMULATOR_HOST", endpoint);
            cmd
        }
        Client::Go => {
            let mut cmd = Command::new(path("go")?);
            cmd.env("STORAGE_EMULATOR_HOST", host_port);
            cmd
        }
        Client::Node => {
            let mut cmd = Command::new("node");
            cmd.arg(here.join("node/scenario.js"))
                .env("NODE_PATH", path("node")?)
                .env("BUCKETMAP_TEST_ENDPOINT", endpoint)
                .env_remove("STORAGE_EMULATOR_HOST");
            cmd
        }
        Client::Java => {
            let dir = path("java")?;
            let classpath = format!(
                "{}:{}/*",
                dir.join("classes").display(),
                dir.join("lib").display()
            );
            let mut cmd = Command::new("java");
            cmd.args(["-cp", &classpath, "Scenario"])
                .env("BUCKETMAP_TEST_ENDPOINT", endpoint);
            cmd
        }
        Client::Rust => {
            let mut cmd = Command::new(path("rust")?);
            cmd.env("BUCKETMAP_TEST_ENDPOINT", endpoint);
            if direct {
                // Emulator gap: the SDK sends `Host: 127.0.0.1` without the
                // port, and fake-gcs-server builds the resumable session's
                // `Location` from `Host` (port 80), so no resumable upload can
                // work against it directly. The baseline writes in one shot;
                // through the sidecar, whose links do not come from `Host`,
                // the SDK's default resumable upload runs.
                cmd.env("BUCKETMAP_TEST_SINGLE_SHOT_ONLY", "1");
            }
            cmd
        }
    };
    cmd.arg(&scenario.spec_path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env_remove("CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE");
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    let started = Instant::now();
    let out = run_with_timeout(&mut cmd, Duration::from_secs(300))?;
    let report_path = out_dir.join(format!("{}-report.json", client.name()));
    let stderr_path = out_dir.join(format!("{}-stderr.log", client.name()));
    std::fs::write(&report_path, &out.stdout)?;
    std::fs::write(&stderr_path, &out.stderr)?;
    eprintln!("{} client ran in {:.1?}", client.name(), started.elapsed());
    if !out.status.success() {
        bail!(
            "{} client exited with {}\n{}",
            client.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{} printed no JSON report", client.name()))
}
