//! The JSON API's operations, from Google's discovery document for storage v1
//! (vendored in `sidecar-core/discovery/`, see its README for the pinned version).
//!
//! `build.rs` turns the document into a `static` table of path templates at
//! compile time, so the sidecar neither embeds nor parses it at run time. A
//! `/storage/v1/...` request is forwarded only when its method and raw path
//! match one template of a method classified here as routed; every method of
//! the document must be classified ([`CLASSIFIED`]), so a method added
//! upstream is refused until someone decides how the sidecar handles it (and
//! the test `every_discovery_method_is_classified` says so).

use std::borrow::Cow;
use std::sync::LazyLock;

use http::Method;

use crate::resource::Resource;

/// The vendored discovery document (the tests check the generated table
/// against it).
#[cfg(test)]
pub const DOCUMENT: &str = include_str!("../discovery/storage.v1.json");

/// How the sidecar treats one method of the document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Forwarded: bucket path parameters and body fields are translated.
    Routed,
    /// Answered with a 400 that gives the reason.
    Refused(&'static str),
}

const HMAC: Class = Class::Refused(
    "HMAC keys are project credentials, not bucket operations, and HMAC-signed requests cannot \
     pass the sidecar anyway: manage HMAC keys against GCS directly",
);

/// Every method of the document, by id. Keep sorted by id.
pub const CLASSIFIED: &[(&str, Class)] = &[
    ("storage.anywhereCaches.disable", Class::Routed),
    ("storage.anywhereCaches.get", Class::Routed),
    ("storage.anywhereCaches.insert", Class::Routed),
    ("storage.anywhereCaches.list", Class::Routed),
    ("storage.anywhereCaches.pause", Class::Routed),
    ("storage.anywhereCaches.resume", Class::Routed),
    ("storage.anywhereCaches.update", Class::Routed),
    ("storage.bucketAccessControls.delete", Class::Routed),
    ("storage.bucketAccessControls.get", Class::Routed),
    ("storage.bucketAccessControls.insert", Class::Routed),
    ("storage.bucketAccessControls.list", Class::Routed),
    ("storage.bucketAccessControls.patch", Class::Routed),
    ("storage.bucketAccessControls.update", Class::Routed),
    ("storage.buckets.delete", Class::Routed),
    ("storage.buckets.get", Class::Routed),
    ("storage.buckets.getIamPolicy", Class::Routed),
    ("storage.buckets.getStorageLayout", Class::Routed),
    ("storage.buckets.insert", Class::Routed),
    ("storage.buckets.list", Class::Routed),
    ("storage.buckets.lockRetentionPolicy", Class::Routed),
    (
        "storage.buckets.operations.advanceRelocateBucket",
        Class::Routed,
    ),
    ("storage.buckets.operations.cancel", Class::Routed),
    ("storage.buckets.operations.get", Class::Routed),
    ("storage.buckets.operations.list", Class::Routed),
    ("storage.buckets.patch", Class::Routed),
    ("storage.buckets.relocate", Class::Routed),
    ("storage.buckets.restore", Class::Routed),
    ("storage.buckets.setIamPolicy", Class::Routed),
    ("storage.buckets.testIamPermissions", Class::Routed),
    ("storage.buckets.update", Class::Routed),
    ("storage.defaultObjectAccessControls.delete", Class::Routed),
    ("storage.defaultObjectAccessControls.get", Class::Routed),
    ("storage.defaultObjectAccessControls.insert", Class::Routed),
    ("storage.defaultObjectAccessControls.list", Class::Routed),
    ("storage.defaultObjectAccessControls.patch", Class::Routed),
    ("storage.defaultObjectAccessControls.update", Class::Routed),
    ("storage.folders.delete", Class::Routed),
    ("storage.folders.deleteRecursive", Class::Routed),
    ("storage.folders.get", Class::Routed),
    ("storage.folders.insert", Class::Routed),
    ("storage.folders.list", Class::Routed),
    ("storage.folders.rename", Class::Routed),
    ("storage.managedFolders.delete", Class::Routed),
    ("storage.managedFolders.get", Class::Routed),
    ("storage.managedFolders.getIamPolicy", Class::Routed),
    ("storage.managedFolders.insert", Class::Routed),
    ("storage.managedFolders.list", Class::Routed),
    ("storage.managedFolders.setIamPolicy", Class::Routed),
    ("storage.managedFolders.testIamPermissions", Class::Routed),
    ("storage.managedFolders.update", Class::Routed),
    ("storage.notifications.delete", Class::Routed),
    ("storage.notifications.get", Class::Routed),
    ("storage.notifications.insert", Class::Routed),
    ("storage.notifications.list", Class::Routed),
    ("storage.objectAccessControls.delete", Class::Routed),
    ("storage.objectAccessControls.get", Class::Routed),
    ("storage.objectAccessControls.insert", Class::Routed),
    ("storage.objectAccessControls.list", Class::Routed),
    ("storage.objectAccessControls.patch", Class::Routed),
    ("storage.objectAccessControls.update", Class::Routed),
    ("storage.objects.bulkRestore", Class::Routed),
    ("storage.objects.compose", Class::Routed),
    ("storage.objects.copy", Class::Routed),
    ("storage.objects.delete", Class::Routed),
    ("storage.objects.get", Class::Routed),
    ("storage.objects.getIamPolicy", Class::Routed),
    ("storage.objects.insert", Class::Routed),
    ("storage.objects.list", Class::Routed),
    ("storage.objects.move", Class::Routed),
    ("storage.objects.patch", Class::Routed),
    ("storage.objects.restore", Class::Routed),
    ("storage.objects.rewrite", Class::Routed),
    ("storage.objects.setIamPolicy", Class::Routed),
    ("storage.objects.testIamPermissions", Class::Routed),
    ("storage.objects.update", Class::Routed),
    ("storage.objects.viewFullContext", Class::Routed),
    ("storage.projects.hmacKeys.create", HMAC),
    ("storage.projects.hmacKeys.delete", HMAC),
    ("storage.projects.hmacKeys.get", HMAC),
    ("storage.projects.hmacKeys.list", HMAC),
    ("storage.projects.hmacKeys.update", HMAC),
    ("storage.projects.serviceAccount.get", Class::Routed),
    ("storage.rapidCaches.disable", Class::Routed),
    ("storage.rapidCaches.get", Class::Routed),
    ("storage.rapidCaches.insert", Class::Routed),
    ("storage.rapidCaches.list", Class::Routed),
    ("storage.rapidCaches.update", Class::Routed),
];

/// The classification of method `id`, `None` when it is not classified.
pub fn class_of(id: &str) -> Option<Class> {
    CLASSIFIED
        .binary_search_by(|(known, _)| known.cmp(&id))
        .ok()
        .map(|i| CLASSIFIED[i].1)
}

/// The reason given for a method of the document that [`CLASSIFIED`] does not
/// list yet.
const UNCLASSIFIED: Class = Class::Refused(
    "this operation is new in the discovery document and not yet classified by \
     bucketmap-sidecar",
);

/// The classification of method `id`, [`UNCLASSIFIED`] when it has none; a
/// `const fn` so the generated table is classified at compile time.
const fn class_or_unclassified(id: &str) -> Class {
    let mut i = 0;
    while i < CLASSIFIED.len() {
        if same_bytes(CLASSIFIED[i].0, id) {
            return CLASSIFIED[i].1;
        }
        i += 1;
    }
    UNCLASSIFIED
}

/// `a == b`, in a `const fn`.
const fn same_bytes(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// One segment of a path template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Matched byte for byte against the raw segment.
    Literal(&'static str),
    /// A bucket name.
    Bucket,
    /// Any other parameter (object name, entity, id): one non-empty raw segment.
    Param,
}

/// One method of the document.
#[derive(Clone, Debug)]
pub struct Operation {
    /// The method id without `storage.` (`objects.get`), for metrics and logs.
    pub name: Cow<'static, str>,
    /// The HTTP method (`httpMethod`).
    pub method: Method,
    /// The template after `/storage/v1/`.
    pub segments: &'static [Segment],
    /// The request body's schema, when the method takes one.
    pub request: Option<Cow<'static, str>>,
    /// The `kind` of the request schema, when it has one (`storage#object`).
    pub request_kind: Option<Cow<'static, str>>,
    /// The response body's schema, when the method returns one.
    pub response: Option<Cow<'static, str>>,
    /// `alt=media` is allowed (object data).
    pub media_download: bool,
    /// Whether the sidecar forwards it (translated) or refuses it.
    pub class: Class,
}

impl Operation {
    /// A concrete request path for this method's template: `bucket` for the
    /// bucket segments, `x` for the other parameters (tests and tools).
    pub fn example_path(&self, bucket: &str) -> String {
        let parts: Vec<&str> = self
            .segments
            .iter()
            .map(|s| match s {
                Segment::Literal(lit) => *lit,
                Segment::Bucket => bucket,
                Segment::Param => "x",
            })
            .collect();
        format!("/storage/v1/{}", parts.join("/"))
    }

    /// The resource its request body holds, when it takes one.
    pub fn request_resource(&self) -> Option<Resource> {
        self.request.as_deref().map(schema_resource)
    }

    /// The resource its response body holds.
    pub fn response_resource(&self) -> Resource {
        self.response
            .as_deref()
            .map_or(Resource::Generic, schema_resource)
    }

    /// Whether `segs` (raw path segments after `/storage/v1/`) fit the template.
    pub fn matches(&self, segs: &[&str]) -> bool {
        segs.len() == self.segments.len()
            && self.segments.iter().zip(segs).all(|(t, s)| match t {
                Segment::Literal(lit) => lit == s,
                Segment::Bucket | Segment::Param => true,
            })
    }
}

/// The JSON resource a discovery schema holds, for the rewriter.
pub fn schema_resource(schema: &str) -> Resource {
    match schema {
        "Bucket" => Resource::Bucket,
        "Buckets" => Resource::Buckets,
        "Object" => Resource::Object,
        "Objects" => Resource::Objects,
        "BucketAccessControl" | "ObjectAccessControl" => Resource::Acl,
        "BucketAccessControls" | "ObjectAccessControls" => Resource::Acls,
        "Policy" => Resource::Policy,
        "Notification" | "Notifications" => Resource::Notification,
        "RewriteResponse" => Resource::RewriteResponse,
        "ComposeRequest" => Resource::ComposeRequest,
        "GoogleLongrunningOperation" => Resource::Operation,
        _ => Resource::Generic,
    }
}

/// Every method of the document, most literal segments first (so a template
/// such as `b/{bucket}/o/bulkRestore` wins over `b/{bucket}/o/{object}`).
pub struct Table {
    /// Sorted: most literal segments first.
    pub operations: [Operation; OPERATION_COUNT],
    /// The operations grouped by method and segment count, built on first use.
    index: LazyLock<Index, fn() -> Index>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("operations", &self.operations.len())
            .finish_non_exhaustive()
    }
}

impl Table {
    /// The operation (routed or refused on purpose) for `method` and the raw
    /// segments after `/storage/v1/`; `None` when nothing matches. Only the
    /// templates of the method with as many segments are compared, in table
    /// order.
    pub fn find(&self, method: &Method, segs: &[&str]) -> Option<&'static Operation> {
        self.index
            .group(method, segs.len())
            .iter()
            .copied()
            .find(|op| op.matches(segs))
    }
}

/// The table's operations by method and segment count, each group in table
/// order: `groups[method][segment count]`.
struct Index {
    methods: Vec<Method>,
    groups: Vec<Vec<Vec<&'static Operation>>>,
}

impl Index {
    fn of_table() -> Index {
        let mut index = Index {
            methods: Vec::new(),
            groups: Vec::new(),
        };
        for op in &TABLE.operations {
            let m = match index.methods.iter().position(|m| *m == op.method) {
                Some(m) => m,
                None => {
                    index.methods.push(op.method.clone());
                    index.groups.push(Vec::new());
                    index.methods.len() - 1
                }
            };
            let group = &mut index.groups[m];
            if group.len() <= op.segments.len() {
                group.resize(op.segments.len() + 1, Vec::new());
            }
            group[op.segments.len()].push(op);
        }
        index
    }

    fn group(&self, method: &Method, len: usize) -> &[&'static Operation] {
        self.methods
            .iter()
            .position(|m| m == method)
            .and_then(|m| self.groups[m].get(len))
            .map_or(&[], Vec::as_slice)
    }
}

// `OPERATION_COUNT` and `const OPERATIONS: [Operation; OPERATION_COUNT]`,
// written by build.rs.
include!(concat!(env!("OUT_DIR"), "/discovery_table.rs"));

static TABLE: Table = Table {
    operations: OPERATIONS,
    index: LazyLock::new(Index::of_table),
};

/// The table built from the vendored document at compile time.
pub fn table() -> &'static Table {
    &TABLE
}

/// Checks the table at start-up: it lists operations (the build already
/// fails on a document it cannot turn into a table).
pub fn check() -> anyhow::Result<()> {
    let table = table();
    anyhow::ensure!(
        !table.operations.is_empty(),
        "the discovery table lists no operation"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The methods of the document, walked here independently of build.rs.
    fn document_methods() -> Vec<Value> {
        fn walk(resources: &Value, out: &mut Vec<Value>) {
            for resource in resources.as_object().into_iter().flat_map(|m| m.values()) {
                let methods = resource["methods"].as_object().into_iter();
                out.extend(methods.flat_map(|m| m.values().cloned()));
                walk(&resource["resources"], out);
            }
        }
        let doc: Value = serde_json::from_str(DOCUMENT).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        walk(&doc["resources"], &mut out);
        out
    }

    fn document_ids() -> Vec<String> {
        document_methods()
            .iter()
            .map(|m| m["id"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The document's path template as the table spells it.
    fn template_of(path: &str) -> Vec<Segment> {
        path.split('/')
            .map(
                |seg| match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some("bucket" | "sourceBucket" | "destinationBucket") => Segment::Bucket,
                    Some(_) => Segment::Param,
                    None => Segment::Literal(seg.to_owned().leak()),
                },
            )
            .collect()
    }

    #[test]
    fn classification_is_sorted_for_lookup() {
        for pair in CLASSIFIED.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{} before {}", pair[0].0, pair[1].0);
        }
    }

    #[test]
    fn every_discovery_method_is_classified() {
        let ids = document_ids();
        assert!(ids.len() > 80, "the document lists {} methods", ids.len());
        let unclassified: Vec<&String> = ids.iter().filter(|id| class_of(id).is_none()).collect();
        assert!(
            unclassified.is_empty(),
            "methods of the discovery document not classified in discovery::CLASSIFIED \
             (route them or refuse them with a reason): {unclassified:?}"
        );
        let stale: Vec<&str> = CLASSIFIED
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| !ids.iter().any(|known| known == id))
            .collect();
        assert!(
            stale.is_empty(),
            "classified but gone from the document: {stale:?}"
        );
        for op in &table().operations {
            let id = format!("storage.{}", op.name);
            assert_eq!(Some(op.class), class_of(&id), "{id}: the table's class");
        }
    }

    /// The table build.rs generates holds every method of the document, as
    /// the document describes it, most literal segments first.
    #[test]
    fn the_generated_table_is_the_document() {
        let table = table();
        let methods = document_methods();
        assert_eq!(
            table.operations.len(),
            methods.len(),
            "one entry per method"
        );
        for m in &methods {
            let id = m["id"].as_str().unwrap_or_default();
            let name = id.strip_prefix("storage.").unwrap_or(id);
            let op = table.operations.iter().find(|op| op.name == name);
            let op = op.unwrap_or_else(|| panic!("{id} is missing from the table"));
            assert_eq!(op.method.as_str(), m["httpMethod"], "{id}");
            let path = m["path"].as_str().unwrap_or_default();
            assert_eq!(op.segments, template_of(path), "{id}");
            assert_eq!(op.request.as_deref(), m["request"]["$ref"].as_str(), "{id}");
            assert_eq!(
                op.response.as_deref(),
                m["response"]["$ref"].as_str(),
                "{id}"
            );
            let media = m["supportsMediaDownload"].as_bool().unwrap_or(false);
            assert_eq!(op.media_download, media, "{id}");
        }
        let literals = |op: &Operation| {
            let is_literal = |s: &&Segment| matches!(s, Segment::Literal(_));
            op.segments.iter().filter(is_literal).count()
        };
        for pair in table.operations.windows(2) {
            assert!(literals(&pair[0]) >= literals(&pair[1]), "{}", pair[1].name);
        }
        let insert = table.find(&Method::POST, &["b", "x", "o"]);
        assert_eq!(
            insert.and_then(|op| op.request_kind.as_deref()),
            Some("storage#object")
        );
    }

    #[test]
    fn the_table_parses_and_templates_are_unambiguous() {
        let table = table();
        for (i, a) in table.operations.iter().enumerate() {
            for b in &table.operations[i + 1..] {
                let same_shape = a.method == b.method
                    && a.segments.len() == b.segments.len()
                    && a.segments.iter().zip(b.segments).all(|(x, y)| x == y);
                assert!(
                    !same_shape,
                    "{} and {} have the same template",
                    a.name, b.name
                );
            }
        }
    }

    /// Paths (`logging.logBucket`, `acl[].bucket`) of the string fields that
    /// name a bucket in `schema`, following `$ref`s, by the schema's own
    /// descriptions.
    fn bucket_fields(
        schemas: &serde_json::Value,
        schema: &str,
        prefix: &[String],
        depth: usize,
        out: &mut Vec<Vec<String>>,
    ) {
        if depth > 4 {
            return;
        }
        let props = &schemas[schema]["properties"];
        let Some(props) = props.as_object() else {
            return;
        };
        walk_properties(schemas, props, prefix, depth, out);
    }

    fn walk_properties(
        schemas: &serde_json::Value,
        props: &serde_json::Map<String, serde_json::Value>,
        prefix: &[String],
        depth: usize,
        out: &mut Vec<Vec<String>>,
    ) {
        for (name, prop) in props {
            let mut path = prefix.to_vec();
            path.push(name.clone());
            let description = prop["description"].as_str().unwrap_or_default();
            let names_bucket = description.starts_with("The name of the bucket")
                || description.starts_with("The destination bucket")
                || description.contains("projects/_/buckets/bucket");
            if prop["type"] == "string" && names_bucket {
                out.push(path.clone());
            }
            let (inner, array) = match prop["type"].as_str() {
                Some("array") => (&prop["items"], true),
                _ => (prop, false),
            };
            if array {
                path.push("[]".to_owned());
            }
            if let Some(reference) = inner["$ref"].as_str() {
                bucket_fields(schemas, reference, &path, depth + 1, out);
            } else if let Some(nested) = inner["properties"].as_object() {
                walk_properties(schemas, nested, &path, depth + 1, out);
            }
        }
    }

    /// A body with `value` at `path`.
    fn body_at(path: &[String], value: serde_json::Value) -> serde_json::Value {
        path.iter().rev().fold(value, |inner, key| {
            if key == "[]" {
                serde_json::Value::Array(vec![inner])
            } else {
                serde_json::json!({ key.as_str(): inner })
            }
        })
    }

    /// Which request fields name buckets comes from the discovery schemas:
    /// for every request schema of a routed method, each field its
    /// description says names a bucket is translated, and refused when it
    /// names a bucket the map does not hold.
    #[test]
    fn bucket_fields_of_request_schemas_are_translated() {
        use crate::rewrite::Direction;
        use crate::rewrite::json::rewrite_json_bytes;
        use crate::rewrite::testing::{mapping, translator, upstream_base};
        let doc: Value = serde_json::from_str(DOCUMENT).unwrap_or_default();
        let schemas = &doc["schemas"];
        let m = mapping();
        let links = upstream_base();
        let tr = translator(&m, &links, Direction::ToPhysical);
        let table = table();
        let mut checked = 0;
        for op in table
            .operations
            .iter()
            .filter(|op| op.class == Class::Routed)
        {
            let Some(schema) = op.request.as_deref() else {
                continue;
            };
            let mut fields = Vec::new();
            bucket_fields(schemas, schema, &[], 0, &mut fields);
            for path in fields {
                let resource_id = path.last().is_some_and(|k| k == "resourceId");
                let value = |b: &str| {
                    if resource_id {
                        format!("projects/_/buckets/{b}")
                    } else {
                        b.to_owned()
                    }
                };
                let body = body_at(&path, value("other").into()).to_string();
                let refused = rewrite_json_bytes(
                    body.as_bytes(),
                    op.request_resource().unwrap_or(Resource::Generic),
                    &tr,
                );
                assert_eq!(
                    refused.map_err(|e| e.status.as_u16()).map(|_| ()),
                    Err(404),
                    "{} {schema}.{}: an unmapped bucket is refused",
                    op.name,
                    path.join(".")
                );
                let body = body_at(&path, value("photos").into()).to_string();
                let hint = op.request_resource().unwrap_or(Resource::Generic);
                let new = rewrite_json_bytes(body.as_bytes(), hint, &tr)
                    .unwrap_or_else(|e| panic!("{}: {e}", op.name))
                    .unwrap_or_default();
                let new = String::from_utf8_lossy(&new);
                assert!(
                    new.contains(&value("photos-k3x9q2mw")),
                    "{} {schema}.{}: translated, got {new}",
                    op.name,
                    path.join(".")
                );
                checked += 1;
            }
        }
        assert!(checked >= 20, "{checked} bucket fields checked");
    }
}
