//! Checks of a client's report (what the application saw) and of the
//! upstream afterwards (what fake-gcs-server holds and served). Every
//! expected value comes from the [`Scenario`]; nothing is taken from what the
//! sidecar or fake-gcs-server answered.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use std::collections::BTreeSet;

use anyhow::Result;
use serde_json::{Value, json};

use super::checks::Checks;
use super::http::encode;
use super::scenario::{CHUNK_SIZE, Client, LARGE_SIZE, Scenario, sha256_hex};
use super::world::World;

fn s(v: &Value) -> Option<&str> {
    v.as_str()
}

/// Check a client's report. `endpoint` is the URL the client was given;
/// `leaks` are strings that must not appear anywhere in what the client saw
/// (physical names, the upstream address) outside user metadata.
pub fn check_report(
    c: &mut Checks,
    client: Client,
    sc: &Scenario,
    report: &Value,
    endpoint: &str,
    leaks: &[String],
) -> Result<()> {
    let steps = &report["steps"];
    let got: BTreeSet<&str> = steps
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    c.eq("steps reported", got, client.steps());
    let mut failed = BTreeSet::new();
    for (name, step) in steps.as_object().into_iter().flatten() {
        if step["ok"] != Value::Bool(true) {
            failed.insert(name.clone());
            c.fail(format!("step {name} failed: {}", step["error"]));
        }
    }
    let ok = |name: &str| -> Option<&Value> {
        (!failed.contains(name))
            .then(|| &steps[name])
            .filter(|v| !v.is_null())
    };
    let small_len = sc.small.len().to_string();
    let large_len = sc.large.len().to_string();
    let digest = |data: &[u8]| -> Result<Value> {
        Ok(json!({ "len": data.len(), "sha256": sha256_hex(data)? }))
    };
    let small_digest = digest(&sc.small)?;
    let large_digest = digest(&sc.large)?;

    let resource =
        |c: &mut Checks, what: &str, r: &Value, bucket: &str, name: &str, size: Option<&str>| {
            c.eq(&format!("{what}: bucket"), s(&r["bucket"]), Some(bucket));
            c.eq(&format!("{what}: name"), s(&r["name"]), Some(name));
            if let Some(size) = size {
                // GCS sends sizes as strings; fake-gcs-server sends a number after a resumable upload.
                let got = match &r["size"] {
                    Value::Number(n) => Some(n.to_string()),
                    other => other.as_str().map(str::to_owned),
                };
                c.eq(&format!("{what}: size"), got.as_deref(), Some(size));
            }
        };

    if let Some(st) = ok("get_bucket") {
        c.eq(
            "get_bucket: name",
            s(&st["resource"]["name"]),
            Some("photos"),
        );
        if !st["resource"]["id"].is_null() {
            c.eq("get_bucket: id", s(&st["resource"]["id"]), Some("photos"));
        }
        if let Some(link) = s(&st["resource"]["selfLink"]) {
            c.check(link == format!("{endpoint}/storage/v1/b/photos"), || {
                format!("get_bucket: selfLink {link:?} is not {endpoint}/storage/v1/b/photos")
            });
        }
    }
    if let Some(st) = ok("small_upload") {
        resource(
            c,
            "small_upload",
            &st["resource"],
            "photos",
            sc.object("small"),
            Some(&small_len),
        );
    }
    if let Some(st) = ok("large_upload") {
        resource(
            c,
            "large_upload",
            &st["resource"],
            "photos",
            sc.object("large"),
            Some(&large_len),
        );
    }
    if let Some(st) = ok("resumable_session") {
        let url = s(&st["session_url"]).unwrap_or_default();
        let want = format!("{endpoint}/upload/storage/v1/b/photos/o?");
        c.check(url.starts_with(&want), || {
            format!("resumable_session: session URL {url:?} does not start with {want:?}")
        });
        c.check(url.contains("upload_id="), || {
            format!("resumable_session: session URL {url:?} has no upload_id")
        });
        c.eq(
            "resumable_session: PUT status",
            st["put_status"].as_u64(),
            Some(200),
        );
        resource(
            c,
            "resumable_session",
            &st["resource"],
            "photos",
            sc.object("session"),
            Some(&small_len),
        );
    }
    if let Some(st) = ok("tree_upload") {
        let names: Vec<&str> = st["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| s(&r["name"]))
            .collect();
        let want: Vec<&str> = sc.tree.iter().map(|(n, _)| n.as_str()).collect();
        c.eq("tree_upload: names", names, want);
    }
    if let Some(st) = ok("download_full") {
        c.eq("download_full: large", &st["large"], &large_digest);
        c.eq("download_full: small", &st["small"], &small_digest);
        if !st["large_via_media_link"].is_null() {
            c.eq(
                "download_full: large via mediaLink",
                &st["large_via_media_link"],
                &large_digest,
            );
        }
    }
    if let Some(st) = ok("download_full_json_api") {
        c.eq("download_full_json_api: large", &st["large"], &large_digest);
    }
    if let Some(st) = ok("download_range") {
        let (start, len) = sc.range;
        c.eq(
            "download_range",
            &st["range"],
            &digest(&sc.large[start..start + len])?,
        );
    }
    for (step, delimited) in [("list_delimited", true), ("list_prefix", false)] {
        if let Some(st) = ok(step) {
            let (want_items, want_prefixes) = sc.expected_listing(delimited);
            let items: BTreeSet<String> = st["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| s(&r["name"]).map(str::to_owned))
                .collect();
            c.eq(&format!("{step}: object names"), items, want_items);
            if delimited {
                let prefixes: BTreeSet<String> = st["prefixes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| s(p).map(str::to_owned))
                    .collect();
                c.eq(&format!("{step}: prefixes"), prefixes, want_prefixes);
            }
        }
    }
    if let Some(st) = ok("copy") {
        resource(
            c,
            "copy",
            &st["resource"],
            "videos",
            sc.object("copy"),
            Some(&small_len),
        );
        c.eq("copy: content read back", &st["content"], &small_digest);
    }
    if let Some(st) = ok("rewrite") {
        resource(
            c,
            "rewrite",
            &st["resource"],
            "videos",
            sc.object("rewrite"),
            Some(&large_len),
        );
        c.eq("rewrite: content read back", &st["content"], &large_digest);
    }
    if let Some(st) = ok("compose") {
        let mut composed = Vec::new();
        for name in &sc.compose_sources {
            composed.extend_from_slice(sc.tree_content(name));
        }
        resource(
            c,
            "compose",
            &st["resource"],
            "photos",
            &sc.compose_destination,
            Some(&composed.len().to_string()),
        );
        c.eq(
            "compose: content read back",
            &st["content"],
            &digest(&composed)?,
        );
    }
    if let Some(st) = ok("metadata_patch") {
        let want = serde_json::to_value(&sc.metadata)?;
        for key in ["resource", "reloaded"] {
            resource(
                c,
                &format!("metadata_patch ({key})"),
                &st[key],
                "photos",
                sc.object("small"),
                None,
            );
            c.eq(
                &format!("metadata_patch ({key}): metadata"),
                &st[key]["metadata"],
                &want,
            );
        }
    }
    if let Some(st) = ok("delete") {
        c.eq(
            "delete: object exists afterwards",
            st["exists_after"].as_bool(),
            Some(false),
        );
    }
    if let Some(st) = ok("not_found") {
        c.eq(
            "not_found: error code",
            st["error"]["code"].as_u64(),
            Some(404),
        );
        if client == Client::Go {
            c.eq(
                "not_found: XML read error code",
                st["read_error"]["code"].as_u64(),
                Some(404),
            );
        }
    }
    if let Some(st) = ok("batch_delete") {
        let before: Vec<&str> = st["before"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(s)
            .collect();
        let want: Vec<&str> = sc.batch.iter().map(String::as_str).collect();
        c.eq("batch_delete: objects before", before, want);
        c.eq(
            "batch_delete: objects after",
            st["after"].as_array().map(Vec::len),
            Some(0),
        );
    }
    if let Some(st) = ok("env_only_client") {
        resource(
            c,
            "env_only_client",
            &st["resource"],
            "photos",
            sc.object("small"),
            Some(&small_len),
        );
    }

    check_links(c, report, endpoint);
    check_leaks(c, report, leaks, sc);
    Ok(())
}

const LOGICAL: [&str; 2] = ["photos", "videos"];

/// The bucket segment of a JSON API URL path (`.../b/BUCKET/...`).
fn link_bucket(url: &str) -> Option<&str> {
    let rest = &url[url.find("/b/")? + 3..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Every `bucket`, `selfLink`, `mediaLink`, object `id`, session URL the
/// client saw must name a logical bucket and point at `endpoint`.
fn check_links(c: &mut Checks, report: &Value, endpoint: &str) {
    fn walk(c: &mut Checks, v: &Value, path: &str, endpoint: &str) {
        match v {
            Value::Object(map) => {
                if let Some(bucket) = map.get("bucket").and_then(Value::as_str) {
                    c.check(LOGICAL.contains(&bucket), || {
                        format!("{path}.bucket is {bucket:?}, not a logical name")
                    });
                }
                let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
                if let (true, Some(id), Some(bucket)) = (
                    kind == "storage#object",
                    map.get("id").and_then(Value::as_str),
                    map.get("bucket").and_then(Value::as_str),
                ) {
                    c.check(id.starts_with(&format!("{bucket}/")), || {
                        format!("{path}.id {id:?} does not start with {bucket}/")
                    });
                }
                for key in ["selfLink", "mediaLink", "session_url", "media_link_used"] {
                    if let Some(url) = map.get(key).and_then(Value::as_str) {
                        c.check(url.starts_with(&format!("{endpoint}/")), || {
                            format!("{path}.{key} {url:?} does not point at {endpoint}")
                        });
                        let bucket = link_bucket(url);
                        c.check(bucket.is_some_and(|b| LOGICAL.contains(&b)), || {
                            format!(
                                "{path}.{key} {url:?} names bucket {bucket:?}, not a logical name"
                            )
                        });
                    }
                }
                for (k, child) in map {
                    // User metadata is data: it may hold any text, bucket names included.
                    if k != "metadata" && k != "traceback" && k != "stack" {
                        walk(c, child, &format!("{path}.{k}"), endpoint);
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(c, item, &format!("{path}[{i}]"), endpoint);
                }
            }
            _ => {}
        }
    }
    walk(c, &report["steps"], "steps", endpoint);
}

/// No physical name or upstream address anywhere the client could see it,
/// except inside user metadata and object names chosen to contain one.
fn check_leaks(c: &mut Checks, report: &Value, leaks: &[String], sc: &Scenario) {
    fn strip_metadata(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.remove("metadata");
                map.values_mut().for_each(strip_metadata);
            }
            Value::Array(items) => items.iter_mut().for_each(strip_metadata),
            _ => {}
        }
    }
    let mut report = report.clone();
    strip_metadata(&mut report);
    let mut text = report.to_string();
    // The last segment of object names that embed a physical name on purpose.
    for (name, _) in &sc.tree {
        if let Some(segment) = name
            .rsplit('/')
            .next()
            .filter(|seg| leaks.iter().any(|l| seg.contains(l.as_str())))
        {
            text = text.replace(segment, "<object-name>");
        }
    }
    for leak in leaks {
        if let Some(at) = text.find(leak.as_str()) {
            let from = text[..at]
                .char_indices()
                .rev()
                .nth(120)
                .map(|(i, _)| i)
                .unwrap_or(0);
            let snippet: String = text[from..].chars().take(240 + leak.len()).collect();
            c.fail(format!(
                "the client saw {leak:?} (count {}), e.g. …{snippet}…",
                text.matches(leak.as_str()).count()
            ));
        }
    }
}

/// Check fake-gcs-server's state after a client run: every expected object
/// in its physical bucket with the right bytes (and metadata), nothing else
/// anywhere.
pub fn check_upstream(c: &mut Checks, world: &World, client: Client, sc: &Scenario) -> Result<()> {
    let fake = &world.fake;
    let want_buckets: BTreeSet<String> = world.all_physical_buckets().into_iter().collect();
    c.eq(
        "upstream buckets",
        fake.bucket_names()?.into_iter().collect::<BTreeSet<_>>(),
        want_buckets,
    );
    for (logical, objects) in sc.expected_objects(client) {
        let physical = world.physical(logical);
        let found = fake.objects(physical)?;
        c.eq(
            &format!("objects in {physical} (logical {logical})"),
            found.keys().cloned().collect::<BTreeSet<_>>(),
            objects.keys().cloned().collect::<BTreeSet<_>>(),
        );
        for (name, want) in &objects {
            if !found.contains_key(name) {
                continue;
            }
            let got = fake.content(physical, name)?;
            c.check(got == *want, || {
                format!(
                    "{physical}/{name}: upstream holds {} bytes that differ from the {} uploaded",
                    got.len(),
                    want.len()
                )
            });
        }
        if logical == "photos" && client.steps().contains("metadata_patch") {
            let small = sc.object("small");
            let want = serde_json::to_value(&sc.metadata)?;
            let got = found
                .get(small)
                .map(|o| o["metadata"].clone())
                .unwrap_or(Value::Null);
            c.eq(
                &format!("{physical}/{small}: metadata upstream"),
                &got,
                &want,
            );
        }
    }
    check_upstream_requests(c, world, client, sc);
    for bucket in world.forbidden() {
        let found = fake.objects(bucket)?;
        c.check(found.is_empty(), || {
            format!(
                "forbidden bucket {bucket} holds {:?}",
                found.keys().collect::<Vec<_>>()
            )
        });
    }
    Ok(())
}

/// What fake-gcs-server served (it logs each request line): the large
/// upload in several chunks, and each client's characteristic API calls with
/// every bucket of the path rewritten, two-bucket paths included.
fn check_upstream_requests(c: &mut Checks, world: &World, client: Client, sc: &Scenario) {
    // A chunk is a request carrying the session's upload_id.
    let log = std::fs::read_to_string(&world.fake.proc.log).unwrap_or_default();
    let photos = world.physical("photos");
    let large = encode(sc.object("large"));
    let chunk_puts = log
        .lines()
        .filter(|l| {
            // Python and Node PUT each chunk; Go POSTs them.
            ["PUT", "POST"]
                .iter()
                .any(|m| l.contains(&format!("{m} /upload/storage/v1/b/{photos}/o?")))
        })
        // Java's session URL carries the name unencoded.
        .filter(|l| {
            l.contains("upload_id=")
                && (l.contains(&format!("name={large}"))
                    || l.contains(&format!("name={}&", sc.object("large"))))
        })
        .count();
    let want = LARGE_SIZE.div_ceil(CHUNK_SIZE);
    if client == Client::Rust && world.sidecar.is_none() {
        // The baseline's single-shot write (see `run_client`): no chunks.
        let single = format!("POST /upload/storage/v1/b/{photos}/o?uploadType=multipart");
        c.check(
            log.lines()
                .any(|l| l.contains(&single) && l.contains(&format!("name={large}"))),
            || format!("fake-gcs-server never served the single-shot write {single}&name={large}"),
        );
    } else {
        c.check(chunk_puts >= want, || {
            format!("the large upload reached {photos} in {chunk_puts} resumable PUTs, want at least {want} chunks")
        });
    }
    let enc = |name: &str| encode(name);
    let videos = world.physical("videos");
    let copy_verb = if client == Client::Python {
        "copyTo"
    } else {
        "rewriteTo"
    };
    // (method, path prefix); a batch part may carry an absolute URL.
    // Java sends PATCH as a POST with X-HTTP-Method-Override: PATCH; the
    // sidecar forwards it as the PATCH it is.
    let patch = if client == Client::Java && world.sidecar.is_none() {
        "POST"
    } else {
        "PATCH"
    };
    let mut wanted: Vec<(&str, String)> = Vec::new();
    if client.copies() {
        wanted = vec![
            (
                "POST",
                format!(
                    "/storage/v1/b/{photos}/o/{}/{copy_verb}/b/{videos}/o/{}",
                    enc(sc.object("small")),
                    enc(sc.object("copy"))
                ),
            ),
            (
                "POST",
                format!(
                    "/storage/v1/b/{photos}/o/{}/rewriteTo/b/{videos}/o/{}",
                    enc(sc.object("large")),
                    enc(sc.object("rewrite"))
                ),
            ),
            (
                "POST",
                format!(
                    "/storage/v1/b/{photos}/o/{}/compose",
                    enc(&sc.compose_destination)
                ),
            ),
            (
                patch,
                format!("/storage/v1/b/{photos}/o/{}", enc(sc.object("small"))),
            ),
        ];
    }
    match client {
        // Batch parts are logged as fake-gcs-server serves them one by one.
        Client::Python => {
            wanted.push(("POST", "/batch/storage/v1".to_owned()));
            wanted.extend(
                sc.batch
                    .iter()
                    .map(|n| ("DELETE", format!("/storage/v1/b/{photos}/o/{}", enc(n)))),
            );
        }
        // Go reads through the XML API.
        Client::Go => wanted.push(("GET", format!("/{photos}/{}", enc(sc.object("large"))))),
        Client::Node | Client::Java => {}
        // Storage reads objects through the JSON API's media download.
        Client::Rust => wanted.push((
            "GET",
            format!(
                "/storage/v1/b/{photos}/o/{}?alt=media",
                enc(sc.object("large"))
            ),
        )),
    }
    for (method, path) in wanted {
        let served = log.lines().any(|l| {
            l.split(&format!("{method} ")).skip(1).any(|target| {
                let target = target
                    .strip_prefix("http://")
                    .map_or(target, |t| &t[t.find('/').unwrap_or(t.len())..]);
                target.starts_with(&path)
            })
        });
        c.check(served, || {
            format!("fake-gcs-server never served {method} {path}")
        });
    }
}
