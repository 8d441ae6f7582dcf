//! The tenancy policy's per-namespace bucket limit, exact with any number
//! of operator replicas.
//!
//! A resource takes a place before its bucket is created: its uid goes
//! into the ConfigMap `bucketmap-places-<namespace>` in the operator's own
//! namespace (where tenants cannot edit it), by a write conditional on the
//! resourceVersion the count was made from. Two replicas that count at
//! once (a leader that stalled after counting and the one that took over,
//! or two leaders for the few seconds a Lease allows) cannot both take the
//! last place: the API server refuses the second write with 409, and that
//! replica counts again. The lock per namespace ([`super::CountLocks`])
//! only saves this process from conflicting with itself.
//!
//! A place is held as long as its resource exists: a count drops the
//! places of resources no longer listed (deleted, their cleanup done), so
//! there is nothing to give back. The count is read first, then the list:
//! every uid in the places read belongs to a resource created before the
//! list, so a place is dropped only for a resource that is really gone.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::Context;
use crate::crd::Gcs;
use crate::{Error, Result};

/// Prefix of the name of a namespace's places ConfigMap.
pub const PLACES_PREFIX: &str = "bucketmap-places-";

/// Rounds of count and conditional write before giving up for now.
const MAX_ATTEMPTS: u32 = 5;

/// The places ConfigMap of namespace `ns`.
pub fn places_name(ns: &str) -> String {
    format!("{PLACES_PREFIX}{ns}")
}

/// What `decide` said of the count with `obj` in it: `Ok` once `obj`
/// holds a place (taken now, or before), or `decide`'s refusal.
pub(super) async fn take_place<R>(
    ctx: &Context,
    obj: &Gcs,
    decide: impl Fn(usize) -> std::result::Result<(), R>,
) -> Result<std::result::Result<(), R>> {
    let ns = obj.namespace().unwrap_or_default();
    let uid = obj.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let _own = ctx.count_locks.lock(&ns).await;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.config.operator_namespace);
    let name = places_name(&ns);
    for _ in 0..MAX_ATTEMPTS {
        let (held, version) = read(&api, &name).await?;
        let all = list(ctx, &ns).await?;
        let live: HashSet<String> = all.iter().filter_map(|g| g.uid()).collect();
        let mut places: BTreeMap<String, String> = held.clone();
        places.retain(|uid, _| live.contains(uid));
        if let Err(refusal) = decide(buckets_with(obj, &all, &places)) {
            return Ok(Err(refusal));
        }
        places.insert(uid.clone(), obj.name_any());
        if places == held || write(&api, &name, version, &held, &places).await? {
            return Ok(Ok(()));
        }
    }
    Err(Error::Conflict(format!(
        "the places of namespace {ns} (ConfigMap {}/{name}) changed {MAX_ATTEMPTS} times while counted",
        ctx.config.operator_namespace
    )))
}

/// How many buckets the namespace would have if `obj` got its own now:
/// the resources that hold a place or have a bucket, those without either
/// that come before `obj` (created earlier, or at the same second with a
/// smaller name; deleting ones never get one), and `obj`. Every reconcile
/// ranks the same way, so that of two resources racing for the last
/// place the older gets it, rather than neither.
fn buckets_with(obj: &Gcs, all: &[Gcs], places: &BTreeMap<String, String>) -> usize {
    let rank = |g: &Gcs| (g.metadata.creation_timestamp.clone(), g.name_any());
    let mine = rank(obj);
    let counted = all.iter().filter(|g| {
        let placed = g.uid().is_some_and(|uid| places.contains_key(&uid));
        let has_bucket = g
            .status
            .as_ref()
            .is_some_and(|s| s.bucket_full_name.is_some());
        let waits_before = g.metadata.deletion_timestamp.is_none() && rank(g) < mine;
        g.uid() != obj.uid() && (placed || has_bucket || waits_before)
    });
    counted.count() + 1
}

/// The places held (uid → resource name) and the resourceVersion they
/// were read at (`None`: no ConfigMap yet). A consistent read.
async fn read(
    api: &Api<ConfigMap>,
    name: &str,
) -> Result<(BTreeMap<String, String>, Option<String>)> {
    let cm = api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("read ConfigMap {name}")))?;
    Ok(match cm {
        Some(cm) => (cm.data.unwrap_or_default(), cm.metadata.resource_version),
        None => (BTreeMap::new(), None),
    })
}

/// Every `Gcs` of namespace `ns`: a consistent list, not the cache.
async fn list(ctx: &Context, ns: &str) -> Result<Vec<Gcs>> {
    let api: Api<Gcs> = Api::namespaced(ctx.client.clone(), ns);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!(
            "count the Gcs resources of namespace {ns}"
        )))?;
    Ok(list.items)
}

/// Writes `places` in place of `held`, on condition that the ConfigMap is
/// still at `version` (or still absent); `false` when it moved on.
async fn write(
    api: &Api<ConfigMap>,
    name: &str,
    version: Option<String>,
    held: &BTreeMap<String, String>,
    places: &BTreeMap<String, String>,
) -> Result<bool> {
    let result = match version {
        None => {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.to_owned()),
                    labels: Some(BTreeMap::from([(
                        crate::publish::MANAGED_BY.0.to_owned(),
                        crate::publish::MANAGED_BY.1.to_owned(),
                    )])),
                    ..Default::default()
                },
                data: Some(places.clone()),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await.map(drop)
        }
        Some(version) => {
            // A merge patch: dropped places are removed by null.
            let mut data = serde_json::Map::new();
            for uid in held.keys().filter(|uid| !places.contains_key(*uid)) {
                data.insert(uid.clone(), serde_json::Value::Null);
            }
            for (uid, owner) in places {
                data.insert(uid.clone(), json!(owner));
            }
            let patch = json!({"metadata": {"resourceVersion": version}, "data": data});
            let params = PatchParams::default();
            api.patch(name, &params, &Patch::Merge(&patch))
                .await
                .map(drop)
        }
    };
    match result {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(format!("write ConfigMap {name}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_buckets_and_older_waiting_resources_count_before_a_new_one() {
        let all = [
            gcs_at("placed", 5, false, false),
            gcs_at("named", 5, true, false),
            gcs_at("older", 1, false, false),
            gcs_at("gone", 1, false, true),
            gcs_at("younger", 9, false, false),
            gcs_at("me", 5, false, false),
        ];
        let places = BTreeMap::from([("placed".to_owned(), "placed".to_owned())]);
        // placed, named, older (waits before), me; not the deleting one
        // nor the younger; "me" once, though it is in the list.
        assert_eq!(buckets_with(&all[5], &all, &places), 4);
        // Its own place does not count twice.
        let mine = BTreeMap::from([("me".to_owned(), "me".to_owned())]);
        assert_eq!(buckets_with(&all[5], &all, &mine), 3);
    }

    /// A Gcs named `name`, created at second `at`, with a bucket or not.
    fn gcs_at(name: &str, at: i64, bucket: bool, deleting: bool) -> Gcs {
        let time = |s: i64| format!("2026-01-01T00:00:{s:02}Z");
        let mut g: Gcs = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1", "kind": "Gcs",
            "metadata": {"name": name, "namespace": "ns", "uid": name, "creationTimestamp": time(at)},
            "spec": {"bucketName": name},
        }))
        .expect("a valid Gcs");
        if bucket {
            g.status = Some(crate::crd::GcsStatus {
                bucket_full_name: Some(format!("{name}-k3x9q2mw")),
                ..Default::default()
            });
        }
        if deleting {
            g.metadata.deletion_timestamp =
                serde_json::from_value(serde_json::json!(time(59))).ok();
        }
        g
    }

    #[test]
    fn the_older_of_two_racing_resources_takes_the_last_place() {
        let all = [
            gcs_at("a", 1, true, false),
            gcs_at("z", 9, true, false),
            gcs_at("d", 5, false, false),
            gcs_at("e", 5, false, false),
            gcs_at("gone", 2, false, true),
        ];
        let count = |name: &str| {
            let me = all.iter().find(|g| g.name_any() == name).expect("listed");
            buckets_with(me, &all, &BTreeMap::new())
        };
        // a and z have buckets (z though younger); d ranks before e by name;
        // a deleting resource without a bucket never takes a place.
        assert_eq!(count("d"), 3);
        assert_eq!(count("e"), 4);
        assert_eq!(count("gone"), 3, "it counts itself, not itself twice");
        // With a limit of 3, d gets the last place and e waits; once d has
        // its bucket, e still counts it: the total never exceeds the limit.
        let mut after = all.clone();
        after[2] = gcs_at("d", 5, true, false);
        let e = &after[3];
        assert_eq!(buckets_with(e, &after, &BTreeMap::new()), 4);
    }
}
