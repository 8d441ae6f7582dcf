//! Bucket Lock and object retention as GCS enforces them: a retention
//! policy is locked by LockBucketRetentionPolicy (at the bucket's current
//! metageneration, never undone); while an object is younger than the
//! bucket's retention period, or its own retention (Object Retention Lock)
//! has not passed, it cannot be deleted (PERMISSION_DENIED, the JSON API's
//! 403 `retentionPolicyNotMet`); objects report when they may go
//! (`retention_expire_time`).

use prost_types::Timestamp;
use tonic::Status;

use super::proto;
use super::state::{State, duration_of, now, parse_bucket_name, touch};

impl State {
    /// LockBucketRetentionPolicy: locks the current policy. The request's
    /// metageneration must be the bucket's (FAILED_PRECONDITION otherwise,
    /// INVALID_ARGUMENT when it is not positive); a bucket without a policy
    /// has nothing to lock (FAILED_PRECONDITION). Locking a locked policy
    /// changes nothing.
    pub(crate) fn lock_retention_policy(
        &mut self,
        request: &proto::LockBucketRetentionPolicyRequest,
    ) -> Result<proto::Bucket, Status> {
        let id = parse_bucket_name(&request.bucket)?;
        let wanted = request.if_metageneration_match;
        if wanted <= 0 {
            return Err(Status::invalid_argument(format!(
                "LockBucketRetentionPolicy of bucket {id} needs a positive if_metageneration_match, got {wanted}"
            )));
        }
        let bucket = self.existing_bucket(id)?;
        if bucket.metageneration != wanted {
            return Err(Status::failed_precondition(format!(
                "metageneration precondition failed for bucket {id}: if_metageneration_match={wanted}, actual {}",
                bucket.metageneration
            )));
        }
        let Some(policy) = bucket.retention_policy else {
            return Err(Status::failed_precondition(format!(
                "bucket {id} has no retention policy to lock"
            )));
        };
        if policy.is_locked {
            return Ok(bucket.clone());
        }
        let id = id.to_string();
        let bucket = self
            .buckets
            .get_mut(&id)
            .ok_or_else(|| super::state::bucket_not_found(&id))?;
        if let Some(policy) = bucket.retention_policy.as_mut() {
            policy.is_locked = true;
        }
        touch(bucket);
        Ok(bucket.clone())
    }
}

/// `object` as GCS returns it from `bucket`: with the time its bucket's
/// retention policy lets it go, if the bucket has one.
pub(crate) fn with_retention_expiry(
    bucket: &proto::Bucket,
    mut object: proto::Object,
) -> proto::Object {
    object.retention_expire_time = policy_expiry(bucket, &object);
    object
}

/// PERMISSION_DENIED while `object` may not be deleted yet: on hold
/// (temporary or event-based), younger than `bucket`'s retention period,
/// or under its own retention.
pub(crate) fn check_deletable(
    bucket: &proto::Bucket,
    object: &proto::Object,
) -> Result<(), Status> {
    if object.temporary_hold || object.event_based_hold == Some(true) {
        return Err(Status::permission_denied(format!(
            "Object '{}/{}' is under active Event-Based hold or Temporary hold and cannot be deleted, overwritten or archived until the hold is removed",
            bucket.bucket_id, object.name
        )));
    }
    let now = now();
    let own = object.retention.as_ref().and_then(|r| r.retain_until_time);
    let until = [policy_expiry(bucket, object), own]
        .into_iter()
        .flatten()
        .filter(|t| later(t, &now))
        .max_by(|a, b| (a.seconds, a.nanos).cmp(&(b.seconds, b.nanos)));
    match until {
        None => Ok(()),
        Some(t) => Err(Status::permission_denied(format!(
            "Object '{}/{}' is subject to bucket's retention policy or object retention and cannot be deleted or overwritten until {}",
            bucket.bucket_id, object.name, t
        ))),
    }
}

/// When `bucket`'s retention policy lets `object` go: its creation plus
/// the retention period.
fn policy_expiry(bucket: &proto::Bucket, object: &proto::Object) -> Option<Timestamp> {
    let period = duration_of(bucket.retention_policy?.retention_duration);
    let created = object.create_time?;
    let seconds = i64::try_from(period.as_secs()).unwrap_or(i64::MAX);
    Some(Timestamp {
        seconds: created.seconds.saturating_add(seconds),
        nanos: created.nanos,
    })
}

fn later(a: &Timestamp, b: &Timestamp) -> bool {
    (a.seconds, a.nanos) > (b.seconds, b.nanos)
}
