//! The sidecar follows its namespace's bucket map through a real API
//! server (`--map-configmap`), as the injected sidecar does: the
//! ServiceAccount token of a TokenRequest, RBAC allowing `get`, `list` and
//! `watch` on that one ConfigMap and nothing else, the cluster CA. A
//! changed map is served at once; a sidecar cut off from the API server
//! during a change serves reads from its last map but refuses every write
//! once the change is older than the bound (`--max-map-age`), and follows
//! again when the API server is back (docs/ARCHITECTURE.md, "How fresh a
//! sidecar's map is").

// Scenarios read top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bucketmap_testkit::testenv::{self, TestEnv};
use common::http::Request;
use common::procs::{FakeGcs, Sidecar};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

const V1: &str = "photos-v1aaaa11";
const V2: &str = "photos-v2bbbb22";
const V3: &str = "photos-v3cccc33";
/// The bound the sidecars run with: short, so the test is.
const BOUND: Duration = Duration::from_secs(8);

/// A TCP relay to the API server that the test can cut: once cut, bytes
/// stop flowing both ways on every connection, and new connections are
/// accepted and left hanging — a network partition, not a refusal.
struct Relay {
    addr: std::net::SocketAddr,
    cut: Arc<AtomicBool>,
}

impl Relay {
    async fn start(target: std::net::SocketAddr) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, target, flag.clone()));
            }
        });
        Ok(Relay { addr, cut })
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }
}

/// Relays one connection both ways; waits while the link is cut.
async fn relay(client: TcpStream, target: std::net::SocketAddr, cut: Arc<AtomicBool>) {
    while cut.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = tokio::spawn(pump(client_read, server_write, cut.clone()));
    let down = tokio::spawn(pump(server_read, client_write, cut));
    let _ = tokio::join!(up, down);
}

/// Copies one direction. Bytes that arrive while the link is cut are lost,
/// and the connection with them: once the link is back it is closed, as a
/// connection that lost data would be reset.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, cut: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            while cut.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A namespace with a ServiceAccount whose token may read the map and
/// nothing else (the grant bucketmap gives), and fake-gcs-server holding
/// the three buckets a logical name moves through.
struct Fixture {
    env: TestEnv,
    client: kube::Client,
    ns: String,
    /// `token`, `ca.crt`, `namespace`: the sidecar's credentials directory.
    creds: tempfile::TempDir,
    /// An empty mapping directory: the map comes from the API server.
    volume: tempfile::TempDir,
    logs: tempfile::TempDir,
    gcs: FakeGcs,
}

async fn fixture() -> Result<Fixture> {
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    let ns = testenv::create_namespace(&client, "live").await?;
    let pp = PostParams::default();
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "app"}}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(&pp, &account)
        .await?;
    grant_map_reading(&client, &ns).await?;
    let creds = tempfile::tempdir()?;
    write_credentials(&env, &client, &ns, "app", creds.path()).await?;
    let logs = tempfile::tempdir()?;
    let gcs = FakeGcs::start(logs.path(), &[V1, V2, V3])?;
    Ok(Fixture {
        env,
        client,
        ns,
        creds,
        volume: tempfile::tempdir()?,
        logs,
        gcs,
    })
}

/// What bucketmap grants a namespace's ServiceAccounts: `get`, `list`,
/// `watch` on the ConfigMap `bucketmap`, by name.
async fn grant_map_reading(client: &kube::Client, ns: &str) -> Result<()> {
    let pp = PostParams::default();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "map-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": ["bucketmap"], "verbs": ["get", "list", "watch"]}]
    }))?;
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&pp, &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "map-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "map-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": format!("system:serviceaccounts:{ns}")}]
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&pp, &binding)
        .await?;
    Ok(())
}

/// A token of `account`, the cluster CA and the namespace, laid out as
/// the injected projected volume.
async fn write_credentials(
    env: &TestEnv,
    client: &kube::Client,
    ns: &str,
    account: &str,
    dir: &Path,
) -> Result<()> {
    testenv::write_pod_credentials(env, client, ns, account, 1, dir).await
}

impl Fixture {
    /// Points `photos` at `physical`; the instant the API server acknowledged it.
    async fn set_map(&self, physical: &str) -> Result<Instant> {
        let map = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "bucketmap"},
            "data": {"photos": physical}
        });
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns)
            .patch(
                "bucketmap",
                &PatchParams::apply("live-map-test"),
                &Patch::Apply(map),
            )
            .await?;
        Ok(Instant::now())
    }

    /// A sidecar following the map through `api`, logging under `name`.
    fn sidecar(&self, api: &str, name: &str) -> Result<Sidecar> {
        let logs = self.logs.path().join(name);
        std::fs::create_dir_all(&logs)?;
        Sidecar::start(
            &logs,
            &self.gcs.url(),
            &[
                "--map-configmap=bucketmap".to_owned(),
                format!("--kube-api={api}"),
                format!("--kube-credentials-dir={}", self.creds.path().display()),
                format!("--max-map-age={}s", BOUND.as_secs()),
                format!("--mapping-dir={}", self.volume.path().display()),
            ],
        )
    }

    /// Whether the object `name` is in `bucket`.
    fn holds(&self, bucket: &str, name: &str) -> Result<bool> {
        Ok(self.gcs.objects(bucket)?.contains_key(name))
    }

    /// Writes through `sidecar` until a write lands in `bucket`; how long that took.
    fn until_writes_land(&self, sidecar: &Sidecar, bucket: &str, tag: &str) -> Result<Duration> {
        let start = Instant::now();
        for i in 0.. {
            let name = format!("{tag}-{i}");
            let status = write(sidecar, &name)?.status;
            if status == 200 && self.holds(bucket, &name)? {
                return Ok(start.elapsed());
            }
            anyhow::ensure!(
                start.elapsed() < BOUND + Duration::from_secs(15),
                "writes through {} never landed in {bucket} (last status {status})",
                sidecar.url()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        unreachable!()
    }
}

fn write(sidecar: &Sidecar, name: &str) -> Result<common::http::Response> {
    Request::new(
        "POST",
        format!("/upload/storage/v1/b/photos/o?uploadType=media&name={name}"),
    )
    .header("Content-Type", "text/plain")
    .body(name.as_bytes().to_vec())
    .send(sidecar.addr)
}

fn read(sidecar: &Sidecar, name: &str) -> Result<common::http::Response> {
    Request::get(format!("/storage/v1/b/photos/o/{name}?alt=media")).send(sidecar.addr)
}

fn admin(sidecar: &Sidecar, endpoint: &str) -> Result<String> {
    Ok(Request::get(format!("/_bucketmap/{endpoint}"))
        .send(sidecar.addr)?
        .text())
}

/// The sample of `map_age_seconds` in a metrics text.
fn map_age(metrics: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("bucketmap_sidecar_map_age_seconds "))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_map_is_served_at_once_and_a_cut_off_sidecar_stops_writing_within_the_bound()
-> Result<()> {
    let f = fixture().await?;
    f.set_map(V1).await?;
    let api: std::net::SocketAddr = f.env.server_url().trim_start_matches("https://").parse()?;
    let link = Relay::start(api).await?;
    let cut_off = f.sidecar(&format!("https://{}", link.addr), "cut-off")?;
    let direct = f.sidecar(&f.env.server_url(), "direct")?;
    for sidecar in [&cut_off, &direct] {
        f.until_writes_land(sidecar, V1, "first")?;
        let ready = admin(sidecar, "readyz")?;
        assert!(ready.contains("map confirmed by the API server"), "{ready}");
    }

    // A change reaches both through the API server, long before the
    // kubelet would sync a volume (no volume here at all).
    f.set_map(V2).await?;
    for sidecar in [&cut_off, &direct] {
        let took = f.until_writes_land(sidecar, V2, "second")?;
        assert!(took < BOUND, "the change took {took:?}");
    }
    let age = map_age(&admin(&cut_off, "metrics")?).context("no map_age_seconds")?;
    assert!(age < BOUND.as_secs_f64(), "map_age_seconds {age}");
    let kept = "kept-in-v2";
    assert_eq!(write(&cut_off, kept)?.status, 200);
    assert!(f.holds(V2, kept)?);

    // The cut-off sidecar misses the next change.
    link.set_cut(true);
    let changed = f.set_map(V3).await?;
    f.until_writes_land(&direct, V3, "third")?;
    let (accepted, refused) = write_until_refused(&f, &cut_off, changed)?;
    // The rule: no write is accepted once the change is older than the
    // bound. The sidecar's last confirmation predates the cut, so its map
    // passed the bound before `changed + BOUND`.
    for (name, sent) in &accepted {
        assert!(
            *sent < changed + BOUND,
            "{name} was accepted {:?} after the change",
            sent.duration_since(changed)
        );
        assert!(f.holds(V2, name)?, "{name} is not in the old bucket");
        assert!(!f.holds(V3, name)?, "{name} reached the new bucket");
    }
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused.text().contains("--max-map-age"),
        "{}",
        refused.text()
    );
    // Reads are served from the last map all along.
    let got = read(&cut_off, kept)?;
    assert_eq!((got.status, got.text()), (200, kept.to_owned()));
    let ready = admin(&cut_off, "readyz")?;
    assert!(ready.contains("writes are refused"), "{ready}");
    let age = map_age(&admin(&cut_off, "metrics")?).context("no map_age_seconds")?;
    assert!(age > BOUND.as_secs_f64(), "map_age_seconds {age}");

    // The link is back: the sidecar lists again, takes the new map and writes.
    link.set_cut(false);
    f.until_writes_land(&cut_off, V3, "back")?;
    let ready = admin(&cut_off, "readyz")?;
    assert!(ready.contains("map confirmed by the API server"), "{ready}");
    Ok(())
}

/// Writes through `sidecar` every 100 ms until one is refused: the names
/// and send instants of the writes accepted, and the refusal.
fn write_until_refused(
    f: &Fixture,
    sidecar: &Sidecar,
    changed: Instant,
) -> Result<(Vec<(String, Instant)>, common::http::Response)> {
    let mut accepted = Vec::new();
    for i in 0.. {
        let name = format!("during-cut-{i}");
        let sent = Instant::now();
        let response = write(sidecar, &name)?;
        if response.status != 200 {
            return Ok((accepted, response));
        }
        accepted.push((name, sent));
        anyhow::ensure!(
            changed.elapsed() < BOUND * 3,
            "the cut-off sidecar kept writing {:?} after the change (logs in {})",
            changed.elapsed(),
            f.logs.path().display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_the_grant_serves_reads_from_the_volume_and_refuses_writes() -> Result<()> {
    let f = fixture().await?;
    f.set_map(V2).await?;
    // An account of another namespace: no grant on this map.
    let other = testenv::create_namespace(&f.client, "other").await?;
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "app"}}))?;
    Api::<ServiceAccount>::namespaced(f.client.clone(), &other)
        .create(&PostParams::default(), &account)
        .await?;
    let creds = tempfile::tempdir()?;
    write_credentials(&f.env, &f.client, &other, "app", creds.path()).await?;
    // Its sidecar asks for its own namespace's map, where nothing grants it.
    std::fs::write(f.volume.path().join("photos"), V1)?;
    let sidecar = Sidecar::start(
        f.logs.path(),
        &f.gcs.url(),
        &[
            "--map-configmap=bucketmap".to_owned(),
            format!("--kube-api={}", f.env.server_url()),
            format!("--kube-credentials-dir={}", creds.path().display()),
            format!("--max-map-age={}s", BOUND.as_secs()),
            format!("--mapping-dir={}", f.volume.path().display()),
        ],
    )?;
    // Reads are served from the volume's map; writes are refused: a map
    // never confirmed may be older than any change.
    f.gcs.put(V1, "from-volume", b"v1")?;
    let got = read(&sidecar, "from-volume")?;
    assert_eq!((got.status, got.text()), (200, "v1".to_owned()));
    let refused = write(&sidecar, "never")?;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused.text().contains("not been confirmed since"),
        "{}",
        refused.text()
    );
    let metrics = admin(&sidecar, "metrics")?;
    let failures = metrics
        .lines()
        .find_map(|l| l.strip_prefix("bucketmap_sidecar_map_follow_failures_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(failures.is_some_and(|n| n > 0), "{metrics}");
    let log = std::fs::read_to_string(f.logs.path().join("sidecar-0.log"))?;
    assert!(log.contains("403"), "{log}");
    Ok(())
}
