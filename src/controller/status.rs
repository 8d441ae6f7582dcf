//! The status a reconcile builds, written once (and only when changed), and
//! how a failed reconcile shows in it.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::{Context, FIELD_MANAGER};
use crate::conditions::{self, READY, reason};
use crate::crd::{Gcs, GcsStatus};
use crate::gcs::GcsErrorKind;
use crate::{Error, Result};

/// The status a reconcile is building, written once at the end if changed.
pub(super) struct StatusWriter<'a> {
    obj: &'a Gcs,
    ctx: &'a Context,
    pub(super) status: GcsStatus,
    /// What the API server holds (as far as this reconcile knows).
    written: Option<GcsStatus>,
}

impl<'a> StatusWriter<'a> {
    /// The status as the cache shows it, with a bucket this process has
    /// recorded that the cache does not show yet (see [`CreatedBuckets`]).
    pub(super) fn new(obj: &'a Gcs, ctx: &'a Context) -> Self {
        let mut writer = StatusWriter {
            obj,
            ctx,
            status: obj.status.clone().unwrap_or_default(),
            written: obj.status.clone(),
        };
        let Some(uid) = obj.uid() else {
            return writer;
        };
        if writer.status.create_time.is_some() {
            return writer;
        }
        if let Some(created) = ctx.created.get(&uid) {
            writer.name(&created.physical, &created.project, created.attempt);
            writer.status.create_time = Some(created.time);
        }
        writer
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

    /// Records when the bucket was first created (kept afterwards), here
    /// and in [`CreatedBuckets`] until the cache shows it.
    pub(super) fn created_now(&mut self) {
        if self.status.create_time.is_some() {
            return;
        }
        let time = Time(k8s_openapi::jiff::Timestamp::now());
        self.status.create_time = Some(time.clone());
        let (Some(uid), Some(physical), Some(project)) = (
            self.obj.uid(),
            self.status.bucket_full_name.clone(),
            self.status.project_id.clone(),
        ) else {
            return;
        };
        let attempt = self.status.name_attempt.unwrap_or(0);
        let created = Created {
            physical,
            project,
            attempt,
            time,
        };
        self.ctx.created.record(uid, created);
    }

    /// Writes the status if it differs from what the API server holds.
    pub(super) async fn flush(&mut self) -> Result<()> {
        if self.written.as_ref() == Some(&self.status) {
            return Ok(());
        }
        write_status(self.obj, &self.ctx.client, &self.status).await?;
        self.written = Some(self.status.clone());
        Ok(())
    }

    /// Sets the `Ready` condition to false for `reason` and writes it.
    pub(super) async fn not_ready(&mut self, reason: &str, message: String) -> Result<()> {
        self.ready(false, reason, message);
        self.flush().await
    }
}

/// Buckets this process has recorded as created (or adopted) for a
/// resource, by its uid, until the resource cache shows the record.
///
/// A status write reaches the cache through the watch, a few milliseconds
/// later. A reconcile that starts meanwhile would read the resource
/// without `createTime` and create its bucket again: GCS answers
/// AlreadyExists, the bucket is found again, and the project's create
/// quota pays for a call that did nothing. The entry goes when the watch
/// brings the record to the cache, or the resource's deletion.
#[derive(Default)]
pub(super) struct CreatedBuckets(Mutex<HashMap<String, Created>>);

/// One bucket recorded as created: the fields its status write carried.
#[derive(Clone)]
pub(super) struct Created {
    physical: String,
    project: String,
    attempt: u32,
    time: Time,
}

impl CreatedBuckets {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Created>> {
        // Each entry is written whole under the lock: a poisoned map is
        // still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, uid: String, created: Created) {
        self.lock().insert(uid, created);
    }

    fn get(&self, uid: &str) -> Option<Created> {
        self.lock().get(uid).cloned()
    }

    /// The watch brought `event` to the cache: what the cache now shows,
    /// and what is gone, leaves.
    pub(super) fn seen(&self, event: &Event<Gcs>) {
        let shown = |obj: &Gcs| obj.status.as_ref().is_some_and(|s| s.create_time.is_some());
        let uid = match event {
            Event::Apply(obj) | Event::InitApply(obj) if shown(obj) => obj.uid(),
            Event::Delete(obj) => obj.uid(),
            _ => return,
        };
        if let Some(uid) = uid {
            self.lock().remove(&uid);
        }
    }
}

async fn write_status(obj: &Gcs, client: &kube::Client, status: &GcsStatus) -> Result<()> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let name = obj.name_any();
    let api: Api<Gcs> = Api::namespaced(client.clone(), &ns);
    let patch = serde_json::json!({
        "apiVersion": Gcs::api_version(&()),
        "kind": Gcs::kind(&()),
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!("write status of Gcs {ns}/{name}")))?;
    Ok(())
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
            return;
        }
        if let Err(e) = writer
            .not_ready(report.reason, report.message.clone())
            .await
        {
            warn!(error = %e, "cannot record failure in status");
        }
    }
    ctx.event(
        obj,
        EventType::Warning,
        report.event_reason,
        "Reconcile",
        report.message,
    );
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
        ] {
            assert_eq!(failure_report(&error, "p"), None, "{error}");
        }
    }

    fn resource(uid: &str, created: bool) -> Gcs {
        let mut obj: Gcs = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1", "kind": "Gcs",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"bucketName": "photos"},
        }))
        .expect("a valid Gcs");
        let time = Time(k8s_openapi::jiff::Timestamp::now());
        obj.status = Some(GcsStatus {
            create_time: created.then_some(time),
            ..GcsStatus::default()
        });
        obj
    }

    #[test]
    fn a_created_bucket_is_remembered_until_the_cache_shows_it_or_it_is_deleted() {
        let created = CreatedBuckets::default();
        for uid in ["a", "b"] {
            let entry = Created {
                physical: format!("photos-{uid}"),
                project: "p".into(),
                attempt: 0,
                time: Time(k8s_openapi::jiff::Timestamp::now()),
            };
            created.record(uid.into(), entry);
        }
        created.seen(&Event::Apply(resource("a", false)));
        created.seen(&Event::InitApply(resource("b", false)));
        assert!(created.get("a").is_some(), "the cache is still behind");
        assert!(created.get("b").is_some(), "the cache is still behind");
        created.seen(&Event::Apply(resource("a", true)));
        assert!(created.get("a").is_none(), "the cache shows it");
        created.seen(&Event::Delete(resource("b", false)));
        assert!(created.get("b").is_none(), "the resource is gone");
    }
}
