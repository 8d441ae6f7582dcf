//! Which watch events of a resource call for a reconcile: a new resource,
//! a spec change or a deletion (both bump `metadata.generation`) and a
//! change of its finalizers, and a reconcile requested through the
//! annotation `bucketmap.dev/reconcile-requested-at`. Its own status
//! writes do not.
//!
//! kube-runtime's `predicate_filter` decides the same, but keeps a table of
//! every object's name, namespace and uid beside the reflector's store,
//! which already holds the previous version of each object. Comparing with
//! that version before the store takes the new one decides alike and keeps
//! nothing per resource (the operator's memory at scale: docs/BENCHMARKS.md).

use std::sync::Arc;

use futures::{Stream, TryStreamExt, future};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};

use super::status::OwnWrites;
use crate::crd::{Gcs, RECONCILE_REQUEST_ANNOTATION};

/// Writes each event of `events` to the cache behind `writer` (as
/// kube-runtime's `reflect` does), tells `own_writes` what the cache now
/// shows, and yields the applied resources that
/// call for a reconcile, judged against the version `cache` held before.
///
/// What it yields only becomes a reconcile request, which kube-runtime
/// keys by name and namespace and which fetches the object from the cache
/// when it runs. Its uid and resourceVersion are dropped: the requests
/// that queue up behind a burst of new resources hold two strings fewer
/// each.
pub(super) fn reflect_changes(
    events: impl Stream<Item = Result<Event<Gcs>, watcher::Error>>,
    mut writer: Writer<Gcs>,
    cache: Store<Gcs>,
    own_writes: Arc<OwnWrites>,
) -> impl Stream<Item = Result<Gcs, watcher::Error>> {
    events
        .map_ok(move |event| {
            let wanted = match &event {
                Event::Apply(obj) | Event::InitApply(obj) => calls_for_reconcile(&cache, obj),
                Event::Delete(_) | Event::Init | Event::InitDone => false,
            };
            writer.apply_watcher_event(&event);
            own_writes.seen(&event, &cache);
            match event {
                Event::Apply(mut obj) | Event::InitApply(mut obj) if wanted => {
                    obj.metadata.uid = None;
                    obj.metadata.resource_version = None;
                    Some(obj)
                }
                _ => None,
            }
        })
        .try_filter_map(future::ok)
}

/// Whether `obj` is new to `cache` (or a new object under an old name), or
/// differs from the cached version in generation, finalizers or the
/// reconcile request annotation.
fn calls_for_reconcile(cache: &Store<Gcs>, obj: &Gcs) -> bool {
    let Some(old) = cache.get(&ObjectRef::from_obj(obj)) else {
        return true;
    };
    let requested = |g: &Gcs| g.annotations().get(RECONCILE_REQUEST_ANNOTATION).cloned();
    old.uid() != obj.uid()
        || old.meta().generation != obj.meta().generation
        || old.finalizers() != obj.finalizers()
        || requested(&old) != requested(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{StreamExt, stream};
    use kube::runtime::reflector;

    fn gcs(name: &str, uid: &str, generation: i64, finalizers: &[&str], ready: bool) -> Gcs {
        let mut obj: Gcs = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1",
            "kind": "Gcs",
            "metadata": {
                "name": name, "namespace": "ns", "uid": uid, "generation": generation,
                "resourceVersion": "7",
                "finalizers": finalizers,
            },
            "spec": {"bucketName": "photos"},
        }))
        .expect("a valid Gcs");
        if ready {
            obj.status = Some(Default::default());
        }
        obj
    }

    /// The names the filter yields for `events`, and the cache after them.
    async fn run(events: Vec<Event<Gcs>>) -> (Vec<String>, Store<Gcs>) {
        let (cache, writer) = reflector::store();
        let out = reflect_changes(
            stream::iter(events.into_iter().map(Ok)),
            writer,
            cache.clone(),
            Arc::default(),
        )
        .map(|r| r.expect("no watch error").name_any())
        .collect()
        .await;
        (out, cache)
    }

    #[tokio::test]
    async fn new_resources_spec_changes_and_finalizer_changes_pass_status_writes_do_not() {
        let (out, cache) = run(vec![
            Event::Init,
            Event::InitApply(gcs("a", "u1", 1, &[], false)),
            Event::InitDone,
            Event::Apply(gcs("a", "u1", 1, &["f"], false)),
            Event::Apply(gcs("a", "u1", 1, &["f"], true)),
            Event::Apply(gcs("b", "u2", 1, &[], false)),
            Event::Apply(gcs("b", "u2", 2, &[], false)),
            Event::Apply(gcs("b", "u2", 2, &[], true)),
        ])
        .await;
        assert_eq!(out, ["a", "a", "b", "b"]);
        // The cache keeps what the requests do without.
        let b = cache
            .get(&ObjectRef::new("b").within("ns"))
            .expect("b cached");
        assert_eq!(b.uid().as_deref(), Some("u2"));
        // The cache holds every event's object, the filtered ones included.
        let a = cache
            .get(&ObjectRef::new("a").within("ns"))
            .expect("a cached");
        assert!(a.status.is_some(), "the status write reached the cache");
    }

    #[tokio::test]
    async fn a_request_keeps_the_name_and_namespace_only() {
        let (cache, writer) = reflector::store();
        let events = stream::iter([Ok(Event::Apply(gcs("a", "u1", 1, &[], false)))]);
        let out: Vec<Gcs> = reflect_changes(events, writer, cache, Arc::default())
            .map(|r| r.expect("no watch error"))
            .collect()
            .await;
        let [obj] = out.as_slice() else {
            panic!("one request expected, got {}", out.len())
        };
        assert_eq!(
            (obj.name_any(), obj.namespace()),
            ("a".into(), Some("ns".into()))
        );
        assert_eq!((obj.uid(), obj.resource_version()), (None, None));
    }

    #[tokio::test]
    async fn a_new_object_under_an_old_name_passes() {
        let (out, _) = run(vec![
            Event::Apply(gcs("a", "u1", 1, &[], true)),
            Event::Delete(gcs("a", "u1", 1, &[], true)),
            Event::Apply(gcs("a", "u3", 1, &[], true)),
            Event::Apply(gcs("a", "u4", 1, &[], true)),
        ])
        .await;
        assert_eq!(out, ["a", "a", "a"]);
    }

    #[tokio::test]
    async fn a_relist_passes_only_what_changed_while_the_watch_was_down() {
        let (out, cache) = run(vec![
            Event::Apply(gcs("a", "u1", 1, &[], false)),
            Event::Apply(gcs("b", "u2", 1, &[], false)),
            Event::Init,
            Event::InitApply(gcs("a", "u1", 1, &[], true)),
            Event::InitApply(gcs("b", "u2", 2, &[], false)),
            Event::InitDone,
        ])
        .await;
        assert_eq!(out, ["a", "b", "b"]);
        assert_eq!(cache.state().len(), 2);
    }

    #[tokio::test]
    async fn a_new_reconcile_request_passes_and_the_same_one_again_does_not() {
        let requested = |value: &str| {
            let mut obj = gcs("a", "u1", 1, &[], true);
            obj.annotations_mut()
                .insert(RECONCILE_REQUEST_ANNOTATION.into(), value.into());
            obj
        };
        let (out, _) = run(vec![
            Event::Apply(gcs("a", "u1", 1, &[], true)),
            Event::Apply(requested("2026-12-07T10:00:00Z")),
            Event::Apply(requested("2026-12-07T10:00:00Z")),
            Event::Apply(requested("2026-12-07T11:00:00Z")),
        ])
        .await;
        assert_eq!(out, ["a", "a", "a"]);
    }
}
