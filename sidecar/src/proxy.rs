//! The core of the request path ([`Core`]): a request the layers of
//! [`crate::layers`] let through is rewritten, forwarded and its answer
//! rewritten back.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use hyper::body::Incoming;
use tower::{Layer as _, Service};

use crate::batch;
use crate::body::{
    BoxError, CollectError, Counted, ProxyBody, Replay, boxed, collect_capped, empty, full,
};
use crate::config::UpstreamHttp;
use crate::encoding::{Encoding, Gunzip, GunzipError, content_encoding, gunzip};
use crate::errors::ApiError;
use crate::flights::{Buckets, Flight, Flights, Guarded};
use crate::hold::{Ended, Hold};
use crate::layers::refuse::{
    Held, METHOD_OVERRIDE_HEADER, Refusal as RefuseRefusal, RefuseLayer, Routed, Stop,
};
use crate::layers::timeout::{TimeoutFuture, UpstreamError, UpstreamTimeout, UpstreamTimeoutLayer};
use crate::layers::{Answer, BoxFuture, rejection};
use crate::mapping::{Mapping, MappingStore};
use crate::metrics::Metrics;
use crate::policy;
use crate::rewrite::json::{JsonBody, rewrite_json_body, rewrite_json_bytes};
use crate::rewrite::strict::check_request_json;
use crate::rewrite::text::replace_bucket_tokens;
use crate::rewrite::url::{rewrite_copy_source, rewrite_url};
use crate::rewrite::xml::rewrite_xml;
use crate::rewrite::{Direction, LinkBase, Translator};
use crate::route::{RequestBody, Resource, ResponseBody, Route};
use crate::upload;
use crate::upstream::UpstreamClient;
use bucketmap_sidecar_core::answer::{is_json, unreadable_answer};
use bucketmap_sidecar_core::hop_by_hop::{present, remove_present, strip_hop_by_hop};

/// Behaviour switches of the proxy.
#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// Accept the physical names of mapped buckets too (`--allow-physical-names`).
    pub allow_physical_names: bool,
    /// Largest metadata body read into memory, in bytes; larger ones get 413.
    pub max_metadata_bytes: usize,
    /// Time to upstream response headers; `None` for no limit.
    pub upstream_timeout: Option<Duration>,
    /// The address clients connect to; links in responses point at it.
    pub listen: SocketAddr,
    /// Where links point instead, when set (`--advertise-url`).
    pub advertise_url: Option<Uri>,
    /// HTTP version spoken to the upstream (`--upstream-http`).
    pub upstream_http: UpstreamHttp,
    /// How long a write a move's fence holds waits (`--hold-limit`).
    pub hold_limit: Duration,
}

/// The local address of the connection a request arrived on, put in the
/// request's extensions by [`crate::server::serve`]: links in responses
/// point at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLocalAddr(pub SocketAddr);

/// What the request path shares: the map, the upstream, the metrics and
/// the settings. The layers take their part of it in
/// [`crate::server::proxy_stack`]; the core ([`Core`]) the rest.
pub struct Proxy {
    pub(crate) mapping: Arc<MappingStore>,
    /// The upstream client, under the upstream timeout.
    upstream: UpstreamTimeout<UpstreamClient>,
    upstream_scheme: Scheme,
    upstream_authority: Authority,
    /// Where links in requests point: the upstream.
    upstream_links: LinkBase,
    /// The authority of links to the configured listen address, formatted
    /// once: most connections arrive on it.
    listen_authority: Arc<str>,
    /// The scheme of links to the sidecar: `http`.
    http_scheme: Arc<str>,
    /// Where links in responses point when `--advertise-url` is set.
    advertised_links: Option<LinkBase>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: ProxySettings,
    /// The refuse layer, which decides a held request again.
    pub(crate) refuse: RefuseLayer,
    /// Writes in flight, cut off when a move fences their bucket.
    flights: Arc<Flights>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field(
                "upstream",
                &format_args!("{}://{}", self.upstream_scheme, self.upstream_authority),
            )
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Response headers holding absolute URLs the client follows.
static LINK_HEADERS: [HeaderName; 4] = [
    header::LOCATION,
    header::CONTENT_LOCATION,
    HeaderName::from_static("x-goog-upload-url"),
    HeaderName::from_static("x-goog-upload-control-url"),
];

/// Request headers naming a copy's source object.
static COPY_SOURCE_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static("x-goog-copy-source"),
    HeaderName::from_static("x-amz-copy-source"),
];

impl Proxy {
    /// Fails when `upstream` lacks a scheme or host, or the JSON API's
    /// operation table is broken.
    pub fn new(
        mapping: Arc<MappingStore>,
        client: UpstreamClient,
        upstream: &Uri,
        metrics: Arc<Metrics>,
        settings: ProxySettings,
    ) -> anyhow::Result<Self> {
        let upstream_scheme = upstream
            .scheme()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("upstream {upstream} has no scheme"))?;
        let upstream_authority = upstream
            .authority()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("upstream {upstream} has no host"))?;
        // The JSON API's operation table: a broken document stops start-up.
        crate::discovery::check()?;
        let upstream_links = LinkBase {
            scheme: Arc::from(upstream_scheme.as_str()),
            authority: Arc::from(upstream_authority.as_str()),
            virtual_host: None,
        };
        let upstream = UpstreamTimeoutLayer::new(settings.upstream_timeout).layer(client);
        let listen_authority = Arc::from(loopback_if_unspecified(settings.listen).to_string());
        let advertised_links = settings.advertise_url.as_ref().map(|url| LinkBase {
            scheme: Arc::from(url.scheme_str().unwrap_or("http")),
            authority: Arc::from(url.authority().map_or("", |a| a.as_str())),
            virtual_host: None,
        });
        let refuse = RefuseLayer::new(
            mapping.clone(),
            metrics.clone(),
            settings.listen,
            settings.allow_physical_names,
            settings.hold_limit,
        );
        let flights = Flights::new(mapping.clone(), metrics.clone());
        Ok(Self {
            refuse,
            flights,
            mapping,
            upstream,
            upstream_scheme,
            upstream_authority,
            upstream_links,
            listen_authority,
            http_scheme: Arc::from("http"),
            advertised_links,
            metrics,
            settings,
        })
    }

    /// The proxy with the flights `flights` (the process's one registry,
    /// which its sweeper looks at) in place of its own.
    #[must_use]
    pub fn with_flights(mut self, flights: Arc<Flights>) -> Self {
        self.flights = flights;
        self
    }

    /// Rewrites, forwards and rewrites back one routed request; never fails
    /// (errors become GCS-style answers, labelled for the record layer). A
    /// request held by a name in its headers or body is decided again when
    /// the map changes, with its body as far as it was read.
    async fn forward<B>(&self, routed: Routed<B>) -> Answer
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let operation = routed.route.operation;
        let style = routed.route.api.error_style();
        let mut routed = routed.map_body(Replay::unread);
        let mut hold = None;
        loop {
            let held = match self.rewrite_and_send(routed).await {
                Ok(response) => {
                    self.hold_ended(hold.is_some(), Ended::Forwarded);
                    return Answer::new(response, operation);
                }
                Err(Failure::Refused(error)) => {
                    self.hold_ended(hold.is_some(), Ended::Refused);
                    return rejection(error, style, operation);
                }
                Err(Failure::Held(held)) => *held,
            };
            let hold = *hold.get_or_insert_with(|| self.refuse.holds().start());
            routed = match self.decide_again(held.0, held.1, hold).await {
                Ok(routed) => routed,
                Err(answer) => return answer,
            };
        }
    }

    /// Counts the end of a hold, if there was one.
    fn hold_ended(&self, held: bool, how: Ended) {
        if held {
            self.refuse.holds().ended(how);
        }
    }

    /// Waits for the map to change and decides `held` again, until it goes
    /// on, is refused, or `hold` ends. The credentials layer's headers, if
    /// it added any, go with the request again.
    async fn decide_again<B>(
        &self,
        mut held: Held<Replay<B>>,
        credentials: Option<HeaderMap>,
        hold: Hold,
    ) -> Result<Routed<Replay<B>>, Answer> {
        loop {
            if !self.refuse.holds().wait(&hold, held.mapping.as_ref()).await {
                self.refuse.holds().ended(Ended::TimedOut);
                return Err(held.refusal.answer());
            }
            match self.refuse.check(held.request) {
                Ok(mut routed) => {
                    routed.credentials = credentials;
                    return Ok(routed);
                }
                Err(Stop::Refused(refused)) => {
                    self.refuse.holds().ended(Ended::Refused);
                    return Err(refused.answer());
                }
                Err(Stop::Held(again)) => held = *again,
            }
        }
    }

    async fn rewrite_and_send<B>(
        &self,
        routed: Routed<Replay<B>>,
    ) -> Result<Response<ProxyBody>, Failure<B>>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let Routed {
            request,
            route: routed,
            method,
            mapping,
            host,
            upstream_path,
            credentials,
            access,
        } = routed;
        let target = self.upstream_uri(upstream_path)?;
        let to_physical = self.translator(&mapping, &self.upstream_links, access);
        let local = request
            .extensions()
            .get::<ConnectionLocalAddr>()
            .map(|a| a.0);
        let client_links = self.client_links(&host, routed.virtual_host.clone(), local);
        let to_logical = Translator {
            direction: Direction::ToLogical,
            ..self.translator(&mapping, &client_links, access)
        };

        let (mut parts, body) = request.into_parts();
        let (headers, outgoing) = self
            .outgoing(
                &parts.headers,
                body,
                &routed,
                &to_physical,
                credentials.as_ref(),
            )
            .await?;
        let (upstream_body, batch_plan) = match outgoing {
            Outgoing::Body(body) => (body, None),
            Outgoing::Batch(body, plan) => (body, Some(plan)),
            Outgoing::Answered(response) => return Ok(response),
            Outgoing::HeldRead {
                bytes,
                gzipped,
                refusal,
            } => {
                let body = Replay::read(bytes, &mut parts.headers, gzipped);
                let held = (Request::from_parts(parts, body), refusal);
                return Err(held_failure(held, &routed, mapping, credentials));
            }
            Outgoing::HeldUnread(body, refusal) => {
                let held = (Request::from_parts(parts, body), refusal);
                return Err(held_failure(held, &routed, mapping, credentials));
            }
        };
        // Links in responses point back at the sidecar.
        let (upstream_body, flight) = self.guard(upstream_body, &routed, &mapping, access);
        let mut upstream_req = Request::new(upstream_body);
        *upstream_req.method_mut() = method.clone();
        *upstream_req.uri_mut() = target;
        *upstream_req.headers_mut() = headers;
        let response = self.send(upstream_req, routed.operation, flight).await?;
        Ok(self
            .translate_response(response, &routed, &method, &to_logical, batch_plan.as_ref())
            .await?)
    }

    /// A translator of request names with `mapping`, links to `links`.
    fn translator<'t>(
        &self,
        mapping: &'t Mapping,
        links: &'t LinkBase,
        access: policy::Access,
    ) -> Translator<'t> {
        Translator {
            mapping,
            direction: Direction::ToPhysical,
            allow_physical: self.settings.allow_physical_names,
            links,
            access,
            seen: None,
        }
    }

    /// A write's body registered among the flights, under the physical
    /// names of its path and `Host`, so that it is cut off if a move fences
    /// one of them before the body is complete; with the flight. Reads, and
    /// writes that name no bucket there (batches), go as they are.
    fn guard(
        &self,
        body: ProxyBody,
        routed: &Route,
        mapping: &Mapping,
        access: policy::Access,
    ) -> (ProxyBody, Option<Arc<Flight>>) {
        if !access.writes {
            return (body, None);
        }
        let sent_to: Buckets = routed
            .bucket_names()
            .filter_map(|name| mapping.shared_physical(name))
            .collect();
        if sent_to.is_empty() {
            return (body, None);
        }
        let ticket = self.flights.register(sent_to);
        let flight = ticket.flight().clone();
        (boxed(Guarded::new(body, ticket)), Some(flight))
    }

    /// The upstream headers and body, or why the request does not go.
    async fn outgoing<B>(
        &self,
        incoming: &HeaderMap,
        body: B,
        routed: &Route,
        to_physical: &Translator<'_>,
        credentials: Option<&HeaderMap>,
    ) -> Result<(HeaderMap, Outgoing<B>), ApiError>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let mut headers = match upstream_headers(incoming, routed, to_physical, credentials) {
            Ok(headers) => headers,
            // A copy source naming a fenced entry: nothing read yet.
            Err(error) if policy::holds(&error) => {
                return Ok((HeaderMap::new(), Outgoing::HeldUnread(body, error)));
            }
            Err(error) => return Err(error),
        };
        let outgoing = self
            .upstream_body(incoming, &mut headers, body, routed, to_physical)
            .await?;
        Ok((headers, outgoing))
    }

    /// Where absolute links in responses point: `--advertise-url` when set;
    /// otherwise the local address of the connection the request came on
    /// (`local`: the address and port the client connected to), or the
    /// listen address when that is unknown. The `Host` header is used only
    /// for its host name, and only when the request is virtual-hosted (the
    /// bucket is in the host name) or the address is unspecified; its port is
    /// never used, so a `Host` without a port (the Rust SDK's) still gives
    /// links that reach the sidecar.
    fn client_links(
        &self,
        host: &str,
        virtual_host: Option<String>,
        local: Option<SocketAddr>,
    ) -> LinkBase {
        if let Some(links) = &self.advertised_links {
            return links.clone();
        }
        let listen = local.unwrap_or(self.settings.listen);
        let named = virtual_host.is_some() || listen.ip().is_unspecified();
        let authority = named.then(|| link_host(host)).flatten().map_or_else(
            || self.address_authority(listen),
            |name| Arc::from(format!("{name}:{}", listen.port())),
        );
        LinkBase {
            scheme: Arc::clone(&self.http_scheme),
            authority,
            virtual_host,
        }
    }

    /// `addr` as the authority of a link (loopback for an unspecified address).
    fn address_authority(&self, addr: SocketAddr) -> Arc<str> {
        if addr == self.settings.listen {
            Arc::clone(&self.listen_authority)
        } else {
            Arc::from(loopback_if_unspecified(addr).to_string())
        }
    }

    /// The upstream URL of a routed request's physical path and query.
    fn upstream_uri(&self, path_and_query: http::uri::PathAndQuery) -> Result<Uri, ApiError> {
        Uri::builder()
            .scheme(self.upstream_scheme.clone())
            .authority(self.upstream_authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| ApiError::bad_request(format!("cannot build the upstream URL: {e}")))
    }

    /// The request body to send: streamed, or (metadata) read, translated and
    /// re-measured. `headers` are the upstream headers (`Content-Length`).
    async fn upstream_body<B>(
        &self,
        incoming: &HeaderMap,
        headers: &mut HeaderMap,
        body: B,
        routed: &Route,
        to_physical: &Translator<'_>,
    ) -> Result<Outgoing<B>, ApiError>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let encoding = match routed.request_body {
            // Object data: never decoded, its encoding is the client's business.
            RequestBody::Stream => Encoding::Identity,
            _ => content_encoding(incoming)
                .map_err(|e| ApiError::bad_request(format!("bucketmap-sidecar: {e}")))?,
        };
        if encoding == Encoding::Gzip {
            // The sidecar decodes what it rewrites and forwards it uncompressed.
            headers.remove(header::CONTENT_ENCODING);
        }
        let req = BodyRequest {
            incoming,
            routed,
            to_physical,
            content_type: header_str(incoming, header::CONTENT_TYPE).unwrap_or_default(),
            gzipped: encoding == Encoding::Gzip,
        };
        Ok(match routed.request_body {
            RequestBody::Stream => {
                Outgoing::Body(boxed(Counted::new(body, self.metrics.from_client())))
            }
            RequestBody::None => self.no_body(&req, headers, body).await?,
            RequestBody::Json(hint) => {
                let bytes = self.read_metadata(&req, body).await?;
                check_request_json(&bytes, routed.request_kind)?;
                let new = rewrite_json_bytes(&bytes, hint, to_physical);
                held_or(bytes, req.gzipped, new, |bytes, new| {
                    Outgoing::Body(replaced_body(headers, bytes, new))
                })?
            }
            RequestBody::Xml => {
                let bytes = self.read_metadata(&req, body).await?;
                // Fail closed: what the rewriter cannot read is not forwarded.
                let new = rewrite_xml(&bytes, to_physical).and_then(|new| {
                    new.ok_or_else(|| {
                        ApiError::bad_request(
                            "bucketmap-sidecar refuses this XML request body: it is not well-formed XML",
                        )
                    })
                });
                held_or(bytes, req.gzipped, new, |bytes, new| {
                    Outgoing::Body(replaced_body(headers, bytes, Some(new)))
                })?
            }
            RequestBody::Multipart(hint) => self.multipart_body(&req, headers, body, hint).await?,
            RequestBody::Batch => self.batch_body(&req, headers, body).await?,
        })
    }

    /// The body of an operation that takes none: any byte is refused; an
    /// explicit length or chunked framing becomes `Content-Length: 0`.
    async fn no_body<B>(
        &self,
        req: &BodyRequest<'_, '_>,
        headers: &mut HeaderMap,
        body: B,
    ) -> Result<Outgoing<B>, ApiError>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let bytes = self.read_metadata(req, body).await?;
        if !bytes.is_empty() {
            return Err(ApiError::bad_request(format!(
                "bucketmap-sidecar refuses a request body on {}, which takes none",
                req.routed.operation
            )));
        }
        headers.remove(header::TRANSFER_ENCODING);
        if req.incoming.contains_key(header::CONTENT_LENGTH)
            || req.incoming.contains_key(header::TRANSFER_ENCODING)
        {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
        }
        Ok(Outgoing::Body(empty()))
    }

    /// A `multipart/related` upload: its metadata part checked and translated
    /// as it streams, the media part untouched; `Content-Length` adjusted.
    async fn multipart_body<B>(
        &self,
        req: &BodyRequest<'_, '_>,
        headers: &mut HeaderMap,
        body: B,
        hint: Resource,
    ) -> Result<Outgoing<B>, ApiError>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let limit = self.settings.max_metadata_bytes;
        let counted = Counted::new(body, self.metrics.from_client());
        let counted = if req.gzipped {
            boxed(Gunzip::new(counted))
        } else {
            boxed(counted)
        };
        let kind = req.routed.request_kind;
        let to_physical = req.to_physical;
        let rewritten = upload::rewrite_related(counted, req.content_type, limit, |part| {
            check_request_json(part, kind)?;
            rewrite_json_bytes(part, hint, to_physical)
        })
        .await
        .map_err(|e| e.into_api_error(limit))?;
        if req.gzipped {
            // Decoded as it streams: its length is known only at the end.
            headers.remove(header::CONTENT_LENGTH);
        } else if let Some(length) = content_length(req.incoming) {
            let new_length = length.saturating_add_signed(rewritten.length_delta);
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(new_length));
        }
        Ok(Outgoing::Body(rewritten.body))
    }

    /// A batch: its parts translated, the refused ones counted and answered
    /// locally; answered without the upstream when every part was refused.
    async fn batch_body<B>(
        &self,
        req: &BodyRequest<'_, '_>,
        headers: &mut HeaderMap,
        body: B,
    ) -> Result<Outgoing<B>, ApiError>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let bytes = self.read_metadata(req, body).await?;
        let plan = batch::prepare(&bytes, req.content_type, req.to_physical)?;
        if let Some(refusal) = plan.held() {
            // A part writes to a bucket a move has fenced: the whole batch
            // waits, and is prepared again with the next map.
            return Ok(Outgoing::HeldRead {
                refusal: refusal.clone(),
                bytes,
                gzipped: req.gzipped,
            });
        }
        for reason in plan.refusals() {
            self.metrics.refused(reason);
        }
        Ok(match plan.upstream_body.clone() {
            Some(upstream) => {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(upstream.len()));
                Outgoing::Batch(full(upstream), plan)
            }
            // Every part was refused: answer without the upstream.
            None => Outgoing::Answered(batch::local_response(&plan).map(full)),
        })
    }

    /// Sends upstream (under the upstream timeout), timing the wait for
    /// response headers; a write's `flight` tells a failure that was its
    /// cut-off.
    async fn send(
        &self,
        request: Request<ProxyBody>,
        operation: &'static str,
        flight: Option<Arc<Flight>>,
    ) -> Result<Response<Incoming>, ApiError> {
        let sent = Instant::now();
        let result = self.call_upstream(request).await;
        if !matches!(result, Err(UpstreamError::TimedOut)) {
            self.metrics
                .observe_upstream(operation, sent.elapsed().as_secs_f64());
        }
        result.map_err(|e| match flight.is_some_and(|f| f.is_cut()) {
            // A write cut off: its body failed, so the upstream call did.
            true => ApiError::cut_off(),
            false => e.into_api_error(operation),
        })
    }

    /// One call of the upstream client through the upstream timeout. The
    /// client is always ready (it waits for a connection inside the call),
    /// so it is called without waiting for readiness, through a borrow.
    fn call_upstream(
        &self,
        request: Request<ProxyBody>,
    ) -> TimeoutFuture<<&UpstreamClient as Service<Request<ProxyBody>>>::Future> {
        self.upstream.by_ref().call(request)
    }

    /// A metadata body, read up to `--max-metadata-bytes`, decoded when the
    /// client gzipped it, and counted as bytes from the client.
    async fn read_metadata<B>(&self, req: &BodyRequest<'_, '_>, body: B) -> Result<Bytes, ApiError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let limit = self.settings.max_metadata_bytes;
        let bytes = collect_capped(body, limit).await.map_err(|e| match e {
            CollectError::TooLarge { limit } => ApiError::too_large(limit),
            CollectError::Body(err) => {
                ApiError::bad_request(format!("cannot read the request body: {err}"))
            }
        })?;
        let bytes = match req.gzipped {
            false => bytes,
            true => gunzip(&bytes, limit).map_err(GunzipError::into_api_error)?,
        };
        self.metrics.from_client().inc_by(bytes.len() as u64);
        Ok(bytes)
    }

    /// Translates the upstream's answer: link headers always; the body when it
    /// is metadata (object data streams through untouched).
    async fn translate_response(
        &self,
        response: Response<Incoming>,
        routed: &Route,
        method: &Method,
        tr: &Translator<'_>,
        batch_plan: Option<&batch::Plan>,
    ) -> Result<Response<ProxyBody>, ApiError> {
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let links = present(&parts.headers, LINK_HEADERS.each_ref());
        for (name, _) in LINK_HEADERS.iter().zip(links).filter(|(_, here)| *here) {
            if let Some(value) = parts.headers.get(name).and_then(|v| v.to_str().ok()) {
                let absolute = if value.starts_with('/') {
                    format!("{}://{}{value}", tr.links.scheme, tr.links.authority)
                } else {
                    value.to_owned()
                };
                if let Some(new) =
                    rewrite_url(&absolute, tr).and_then(|v| HeaderValue::from_str(&v).ok())
                {
                    parts.headers.insert(name.clone(), new);
                }
            }
        }
        let content_type = header_str(&parts.headers, header::CONTENT_TYPE).unwrap_or_default();
        let content_type = match content_type.bytes().any(|b| b.is_ascii_uppercase()) {
            true => Cow::Owned(content_type.to_ascii_lowercase()),
            false => Cow::Borrowed(content_type),
        };
        let Some(kind) = metadata_kind(routed, method, parts.status, &content_type) else {
            return Ok(Response::from_parts(parts, boxed(body)));
        };
        let encoding = content_encoding(&parts.headers)
            .map_err(|e| ApiError::bad_gateway(format!("the upstream sent {e}")))?;
        let limit = self.settings.max_metadata_bytes;
        let mut bytes = collect_capped(body, limit).await.map_err(|e| {
            ApiError::bad_gateway(format!("cannot read the upstream response: {e}"))
        })?;
        if encoding == Encoding::Gzip {
            // Sent uncompressed to the client, which may not have asked for gzip.
            bytes = gunzip(&bytes, limit).map_err(|e| {
                ApiError::bad_gateway(format!("cannot read the upstream response: {e}"))
            })?;
            parts.headers.remove(header::CONTENT_ENCODING);
        }
        let new = translate_metadata(kind, &bytes, &parts, tr, batch_plan)?;
        // hyper writes the length of a whole body itself, formatting it
        // into the head it writes (a header value would be allocated).
        // (`Transfer-Encoding` went with the other hop-by-hop headers.)
        parts.headers.remove(header::CONTENT_LENGTH);
        let bytes = new.map(Bytes::from).unwrap_or(bytes);
        Ok(Response::from_parts(parts, full(bytes)))
    }
}

/// The core service: rewrite, forward, rewrite back (see [`Proxy`]).
#[derive(Clone, Debug)]
pub struct Core(pub Arc<Proxy>);

impl<B> Service<Routed<B>> for Core
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = BoxFuture<Result<Answer, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, routed: Routed<B>) -> Self::Future {
        let proxy = self.0.clone();
        Box::pin(async move { Ok(proxy.forward(routed).await) })
    }
}

/// The client's headers minus hop-by-hop ones, with copy sources
/// translated, and `credentials` (from the credentials layer) added where
/// the forwarded headers lack them.
fn upstream_headers(
    incoming: &HeaderMap,
    routed: &Route,
    to_physical: &Translator<'_>,
    credentials: Option<&HeaderMap>,
) -> Result<HeaderMap, ApiError> {
    let mut headers = forwarded_headers(incoming);
    for name in &COPY_SOURCE_HEADERS {
        if let Some(value) = incoming.get(name) {
            let value = value
                .to_str()
                .map_err(|_| ApiError::bad_request(format!("{name} is not ASCII")))?;
            let new = rewrite_copy_source(value, to_physical)?;
            let new = HeaderValue::from_str(&new)
                .map_err(|_| ApiError::bad_request(format!("{name} cannot be rewritten")))?;
            headers.insert(name.clone(), new);
        }
    }
    if routed.response_body != ResponseBody::Media {
        // Metadata responses are rewritten: ask for them uncompressed.
        remove_present(&mut headers, [&header::ACCEPT_ENCODING]);
    }
    if let Some(credentials) = credentials
        && !headers.contains_key(header::AUTHORIZATION)
    {
        for (name, value) in credentials {
            if !headers.contains_key(name) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    Ok(headers)
}

/// What a response body is, when it must be rewritten.
enum MetadataKind {
    Json(Resource),
    Xml,
    Text,
    Batch,
}

/// What translating a request body needs to know of the request.
struct BodyRequest<'a, 't> {
    /// The client's headers.
    incoming: &'a HeaderMap,
    routed: &'a Route,
    to_physical: &'a Translator<'t>,
    /// The client's `Content-Type`, empty when absent or not text.
    content_type: &'a str,
    /// The body is gzip-encoded (never for object data).
    gzipped: bool,
}

/// The request body after translation.
enum Outgoing<B> {
    Body(ProxyBody),
    Batch(ProxyBody, batch::Plan),
    /// Nothing to send: the sidecar answers itself.
    Answered(Response<ProxyBody>),
    /// A name in the body names an entry a move has fenced: the body read
    /// whole (decoded when `gzipped`), to decide the request again.
    HeldRead {
        bytes: Bytes,
        gzipped: bool,
        refusal: ApiError,
    },
    /// A name in the headers does: the body, not read.
    HeldUnread(B, ApiError),
}

/// The body to send made by `send` from the body read (`bytes`) and its
/// translation, or the body held when a name in it names an entry a move
/// has fenced.
fn held_or<B, T>(
    bytes: Bytes,
    gzipped: bool,
    translated: Result<T, ApiError>,
    send: impl FnOnce(Bytes, T) -> Outgoing<B>,
) -> Result<Outgoing<B>, ApiError> {
    match translated {
        Ok(new) => Ok(send(bytes, new)),
        Err(refusal) if policy::holds(&refusal) => Ok(Outgoing::HeldRead {
            bytes,
            gzipped,
            refusal,
        }),
        Err(error) => Err(error),
    }
}

/// Why a request was not sent upstream.
enum Failure<B> {
    /// Answered with this error.
    Refused(ApiError),
    /// Held by a name in its headers or body: the request, its body as far
    /// as it was read, to decide again; and the credentials layer's headers.
    Held(Box<(Held<Replay<B>>, Option<HeaderMap>)>),
}

impl<B> From<ApiError> for Failure<B> {
    fn from(error: ApiError) -> Self {
        Failure::Refused(error)
    }
}

/// The failure of a request held (`held`: the request rebuilt and why) by
/// a name in its headers or body, decided with `mapping`.
fn held_failure<B>(
    held: (Request<Replay<B>>, ApiError),
    routed: &Route,
    mapping: Arc<Mapping>,
    credentials: Option<HeaderMap>,
) -> Failure<B> {
    let (request, refusal) = held;
    let refusal = RefuseRefusal::new(refusal, routed.api.error_style(), routed.operation);
    let held = Held {
        request,
        mapping: Some(mapping),
        refusal,
    };
    Failure::Held(Box::new((held, credentials)))
}

/// Whether (and how) a response body must be rewritten. Object data (media
/// routes, successful) is never touched, whatever its content type.
fn metadata_kind(
    routed: &Route,
    method: &Method,
    status: StatusCode,
    content_type: &str,
) -> Option<MetadataKind> {
    let no_body = *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let media = routed.response_body == ResponseBody::Media && status.as_u16() < 400;
    if no_body || media {
        None
    } else if routed.response_body == ResponseBody::Batch && content_type.starts_with("multipart/")
    {
        Some(MetadataKind::Batch)
    } else if content_type.contains("json") {
        Some(MetadataKind::Json(match routed.response_body {
            ResponseBody::Json(hint) => hint,
            _ => Resource::Generic,
        }))
    } else if content_type.contains("xml") {
        Some(MetadataKind::Xml)
    } else if status.as_u16() >= 400 && content_type.starts_with("text/") {
        Some(MetadataKind::Text)
    } else {
        None
    }
}

/// The translated metadata body of an answer, or `None` to send it as it is.
fn translate_metadata(
    kind: MetadataKind,
    bytes: &[u8],
    parts: &http::response::Parts,
    tr: &Translator<'_>,
    batch_plan: Option<&batch::Plan>,
) -> Result<Option<Vec<u8>>, ApiError> {
    Ok(match kind {
        MetadataKind::Json(hint) => match rewrite_json_body(bytes, hint, tr) {
            Ok(JsonBody::Changed(new)) => Some(new),
            Ok(JsonBody::Unchanged) => None,
            Ok(JsonBody::Unreadable) | Err(_) => Some(unreadable_answer(
                parts.status,
                bytes,
                is_json(bytes),
                tr,
                "JSON",
            )?),
        },
        MetadataKind::Xml => match rewrite_xml(bytes, tr) {
            Ok(Some(new)) => Some(new),
            Ok(None) | Err(_) => Some(unreadable_answer(parts.status, bytes, false, tr, "XML")?),
        },
        MetadataKind::Text => std::str::from_utf8(bytes).ok().map(|text| {
            replace_bucket_tokens(text, |n| tr.bucket_lenient(n))
                .into_owned()
                .into_bytes()
        }),
        MetadataKind::Batch => match batch_plan {
            Some(plan) => {
                let content_type =
                    header_str(&parts.headers, header::CONTENT_TYPE).unwrap_or_default();
                Some(batch::translate_response(bytes, content_type, plan, tr)?)
            }
            // Batch responses answer batch requests, which always have a plan.
            None => None,
        },
    })
}

/// The request body to send after a rewrite (or the original), with
/// `Content-Length` set. (A rewritten response leaves its length to hyper,
/// see `translate_response`; a request cannot: hyper's client sends no
/// length for an empty body, and a POST without one may be refused.)
fn replaced_body(headers: &mut HeaderMap, original: Bytes, new: Option<Vec<u8>>) -> ProxyBody {
    let bytes = new.map(Bytes::from).unwrap_or(original);
    headers.remove(header::TRANSFER_ENCODING);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    full(bytes)
}

fn forwarded_headers(incoming: &HeaderMap) -> HeaderMap {
    let mut headers = incoming.clone();
    remove_present(
        &mut headers,
        [&METHOD_OVERRIDE_HEADER, &header::HOST, &header::EXPECT],
    );
    strip_hop_by_hop(&mut headers);
    headers
}

/// The host name of a `Host` value (`photos.localhost:9023` → `photos.localhost`,
/// `[::1]` stays bracketed), when it is a syntactically valid authority
/// without user info.
fn link_host(host: &str) -> Option<&str> {
    let authority: Authority = host.parse().ok()?;
    if host.contains('@') || authority.host().is_empty() {
        return None;
    }
    let end = if host.starts_with('[') {
        host.find(']')? + 1
    } else {
        host.rfind(':').unwrap_or(host.len())
    };
    Some(&host[..end])
}

/// `0.0.0.0:P` (or `[::]:P`) is no address to link to: use loopback.
fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    }
}

pub(crate) fn header_str(headers: &HeaderMap, name: HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    header_str(headers, header::CONTENT_LENGTH).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn forwarded_requests_lose_host_expect_and_the_method_override() {
        let incoming = header_map(&[
            ("host", "127.0.0.1:9023"),
            ("expect", "100-continue"),
            ("x-http-method-override", "PATCH"),
            ("te", "trailers"),
            ("authorization", "Bearer t"),
            ("x-goog-user-project", "p"),
        ]);
        let forwarded = forwarded_headers(&incoming);
        let mut left: Vec<&str> = forwarded.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "x-goog-user-project"]);
    }

    #[test]
    fn link_hosts_keep_the_name_and_drop_the_port() {
        let cases = [
            ("photos.localhost:9023", Some("photos.localhost")),
            ("photos.localhost", Some("photos.localhost")),
            ("127.0.0.1", Some("127.0.0.1")),
            ("[::1]:9023", Some("[::1]")),
            ("[::1]", Some("[::1]")),
            ("user@host:1", None),
            ("bad host", None),
            ("", None),
        ];
        for (host, want) in cases {
            assert_eq!(link_host(host), want, "{host:?}");
        }
        let any: SocketAddr = "0.0.0.0:9023".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loopback_if_unspecified(any).to_string(), "127.0.0.1:9023");
    }
}
