//! Deny by default: the discovery document's methods are each routed or
//! refused on purpose, the request shapes that used to slip past the router
//! are refused, and no random path is forwarded naming an unmapped bucket.

use http::Method;
use proptest::prelude::*;

use super::*;
use crate::discovery::{Class, Segment, table};
use crate::rewrite::request_bucket;
use crate::rewrite::testing::mapping;

fn split(target: &str) -> (&str, Option<&str>) {
    match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    }
}

fn route_target(method: &Method, target: &str) -> Result<Route, RouteError> {
    let (path, query) = split(target);
    route(method, path, query, None)
}

#[test]
fn every_discovery_method_is_routed_and_rewritten_or_refused_with_a_reason() {
    let table = table();
    let m = mapping();
    for op in &table.operations {
        let path = op.example_path("photos");
        let routed = route(&op.method, &path, None, None);
        match op.class {
            Class::Routed => {
                let r = routed.unwrap_or_else(|e| panic!("{} {path}: {e}", op.name));
                assert_eq!(r.operation, op.name, "{path}");
                let buckets = op
                    .segments
                    .iter()
                    .filter(|s| **s == Segment::Bucket)
                    .count();
                assert_eq!(r.buckets.len(), buckets, "{}: bucket slots", op.name);
                let physical: Vec<String> = r
                    .buckets
                    .iter()
                    .map(|s| request_bucket(&m, false, &s.name).unwrap_or_default())
                    .collect();
                let names: Vec<&str> = physical.iter().map(String::as_str).collect();
                let upstream = replace_slots(&path, &r.buckets, &names);
                assert_eq!(
                    upstream,
                    op.example_path("photos-k3x9q2mw"),
                    "{}: every bucket segment rewritten",
                    op.name
                );
                let want_request = op
                    .request_resource()
                    .map_or(RequestBody::None, RequestBody::Json);
                assert_eq!(r.request_body, want_request, "{}: request body", op.name);
                assert_eq!(
                    r.response_body,
                    ResponseBody::Json(op.response_resource()),
                    "{}: response body",
                    op.name
                );
            }
            Class::Refused(reason) => {
                assert!(reason.len() > 20, "{}: a reason is given", op.name);
                assert_eq!(
                    routed,
                    Err(RouteError::RefusedOperation {
                        operation: &op.name,
                        reason
                    }),
                    "{path}"
                );
            }
        }
    }
}

/// The request shapes issue 8 found forwarded naming an unmapped bucket.
#[test]
#[allow(clippy::too_many_lines)] // a table of cases
fn shapes_that_slipped_past_the_old_router_are_refused() {
    use RouteError as E;
    let unknown = |m: &str, p: &str| E::UnknownOperation {
        method: m.to_owned(),
        path: p.to_owned(),
    };
    let dot = |s: &str| E::DotSegment(s.to_owned());
    let cases: Vec<(Method, &str, RouteError)> = vec![
        (Method::GET, "/storage/v1//b/OTHER/o/x", E::EmptySegment),
        (
            Method::GET,
            "/storage/v1/%62/OTHER/o/x",
            unknown("GET", "/storage/v1/%62/OTHER/o/x"),
        ),
        (Method::GET, "/storage/v1/./b/other/o/x", dot(".")),
        (Method::GET, "/storage/v1/b/photos/../other/o/x", dot("..")),
        (Method::GET, "/storage/v1/b/photos/o/..", dot("..")),
        (Method::GET, "/storage/v1/b/photos/o/%2E%2e", dot("%2E%2e")),
        (Method::GET, "/storage/v1/b/photos/o/x/acl/.", dot(".")),
        (
            Method::GET,
            "/download/storage/v1/b/photos/o/%2E",
            dot("%2E"),
        ),
        (Method::GET, "/photos/../other/x", dot("..")),
        (Method::GET, "/photos/a/./b", dot(".")),
        (Method::PUT, "/photos/%2e%2E/other/x", dot("%2e%2E")),
        (Method::GET, "/photos/a//b", E::EmptySegment),
        (
            Method::POST,
            "/upload/storage/v2/b/other/o?uploadType=media",
            unknown("POST", "/upload/storage/v2/b/other/o"),
        ),
        (
            Method::POST,
            "/storage/v1/b/photos/o/x/copyTo/b/logs/o/y/copyTo/b/other/o/z",
            unknown(
                "POST",
                "/storage/v1/b/photos/o/x/copyTo/b/logs/o/y/copyTo/b/other/o/z",
            ),
        ),
        (
            Method::POST,
            "/storage/v1/b/photos/o/x/copyTo/%62/other/o/y",
            unknown("POST", "/storage/v1/b/photos/o/x/copyTo/%62/other/o/y"),
        ),
        (
            Method::POST,
            "/storage/v1/b/photos/o/dir/x/rewriteTo/b/other/o/y",
            unknown("POST", "/storage/v1/b/photos/o/dir/x/rewriteTo/b/other/o/y"),
        ),
        (
            Method::PUT,
            "/photos?%6Cogging",
            E::DisguisedParameter {
                raw: "%6Cogging".into(),
                key: "logging",
            },
        ),
        (
            Method::PUT,
            "/photos?Logging",
            E::DisguisedParameter {
                raw: "Logging".into(),
                key: "logging",
            },
        ),
        (
            Method::PUT,
            "/photos?logging&logging",
            E::RepeatedParameter("logging"),
        ),
        (
            Method::GET,
            "/storage/v1/b/photos/o/x?alt=json&alt=media",
            E::RepeatedParameter("alt"),
        ),
        (
            Method::GET,
            "/storage/v1/b/photos/o/x?%61lt=media",
            E::DisguisedParameter {
                raw: "%61lt".into(),
                key: "alt",
            },
        ),
        (
            Method::GET,
            "/storage/v1/b/photos?alt=media",
            E::BadParameter {
                key: "alt",
                value: "media".into(),
            },
        ),
        (
            Method::POST,
            "/upload/storage/v1/b/photos/o?uploadType=media&uploadType=multipart",
            E::RepeatedParameter("uploadType"),
        ),
        (
            Method::POST,
            "/upload/storage/v1/b/photos/o?name=x",
            E::BadParameter {
                key: "uploadType",
                value: "(missing)".into(),
            },
        ),
        (
            Method::GET,
            "/storage/v1/b/%70hotos/o",
            E::InvalidBucket("%70hotos".into()),
        ),
        (
            Method::GET,
            "/batch/storage/v1",
            unknown("GET", "/batch/storage/v1"),
        ),
        (
            Method::GET,
            "/download/other/x",
            unknown("GET", "/download/other/x"),
        ),
        (
            Method::OPTIONS,
            "/storage/v1/b/photos",
            unknown("OPTIONS", "/storage/v1/b/photos"),
        ),
        (
            Method::POST,
            "/photos",
            unknown("POST", "(an XML API bucket or object)"),
        ),
    ];
    for (method, target, want) in cases {
        assert_eq!(
            route_target(&method, target),
            Err(want),
            "{method} {target}"
        );
    }
    let hmac = route_target(&Method::GET, "/storage/v1/projects/p/hmacKeys");
    assert!(
        matches!(
            hmac,
            Err(RouteError::RefusedOperation {
                operation: "projects.hmacKeys.list",
                ..
            })
        ),
        "{hmac:?}"
    );
}

#[test]
fn routing_parameters_are_read_once_and_exactly() {
    let [alt, upload] = routing_params("a=1&alt=media&uploadType=x%2Fy", &["alt", "uploadType"])
        .unwrap_or_default();
    assert_eq!(alt.as_deref(), Some("media"));
    assert_eq!(upload.as_deref(), Some("x/y"));
    // Other keys, encoded or repeated, are not routing parameters.
    assert!(routing_params("prefix=a&prefix=b&%70refix=c", &["alt"]).is_ok());
    assert_eq!(
        routing_params("ALT=media", &["alt"]).map(|_| ()),
        Err(RouteError::DisguisedParameter {
            raw: "ALT".into(),
            key: "alt"
        })
    );
}

/// Bucket positions in an upstream path as a lenient server might read it:
/// segments percent-decoded, dot segments resolved, empty segments dropped.
fn lenient_bucket_positions(upstream: &str) -> Result<Vec<String>, String> {
    let mut segs: Vec<String> = Vec::new();
    for raw in upstream.trim_start_matches('/').split('/') {
        let seg = percent_decode_str(raw).decode_utf8_lossy().into_owned();
        match seg.as_str() {
            "" | "." => {}
            ".." => {
                segs.pop();
            }
            _ => segs.push(seg),
        }
    }
    let names: Vec<&str> = segs.iter().map(String::as_str).collect();
    let json_at = match names.as_slice() {
        ["storage", "v1", ..] => 2,
        ["upload" | "download", "storage", "v1", ..] => 3,
        ["resumable", "upload", "storage", "v1", ..] => 4,
        ["upload", "resumable", _] | ["batch", "storage", "v1"] => return Ok(Vec::new()),
        [first, ..] if JSON_FAMILY.contains(first) => {
            return Err(format!(
                "an unknown JSON API path went upstream: {upstream}"
            ));
        }
        [first, ..] => return Ok(vec![(*first).to_owned()]),
        [] => return Ok(Vec::new()),
    };
    let rest = &names[json_at..];
    let mut out = Vec::new();
    if let ["b", bucket, ..] = rest {
        out.push((*bucket).to_owned());
    }
    for window in rest.windows(3) {
        if matches!(window[0], "copyTo" | "rewriteTo") && window[1] == "b" {
            out.push(window[2].to_owned());
        }
    }
    Ok(out)
}

const VOCABULARY: [&str; 34] = [
    "storage",
    "v1",
    "v2",
    "b",
    "o",
    "photos",
    "logs",
    "other",
    "OTHER",
    "photos-k3x9q2mw",
    "%62",
    "%6F",
    "x",
    "a%2Fb",
    "copyTo",
    "rewriteTo",
    "moveTo",
    "compose",
    "acl",
    "iam",
    "upload",
    "download",
    "batch",
    "resumable",
    ".",
    "..",
    "%2E",
    "%2e%2E",
    "",
    "b%2Fother",
    "folders",
    "projects",
    "serviceAccount",
    "%2Fother",
];

const PREFIXES: [&str; 6] = [
    "/",
    "/storage/v1/",
    "/storage/v1/b/",
    "/upload/storage/v1/b/",
    "/download/storage/v1/b/",
    "/photos/",
];

const QUERIES: [Option<&str>; 8] = [
    None,
    Some("alt=media"),
    Some("uploadType=media"),
    Some("uploadType=multipart&name=x"),
    Some("upload_id=1"),
    Some("logging"),
    Some("%6Cogging"),
    Some("alt=media&alt=json"),
];

/// The share of cases each property test must compare at least: about
/// half of what its generator reaches (most random paths are refused,
/// rightly), far enough below it that chance does not fail a run, far
/// enough above zero that a router refusing everything does.
const FLOOR_RANDOM_PATHS: f64 = 0.04;
const FLOOR_OBJECT_LINKS: f64 = 0.04;

const METHODS: [Method; 6] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

/// Runs `test` on `cases` values of `strategy` the way `proptest!` does
/// (the saved regressions first, a failure shrunk and saved), and fails
/// unless at least `floor` of the cases reached the comparison: `test`
/// answers whether its case did (false when routing refused the input
/// before there was anything to compare). Without the floor, a router
/// refusing everything would pass every case.
fn compared_at_least<S: Strategy>(
    name: &'static str,
    cases: u32,
    floor: f64,
    strategy: S,
    test: impl Fn(S::Value) -> Result<bool, TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    use proptest::test_runner::{Config, TestRunner};
    use std::sync::atomic::{AtomicU32, Ordering};
    let config = Config {
        test_name: Some(name),
        source_file: Some(file!()),
        ..Config::with_cases(cases)
    };
    let compared = AtomicU32::new(0);
    let run = TestRunner::new(config).run(&strategy, |value| {
        if test(value)? {
            compared.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = run {
        panic!("{name}: {e}");
    }
    let compared = compared.into_inner();
    eprintln!("{name}: {compared} of {cases} cases compared");
    assert!(
        f64::from(compared) >= floor * f64::from(cases),
        "{name}: only {compared} of {cases} cases reached the comparison (the floor is {floor} \
         of them): routing refused the rest, so the test checked almost nothing"
    );
}

#[test]
fn random_paths_are_routed_to_mapped_buckets_or_refused() {
    let strategy = (
        0..PREFIXES.len(),
        prop::collection::vec(0..VOCABULARY.len(), 0..10),
        0..QUERIES.len(),
        0..METHODS.len(),
    );
    compared_at_least(
        "random_paths_are_routed_to_mapped_buckets_or_refused",
        4096,
        FLOOR_RANDOM_PATHS,
        strategy,
        |(prefix, segs, query, method)| {
            let tail: Vec<&str> = segs.iter().map(|&i| VOCABULARY[i]).collect();
            let path = format!("{}{}", PREFIXES[prefix], tail.join("/"));
            let Ok(routed) = route(&METHODS[method], &path, QUERIES[query], None) else {
                return Ok(false);
            };
            let m = mapping();
            let mut physical = Vec::new();
            for slot in &routed.buckets {
                prop_assert_eq!(&path[slot.range.clone()], slot.name.as_str());
                match request_bucket(&m, false, &slot.name) {
                    Ok(name) => physical.push(name),
                    // The proxy answers 404/403 itself: nothing is forwarded.
                    Err(_) => return Ok(false),
                }
            }
            let names: Vec<&str> = physical.iter().map(String::as_str).collect();
            let upstream = replace_slots(&path, &routed.buckets, &names);
            let buckets = lenient_bucket_positions(&upstream).map_err(TestCaseError::fail)?;
            for bucket in buckets {
                prop_assert!(
                    m.logical(&bucket).is_some(),
                    "{} {} went upstream as {} naming {:?}",
                    METHODS[method],
                    path,
                    upstream,
                    bucket
                );
            }
            Ok(true)
        },
    );
}

/// Paths and queries near the two link shapes [`object_link_slot`] reads,
/// weighted towards those that take the short way, so that enough cases
/// reach the comparison (`FLOOR_OBJECT_LINKS` holds the share).
fn link_target() -> impl Strategy<Value = (String, Option<String>)> {
    let prefix = prop_oneof![
        4 => Just("/storage/v1/b/"),
        4 => Just("/download/storage/v1/b/"),
        1 => Just("/upload/storage/v1/b/"),
        1 => Just("/storage/v1/"),
        1 => Just("/"),
    ];
    let bucket = prop_oneof![
        2 => Just("photos".to_owned()),
        2 => Just("photos-k3x9q2mw".to_owned()),
        1 => "[a-zA-Z0-9._%-]{0,8}",
    ];
    let middle = prop_oneof![
        8 => Just("/o/"),
        1 => Just("/o"),
        1 => Just("/"),
        1 => Just("/acl/"),
        1 => Just("/O/"),
    ];
    let object = prop_oneof![
        Just(".".to_owned()),
        Just("%2e%2E".to_owned()),
        Just("rewriteTo".to_owned()),
        "[a-z0-9%./A-F_~-]{0,10}",
    ];
    let pair = prop_oneof![
        4 => Just("alt=media"),
        4 => Just("alt=json"),
        4 => Just("generation=17"),
        1 => Just("alt=xml"),
        1 => Just("ALT=media"),
        1 => Just("al%74=media"),
        1 => Just("generation="),
        1 => Just("generation=1x"),
        1 => Just("userProject=p"),
        1 => Just("uploadType=media"),
        1 => Just(""),
    ];
    let query = prop::option::of(prop::collection::vec(pair, 0..4).prop_map(|p| p.join("&")));
    (prefix, bucket, middle, object, query).prop_map(|(p, b, m, o, q)| (format!("{p}{b}{m}{o}"), q))
}

/// The links' short way finds exactly what routing a GET finds.
#[test]
fn object_links_are_read_as_the_router_reads_them() {
    compared_at_least(
        "object_links_are_read_as_the_router_reads_them",
        4096,
        FLOOR_OBJECT_LINKS,
        link_target(),
        |(path, query)| {
            let Some(slot) = object_link_slot(&path, query.as_deref()) else {
                return Ok(false);
            };
            let routed = route(&Method::GET, &path, query.as_deref(), None);
            let slots = routed.map(|r| r.buckets.into_iter().map(|s| s.range).collect::<Vec<_>>());
            prop_assert_eq!(slots, Ok(vec![slot]), "{} {:?}", path, query);
            Ok(true)
        },
    );
}

#[test]
fn the_links_gcs_writes_take_the_short_way() {
    for (path, query, bucket) in [
        ("/storage/v1/b/photos-k3x9q2mw/o/a%2Fb.jpg", None, 14..29),
        (
            "/storage/v1/b/photos-k3x9q2mw/o/x",
            Some("generation=17"),
            14..29,
        ),
        (
            "/download/storage/v1/b/photos-k3x9q2mw/o/a%2Fb.jpg",
            Some("generation=17&alt=media"),
            23..38,
        ),
    ] {
        assert_eq!(object_link_slot(path, query), Some(bucket), "{path}");
    }
    for (path, query) in [
        ("/storage/v1/b/photos-k3x9q2mw/o/a/b", None),
        ("/storage/v1/b/photos-k3x9q2mw/o/..", None),
        (
            "/storage/v1/b/photos-k3x9q2mw/o/x",
            Some("alt=media&alt=json"),
        ),
        ("/storage/v1/b/photos-k3x9q2mw/o/x", Some("userProject=p")),
        ("/storage/v1/b/Photos/o/x", None),
        ("/storage/v1/b/photos-k3x9q2mw/o/%zz", None),
    ] {
        assert_eq!(object_link_slot(path, query), None, "{path} {query:?}");
    }
}
