//! One gRPC call through the sidecar: the method looked up in the table
//! (unknown ones refused), the routing header and the first request message
//! checked and translated before anything goes upstream, the rest of the
//! request stream translated message by message (a refused later message
//! aborts the upstream call), and the response stream translated back, its
//! status message included. A write that names an entry a move has fenced,
//! in its routing header or first message, waits for the map to change
//! ([`crate::hold`]); a write stream is cut off (reset) when its bucket is
//! fenced before the message that finishes it has gone on
//! ([`crate::flights`]).

use std::sync::{Arc, Mutex, PoisonError};

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
use crate::flights::{Buckets, Flights, Ticket};
use crate::hold::{Ended, Hold, Holds};
use crate::hop_by_hop::forwards_authorization;
use crate::layers::{Answer, Rejected};
use crate::mapping::{Mapping, MappingStore};
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
    /// How long a write a move's fence holds waits (`--hold-limit`).
    pub hold_limit: std::time::Duration,
}

/// The gRPC path of the sidecar.
#[derive(Debug)]
pub struct GrpcProxy {
    client: GrpcClient,
    settings: GrpcSettings,
    mapping: Arc<MappingStore>,
    metrics: Arc<Metrics>,
    auth: Arc<Auth>,
    holds: Holds,
    /// Writes in flight, cut off when a move fences their bucket.
    flights: Arc<Flights>,
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
    /// A message's payload, decoded when it is compressed.
    fn payload(&self, message: &Message) -> Result<Bytes, Status> {
        match message.compressed {
            true => self.compression.decode(&message.payload, self.limit),
            false => Ok(message.payload.clone()),
        }
    }

    fn rewrite(&self, message: Message) -> Result<Message, Status> {
        let Some(index) = self.message else {
            return Ok(message);
        };
        let payload = self.payload(&message)?;
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
/// leaves its status in the slot. A write's stream is cut off (reset, its
/// status in the slot) when a move fences its bucket before the message
/// that finishes the write has gone on ([`crate::flights`]).
struct RequestSide {
    rewriter: Rewriter,
    failed: Slot,
    /// Set for the first message: the physical names it uses go to `sent_to`.
    first: bool,
    /// The physical names the first message used.
    sent_to: Buckets,
    /// The last message refused named an entry a move has fenced.
    held: bool,
    /// A message that finishes the write was rewritten: once it has gone
    /// on, the write is complete.
    finishing: bool,
    /// The write's place among the flights.
    ticket: Option<Ticket>,
}

impl RequestSide {
    fn new(rewriter: Rewriter, failed: Slot) -> Self {
        Self {
            rewriter,
            failed,
            first: true,
            sent_to: Buckets::new(),
            held: false,
            finishing: false,
            ticket: None,
        }
    }

    /// The status of a write cut off.
    fn cut_off() -> Status {
        refused(&policy::Refusal::cut_off())
    }
}

impl Side for RequestSide {
    fn message(&mut self, message: Message) -> Result<Message, Status> {
        let Some(index) = self.rewriter.message else {
            return Ok(message);
        };
        let payload = self.rewriter.payload(&message)?;
        self.finishing |= super::wire::finishes_write(&payload, index);
        let names = &self.rewriter.names;
        let seen = Mutex::new(Buckets::new());
        let record = |name: &str| {
            if let (Some(physical), Ok(mut seen)) =
                (names.mapping.shared_physical(name), seen.lock())
            {
                seen.push(physical);
            }
        };
        let translator = match std::mem::take(&mut self.first) {
            true => names.seeing(&record),
            false => names.translator(Direction::ToPhysical),
        };
        let rewritten = super::wire::rewrite_message(&payload, index, &translator);
        self.sent_to
            .extend(seen.into_inner().unwrap_or_else(PoisonError::into_inner));
        match rewritten {
            Ok(None) => Ok(message),
            Ok(Some(payload)) => Ok(Message {
                compressed: false,
                payload,
            }),
            Err(status) => {
                self.held = status.reason() == Some(policy::Kind::Moving.row().error_info);
                Err(from_core(status))
            }
        }
    }

    fn finish(&mut self, trailers: Option<HeaderMap>) -> Result<Option<HeaderMap>, BoxError> {
        // The whole stream went on: complete, unless cut off first.
        match self.ticket.as_ref().is_none_or(|t| t.flight().complete()) {
            true => Ok(trailers),
            false => self.fail(Self::cut_off()).map(Some),
        }
    }

    fn fail(&mut self, status: Status) -> Result<HeaderMap, BoxError> {
        self.failed.set(status);
        // hyper resets the upstream stream with the reason it finds in the
        // error: CANCEL, as a gRPC client cancelling a call sends.
        Err(Box::new(h2::Error::from(h2::Reason::CANCEL)))
    }

    fn passing(&mut self, last: bool) -> Option<Status> {
        let flight = self.ticket.as_ref()?.flight();
        let gone_on = match last && self.finishing {
            true => flight.complete(),
            false => !flight.is_cut(),
        };
        (!gone_on).then(Self::cut_off)
    }

    fn poll_cut(&mut self, cx: &std::task::Context<'_>) -> Option<Status> {
        let flight = self.ticket.as_ref()?.flight();
        flight.poll_cut(cx).then(Self::cut_off)
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

/// What the policy decides a call with, besides the map: its head, method,
/// deadline and routing header.
struct Call {
    head: Request<()>,
    rpc: Option<&'static Rpc>,
    deadline: Result<Option<std::time::Duration>, CoreStatus>,
    routing: Result<Vec<String>, CoreStatus>,
}

/// What the policy made of a call.
enum Verdict {
    /// It goes on.
    Go(Go),
    /// A move's fence holds it: decided again when the map is another than
    /// `mapping`; `status` once the hold limit passes.
    Hold {
        mapping: Option<Arc<Mapping>>,
        status: Status,
    },
}

/// A call the policy lets go.
struct Go {
    /// The map and rules its messages are translated with.
    names: Arc<Names>,
    add_credentials: bool,
    /// The physical names of its routing header, when it writes.
    sent_to: Buckets,
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
            holds: Holds::new(mapping.clone(), settings.hold_limit, metrics.clone()),
            flights: Flights::new(mapping.clone(), metrics.clone()),
            client,
            settings,
            mapping,
            metrics,
            auth,
        }
    }

    /// The path with the flights `flights` (the process's one registry,
    /// which its sweeper looks at) in place of its own.
    #[must_use]
    pub fn with_flights(mut self, flights: Arc<Flights>) -> Self {
        self.flights = flights;
        self
    }

    /// Serves one gRPC call. The decision is the policy's
    /// ([`policy::decide`]); this front end translates the call into the
    /// policy's model ([`model`]) and renders the refusal as a status. A
    /// call a move's fence holds — by its routing header or its first
    /// message — waits, within its deadline, for the map to change
    /// ([`crate::hold`]).
    pub async fn call<B>(self: Arc<Self>, req: Request<B>) -> Answer
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError> + std::fmt::Display,
    {
        let rpc = find_rpc(req.uri().path());
        let outcome = self.outcome(rpc.map_or("unknown", |rpc| &rpc.path[1..]));
        let (parts, body) = req.into_parts();
        let call = Call {
            deadline: headers::deadline(&parts.headers),
            routing: headers::routing_buckets(&parts.headers),
            head: Request::from_parts(parts, ()),
            rpc,
        };
        let verdict = match self.decide(&call) {
            Ok(verdict) => verdict,
            Err(status) => return refuse(outcome, &status),
        };
        let Some(rpc) = rpc else {
            // The policy refuses unknown methods.
            let refusal = policy::Refusal::unknown_grpc_method(call.head.uri().path());
            return refuse(outcome, &refused(&refusal));
        };
        let deadline = call.deadline.as_ref().ok().copied().flatten();
        let deadline = deadline.map(|d| tokio::time::Instant::now() + d);
        let failed = Slot::default();
        let forwarded = self.hold_and_forward(rpc, call, body, verdict, &failed);
        let answered = match deadline {
            Some(at) => tokio::time::timeout_at(at, forwarded)
                .await
                .unwrap_or_else(|_| Err(from_core(headers::deadline_exceeded()))),
            None => forwarded.await,
        };
        match answered {
            Ok((response, names)) => self.response(rpc, response, names, failed, outcome, deadline),
            Err(status) => refuse(outcome, &status),
        }
    }

    /// The policy's verdict on `call` with the map in force; its refusal
    /// as a status.
    fn decide(&self, call: &Call) -> Result<Verdict, Status> {
        let mapping = self.mapping.current();
        let stale = self.mapping.staleness();
        let cx = policy::Context {
            mapping: mapping.as_deref(),
            allow_physical: self.settings.allow_physical_names,
            adc: self.auth.adds(),
            stale,
        };
        let model = model(&call.head, call.rpc, &call.deadline, &call.routing);
        let writes = model.writes;
        let (add_credentials, sent_to) = match policy::decide(&model, &cx) {
            Decision::Forward {
                add_credentials,
                physical,
                ..
            } => {
                let shared = |name: &&str| mapping.as_ref()?.shared_physical(name);
                let sent_to = physical.iter().filter(|_| writes).filter_map(shared);
                (add_credentials, sent_to.collect())
            }
            Decision::Refuse(refusal) => return Err(refused(&refusal)),
            Decision::Hold { bucket, .. } => {
                let status = refused(&policy::Refusal::moving(bucket));
                let mapping = mapping.clone();
                return Ok(Verdict::Hold { mapping, status });
            }
        };
        // The model borrows the map; what it said is out of it now.
        drop(model);
        let (Some(mapping), Ok(_)) = (mapping, &call.deadline) else {
            // The policy forwards with a map and a deadline it can read only.
            return Err(refused(&policy::Refusal::not_ready()));
        };
        let access = policy::Access { writes, stale };
        let names = Arc::new(Names {
            mapping,
            allow_physical: self.settings.allow_physical_names,
            access,
        });
        Ok(Verdict::Go(Go {
            names,
            add_credentials,
            sent_to,
        }))
    }

    /// Holds the call until the policy lets it go, then sends it upstream
    /// (its first message checked first, and held too if it names an entry
    /// a move has fenced); the response head, and the names it went with.
    async fn hold_and_forward<B>(
        &self,
        rpc: &'static Rpc,
        call: Call,
        body: B,
        verdict: Verdict,
        failed: &Slot,
    ) -> Result<(Response<hyper::body::Incoming>, Arc<Names>), Status>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError> + std::fmt::Display,
    {
        let mut hold = None;
        let go = self.until_go(&call, verdict, &mut hold).await?;
        let (body, go) = match rpc.request {
            None => (boxed(body), go),
            Some(_) => {
                let rewriter = self.rewriter(
                    &go.names,
                    rpc.request,
                    Direction::ToPhysical,
                    call.head.headers(),
                );
                let side = RequestSide::new(rewriter, failed.clone());
                let mut body = RewriteBody::new(body, side, self.settings.max_message_bytes);
                let go = self
                    .first_message(&call, &mut body, go, &mut hold, failed)
                    .await?;
                (boxed(body), go)
            }
        };
        if hold.is_some() {
            self.holds.ended(Ended::Forwarded);
        }
        let (head, ()) = call.head.into_parts();
        let upstream = self
            .upstream_request(rpc, head.headers, body, &go.names, go.add_credentials)
            .await?;
        let response = self.client.send(upstream).await.map_err(|e| {
            failed.take().unwrap_or_else(|| {
                Status::unavailable(format!(
                    "bucketmap-sidecar cannot reach the gRPC upstream: {}",
                    crate::layers::timeout::error_chain(&e)
                ))
            })
        })?;
        Ok((response, go.names))
    }

    /// Holds the call while the verdict is to hold it; the call as it goes.
    async fn until_go(
        &self,
        call: &Call,
        mut verdict: Verdict,
        hold: &mut Option<Hold>,
    ) -> Result<Go, Status> {
        loop {
            match verdict {
                Verdict::Go(go) => return Ok(go),
                Verdict::Hold { mapping, status } => {
                    self.wait(hold, mapping.as_ref(), status).await?;
                    verdict = self
                        .decide(call)
                        .inspect_err(|_| self.holds.ended(Ended::Refused))?;
                }
            }
        }
    }

    /// Waits under `hold` (started now if the call was not held yet) for
    /// the map to be another than `mapping`; `status` once the hold limit
    /// has passed.
    async fn wait(
        &self,
        hold: &mut Option<Hold>,
        mapping: Option<&Arc<Mapping>>,
        status: Status,
    ) -> Result<(), Status> {
        let hold = *hold.get_or_insert_with(|| self.holds.start());
        match self.holds.wait(&hold, mapping).await {
            true => Ok(()),
            false => {
                self.holds.ended(Ended::TimedOut);
                Err(status)
            }
        }
    }

    /// Reads and checks the first request message before anything goes
    /// upstream: a write whose message names an entry a move has fenced is
    /// held, and the whole call decided again with the next map. A write
    /// is then registered among the flights with the physical names of its
    /// routing header and first message.
    async fn first_message<B>(
        &self,
        call: &Call,
        body: &mut RewriteBody<B, RequestSide>,
        mut go: Go,
        hold: &mut Option<Hold>,
        failed: &Slot,
    ) -> Result<Go, Status>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let first = body.first().await.map_err(|e| {
            failed
                .take()
                .unwrap_or_else(|| Status::cancelled(e.to_string()))
        })?;
        while let Some(message) = &first {
            let side = body.side_mut();
            side.rewriter.names = go.names.clone();
            (side.first, side.held) = (true, false);
            side.sent_to.clear();
            match body.put_first(message.clone()) {
                Ok(()) => break,
                Err(status) if body.side_mut().held => {
                    let mapping = go.names.mapping.clone();
                    self.wait(hold, Some(&mapping), status).await?;
                    let verdict = self
                        .decide(call)
                        .inspect_err(|_| self.holds.ended(Ended::Refused))?;
                    go = self.until_go(call, verdict, hold).await?;
                }
                Err(status) => return Err(status),
            }
        }
        let side = body.side_mut();
        if go.names.access.writes {
            go.sent_to.extend(side.sent_to.drain(..));
            if !go.sent_to.is_empty() {
                side.ticket = Some(self.flights.register(std::mem::take(&mut go.sent_to)));
            }
        }
        Ok(go)
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
    /// the body (translated as it streams, its first message checked).
    async fn upstream_request(
        &self,
        rpc: &Rpc,
        headers: HeaderMap,
        body: ProxyBody,
        names: &Arc<Names>,
        add_credentials: bool,
    ) -> Result<Request<ProxyBody>, Status> {
        let mut headers =
            headers::upstream_headers(headers, &names.translator(Direction::ToPhysical))
                .map_err(from_core)?;
        if add_credentials {
            self.add_credentials(&mut headers).await?;
        }
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
