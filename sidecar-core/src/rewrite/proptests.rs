//! Property tests: for arbitrary object names (including ones equal to or
//! containing the bucket names, `/`, `%2F`, unicode), translating a request
//! and then its response is the identity for the app, and physical names
//! never leak into responses for mapped buckets.

use http::Method;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::json::rewrite_document;
use super::testing::*;
use super::text::replace_bucket_tokens;
use super::xml::rewrite_xml;
use super::{Direction, request_bucket};
use crate::route::{Resource, replace_slots, route};

const PHYSICAL: &str = "photos-k3x9q2mw";

/// What client libraries encode in a path segment: everything but unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn object_name() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("photos".to_owned()),
        Just(PHYSICAL.to_owned()),
        Just("logs-aaaa1111".to_owned()),
        Just("/".to_owned()),
        Just("%2F".to_owned()),
        Just("b/photos/o/".to_owned()),
        Just("copyTo".to_owned()),
        "[a-z0-9._-]{1,8}",
        "\\PC{1,4}",
    ];
    prop::collection::vec(piece, 1..6).prop_map(|pieces| pieces.concat())
}

fn upstream_object(bucket: &str, name: &str) -> Value {
    let enc = utf8_percent_encode(name, SEGMENT).to_string();
    json!({
        "kind": "storage#object",
        "id": format!("{bucket}/{name}/42"),
        "bucket": bucket,
        "name": name,
        "selfLink": format!("https://www.googleapis.com/storage/v1/b/{bucket}/o/{enc}"),
        "mediaLink": format!("https://storage.googleapis.com/download/storage/v1/b/{bucket}/o/{enc}?generation=42&alt=media"),
        "metadata": {"note": name},
        "acl": [{"kind": "storage#objectAccessControl", "bucket": bucket, "object": name, "id": format!("{bucket}/{name}/42/allUsers")}],
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn request_then_response_is_the_identity_for_the_app(name in object_name()) {
        // GCS refuses these object names; the router refuses them as dot segments.
        prop_assume!(name != "." && name != "..");
        let m = mapping();
        let enc = utf8_percent_encode(&name, SEGMENT).to_string();
        let app_path = format!("/storage/v1/b/photos/o/{enc}");

        // Request: only the bucket segment changes; the object segment is byte-identical.
        let routed = route(&Method::GET, &app_path, Some("alt=json"), None).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(routed.buckets.len(), 1);
        let physical = request_bucket(&m, false, &routed.buckets[0].name).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let upstream_path = replace_slots(&app_path, &routed.buckets, &[physical.as_str()]);
        prop_assert_eq!(&upstream_path, &format!("/storage/v1/b/{PHYSICAL}/o/{enc}"));

        // Response: the app sees its own request again.
        let links = sidecar_base();
        let tr = translator(&m, &links, Direction::ToLogical);
        let mut doc = upstream_object(PHYSICAL, &name);
        rewrite_document(&mut doc, Resource::Object, &tr).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&doc["bucket"], "photos");
        prop_assert_eq!(&doc["name"], &Value::String(name.clone()));
        prop_assert_eq!(&doc["metadata"]["note"], &Value::String(name.clone()));
        prop_assert_eq!(&doc["id"], &Value::String(format!("photos/{name}/42")));
        prop_assert_eq!(&doc["selfLink"], &Value::String(format!("http://127.0.0.1:9023{app_path}")));
        prop_assert_eq!(&doc["acl"][0]["bucket"], "photos");
        prop_assert_eq!(&doc["acl"][0]["object"], &Value::String(name.clone()));
        let media = doc["mediaLink"].as_str().unwrap_or_default().to_owned();
        prop_assert_eq!(media, format!("http://127.0.0.1:9023/download/storage/v1/b/photos/o/{enc}?generation=42&alt=media"));

        // Following the links maps back to the same physical object.
        for link in [&doc["selfLink"], &doc["mediaLink"]] {
            let uri: http::Uri = link.as_str().unwrap_or_default().parse().map_err(|_| TestCaseError::fail("link parses"))?;
            let again = route(&Method::GET, uri.path(), uri.query(), None).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&again.buckets[0].name, "photos");
            prop_assert_eq!(replace_slots(uri.path(), &again.buckets, &[PHYSICAL]).contains(&enc), true);
        }
    }

    #[test]
    fn physical_names_never_leak_outside_app_data(name in object_name()) {
        // GCS refuses these object names: links to them are not routed.
        prop_assume!(name != "." && name != "..");
        let m = mapping();
        let links = sidecar_base();
        let tr = translator(&m, &links, Direction::ToLogical);
        let mut list = json!({"kind": "storage#objects", "items": [upstream_object(PHYSICAL, &name), upstream_object("logs-aaaa1111", &name)]});
        rewrite_document(&mut list, Resource::Objects, &tr).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Remove what is the app's own data (object names, custom metadata), then look for leaks.
        let mut scrubbed = list.clone();
        if let Some(items) = scrubbed["items"].as_array_mut() {
            for item in items {
                let enc = utf8_percent_encode(&name, SEGMENT).to_string();
                for key in ["id", "selfLink", "mediaLink"] {
                    if let Some(s) = item[key].as_str() {
                        item[key] = Value::String(s.replace(&name, "<name>").replace(&enc, "<name>"));
                    }
                }
                item["name"] = Value::Null;
                item["metadata"] = Value::Null;
                item["acl"][0]["object"] = Value::Null;
                if let Some(s) = item["acl"][0]["id"].as_str() {
                    item["acl"][0]["id"] = Value::String(s.replace(&name, "<name>"));
                }
            }
        }
        let text = scrubbed.to_string();
        prop_assert!(!text.contains(PHYSICAL), "{}", text);
        prop_assert!(!text.contains("logs-aaaa1111"), "{}", text);
    }

    #[test]
    fn error_text_only_changes_whole_physical_tokens(text in "\\PC{0,60}") {
        let m = mapping();
        let out = replace_bucket_tokens(&text, |n| m.logical(n).map(str::to_owned));
        if !text.contains(PHYSICAL) && !text.contains("logs-aaaa1111") {
            prop_assert_eq!(out.as_ref(), text.as_str());
        }
        let wrapped = format!("No such object: {PHYSICAL}/{text}");
        let out = replace_bucket_tokens(&wrapped, |n| m.logical(n).map(str::to_owned));
        prop_assert!(out.starts_with("No such object: photos/"), "{}", out);
    }

    #[test]
    fn xml_keys_survive_and_the_bucket_is_logical(name in object_name()) {
        let m = mapping();
        let links = sidecar_base();
        let tr = translator(&m, &links, Direction::ToLogical);
        let key = quick_xml::escape::escape(name.as_str()).into_owned();
        let doc = format!("<ListBucketResult><Name>{PHYSICAL}</Name><Prefix>{key}</Prefix><Contents><Key>{key}</Key></Contents></ListBucketResult>");
        let out = rewrite_xml(doc.as_bytes(), &tr).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let out = String::from_utf8(out.unwrap_or_default()).unwrap_or_default();
        prop_assert_eq!(out, format!("<ListBucketResult><Name>photos</Name><Prefix>{key}</Prefix><Contents><Key>{key}</Key></Contents></ListBucketResult>"));
    }

    #[test]
    fn routing_never_panics(method in prop::sample::select(vec!["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]), path in "/[a-zA-Z0-9%/._~-]{0,80}", query in proptest::option::of("[a-zA-Z0-9%=&_-]{0,40}")) {
        let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
        if let Ok(routed) = route(&method, &path, query.as_deref(), None) {
            for slot in &routed.buckets {
                prop_assert!(path.get(slot.range.clone()).is_some());
            }
        }
    }
}
