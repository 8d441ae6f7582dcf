//! The sidecar's gRPC bucket-name table (`sidecar-core/src/grpc/schema.rs`)
//! is what the vendored protobuf definitions (`sidecar/proto/`) give
//! (`bucketmap_testkit::grpc_schema` derives it). A stale table fails with
//! the command that writes it: `cargo dev grpc-schema` (after
//! `tools/grpc/fetch.sh`).

use bucketmap_testkit::grpc_schema::{SCHEMA_PATH, derive};

#[test]
fn the_checked_in_table_is_derived_from_the_vendored_protos() {
    let derived = derive();
    let path = bucketmap_testkit::repo_path(SCHEMA_PATH);
    let checked_in = std::fs::read_to_string(&path).expect("read schema.rs");
    assert!(
        checked_in == derived,
        "{SCHEMA_PATH} is stale: regenerate it with `cargo dev grpc-schema`"
    );
}

#[test]
fn the_derivation_finds_the_fields_gcs_documents() {
    let derived = derive();
    // Spot checks against the API reference, so a broken derivation that
    // finds nothing cannot pass by regenerating.
    for needle in [
        "name: \"google.storage.v2.Object\"",
        "name: \"google.storage.v2.ReadObjectRequest\"",
        "name: \"google.storage.v2.RewriteObjectRequest\"",
        "name: \"destination_bucket\"",
        "name: \"source_bucket\"",
        "name: \"upload_id\"",
        "name: \"google.iam.v1.GetIamPolicyRequest\"",
        "name: \"google.storage.control.v2.Folder\"",
        "Kind::BucketList(",
        "(\"bucket\", true)",
        "(\"project\", false)",
        "path: \"/google.storage.v2.Storage/BidiWriteObject\"",
    ] {
        assert!(derived.contains(needle), "the derived table lacks {needle}");
    }
    assert!(
        !derived.contains("name: \"google.storage.v2.ListBucketsRequest\""),
        "ListBucketsRequest.parent is a project (child_type Bucket), not a bucket"
    );
}
