//! The workspace's other binaries (`bucketmap-sidecar` for the demo) next
//! to this one, built with the same profile when missing or older than this
//! binary (which links the operator's library, so it is rebuilt whenever
//! that changes). Always running `cargo build` would rebuild dependencies
//! with other features inside `cargo test --workspace`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use tokio::process::Command;

/// `bin` of workspace package `package`, in this binary's directory.
pub async fn sibling(package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this binary")?;
    let path = exe.with_file_name(bin);
    if !older(&path, &exe) {
        return Ok(path);
    }
    let release = exe
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|p| p.to_str())
        == Some("release");
    let mut build = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    build.args(["build", "--quiet", "-p", package, "--bin", bin]);
    for name in bucketmap_testkit::package_env_vars() {
        build.env_remove(name);
    }
    if release {
        build.arg("--release");
    }
    eprintln!("building {bin} ({package})...");
    let status = build
        .current_dir(bucketmap_testkit::repo_path(""))
        .status()
        .await
        .with_context(|| format!("cannot run cargo to build {bin}"))?;
    anyhow::ensure!(status.success(), "building {bin} failed ({status})");
    anyhow::ensure!(
        path.exists(),
        "cargo built {bin} but {} is missing",
        path.display()
    );
    Ok(path)
}

/// Whether `path` is missing or older than `than`.
fn older(path: &Path, than: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(path), modified(than)) {
        (Some(a), Some(b)) => a < b,
        _ => true,
    }
}
