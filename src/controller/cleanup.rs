//! Deleting a bucket when its resource goes: unpublish first, revoke the
//! operator's IAM grants (whatever the `deletionPolicy`), then delete
//! per `deletionPolicy`, never a bucket that is not ours, never data the
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
use crate::gcs::GcsErrorKind;
use crate::naming::{self, OWNER_LABEL};
use crate::publish;
use crate::slots::Slot;
use crate::{Error, Result};

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
    publish::delete_binding(&ctx.client, &obj).await?;
    let Some(physical) = recorded.bucket_full_name else {
        return Ok(Action::await_change());
    };
    // The namespace no longer declares access, whether the bucket stays or not.
    super::access::revoke_all(&obj, ctx, status, &physical).await?;
    if obj.spec.deletion_policy == DeletionPolicy::Orphan {
        let note = format!(
            "deletionPolicy is Orphan: bucket {physical} is kept, without the grants of spec.access"
        );
        ctx.event(&obj, EventType::Normal, "Orphaned", "DeleteBucket", note);
        return Ok(Action::await_change());
    }
    if !is_ours(&obj, ctx, &physical).await? {
        return Ok(Action::await_change());
    }
    empty_bucket(&obj, ctx, &physical).await?;
    let project = recorded.project_id.unwrap_or_default();
    delete_bucket(&obj, ctx, &physical, &project).await?;
    Ok(Action::await_change())
}

/// Whether bucket `physical` exists and carries this resource's ownership
/// label (a foreign one is reported and left alone).
async fn is_ours(obj: &Gcs, ctx: &Context, physical: &str) -> Result<bool> {
    let uid = obj.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let owner = naming::owner_id(&uid);
    let Some(bucket) = ctx.gcs.get_bucket(physical).await? else {
        info!(bucket = %physical, "bucket already gone");
        return Ok(false);
    };
    if bucket.labels.get(OWNER_LABEL) == Some(&owner) {
        return Ok(true);
    }
    let note = format!("Bucket {physical} is not owned by this resource; left untouched");
    ctx.event(
        obj,
        EventType::Warning,
        reason::NOT_OWNED,
        "DeleteBucket",
        note,
    );
    Ok(false)
}

/// With `forceDestroy`, deletes every object version; without it, refuses
/// (`DeletionBlocked`) while the bucket holds any.
async fn empty_bucket(obj: &Gcs, ctx: &Context, physical: &str) -> Result<()> {
    if !obj.spec.force_destroy {
        if ctx.gcs.list_objects(physical, true, 1).await?.is_empty() {
            return Ok(());
        }
        return Err(Error::DeletionBlocked(format!(
            "bucket {physical} is not empty: delete its objects (including noncurrent versions) or set spec.forceDestroy: true; the bucket is kept until then"
        )));
    }
    let deleted = ctx.gcs.delete_all_objects(physical).await?;
    if deleted > 0 {
        ctx.event(
            obj,
            EventType::Normal,
            "ObjectsDeleted",
            "DeleteBucket",
            format!("forceDestroy: deleted {deleted} object versions from bucket {physical}"),
        );
    }
    Ok(())
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
