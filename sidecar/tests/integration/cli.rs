//! The binary's command line as a person or a pod meets it: what it says on
//! stderr when it cannot start, and how it stops.

use std::process::Command;

use crate::common::procs::Sidecar;

type TestResult = anyhow::Result<()>;

/// A log read from a pipe or a file (a pod's log, a CI job's) is plain
/// text: no terminal colour codes, whatever the log format.
#[test]
fn a_start_up_failure_is_logged_as_plain_text_to_a_pipe() -> TestResult {
    let out = Command::new(Sidecar::bin())
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

/// What a pod's stop sends: SIGTERM. The binary drains, says so, and
/// exits 0, where a sidecar that ignored the signal would be killed after
/// the grace period.
#[test]
fn sigterm_stops_the_sidecar_cleanly() -> TestResult {
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir()?;
    let args = ["--map", "photos=photos-k3x9q2mw", "--log-format", "text"].map(String::from);
    let mut sidecar = Sidecar::start(dir.path(), "http://127.0.0.1:1", &args)?;
    let kill = Command::new("kill")
        .args(["-TERM", &sidecar.proc.pid().to_string()])
        .status()?;
    anyhow::ensure!(kill.success(), "kill -TERM failed");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = sidecar.proc.child.try_wait()? {
            break status;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sidecar did not exit within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(&sidecar.proc.log)?;
    assert!(status.success(), "exit {status} after SIGTERM: {log}");
    assert!(log.contains("SIGTERM: draining"), "{log}");
    assert!(log.contains("bucketmap-sidecar stopped"), "{log}");
    Ok(())
}
