//! Turns the vendored discovery document (`discovery/storage.v1.json`) into
//! Rust source: a `static` table of the JSON API's operations, included by
//! `src/discovery.rs`, so the sidecar neither embeds nor parses the document
//! at run time. The classification of each method stays in
//! `src/discovery.rs` (`CLASSIFIED`); its tests check it over this table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::Value;

const DOCUMENT: &str = "discovery/storage.v1.json";

/// Path parameters that name a bucket.
const BUCKET_PARAMS: [&str; 3] = ["bucket", "sourceBucket", "destinationBucket"];

/// One method of the document, as the generated source spells it.
struct Method {
    id: String,
    http_method: &'static str,
    segments: Vec<String>,
    literals: usize,
    request: Option<String>,
    request_kind: Option<String>,
    response: Option<String>,
    media_download: bool,
}

fn main() {
    println!("cargo::rerun-if-changed={DOCUMENT}");
    println!("cargo::rerun-if-changed=build.rs");
    if let Err(e) = generate() {
        // A build script reports by failing: the message is the whole story.
        eprintln!("error: cannot build the discovery table from {DOCUMENT}: {e}");
        std::process::exit(1);
    }
}

fn generate() -> Result<(), String> {
    let text = std::fs::read_to_string(DOCUMENT).map_err(|e| format!("cannot read it: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    let mut methods = Vec::with_capacity(128);
    collect(&doc, &doc["resources"], &mut methods)?;
    if methods.is_empty() {
        return Err("it lists no method".into());
    }
    // Most literal segments first (so `b/{bucket}/o/bulkRestore` wins over
    // `b/{bucket}/o/{object}`); stable, so ties keep the document's order.
    methods.sort_by_key(|m| std::cmp::Reverse(m.literals));
    let out_dir = std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?;
    let out = PathBuf::from(out_dir).join("discovery_table.rs");
    std::fs::write(&out, render(&methods))
        .map_err(|e| format!("cannot write {}: {e}", out.display()))
}

/// Object members sorted by key, whatever map serde_json was built with.
fn members(value: &Value) -> BTreeMap<&str, &Value> {
    value.as_object().map_or_else(BTreeMap::new, |map| {
        map.iter().map(|(k, v)| (k.as_str(), v)).collect()
    })
}

/// The methods of `resources` and of their nested resources, depth first.
fn collect(doc: &Value, resources: &Value, out: &mut Vec<Method>) -> Result<(), String> {
    for resource in members(resources).into_values() {
        for method in members(&resource["methods"]).into_values() {
            out.push(method_of(doc, method)?);
        }
        collect(doc, &resource["resources"], out)?;
    }
    Ok(())
}

fn method_of(doc: &Value, method: &Value) -> Result<Method, String> {
    let id = method["id"].as_str().ok_or("a method without an id")?;
    let http_method = http_method(id, method["httpMethod"].as_str().unwrap_or_default())?;
    let path = method["path"]
        .as_str()
        .ok_or_else(|| format!("{id}: no path"))?;
    let segments = path
        .split('/')
        .map(|seg| template_segment(id, seg))
        .collect::<Result<Vec<_>, _>>()?;
    let schema = |key: &str| method[key]["$ref"].as_str().map(str::to_owned);
    let request = schema("request");
    let request_kind = request.as_deref().and_then(|s| {
        let kind = &doc["schemas"][s]["properties"]["kind"]["default"];
        kind.as_str().map(str::to_owned)
    });
    Ok(Method {
        id: id.to_owned(),
        http_method,
        literals: path.split('/').filter(|s| !s.starts_with('{')).count(),
        segments,
        request,
        request_kind,
        response: schema("response"),
        media_download: method["supportsMediaDownload"].as_bool().unwrap_or(false),
    })
}

/// The `http::Method` constant for the document's `httpMethod`.
fn http_method(id: &str, name: &str) -> Result<&'static str, String> {
    Ok(match name {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        _ => return Err(format!("{id}: unsupported HTTP method {name:?}")),
    })
}

/// The `Segment` expression for one segment of a path template.
fn template_segment(id: &str, seg: &str) -> Result<String, String> {
    match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
        // Reserved expansion (`{+name}`) would span segments: not supported.
        Some(name) if name.starts_with('+') || name.is_empty() => {
            Err(format!("{id}: unsupported path parameter {seg:?}"))
        }
        Some(name) if BUCKET_PARAMS.contains(&name) => Ok("Bucket".into()),
        Some(_) => Ok("Param".into()),
        None if seg.is_empty() || seg.contains(['{', '}']) => {
            Err(format!("{id}: malformed path segment {seg:?}"))
        }
        None => Ok(format!("Literal({seg:?})")),
    }
}

fn render(methods: &[Method]) -> String {
    let mut src = format!(
        "// Generated by build.rs from {DOCUMENT}: do not edit.\n\
         /// How many methods the discovery document lists.\n\
         pub const OPERATION_COUNT: usize = {};\n\
         const OPERATIONS: [Operation; OPERATION_COUNT] = [\n",
        methods.len()
    );
    for m in methods {
        let segments: Vec<String> = m.segments.iter().map(|s| format!("Segment::{s}")).collect();
        // Writing to a String cannot fail.
        let name = m.id.strip_prefix("storage.").unwrap_or(&m.id);
        // Writing to a String cannot fail.
        let _ = writeln!(
            src,
            "    Operation {{ name: Cow::Borrowed({name:?}), method: Method::{method}, \
             segments: &[{segments}], request: {request}, request_kind: {kind}, \
             response: {response}, media_download: {media}, \
             class: class_or_unclassified({id:?}) }},",
            method = m.http_method,
            segments = segments.join(", "),
            request = text(m.request.as_deref()),
            kind = text(m.request_kind.as_deref()),
            response = text(m.response.as_deref()),
            media = m.media_download,
            id = m.id,
        );
    }
    src.push_str("];\n");
    src
}

/// The `Option<Cow<'static, str>>` expression for `value`.
fn text(value: Option<&str>) -> String {
    value.map_or_else(|| "None".into(), |v| format!("Some(Cow::Borrowed({v:?}))"))
}
