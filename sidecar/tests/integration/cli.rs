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

/// What a pod's stop sends: SIGTERM. The binary drains, says so, and
/// exits 0, where a sidecar that ignored the signal would be killed after
/// the grace period.
#[test]
fn sigterm_stops_the_sidecar_cleanly() -> TestResult {
    use std::io::{Read as _, Write as _};
    use std::time::{Duration, Instant};

    let addr = format!("127.0.0.1:{}", crate::common::procs::free_port()?);
    let mut child = Command::new(sidecar_bin())
        .args(["--listen", &addr, "--upstream", "http://127.0.0.1:1"])
        .args(["--no-auth", "--map", "photos=photos-k3x9q2mw"])
        .args(["--log-format", "text"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let ready = |addr: &str| -> bool {
        let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
            return false;
        };
        let request = "GET /_bucketmap/readyz HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n";
        let mut answer = String::new();
        stream.write_all(request.as_bytes()).is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.starts_with("HTTP/1.1 200")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready(&addr) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sidecar never got ready on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    anyhow::ensure!(kill.success(), "kill -TERM failed");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("the sidecar did not exit within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .map(|mut err| err.read_to_string(&mut stderr))
        .transpose()?;
    assert!(status.success(), "exit {status} after SIGTERM: {stderr}");
    assert!(stderr.contains("SIGTERM: draining"), "{stderr}");
    assert!(stderr.contains("bucketmap-sidecar stopped"), "{stderr}");
    Ok(())
}
