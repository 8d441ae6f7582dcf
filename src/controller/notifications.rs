//! Where GCS publishes object changes: the configurations of
//! `spec.notifications` on the bucket (the rules of ownership are in
//! [`crate::notifications`]).
//!
//! A topic GCS refuses (missing, or the Cloud Storage service agent may not
//! publish to it) is reported in the `Notifications` condition and tried
//! again soon; the bucket stays Ready, since its data is unaffected. The
//! operator never creates topics nor grants on them. Like the bucket's
//! other settings, the configurations stay with a bucket that is orphaned
//! or abandoned, and go with one that is deleted.

use kube::runtime::events::EventType;
use tracing::info;

use super::Context;
use super::status::StatusWriter;
use crate::conditions::{NOTIFICATIONS, reason};
use crate::crd::{Gcs, RecordedNotification};
use crate::gcs::{GcsErrorKind, NotificationResource};
use crate::notifications::{self, Key};
use crate::{Error, Result};

/// Whether every declared configuration is in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Synced {
    /// In place, or nothing declared.
    Done,
    /// A topic was refused; try again before the next resync.
    TopicRefused,
}

/// Makes bucket `physical`'s notification configurations as declared and
/// says how it went in the `Notifications` condition.
pub(super) async fn sync_notifications(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    physical: &str,
) -> Result<Synced> {
    let declared = &obj.spec.notifications;
    if declared.is_empty() && status.status.notifications.is_empty() {
        status.condition(NOTIFICATIONS, None);
        return Ok(Synced::Done);
    }
    let mut existing = fail_with_condition(status, ctx.gcs.list_notifications(physical).await)?;
    let plan = notifications::plan(declared, &status.status.notifications, &existing);
    let intent = notifications::intent(declared, &status.status.notifications, &existing);
    if intent != status.status.notifications {
        status.status.notifications = intent;
        status.flush().await?;
    }
    let mut refused: Vec<(&str, String)> = declared
        .iter()
        .filter_map(notifications::invalid)
        .map(|why| (reason::INVALID_SPEC, why))
        .collect();
    for config in &plan.create {
        let request = notifications::to_resource(config);
        match ctx.gcs.insert_notification(physical, &request).await {
            Ok(created) => {
                announce_created(obj, ctx, physical, &created);
                existing.push(created);
            }
            Err(e) if topic_refused(&e) => refused.push((reason::TOPIC_UNAVAILABLE, e.message)),
            Err(e) => return fail_with_condition(status, Err(Error::Gcs(e))),
        }
    }
    for (id, key) in &plan.delete {
        fail_with_condition(status, ctx.gcs.delete_notification(physical, id).await)?;
        existing.retain(|r| r.id.as_deref() != Some(id.as_str()));
        announce_deleted(obj, ctx, physical, id, key);
    }
    status.status.notifications = declared_with_ids(obj, &existing);
    Ok(report(obj, ctx, status, physical, &refused))
}

fn topic_refused(e: &crate::gcs::GcsError) -> bool {
    matches!(
        e.kind,
        GcsErrorKind::InvalidArgument | GcsErrorKind::PermissionDenied | GcsErrorKind::NotFound
    ) && notifications::is_topic_refusal(&e.message)
}

/// Sets the condition false when `result` is a GCS failure.
fn fail_with_condition<T, E: Into<Error>>(
    status: &mut StatusWriter<'_>,
    result: std::result::Result<T, E>,
) -> Result<T> {
    result.map_err(|e| {
        let error: Error = e.into();
        let why = super::access::failure_reason(&error);
        status.condition(NOTIFICATIONS, Some((false, why, error.to_string())));
        error
    })
}

/// The declared configurations (each content once) with their ids.
fn declared_with_ids(obj: &Gcs, existing: &[NotificationResource]) -> Vec<RecordedNotification> {
    notifications::intent(&obj.spec.notifications, &[], existing)
}

fn announce_created(obj: &Gcs, ctx: &Context, physical: &str, created: &NotificationResource) {
    let id = created.id.as_deref().unwrap_or("?");
    info!(bucket = %physical, id, topic = %created.topic, "created notification configuration");
    let note = format!(
        "Bucket {physical} publishes to {} (notification configuration {id})",
        created.topic
    );
    ctx.event(
        obj,
        EventType::Normal,
        "NotificationCreated",
        "CreateNotificationConfig",
        note,
    );
}

fn announce_deleted(obj: &Gcs, ctx: &Context, physical: &str, id: &str, key: &Key) {
    info!(bucket = %physical, id, topic = %key.topic(), "deleted notification configuration");
    let note = format!(
        "Bucket {physical} no longer publishes to {} (notification configuration {id} deleted)",
        key.topic()
    );
    ctx.event(
        obj,
        EventType::Normal,
        "NotificationDeleted",
        "DeleteNotificationConfig",
        note,
    );
}

/// The `Notifications` condition, and a warning when a refusal is new.
fn report(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    physical: &str,
    refused: &[(&str, String)],
) -> Synced {
    if obj.spec.notifications.is_empty() {
        // Everything recorded was deleted: nothing is declared any more.
        status.condition(NOTIFICATIONS, None);
        return Synced::Done;
    }
    if refused.is_empty() {
        let topics: Vec<&str> = status
            .status
            .notifications
            .iter()
            .map(|n| n.topic.as_str())
            .collect();
        let message = format!("Bucket {physical} publishes to {}", topics.join(", "));
        status.condition(
            NOTIFICATIONS,
            Some((true, reason::NOTIFICATIONS_READY, message)),
        );
        return Synced::Done;
    }
    let mut messages: Vec<&str> = refused.iter().map(|(_, m)| m.as_str()).collect();
    let topic = refused
        .iter()
        .any(|(why, _)| *why == reason::TOPIC_UNAVAILABLE);
    if topic {
        messages.push("create the topic and grant roles/pubsub.publisher on it to the project's Cloud Storage service agent (docs/INSTALL-GKE.md); bucketmap creates neither");
    }
    let message = messages.join("; ");
    let why = refused[0].0;
    let unchanged = status
        .current(NOTIFICATIONS)
        .is_some_and(|c| c.reason == why && c.message == message);
    if !unchanged {
        ctx.event(
            obj,
            EventType::Warning,
            why,
            "CreateNotificationConfig",
            message.clone(),
        );
    }
    status.condition(NOTIFICATIONS, Some((false, why, message)));
    if topic {
        Synced::TopicRefused
    } else {
        Synced::Done
    }
}
