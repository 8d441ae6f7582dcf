//! Two `bucketmap operator --leader-elect` processes: only the Lease holder
//! reconciles, and when it dies the standby takes over within a lease.

use crate::common;

use std::time::Duration;

use anyhow::Context as _;
use bucketmap_testkit::free_port;
use common::{Fixture, physical};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

type TestResult = anyhow::Result<()>;

const LEASE: &str = "bucketmap-operator";

async fn metric(port: u16, name: &str) -> anyhow::Result<f64> {
    let addr = format!("127.0.0.1:{port}");
    let (_, text) = bucketmap_testkit::http::get(&addr, "/metrics").await?;
    Ok(text
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0))
}

fn start(f: &Fixture, identity: &str, port: u16) -> anyhow::Result<tokio::process::Child> {
    f.operator_command()
        .args(["--namespace", &f.ns])
        .args(["--leader-elect", "--leader-election-namespace", &f.ns])
        .args(["--leader-election-identity", identity])
        .args(["--lease-duration", "4s", "--lease-renew-margin", "2s"])
        .args(["--default-project", "leader-project"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .spawn()
        .context("cannot start the operator")
}

async fn holder(f: &Fixture) -> anyhow::Result<Option<String>> {
    let api: Api<Lease> = Api::namespaced(f.client.clone(), &f.ns);
    Ok(api
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_standby_takes_over() -> TestResult {
    let f = Fixture::new().await?;
    let ports = [free_port()?, free_port()?];
    let mut a = start(&f, "replica-a", ports[0])?;
    let mut b = start(&f, "replica-b", ports[1])?;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let leader = loop {
        if let Some(h) = holder(&f).await? {
            break h;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "nobody took the lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (leader_port, standby_port) = if leader == "replica-a" {
        (ports[0], ports[1])
    } else {
        (ports[1], ports[0])
    };

    f.create("first", serde_json::json!({"bucketName": "first"}))
        .await?;
    let first = f.wait_ready("first").await?;
    assert!(f.gcs.bucket(&physical(&first)).is_some());
    assert!(metric(leader_port, "bucketmap_reconciles_total").await? >= 1.0);
    assert_eq!(
        metric(standby_port, "bucketmap_reconciles_total").await?,
        0.0,
        "the standby must not reconcile"
    );

    // The leader dies without releasing the lease.
    let (dead, mut survivor) = if leader == "replica-a" {
        (&mut a, b)
    } else {
        (&mut b, a)
    };
    dead.kill().await?;
    let killed_at = tokio::time::Instant::now();

    f.create("second", serde_json::json!({"bucketName": "second"}))
        .await?;
    let second = f.wait_ready("second").await?;
    assert!(f.gcs.bucket(&physical(&second)).is_some());
    let new_holder = holder(&f).await?.unwrap_or_default();
    assert_ne!(new_holder, leader, "the lease moved to the standby");
    assert!(metric(standby_port, "bucketmap_reconciles_total").await? >= 1.0);
    // Lease of 4 s: the standby takes over once it expires, unprompted.
    // The bound says that it happens, not how fast: generous by an order
    // of magnitude over the lease, plus reconcile time on a loaded machine.
    assert!(
        killed_at.elapsed() < Duration::from_secs(60),
        "takeover took {:?}",
        killed_at.elapsed()
    );
    survivor.kill().await?;
    Ok(())
}
