//! The sidecars' live map under the run's disruptions: in each namespace a
//! follower (`bucketmap_sidecar::live`, in-process, as an injected sidecar
//! runs it) watches the namespace's bucket map with a ServiceAccount token
//! and nothing but the grant the operator binds (`--map-reader-role`).
//! Through the API server restart and the operator kills, each follower
//! must end up holding exactly its namespace's map, confirmed by the API
//! server within the bound: at all Ready, and again at the end, when the
//! map is empty.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

use bucketmap_sidecar::live::{self, LiveConfig};
use bucketmap_sidecar::mapping::MappingStore;
use bucketmap_sidecar::metrics::Metrics;
use bucketmap_testkit::testenv::{self, TestEnv};

use super::check::Violation;

/// The ClusterRole the replicas bind (`--map-reader-role`), as the chart
/// ships it.
pub const MAP_READER_ROLE: &str = "bucketmap-map-reader";
/// The followers' bound, as injected.
const BOUND: Duration = Duration::from_secs(60);
/// How long a follower may take to hold its map at a checkpoint: one relist
/// period and one backoff after a refused list, and some.
const SETTLE: Duration = Duration::from_secs(45);

/// One follower per namespace, stopped on drop.
pub struct Followers {
    stores: BTreeMap<String, Arc<MappingStore>>,
    stop: watch::Sender<bool>,
    _creds: tempfile::TempDir,
}

impl Drop for Followers {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Followers {
    /// The map reader ClusterRole, a ServiceAccount and its token in each
    /// namespace, and a follower using it.
    pub async fn start(
        env: &TestEnv,
        client: &kube::Client,
        namespaces: &[String],
        map_name: &str,
    ) -> anyhow::Result<Followers> {
        install_role(client, map_name).await?;
        let creds = tempfile::tempdir().context("cannot create a credentials directory")?;
        let (stop, stopped) = watch::channel(false);
        let mut stores = BTreeMap::new();
        for ns in namespaces {
            let dir = creds.path().join(ns);
            std::fs::create_dir_all(&dir)?;
            write_credentials(env, client, ns, &dir).await?;
            let store = Arc::new(MappingStore::new(None, Vec::new()).following(BOUND));
            let cfg = LiveConfig {
                api: env.server_url().parse()?,
                namespace: ns.clone(),
                name: map_name.to_owned(),
                token_file: dir.join("token"),
                ca_file: dir.join("ca.crt"),
                relist: BOUND / 4,
            };
            let metrics = Arc::new(Metrics::new());
            tokio::spawn(live::run(cfg, store.clone(), metrics, stopped.clone()));
            stores.insert(ns.clone(), store);
        }
        Ok(Followers {
            stores,
            stop,
            _creds: creds,
        })
    }

    /// Waits (up to [`SETTLE`]) until every follower holds its namespace's
    /// map, confirmed within the bound; what still differs then.
    pub async fn check(&self, client: &kube::Client, map_name: &str) -> Vec<Violation> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let violations = self.differences(client, map_name).await;
            if violations.is_empty() || Instant::now() > deadline {
                return violations;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn differences(&self, client: &kube::Client, map_name: &str) -> Vec<Violation> {
        let mut violations = Vec::new();
        for (ns, store) in &self.stores {
            let want = match map_of(client, ns, map_name).await {
                Ok(want) => want,
                Err(e) => {
                    violations.push(format!("{ns}: cannot read the map: {e:#}"));
                    continue;
                }
            };
            let held: BTreeMap<String, String> = store
                .current()
                .map(|m| {
                    m.values()
                        .into_iter()
                        .map(|(l, v)| (l.to_owned(), v))
                        .collect()
                })
                .unwrap_or_default();
            if held != want {
                violations.push(format!(
                    "{ns}: the sidecar's live map holds {} entries, the namespace's map {} \
                     (first difference: {:?})",
                    held.len(),
                    want.len(),
                    first_difference(&held, &want)
                ));
            } else if let Some(stale) = store.staleness() {
                violations.push(format!(
                    "{ns}: the sidecar's live map was last confirmed {}s ago, past its bound",
                    stale.age.as_secs()
                ));
            }
        }
        violations
    }
}

/// The entries of the namespace's map (none when it does not exist).
async fn map_of(
    client: &kube::Client,
    ns: &str,
    map_name: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let map = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(map_name)
        .await?;
    Ok(map
        .and_then(|m| m.data)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !k.starts_with('.'))
        .collect())
}

fn first_difference(
    held: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
) -> Option<String> {
    let keys = held.keys().chain(want.keys());
    keys.into_iter()
        .find(|k| held.get(*k) != want.get(*k))
        .map(|k| format!("{k}: {:?} held, {:?} in the map", held.get(k), want.get(k)))
}

/// The map reader ClusterRole as the chart renders it.
async fn install_role(client: &kube::Client, map_name: &str) -> anyhow::Result<()> {
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": MAP_READER_ROLE},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": [map_name], "verbs": ["get", "list", "watch"]}]
    }))?;
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .context("cannot create the map reader ClusterRole")?;
    Ok(())
}

/// A ServiceAccount `app` in `ns` and its token, the CA and the namespace,
/// laid out as the injected sidecar's projected volume.
async fn write_credentials(
    env: &TestEnv,
    client: &kube::Client,
    ns: &str,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "app"}}))?;
    accounts.create(&PostParams::default(), &account).await?;
    testenv::write_pod_credentials(env, client, ns, "app", 3, dir).await
}
