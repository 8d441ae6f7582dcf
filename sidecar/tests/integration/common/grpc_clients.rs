//! The gRPC client scenarios (Go `storage.NewGRPCClient`, Java
//! `StorageOptions.grpc()`, the Rust SDK's `StorageControl` and
//! `Storage::open_object`) against any plaintext
//! HTTP/2 endpoint (the in-repo mock GCS directly, or a proxy in front of
//! it), checked by the reports and by what the mock holds.
//!
//! The spec names logical buckets (what the clients see); the checks look
//! in the mock's physical buckets. Directly against the mock both are the
//! same.

// The checks read top to bottom, one per step; the one-screen rule for
// functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bucketmap_testkit::mock_gcs::{Call, MockHandle};
use serde_json::{Value, json};

use super::checks::Checks;
use super::procs::{clients, run_with_timeout};
use super::scenario::{pseudo_random, sha256_hex};

const MIB: usize = 1024 * 1024;

/// What the gRPC scenarios read and write, and where.
#[derive(Debug, Clone)]
pub struct GrpcSpec {
    pub spec_path: PathBuf,
    /// Logical bucket name (`photos`, `videos`) to the name clients use.
    pub logical: BTreeMap<String, String>,
    /// Logical bucket name to the mock's bucket id.
    pub physical: BTreeMap<String, String>,
    pub small: Vec<u8>,
    /// Over 16 MiB: the Go client's default resumable upload flushes.
    pub large: Vec<u8>,
    pub range: (u64, u64),
    /// Objects in `photos` the Rust scenario composes (it cannot write).
    pub sources: Vec<(String, Vec<u8>)>,
    pub objects: BTreeMap<&'static str, String>,
}

impl GrpcSpec {
    /// Writes the spec and the files into `dir`. `logical` and `physical`
    /// map `photos` and `videos` to the names clients use and the mock's
    /// bucket ids.
    pub fn write(
        dir: &Path,
        logical: &BTreeMap<String, String>,
        physical: &BTreeMap<String, String>,
    ) -> Result<GrpcSpec> {
        let small = b"bucketmap gRPC small object\n".to_vec();
        let large = pseudo_random(20 * MIB + 4321, 0x9e37);
        let small_file = dir.join("grpc-small.bin");
        let large_file = dir.join("grpc-large.bin");
        std::fs::write(&small_file, &small)?;
        std::fs::write(&large_file, &large)?;
        let objects: BTreeMap<&'static str, String> = [
            ("small", "grpc/small.txt"),
            ("large", "grpc/large.bin"),
            ("missing", "grpc/missing.bin"),
            ("composed", "grpc/composed.bin"),
            ("copy", "grpc-copies/composed.bin"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        let sources: Vec<(String, Vec<u8>)> = (0..3u64)
            .map(|i| {
                let len = [3 * MIB + 1, 17, MIB][i as usize];
                (format!("grpc/part-{i}"), pseudo_random(len, 77 + i))
            })
            .collect();
        let range = (2 * MIB as u64 + 100, 3 * MIB as u64);
        let spec = json!({
            "buckets": logical,
            "small_file": small_file,
            "large_file": large_file,
            "range": { "start": range.0, "length": range.1 },
            "list_prefix": "grpc/",
            "objects": {
                "small": objects["small"],
                "large": objects["large"],
                "missing": objects["missing"],
                "composed": objects["composed"],
                "copy": objects["copy"],
            },
            "sources": sources.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        });
        let spec_path = dir.join("grpc-spec.json");
        std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec)?)?;
        Ok(GrpcSpec {
            spec_path,
            logical: logical.clone(),
            physical: physical.clone(),
            small,
            large,
            range,
            sources,
            objects,
        })
    }

    fn physical<'a>(&'a self, logical: &'a str) -> &'a str {
        self.physical.get(logical).map_or(logical, String::as_str)
    }

    /// Puts the Rust scenario's source objects into the mock.
    pub fn arrange_rust(&self, mock: &MockHandle) -> Result<()> {
        for (name, data) in &self.sources {
            mock.put_object_data(self.physical("photos"), name, data.clone())?;
        }
        Ok(())
    }
}

/// The gRPC client programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcClient {
    Go,
    Rust,
    /// Google's Java client over gRPC (`StorageOptions.grpc()`): the Go
    /// scenario's steps and report, checked by [`check_go`].
    Java,
}

impl GrpcClient {
    pub fn name(self) -> &'static str {
        match self {
            GrpcClient::Go => "go",
            GrpcClient::Rust => "rust",
            GrpcClient::Java => "java",
        }
    }

    /// The command that runs the scenario with `spec` (the endpoint is
    /// given in the environment).
    fn command(self, program: &Path, spec: &Path) -> Command {
        match self {
            GrpcClient::Go | GrpcClient::Rust => {
                let mut cmd = Command::new(program);
                cmd.arg("--grpc").arg(spec);
                cmd
            }
            GrpcClient::Java => {
                let classpath = format!(
                    "{}:{}/*",
                    program.join("classes").display(),
                    program.join("lib").display()
                );
                let mut cmd = Command::new("java");
                cmd.args(["-cp", &classpath, "GrpcScenario"]).arg(spec);
                cmd
            }
        }
    }
}

/// Runs `client`'s gRPC scenario against `endpoint` (`http://127.0.0.1:PORT`);
/// its report. Blocking: call it from `spawn_blocking` next to a mock.
pub fn run_grpc_client(
    client: GrpcClient,
    endpoint: &str,
    spec: &GrpcSpec,
    out_dir: &Path,
) -> Result<Value> {
    let installed = clients()?;
    let program = installed
        .get(client.name())
        .cloned()
        .with_context(|| format!("install.sh printed no {}=", client.name()))?;
    let endpoint_value = match client {
        GrpcClient::Go => endpoint.trim_start_matches("http://").to_owned(),
        GrpcClient::Rust | GrpcClient::Java => endpoint.to_owned(),
    };
    let mut cmd = client.command(&program, &spec.spec_path);
    cmd.env("BUCKETMAP_TEST_GRPC_ENDPOINT", endpoint_value)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env_remove("STORAGE_EMULATOR_HOST")
        .env_remove("STORAGE_EMULATOR_HOST_GRPC");
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
    let name = client.name();
    std::fs::write(
        out_dir.join(format!("{name}-grpc-report.json")),
        &out.stdout,
    )?;
    std::fs::write(out_dir.join(format!("{name}-grpc-stderr.log")), &out.stderr)?;
    eprintln!("{name} gRPC client ran in {:.1?}", started.elapsed());
    if !out.status.success() {
        bail!(
            "{name} gRPC client exited with {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{name} gRPC client printed no JSON report"))
}

fn step<'a>(checks: &mut Checks, report: &'a Value, name: &str) -> Option<&'a Value> {
    let step = &report["steps"][name];
    if step["ok"] != json!(true) {
        checks.fail(format!("step {name} failed: {step}"));
        return None;
    }
    Some(step)
}

fn digest_of(data: &[u8]) -> Result<Value> {
    Ok(json!({ "len": data.len(), "sha256": sha256_hex(data)? }))
}

/// Checks the Go (or Java) report and the mock: the written objects hold the bytes,
/// reads and listings saw them, the deleted one is gone.
pub fn check_go(
    checks: &mut Checks,
    spec: &GrpcSpec,
    report: &Value,
    mock: &MockHandle,
) -> Result<()> {
    let photos = spec.physical("photos");
    let (small, large) = (&spec.objects["small"], &spec.objects["large"]);
    for (name, data, key) in [
        (small, &spec.small, "write_small"),
        (large, &spec.large, "write_large"),
    ] {
        if let Some(s) = step(checks, report, key) {
            checks.eq(
                &format!("{key} size"),
                s["resource"]["size"].clone(),
                json!(data.len().to_string()),
            );
            checks.eq(
                &format!("{key} bucket"),
                s["resource"]["bucket"].clone(),
                json!(spec.logical["photos"]),
            );
        }
        if name == large {
            let stored = mock.object_data(photos, name);
            checks.check(stored.as_deref() == Some(&data[..]), || {
                format!(
                    "the mock holds {:?} bytes for {name}, want {}",
                    stored.map(|d| d.len()),
                    data.len()
                )
            });
        }
    }
    let (start, len) = (spec.range.0 as usize, spec.range.1 as usize);
    let expected = [
        ("read_full", digest_of(&spec.large)?),
        ("read_small", digest_of(&spec.small)?),
        ("read_range", digest_of(&spec.large[start..start + len])?),
        (
            "bidi_read_range",
            digest_of(&spec.large[start..start + len])?,
        ),
    ];
    for (key, want) in expected {
        if let Some(s) = step(checks, report, key) {
            checks.eq(key, s["data"].clone(), want);
        }
    }
    if let Some(s) = step(checks, report, "list") {
        checks.eq("list", s["names"].clone(), json!([large, small]));
    }
    if let Some(s) = step(checks, report, "attrs") {
        let crc = crc32c_of(&spec.large);
        checks.eq("attrs crc32c", s["crc32c"].clone(), json!(crc.to_string()));
    }
    if let Some(s) = step(checks, report, "delete") {
        checks.eq(
            "delete: exists after",
            s["exists_after"].clone(),
            json!(false),
        );
    }
    checks.check(mock.object_data(photos, small).is_none(), || {
        format!("{small} is still in the mock")
    });
    if let Some(s) = step(checks, report, "not_found") {
        checks.eq(
            "not_found attrs",
            s["error"]["object_not_exist"].clone(),
            json!(true),
        );
        checks.eq(
            "not_found read",
            s["read_error"]["object_not_exist"].clone(),
            json!(true),
        );
    }
    Ok(())
}

/// Checks the Rust report and the mock: compose and rewrite made the
/// objects with the concatenated bytes, the bidi read saw the range.
pub fn check_rust(
    checks: &mut Checks,
    spec: &GrpcSpec,
    report: &Value,
    mock: &MockHandle,
) -> Result<()> {
    let (photos, videos) = (spec.physical("photos"), spec.physical("videos"));
    let whole: Vec<u8> = spec
        .sources
        .iter()
        .flat_map(|(_, d)| d.iter().copied())
        .collect();
    if let Some(s) = step(checks, report, "get_bucket") {
        checks.eq(
            "get_bucket",
            s["bucket"]["bucket_id"].clone(),
            json!(spec.logical["photos"]),
        );
    }
    if let Some(s) = step(checks, report, "list_objects") {
        let names: Vec<&String> = spec.sources.iter().map(|(n, _)| n).collect();
        checks.eq("list_objects", s["names"].clone(), json!(names));
    }
    if let Some(s) = step(checks, report, "get_object") {
        checks.eq(
            "get_object size",
            s["resource"]["size"].clone(),
            json!(spec.sources[0].1.len().to_string()),
        );
    }
    if let Some(s) = step(checks, report, "compose_object") {
        checks.eq(
            "compose size",
            s["resource"]["size"].clone(),
            json!(whole.len().to_string()),
        );
        checks.eq(
            "compose components",
            s["component_count"].clone(),
            json!(spec.sources.len()),
        );
    }
    let composed = mock.object_data(photos, &spec.objects["composed"]);
    checks.check(composed.as_deref() == Some(&whole[..]), || {
        "the composed object's bytes differ".to_owned()
    });
    if let Some(s) = step(checks, report, "rewrite_object") {
        checks.eq("rewrite done", s["done"].clone(), json!(true));
        checks.eq(
            "rewrite bucket",
            s["resource"]["bucket"].clone(),
            json!(spec.logical["videos"]),
        );
    }
    let copy = mock.object_data(videos, &spec.objects["copy"]);
    checks.check(copy.as_deref() == Some(&whole[..]), || {
        "the rewritten copy's bytes differ".to_owned()
    });
    let (start, len) = (spec.range.0 as usize, spec.range.1 as usize);
    if let Some(s) = step(checks, report, "open_object") {
        let want = &whole[start.min(whole.len())..(start + len).min(whole.len())];
        checks.eq("open_object range", s["range"].clone(), digest_of(want)?);
    }
    if let Some(s) = step(checks, report, "delete_object") {
        checks.eq(
            "delete: exists after",
            s["exists_after"].clone(),
            json!(false),
        );
    }
    checks.check(
        mock.object_data(photos, &spec.sources[0].0).is_none(),
        || "the deleted source is still in the mock".to_owned(),
    );
    if let Some(s) = step(checks, report, "not_found") {
        checks.eq(
            "not_found code",
            s["error"]["grpc_code"].clone(),
            json!("NotFound"),
        );
    }
    Ok(())
}

/// The gRPC methods the mock saw, in order, without repeats in a row.
pub fn methods(calls: &[Call]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for call in calls {
        if out.last() != Some(&call.method) {
            out.push(call.method.clone());
        }
    }
    out
}

fn crc32c_of(data: &[u8]) -> u32 {
    // Castagnoli, reflected, bitwise: enough for a test's 20 MiB.
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
