//! The operator's webhook shuts down gracefully: on SIGTERM readiness turns
//! false while the webhook still accepts, then the listener closes and the
//! admission requests in flight finish before the process ends, for at
//! most `--webhook-drain-timeout`.
//!
//! The request in flight is made slow by its client: the headers and half
//! of the body are sent before the signal, the rest after the listener
//! closed.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bucketmap_testkit::free_port;
use common::Fixture;
use common::certs::cert_files;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

type TestResult = anyhow::Result<()>;

/// The webhook's ports and the operator serving it.
struct Webhook {
    port: u16,
    metrics_port: u16,
    process: tokio::process::Child,
    _certs: tempfile::TempDir,
    ca: String,
}

/// The operator with its webhooks (certificate from files) and the given
/// shutdown timings, ready (its caches synced).
async fn start(f: &Fixture, delay: &str, drain: &str) -> anyhow::Result<Webhook> {
    let (ca, certs) = cert_files()?;
    let (port, metrics_port) = (free_port()?, free_port()?);
    let process = f
        .operator_command()
        .args(["--namespace", &f.ns, "--default-project", common::PROJECT])
        .args(["--webhook-addr", &format!("127.0.0.1:{port}")])
        .arg("--webhook-cert-dir")
        .arg(certs.path())
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .args(["--shutdown-delay", delay, "--webhook-drain-timeout", drain])
        .spawn()?;
    let webhook = Webhook {
        port,
        metrics_port,
        process,
        _certs: certs,
        ca,
    };
    wait_readyz(metrics_port, 200).await?;
    Ok(webhook)
}

/// The status of GET /readyz, if the server answers.
async fn readyz(port: u16) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = "GET /readyz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

async fn wait_readyz(port: u16, status: u16) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while readyz(port).await != Some(status) {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "/readyz never answered {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn accepting(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// A TLS connection to the webhook, trusting only its CA.
async fn connect(w: &Webhook) -> anyhow::Result<TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    bucketmap::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(w.ca.as_bytes()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", w.port)).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    Ok(connector.connect(name, tcp).await?)
}

/// A Gcs create in `ns` for /mutate-gcs, and its uid.
fn gcs_review(ns: &str) -> anyhow::Result<(Vec<u8>, &'static str)> {
    let uid = "7d1e5c0a-0000-4000-8000-00000000000a";
    let gvk =
        serde_json::json!({"group": "storage.bucketmap.dev", "version": "v1alpha1", "kind": "Gcs"});
    let gvr = serde_json::json!({"group": "storage.bucketmap.dev", "version": "v1alpha1", "resource": "gcs"});
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": "photos",
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "storage.bucketmap.dev/v1alpha1",
                "kind": "Gcs",
                "metadata": {"name": "photos", "namespace": ns},
                "spec": {"bucketName": "photos"},
            },
            "dryRun": false,
        }
    });
    Ok((serde_json::to_vec(&review)?, uid))
}

/// Sends the request line, headers and the first half of `body`; returns
/// the rest.
async fn start_request<'b>(
    tls: &mut TlsStream<tokio::net::TcpStream>,
    body: &'b [u8],
) -> anyhow::Result<&'b [u8]> {
    let head = format!(
        "POST /mutate-gcs HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let (first, rest) = body.split_at(body.len() / 2);
    tls.write_all(head.as_bytes()).await?;
    tls.write_all(first).await?;
    tls.flush().await?;
    Ok(rest)
}

/// Everything the server sends until it closes (a close without TLS
/// close_notify ends the answer too).
async fn read_answer(tls: &mut TlsStream<tokio::net::TcpStream>) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

fn sigterm(process: &tokio::process::Child) -> TestResult {
    let pid = process.id().context("the operator has exited already")?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -TERM {pid} failed");
    Ok(())
}

/// Waits for the process to exit: generous, since the drain it waits for
/// is bounded by the operator itself.
async fn exited(process: &mut tokio::process::Child) -> anyhow::Result<std::process::ExitStatus> {
    tokio::time::timeout(Duration::from_secs(120), process.wait())
        .await
        .context("the operator did not exit after SIGTERM")?
        .context("cannot wait for the operator")
}

#[tokio::test]
async fn a_slow_admission_request_in_flight_completes_across_shutdown() -> TestResult {
    let f = Fixture::new().await?;
    // The drain timeout is far beyond what the request needs: it must end
    // because the request finished, not because the drain gave up.
    let mut w = start(&f, "3s", "120s").await?;
    let (body, uid) = gcs_review(&f.ns)?;
    let mut tls = connect(&w).await?;
    let rest = start_request(&mut tls, &body).await?;

    sigterm(&w.process)?;
    // Readiness turns false first, while the webhook still accepts.
    wait_readyz(w.metrics_port, 503).await?;
    assert!(
        accepting(w.port).await,
        "the webhook stopped accepting before readiness turned false"
    );
    // Then the listener closes; the request in flight is still served.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while accepting(w.port).await {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the webhook never stopped accepting"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        w.process.try_wait()?.is_none(),
        "the operator exited with a request in flight"
    );
    tls.write_all(rest).await?;
    tls.flush().await?;
    let answer = read_answer(&mut tls).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(uid), "{answer}");
    assert!(answer.contains("\"allowed\":true"), "{answer}");
    assert!(
        answer.contains("\"patch\""),
        "the finalizer patch: {answer}"
    );
    let status = exited(&mut w.process).await?;
    assert!(status.success(), "{status}");
    Ok(())
}

/// The control: a request that never finishes gets no answer, and does not
/// hold the process past the drain timeout.
#[tokio::test]
async fn a_request_that_never_finishes_is_cut_off_after_the_drain_timeout() -> TestResult {
    let f = Fixture::new().await?;
    let mut w = start(&f, "0s", "1s").await?;
    let (body, _) = gcs_review(&f.ns)?;
    let mut tls = connect(&w).await?;
    start_request(&mut tls, &body).await?;
    sigterm(&w.process)?;
    let status = exited(&mut w.process).await?;
    assert!(status.success(), "{status}");
    let answer = read_answer(&mut tls).await;
    assert!(
        answer.is_empty(),
        "an unfinished request was answered: {answer}"
    );
    Ok(())
}
