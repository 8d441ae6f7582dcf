//! One gRPC call through the sidecar: the method looked up in the table
//! (unknown ones refused), the routing header and the first request message
//! checked and translated before anything goes upstream, the rest of the
//! request stream translated message by message (a refused later message
//! aborts the upstream call), and the response stream translated back, its
//! status message included.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use tonic::{Code, Status};

use super::frame::Message;
use super::schema::RPCS;
use super::status::{code_in, code_name, from_core, rewrite_status_headers};
use super::stream::{RewriteBody, Side};
use super::table::Rpc;
use super::{Names, headers, status};
use crate::auth::Auth;
use crate::body::{BoxError, ProxyBody, boxed, empty};
use crate::config::UpstreamHttp;
use crate::hop_by_hop::forwards_authorization;
use crate::layers::{Answer, Rejected};
use crate::mapping::MappingStore;
use crate::metrics::{GrpcLabels, Metrics};
use crate::policy::{self, Decision};
use crate::rewrite::Direction;
use crate::upstream::{UpstreamClient, build_client};
use bucketmap_sidecar_core::grpc::status::Status as CoreStatus;

/// The HTTP/2 client of the gRPC upstream: one multiplexed connection.
pub type GrpcClient = UpstreamClient;

/// The operation label of gRPC calls in the request log and metrics.
pub const OPERATION: &str = "grpc";

/// Builds the client of the gRPC upstream `upstream`: HTTP/2 only (ALPN
/// `h2` over TLS for https://, prior knowledge for http://), with the roots
/// of `tls`.
pub fn build_grpc_client(
    upstream: &Uri,
    connect_timeout: std::time::Duration,
    tls: rustls::ClientConfig,
) -> anyhow::Result<GrpcClient> {
    // One HTTP/2 connection, kept while the upstream keeps it: the idle
    // timeout applies to HTTP/1.1 connections only (unused here).
    let idle_timeout = std::time::Duration::from_secs(90);
    build_client(
        upstream,
        connect_timeout,
        idle_timeout,
        tls,
        UpstreamHttp::Http2,
    )
}

/// Settings of the gRPC path.
#[derive(Clone, Debug)]
pub struct GrpcSettings {
    /// `scheme://authority` of the gRPC upstream.
    pub upstream: Uri,
    /// Accept the physical names of mapped buckets in requests.
    pub allow_physical_names: bool,
    /// Largest message read to be rewritten, in bytes.
    pub max_message_bytes: usize,
}

/// The gRPC path of the sidecar.
#[derive(Debug)]
pub struct GrpcProxy {
    client: GrpcClient,
    settings: GrpcSettings,
    mapping: Arc<MappingStore>,
    metrics: Arc<Metrics>,
    auth: Arc<Auth>,
}

/// Where a refused later request message leaves its status for the response.
#[derive(Clone, Debug, Default)]
struct Slot(Arc<Mutex<Option<Status>>>);

impl Slot {
    fn set(&self, status: Status) {
        if let Ok(mut slot) = self.0.lock() {
            slot.get_or_insert(status);
        }
    }

    fn take(&self) -> Option<Status> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

/// Counts a call in `grpc_requests_total` once, when its status is known
/// (or as CANCELLED when the client goes away first).
struct Outcome {
    metrics: Arc<Metrics>,
    method: &'static str,
    recorded: bool,
}

impl Outcome {
    fn record(&mut self, code: Code) {
        if !std::mem::replace(&mut self.recorded, true) {
            let labels = GrpcLabels {
                method: self.method,
                code: code_name(code),
            };
            self.metrics.grpc_requests.get_or_create(&labels).inc();
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        self.record(Code::Cancelled);
    }
}

/// The stream's `grpc-encoding`, for messages with the compressed flag.
#[derive(Clone, Debug)]
enum Compression {
    Identity,
    Gzip,
    Other(String),
}

impl Compression {
    fn of(headers: &HeaderMap) -> Self {
        match headers.get("grpc-encoding").map(|v| v.to_str()) {
            None => Self::Identity,
            Some(Ok("identity")) => Self::Identity,
            Some(Ok("gzip")) => Self::Gzip,
            Some(other) => Self::Other(other.unwrap_or("(not ASCII)").to_owned()),
        }
    }

    fn decode(&self, payload: &[u8], limit: usize) -> Result<Bytes, Status> {
        match self {
            Self::Gzip => crate::encoding::gunzip(payload, limit).map_err(|e| {
                from_core(CoreStatus::invalid_argument(format!(
                    "cannot read a gzip gRPC message: {e}"
                )))
            }),
            Self::Identity => Err(from_core(CoreStatus::invalid_argument(
                "a compressed gRPC message on a stream without grpc-encoding",
            ))),
            Self::Other(name) => Err(Status::unimplemented(format!(
                "bucketmap-sidecar reads gzip gRPC messages only, not grpc-encoding {name}"
            ))),
        }
    }
}

/// Rewrites the messages of one direction of one call.
struct Rewriter {
    names: Arc<Names>,
    message: Option<usize>,
    direction: Direction,
    compression: Compression,
    limit: usize,
}

impl Rewriter {
    fn rewrite(&self, message: Message) -> Result<Message, Status> {
        let Some(index) = self.message else {
            return Ok(message);
        };
        let payload = if message.compressed {
            self.compression.decode(&message.payload, self.limit)?
        } else {
            message.payload.clone()
        };
        let translator = self.names.translator(self.direction);
        match super::wire::rewrite_message(&payload, index, &translator).map_err(from_core)? {
            None => Ok(message),
            Some(payload) => Ok(Message {
                compressed: false,
                payload,
            }),
        }
    }

    /// Whether [`Rewriter::rewrite`] would leave a message as it is,
    /// judged from its payload in pieces: a type with no bucket names, or
    /// an uncompressed message whose top-level fields hold none (object
    /// data).
    fn unchanged(&self, compressed: bool, payload: &[&[u8]]) -> bool {
        match self.message {
            None => true,
            Some(index) => !compressed && super::wire::unchanged_at_top(payload, index),
        }
    }
}

/// The request direction: a refused message aborts the upstream call and
/// leaves its status in the slot.
struct RequestSide {
    rewriter: Rewriter,
    failed: Slot,
}

impl Side for RequestSide {
    fn message(&mut self, message: Message) -> Result<Message, Status> {
        self.rewriter.rewrite(message)
    }

    fn finish(&mut self, trailers: Option<HeaderMap>) -> Result<Option<HeaderMap>, BoxError> {
        Ok(trailers)
    }

    fn fail(&mut self, status: Status) -> Result<HeaderMap, BoxError> {
        self.failed.set(status);
        // hyper resets the upstream stream with the reason it finds in the
        // error: CANCEL, as a gRPC client cancelling a call sends.
        Err(Box::new(h2::Error::from(h2::Reason::CANCEL)))
    }
}

/// The response direction: names back to logical, the status rewritten
/// and counted; a failure (or a refused request message) ends the stream
/// with a status in the trailers.
struct ResponseSide {
    rewriter: Rewriter,
    failed: Slot,
    outcome: Outcome,
}

impl Side for ResponseSide {
    fn message(&mut self, message: Message) -> Result<Message, Status> {
        self.rewriter.rewrite(message)
    }

    /// Object data on its way to the client goes on in the pieces it came
    /// in: hyper's server sends them on as the h2 relay does, and gathering
    /// them first cost more than it saved (docs/BENCHMARKS.md, gRPC).
    /// Requests keep the gathering, which makes uploads faster.
    fn as_it_came(&self, compressed: bool, payload: &[&[u8]]) -> bool {
        self.rewriter.unchanged(compressed, payload)
    }

    fn finish(&mut self, trailers: Option<HeaderMap>) -> Result<Option<HeaderMap>, BoxError> {
        let Some(mut trailers) = trailers else {
            let status = from_core(CoreStatus::internal(
                "the gRPC upstream ended its response without a status",
            ));
            return self.fail(status).map(Some);
        };
        if let Some(status) = self.failed.take() {
            return self.fail(status).map(Some);
        }
        self.outcome
            .record(code_in(&trailers).unwrap_or(Code::Unknown));
        rewrite_status_headers(&mut trailers, &self.rewriter.names.mapping);
        Ok(Some(trailers))
    }

    fn fail(&mut self, status: Status) -> Result<HeaderMap, BoxError> {
        let status = self.failed.take().unwrap_or(status);
        self.outcome.record(status.code());
        Ok(status::trailers(&status))
    }
}

/// The method `path` names, if the sidecar knows it.
pub fn find_rpc(path: &str) -> Option<&'static Rpc> {
    RPCS.binary_search_by(|rpc| rpc.path.cmp(path))
        .ok()
        .map(|i| &RPCS[i])
}

/// The gRPC code for an HTTP status that is not 200 (gRPC's HTTP to gRPC
/// status mapping).
fn code_of_http(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// A trailers-only answer with `status`, counted.
fn refuse(mut outcome: Outcome, status: &Status) -> Answer {
    outcome.record(status.code());
    Answer {
        response: status::response(status),
        operation: OPERATION,
        rejected: Some(Rejected {
            reason: code_name(status.code()),
            message: status.message().to_owned(),
        }),
    }
}

/// A refusal of the policy as the status this front end answers with.
fn refused(refusal: &policy::Refusal) -> Status {
    from_core(refusal.grpc_status())
}

/// The gRPC front end's call as the policy's model: the method (an unknown
/// one refused), a call not over HTTP/2 or with a `grpc-timeout` or routing
/// header the sidecar cannot read as a refusal of the framing, the bucket
/// names of the routing header (`routing`; the messages' names are checked
/// by the wire walker with the policy's rule), and whether the client's
/// own `Authorization` reaches the upstream.
pub fn model<'a, B>(
    req: &Request<B>,
    rpc: Option<&'static Rpc>,
    deadline: &Result<Option<std::time::Duration>, CoreStatus>,
    routing: &'a Result<Vec<String>, CoreStatus>,
) -> policy::Request<'a> {
    let path = req.uri().path();
    let framing = if req.version() != Version::HTTP_2 {
        Some(policy::Refusal::grpc_not_http2(path, &req.version()))
    } else {
        let unreadable = deadline.as_ref().err().or(routing.as_ref().err());
        unreadable.map(|status| policy::Refusal::bad_request(status.message()))
    };
    policy::Request {
        operation: rpc
            .map(|rpc| rpc.path)
            .ok_or_else(|| policy::Refusal::unknown_grpc_method(path)),
        framing,
        buckets: routing.iter().flatten().map(String::as_str).collect(),
        credentials: forwards_authorization(req.headers()),
        writes: !policy::is_read_rpc(path),
    }
}

impl GrpcProxy {
    /// The gRPC path forwarding to `settings.upstream` with `client`.
    pub fn new(
        client: GrpcClient,
        settings: GrpcSettings,
        mapping: Arc<MappingStore>,
        metrics: Arc<Metrics>,
        auth: Arc<Auth>,
    ) -> Self {
        Self {
            client,
            settings,
            mapping,
            metrics,
            auth,
        }
    }

    /// Serves one gRPC call. The decision is the policy's
    /// ([`policy::decide`]); this front end translates the call into the
    /// policy's model ([`model`]) and renders the refusal as a status.
    pub async fn call<B>(self: Arc<Self>, req: Request<B>) -> Answer
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError> + std::fmt::Display,
    {
        let rpc = find_rpc(req.uri().path());
        let outcome = self.outcome(rpc.map_or("unknown", |rpc| &rpc.path[1..]));
        let mapping = self.mapping.current();
        let deadline = headers::deadline(req.headers());
        let routing = headers::routing_buckets(req.headers());
        let cx = policy::Context {
            mapping: mapping.as_deref(),
            allow_physical: self.settings.allow_physical_names,
            adc: self.auth.adds(),
            stale: self.mapping.staleness(),
        };
        let stale = cx.stale;
        let add_credentials = match policy::decide(&model(&req, rpc, &deadline, &routing), &cx) {
            Decision::Forward {
                add_credentials, ..
            } => add_credentials,
            Decision::Refuse(refusal) => return refuse(outcome, &refused(&refusal)),
            Decision::Hold { bucket, .. } => {
                return refuse(outcome, &refused(&policy::Refusal::moving(bucket)));
            }
        };
        let (Some(rpc), Some(mapping), Ok(deadline)) = (rpc, mapping, deadline) else {
            // The policy forwards known methods with a map and a deadline only.
            return refuse(outcome, &refused(&policy::Refusal::not_ready()));
        };
        let names = Arc::new(Names {
            mapping,
            allow_physical: self.settings.allow_physical_names,
            access: policy::Access {
                writes: !policy::is_read_rpc(rpc.path),
                stale,
            },
        });
        let deadline = deadline.map(|d| tokio::time::Instant::now() + d);
        let failed = Slot::default();
        let forwarded = self.forward(rpc, req, &names, &failed, add_credentials);
        let answered = match deadline {
            Some(at) => tokio::time::timeout_at(at, forwarded)
                .await
                .unwrap_or_else(|_| Err(from_core(headers::deadline_exceeded()))),
            None => forwarded.await,
        };
        match answered {
            Ok(response) => self.response(rpc, response, names, failed, outcome, deadline),
            Err(status) => refuse(outcome, &status),
        }
    }

    /// Sends the call upstream; its response head.
    async fn forward<B>(
        &self,
        rpc: &Rpc,
        req: Request<B>,
        names: &Arc<Names>,
        failed: &Slot,
        add_credentials: bool,
    ) -> Result<Response<hyper::body::Incoming>, Status>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError> + std::fmt::Display,
    {
        let upstream = self
            .upstream_request(rpc, req, names, failed, add_credentials)
            .await?;
        self.client.send(upstream).await.map_err(|e| {
            failed.take().unwrap_or_else(|| {
                Status::unavailable(format!(
                    "bucketmap-sidecar cannot reach the gRPC upstream: {}",
                    crate::layers::timeout::error_chain(&e)
                ))
            })
        })
    }

    fn outcome(&self, method: &'static str) -> Outcome {
        Outcome {
            metrics: self.metrics.clone(),
            method,
            recorded: false,
        }
    }

    fn rewriter(
        &self,
        names: &Arc<Names>,
        message: Option<usize>,
        direction: Direction,
        headers: &HeaderMap,
    ) -> Rewriter {
        Rewriter {
            names: names.clone(),
            message,
            direction,
            compression: Compression::of(headers),
            limit: self.settings.max_message_bytes,
        }
    }

    /// The request sent upstream: headers translated, credentials added,
    /// and the body translated, its first message already checked.
    async fn upstream_request<B>(
        &self,
        rpc: &Rpc,
        req: Request<B>,
        names: &Arc<Names>,
        failed: &Slot,
        add_credentials: bool,
    ) -> Result<Request<ProxyBody>, Status>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError> + std::fmt::Display,
    {
        let (parts, body) = req.into_parts();
        let mut headers =
            headers::upstream_headers(parts.headers, &names.translator(Direction::ToPhysical))
                .map_err(from_core)?;
        if add_credentials {
            self.add_credentials(&mut headers).await?;
        }
        let body = match rpc.request {
            None => boxed(body),
            Some(_) => {
                let rewriter = self.rewriter(names, rpc.request, Direction::ToPhysical, &headers);
                let side = RequestSide {
                    rewriter,
                    failed: failed.clone(),
                };
                let mut body = RewriteBody::new(body, side, self.settings.max_message_bytes);
                if let Err(e) = body.prime().await {
                    return Err(failed
                        .take()
                        .unwrap_or_else(|| Status::cancelled(e.to_string())));
                }
                boxed(body)
            }
        };
        let uri = upstream_uri(&self.settings.upstream, rpc.path)?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .version(Version::HTTP_2)
            .body(body)
            .map_err(|e| {
                from_core(CoreStatus::internal(format!(
                    "cannot build the upstream request: {e}"
                )))
            })?;
        *request.headers_mut() = headers;
        Ok(request)
    }

    /// Adds the configured credentials (the policy decided the call needs
    /// them: its own `Authorization` does not reach the upstream).
    async fn add_credentials(&self, headers: &mut HeaderMap) -> Result<(), Status> {
        let extra = self.auth.headers().await.map_err(|detail| {
            tracing::warn!(error = %detail, "cannot obtain credentials");
            refused(&policy::Refusal::credentials_unavailable(&detail))
        })?;
        for (name, value) in extra.iter().flatten() {
            if !headers.contains_key(name) {
                headers.insert(name.clone(), value.clone());
            }
        }
        Ok(())
    }

    /// The response to the client: headers kept, messages and status translated back.
    fn response(
        &self,
        rpc: &Rpc,
        response: Response<hyper::body::Incoming>,
        names: Arc<Names>,
        failed: Slot,
        mut outcome: Outcome,
        deadline: Option<tokio::time::Instant>,
    ) -> Answer {
        let (mut parts, body) = response.into_parts();
        if parts.status != StatusCode::OK {
            let status = Status::new(
                code_of_http(parts.status),
                format!("the gRPC upstream answered HTTP {}", parts.status),
            );
            return refuse(outcome, &status);
        }
        parts.headers = headers::client_headers(parts.headers);
        if let Some(code) = code_in(&parts.headers) {
            // Trailers-only: the status is in the headers.
            rewrite_status_headers(&mut parts.headers, &names.mapping);
            outcome.record(code);
            return Answer::new(Response::from_parts(parts, empty()), OPERATION);
        }
        let rewriter = self.rewriter(&names, rpc.response, Direction::ToLogical, &parts.headers);
        let side = ResponseSide {
            rewriter,
            failed,
            outcome,
        };
        let body =
            RewriteBody::new(body, side, self.settings.max_message_bytes).with_deadline(deadline);
        Answer::new(Response::from_parts(parts, boxed(body)), OPERATION)
    }
}

/// `upstream` (scheme and authority) with the method's path.
fn upstream_uri(upstream: &Uri, path: &str) -> Result<Uri, Status> {
    let mut parts = upstream.clone().into_parts();
    parts.path_and_query = Some(path.parse().map_err(|e| {
        from_core(CoreStatus::internal(format!(
            "cannot build the upstream path: {e}"
        )))
    })?);
    Uri::from_parts(parts).map_err(|e| {
        from_core(CoreStatus::internal(format!(
            "cannot build the upstream URL: {e}"
        )))
    })
}
