//! What the chaos run observes: transitions into Ready (a watch on every
//! `Gcs`), and snapshots of the resources, the mock's buckets, the bucket
//! maps and the binding Secrets as a [`World`] for the checks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt as _, watcher};

use bucketmap::crd::Gcs;
use bucketmap_testkit::mock_gcs::MockHandle;

use super::check::{SeenBucket, SeenResource, World};

/// Counts, per uid, how often a `Gcs` went into Ready (from absent or not
/// Ready). "Ready exactly once" is derived from this watch: a resource
/// whose Ready flips False and back while the watch is away (the API
/// server restart) is missed, so the count is a lower bound.
pub struct ReadyWatch {
    transitions: Arc<Mutex<HashMap<String, u32>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    /// Starts watching every `Gcs` (re-listing after errors, with backoff).
    pub fn start(client: kube::Client) -> Self {
        let transitions = Arc::new(Mutex::new(HashMap::new()));
        let counts = transitions.clone();
        let api: Api<Gcs> = Api::all(client);
        let mut ready_now: HashMap<String, bool> = HashMap::new();
        let events = watcher(api, watcher::Config::default()).default_backoff();
        let task = tokio::spawn(events.for_each(move |event| {
            match event {
                Ok(watcher::Event::Apply(g) | watcher::Event::InitApply(g)) => {
                    let uid = g.uid().unwrap_or_default();
                    let was = ready_now.insert(uid.clone(), g.is_ready()).unwrap_or(false);
                    if g.is_ready() && !was {
                        let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
                        *counts.entry(uid).or_insert(0) += 1;
                    }
                }
                Ok(watcher::Event::Delete(g)) => {
                    ready_now.remove(&g.uid().unwrap_or_default());
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "Gcs watch error; re-listing"),
            }
            futures::future::ready(())
        }));
        ReadyWatch { transitions, task }
    }

    /// Transitions into Ready so far, by uid.
    pub fn transitions(&self) -> BTreeMap<String, u32> {
        let counts = self.transitions.lock().unwrap_or_else(|p| p.into_inner());
        counts.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where to look.
pub struct Scope<'a> {
    pub client: &'a kube::Client,
    pub namespaces: &'a [String],
    pub map_name: &'a str,
    pub gcs: &'a MockHandle,
}

/// The world as it is now.
pub async fn snapshot(scope: &Scope<'_>, watch: &ReadyWatch) -> anyhow::Result<World> {
    let mut world = World {
        buckets: buckets(scope.gcs),
        ready_transitions: watch.transitions(),
        create_attempts: scope
            .gcs
            .calls()
            .into_iter()
            .filter(|c| c.method == "CreateBucket")
            .filter_map(|c| c.bucket)
            .collect(),
        ..World::default()
    };
    for ns in scope.namespaces {
        let gcs: Api<Gcs> = Api::namespaced(scope.client.clone(), ns);
        let list = gcs
            .list(&ListParams::default())
            .await
            .with_context(|| format!("cannot list the Gcs resources of {ns}"))?;
        for g in list {
            world
                .resources
                .insert(format!("{ns}/{}", g.name_any()), seen(&g));
        }
        if let Some(map) = bucket_map(scope, ns).await? {
            world.maps.insert(ns.clone(), map);
        }
        world.bindings.extend(bindings(scope.client, ns).await?);
    }
    Ok(world)
}

/// A resource as the checks see it.
pub fn seen(g: &Gcs) -> SeenResource {
    let status = g.status.clone().unwrap_or_default();
    SeenResource {
        uid: g.uid().unwrap_or_default(),
        ready: g.is_ready(),
        reason: g
            .ready_condition()
            .map(|c| c.reason.clone())
            .unwrap_or_default(),
        physical: status.bucket_full_name,
        finalizers: g.finalizers().to_vec(),
        deleting: g.metadata.deletion_timestamp.is_some(),
    }
}

/// The Gcs (`namespace/name`) a bucket's ownership labels name, when its
/// owner key matches them (a bucket labelled by hand or by another owner
/// has none).
fn owner_of(labels: &std::collections::HashMap<String, String>) -> Option<String> {
    use bucketmap::naming::{CLUSTER_LABEL, Identity, NAME_LABEL, NAMESPACE_LABEL, OWNER_LABEL};
    let get = |key: &str| labels.get(key).map(String::as_str);
    let identity = Identity {
        cluster: get(CLUSTER_LABEL)?,
        namespace: get(NAMESPACE_LABEL)?,
        name: get(NAME_LABEL)?,
    };
    (get(OWNER_LABEL)? == identity.owner_key())
        .then(|| format!("{}/{}", identity.namespace, identity.name))
}

/// Every bucket of the mock, by id.
pub fn buckets(gcs: &MockHandle) -> BTreeMap<String, SeenBucket> {
    gcs.buckets()
        .into_iter()
        .map(|b| {
            let id = b.name.rsplit('/').next().unwrap_or_default().to_owned();
            let seen = SeenBucket {
                project: b.project.trim_start_matches("projects/").to_owned(),
                owner: owner_of(&b.labels),
                labels: b.labels.clone().into_iter().collect(),
                metageneration: b.metageneration,
                objects: gcs.objects(&id).len(),
            };
            (id, seen)
        })
        .collect()
}

async fn bucket_map(
    scope: &Scope<'_>,
    ns: &str,
) -> anyhow::Result<Option<BTreeMap<String, String>>> {
    let api: Api<ConfigMap> = Api::namespaced(scope.client.clone(), ns);
    let map = api
        .get_opt(scope.map_name)
        .await
        .with_context(|| format!("cannot read the bucket map of {ns}"))?;
    Ok(map.map(|m| m.data.unwrap_or_default()))
}

/// The binding Secrets of `ns` (by their type), data decoded.
async fn bindings(
    client: &kube::Client,
    ns: &str,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, String>>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secrets = api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("cannot list the Secrets of {ns}"))?;
    Ok(secrets
        .into_iter()
        .filter(|s| s.type_.as_deref() == Some(bucketmap::publish::BINDING_SECRET_TYPE))
        .map(|s| {
            let data = s
                .data
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect();
            (format!("{ns}/{}", s.name_any()), data)
        })
        .collect())
}
