//! The bucket map of each namespace: one ConfigMap (`bucketmap` by default)
//! whose keys are logical names and values physical names, Ready buckets
//! only. The sidecars mount it.
//!
//! **One writer per namespace.** The whole map of a namespace is computed
//! from the resources that claim an entry ([`Claim`], [`Verdict`]) and written by a single
//! server-side-apply field manager ([`crate::FIELD_MANAGER`]), so a write costs
//! the API server O(entries) and `managedFields` stays one entry long. Claims
//! arriving close together are coalesced: after the first one a short
//! debounce passes, then one write carries every claim made so far, and at
//! most one write per namespace is in flight. N new resources cause far
//! fewer than N writes.
//!
//! **How a reconcile learns its entry was written.** [`BucketMaps::publish`]
//! registers the claim under a new version number of the namespace's map and
//! waits until a flush that started after the registration has been
//! accepted by the API server (or found the map already as planned), then
//! returns the claim's [`Verdict`]. The reconciler reports Ready only after
//! `Published`: Ready means "the map has it". A claim already in the map
//! returns at once, without a write (the steady-state resync).
//!
//! **Nothing foreign is touched.** Keys another field manager owns stay as
//! they are (server-side apply without force); a claim colliding with one is
//! refused with a conflict, found from the API server's own conflict report.
//!
//! **Size.** A ConfigMap holds at most 1 MiB of data and an etcd object at
//! most 1.5 MiB with its metadata; [`DEFAULT_MAX_MAP_BYTES`] keeps every map
//! under both. Claims that do not fit get [`Verdict::TooLarge`] (oldest
//! first are admitted); they are woken when an entry leaves.

mod plan;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use tokio::sync::{mpsc, watch};

pub use plan::{Claim, Contender, Verdict, entry_cost};

use crate::crd::Gcs;
use crate::metrics::Metrics;
use crate::{Error, Result};

/// Budget for the entries of one map, in [`entry_cost`] bytes. Below the API
/// server's 1 MiB limit on a ConfigMap's data and etcd's 1.5 MiB limit on a
/// stored object (data, `managedFields` and the rest of the metadata). It
/// fits 5,347 entries of the longest names (54-character logical, 63-character
/// physical) and 18,181 of 10-character logical names.
pub const DEFAULT_MAX_MAP_BYTES: usize = 1_000_000;

/// Default pause between the first claim of a burst and the write.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(100);

/// Default number of map writes in flight at once, over all namespaces.
pub const DEFAULT_WRITERS: usize = 2;

/// The suffix of a map value whose entry a move has fenced (writes held,
/// docs/ARCHITECTURE.md, "Moving a bucket: the switch"). The sidecar reads
/// it as `bucketmap_sidecar_core::mapping::FENCED_SUFFIX`; a test holds the
/// two equal.
pub const FENCED_SUFFIX: &str = ";fenced";

/// The map's value for an entry: the physical name, fenced or not.
pub fn entry_value(physical: &str, fenced: bool) -> String {
    if fenced {
        format!("{physical}{FENCED_SUFFIX}")
    } else {
        physical.to_owned()
    }
}

/// Settings of the map writers.
#[derive(Clone, Debug)]
pub struct MapSettings {
    /// Name of the ConfigMap in each namespace (`--map-name`).
    pub map_name: String,
    /// Bytes one namespace's map may hold (`--map-max-bytes`).
    pub max_bytes: usize,
    /// Pause between a namespace's first change and its write (`--map-debounce`).
    pub debounce: Duration,
    /// Map writes in flight at once, over all namespaces (`--map-writers`;
    /// 0: no limit beyond one per namespace).
    pub writers: usize,
}

/// The writers of every namespace's map.
pub struct BucketMaps {
    client: kube::Client,
    metrics: Arc<Metrics>,
    settings: MapSettings,
    resources: Store<Gcs>,
    configmaps: Store<ConfigMap>,
    /// Resources to reconcile again (their claim may now succeed).
    wake: mpsc::UnboundedSender<ObjectRef<Gcs>>,
    namespaces: Mutex<HashMap<String, Arc<NamespaceMap>>>,
    /// The map cache has synced: a namespace can be seeded from it.
    synced: AtomicBool,
    /// Permits to write a map, `settings.writers` of them (fair: first come,
    /// first served); `None` without a limit.
    writers: Option<tokio::sync::Semaphore>,
}

/// One namespace's writer.
struct NamespaceMap {
    ns: String,
    state: Mutex<State>,
    /// The latest finished flush: its version and its error, if any.
    flushed: watch::Sender<(u64, Option<String>)>,
}

#[derive(Default)]
struct State {
    /// Resources asking for an entry, by uid.
    claims: BTreeMap<Arc<str>, Claim>,
    /// Bumped by every change of `claims`.
    version: u64,
    flushing: bool,
    /// What the map holds from us: logical → (uid, physical).
    applied: BTreeMap<Arc<str>, (Arc<str>, Arc<str>)>,
    /// Keys owned by other field managers (from the API server's conflicts).
    foreign: BTreeMap<String, String>,
    /// A write failed without an answer: it may have been committed (a lost
    /// response), so the map may hold entries `applied` does not know. The
    /// next flush writes whatever it plans; the apply removes them.
    uncertain: bool,
    /// The verdict of each claim in the latest plan.
    verdicts: HashMap<Arc<str>, Verdict>,
    /// Refused claims, woken when an entry leaves the map.
    refused: HashMap<Arc<str>, Refused>,
}

/// A claim the latest plan refused.
struct Refused {
    obj: ObjectRef<Gcs>,
    claim: Claim,
    /// Refused for want of room (it keeps its place in line).
    full: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state stays consistent at every await-free step: keep using it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl BucketMaps {
    /// Writers over the controller's caches. `wake` receives resources whose
    /// refused claim may now succeed.
    pub fn new(
        client: kube::Client,
        metrics: Arc<Metrics>,
        settings: MapSettings,
        resources: Store<Gcs>,
        configmaps: Store<ConfigMap>,
        wake: mpsc::UnboundedSender<ObjectRef<Gcs>>,
    ) -> Arc<Self> {
        let writers = (settings.writers > 0).then(|| tokio::sync::Semaphore::new(settings.writers));
        Arc::new(BucketMaps {
            writers,
            client,
            metrics,
            settings,
            resources,
            configmaps,
            wake,
            namespaces: Mutex::new(HashMap::new()),
            synced: AtomicBool::new(false),
        })
    }

    /// Asks for `obj`'s entry (logical → `physical`) and waits until the map
    /// holds it or the claim is refused.
    pub async fn publish(self: &Arc<Self>, obj: &Gcs, physical: &str) -> Result<Verdict> {
        let claim = claim_of(obj, physical)?;
        self.cache_synced().await?;
        let map = self.namespace(&claim_ns(obj)?);
        let version = {
            let mut state = lock(&map.state);
            if self.already_published(&map.ns, &state, &claim) {
                return Ok(Verdict::Published);
            }
            state.refused.remove(&claim.uid);
            state.claims.insert(claim.uid.clone(), claim.clone());
            self.bump(&map, &mut state)
        };
        self.wait_flushed(&map, version).await?;
        let state = lock(&map.state);
        state.verdicts.get(&claim.uid).cloned().ok_or_else(|| {
            Error::Publish(format!(
                "the claim of {} was withdrawn while it was being written",
                claim.logical
            ))
        })
    }

    /// Removes `obj`'s entry (if it has one) and waits until the map no
    /// longer holds it.
    pub async fn unpublish(self: &Arc<Self>, obj: &Gcs) -> Result<()> {
        let uid = obj.uid().ok_or(Error::MissingField("metadata.uid"))?;
        self.cache_synced().await?;
        let map = self.namespace(&claim_ns(obj)?);
        let version = {
            let mut state = lock(&map.state);
            state.refused.remove(uid.as_str());
            state.verdicts.remove(uid.as_str());
            let claimed = state.claims.remove(uid.as_str()).is_some();
            let in_map = state.applied.values().any(|(holder, _)| **holder == *uid)
                || self.owns_key(&map.ns, &obj.spec.bucket_name);
            if !claimed && !in_map {
                return Ok(());
            }
            self.bump(&map, &mut state)
        };
        self.wait_flushed(&map, version).await
    }

    /// Waits for the map cache: seeding a namespace from an empty cache
    /// would drop the entries of resources not reconciled yet.
    async fn cache_synced(&self) -> Result<()> {
        while !self.synced.load(Ordering::Acquire) {
            // Re-poll: a store's readiness future wakes only its latest poller.
            let wait = self.configmaps.wait_until_ready();
            match tokio::time::timeout(Duration::from_millis(200), wait).await {
                Ok(Ok(())) => self.synced.store(true, Ordering::Release),
                Ok(Err(_)) => {
                    return Err(Error::Publish(
                        "the bucket map cache was dropped before it synced".into(),
                    ));
                }
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// The claim is in the map as it stands, as far as the caches know.
    fn already_published(&self, ns: &str, state: &State, claim: &Claim) -> bool {
        let ours = state.applied.get(&claim.logical);
        let applied =
            ours.is_some_and(|(uid, physical)| *uid == claim.uid && *physical == claim.physical);
        if !applied || state.claims.get(&claim.uid) != Some(claim) {
            return false;
        }
        let Some(cm) = self
            .configmaps
            .get(&ObjectRef::new(&self.settings.map_name).within(ns))
        else {
            return false;
        };
        let data = cm.data.as_ref();
        data.and_then(|d| d.get(&*claim.logical))
            .is_some_and(|v| *v == *claim.physical)
    }

    /// Records a change and makes sure a flush will pick it up.
    fn bump(self: &Arc<Self>, map: &Arc<NamespaceMap>, state: &mut State) -> u64 {
        state.version += 1;
        if !state.flushing {
            state.flushing = true;
            let (maps, map) = (self.clone(), map.clone());
            tokio::spawn(async move { maps.flush_loop(map).await });
        }
        state.version
    }

    async fn wait_flushed(&self, map: &NamespaceMap, version: u64) -> Result<()> {
        let mut rx = map.flushed.subscribe();
        let flushed = rx
            .wait_for(|(v, _)| *v >= version)
            .await
            .map_err(|_| Error::Publish("the bucket map writer stopped".into()))?;
        match &flushed.1 {
            None => Ok(()),
            Some(e) => Err(Error::Publish(e.clone())),
        }
    }

    /// The writer of `ns`, seeded from the caches on first use.
    fn namespace(&self, ns: &str) -> Arc<NamespaceMap> {
        let mut namespaces = lock(&self.namespaces);
        if let Some(map) = namespaces.get(ns) {
            return map.clone();
        }
        let map = Arc::new(NamespaceMap {
            ns: ns.to_owned(),
            state: Mutex::new(self.seed(ns)),
            flushed: watch::Sender::new((0, None)),
        });
        namespaces.insert(ns.to_owned(), map.clone());
        map
    }

    /// After a start: the entries the map holds for resources that still
    /// exist are ours (a resource being deleted keeps its entry only until
    /// its cleanup unpublishes it; one that is not deleted keeps its claim,
    /// Ready or not, so a restart never drops a working entry).
    fn seed(&self, ns: &str) -> State {
        let data = self.current_data(ns);
        let mut state = State::default();
        for obj in self.resources.state_filter(|g| in_namespace(g, ns)) {
            let Some(physical) = obj.status.as_ref().and_then(|s| s.bucket_full_name.clone())
            else {
                continue;
            };
            let Ok(claim) = claim_of(&obj, &physical) else {
                continue;
            };
            if data.get(&*claim.logical) != Some(&physical) {
                continue;
            }
            let entry = (claim.uid.clone(), claim.physical.clone());
            state.applied.insert(claim.logical.clone(), entry);
            if obj.meta().deletion_timestamp.is_none() {
                state.verdicts.insert(claim.uid.clone(), Verdict::Published);
                state.claims.insert(claim.uid.clone(), claim);
            }
        }
        state
    }

    /// Whether the cached map holds `logical` under our field manager: an
    /// entry `applied` may not know (written by another replica before it
    /// lost the lease, or by a write whose answer was lost).
    fn owns_key(&self, ns: &str, logical: &str) -> bool {
        self.owned_keys(ns).contains(logical)
    }

    /// The data keys the cached map holds under our field manager.
    fn owned_keys(&self, ns: &str) -> BTreeSet<String> {
        self.configmaps
            .get(&ObjectRef::new(&self.settings.map_name).within(ns))
            .map(|cm| owned_data_keys(&cm, crate::FIELD_MANAGER))
            .unwrap_or_default()
    }

    fn current_data(&self, ns: &str) -> BTreeMap<String, String> {
        self.configmaps
            .get(&ObjectRef::new(&self.settings.map_name).within(ns))
            .and_then(|cm| cm.data.clone())
            .unwrap_or_default()
    }

    /// Every resource of `ns` that names a logical bucket and is not being deleted.
    fn contenders(&self, ns: &str) -> Vec<Contender> {
        self.resources
            .state_filter(|g| in_namespace(g, ns) && g.meta().deletion_timestamp.is_none())
            .iter()
            .filter_map(|g| {
                Some(Contender {
                    uid: g.uid()?,
                    name: g.name_any(),
                    logical: g.spec.bucket_name.clone(),
                    created: g.meta().creation_timestamp.as_ref().map(|t| t.0),
                })
            })
            .collect()
    }
}

/// Whether `obj` is in namespace `ns`: a cache-wide filter, run on every
/// flush, that must not copy each resource's namespace to compare it.
pub(crate) fn in_namespace(obj: &Gcs, ns: &str) -> bool {
    obj.meta().namespace.as_deref() == Some(ns)
}

/// The `data` keys that `manager` owns by server-side apply, read from the
/// ConfigMap's `managedFields` (`{"f:data": {"f:KEY": {}}}`).
fn owned_data_keys(cm: &ConfigMap, manager: &str) -> BTreeSet<String> {
    cm.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.manager.as_deref() == Some(manager) && m.operation.as_deref() == Some("Apply")
        })
        .filter_map(|m| m.fields_v1.as_ref()?.0.get("f:data")?.as_object())
        .flat_map(|data| data.keys())
        .filter_map(|k| k.strip_prefix("f:"))
        .map(str::to_owned)
        .collect()
}

fn claim_ns(obj: &Gcs) -> Result<String> {
    obj.namespace()
        .ok_or(Error::MissingField("metadata.namespace"))
}

fn claim_of(obj: &Gcs, physical: &str) -> Result<Claim> {
    Ok(Claim {
        uid: obj.uid().ok_or(Error::MissingField("metadata.uid"))?.into(),
        name: obj.name_any(),
        logical: obj.spec.bucket_name.as_str().into(),
        physical: physical.into(),
        created: obj.meta().creation_timestamp.as_ref().map(|t| t.0),
    })
}

mod flush;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use kube::api::ObjectMeta;

    fn managed(manager: &str, operation: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn owned_keys_are_the_data_keys_our_manager_applied() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                managed_fields: Some(vec![
                    managed(
                        "bucketmap",
                        "Apply",
                        serde_json::json!({"f:data": {"f:photos": {}, "f:logs": {}},
                                           "f:metadata": {"f:labels": {"f:app": {}}}}),
                    ),
                    managed(
                        "platform-team",
                        "Apply",
                        serde_json::json!({"f:data": {"f:media": {}}}),
                    ),
                    managed(
                        "bucketmap",
                        "Update",
                        serde_json::json!({"f:data": {"f:edited": {}}}),
                    ),
                ]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let owned = owned_data_keys(&cm, "bucketmap");
        assert_eq!(
            owned,
            BTreeSet::from(["logs".to_owned(), "photos".to_owned()])
        );
        assert!(owned_data_keys(&ConfigMap::default(), "bucketmap").is_empty());
    }
}
