//! What the chaos run observes: transitions into Ready (a watch on every
//! `Gcs`), and snapshots of the resources, the mock's buckets, the bucket
//! maps and the binding Secrets as a [`World`] for the checks.

use std::collections::{BTreeMap, HashMap, HashSet};
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
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

/// What the watch has seen so far.
#[derive(Default)]
struct Seen {
    /// Transitions into Ready, by uid.
    transitions: HashMap<String, u32>,
    /// Uids deleted (a delete event, or absent from a re-list).
    gone: HashSet<String>,
    /// Whether each present uid is Ready now.
    ready_now: HashMap<String, bool>,
    /// Uids listed by the re-list under way.
    relisted: HashSet<String>,
}

impl Seen {
    fn apply(&mut self, g: &Gcs) {
        let uid = g.uid().unwrap_or_default();
        let was = self.ready_now.insert(uid.clone(), g.is_ready());
        if g.is_ready() && was != Some(true) {
            *self.transitions.entry(uid).or_insert(0) += 1;
        }
    }

    fn delete(&mut self, uid: String) {
        self.ready_now.remove(&uid);
        self.gone.insert(uid);
    }

    fn event(&mut self, event: watcher::Event<Gcs>) {
        match event {
            watcher::Event::Apply(g) => self.apply(&g),
            watcher::Event::Delete(g) => self.delete(g.uid().unwrap_or_default()),
            watcher::Event::Init => self.relisted.clear(),
            watcher::Event::InitApply(g) => {
                self.relisted.insert(g.uid().unwrap_or_default());
                self.apply(&g);
            }
            watcher::Event::InitDone => {
                // Deleted while the watch was away.
                let missing: Vec<String> = (self.ready_now.keys())
                    .filter(|uid| !self.relisted.contains(*uid))
                    .cloned()
                    .collect();
                for uid in missing {
                    self.delete(uid);
                }
            }
        }
    }
}

impl ReadyWatch {
    /// Starts watching every `Gcs` (re-listing after errors, with backoff).
    pub fn start(client: kube::Client) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = seen.clone();
        let api: Api<Gcs> = Api::all(client);
        let events = watcher(api, watcher::Config::default()).default_backoff();
        let task = tokio::spawn(events.for_each(move |event| {
            match event {
                Ok(event) => lock(&shared).event(event),
                Err(e) => tracing::debug!(error = %e, "Gcs watch error; re-listing"),
            }
            futures::future::ready(())
        }));
        ReadyWatch { seen, task }
    }

    /// Transitions into Ready so far, by uid.
    pub fn transitions(&self) -> BTreeMap<String, u32> {
        let seen = lock(&self.seen);
        (seen.transitions.iter())
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// A handle that reads the run's progress, for the kill supervisor.
    pub fn progress(&self) -> Progress {
        Progress(self.seen.clone())
    }
}

/// The run's progress as the watch saw it: resources that were Ready at
/// some point plus resources deleted; twice the resources when all is done.
#[derive(Clone)]
pub struct Progress(Arc<Mutex<Seen>>);

impl Progress {
    pub fn get(&self) -> usize {
        let seen = lock(&self.0);
        seen.transitions.len() + seen.gone.len()
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|p| p.into_inner())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn gcs(uid: &str, ready: bool) -> Gcs {
        let status = if ready { "True" } else { "False" };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1",
            "kind": "Gcs",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"bucketName": "photos"},
            "status": {"conditions": [{
                "type": "Ready", "status": status, "reason": "R", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }]},
        }))
        .expect("a valid Gcs")
    }

    fn progress(seen: &Seen) -> usize {
        seen.transitions.len() + seen.gone.len()
    }

    #[test]
    fn progress_counts_each_resource_once_ready_and_once_gone() {
        let mut seen = Seen::default();
        seen.event(watcher::Event::Apply(gcs("a", false)));
        assert_eq!(progress(&seen), 0);
        seen.event(watcher::Event::Apply(gcs("a", true)));
        seen.event(watcher::Event::Apply(gcs("a", true)));
        seen.event(watcher::Event::Apply(gcs("b", true)));
        assert_eq!(progress(&seen), 2);
        seen.event(watcher::Event::Delete(gcs("a", true)));
        assert_eq!(progress(&seen), 3);
    }

    #[test]
    fn a_relist_counts_the_resources_deleted_while_the_watch_was_away() {
        let mut seen = Seen::default();
        seen.event(watcher::Event::Apply(gcs("a", true)));
        seen.event(watcher::Event::Apply(gcs("b", true)));
        seen.event(watcher::Event::Init);
        seen.event(watcher::Event::InitApply(gcs("b", true)));
        seen.event(watcher::Event::InitDone);
        assert_eq!(seen.gone, HashSet::from(["a".to_owned()]));
        assert_eq!(seen.transitions.get("b"), Some(&1), "b stayed Ready");
        assert_eq!(progress(&seen), 3);
    }
}
