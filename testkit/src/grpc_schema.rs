//! The sidecar's gRPC bucket-name table (`sidecar-core/src/grpc/schema.rs`),
//! derived from the vendored protobuf definitions (`sidecar/proto/`).
//! `cargo dev grpc-schema` writes it (after `tools/grpc/fetch.sh`);
//! `sidecar/tests/integration/grpc_schema.rs` fails while the checked-in copy is stale.
//!
//! Which fields hold bucket names is read from Google's annotations, not
//! from examples:
//! - `google.api.resource_reference` with `type` a bucket resource (or a
//!   resource under a bucket), or `child_type` a resource whose parent is a
//!   bucket;
//! - the name field of messages annotated `google.api.resource` with such a
//!   type (`Bucket.name`, `Folder.name`, ...);
//! - `google.api.routing` parameters that extract `{bucket=...}` (the IAM
//!   `resource`, the resumable `upload_id`), and same-named string fields of
//!   the same package;
//! - by hand, the two bare `bucket_id` fields (checked to exist here).

#![allow(
    clippy::too_many_lines,
    reason = "a generator reads best top to bottom"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use prost_reflect::{
    DescriptorPool, DynamicMessage, Kind as ProtoKind, MessageDescriptor, MethodDescriptor, Value,
};

const ROOTS: [&str; 2] = [
    "google/storage/v2/storage.proto",
    "google/storage/control/v2/storage_control.proto",
];
const SERVICES: [&str; 2] = [
    "google.storage.v2.Storage",
    "google.storage.control.v2.StorageControl",
];
const BUCKET_PATTERN: &str = "projects/{project}/buckets/{bucket}";
/// Bare bucket names: no annotation says so, the field comments do.
const BUCKET_IDS: [(&str, &str); 2] = [
    ("google.storage.v2.Bucket", "bucket_id"),
    ("google.storage.v2.CreateBucketRequest", "bucket_id"),
];

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Repr {
    Name,
    Prefixed,
    Id,
    Message(String),
    List(String),
}

fn pool() -> DescriptorPool {
    let dir = crate::repo_path("sidecar/proto");
    let mut compiler = protox::Compiler::new([dir]).expect("protox compiler");
    compiler.include_imports(true);
    compiler
        .open_files(ROOTS)
        .expect("the vendored protos compile");
    compiler.descriptor_pool()
}

fn string_field(message: &DynamicMessage, name: &str) -> String {
    match message.get_field_by_name(name).as_deref() {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

fn extension(pool: &DescriptorPool, options: &DynamicMessage, name: &str) -> Option<Value> {
    let ext = pool.get_extension_by_name(name).expect("extension known");
    options
        .has_extension(&ext)
        .then(|| options.get_extension(&ext).into_owned())
}

/// Resource type → pattern, from message and file annotations.
fn resource_patterns(pool: &DescriptorPool) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::<String, Vec<String>>::new();
    let mut add = |descriptor: &DynamicMessage| {
        let patterns = match descriptor.get_field_by_name("pattern").as_deref() {
            Some(Value::List(list)) => list
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        out.entry(string_field(descriptor, "type"))
            .or_default()
            .extend(patterns);
    };
    for message in pool.all_messages() {
        if let Some(Value::Message(r)) = extension(pool, &message.options(), "google.api.resource")
        {
            add(&r);
        }
    }
    for file in pool.files() {
        if let Some(Value::List(list)) =
            extension(pool, &file.options(), "google.api.resource_definition")
        {
            for r in list.iter().filter_map(Value::as_message) {
                add(r);
            }
        }
    }
    out
}

/// The kind of a name with `pattern`, if it is a bucket or lies under one.
fn pattern_kind(pattern: &str) -> Option<Repr> {
    if pattern == BUCKET_PATTERN {
        Some(Repr::Name)
    } else if pattern.starts_with(&format!("{BUCKET_PATTERN}/")) {
        Some(Repr::Prefixed)
    } else {
        None
    }
}

fn type_kind(patterns: &BTreeMap<String, Vec<String>>, ty: &str) -> Option<Repr> {
    patterns.get(ty)?.iter().find_map(|p| pattern_kind(p))
}

fn parent_kind(patterns: &BTreeMap<String, Vec<String>>, child: &str) -> Option<Repr> {
    patterns.get(child)?.iter().find_map(|p| {
        let segments: Vec<&str> = p.split('/').collect();
        (segments.len() >= 2)
            .then(|| segments[..segments.len() - 2].join("/"))
            .and_then(|parent| pattern_kind(&parent))
    })
}

/// The message types reachable from the services' RPCs.
fn reachable(pool: &DescriptorPool, methods: &[MethodDescriptor]) -> Vec<MessageDescriptor> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<MessageDescriptor> = methods
        .iter()
        .flat_map(|m| [m.input(), m.output()])
        .collect();
    let mut out = Vec::new();
    while let Some(message) = todo.pop() {
        if !seen.insert(message.full_name().to_owned()) {
            continue;
        }
        for field in message.fields() {
            if let ProtoKind::Message(nested) = field.kind() {
                todo.push(nested);
            }
        }
        out.push(message);
    }
    let _ = pool;
    out
}

type Kinds = BTreeMap<String, BTreeMap<u32, (String, Repr)>>;

fn direct_kinds(
    pool: &DescriptorPool,
    patterns: &BTreeMap<String, Vec<String>>,
    messages: &[MessageDescriptor],
) -> Kinds {
    let mut kinds = Kinds::new();
    for message in messages {
        let resource = extension(pool, &message.options(), "google.api.resource");
        let own = resource.as_ref().and_then(Value::as_message).map(|r| {
            let field = string_field(r, "name_field");
            let field = if field.is_empty() {
                "name".to_owned()
            } else {
                field
            };
            (field, type_kind(patterns, &string_field(r, "type")))
        });
        for field in message.fields() {
            if field.kind() != ProtoKind::String {
                continue;
            }
            let mut kind = None;
            if let Some(Value::Message(reference)) =
                extension(pool, &field.options(), "google.api.resource_reference")
            {
                kind = type_kind(patterns, &string_field(&reference, "type"))
                    .or_else(|| parent_kind(patterns, &string_field(&reference, "child_type")));
            }
            if let Some((name, own_kind @ Some(_))) = &own
                && name == field.name()
            {
                kind = own_kind.clone();
            }
            if BUCKET_IDS.contains(&(message.full_name(), field.name())) {
                kind = Some(Repr::Id);
            }
            if let Some(kind) = kind {
                kinds
                    .entry(message.full_name().to_owned())
                    .or_default()
                    .insert(field.number(), (field.name().to_owned(), kind));
            }
        }
    }
    for (message, field) in BUCKET_IDS {
        let found = kinds
            .get(message)
            .and_then(|f| f.values().find(|(n, _)| n == field));
        assert!(
            found.is_some(),
            "{message}.{field} is no longer a string field of the protos"
        );
    }
    kinds
}

/// Routing parameters that extract a bucket; returns the routing header keys.
fn routing_kinds(
    pool: &DescriptorPool,
    methods: &[MethodDescriptor],
    messages: &[MessageDescriptor],
    kinds: &mut Kinds,
) -> BTreeMap<String, bool> {
    let mut keys = BTreeMap::new();
    let mut routed_names = BTreeSet::new();
    for method in methods {
        let Some(Value::Message(rule)) = extension(pool, &method.options(), "google.api.routing")
        else {
            continue;
        };
        let Some(Value::List(params)) = rule
            .get_field_by_name("routing_parameters")
            .as_deref()
            .cloned()
        else {
            continue;
        };
        for param in params.iter().filter_map(Value::as_message) {
            let path = string_field(param, "field");
            let template = string_field(param, "path_template");
            let key = template
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('='))
                .map_or_else(|| path.clone(), |(key, _)| key.to_owned());
            let bucket = key == "bucket" || key.ends_with("_bucket");
            keys.insert(key, bucket);
            if !bucket {
                continue;
            }
            let (owner, field) = resolve(method.input(), &path);
            let entry = kinds.entry(owner.full_name().to_owned()).or_default();
            if entry.contains_key(&field.number()) {
                // Already a bucket name by its resource annotation.
                continue;
            }
            entry.insert(field.number(), (field.name().to_owned(), Repr::Prefixed));
            // Known by routing alone (`upload_id`, the IAM `resource`): the
            // same-named fields of the package hold the same kind of value.
            routed_names.insert((owner.package_name().to_owned(), field.name().to_owned()));
        }
    }
    for message in messages {
        for field in message.fields() {
            let same = routed_names
                .contains(&(message.package_name().to_owned(), field.name().to_owned()));
            if same && field.kind() == ProtoKind::String {
                kinds
                    .entry(message.full_name().to_owned())
                    .or_default()
                    .entry(field.number())
                    .or_insert_with(|| (field.name().to_owned(), Repr::Prefixed));
            }
        }
    }
    keys
}

fn resolve(
    mut message: MessageDescriptor,
    path: &str,
) -> (MessageDescriptor, prost_reflect::FieldDescriptor) {
    let mut parts = path.split('.').peekable();
    loop {
        let part = parts.next().expect("non-empty routing field path");
        let field = message
            .get_field_by_name(part)
            .unwrap_or_else(|| panic!("routing field {path} not in {}", message.full_name()));
        if parts.peek().is_none() {
            return (message, field);
        }
        let ProtoKind::Message(nested) = field.kind() else {
            panic!("routing field path {path} crosses a scalar");
        };
        message = nested;
    }
}

/// Marks message-typed fields whose type holds bucket names, to a fixpoint.
fn nested_kinds(messages: &[MessageDescriptor], kinds: &mut Kinds) {
    loop {
        let mut changed = false;
        for message in messages {
            for field in message.fields() {
                let ProtoKind::Message(nested) = field.kind() else {
                    continue;
                };
                if !kinds.contains_key(nested.full_name()) {
                    continue;
                }
                let list = field.is_list()
                    && nested.full_name() == "google.storage.v2.Bucket"
                    && message.name().ends_with("Response");
                let repr = if list {
                    Repr::List(nested.full_name().to_owned())
                } else {
                    Repr::Message(nested.full_name().to_owned())
                };
                let entry = kinds.entry(message.full_name().to_owned()).or_default();
                if let std::collections::btree_map::Entry::Vacant(slot) =
                    entry.entry(field.number())
                {
                    slot.insert((field.name().to_owned(), repr));
                    changed = true;
                }
            }
        }
        if !changed {
            return;
        }
    }
}

fn render(kinds: &Kinds, methods: &[MethodDescriptor], keys: &BTreeMap<String, bool>) -> String {
    let index: BTreeMap<&str, usize> = kinds
        .keys()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    let mut out = String::from(
        "//! @generated by `testkit/src/grpc_schema.rs` from `sidecar/proto/`; do not edit.\n\
         //! Regenerate: `cargo dev grpc-schema`.\n\n\
         use super::table::{Field, Kind, Message, Rpc};\n\n\
         /// Message types that hold bucket names, sorted by name.\n\
         pub const MESSAGES: &[Message] = &[\n",
    );
    for (i, (name, fields)) in kinds.iter().enumerate() {
        let _ = writeln!(
            out,
            "    // {i}\n    Message {{\n        name: \"{name}\",\n        fields: &["
        );
        for (number, (field, repr)) in fields {
            let kind = match repr {
                Repr::Name => "Kind::BucketName".to_owned(),
                Repr::Prefixed => "Kind::BucketPrefixed".to_owned(),
                Repr::Id => "Kind::BucketId".to_owned(),
                Repr::Message(m) => format!("Kind::Message({})", index[m.as_str()]),
                Repr::List(m) => format!("Kind::BucketList({})", index[m.as_str()]),
            };
            let _ = writeln!(
                out,
                "            Field {{\n                number: {number},\n                name: \"{field}\",\n                kind: {kind},\n            }},"
            );
        }
        out.push_str("        ],\n    },\n");
    }
    out.push_str("];\n\n/// Every RPC of the proxied services, sorted by path.\npub const RPCS: &[Rpc] = &[\n");
    let mut rpcs: Vec<_> = methods
        .iter()
        .map(|m| {
            (
                format!("/{}/{}", m.parent_service().full_name(), m.name()),
                m,
            )
        })
        .collect();
    rpcs.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, m) in rpcs {
        let idx = |d: MessageDescriptor| {
            index
                .get(d.full_name())
                .map_or_else(|| "None".to_owned(), |i| format!("Some({i})"))
        };
        let _ = writeln!(
            out,
            "    Rpc {{\n        path: \"{path}\",\n        request: {},\n        response: {},\n        client_streaming: {},\n        server_streaming: {},\n    }},",
            idx(m.input()),
            idx(m.output()),
            m.is_client_streaming(),
            m.is_server_streaming()
        );
    }
    out.push_str("];\n\n/// The keys of the `x-goog-request-params` routing header, and whether the\n/// value holds a bucket.\npub const ROUTING_KEYS: &[(&str, bool)] = &[\n");
    for (key, bucket) in keys {
        let _ = writeln!(out, "    (\"{key}\", {bucket}),");
    }
    out.push_str("];\n");
    out
}

/// Where the table is checked in.
pub const SCHEMA_PATH: &str = "sidecar-core/src/grpc/schema.rs";

/// The table as `sidecar-core/src/grpc/schema.rs` holds it, derived from the
/// vendored protos.
///
/// # Panics
///
/// When the vendored protos do not compile or lack the services.
pub fn derive() -> String {
    let pool = pool();
    let methods: Vec<MethodDescriptor> = SERVICES
        .iter()
        .flat_map(|s| {
            let service = pool.get_service_by_name(s).expect("service");
            service.methods().collect::<Vec<_>>()
        })
        .collect();
    let patterns = resource_patterns(&pool);
    let messages = reachable(&pool, &methods);
    let mut kinds = direct_kinds(&pool, &patterns, &messages);
    let keys = routing_kinds(&pool, &methods, &messages, &mut kinds);
    nested_kinds(&messages, &mut kinds);
    render(&kinds, &methods, &keys)
}
