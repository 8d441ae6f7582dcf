//! Translation: JSON and XML metadata, links, method overrides, gzip
//! bodies, resumable sessions, credentials and batches, through the proxy.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use bucketmap_sidecar::auth::Auth;
use bucketmap_sidecar::body::{ProxyBody, empty, full};

use super::harness::*;

#[tokio::test]
async fn json_metadata_is_translated_both_ways() {
    let upstream = Upstream::start(echo_object_handler()).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let target = "/storage/v1/b/photos/o/photos-k3x9q2mw%2Fphotos%2Fa%20b.jpg?projection=full";
    let answer = sidecar.get(target).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let seen = upstream.seen();
    assert_eq!(
        seen[0].target,
        "/storage/v1/b/photos-k3x9q2mw/o/photos-k3x9q2mw%2Fphotos%2Fa%20b.jpg?projection=full"
    );
    let doc = answer.json();
    assert_eq!(doc["bucket"], "photos");
    assert_eq!(
        doc["name"], "photos-k3x9q2mw/photos/a b.jpg",
        "object names are untouched"
    );
    assert_eq!(doc["id"], "photos/photos-k3x9q2mw/photos/a b.jpg/1");
    let base = format!("http://{}", sidecar.addr);
    assert_eq!(
        doc["selfLink"],
        format!("{base}/storage/v1/b/photos/o/photos-k3x9q2mw%2Fphotos%2Fa%20b.jpg")
    );
    assert_eq!(
        doc["mediaLink"],
        format!(
            "{base}/download/storage/v1/b/photos/o/photos-k3x9q2mw%2Fphotos%2Fa%20b.jpg?generation=1&alt=media"
        )
    );
    assert_eq!(
        answer
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()),
        Some(answer.body.len().to_string()).as_deref()
    );
}

/// A POST with `X-HTTP-Method-Override: PATCH` (Google's Java client on
/// `HttpURLConnection`) is routed and forwarded as the PATCH it stands for.
#[tokio::test]
async fn a_method_override_on_post_is_honoured() {
    let methods = Arc::new(Mutex::new(Vec::new()));
    let record = methods.clone();
    let upstream = Upstream::start(handler(move |req: Request<Incoming>| {
        let record = record.clone();
        async move {
            let override_sent = req.headers().contains_key("x-http-method-override");
            let method = req.method().clone();
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            record.lock().expect("lock").push((
                method,
                override_sent,
                String::from_utf8_lossy(&body).into_owned(),
            ));
            json_response(
                StatusCode::OK,
                object("https://storage.googleapis.com", PHYSICAL, "x", "x"),
            )
        }
    }))
    .await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let mut req = request(
        Method::POST,
        &sidecar.url("/storage/v1/b/photos/o/x"),
        full(r#"{"bucket":"photos","metadata":{"a":"b"}}"#),
    );
    req.headers_mut()
        .insert("x-http-method-override", HeaderValue::from_static("PATCH"));
    let answer = send(req).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.json()["bucket"], "photos");
    let methods = methods.lock().expect("lock").clone();
    assert_eq!(methods.len(), 1);
    assert_eq!(methods[0].0, Method::PATCH);
    assert!(!methods[0].1, "the override header is not forwarded");
    assert!(methods[0].2.contains(PHYSICAL), "{}", methods[0].2);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).expect("gzip");
    encoder.finish().expect("gzip")
}

/// What a recording upstream saw: content encoding and the body.
type Recorded = Arc<Mutex<Vec<(Option<HeaderValue>, Bytes)>>>;

/// An upstream that records bodies and answers an object resource,
/// gzip-compressed when the path ends in `gz`.
fn recording_upstream(recorded: Recorded) -> Handler {
    handler(move |req: Request<Incoming>| {
        let recorded = recorded.clone();
        async move {
            let gz = req.uri().path().ends_with("gz");
            let encoding = req.headers().get(header::CONTENT_ENCODING).cloned();
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            recorded
                .lock()
                .expect("lock")
                .push((encoding, body.unwrap_or_default()));
            let doc = object("https://storage.googleapis.com", PHYSICAL, "gz", "gz");
            if !gz {
                return json_response(StatusCode::OK, doc);
            }
            let mut response = Response::new(full(gzip(doc.to_string().as_bytes())));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            response
        }
    })
}

/// `method target` with a gzip body of `content_type`.
fn gzipped(
    sidecar: &Sidecar,
    method: Method,
    target: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Request<ProxyBody> {
    let mut req = request(method, &sidecar.url(target), full(body));
    let headers = req.headers_mut();
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    headers.insert(header::CONTENT_TYPE, content_type.parse().expect("type"));
    req
}

/// What the recording upstream saw since the last call.
fn take(recorded: &Recorded) -> Vec<(Option<HeaderValue>, Bytes)> {
    recorded.lock().expect("lock").drain(..).collect()
}

/// A `multipart/related` upload (boundary `b`) of `data` into `photos`.
fn multipart_upload(data: &[u8]) -> Vec<u8> {
    let mut multipart = b"--b\r\nContent-Type: application/json\r\n\r\n{\"name\":\"o\",\"bucket\":\"photos\"}\r\n--b\r\nContent-Type: application/octet-stream\r\n\r\n".to_vec();
    multipart.extend_from_slice(data);
    multipart.extend_from_slice(b"\r\n--b--\r\n");
    multipart
}

/// Truncated or non-gzip bodies declared gzip: a 400 naming gzip. `target`
/// takes multipart uploads.
async fn corrupt_gzip_is_refused(sidecar: &Sidecar, target: &str, multipart: &[u8]) {
    let truncated_json = gzip(br#"{"bucket":"photos"}"#);
    let truncated_json = truncated_json[..truncated_json.len() - 5].to_vec();
    let mut truncated_upload = gzip(multipart);
    truncated_upload.truncate(truncated_upload.len() - 100);
    for (method, target, content_type, body) in [
        (
            Method::PATCH,
            "/storage/v1/b/photos/o/x",
            "application/json",
            truncated_json,
        ),
        (
            Method::PATCH,
            "/storage/v1/b/photos/o/x",
            "application/json",
            b"not gzip".to_vec(),
        ),
        (
            Method::POST,
            target,
            "multipart/related; boundary=b",
            truncated_upload,
        ),
    ] {
        let answer = send(gzipped(sidecar, method.clone(), target, content_type, body)).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{method} {target}: {}",
            answer.text()
        );
        assert!(answer.text().contains("gzip"), "{}", answer.text());
    }
}

/// A gzip media upload is object data: forwarded as it is, still gzip.
async fn gzip_media_passes_as_is(sidecar: &Sidecar, recorded: &Recorded, data: &[u8]) {
    let packed = gzip(data);
    let mut req = gzipped(
        sidecar,
        Method::POST,
        "/upload/storage/v1/b/photos/o?uploadType=media&name=o",
        "application/octet-stream",
        packed.clone(),
    );
    req.headers_mut().remove(header::CONTENT_TYPE);
    let answer = send(req).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let seen = take(recorded);
    assert_eq!(seen[0].0.as_ref().map(|v| v.as_bytes()), Some(&b"gzip"[..]));
    assert_eq!(&seen[0].1[..], &packed[..], "media is never decoded");
}

/// Google's Java client gzips metadata bodies and multipart uploads: they are
/// decoded, rewritten and forwarded uncompressed; object data is never decoded
/// (a gzip media upload passes as it is); corrupt gzip is a 400, never a 502;
/// a gzip metadata response reaches the client decoded and rewritten.
#[tokio::test]
async fn gzip_bodies_are_decoded_before_rewriting() {
    let recorded: Recorded = Arc::new(Mutex::new(Vec::new()));
    let upstream = Upstream::start(recording_upstream(recorded.clone())).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let gzipped = |method: Method, target: &str, content_type: &str, body: Vec<u8>| {
        gzipped(&sidecar, method, target, content_type, body)
    };
    let take = || take(&recorded);

    let answer = send(gzipped(
        Method::PATCH,
        "/storage/v1/b/photos/o/x",
        "application/json",
        gzip(br#"{"bucket":"photos","metadata":{"k":"v"}}"#),
    ))
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let seen = take();
    assert_eq!(seen[0].0, None, "forwarded uncompressed");
    assert_eq!(
        &seen[0].1[..],
        br#"{"bucket":"photos-k3x9q2mw","metadata":{"k":"v"}}"#
    );

    let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let multipart = multipart_upload(&data);
    let target = "/upload/storage/v1/b/photos/o?uploadType=multipart";
    let answer = send(gzipped(
        Method::POST,
        target,
        "multipart/related; boundary=b",
        gzip(&multipart),
    ))
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let seen = take();
    assert_eq!(seen[0].0, None, "forwarded uncompressed");
    let forwarded = &seen[0].1;
    let text = String::from_utf8_lossy(forwarded);
    assert!(
        text.contains(r#""bucket":"photos-k3x9q2mw""#),
        "metadata rewritten"
    );
    assert!(
        forwarded.windows(data.len()).any(|w| w == &data[..]),
        "object data forwarded byte for byte"
    );

    gzip_media_passes_as_is(&sidecar, &recorded, &data).await;

    corrupt_gzip_is_refused(&sidecar, target, &multipart).await;
    take();

    let answer = sidecar.get("/storage/v1/b/photos/o/gz").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert!(answer.headers.get(header::CONTENT_ENCODING).is_none());
    assert_eq!(answer.json()["bucket"], "photos");
}

#[tokio::test]
async fn physical_names_pass_when_allowed() {
    let upstream = Upstream::start(echo_object_handler()).await;
    let sidecar = Sidecar::start(
        &upstream,
        Options {
            allow_physical: true,
            ..Options::default()
        },
    )
    .await;
    let answer = sidecar.get("/storage/v1/b/photos-k3x9q2mw/o/x").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        upstream.seen()[0].target,
        "/storage/v1/b/photos-k3x9q2mw/o/x"
    );
}

#[tokio::test]
async fn resumable_sessions_stay_behind_the_proxy() {
    let upstream = Upstream::start(handler(|req: Request<Incoming>| async move {
        let upstream_host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default().to_owned();
        if req.uri().query().is_some_and(|q| q.contains("upload_id")) {
            let mut body = req.into_body();
            while let Some(Ok(_)) = body.frame().await {}
            return json_response(StatusCode::OK, object("https://storage.googleapis.com", PHYSICAL, "x", "x"));
        }
        let mut response = Response::new(empty());
        let location = format!("http://{upstream_host}/upload/storage/v1/b/{PHYSICAL}/o?uploadType=resumable&name=x&upload_id=ABC");
        response.headers_mut().insert(header::LOCATION, HeaderValue::from_str(&location).expect("location"));
        response
    }))
    .await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let mut init = request(
        Method::POST,
        &sidecar.url("/upload/storage/v1/b/photos/o?uploadType=resumable&name=x"),
        full(r#"{"name":"x","bucket":"photos"}"#),
    );
    init.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let answer = send(init).await;
    let location = answer
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        location,
        sidecar.url("/upload/storage/v1/b/photos/o?uploadType=resumable&name=x&upload_id=ABC")
    );
    let answer = send(request(Method::PUT, &location, full("data"))).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["bucket"], "photos");
    let seen = upstream.seen();
    assert_eq!(
        seen[1].target,
        format!("/upload/storage/v1/b/{PHYSICAL}/o?uploadType=resumable&name=x&upload_id=ABC")
    );
}

/// Links point at the address the client connected to, whatever `Host`
/// says: a `Host` without a port (the Rust SDK's) or naming another host
/// still gives a session URL that reaches the sidecar; `--advertise-url`
/// replaces it when set.
#[tokio::test]
async fn links_reach_the_sidecar_whatever_the_host_header_says() {
    let upstream = Upstream::start(handler(resumable_session_upstream)).await;
    let advertised: http::Uri = "https://sidecar.example:8443".parse().expect("uri");
    let plain = Sidecar::start(&upstream, Options::default()).await;
    let advertising = Sidecar::start(
        &upstream,
        Options {
            advertise_url: Some(advertised),
            ..Options::default()
        },
    )
    .await;
    let tail = "/upload/storage/v1/b/photos/o?uploadType=resumable&upload_id=ABC";
    let cases = [
        (&plain, Some("127.0.0.1"), plain.url(tail)),
        (&plain, Some("attacker.example:1234"), plain.url(tail)),
        (&plain, None, plain.url(tail)),
        (
            &advertising,
            Some("127.0.0.1"),
            format!("https://sidecar.example:8443{tail}"),
        ),
    ];
    for (sidecar, host, want) in cases {
        let mut init = request(
            Method::POST,
            &sidecar.url("/upload/storage/v1/b/photos/o?uploadType=resumable&name=x"),
            full(r#"{"name":"x"}"#),
        );
        if let Some(host) = host {
            init.headers_mut()
                .insert(header::HOST, HeaderValue::from_static(host));
        }
        let answer = send(init).await;
        let location = answer
            .headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert_eq!(location, want, "Host {host:?}");
    }
    // The session URL given for a port-less Host works.
    let answer = send(request(Method::PUT, &plain.url(tail), full("data"))).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
}

/// Without `--advertise-url`, links point at the local address of the
/// connection the request came on, not at the configured listen address:
/// with `--listen 127.0.0.2:0` (an ephemeral port) and a `Host` naming
/// neither address nor port, the session URL still names 127.0.0.2 and the
/// port the client connected to, and it works.
#[tokio::test]
async fn links_name_the_address_the_client_connected_to() {
    let upstream = Upstream::start(handler(resumable_session_upstream)).await;
    let sidecar = Sidecar::start(
        &upstream,
        Options {
            bind: "127.0.0.2:0",
            configured_listen: Some("127.0.0.2:0".parse().expect("addr")),
            ..Options::default()
        },
    )
    .await;
    assert_eq!(sidecar.addr.ip().to_string(), "127.0.0.2");
    let tail = "/upload/storage/v1/b/photos/o?uploadType=resumable&upload_id=ABC";
    let mut init = request(
        Method::POST,
        &sidecar.url("/upload/storage/v1/b/photos/o?uploadType=resumable&name=x"),
        full(r#"{"name":"x"}"#),
    );
    init.headers_mut()
        .insert(header::HOST, HeaderValue::from_static("localhost"));
    let answer = send(init).await;
    let location = answer
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(location, sidecar.url(tail));
    let answer = send(request(Method::PUT, &location, full("data"))).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.json()["bucket"], "photos");
}

/// An upstream that opens a resumable session (`Location` at GCS's host)
/// and completes it on the first PUT.
async fn resumable_session_upstream(req: Request<Incoming>) -> Response<ProxyBody> {
    if req.uri().query().is_some_and(|q| q.contains("upload_id")) {
        return json_response(
            StatusCode::OK,
            object("https://storage.googleapis.com", PHYSICAL, "x", "x"),
        );
    }
    let mut response = Response::new(empty());
    let location = format!(
        "https://storage.googleapis.com/upload/storage/v1/b/{PHYSICAL}/o?uploadType=resumable&upload_id=ABC"
    );
    response.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&location).expect("location"),
    );
    response
}

#[tokio::test]
async fn xml_api_path_and_virtual_hosted_styles() {
    let upstream = Upstream::start(handler(|req: Request<Incoming>| async move {
        if req.uri().path() == format!("/{PHYSICAL}") {
            let xml = format!("<?xml version='1.0' encoding='UTF-8'?><ListBucketResult><Name>{PHYSICAL}</Name><Contents><Key>{PHYSICAL}</Key></Contents></ListBucketResult>");
            let mut response = Response::new(full(xml));
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/xml"));
            return response;
        }
        let mut response = Response::new(full("<data/>"));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/xml"));
        response
    }))
    .await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let list = sidecar.get("/photos?prefix=a").await;
    assert_eq!(
        list.text(),
        format!(
            "<?xml version='1.0' encoding='UTF-8'?><ListBucketResult><Name>photos</Name><Contents><Key>{PHYSICAL}</Key></Contents></ListBucketResult>"
        )
    );
    let object = sidecar.get("/photos/a/b.xml").await;
    assert_eq!(object.text(), "<data/>", "object data is never rewritten");

    let mut vhost = request(Method::GET, &sidecar.url("/a/b.xml"), empty());
    vhost
        .headers_mut()
        .insert(header::HOST, HeaderValue::from_static("photos.localhost"));
    let answer = send(vhost).await;
    assert_eq!(answer.status, StatusCode::OK);
    let mut copy = request(Method::PUT, &sidecar.url("/photos/dst"), empty());
    copy.headers_mut().insert(
        "x-goog-copy-source",
        HeaderValue::from_static("/logs/src%2Fa"),
    );
    let _ = send(copy).await;
    let seen = upstream.seen();
    assert_eq!(seen[0].target, format!("/{PHYSICAL}?prefix=a"));
    assert_eq!(seen[1].target, format!("/{PHYSICAL}/a/b.xml"));
    assert_eq!(seen[2].target, format!("/{PHYSICAL}/a/b.xml"));
    assert_eq!(
        seen[2]
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok()),
        Some(upstream.addr.to_string()).as_deref()
    );
    assert_eq!(
        seen[3]
            .headers
            .get("x-goog-copy-source")
            .and_then(|h| h.to_str().ok()),
        Some("/logs-aaaa1111/src%2Fa")
    );
}

#[tokio::test]
async fn credentials_are_added_only_when_the_client_sends_none() {
    let upstream = Upstream::start(echo_object_handler()).await;
    let mut headers = http::HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("Bearer from-adc"),
    );
    let sidecar = Sidecar::start(
        &upstream,
        Options {
            auth: Auth::Static(headers),
            ..Options::default()
        },
    )
    .await;
    let _ = sidecar.get("/storage/v1/b/photos/o/x").await;
    let mut own = request(
        Method::GET,
        &sidecar.url("/storage/v1/b/photos/o/x"),
        empty(),
    );
    own.headers_mut().insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("Bearer the-apps-own"),
    );
    let _ = send(own).await;
    let seen = upstream.seen();
    let auth = |i: usize| {
        seen[i]
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(auth(0).as_deref(), Some("Bearer from-adc"));
    assert_eq!(auth(1).as_deref(), Some("Bearer the-apps-own"));
}

#[tokio::test]
async fn batch_requests_are_translated_part_by_part() {
    let upstream = Upstream::start(handler(|req: Request<Incoming>| async move {
        let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        let text = String::from_utf8_lossy(&body).into_owned();
        // Answer each forwarded part with the object it named.
        let mut out = String::new();
        for id in ["1", "3"] {
            if text.contains(&format!("<b+{id}>")) {
                let obj = object("https://storage.googleapis.com", PHYSICAL, "x", "x").to_string();
                out.push_str(&format!(
                    "--resp\r\nContent-Type: application/http\r\nContent-ID: <response-b+{id}>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{obj}\r\n",
                    obj.len()
                ));
            }
        }
        out.push_str("--resp--\r\n");
        let mut response = Response::new(full(out));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("multipart/mixed; boundary=resp"));
        response
    }))
    .await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let body = format!(
        "--b\r\nContent-Type: application/http\r\nContent-ID: <b+1>\r\n\r\nGET {} HTTP/1.1\r\n\r\n\r\n\
         --b\r\nContent-Type: application/http\r\nContent-ID: <b+2>\r\n\r\nGET /storage/v1/b/nope/o/x HTTP/1.1\r\n\r\n\r\n\
         --b\r\nContent-Type: application/http\r\nContent-ID: <b+3>\r\n\r\nDELETE /storage/v1/b/photos/o/y HTTP/1.1\r\n\r\n\r\n--b--\r\n",
        sidecar.url("/storage/v1/b/photos/o/x")
    );
    let mut req = request(Method::POST, &sidecar.url("/batch/storage/v1"), full(body));
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("multipart/mixed; boundary=b"),
    );
    let answer = send(req).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let text = answer.text();
    assert!(!text.contains(PHYSICAL), "{text}");
    assert!(text.contains("\"bucket\":\"photos\""), "{text}");
    assert!(
        text.contains("<response-b+2>") && text.contains("HTTP/1.1 404 Not Found"),
        "{text}"
    );
    let positions: Vec<usize> = ["b+1", "b+2", "b+3"]
        .iter()
        .filter_map(|id| text.find(&format!("response-{id}")))
        .collect();
    assert!(
        positions.len() == 3 && positions.windows(2).all(|w| w[0] < w[1]),
        "{text}"
    );
}

/// What the upstream answers for each target, by the path it receives.
fn answering(answers: Vec<(String, u16, &'static str, String)>) -> Handler {
    let answers = Arc::new(answers);
    handler(move |req: Request<Incoming>| {
        let answers = answers.clone();
        async move {
            let target = req.uri().to_string();
            let (_, status, content_type, body) = answers
                .iter()
                .find(|(path, ..)| target.starts_with(path.as_str()))
                .cloned()
                .unwrap_or_else(|| {
                    (
                        String::new(),
                        500,
                        "text/plain",
                        format!("no answer for {target}"),
                    )
                });
            let mut response = Response::new(full(body));
            *response.status_mut() = StatusCode::from_u16(status).expect("status");
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        }
    })
}

/// The upstream's answers for the fail-closed test: by target, a status, a
/// content type and a body (all but `fine` unreadable).
fn unreadable_answers() -> Vec<(String, u16, &'static str, String)> {
    let json = "application/json; charset=UTF-8";
    let xml = "application/xml";
    let object = |name: &str| format!("/storage/v1/b/{PHYSICAL}/o/{name}");
    vec![
        (
            object("truncated"),
            200,
            json,
            format!(r#"{{"bucket":"{PHYSICAL}","name":"tr"#),
        ),
        (object("array"), 200, json, format!(r#"["{PHYSICAL}"]"#)),
        (object("null"), 200, json, "null\n".to_owned()),
        (
            object("html"),
            404,
            json,
            format!("<html>No such bucket {PHYSICAL}</html>"),
        ),
        (
            object("fine"),
            200,
            json,
            format!(r#"{{"bucket":"{PHYSICAL}","name":"fine"}}"#),
        ),
        (
            format!("/{PHYSICAL}?prefix=bad"),
            200,
            xml,
            format!("<ListBucketResult><Name>{PHYSICAL}</Name>"),
        ),
        (
            format!("/{PHYSICAL}?prefix=err"),
            403,
            xml,
            format!("<Error><Message>{PHYSICAL} denied</Message"),
        ),
    ]
}

/// Fail closed: a JSON or XML answer the sidecar cannot read as a resource
/// is never forwarded as it came. A success that is not well-formed becomes
/// a GCS-style 502; an error, or JSON of another shape (the emulator answers
/// a delete with `null`), keeps its status with bucket names translated as
/// in a text error.
#[tokio::test]
async fn metadata_answers_that_cannot_be_read_are_never_forwarded_as_they_came() {
    let upstream = Upstream::start(answering(unreadable_answers())).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    for (target, status) in [
        ("/storage/v1/b/photos/o/truncated", 502),
        ("/storage/v1/b/photos/o/array", 200),
        ("/storage/v1/b/photos/o/html", 404),
        ("/photos?prefix=bad", 502),
        ("/photos?prefix=err", 403),
    ] {
        let answer = sidecar.get(target).await;
        assert_eq!(
            answer.status.as_u16(),
            status,
            "{target}: {}",
            answer.text()
        );
        assert!(
            !answer.text().contains(PHYSICAL),
            "{target}: {}",
            answer.text()
        );
        if status == 502 && target.starts_with("/storage/") {
            assert_eq!(
                answer.json()["error"]["code"],
                502,
                "{target}: JSON API error"
            );
        } else if status == 502 {
            let text = answer.text();
            assert!(
                text.contains("<Error><Code>"),
                "{target}: XML API error: {text}"
            );
        } else {
            assert!(
                answer.text().contains("photos"),
                "{target}: {}",
                answer.text()
            );
        }
    }
    let null = sidecar.get("/storage/v1/b/photos/o/null").await;
    assert_eq!((null.status.as_u16(), null.text().trim()), (200, "null"));
    let fine = sidecar.get("/storage/v1/b/photos/o/fine").await;
    assert_eq!(fine.status, StatusCode::OK);
    assert_eq!(fine.json()["bucket"], "photos");
}
