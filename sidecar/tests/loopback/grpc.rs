//! The gRPC path in process: a raw HTTP/2 upstream that records what it
//! receives and answers raw gRPC frames, and an HTTP/2 client speaking h2c
//! to the sidecar. What the typed clients never send: gRPC over HTTP/1.1,
//! a refused later message of a client stream, statuses and trailers the
//! upstream writes with physical names.

use std::sync::{Arc, Mutex};

use bytes::{BufMut as _, Bytes, BytesMut};
use futures::SinkExt as _;
use googleapis_tonic_google_storage_v2::google::storage::v2 as proto;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version, header};
use http_body_util::BodyExt as _;
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost::Message as _;

use bucketmap_sidecar::body::{BoxError, ProxyBody, boxed, full};

use super::harness::*;

pub(crate) const GET_OBJECT: &str = "/google.storage.v2.Storage/GetObject";
const WRITE_OBJECT: &str = "/google.storage.v2.Storage/WriteObject";

/// `payload` as one gRPC message, with the compressed flag `compressed`.
fn frame(compressed: bool, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(payload.len() + 5);
    out.put_u8(u8::from(compressed));
    out.put_u32(u32::try_from(payload.len()).expect("small"));
    out.put_slice(payload);
    out.freeze()
}

pub(crate) fn framed(message: &impl prost::Message) -> Bytes {
    frame(false, &message.encode_to_vec())
}

/// `GetObject` of `photos/a`, by the logical name.
pub(crate) fn get_photos_a() -> proto::GetObjectRequest {
    proto::GetObjectRequest {
        bucket: "projects/_/buckets/photos".into(),
        object: "a".into(),
        ..Default::default()
    }
}

/// The payloads of the gRPC messages in `data`.
pub(crate) fn messages(mut data: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    while data.len() >= 5 {
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        out.push(Bytes::copy_from_slice(&data[5..5 + len]));
        data = &data[5 + len..];
    }
    out
}

pub(crate) fn grpc_request(path: &str, version: Version, body: ProxyBody) -> Request<ProxyBody> {
    let mut req = Request::new(body);
    *req.method_mut() = Method::POST;
    *req.version_mut() = version;
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    req.headers_mut()
        .insert(header::TE, HeaderValue::from_static("trailers"));
    req.headers_mut().insert(
        "x-goog-request-params",
        HeaderValue::from_static("bucket=projects%2F_%2Fbuckets%2Fphotos"),
    );
    *req.uri_mut() = path.parse().expect("a path");
    req
}

pub(crate) fn h2c() -> Client<hyper_util::client::legacy::connect::HttpConnector, ProxyBody> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// What a gRPC answer carried: status code, message, payloads.
pub(crate) struct GrpcAnswer {
    pub headers: HeaderMap,
    pub code: Option<i32>,
    pub message: String,
    pub payloads: Vec<Bytes>,
}

pub(crate) async fn call(sidecar: &Sidecar, mut req: Request<ProxyBody>) -> GrpcAnswer {
    let uri = format!("http://{}{}", sidecar.addr, req.uri().path());
    *req.uri_mut() = uri.parse().expect("a URL");
    let response = h2c().request(req).await.expect("an answer");
    let headers = response.headers().clone();
    let collected = response.into_body().collect().await.expect("the body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let status = if headers.contains_key("grpc-status") {
        &headers
    } else {
        &trailers
    };
    GrpcAnswer {
        code: status
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()?.parse().ok()),
        message: status
            .get("grpc-message")
            .map(|v| {
                percent_encoding::percent_decode(v.as_bytes())
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default(),
        payloads: messages(&collected.to_bytes()),
        headers,
    }
}

/// The request bodies an upstream read, or the errors that ended them.
pub(crate) type Bodies = Arc<Mutex<Vec<Result<Bytes, String>>>>;

/// An upstream answering `reply` (and `trailers`) to every call, keeping
/// the request bodies it read (or the error that ended them).
pub(crate) fn grpc_upstream(reply: Bytes, trailers: HeaderMap) -> (Handler, Bodies) {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    let handler = handler(move |req: Request<Incoming>| {
        let (reply, trailers, kept) = (reply.clone(), trailers.clone(), kept.clone());
        async move {
            let body = req.into_body().collect().await;
            let body = body.map(|c| c.to_bytes()).map_err(|e| e.to_string());
            kept.lock().expect("lock").push(body);
            let frames = futures::stream::iter([
                Ok::<_, BoxError>(Frame::data(reply)),
                Ok(Frame::trailers(trailers)),
            ]);
            let mut response = Response::new(boxed(http_body_util::StreamBody::new(frames)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            response
        }
    });
    (handler, bodies)
}

pub(crate) fn ok_trailers(message: &str) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t.insert(
        "grpc-message",
        HeaderValue::from_str(message).expect("ASCII"),
    );
    t
}

#[tokio::test]
async fn grpc_over_http1_is_refused_and_not_forwarded() {
    let (handler, bodies) = grpc_upstream(Bytes::new(), ok_trailers(""));
    let upstream = Upstream::start(handler).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let mut req = grpc_request(GET_OBJECT, Version::HTTP_11, full(framed(&get_photos_a())));
    *req.uri_mut() = sidecar.url(GET_OBJECT).parse().expect("a URL");
    let answer = send(req).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.headers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"3"[..])
    );
    assert!(upstream.seen().is_empty() && bodies.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn names_are_rewritten_both_ways_and_unknown_fields_kept() {
    let object = proto::Object {
        bucket: format!("projects/_/buckets/{PHYSICAL}"),
        name: "a".into(),
        ..Default::default()
    };
    // A field number the types do not define, after the known ones.
    let mut reply_payload = object.encode_to_vec();
    reply_payload.extend_from_slice(&[0xb8, 0x3e, 0x2a]); // field 999, varint 42
    let message = format!("served from {PHYSICAL}.");
    let (handler, bodies) = grpc_upstream(frame(false, &reply_payload), ok_trailers(&message));
    let upstream = Upstream::start(handler).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let mut payload = get_photos_a().encode_to_vec();
    payload.extend_from_slice(&[0xba, 0x3e, 0x03, b'x', b'y', b'z']); // field 999, bytes
    let req = grpc_request(GET_OBJECT, Version::HTTP_2, full(frame(false, &payload)));
    let answer = call(&sidecar, req).await;
    assert_eq!(answer.code, Some(0), "{}", answer.message);
    assert_eq!(answer.message, "served from photos.");
    // Upstream: the physical name, the unknown field byte for byte at the end.
    let received = bodies.lock().expect("lock")[0].clone().expect("a body");
    let received = messages(&received).remove(0);
    let seen = proto::GetObjectRequest::decode(received.clone()).expect("a request");
    assert_eq!(seen.bucket, format!("projects/_/buckets/{PHYSICAL}"));
    assert!(received.ends_with(&[0xba, 0x3e, 0x03, b'x', b'y', b'z']));
    let seen_params = upstream.seen()[0]
        .headers
        .get("x-goog-request-params")
        .cloned();
    let expected = format!("bucket=projects%2F_%2Fbuckets%2F{PHYSICAL}");
    assert_eq!(
        seen_params.as_ref().map(|v| v.as_bytes()),
        Some(expected.as_bytes())
    );
    // Client: the logical name, the unknown field kept.
    let got = answer.payloads[0].clone();
    assert_eq!(
        proto::Object::decode(got.clone())
            .expect("an object")
            .bucket,
        "projects/_/buckets/photos"
    );
    assert!(got.ends_with(&[0xb8, 0x3e, 0x2a]));
    assert!(answer.headers.get("grpc-accept-encoding").is_none());
}

#[tokio::test]
async fn a_refused_later_message_aborts_the_upstream_call() {
    let (handler, bodies) = grpc_upstream(Bytes::new(), ok_trailers(""));
    let upstream = Upstream::start(handler).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let (mut tx, body) = channel_body();
    let first = proto::WriteObjectRequest {
        first_message: Some(proto::write_object_request::FirstMessage::WriteObjectSpec(
            proto::WriteObjectSpec {
                resource: Some(proto::Object {
                    bucket: "projects/_/buckets/photos".into(),
                    name: "a".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    let later = proto::WriteObjectRequest {
        first_message: Some(proto::write_object_request::FirstMessage::UploadId(
            "projects/_/buckets/elsewhere/uploads/1".into(),
        )),
        ..Default::default()
    };
    let sender = tokio::spawn(async move {
        tx.send(Ok(Frame::data(framed(&first)))).await?;
        tx.send(Ok(Frame::data(framed(&later)))).await?;
        // The stream stays open: the sidecar must end the call itself.
        std::future::pending::<()>().await;
        Ok::<_, futures::channel::mpsc::SendError>(())
    });
    let req = grpc_request(WRITE_OBJECT, Version::HTTP_2, body);
    let answer = tokio::time::timeout(TIMEOUT, call(&sidecar, req))
        .await
        .expect("the sidecar ends the call");
    sender.abort();
    assert_eq!(answer.code, Some(5), "NOT_FOUND: {}", answer.message);
    assert!(answer.message.contains("elsewhere"), "{}", answer.message);
    // The upstream got the first message, then its stream was reset.
    upstream.wait_for_a_request().await;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while bodies.lock().expect("lock").is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let received = bodies.lock().expect("lock").clone();
    assert!(
        matches!(received.as_slice(), [Err(_)]),
        "the upstream's request stream must end in an error, not a clean end: {received:?}"
    );
}

/// A `GetObject` of `photos/a` sent gzip-compressed (`grpc-encoding: gzip`).
fn gzipped_get(encoding: &'static str) -> Request<ProxyBody> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&get_photos_a().encode_to_vec()).expect("gzip");
    let compressed = gz.finish().expect("gzip");
    let mut req = grpc_request(GET_OBJECT, Version::HTTP_2, full(frame(true, &compressed)));
    req.headers_mut()
        .insert("grpc-encoding", HeaderValue::from_static(encoding));
    req
}

#[tokio::test]
async fn gzip_request_messages_are_read_and_other_encodings_refused() {
    let (handler, bodies) = grpc_upstream(Bytes::new(), ok_trailers(""));
    let upstream = Upstream::start(handler).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    // An encoding the sidecar cannot read: refused, nothing forwarded.
    let answer = call(&sidecar, gzipped_get("snappy")).await;
    assert_eq!(answer.code, Some(12), "UNIMPLEMENTED: {}", answer.message);
    assert!(answer.message.contains("snappy"), "{}", answer.message);
    assert!(upstream.seen().is_empty());
    // gzip: decoded, rewritten, forwarded uncompressed.
    let answer = call(&sidecar, gzipped_get("gzip")).await;
    assert_eq!(answer.code, Some(0), "{}", answer.message);
    let received = bodies.lock().expect("lock")[0].clone().expect("a body");
    assert_eq!(received[0], 0, "forwarded uncompressed");
    let seen = proto::GetObjectRequest::decode(messages(&received).remove(0)).expect("a request");
    assert_eq!(seen.bucket, format!("projects/_/buckets/{PHYSICAL}"));
    // A compressed message on a stream that names no encoding is malformed.
    let mut req = gzipped_get("gzip");
    req.headers_mut().remove("grpc-encoding");
    let answer = call(&sidecar, req).await;
    assert_eq!(answer.code, Some(3), "INVALID_ARGUMENT: {}", answer.message);
    assert_eq!(upstream.seen().len(), 1, "only the gzip call went upstream");
}
