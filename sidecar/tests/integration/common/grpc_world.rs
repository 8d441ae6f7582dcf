//! One gRPC test's world: the in-repo mock GCS holding the physical
//! buckets, the sidecar in front of it (`--grpc-upstream`), and the raw
//! tools the negative and wire-level tests need: a tonic channel with a
//! byte-for-byte codec (any method path, any message bytes) and a tiny h2c
//! upstream of our own that records the raw request and answers a fixed
//! message.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use bucketmap_testkit::mock_gcs::{MockGcs, proto};
use bytes::{Buf, BufMut, Bytes};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::http::Request;
use super::procs::{Sidecar, log_tail};

/// The project the mock's buckets live in.
pub const PROJECT: &str = "acme-staging";
/// logical → physical, as the operator would publish it.
pub const MAP: [(&str, &str); 2] = [("photos", "photos-k3x9q2mw"), ("videos", "videos-a1b2c3d4")];
/// A physical bucket of another environment, in the same upstream: never
/// reachable through the sidecar.
pub const FORBIDDEN: &str = "photos-j7h6g5f4";

/// `projects/_/buckets/{id}`, the v2 API's bucket resource name.
pub fn bucket_name(id: &str) -> String {
    format!("projects/_/buckets/{id}")
}

/// The physical bucket id of `logical` in [`MAP`].
pub fn physical(logical: &str) -> &'static str {
    MAP.iter()
        .find(|(l, _)| *l == logical)
        .map(|(_, p)| *p)
        .unwrap_or_else(|| panic!("{logical} is not in the test map"))
}

/// Every physical bucket id the mock holds.
pub fn all_physical() -> Vec<&'static str> {
    let mut all: Vec<&str> = MAP.iter().map(|(_, p)| *p).collect();
    all.push(FORBIDDEN);
    all
}

/// The mock GCS with the mapped and the forbidden buckets, and the sidecar.
pub struct GrpcWorld {
    dir: TempDir,
    pub mock: MockGcs,
    pub sidecar: Sidecar,
}

impl GrpcWorld {
    /// Starts the mock and a sidecar with `--map` for [`MAP`],
    /// `--grpc-upstream` the mock, and `extra_args`.
    pub async fn start(name: &str, extra_args: &[&str]) -> Result<GrpcWorld> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("bucketmap-grpc-{name}-"))
            .tempdir()?;
        let mock = MockGcs::start()
            .await
            .context("cannot start the mock GCS")?;
        for id in all_physical() {
            let bucket = proto::Bucket {
                bucket_id: id.to_owned(),
                ..Default::default()
            };
            mock.handle().insert_bucket(PROJECT, bucket)?;
        }
        let sidecar = start_sidecar(dir.path(), &mock.endpoint(), extra_args).await?;
        Ok(GrpcWorld { dir, mock, sidecar })
    }

    /// The test's directory (logs, client reports).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where gRPC clients connect: the sidecar's listener.
    pub fn endpoint(&self) -> String {
        self.sidecar.url()
    }

    /// A tonic channel to the sidecar (h2c).
    pub async fn channel(&self) -> Result<Channel> {
        channel_to(&self.endpoint()).await
    }

    /// The generated `google.storage.v2.Storage` client, through the sidecar.
    pub async fn storage(&self) -> Result<proto::storage_client::StorageClient<Channel>> {
        Ok(proto::storage_client::StorageClient::new(
            self.channel().await?,
        ))
    }

    /// Log tails and where the files are, for failure messages.
    pub fn diagnostics(&self) -> String {
        format!(
            "{}\ntest files: {}",
            log_tail(&self.sidecar.proc.log, 60),
            self.dir.path().display()
        )
    }

    /// Keeps the test's files when `BUCKETMAP_TEST_KEEP` is set.
    pub fn keep_if_asked(&mut self) {
        if std::env::var_os("BUCKETMAP_TEST_KEEP").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("kept {}", self.dir.path().display());
        }
    }
}

/// Starts the sidecar with [`MAP`] in front of the gRPC upstream `upstream`
/// (also its HTTP upstream: only gRPC is exercised) and `extra_args`.
pub async fn start_sidecar(log_dir: &Path, upstream: &str, extra_args: &[&str]) -> Result<Sidecar> {
    let mut args: Vec<String> = vec!["--grpc-upstream".into(), upstream.to_owned()];
    for (logical, physical) in MAP {
        args.push("--map".into());
        args.push(format!("{logical}={physical}"));
    }
    args.extend(extra_args.iter().map(|a| (*a).to_owned()));
    let (log_dir, upstream) = (log_dir.to_owned(), upstream.to_owned());
    tokio::task::spawn_blocking(move || Sidecar::start(&log_dir, &upstream, &args))
        .await
        .context("the sidecar starter panicked")?
}

/// A tonic channel to `endpoint` (`http://127.0.0.1:PORT`, h2c).
pub async fn channel_to(endpoint: &str) -> Result<Channel> {
    tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .with_context(|| format!("bad endpoint {endpoint}"))?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))
}

/// The sidecar's `/_bucketmap/metrics` text.
pub async fn metrics(sidecar: &Sidecar) -> Result<String> {
    let addr = sidecar.addr;
    let resp = tokio::task::spawn_blocking(move || Request::get("/_bucketmap/metrics").send(addr))
        .await
        .context("the metrics reader panicked")??;
    if resp.status != 200 {
        bail!("GET /_bucketmap/metrics: {}", resp.summary());
    }
    Ok(resp.text())
}

/// The value of the sample of `metric` carrying every label in `labels`
/// (`name="value"` pairs, any order), if there is one.
pub fn sample(text: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A gRPC codec that passes message bytes as they are: requests the
/// generated types cannot express (unknown fields, truncated messages,
/// methods that do not exist) and responses read byte for byte.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let len = src.remaining();
        Ok(Some(src.copy_to_bytes(len)))
    }
}

/// A unary call of `path` (`/package.Service/Method`) with the message
/// bytes `message` and the metadata `metadata`, over `channel`.
pub async fn raw_unary(
    channel: Channel,
    path: &str,
    message: Bytes,
    metadata: &[(&'static str, &str)],
) -> Result<tonic::Response<Bytes>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("channel not ready: {e}")))?;
    let path = http::uri::PathAndQuery::try_from(path)
        .map_err(|e| Status::internal(format!("bad path {path}: {e}")))?;
    let mut request = tonic::Request::new(message);
    for (name, value) in metadata {
        let value = value
            .parse()
            .map_err(|e| Status::internal(format!("bad {name} value {value:?}: {e}")))?;
        request.metadata_mut().insert(*name, value);
    }
    grpc.unary(request, path, RawCodec).await
}

/// A gRPC message in its length-prefixed frame (uncompressed).
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// The messages of a gRPC body (uncompressed frames only).
pub fn grpc_messages(mut body: &[u8]) -> Result<Vec<Bytes>> {
    let mut out = Vec::new();
    while !body.is_empty() {
        if body.len() < 5 || body[0] != 0 {
            bail!("not an uncompressed gRPC frame: {body:?}");
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let rest = &body[5..];
        if rest.len() < len {
            bail!("a frame of {len} bytes, {} left", rest.len());
        }
        out.push(Bytes::copy_from_slice(&rest[..len]));
        body = &rest[len..];
    }
    Ok(out)
}

/// A request the raw upstream received.
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub path: String,
    pub headers: http::HeaderMap,
    /// The request body as it arrived (gRPC frames).
    pub body: Bytes,
}

/// A tiny h2c gRPC server of our own: records every request raw and
/// answers each with the same message bytes and `grpc-status: 0`.
pub struct RawUpstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<RawRequest>>>,
    task: JoinHandle<()>,
}

impl RawUpstream {
    /// Listens on a free loopback port; every call is answered `answer`.
    pub async fn start(answer: Bytes) -> Result<RawUpstream> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the raw upstream")?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(accept_loop(listener, seen.clone(), answer));
        Ok(RawUpstream { addr, seen, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<RawRequest> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    seen: Arc<Mutex<Vec<RawRequest>>>,
    answer: Bytes,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let (seen, answer) = (seen.clone(), answer.clone());
        let service =
            hyper::service::service_fn(move |req| respond(req, seen.clone(), answer.clone()));
        tokio::spawn(async move {
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                eprintln!("raw upstream connection: {e}");
            }
        });
    }
}

type RawBody =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

async fn respond(
    req: http::Request<Incoming>,
    seen: Arc<Mutex<Vec<RawRequest>>>,
    answer: Bytes,
) -> Result<http::Response<RawBody>, hyper::Error> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    seen.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(RawRequest {
            path: parts.uri.path().to_owned(),
            headers: parts.headers,
            body,
        });
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames = vec![
        Ok(Frame::data(grpc_frame(&answer))),
        Ok(Frame::trailers(trailers)),
    ];
    let mut resp = http::Response::new(StreamBody::new(futures::stream::iter(frames)));
    resp.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/grpc"),
    );
    Ok(resp)
}

/// The status of a call, whether it failed at the head or in the stream.
pub fn code_of<T>(result: &Result<T, Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}
