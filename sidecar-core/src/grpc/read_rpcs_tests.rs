//! Which RPCs of the schema the staleness rule lets through as reads
//! (`policy::is_read_rpc`), method by method. The rule matches by prefix;
//! this table ties it to the schema, so an RPC added to the protos is
//! classified by a person before the sidecar serves it, never by accident
//! of its name.

use super::schema::RPCS;
use crate::policy::is_read_rpc;

/// Every method of the schema, and whether it only reads.
const CLASSIFIED: &[(&str, bool)] = &[
    ("BidiReadObject", true),
    ("BidiWriteObject", false),
    ("CancelResumableWrite", false),
    ("ComposeObject", false),
    ("CreateAnywhereCache", false),
    ("CreateBucket", false),
    ("CreateFolder", false),
    ("CreateManagedFolder", false),
    ("DeleteBucket", false),
    ("DeleteFolder", false),
    ("DeleteManagedFolder", false),
    ("DeleteObject", false),
    ("DisableAnywhereCache", false),
    ("GetAnywhereCache", true),
    ("GetBucket", true),
    ("GetFolder", true),
    ("GetFolderIntelligenceConfig", true),
    ("GetIamPolicy", true),
    ("GetManagedFolder", true),
    ("GetObject", true),
    ("GetOrganizationIntelligenceConfig", true),
    ("GetProjectIntelligenceConfig", true),
    ("GetStorageLayout", true),
    ("ListAnywhereCaches", true),
    ("ListBuckets", true),
    ("ListFolders", true),
    ("ListManagedFolders", true),
    ("ListObjects", true),
    ("LockBucketRetentionPolicy", false),
    ("MoveObject", false),
    ("PauseAnywhereCache", false),
    ("QueryWriteStatus", true),
    ("ReadObject", true),
    ("RenameFolder", false),
    ("RestoreObject", false),
    ("ResumeAnywhereCache", false),
    ("RewriteObject", false),
    ("SetIamPolicy", false),
    ("StartResumableWrite", false),
    ("TestIamPermissions", true),
    ("UpdateAnywhereCache", false),
    ("UpdateBucket", false),
    ("UpdateFolderIntelligenceConfig", false),
    ("UpdateObject", false),
    ("UpdateOrganizationIntelligenceConfig", false),
    ("UpdateProjectIntelligenceConfig", false),
    ("WriteObject", false),
];

#[test]
fn every_rpc_of_the_schema_is_classified_and_the_rule_agrees() {
    for rpc in RPCS {
        let method = rpc.path.rsplit('/').next().unwrap_or_default();
        let Some(&(_, reads)) = CLASSIFIED.iter().find(|(m, _)| *m == method) else {
            panic!(
                "{} is not classified: add it to CLASSIFIED as a read or a write",
                rpc.path
            );
        };
        assert_eq!(is_read_rpc(rpc.path), reads, "{}", rpc.path);
    }
    for (method, _) in CLASSIFIED {
        assert!(
            RPCS.iter().any(|r| r.path.ends_with(&format!("/{method}"))),
            "{method} is no longer in the schema"
        );
    }
}

#[test]
fn a_method_outside_the_schema_is_a_write_unless_named_as_a_read() {
    assert!(!is_read_rpc("/google.storage.v2.Storage/FrobnicateObject"));
    assert!(!is_read_rpc("/google.storage.v2.Storage/"));
    assert!(!is_read_rpc(""));
}
