//! The IAM permissions the operator needs: one per Cloud Storage call it
//! makes ([`crate::gcs`] names each call when it records it), and the
//! custom role that grants exactly these
//! (`deploy/gcp/bucketmap-operator-role.yaml`, docs/INSTALL-GKE.md).

/// Each Cloud Storage call of [`crate::gcs::GcsClient`] (the method name it
/// is recorded under in metrics) and the IAM permission it needs.
pub const PERMISSIONS: &[(&str, &str)] = &[
    ("GetBucket", "storage.buckets.get"),
    // `ipFilter`: read it, and reach a bucket whose filter does not list the
    // operator's addresses (get, update and delete are exempt with it).
    ("GetBucket", "storage.buckets.getIpFilter"),
    ("GetBucket", "storage.buckets.exemptFromIpFilter"),
    // Whether a bucket lives in a project (adoption, ownership checks).
    ("ListBuckets", "storage.buckets.list"),
    ("CreateBucket", "storage.buckets.create"),
    // `objectRetention: {mode: Enabled}` on a new bucket.
    ("CreateBucket", "storage.buckets.enableObjectRetention"),
    // `ipFilter` on a new bucket, and its drift.
    ("CreateBucket", "storage.buckets.setIpFilter"),
    ("UpdateBucket", "storage.buckets.setIpFilter"),
    // Drift correction.
    ("UpdateBucket", "storage.buckets.update"),
    // `retentionPolicy.isLocked: true`.
    ("LockBucketRetentionPolicy", "storage.buckets.update"),
    ("DeleteBucket", "storage.buckets.delete"),
    // Deletion: is the bucket empty; `forceDestroy` empties it.
    ("ListObjects", "storage.objects.list"),
    ("DeleteObject", "storage.objects.delete"),
    // `spec.access`: read-modify-write of the bucket's policy.
    ("GetIamPolicy", "storage.buckets.getIamPolicy"),
    ("SetIamPolicy", "storage.buckets.setIamPolicy"),
    // `spec.notifications` (JSON API): read them, make and delete them.
    ("ListNotificationConfigs", "storage.buckets.get"),
    ("CreateNotificationConfig", "storage.buckets.update"),
    ("DeleteNotificationConfig", "storage.buckets.update"),
];

/// Calls any caller may make, with no permission: TestIamPermissions asks
/// whether the operator may read a bucket's IP filter (GCS hides the
/// filter from a caller without `storage.buckets.getIpFilter`).
pub const FREE_CALLS: &[&str] = &["TestIamPermissions"];

/// The permissions of the custom role, sorted and without duplicates.
pub fn role_permissions() -> Vec<&'static str> {
    let mut permissions: Vec<&str> = PERMISSIONS.iter().map(|(_, p)| *p).collect();
    permissions.sort_unstable();
    permissions.dedup();
    permissions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The method names `src/gcs.rs` (gRPC) and `src/gcs/notifications.rs`
    /// (JSON API) record their calls under.
    fn recorded_calls() -> Vec<String> {
        let grpc = include_str!("gcs.rs").split("self.record(\"");
        let json = include_str!("gcs/notifications.rs").split("self.record_json(\"");
        grpc.skip(1)
            .chain(json.skip(1))
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_gcs_call_has_its_permission_in_the_table() {
        let calls = recorded_calls();
        assert!(calls.len() >= 9, "too few calls found: {calls:?}");
        for call in &calls {
            assert!(
                FREE_CALLS.contains(&call.as_str())
                    || PERMISSIONS.iter().any(|(name, _)| name == call),
                "src/gcs.rs calls {call}, which src/permissions.rs does not map to a permission"
            );
        }
        for (name, _) in PERMISSIONS {
            assert!(
                calls.iter().any(|c| c == name),
                "{name} is in the table but src/gcs.rs never calls it: remove it from the role"
            );
        }
    }

    #[test]
    fn the_checked_in_role_grants_exactly_the_table() {
        let role: serde_yaml::Value =
            serde_yaml::from_str(include_str!("../deploy/gcp/bucketmap-operator-role.yaml"))
                .expect("the role file is YAML");
        let listed: Vec<&str> = role["includedPermissions"]
            .as_sequence()
            .expect("includedPermissions is a list")
            .iter()
            .map(|p| p.as_str().expect("a permission is a string"))
            .collect();
        assert_eq!(
            listed,
            role_permissions(),
            "deploy/gcp/bucketmap-operator-role.yaml differs from src/permissions.rs \
             (sorted, one per line)"
        );
    }

    #[test]
    fn the_install_page_explains_every_reason_and_lists_the_role() {
        let page = include_str!("../docs/INSTALL-GKE.md");
        let conditions = include_str!("conditions.rs");
        let reasons: Vec<&str> = conditions
            .split("pub mod reason {")
            .nth(1)
            .and_then(|m| m.split("\n}\n").next())
            .expect("conditions.rs has the reason module")
            .split("&str = \"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        assert!(reasons.len() >= 20, "too few reasons found: {reasons:?}");
        for reason in reasons {
            assert!(
                page.contains(&format!("`{reason}`")),
                "docs/INSTALL-GKE.md does not explain the reason {reason}"
            );
        }
        for permission in role_permissions() {
            assert!(page.contains(permission), "the page omits {permission}");
        }
    }
}
