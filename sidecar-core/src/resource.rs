//! The JSON resource a metadata body holds: what the router expects of a
//! body (from the discovery document's request and response types) and
//! what the JSON rewriter translates by.

/// The JSON resource a metadata body holds, used when the body has no `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `storage#bucket`.
    Bucket,
    /// `storage#buckets`: a bucket list, whose unmapped buckets may be hidden.
    Buckets,
    /// `storage#object`.
    Object,
    /// `storage#objects`: an object list.
    Objects,
    /// A bucket or object access control entry.
    Acl,
    /// A list of access control entries.
    Acls,
    /// An IAM policy (`resourceId` names the bucket).
    Policy,
    /// A Pub/Sub notification configuration, or a list of them.
    Notification,
    /// The answer of `objects.rewrite` (its `resource` is an object).
    RewriteResponse,
    /// The body of `objects.compose` (its `destination` is an object).
    ComposeRequest,
    /// A long-running operation (`name` holds the bucket's resource name).
    Operation,
    /// Unknown: every member that may name a bucket is translated.
    Generic,
}
