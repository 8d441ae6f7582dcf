//! The production shape of the upstream: TLS, as GCS speaks it. The sidecar
//! trusts a throwaway CA given with `--upstream-ca-file` (besides the
//! bundled roots), reaches the upstream over HTTP/1.1 for JSON and over
//! HTTP/2 (ALPN `h2`) for gRPC, and refuses an upstream it cannot verify.

use http::{Request, Version};
use hyper::body::Incoming;
use prost::Message as _;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

use googleapis_tonic_google_storage_v2::google::storage::v2 as proto;

use bucketmap_sidecar::body::full;
use bucketmap_sidecar::config::UpstreamHttp;

use super::grpc::{
    GET_OBJECT, call, framed, get_photos_a, grpc_request, grpc_upstream, ok_trailers,
};
use super::harness::*;

/// A CA (PEM) and a server configuration for `localhost` signed by it.
fn throwaway_ca() -> (String, rustls::ServerConfig) {
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("a key"))
        .expect("the CA");
    let key = KeyPair::generate().expect("a key");
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("the certificate");
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("a key");
    let mut server = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], der)
    .expect("the server configuration");
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca.pem(), server)
}

/// `ca_pem` written to a file for `--upstream-ca-file` (in the returned
/// directory, which must outlive the sidecar).
fn ca_file(ca_pem: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("ca.pem");
    std::fs::write(&file, ca_pem).expect("the CA file");
    (dir, file)
}

/// JSON requests get the echo handler's object; gRPC calls an Object
/// naming the physical bucket.
fn handler_for_both() -> Handler {
    let object = proto::Object {
        bucket: format!("projects/_/buckets/{PHYSICAL}"),
        name: "a".into(),
        ..Default::default()
    };
    let (grpc, _) = grpc_upstream(framed(&object), ok_trailers(""));
    let json = echo_object_handler();
    handler(move |req: Request<Incoming>| {
        let is_grpc = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        if is_grpc { grpc(req) } else { json(req) }
    })
}

fn get_object() -> Request<bucketmap_sidecar::body::ProxyBody> {
    grpc_request(GET_OBJECT, Version::HTTP_2, full(framed(&get_photos_a())))
}

#[tokio::test]
async fn a_tls_upstream_trusted_through_the_ca_file_serves_json_and_grpc() {
    let (ca_pem, server) = throwaway_ca();
    let (_dir, ca_file) = ca_file(&ca_pem);
    let upstream = Upstream::start_tls(handler_for_both(), server).await;
    let options = Options {
        upstream_ca_file: Some(ca_file),
        ..Options::default()
    };
    let sidecar = Sidecar::start(&upstream, options).await;
    let json = sidecar.get("/storage/v1/b/photos/o/a").await;
    assert_eq!(json.status, 200, "{}", json.text());
    assert_eq!(json.json()["bucket"], "photos");
    let answer = call(&sidecar, get_object()).await;
    assert_eq!(answer.code, Some(0), "{}", answer.message);
    let object = proto::Object::decode(answer.payloads[0].clone()).expect("an object");
    assert_eq!(object.bucket, "projects/_/buckets/photos");
    // JSON goes over whichever ALPN picks (GCS and this upstream prefer
    // h2); gRPC over HTTP/2 only.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].version, Version::HTTP_2);
}

#[tokio::test]
async fn an_upstream_the_sidecar_cannot_verify_is_refused() {
    let (_, server) = throwaway_ca();
    let upstream = Upstream::start_tls(handler_for_both(), server).await;
    let sidecar = Sidecar::start(&upstream, Options::default()).await;
    let json = sidecar.get("/storage/v1/b/photos/o/a").await;
    assert_eq!(json.status, 502, "{}", json.text());
    // Both answers say why, down to the TLS failure.
    assert!(json.text().contains("certificate"), "{}", json.text());
    let answer = call(&sidecar, get_object()).await;
    assert_eq!(answer.code, Some(14), "UNAVAILABLE: {}", answer.message);
    assert!(answer.message.contains("certificate"), "{}", answer.message);
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn the_upstream_http_version_is_the_one_asked_for() {
    let (ca_pem, server) = throwaway_ca();
    let (_dir, ca_file) = ca_file(&ca_pem);
    for (asked, spoken) in [
        (UpstreamHttp::Auto, Version::HTTP_2),
        (UpstreamHttp::Http1, Version::HTTP_11),
        (UpstreamHttp::Http2, Version::HTTP_2),
    ] {
        let upstream = Upstream::start_tls(handler_for_both(), server.clone()).await;
        let options = Options {
            upstream_ca_file: Some(ca_file.clone()),
            upstream_http: asked,
            ..Options::default()
        };
        let sidecar = Sidecar::start(&upstream, options).await;
        for _ in 0..2 {
            let json = sidecar.get("/storage/v1/b/photos/o/a").await;
            assert_eq!(json.status, 200, "{asked:?}: {}", json.text());
        }
        let versions: Vec<Version> = upstream.seen().iter().map(|r| r.version).collect();
        assert_eq!(versions, [spoken, spoken], "{asked:?}");
    }
}
