//! The binary's command line as a person or a pod meets it: what it says on
//! stderr when it cannot start.

use std::process::Command;

type TestResult = anyhow::Result<()>;

/// The binary under test: `BUCKETMAP_SIDECAR_BIN` (CI's shipped build)
/// when set, else cargo's build (as `common::procs::Sidecar::bin`).
fn sidecar_bin() -> std::ffi::OsString {
    std::env::var_os("BUCKETMAP_SIDECAR_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_bucketmap-sidecar").into())
}

/// A log read from a pipe or a file (a pod's log, a CI job's) is plain
/// text: no terminal colour codes, whatever the log format.
#[test]
fn a_start_up_failure_is_logged_as_plain_text_to_a_pipe() -> TestResult {
    let out = Command::new(sidecar_bin())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "https://127.0.0.1:1",
        ])
        .args(["--no-auth", "--map", "photos=photos-k3x9q2mw"])
        .args(["--upstream-ca-file", "/nonexistent/ca.pem"])
        .args(["--log-format", "text"])
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .output()?;
    assert!(
        !out.status.success(),
        "started without its CA file: {out:?}"
    );
    let stderr = String::from_utf8(out.stderr)?;
    assert!(
        stderr.contains("cannot read --upstream-ca-file /nonexistent/ca.pem"),
        "{stderr}"
    );
    // The map's line comes through the logger, before the failure.
    assert!(stderr.contains("mapping loaded"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "escape codes in {stderr:?}");
    Ok(())
}
