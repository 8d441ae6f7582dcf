//! The operator's finalizer on `Gcs` resources: added before any bucket
//! exists, removed once the bucket was dealt with.
//!
//! kube-runtime's `finalizer()` helper adds the finalizer with a JSON patch
//! whose `test` op compares `metadata.finalizers` with the *cached* object,
//! then waits for the watch to bring the object back. A reconcile that
//! runs before the watch event arrives (one queued meanwhile by another
//! watch: a ServiceAccount that `spec.access` names applied just after the
//! resource, as `cargo dev` does, or a namespace annotation) reads the
//! cached object still without the finalizer, sends the same patch, and
//! the API server answers 422 Invalid (the `test` op failed) although
//! nothing is wrong. Here a failed `test` leads to one live read: when the
//! live object has the finalizer, the reconcile goes on with it; only a
//! second failed `test` (another writer raced both reads) is an
//! [`Error::Conflict`], which the error policy retries quietly.

use std::future::Future;
use std::str::FromStr as _;
use std::sync::Arc;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::debug;

use crate::crd::{FINALIZER, Gcs};
use crate::{Error, Result};

/// What a reconcile does with the object.
pub(super) enum Event {
    /// Create or keep the bucket (the finalizer is in place).
    Apply(Arc<Gcs>),
    /// The resource is being deleted: deal with the bucket; the finalizer
    /// is removed when this succeeds.
    Cleanup(Arc<Gcs>),
}

/// Runs `reconcile` on `obj` (from the cache) with the finalizer in place:
/// adds it first if needed, removes it after a successful cleanup.
pub(super) async fn finalizer<F, Fut>(api: &Api<Gcs>, obj: Arc<Gcs>, reconcile: F) -> Result<Action>
where
    F: FnOnce(Event) -> Fut,
    Fut: Future<Output = Result<Action>>,
{
    let obj = match prepare(api, obj).await? {
        Prepared::Go(obj) => obj,
        Prepared::Done(action) => return Ok(action),
    };
    if obj.meta().deletion_timestamp.is_none() {
        return reconcile(Event::Apply(obj)).await;
    }
    let action = reconcile(Event::Cleanup(obj.clone())).await?;
    remove(api, &obj).await?;
    Ok(action)
}

/// The object to reconcile, or the end of the reconcile.
enum Prepared {
    Go(Arc<Gcs>),
    Done(Action),
}

/// One attempt: the object with the finalizer in place, or `Stale` when
/// the API server's `metadata.finalizers` differ from `obj`'s.
enum Attempt {
    Ready(Prepared),
    Stale,
}

/// The object with the finalizer in place (added if it was missing).
async fn prepare(api: &Api<Gcs>, obj: Arc<Gcs>) -> Result<Prepared> {
    let name = obj.name_any();
    if let Attempt::Ready(prepared) = attempt(api, obj).await? {
        return Ok(prepared);
    }
    debug!(gcs = %name, "the cached resource lags behind the API server; reading it");
    let live = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read Gcs {name}")))?;
    let Some(live) = live else {
        return Ok(Prepared::Done(Action::await_change()));
    };
    match attempt(api, Arc::new(live)).await? {
        Attempt::Ready(prepared) => Ok(prepared),
        Attempt::Stale => Err(Error::Conflict(format!(
            "the finalizers of Gcs {name} changed while the finalizer was being added"
        ))),
    }
}

/// Adds the finalizer to `obj` unless it has it (or is being deleted
/// without it: nothing of ours is left to clean up).
async fn attempt(api: &Api<Gcs>, obj: Arc<Gcs>) -> Result<Attempt> {
    let ours = obj.finalizers().iter().any(|f| f == FINALIZER);
    let deleting = obj.meta().deletion_timestamp.is_some();
    match (ours, deleting) {
        (true, _) => return Ok(Attempt::Ready(Prepared::Go(obj))),
        (false, true) => return Ok(Attempt::Ready(Prepared::Done(Action::await_change()))),
        (false, false) => {}
    }
    let name = obj.name_any();
    match api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Json::<()>(add_patch(&obj)?),
        )
        .await
    {
        // The write comes back through the watch and triggers the next
        // reconcile, which finds the finalizer (or, when another watch
        // triggers it first, the live object).
        Ok(_) => Ok(Attempt::Ready(Prepared::Done(Action::await_change()))),
        Err(e) if failed_test(&e) => Ok(Attempt::Stale),
        Err(e) => Err(Error::kube(format!("add the finalizer to Gcs {name}"))(e)),
    }
}

/// Appends [`FINALIZER`] to `obj`'s finalizers, provided the object is
/// still the same one (uid) and its finalizers are still those of `obj`
/// (Kubernetes keeps duplicate finalizers, so an append must not race).
fn add_patch(obj: &Gcs) -> Result<json_patch::Patch> {
    let uid = obj.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let finalizers = obj.finalizers();
    let (expected, add_path, value) = if finalizers.is_empty() {
        (
            serde_json::Value::Null,
            "/metadata/finalizers",
            serde_json::json!([FINALIZER]),
        )
    } else {
        (
            serde_json::json!(finalizers),
            "/metadata/finalizers/-",
            serde_json::json!(FINALIZER),
        )
    };
    Ok(json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: pointer("/metadata/uid")?,
            value: serde_json::json!(uid),
        }),
        PatchOperation::Test(TestOperation {
            path: pointer("/metadata/finalizers")?,
            value: expected,
        }),
        PatchOperation::Add(AddOperation {
            path: pointer(add_path)?,
            value,
        }),
    ]))
}

/// Removes [`FINALIZER`] after a successful cleanup. Gone already, or
/// removed already (the cache lagged behind our own removal), is fine.
async fn remove(api: &Api<Gcs>, obj: &Gcs) -> Result<()> {
    let name = obj.name_any();
    let Some(index) = obj.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    let path = pointer(&format!("/metadata/finalizers/{index}"))?;
    let patch = json_patch::Patch(vec![
        // The index is only ours while it still holds our finalizer.
        PatchOperation::Test(TestOperation {
            path: path.clone(),
            value: serde_json::json!(FINALIZER),
        }),
        PatchOperation::Remove(RemoveOperation { path }),
    ]);
    match api
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) if failed_test(&e) => Err(Error::Conflict(format!(
            "the finalizers of Gcs {name} changed while the finalizer was being removed"
        ))),
        Err(e) => Err(Error::kube(format!("remove the finalizer of Gcs {name}"))(
            e,
        )),
    }
}

/// A JSON patch whose `test` op failed: the API server answers 422 Invalid.
fn failed_test(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 422)
}

fn pointer(path: &str) -> Result<PointerBuf> {
    PointerBuf::from_str(path).map_err(|_| Error::MissingField("a valid JSON pointer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcs(finalizers: &[&str]) -> Gcs {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1",
            "kind": "Gcs",
            "metadata": {"name": "photos", "namespace": "team-a", "uid": "u-1", "finalizers": finalizers},
            "spec": {"bucketName": "photos"},
        }))
        .expect("a Gcs")
    }

    fn applied(obj: &Gcs, stored: serde_json::Value) -> Result<serde_json::Value, String> {
        let mut doc = stored;
        let patch = add_patch(obj).map_err(|e| e.to_string())?;
        json_patch::patch(&mut doc, &patch).map_err(|e| e.to_string())?;
        Ok(doc["metadata"]["finalizers"].clone())
    }

    #[test]
    fn the_add_patch_appends_only_to_the_finalizers_it_saw() {
        let none = gcs(&[]);
        // The API server's JSON patch reads a missing list as null.
        let stored = serde_json::json!({"metadata": {"uid": "u-1", "finalizers": null}});
        assert_eq!(applied(&none, stored), Ok(serde_json::json!([FINALIZER])));
        let theirs = gcs(&["example.com/keep"]);
        let stored =
            serde_json::json!({"metadata": {"uid": "u-1", "finalizers": ["example.com/keep"]}});
        assert_eq!(
            applied(&theirs, stored),
            Ok(serde_json::json!(["example.com/keep", FINALIZER]))
        );
        // The cache lagged: the stored object has the finalizer already.
        let stored = serde_json::json!({"metadata": {"uid": "u-1", "finalizers": [FINALIZER]}});
        assert!(applied(&none, stored).is_err());
        // Another object of the same name.
        let stored = serde_json::json!({"metadata": {"uid": "u-2", "finalizers": null}});
        assert!(applied(&none, stored).is_err());
    }
}
