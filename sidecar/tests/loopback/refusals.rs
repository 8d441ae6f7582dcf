//! Deny by default: refused requests are answered locally, counted, and
//! nothing is forwarded.

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};

use bucketmap_sidecar::body::{empty, full};

use super::harness::*;

/// A refused request: (method, target, headers, body, status, reason).
type Refused = (
    Method,
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
    u16,
    &'static str,
);

/// Requests answered locally (with `max_metadata_bytes: 64`).
const REFUSED: &[Refused] = &[
    (
        Method::GET,
        "/storage/v1/b/unknown/o",
        &[],
        "",
        404,
        "notFound",
    ),
    (
        Method::GET,
        "/storage/v1/b/photos-k3x9q2mw/o",
        &[],
        "",
        403,
        "forbidden",
    ),
    (
        Method::POST,
        "/storage/v1/b/photos/o/a/copyTo/b/unknown/o/b",
        &[],
        "",
        404,
        "notFound",
    ),
    (
        Method::GET,
        "/storage/v1/b/photos/o/a%zz",
        &[],
        "",
        400,
        "invalid",
    ),
    (
        Method::GET,
        "/storage/v1/b/Photos/o",
        &[],
        "",
        400,
        "invalid",
    ),
    (
        Method::GET,
        "/photos/a?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature=00",
        &[],
        "",
        400,
        "InvalidArgument",
    ),
    (
        Method::GET,
        "/photos/a?GoogleAccessId=x&Expires=1&Signature=y",
        &[],
        "",
        400,
        "InvalidArgument",
    ),
    (
        Method::GET,
        "/storage/v1/b/photos/o",
        &[("authorization", "GOOG4-HMAC-SHA256 Credential=x")],
        "",
        400,
        "invalid",
    ),
    (
        Method::GET,
        "/photos/a",
        &[("authorization", "AWS4-HMAC-SHA256 Credential=x")],
        "",
        400,
        "InvalidArgument",
    ),
    (Method::GET, "/unknown/a", &[], "", 404, "NoSuchBucket"),
    (
        Method::POST,
        "/storage/v1/b/photos/o/x/compose",
        &[("content-type", "application/json")],
        r#"{"destination":{"bucket":"unknown"}}"#,
        404,
        "notFound",
    ),
    (
        Method::PUT,
        "/photos/dst",
        &[("x-goog-copy-source", "/unknown/src")],
        "",
        404,
        "NoSuchBucket",
    ),
    (
        Method::POST,
        "/storage/v1/b?project=p",
        &[("content-type", "application/json")],
        r#"{"name":"brand-new"}"#,
        404,
        "notFound",
    ),
    (
        Method::PATCH,
        "/storage/v1/b/photos/o/x",
        &[],
        r#"{"metadata":{"k":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}}"#,
        413,
        "payloadTooLarge",
    ),
    (
        Method::PATCH,
        "/storage/v1/b/photos/o/x",
        &[],
        r#"{"bucket":"logs-aaaa1111"}"#,
        403,
        "forbidden",
    ),
    (
        Method::PUT,
        "/photos?logging",
        &[("content-type", "application/xml")],
        "<Logging><LogBucket>logs</LogBucket>",
        400,
        "InvalidArgument",
    ),
];

/// `method target` with `headers` and `body`, sent through the sidecar.
async fn send_with(
    sidecar: &Sidecar,
    method: &Method,
    target: &str,
    headers: &[(&'static str, &'static str)],
    body: Bytes,
) -> Answer {
    let mut req = request(method.clone(), &sidecar.url(target), full(body));
    for (name, value) in headers {
        req.headers_mut().insert(
            header::HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    send(req).await
}

#[tokio::test]
async fn refused_requests_are_answered_locally_and_nothing_is_forwarded() {
    let upstream = Upstream::start(echo_object_handler()).await;
    let sidecar = Sidecar::start(
        &upstream,
        Options {
            max_metadata_bytes: 64,
            ..Options::default()
        },
    )
    .await;
    for (method, target, headers, body, status, reason) in REFUSED {
        let body = Bytes::from_static(body.as_bytes());
        let answer = send_with(&sidecar, method, target, headers, body).await;
        assert_eq!(
            answer.status.as_u16(),
            *status,
            "{method} {target}: {}",
            answer.text()
        );
        assert!(
            answer.text().contains(reason),
            "{method} {target}: {}",
            answer.text()
        );
        let xml = answer
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/xml"));
        assert_eq!(
            xml,
            !target.starts_with("/storage"),
            "{method} {target}: error style"
        );
    }
    assert!(
        upstream.seen().is_empty(),
        "nothing forwarded: {:?}",
        upstream.seen()
    );
}

/// Every method of the discovery document, through the proxy: routed ones
/// reach the upstream with every bucket segment physical, refused ones are
/// answered locally with their reason.
#[tokio::test]
async fn every_discovery_method_is_forwarded_rewritten_or_refused() {
    use bucketmap_sidecar::discovery::{Class, table};
    let upstream = Upstream::start(echo_object_handler()).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let table = table();
    for op in &table.operations {
        let target = op.example_path("photos");
        let body = if op.request.is_some() {
            full("{}")
        } else {
            empty()
        };
        let forwarded = upstream.seen().len();
        let answer = send(request(op.method.clone(), &sidecar.url(&target), body)).await;
        let seen = upstream.seen();
        match op.class {
            Class::Routed => {
                assert_eq!(answer.status, StatusCode::OK, "{target}: {}", answer.text());
                assert_eq!(seen.len(), forwarded + 1, "{}: forwarded once", op.name);
                assert_eq!(
                    seen[forwarded].target,
                    op.example_path(PHYSICAL),
                    "{}",
                    op.name
                );
            }
            Class::Refused(reason) => {
                assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{target}");
                let message = answer.json()["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                assert!(message.contains(reason), "{target}: {message}");
                assert_eq!(seen.len(), forwarded, "{}: nothing forwarded", op.name);
            }
        }
    }
}

/// Shapes the router cannot check: (method, target, what the refusal says).
const UNCHECKABLE: &[(Method, &str, &str)] = &[
    (Method::GET, "/storage/v1//b/other/o/x", "empty segment"),
    (
        Method::GET,
        "/storage/v1/%62/other/o/x",
        "no GCS operation matches",
    ),
    (
        Method::GET,
        "/storage/v1/b/photos/o/x/../../../other/o/x",
        "relative segments are refused",
    ),
    (
        Method::GET,
        "/photos/../other/x",
        "relative segments are refused",
    ),
    (
        Method::GET,
        "/photos/%2e%2e/other/x",
        "relative segments are refused",
    ),
    (
        Method::POST,
        "/upload/storage/v2/b/other/o?uploadType=media",
        "no GCS operation",
    ),
    (
        Method::POST,
        "/storage/v1/b/photos/o/x/copyTo/b/logs/o/y/copyTo/b/other/o/z",
        "no GCS operation",
    ),
    (
        Method::POST,
        "/storage/v1/b/photos/o/x/copyTo/%62/other/o/y",
        "no GCS operation",
    ),
    (Method::PUT, "/photos?%6Cogging", "spelt differently"),
    (
        Method::GET,
        "/storage/v1/b/photos/o/x?alt=media&alt=media",
        "more than once",
    ),
];

/// The shapes issue 8 found forwarded naming an unmapped bucket: each gets a
/// GCS-style 400 naming what was refused, is counted, and nothing is forwarded.
#[tokio::test]
async fn requests_the_router_cannot_check_are_refused_and_counted() {
    let upstream = Upstream::start(echo_object_handler()).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    assert_eq!(UNCHECKABLE.len(), 10);
    for (method, target, says) in UNCHECKABLE {
        let answer = send(request(method.clone(), &sidecar.url(target), full("x"))).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{method} {target}");
        let text = answer.text();
        assert!(text.contains(says), "{method} {target}: {text}");
        assert!(
            text.contains("refuses this request"),
            "{method} {target}: {text}"
        );
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    let metrics = sidecar.metrics.encode();
    let refused: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("bucketmap_sidecar_refused_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(refused, UNCHECKABLE.len() as u64, "{metrics}");
    assert!(
        metrics.contains("bucketmap_sidecar_refused_requests_total{reason=\"dot_segment\"} 3"),
        "{metrics}"
    );
}

const PATCH: &str = "/storage/v1/b/photos/o/x";

/// Bodies refused: (method, target, headers, body, what the refusal says).
type Strict = (
    Method,
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [u8],
    &'static str,
);

const STRICT: &[Strict] = &[
    (
        Method::PATCH,
        PATCH,
        &[],
        br#"{"error":{"code":1},"bucket":"other"}"#,
        "`error` member",
    ),
    (
        Method::PATCH,
        PATCH,
        &[],
        br#"{"kind":"storage#bucket","bucket":"other"}"#,
        "kind",
    ),
    (
        Method::PATCH,
        PATCH,
        &[],
        br#"{"bucket":"photos"}{"bucket":"other"}"#,
        "after the object",
    ),
    (
        Method::PATCH,
        PATCH,
        &[],
        br#"[{"bucket":"other"}]"#,
        "one JSON object",
    ),
    (
        Method::PATCH,
        PATCH,
        &[],
        br#"{"bucket":"photos","BUCKET":"other"}"#,
        "differ only in case",
    ),
    (
        Method::PATCH,
        PATCH,
        &[],
        b"{\"bucket\":\"other\xff\"}",
        "UTF-8",
    ),
    (
        Method::GET,
        PATCH,
        &[],
        br#"{"bucket":"other"}"#,
        "which takes none",
    ),
    (
        Method::DELETE,
        "/storage/v1/b/photos",
        &[],
        b"x",
        "which takes none",
    ),
    (
        Method::GET,
        PATCH,
        &[("x-http-method-override", "PATCH")],
        br#"{"bucket":"other"}"#,
        "honoured on POST only",
    ),
    (
        Method::POST,
        PATCH,
        &[("x-http-method-override", "GET")],
        br#"{"bucket":"other"}"#,
        "which takes none",
    ),
    (
        Method::POST,
        PATCH,
        &[("x-http-method-override", "BREW")],
        b"",
        "not a method GCS serves",
    ),
];

/// Bodies other parsers could read differently from the rewriter, bodies on
/// operations that take none, and method overrides that are not honoured:
/// each refused with a 400, nothing forwarded.
#[tokio::test]
async fn request_bodies_are_parsed_strictly() {
    let upstream = Upstream::start(echo_object_handler()).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    for (method, target, headers, body, says) in STRICT {
        let body = Bytes::from_static(body);
        let answer = send_with(&sidecar, method, target, headers, body).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{method} {target} ({says})"
        );
        let message = answer.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(message.contains(says), "{method} {target}: {message}");
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
}

/// Batch parts refused as requests the sidecar does not forward count in
/// `bucketmap_sidecar_refused_requests_total` by reason, like top-level
/// requests; a batch whose every part is refused reaches no upstream.
#[tokio::test]
async fn refused_batch_parts_count_as_refusals() {
    let upstream = Upstream::start(echo_object_handler()).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let body = "--b\r\nContent-Type: application/http\r\nContent-ID: <1>\r\n\r\nGET /storage/v1/b/photos/o/%2e%2e/x HTTP/1.1\r\n\r\n\r\n\
         --b\r\nContent-Type: application/http\r\nContent-ID: <2>\r\n\r\nGET /storage/v1//b/other/o/x HTTP/1.1\r\n\r\n\r\n\
         --b\r\nContent-Type: application/http\r\nContent-ID: <3>\r\n\r\nPOST /storage/v1/b/photos/o/x HTTP/1.1\r\nX-HTTP-Method-Override: DELETE\r\n\r\n\r\n--b--\r\n";
    let mut req = request(Method::POST, &sidecar.url("/batch/storage/v1"), full(body));
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("multipart/mixed; boundary=b"),
    );
    let answer = send(req).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.text().matches("HTTP/1.1 400 Bad Request").count(), 3);
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    let metrics = sidecar.metrics.encode();
    for reason in ["dot_segment", "empty_segment", "method_override"] {
        let line = format!("bucketmap_sidecar_refused_requests_total{{reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "no {line:?} in\n{metrics}");
    }
}
