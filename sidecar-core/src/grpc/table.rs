//! The shape of the generated bucket-name table ([`super::schema`]): which
//! fields of which `google.storage.v2` / `google.storage.control.v2`
//! messages hold bucket names, and which RPCs exist.
//!
//! The table is derived from the vendored protobuf definitions
//! (`sidecar/proto/`) by `sidecar/tests/integration/grpc_schema.rs`, which also fails
//! when the checked-in table no longer matches them.

/// What a field holds, as far as bucket names go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A bucket's resource name, `projects/{project}/buckets/{bucket}`
    /// (`google.api.resource_reference` to `storage.googleapis.com/Bucket`,
    /// or the name of the `Bucket` resource itself).
    BucketName,
    /// A resource under a bucket, `projects/{project}/buckets/{bucket}/...`,
    /// or the bucket itself (folders, managed folders, upload ids, IAM
    /// resources: resource references and `{bucket=projects/*/buckets/*}/**`
    /// routing annotations).
    BucketPrefixed,
    /// A bare bucket name (`bucket_id`).
    BucketId,
    /// A nested message (index into [`super::schema::MESSAGES`]) that holds
    /// bucket names somewhere.
    Message(usize),
    /// Repeated `Bucket` resources of a list response: in responses, the
    /// buckets the map does not hold are left out.
    BucketList(usize),
}

/// One field that matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// The field number.
    pub number: u32,
    /// The field name, for error messages.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
}

/// A message type with at least one field that matters; fields sorted by number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// Fully qualified name.
    pub name: &'static str,
    /// The fields that hold bucket names, directly or nested.
    pub fields: &'static [Field],
}

impl Message {
    /// The field with `number`, if it matters.
    pub fn field(&self, number: u32) -> Option<&'static Field> {
        self.fields
            .binary_search_by_key(&number, |f| f.number)
            .ok()
            .map(|i| &self.fields[i])
    }
}

/// One RPC of the services the sidecar proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rpc {
    /// The HTTP/2 path, `/package.Service/Method`.
    pub path: &'static str,
    /// Request message (index into [`super::schema::MESSAGES`]), `None`
    /// when the request type holds no bucket names.
    pub request: Option<usize>,
    /// Response message, likewise.
    pub response: Option<usize>,
    /// The client sends a stream of messages.
    pub client_streaming: bool,
    /// The server sends a stream of messages.
    pub server_streaming: bool,
}
