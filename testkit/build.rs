//! Generates the server half of `google.storage.v2.Storage` for the in-repo
//! mock GCS (`src/mock_gcs/`). The message types come from the
//! `googleapis-tonic-google-storage-v2` crate, which ships client code only.

use tonic_build::manual::{Builder, Method, Service};

/// The unary `google.storage.v2.Storage` methods the mock serves, as
/// (Rust method name, gRPC method name, request type, response type).
const METHODS: &[(&str, &str, &str, &str)] = &[
    (
        "create_bucket",
        "CreateBucket",
        "CreateBucketRequest",
        "Bucket",
    ),
    ("get_bucket", "GetBucket", "GetBucketRequest", "Bucket"),
    (
        "update_bucket",
        "UpdateBucket",
        "UpdateBucketRequest",
        "Bucket",
    ),
    (
        "delete_bucket",
        "DeleteBucket",
        "DeleteBucketRequest",
        "Empty",
    ),
    (
        "list_buckets",
        "ListBuckets",
        "ListBucketsRequest",
        "ListBucketsResponse",
    ),
    (
        "list_objects",
        "ListObjects",
        "ListObjectsRequest",
        "ListObjectsResponse",
    ),
    (
        "delete_object",
        "DeleteObject",
        "DeleteObjectRequest",
        "Empty",
    ),
    ("get_object", "GetObject", "GetObjectRequest", "Object"),
    (
        "lock_bucket_retention_policy",
        "LockBucketRetentionPolicy",
        "LockBucketRetentionPolicyRequest",
        "Bucket",
    ),
];

/// The object data methods, as (Rust method name, gRPC method name, request
/// type, response type, client streaming, server streaming).
const OBJECT_DATA_METHODS: &[(&str, &str, &str, &str, bool, bool)] = &[
    (
        "write_object",
        "WriteObject",
        "WriteObjectRequest",
        "WriteObjectResponse",
        true,
        false,
    ),
    (
        "bidi_write_object",
        "BidiWriteObject",
        "BidiWriteObjectRequest",
        "BidiWriteObjectResponse",
        true,
        true,
    ),
    (
        "start_resumable_write",
        "StartResumableWrite",
        "StartResumableWriteRequest",
        "StartResumableWriteResponse",
        false,
        false,
    ),
    (
        "query_write_status",
        "QueryWriteStatus",
        "QueryWriteStatusRequest",
        "QueryWriteStatusResponse",
        false,
        false,
    ),
    (
        "read_object",
        "ReadObject",
        "ReadObjectRequest",
        "ReadObjectResponse",
        false,
        true,
    ),
    (
        "bidi_read_object",
        "BidiReadObject",
        "BidiReadObjectRequest",
        "BidiReadObjectResponse",
        true,
        true,
    ),
    (
        "compose_object",
        "ComposeObject",
        "ComposeObjectRequest",
        "Object",
        false,
        false,
    ),
    (
        "rewrite_object",
        "RewriteObject",
        "RewriteObjectRequest",
        "RewriteResponse",
        false,
        false,
    ),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let service = METHODS.iter().fold(
        Service::builder()
            .name("Storage")
            .package("google.storage.v2")
            .comment("Server side of the Cloud Storage gRPC API, limited to what the mock serves."),
        |service, (name, route, input, output)| {
            service.method(
                Method::builder()
                    .name(*name)
                    .route_name(*route)
                    .input_type(format!("crate::mock_gcs::proto::{input}"))
                    .output_type(if *output == "Empty" {
                        "crate::mock_gcs::service::Empty".to_string()
                    } else {
                        format!("crate::mock_gcs::proto::{output}")
                    })
                    .codec_path("tonic_prost::ProstCodec")
                    .build(),
            )
        },
    );
    let service = OBJECT_DATA_METHODS.iter().fold(
        service,
        |service, (name, route, input, output, client_streaming, server_streaming)| {
            let mut method = Method::builder()
                .name(*name)
                .route_name(*route)
                .input_type(format!("crate::mock_gcs::proto::{input}"))
                .output_type(format!("crate::mock_gcs::proto::{output}"))
                .codec_path("tonic_prost::ProstCodec");
            if *client_streaming {
                method = method.client_streaming();
            }
            if *server_streaming {
                method = method.server_streaming();
            }
            service.method(method.build())
        },
    );
    Builder::new()
        .build_client(false)
        .build_transport(false)
        .compile(&[service.build()]);
    compile_control_service();
}

/// The unary `google.storage.control.v2.StorageControl` methods the mock
/// serves (a bucket's IAM policy, the caller's permissions), as in [`METHODS`]; the message types are
/// `google.iam.v1`'s.
const CONTROL_METHODS: &[(&str, &str, &str, &str)] = &[
    (
        "get_iam_policy",
        "GetIamPolicy",
        "GetIamPolicyRequest",
        "Policy",
    ),
    (
        "set_iam_policy",
        "SetIamPolicy",
        "SetIamPolicyRequest",
        "Policy",
    ),
    (
        "test_iam_permissions",
        "TestIamPermissions",
        "TestIamPermissionsRequest",
        "TestIamPermissionsResponse",
    ),
];

/// Generates the server half of `google.storage.control.v2.StorageControl`
/// (included by `src/mock_gcs/iam.rs`).
fn compile_control_service() {
    let service = CONTROL_METHODS.iter().fold(
        Service::builder()
            .name("StorageControl")
            .package("google.storage.control.v2")
            .comment(
                "Server side of the Storage Control gRPC API, limited to what the mock serves.",
            ),
        |service, (name, route, input, output)| {
            service.method(
                Method::builder()
                    .name(*name)
                    .route_name(*route)
                    .input_type(format!("crate::mock_gcs::iam_proto::{input}"))
                    .output_type(format!("crate::mock_gcs::iam_proto::{output}"))
                    .codec_path("tonic_prost::ProstCodec")
                    .build(),
            )
        },
    );
    Builder::new()
        .build_client(false)
        .build_transport(false)
        .compile(&[service.build()]);
}
