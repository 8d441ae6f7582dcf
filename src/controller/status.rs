//! The status a reconcile builds, written once (and only when changed), and
//! how a failed reconcile shows in it.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::{Context, FIELD_MANAGER};
use crate::conditions::{self, READY, reason};
use crate::crd::{Gcs, GcsStatus, RECONCILE_REQUEST_ANNOTATION};
use crate::gcs::GcsErrorKind;
use crate::{Error, Result};

/// The status a reconcile is building, written at the end (and on the
/// way where a crash must not lose a step) if changed.
///
/// Every write is conditional on the resourceVersion of the object the
/// status was computed from: the API server refuses it with 409 when the
/// object changed since (a spec edit, another replica's or an earlier
/// reconcile's status write the cache had not shown yet), and the
/// reconcile runs again from the live object ([`super::reconcile`]). A
/// status computed from an old view therefore never lands.
pub(super) struct StatusWriter<'a> {
    obj: &'a Gcs,
    ctx: &'a Context,
    pub(super) status: GcsStatus,
    /// What the API server holds (as far as this reconcile knows).
    written: Option<GcsStatus>,
    /// The resourceVersion the status is computed from: the object's, then
    /// each of our writes'.
    base: Option<String>,
}

impl<'a> StatusWriter<'a> {
    /// The status of `obj`, the view a reconcile starts from. A reconcile
    /// requested through [`RECONCILE_REQUEST_ANNOTATION`] counts as
    /// handled by this one, whatever its outcome.
    pub(super) fn new(obj: &'a Gcs, ctx: &'a Context) -> Self {
        let mut status = obj.status.clone().unwrap_or_default();
        if let Some(requested) = obj.annotations().get(RECONCILE_REQUEST_ANNOTATION) {
            status.last_handled_reconcile_at = Some(requested.clone());
        }
        StatusWriter {
            obj,
            ctx,
            status,
            written: obj.status.clone(),
            base: obj.metadata.resource_version.clone(),
        }
    }

    pub(super) fn ready(&mut self, ready: bool, reason: &str, message: String) {
        let generation = self.obj.metadata.generation;
        conditions::set(
            &mut self.status.conditions,
            READY,
            ready,
            reason,
            message,
            generation,
        );
        self.status.observed_generation = generation;
    }

    /// Sets condition `type_` (other than `Ready`), or removes it (`None`).
    pub(super) fn condition(&mut self, type_: &str, value: Option<(bool, &str, String)>) {
        let generation = self.obj.metadata.generation;
        match value {
            Some((status, reason, message)) => conditions::set(
                &mut self.status.conditions,
                type_,
                status,
                reason,
                message,
                generation,
            ),
            None => self.status.conditions.retain(|c| c.type_ != type_),
        }
    }

    /// The current condition `type_`, if any.
    pub(super) fn current(&self, type_: &str) -> Option<&Condition> {
        self.status.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Records the candidate name the bucket is (to be) created under.
    pub(super) fn name(&mut self, physical: &str, project: &str, attempt: u32) {
        self.status.bucket_full_name = Some(physical.to_owned());
        self.status.bucket_name = Some(self.obj.spec.bucket_name.clone());
        self.status.project_id = Some(project.to_owned());
        self.status.url = Some(format!("gs://{physical}"));
        self.status.name_attempt = Some(attempt);
    }

    /// Records when the bucket was first created (kept afterwards).
    pub(super) fn created_now(&mut self) {
        if self.status.create_time.is_none() {
            self.status.create_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        }
    }

    /// Whether the status differs from what the API server holds.
    fn changed(&self) -> bool {
        self.written.as_ref() != Some(&self.status)
    }

    /// Writes the status if it differs from what the API server holds,
    /// provided the object is still the one it was computed from
    /// ([`Error::Stale`] otherwise).
    pub(super) async fn flush(&mut self) -> Result<()> {
        if !self.changed() {
            return Ok(());
        }
        let base = self.base.as_deref();
        let written = write_status(self.obj, &self.ctx.client, &self.status, base).await?;
        if let (Some(uid), Some(version)) = (self.obj.uid(), &written) {
            self.ctx.own_writes.record(uid, version.clone());
        }
        self.base = written;
        self.written = Some(self.status.clone());
        Ok(())
    }

    /// Confirms, by a live read, that the object is still at the version
    /// the status is computed from, before a step taken once per bucket
    /// (its create, its adoption) that a view from a cache behind the API
    /// server would take a second time: [`Error::Stale`] when it moved on,
    /// so the reconcile runs again from the live object. Costs one read
    /// per bucket created or adopted; the status write that records the
    /// step could not be conditional on a write that has not happened.
    pub(super) async fn confirm_current(&self) -> Result<()> {
        let ns = self.obj.namespace().unwrap_or_default();
        let name = self.obj.name_any();
        let api: Api<Gcs> = Api::namespaced(self.ctx.client.clone(), &ns);
        let live = api
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("read Gcs {ns}/{name}")))?;
        let version = live.and_then(|g| g.metadata.resource_version);
        if version.is_none() || version != self.base {
            return Err(Error::Stale(format!(
                "Gcs {ns}/{name} changed since resourceVersion {} that the reconcile read",
                self.base.as_deref().unwrap_or("?")
            )));
        }
        Ok(())
    }

    /// Sets the `Ready` condition to false for `reason` and writes it.
    pub(super) async fn not_ready(&mut self, reason: &str, message: String) -> Result<()> {
        self.ready(false, reason, message);
        self.flush().await
    }
}

/// The resourceVersion of this process's latest status write of each
/// resource (by uid), until the resource cache shows the resource at that
/// version: the expectations Kubernetes' own controllers keep.
///
/// A status write reaches the cache through the watch some milliseconds
/// later. A reconcile that starts meanwhile reads the object live instead
/// of from the cache ([`OwnWrites::behind`]), so that it neither repeats a
/// step the write recorded (a bucket created again: GCS answers
/// AlreadyExists and the project's create quota pays for it) nor computes
/// a status that its conditional write would only have refused. An entry
/// leaves when the cache shows that version, when a live read finds the
/// cache current, or when the resource is gone (deleted, or missing from
/// a relist after the watch was down).
#[derive(Default)]
pub(super) struct OwnWrites(Mutex<HashMap<String, String>>);

impl OwnWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // Each entry is written whole under the lock: a poisoned map is
        // still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, uid: String, version: String) {
        self.lock().insert(uid, version);
    }

    /// Whether the cached `obj` may be older than a write of ours.
    pub(super) fn behind(&self, obj: &Gcs) -> bool {
        let Some(uid) = obj.metadata.uid.as_deref() else {
            return false;
        };
        let lock = self.lock();
        lock.get(uid)
            .is_some_and(|v| Some(v) != obj.metadata.resource_version.as_ref())
    }

    /// A live read found `live` where the cache held `cached`: the cache is
    /// current when they agree; else it is behind until it shows `live`.
    pub(super) fn read_live(&self, cached: &Gcs, live: &Gcs) {
        let (Some(uid), Some(version)) = (live.uid(), live.resource_version()) else {
            return;
        };
        let same = cached.uid().as_deref() == Some(uid.as_str())
            && cached.resource_version().as_deref() == Some(version.as_str());
        let mut lock = self.lock();
        if same {
            lock.remove(&uid);
        } else {
            lock.insert(uid, version);
        }
    }

    /// The watch brought `event` to `cache` (already applied): what the
    /// cache now shows at our version, and what is gone, leaves.
    pub(super) fn seen(&self, event: &Event<Gcs>, cache: &Store<Gcs>) {
        match event {
            Event::Apply(obj) | Event::InitApply(obj) => {
                let (Some(uid), Some(version)) = (obj.uid(), obj.resource_version()) else {
                    return;
                };
                let mut lock = self.lock();
                if lock.get(&uid) == Some(&version) {
                    lock.remove(&uid);
                }
            }
            Event::Delete(obj) => {
                if let Some(uid) = obj.uid() {
                    self.lock().remove(&uid);
                }
            }
            // A relist replaces the cache without delete events: resources
            // deleted while the watch was down leave here.
            Event::InitDone => {
                let mut lock = self.lock();
                if lock.is_empty() {
                    return;
                }
                let cached: std::collections::HashSet<String> =
                    cache.state().iter().filter_map(|g| g.uid()).collect();
                lock.retain(|uid, _| cached.contains(uid));
            }
            Event::Init => {}
        }
    }

    /// How many resources have a write the cache has not shown.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Writes `status` (server-side apply of the status subresource), on
/// condition that the object is still at resourceVersion `base` when one
/// is given; the resourceVersion the write gave it.
async fn write_status(
    obj: &Gcs,
    client: &kube::Client,
    status: &GcsStatus,
    base: Option<&str>,
) -> Result<Option<String>> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let name = obj.name_any();
    let api: Api<Gcs> = Api::namespaced(client.clone(), &ns);
    let mut patch = serde_json::json!({
        "apiVersion": Gcs::api_version(&()),
        "kind": Gcs::kind(&()),
        "status": status,
    });
    if let Some(base) = base {
        // Server-side apply takes a resourceVersion in the applied object
        // as a precondition: 409 Conflict when the object moved on.
        patch["metadata"] = serde_json::json!({ "resourceVersion": base });
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match api
        .patch_status(&name, &params, &Patch::Apply(&patch))
        .await
    {
        Ok(written) => Ok(written.metadata.resource_version),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::Stale(format!(
            "Gcs {ns}/{name} changed since resourceVersion {} that its status was computed from",
            base.unwrap_or("?")
        ))),
        Err(e) => Err(Error::kube(format!("write status of Gcs {ns}/{name}"))(e)),
    }
}

/// How a failed reconcile shows: the `Ready` condition and a warning event.
#[derive(Debug, PartialEq, Eq)]
struct FailureReport {
    /// Reason of the `Ready` condition.
    reason: &'static str,
    /// Message of the condition and of the event.
    message: String,
    /// Reason of the event.
    event_reason: &'static str,
}

/// The report of `error` for a bucket in `project`; `None` for errors that
/// are not reported in the status (Kubernetes errors cannot be reported
/// through Kubernetes reliably).
fn failure_report(error: &Error, project: &str) -> Option<FailureReport> {
    let (reason, message) = match error {
        Error::Gcs(e) => {
            let reason = match e.kind {
                GcsErrorKind::PermissionDenied => reason::PERMISSION_DENIED,
                GcsErrorKind::ResourceExhausted => reason::QUOTA_EXCEEDED,
                _ => reason::GCS_ERROR,
            };
            (
                reason,
                format!("{e} (project {project}); retrying with backoff"),
            )
        }
        Error::DeletionBlocked(msg) => (reason::DELETION_BLOCKED, msg.clone()),
        Error::RetentionLocked(msg) => (reason::RETENTION_LOCKED, msg.clone()),
        Error::BindingNotOwned(msg) => (reason::BINDING_NOT_OWNED, msg.clone()),
        _ => return None,
    };
    // GCS errors share one event reason; the others name their own.
    let event_reason = match error {
        Error::Gcs(_) => "ReconcileError",
        _ => reason,
    };
    Some(FailureReport {
        reason,
        message,
        event_reason,
    })
}

/// Whether `error` leaves `Ready` as it is: a transient GCS failure
/// (unavailable, timed out, quota) while re-checking a bucket that is Ready
/// for the current generation and not being deleted. The bucket and its
/// map entry still work; the warning event and the retry tell what
/// happened. Flipping Ready on every such blip made workloads waiting on
/// Ready see it go and come back (found by `cargo dev chaos`).
fn keeps_ready(obj: &Gcs, conditions: &[Condition], error: &Error) -> bool {
    let transient = matches!(
        error,
        Error::Gcs(e) if matches!(e.kind, GcsErrorKind::Unavailable | GcsErrorKind::ResourceExhausted)
    );
    let ready_now = conditions.iter().any(|c| {
        c.type_ == READY && c.status == "True" && c.observed_generation == obj.metadata.generation
    });
    transient && ready_now && obj.metadata.deletion_timestamp.is_none()
}

/// Puts a failed reconcile's cause into the `Ready` condition.
pub(super) async fn report_failure(
    obj: &Gcs,
    ctx: &Context,
    writer: &mut StatusWriter<'_>,
    error: &Error,
) {
    let project = writer.status.project_id.clone().unwrap_or_default();
    let Some(report) = failure_report(error, &project) else {
        return;
    };
    // A transient error on a Ready resource is reported by the event alone.
    if !keeps_ready(obj, &writer.status.conditions, error) {
        let current = writer.status.conditions.iter().find(|c| c.type_ == READY);
        if current.is_some_and(|c| c.reason == report.reason && c.message == report.message) {
            // Reported already; what else the reconcile found still lands.
            flush_quietly(writer).await;
            return;
        }
        writer.ready(false, report.reason, report.message.clone());
    }
    // Also what the reconcile found before the failure (a refusal decided
    // without GCS, for one), which must show while GCS fails.
    flush_quietly(writer).await;
    ctx.event(
        obj,
        EventType::Warning,
        report.event_reason,
        "Reconcile",
        report.message,
    );
}

/// Writes the status if changed; a failure is logged (the reconcile has
/// failed already and is retried).
async fn flush_quietly(writer: &mut StatusWriter<'_>) {
    if let Err(e) = writer.flush().await {
        warn!(error = %e, "cannot record failure in status");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcs::GcsError;

    fn gcs(kind: GcsErrorKind) -> Error {
        Error::Gcs(GcsError {
            kind,
            operation: "create bucket",
            bucket: "photos-k3x9q2mw".into(),
            message: "denied by the test".into(),
        })
    }

    #[test]
    fn gcs_errors_map_to_their_reason_and_share_one_event_reason() {
        let cases = [
            (GcsErrorKind::PermissionDenied, reason::PERMISSION_DENIED),
            (GcsErrorKind::ResourceExhausted, reason::QUOTA_EXCEEDED),
            (GcsErrorKind::Unavailable, reason::GCS_ERROR),
            (GcsErrorKind::FailedPrecondition, reason::GCS_ERROR),
            (GcsErrorKind::InvalidArgument, reason::GCS_ERROR),
            (GcsErrorKind::Other, reason::GCS_ERROR),
        ];
        for (kind, expected) in cases {
            let error = gcs(kind);
            let report = failure_report(&error, "team-a-project");
            let report = report.unwrap_or_else(|| panic!("{kind:?} is not reported"));
            assert_eq!(report.reason, expected, "{kind:?}");
            assert_eq!(report.event_reason, "ReconcileError", "{kind:?}");
            assert_eq!(
                report.message,
                format!("{error} (project team-a-project); retrying with backoff")
            );
        }
    }

    #[test]
    fn blocked_deletion_and_foreign_binding_name_their_own_event_reason() {
        let blocked = Error::DeletionBlocked("bucket b is not empty".into());
        assert_eq!(
            failure_report(&blocked, "p"),
            Some(FailureReport {
                reason: reason::DELETION_BLOCKED,
                message: "bucket b is not empty".into(),
                event_reason: reason::DELETION_BLOCKED,
            })
        );
        let foreign = Error::BindingNotOwned("Secret photos-binding is not ours".into());
        assert_eq!(
            failure_report(&foreign, "p"),
            Some(FailureReport {
                reason: reason::BINDING_NOT_OWNED,
                message: "Secret photos-binding is not ours".into(),
                event_reason: reason::BINDING_NOT_OWNED,
            })
        );
    }

    #[test]
    fn a_transient_gcs_error_keeps_a_ready_resource_ready() {
        let mut obj = Gcs::new(
            "photos",
            serde_json::from_value(serde_json::json!({"bucketName": "photos"})).unwrap(),
        );
        obj.metadata.generation = Some(2);
        let mut ready = Vec::new();
        conditions::set(
            &mut ready,
            READY,
            true,
            reason::BUCKET_READY,
            "ok".into(),
            Some(2),
        );
        for kind in [GcsErrorKind::Unavailable, GcsErrorKind::ResourceExhausted] {
            assert!(keeps_ready(&obj, &ready, &gcs(kind)), "{kind:?}");
        }
        for kind in [
            GcsErrorKind::PermissionDenied,
            GcsErrorKind::NotFound,
            GcsErrorKind::Other,
        ] {
            assert!(
                !keeps_ready(&obj, &ready, &gcs(kind)),
                "{kind:?} is reported"
            );
        }
        let unavailable = gcs(GcsErrorKind::Unavailable);
        let mut not_ready = Vec::new();
        conditions::set(
            &mut not_ready,
            READY,
            false,
            reason::CREATING,
            "".into(),
            Some(2),
        );
        assert!(
            !keeps_ready(&obj, &not_ready, &unavailable),
            "not Ready yet"
        );
        obj.metadata.generation = Some(3);
        assert!(
            !keeps_ready(&obj, &ready, &unavailable),
            "the spec changed since"
        );
        obj.metadata.generation = Some(2);
        obj.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(!keeps_ready(&obj, &ready, &unavailable), "being deleted");
    }

    #[test]
    fn kubernetes_side_errors_are_not_reported_in_the_status() {
        for error in [
            Error::MissingField("metadata.uid"),
            Error::Publish("conflict writing the map".into()),
            Error::Stale("Gcs ns/photos changed".into()),
        ] {
            assert_eq!(failure_report(&error, "p"), None, "{error}");
        }
    }

    fn resource(uid: &str, version: &str) -> Gcs {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1", "kind": "Gcs",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid, "resourceVersion": version},
            "spec": {"bucketName": "photos"},
        }))
        .expect("a valid Gcs")
    }

    fn cache(objects: &[Gcs]) -> Store<Gcs> {
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for obj in objects {
            writer.apply_watcher_event(&Event::InitApply(obj.clone()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }

    #[test]
    fn an_own_write_is_expected_until_the_cache_shows_it_or_it_is_deleted() {
        let writes = OwnWrites::default();
        let store = cache(&[]);
        writes.record("a".into(), "5".into());
        writes.record("b".into(), "6".into());
        assert!(writes.behind(&resource("a", "4")), "the cache is behind");
        assert!(!writes.behind(&resource("a", "5")), "the cache shows it");
        assert!(!writes.behind(&resource("c", "1")), "never written here");
        writes.seen(&Event::Apply(resource("a", "4")), &store);
        writes.seen(&Event::InitApply(resource("b", "3")), &store);
        assert_eq!(writes.len(), 2, "the cache is still behind");
        writes.seen(&Event::Apply(resource("a", "5")), &store);
        assert!(!writes.behind(&resource("a", "4")), "the cache showed it");
        writes.seen(&Event::Delete(resource("b", "3")), &store);
        assert_eq!(writes.len(), 0, "the resource is gone");
    }

    #[test]
    fn a_live_read_settles_an_expectation_and_a_relist_drops_the_deleted() {
        let writes = OwnWrites::default();
        writes.record("a".into(), "5".into());
        // The live object moved on past our write: expected until cached.
        writes.read_live(&resource("a", "4"), &resource("a", "9"));
        assert!(writes.behind(&resource("a", "5")));
        assert!(!writes.behind(&resource("a", "9")));
        // The cache holds what the API server holds: nothing expected.
        writes.read_live(&resource("a", "9"), &resource("a", "9"));
        assert_eq!(writes.len(), 0);
        // Deleted while the watch was down: the relist has no delete event.
        writes.record("a".into(), "5".into());
        writes.record("b".into(), "7".into());
        let relisted = cache(&[resource("b", "6")]);
        writes.seen(&Event::InitDone, &relisted);
        assert!(!writes.behind(&resource("a", "4")), "a is gone");
        assert!(writes.behind(&resource("b", "6")), "b is still expected");
    }
}
