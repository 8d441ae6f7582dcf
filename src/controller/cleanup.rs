//! Deleting a bucket when its resource goes: unpublish first (and, with
//! the namespace's last resource, unbind its map's readers), revoke the
//! operator's IAM grants (whatever the `deletionPolicy`), then per
//! `deletionPolicy`: delete the bucket, keep it (`Orphan`, still labelled
//! as this owner's) or release it (`Abandon`, bucketmap's labels removed).
//! Never a bucket that does not carry this owner's labels, never data the
//! user did not ask to delete.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::info;

use super::Context;
use super::status::StatusWriter;
use crate::conditions::reason;
use crate::crd::{DeletionPolicy, Gcs};
use crate::gcs::{Emptied, GcsErrorKind};
use crate::naming::{self, Identity, Ownership};
use crate::publish;
use crate::slots::Slot;
use crate::{Error, Result};
use google_cloud_storage::model::Bucket;

/// Deletes the bucket per `deletionPolicy`, never one that is not ours.
pub(super) async fn cleanup(
    obj: Arc<Gcs>,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    slot: &mut Slot,
) -> Result<Action> {
    let recorded = status.status.clone();
    // The workloads lose the name first, whatever happens to the bucket.
    slot.released_while(ctx.maps.unpublish(&obj)).await??;
    if ctx.config.service_binding {
        publish::delete_binding(&ctx.client, &obj).await?;
    }
    // The namespace's last resource takes its map's readers with it.
    super::map_readers::release(ctx, &obj).await?;
    let Some(physical) = recorded.bucket_full_name else {
        return Ok(Action::await_change());
    };
    // The namespace no longer declares access, whether the bucket stays or not.
    super::access::revoke_all(&obj, ctx, status, &physical).await?;
    match obj.spec.effective_deletion_policy() {
        DeletionPolicy::Orphan => {
            let note = format!(
                "deletionPolicy is Orphan: bucket {physical} is kept, without the grants of spec.access, still labelled as owned by cluster identity {}: a Gcs of the same namespace and name finds it again",
                ctx.config.cluster_id
            );
            ctx.event(&obj, EventType::Normal, "Orphaned", "DeleteBucket", note);
            return Ok(Action::await_change());
        }
        DeletionPolicy::Abandon => {
            abandon(&obj, ctx, &physical).await?;
            return Ok(Action::await_change());
        }
        DeletionPolicy::Delete => {}
    }
    let Some(bucket) = ours(&obj, ctx, &physical).await? else {
        return Ok(Action::await_change());
    };
    empty_bucket(&obj, ctx, &bucket).await?;
    let project = recorded.project_id.unwrap_or_default();
    delete_bucket(&obj, ctx, &physical, &project).await?;
    Ok(Action::await_change())
}

/// Bucket `physical`, if it exists and carries this owner's labels (or,
/// from an earlier version, this resource's uid); a foreign or unowned one
/// is reported and left alone.
async fn ours(
    obj: &Gcs,
    ctx: &Context,
    physical: &str,
) -> Result<Option<google_cloud_storage::model::Bucket>> {
    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    let identity = Identity {
        cluster: &ctx.config.cluster_id,
        namespace: &ns,
        name: &name,
    };
    let Some(bucket) = ctx.gcs.get_bucket(physical).await? else {
        info!(bucket = %physical, "bucket already gone");
        return Ok(None);
    };
    match naming::ownership(&bucket.labels, &identity, obj.uid().as_deref()) {
        Ownership::Ours | Ownership::Legacy => return Ok(Some(bucket)),
        Ownership::Foreign(who) => {
            let note = format!(
                "Bucket {physical} is owned by {who}, not by this resource; left untouched"
            );
            ctx.event(
                obj,
                EventType::Warning,
                reason::NOT_OWNED,
                "DeleteBucket",
                note,
            );
        }
        Ownership::Unowned => {
            let note =
                format!("Bucket {physical} carries no bucketmap owner label; left untouched");
            ctx.event(
                obj,
                EventType::Warning,
                reason::NOT_OWNED,
                "DeleteBucket",
                note,
            );
        }
    }
    Ok(None)
}

/// `Abandon`: keeps the bucket and removes bucketmap's labels from it, so
/// that it is nobody's (another cluster or Gcs may adopt it).
async fn abandon(obj: &Gcs, ctx: &Context, physical: &str) -> Result<()> {
    let Some(bucket) = ours(obj, ctx, physical).await? else {
        return Ok(());
    };
    let labels = naming::without_ownership_labels(&bucket.labels);
    let patch = google_cloud_storage::model::Bucket::new().set_labels(labels);
    ctx.gcs
        .update_bucket(physical, patch, &["labels"], bucket.metageneration)
        .await?;
    info!(bucket = %physical, "abandoned bucket");
    let note = format!(
        "deletionPolicy is Abandon: bucket {physical} is kept, without the grants of spec.access and without bucketmap's labels; it is nobody's now and may be adopted (spec.adopt.bucket)"
    );
    ctx.event(obj, EventType::Normal, "Abandoned", "DeleteBucket", note);
    Ok(())
}

/// With `forceDestroy`, deletes every object version, save those under
/// retention or on hold: while any is left, the deletion waits
/// (`RetentionLocked`).
/// A retention policy is never removed to get there, locked or not: it is
/// the user's promise that no object goes before its time, and deleting
/// the `Gcs` does not take it back.
/// Without it, refuses (`DeletionBlocked`) while the bucket holds any.
async fn empty_bucket(obj: &Gcs, ctx: &Context, bucket: &Bucket) -> Result<()> {
    let physical = bucket.bucket_id.as_str();
    if !obj.spec.force_destroy {
        if ctx.gcs.list_objects(physical, true, 1).await?.is_empty() {
            return Ok(());
        }
        return Err(Error::DeletionBlocked(format!(
            "bucket {physical} is not empty: delete its objects (including noncurrent versions) or set spec.forceDestroy: true; the bucket is kept until then"
        )));
    }
    let emptied = ctx.gcs.delete_unretained_objects(physical).await?;
    if emptied.deleted > 0 {
        let deleted = emptied.deleted;
        ctx.event(
            obj,
            EventType::Normal,
            "ObjectsDeleted",
            "DeleteBucket",
            format!("forceDestroy: deleted {deleted} object versions from bucket {physical}"),
        );
    }
    match (emptied.retained, emptied.held) {
        (0, 0) => Ok(()),
        (0, held) => Err(Error::RetentionLocked(hold_message(bucket, held))),
        (retained, held) => {
            let mut message = retention_message(bucket, retained, emptied);
            if held > 0 {
                message = format!("{message}. {}", hold_message(bucket, held));
            }
            Err(Error::RetentionLocked(message))
        }
    }
}

/// Why the bucket is kept: objects on hold, which nothing but their
/// release lets go.
fn hold_message(bucket: &Bucket, held: usize) -> String {
    format!(
        "bucket {} cannot be destroyed while objects are on hold: {held} object versions have a temporary or event-based hold; bucketmap does not release holds: release them (gcloud storage objects update --no-temporary-hold / --no-event-based-hold) and the deletion goes on",
        bucket.bucket_id
    )
}

/// Why the bucket is kept: objects under retention, until when.
fn retention_message(bucket: &Bucket, retained: usize, emptied: Emptied) -> String {
    let physical = &bucket.bucket_id;
    let why = match bucket.retention_policy.as_ref() {
        Some(p) => {
            let seconds = p.retention_duration.as_ref().map_or(0, |d| d.seconds());
            if p.is_locked {
                format!("the bucket's retention policy is locked at {seconds}s")
            } else {
                format!(
                    "the bucket's retention policy keeps objects {seconds}s; it is not locked: removing it from the bucket (gcloud storage buckets update --clear-retention-period) lets bucketmap destroy the bucket now, bucketmap does not remove it"
                )
            }
        }
        None => "they carry a retention of their own (object retention)".to_owned(),
    };
    let until = emptied
        .retained_until
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map_or_else(|| "unknown".to_owned(), |t| t.to_string());
    format!(
        "bucket {physical} cannot be destroyed until its objects' retention expires: {retained} object versions are under retention ({why}), the last until {until}; {} expired ones were deleted. bucketmap deletes the rest as they expire and then the bucket; the Gcs keeps its finalizer until then",
        emptied.deleted
    )
}

/// Deletes the (empty) bucket, paced per project; gone already is fine.
async fn delete_bucket(obj: &Gcs, ctx: &Context, physical: &str, project: &str) -> Result<()> {
    match ctx
        .pacer
        .run(project, ctx.gcs.delete_bucket(physical))
        .await
    {
        Ok(()) => {}
        Err(e) if e.kind == GcsErrorKind::NotFound => {}
        Err(e) if e.kind == GcsErrorKind::FailedPrecondition => {
            return Err(Error::DeletionBlocked(format!(
                "bucket {physical} is not empty ({}); delete its objects or set spec.forceDestroy: true",
                e.message
            )));
        }
        Err(e) => return Err(e.into()),
    }
    info!(bucket = %physical, "deleted bucket");
    let note = format!("Deleted bucket {physical}");
    ctx.event(obj, EventType::Normal, "Deleted", "DeleteBucket", note);
    Ok(())
}
