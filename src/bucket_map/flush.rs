//! The flush: plan a namespace's map, write it if it differs, record the
//! verdicts, wake refused claims when an entry leaves.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use super::plan::{self, Inputs, Plan, Verdict, entry_cost};
use super::{BucketMaps, NamespaceMap, Refused, lock};
use crate::FIELD_MANAGER;
use crate::publish::MANAGED_BY;
use crate::{Error, Result};

/// Field managers of earlier versions, one per resource (`bucketmap-map-<uid>`).
const LEGACY_MANAGER_PREFIX: &str = "bucketmap-map-";

/// How many times a flush plans again after the API server named keys that
/// another field manager owns.
const CONFLICT_REPLANS: usize = 3;

/// Extra pause before a write per entry already in the map.
const PAUSE_PER_ENTRY: std::time::Duration = std::time::Duration::from_micros(40);

/// The pause before a flush: the debounce, plus a share that grows with the
/// map (300 ms at 5000 entries with the default debounce). A write costs the
/// API server work in proportion to the entries it carries; spacing writes
/// in proportion too keeps a burst into a large map from costing O(N²).
/// Reconciles give their work slot back while they wait for the flush
/// ([`crate::slots`]), so a longer pause delays them without idling the
/// operator.
fn pause(debounce: std::time::Duration, entries: usize) -> std::time::Duration {
    let entries = u32::try_from(entries).unwrap_or(u32::MAX);
    debounce.saturating_add(PAUSE_PER_ENTRY.saturating_mul(entries))
}

enum WriteError {
    /// Keys owned by other field managers → their owner, as the API server reports.
    Conflict(BTreeMap<String, String>),
    Other(Error),
}

impl BucketMaps {
    /// Flushes until no change is left, then lets the next claim start a new loop.
    pub(super) async fn flush_loop(self: Arc<Self>, map: Arc<NamespaceMap>) {
        loop {
            let entries = lock(&map.state).applied.len();
            tokio::time::sleep(pause(self.settings.debounce, entries)).await;
            // Planned after the permit: claims that come while this
            // namespace waits for its turn join this write.
            let _permit = match &self.writers {
                Some(writers) => writers.acquire().await.ok(),
                None => None,
            };
            let version = lock(&map.state).version;
            let error = match self.flush(&map).await {
                Ok(()) => None,
                Err(e) => {
                    tracing::warn!(namespace = %map.ns, error = %e, "cannot write the bucket map");
                    Some(e.to_string())
                }
            };
            map.flushed.send_replace((version, error));
            let mut state = lock(&map.state);
            if state.version == version {
                state.flushing = false;
                return;
            }
        }
    }

    async fn flush(&self, map: &NamespaceMap) -> Result<()> {
        for _ in 0..CONFLICT_REPLANS {
            // One read of the cached map serves the plan and the write check.
            let data = self.current_data(&map.ns);
            let plan = self.plan_now(map, &data);
            let owned = self.owned_keys(&map.ns);
            if !Self::needs_write(map, &plan, &data, &owned) {
                self.commit(map, plan);
                return Ok(());
            }
            match self.write(&map.ns, &plan.data).await {
                Ok(()) => {
                    lock(&map.state).uncertain = false;
                    self.commit(map, plan);
                    return Ok(());
                }
                Err(WriteError::Conflict(keys)) => lock(&map.state).foreign.extend(keys),
                Err(WriteError::Other(e)) => {
                    lock(&map.state).uncertain = true;
                    return Err(e);
                }
            }
        }
        Err(Error::Publish(format!(
            "the bucket map of namespace {} kept conflicting with other writers",
            map.ns
        )))
    }

    fn plan_now(&self, map: &NamespaceMap, data: &BTreeMap<String, String>) -> Plan {
        let contenders = self.contenders(&map.ns);
        let state = lock(&map.state);
        // Keys in the map that are not ours count against the budget.
        let others: usize = data
            .iter()
            .filter(|(k, _)| !state.applied.contains_key(k.as_str()))
            .map(|(k, v)| entry_cost(k, v))
            .sum();
        let incumbents: BTreeMap<String, String> = state
            .applied
            .iter()
            .map(|(logical, (uid, _))| (logical.to_string(), uid.to_string()))
            .collect();
        let waiting: BTreeMap<Arc<str>, plan::Claim> = state
            .refused
            .iter()
            .filter(|(_, r)| r.full)
            .map(|(uid, r)| (uid.clone(), r.claim.clone()))
            .collect();
        plan::plan(&Inputs {
            claims: &state.claims,
            waiting: &waiting,
            incumbents: &incumbents,
            contenders: &contenders,
            foreign_keys: &state.foreign,
            budget: self.settings.max_bytes.saturating_sub(others),
        })
    }

    /// Whether the map must be written: our entries differ from the plan,
    /// the cached map does not show them (deleted or edited by somebody),
    /// it holds a key under our field manager that the plan drops (an entry
    /// `applied` does not know: see [`super::State::uncertain`]), or the
    /// last write's outcome is unknown.
    fn needs_write(
        map: &NamespaceMap,
        plan: &Plan,
        data: &BTreeMap<String, String>,
        owned: &BTreeSet<String>,
    ) -> bool {
        let state = lock(&map.state);
        if state.uncertain || owned.iter().any(|k| !plan.data.contains_key(k)) {
            return true;
        }
        let ours: BTreeMap<&str, &str> = state
            .applied
            .iter()
            .map(|(logical, (_, physical))| (&**logical, &**physical))
            .collect();
        let planned: BTreeMap<&str, &str> = plan
            .data
            .iter()
            .map(|(logical, physical)| (logical.as_str(), physical.as_str()))
            .collect();
        if ours != planned {
            return true;
        }
        plan.data.iter().any(|(k, v)| data.get(k) != Some(v))
    }

    /// Records a plan the map now holds.
    fn commit(&self, map: &NamespaceMap, plan: Plan) {
        let mut state = lock(&map.state);
        let before: Vec<Arc<str>> = state.applied.keys().cloned().collect();
        let claimant: HashMap<(&str, &str), &plan::Claim> = state
            .claims
            .values()
            .map(|c| ((&*c.logical, &*c.physical), c))
            .collect();
        // The entries share the claims' names: no copy per entry.
        let applied = plan
            .data
            .iter()
            .filter_map(|(logical, physical)| {
                let c = claimant.get(&(logical.as_str(), physical.as_str()))?;
                Some((c.logical.clone(), (c.uid.clone(), c.physical.clone())))
            })
            .collect();
        state.applied = applied;
        let an_entry_left = before.iter().any(|k| !state.applied.contains_key(k));
        if an_entry_left {
            for (_, refused) in state.refused.drain() {
                let _ = self.wake.send(refused.obj);
            }
        }
        for (uid, verdict) in plan.verdicts {
            if verdict != Verdict::Published
                && let Some(claim) = state.claims.remove(&uid)
            {
                let refused = Refused {
                    obj: ObjectRef::new(&claim.name).within(&map.ns),
                    full: matches!(verdict, Verdict::TooLarge(_)),
                    claim,
                };
                state.refused.insert(uid.clone(), refused);
            }
            state.verdicts.insert(uid, verdict);
        }
    }

    /// Applies our entries with our one field manager, without force.
    async fn write(
        &self,
        ns: &str,
        data: &BTreeMap<String, String>,
    ) -> std::result::Result<(), WriteError> {
        let name = &self.settings.map_name;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        self.drop_legacy_managers(&api, ns)
            .await
            .map_err(WriteError::Other)?;
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
            "data": data,
        });
        match api
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => {
                self.metrics.map_written("written");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.metrics.map_written("conflict");
                let keys = conflicting_keys(&status);
                if keys.is_empty() {
                    return Err(WriteError::Other(Error::Publish(format!(
                        "cannot write ConfigMap {ns}/{name}: {}",
                        status.message
                    ))));
                }
                Err(WriteError::Conflict(keys))
            }
            Err(e) => Err(WriteError::Other({
                self.metrics.map_written("error");
                Error::kube(format!(
                    "write {} entries to ConfigMap {ns}/{name}",
                    data.len()
                ))(e)
            })),
        }
    }

    /// Earlier versions applied each entry with a field manager of its own;
    /// while one of those co-owns a key, our apply cannot remove it. Their
    /// `managedFields` entries are dropped once (the keys stay, now ours).
    async fn drop_legacy_managers(&self, api: &Api<ConfigMap>, ns: &str) -> Result<()> {
        let name = &self.settings.map_name;
        let Some(cm) = self.configmaps.get(&ObjectRef::new(name).within(ns)) else {
            return Ok(());
        };
        let fields = cm.metadata.managed_fields.clone().unwrap_or_default();
        let keep: Vec<_> = fields
            .iter()
            .filter(|f| {
                !f.manager
                    .as_deref()
                    .is_some_and(|m| m.starts_with(LEGACY_MANAGER_PREFIX))
            })
            .collect();
        if keep.len() == fields.len() {
            return Ok(());
        }
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": cm.metadata.resource_version},
            {"op": "replace", "path": "/metadata/managedFields", "value": keep},
        ]))
        .map_err(|e| Error::Publish(format!("cannot build the managedFields patch: {e}")))?;
        api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .map_err(Error::kube(format!(
                "drop the per-resource field managers of ConfigMap {ns}/{name}"
            )))?;
        tracing::info!(namespace = %ns, dropped = fields.len() - keep.len(), "bucket map: took over the per-resource field managers of an earlier version");
        Ok(())
    }
}

/// The data keys named in a server-side apply conflict, with their owner.
fn conflicting_keys(status: &kube::core::Status) -> BTreeMap<String, String> {
    status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .filter_map(|cause| {
            let key = cause.field.strip_prefix(".data.")?;
            Some((key.to_owned(), cause.message.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_pause_grows_with_the_map() {
        let debounce = Duration::from_millis(100);
        assert_eq!(pause(debounce, 0), debounce);
        assert_eq!(pause(debounce, 5000), Duration::from_millis(300));
        assert!(pause(debounce, 1000) < pause(debounce, 2000));
        assert_eq!(
            pause(debounce, usize::MAX),
            pause(debounce, u32::MAX as usize)
        );
    }
}
