//! The `bucketmap` binary as a person runs it: `bucketmap operator` with a
//! kubeconfig, serving metrics and probes, stopping cleanly on SIGTERM; and
//! `bucketmap crd` printing the checked-in CRD.

use crate::common;

use std::time::Duration;

use anyhow::Context as _;
use bucketmap_testkit::free_port;
use common::{Fixture, physical};

type TestResult = anyhow::Result<()>;

/// GET on the operator's metrics and probes listener.
async fn get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    bucketmap_testkit::http::get(addr, path).await
}

#[tokio::test]
async fn operator_command_serves_probes_and_metrics_and_stops_on_sigterm() -> TestResult {
    let f = Fixture::new().await?;
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let log = tempfile::NamedTempFile::new()?;
    let mut child = f
        .operator_command()
        .args(["--default-project", "bin-project", "--namespace", &f.ns])
        .args(["--metrics-addr", &addr])
        .env_remove("NO_COLOR")
        .stderr(log.reopen()?)
        .spawn()?;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let probe = get(&addr, "/readyz").await;
        if let Ok((200, body)) = &probe {
            assert_eq!(body, "ok");
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "operator never became ready: {probe:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(&addr, "/healthz").await?.0, 200);

    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_ready("photos").await?;
    assert_eq!(
        g.status.as_ref().and_then(|s| s.project_id.as_deref()),
        Some("bin-project")
    );
    assert!(f.gcs.bucket(&physical(&g)).is_some());

    let (status, metrics) = get(&addr, "/metrics").await?;
    assert_eq!(status, 200);
    assert!(
        metrics.contains(r#"bucketmap_gcs_calls_total{method="CreateBucket",code="OK"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("bucketmap_reconciles_total"), "{metrics}");
    assert!(
        metrics.contains("bucketmap_reconcile_duration_seconds_bucket"),
        "{metrics}"
    );

    let pid = child.id().context("operator exited early")?;
    // Delivered with kill(1), as an init system or a person would.
    let sent = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await?;
    assert!(sent.success(), "kill -TERM {pid} failed");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await??;
    assert!(status.success(), "operator exited with {status}");
    // Its log, written to a file as to a pod's log, is plain text.
    let log = std::fs::read_to_string(log.path())?;
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\u{1b}'), "escape codes in {log:?}");
    Ok(())
}

#[test]
fn crd_command_prints_the_checked_in_crd() -> TestResult {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bucketmap"))
        .arg("crd")
        .output()?;
    assert!(out.status.success());
    let checked_in =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd/crd.yaml"))?;
    assert_eq!(
        String::from_utf8(out.stdout)?,
        checked_in,
        "deploy/crd/crd.yaml is stale: run `cargo dev crd`"
    );
    Ok(())
}
