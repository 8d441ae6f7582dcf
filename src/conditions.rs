//! The `Ready` condition and its reasons.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type users wait for.
pub const READY: &str = "Ready";

/// Condition type saying whether every grant of `spec.access` is in place.
pub const ACCESS: &str = "Access";

/// Condition type present on a resource that adopted an existing bucket:
/// when, and every setting the adoption changed.
pub const ADOPTED: &str = "Adopted";

/// Condition type present while a setting GCS fixes at creation
/// (hierarchical namespace, placement) differs from the spec: a bucket
/// adopted or found again with other settings, never re-created for them.
/// Its reason is the type's name.
pub const IMMUTABLE_SETTINGS_DIFFER: &str = "ImmutableSettingsDiffer";

/// Condition type present while the spec asks for less than the bucket's
/// locked retention policy (a shorter period, none, or an unlocked one):
/// GCS never shortens, removes or unlocks it, so the bucket keeps it and
/// stays Ready. Its reason is the type's name.
pub const RETENTION_POLICY_LOCKED: &str = "RetentionPolicyLocked";

/// Condition type present while the spec declares an IP filter and GCS
/// hides the bucket's from the operator (it lacks
/// `storage.buckets.getIpFilter`): the filter is neither compared nor
/// written, since rewriting what cannot be read would write at every
/// resync. Its reason is the type's name.
pub const IP_FILTER_HIDDEN: &str = "IpFilterHidden";

/// Condition type saying whether every configuration of
/// `spec.notifications` is in place.
pub const NOTIFICATIONS: &str = "Notifications";

/// Reasons of the `Ready`, `Access` and `Notifications` conditions.
pub mod reason {
    /// The bucket exists, is ours and matches the spec.
    pub const BUCKET_READY: &str = "BucketReady";
    /// The bucket is being created.
    pub const CREATING: &str = "Creating";
    /// Every candidate name belongs to somebody else.
    pub const NAME_CONFLICT: &str = "NameConflict";
    /// `spec.projectID` differs from the namespace's project.
    pub const PROJECT_NOT_ALLOWED: &str = "ProjectNotAllowed";
    /// No project could be resolved.
    pub const PROJECT_MISSING: &str = "ProjectMissing";
    /// The tenancy policy does not allow the resource (`crate::tenancy`).
    pub const NOT_ALLOWED_BY_POLICY: &str = "NotAllowedByPolicy";
    /// The project resolves differently than where the bucket lives.
    pub const PROJECT_CHANGED: &str = "ProjectChanged";
    /// The spec is invalid (caught again by the operator).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// GCS refused for lack of permission.
    pub const PERMISSION_DENIED: &str = "PermissionDenied";
    /// GCS quota or rate limit.
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// GCS unavailable or another GCS error; retried with backoff.
    pub const GCS_ERROR: &str = "GcsError";
    /// Deletion waits for the bucket to be emptied.
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";
    /// Deletion (with `forceDestroy`) waits for objects under retention
    /// (a locked retention policy, or their own retention) to expire.
    pub const RETENTION_LOCKED: &str = "RetentionLocked";
    /// Another resource in the namespace maps the same logical name.
    pub const MAPPING_CONFLICT: &str = "MappingConflict";
    /// The namespace's bucket map has no room left for the entry.
    pub const MAP_FULL: &str = "MapFull";
    /// A Secret of the binding's name belongs to somebody else.
    pub const BINDING_NOT_OWNED: &str = "BindingNotOwned";
    /// The bucket at the recorded name is not ours.
    pub const NOT_OWNED: &str = "NotOwned";
    /// `spec.adopt.bucket` names a bucket that belongs to somebody else,
    /// or one outside the resource's project.
    pub const ADOPTION_REFUSED: &str = "AdoptionRefused";
    /// `spec.adopt.bucket` names a bucket that does not exist.
    pub const BUCKET_NOT_FOUND: &str = "BucketNotFound";
    /// `Adopted`: the bucket was taken under management.
    pub const ADOPTED: &str = "Adopted";
    /// `Notifications`: every configuration of `spec.notifications` is on
    /// the bucket.
    pub const NOTIFICATIONS_READY: &str = "NotificationsReady";
    /// `Notifications`: GCS refused a topic: it does not exist, or the
    /// project's Cloud Storage service agent may not publish to it.
    pub const TOPIC_UNAVAILABLE: &str = "TopicUnavailable";
    /// `Access`: every grant of `spec.access` is in the bucket's policy.
    pub const ACCESS_GRANTED: &str = "AccessGranted";
    /// `Access`: a grant is refused (tenant rules, no identity).
    pub const ACCESS_NOT_ALLOWED: &str = "AccessNotAllowed";
    /// `Access`: a granted ServiceAccount does not exist yet.
    pub const ACCESS_PENDING: &str = "AccessPending";
}

/// Sets condition `type_` in `conditions`, keeping `lastTransitionTime` when
/// the status does not change.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_owned();
    let existing = conditions.iter_mut().find(|c| c.type_ == type_);
    let last_transition_time = match &existing {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(jiff_now()),
    };
    let condition = Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    };
    match existing {
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            READY,
            false,
            reason::CREATING,
            "creating".into(),
            Some(1),
        );
        let first = conditions[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        set(
            &mut conditions,
            READY,
            false,
            reason::GCS_ERROR,
            "unavailable".into(),
            Some(1),
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, first);
        assert_eq!(conditions[0].reason, reason::GCS_ERROR);
        std::thread::sleep(std::time::Duration::from_millis(5));
        set(
            &mut conditions,
            READY,
            true,
            reason::BUCKET_READY,
            "ready".into(),
            Some(1),
        );
        assert_ne!(conditions[0].last_transition_time, first);
        assert_eq!(conditions[0].status, "True");
    }
}
