//! The request handler: route, translate, forward, translate back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::auth::Auth;
use crate::batch;
use crate::body::{BoxError, CollectError, Counted, ProxyBody, boxed, collect_capped, empty, full};
use crate::config::INTERNAL_PREFIX;
use crate::encoding::{Encoding, Gunzip, GunzipError, content_encoding, gunzip};
use crate::errors::{ApiError, ErrorStyle};
use crate::mapping::{Mapping, MappingStore};
use crate::metrics::{Metrics, OperationLabels, RequestLabels};
use crate::rewrite::json::rewrite_json_bytes;
use crate::rewrite::strict::check_request_json;
use crate::rewrite::text::replace_bucket_tokens;
use crate::rewrite::url::{rewrite_copy_source, rewrite_url};
use crate::rewrite::xml::rewrite_xml;
use crate::rewrite::{Direction, LinkBase, Translator, request_bucket};
use crate::route::{
    RequestBody, Resource, ResponseBody, Route, replace_slots, route, virtual_host_bucket,
};
use crate::signing::signature_kind;
use crate::upload;

/// The pooled upstream client.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, ProxyBody>;

/// Builds the upstream client: HTTP/1.1 and HTTP/2 over rustls with the
/// bundled webpki roots (distroless images have no CA store), or plain HTTP.
pub fn build_client(
    connect_timeout: Duration,
    pool_idle_timeout: Duration,
) -> anyhow::Result<HttpClient> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    // An explicit provider: ring and aws-lc are both linked, rustls cannot pick alone.
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .map_err(|e| anyhow::anyhow!("cannot configure TLS for the upstream: {e}"))?
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(pool_idle_timeout)
        // hyper lets each upstream connection's read buffer grow to ~400 KiB;
        // with many concurrent streams that dominates the sidecar's memory.
        // 64 KiB keeps streaming throughput and bounds it (benches/proxy.rs).
        .http1_max_buf_size(64 * 1024)
        .build(https))
}

/// Behaviour switches of the proxy.
#[derive(Clone, Debug)]
pub struct ProxySettings {
    pub allow_physical_names: bool,
    pub max_metadata_bytes: usize,
    /// Time to upstream response headers; `None` for no limit.
    pub upstream_timeout: Option<Duration>,
    /// The address clients connect to; links in responses point at it.
    pub listen: SocketAddr,
    /// Where links point instead, when set (`--advertise-url`).
    pub advertise_url: Option<Uri>,
}

/// The local address of the connection a request arrived on, put in the
/// request's extensions by [`crate::server::serve`]: links in responses
/// point at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLocalAddr(pub SocketAddr);

/// Everything a request needs.
pub struct Proxy {
    mapping: Arc<MappingStore>,
    client: HttpClient,
    upstream_scheme: Scheme,
    upstream_authority: Authority,
    /// Where links in requests point: the upstream.
    upstream_links: LinkBase,
    auth: Auth,
    metrics: Arc<Metrics>,
    settings: ProxySettings,
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

/// A request answered by the sidecar itself.
struct Rejection {
    error: ApiError,
    style: ErrorStyle,
}

fn reject(style: ErrorStyle) -> impl Fn(ApiError) -> Rejection {
    move |error| Rejection { error, style }
}

/// Hop-by-hop headers, never forwarded in either direction.
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Response headers holding absolute URLs the client follows.
const LINK_HEADERS: [&str; 4] = [
    "location",
    "content-location",
    "x-goog-upload-url",
    "x-goog-upload-control-url",
];

impl Proxy {
    pub fn new(
        mapping: Arc<MappingStore>,
        client: HttpClient,
        upstream: &Uri,
        auth: Auth,
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
            scheme: upstream_scheme.to_string(),
            authority: upstream_authority.to_string(),
            virtual_host: None,
        };
        Ok(Self {
            mapping,
            client,
            upstream_scheme,
            upstream_authority,
            upstream_links,
            auth,
            metrics,
            settings,
        })
    }

    /// Serves one request; never fails (errors become GCS-style responses).
    pub async fn handle<B>(&self, req: Request<B>) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let started = Instant::now();
        let method = req.method().clone();
        // For the log lines (a `Uri` clone shares its bytes).
        let uri = req.uri().clone();
        let target = LogPath(uri.path());
        let _in_flight = InFlight::new(&self.metrics);
        let mut operation = "unrouted";
        let response = match self.serve(req, &mut operation).await {
            Ok(response) => response,
            Err(Rejection { error, style }) => {
                tracing::info!(
                    %method,
                    path = %target,
                    operation,
                    status = error.status.as_u16(),
                    reason = error.reason,
                    message = %error.message,
                    "rejected"
                );
                error.into_response(style)
            }
        };
        let status = response.status().as_u16();
        let labels = RequestLabels { operation, status };
        self.metrics.requests.get_or_create(&labels).inc();
        let elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::debug!(%method, path = %target, operation, status, elapsed_ms, "served");
        let to_client = self.metrics.to_client();
        response.map(|body| boxed(Counted::new(body, to_client)))
    }

    async fn serve<B>(
        &self,
        req: Request<B>,
        operation: &mut &'static str,
    ) -> Result<Response<ProxyBody>, Rejection>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let host = request_host(&req).unwrap_or_else(|| self.settings.listen.to_string());
        let mapping = self.mapping.current();
        let vhost = mapping
            .as_deref()
            .and_then(|m| virtual_host_bucket(&host, |label| m.knows(label)));
        let path = req.uri().path().to_owned();
        let query = req.uri().query().map(str::to_owned);

        if vhost.is_none()
            && let Some(what) = path.strip_prefix(INTERNAL_PREFIX)
        {
            *operation = "internal";
            return Ok(self.internal(what));
        }
        if header_str(req.headers(), header::CONTENT_TYPE)
            .is_some_and(|ct| ct.starts_with("application/grpc"))
        {
            *operation = "grpc";
            return Err(Rejection {
                error: ApiError::grpc_unsupported(),
                style: ErrorStyle::Json,
            });
        }
        let method = effective_method(req.method(), req.headers()).map_err(|error| {
            self.metrics.refused("method_override");
            Rejection {
                error,
                style: guess_style(&path),
            }
        })?;
        let routed = route(&method, &path, query.as_deref(), vhost.as_deref()).map_err(|e| {
            self.metrics.refused(e.reason());
            Rejection {
                error: ApiError::refused_request(&e),
                style: guess_style(&path),
            }
        })?;
        *operation = routed.operation;
        let style = routed.api.error_style();
        let rejected = reject(style);

        if let Some(kind) = signature_kind(query.as_deref(), req.headers()) {
            return Err(rejected(ApiError::signed_request(kind)));
        }
        let mapping = mapping.ok_or_else(|| rejected(ApiError::not_ready()))?;
        let target = self
            .upstream_target(&routed, &mapping, &path, query.as_deref())
            .map_err(&rejected)?;

        let allow = self.settings.allow_physical_names;
        let to_physical = Translator {
            mapping: &mapping,
            direction: Direction::ToPhysical,
            allow_physical: allow,
            links: &self.upstream_links,
        };
        let local = req.extensions().get::<ConnectionLocalAddr>().map(|a| a.0);
        let client_links = self.client_links(&host, routed.virtual_host.clone(), local);
        let to_logical = Translator {
            mapping: &mapping,
            direction: Direction::ToLogical,
            allow_physical: allow,
            links: &client_links,
        };

        let (parts, body) = req.into_parts();
        let mut headers = self
            .upstream_headers(&parts.headers, &routed, &to_physical)
            .await
            .map_err(&rejected)?;
        let (upstream_body, batch_plan) = match self
            .upstream_body(&parts.headers, &mut headers, body, &routed, &to_physical)
            .await
            .map_err(&rejected)?
        {
            Outgoing::Body(body) => (body, None),
            Outgoing::Batch(body, plan) => (body, Some(plan)),
            Outgoing::Answered(response) => return Ok(response),
        };

        let mut upstream_req = Request::new(upstream_body);
        *upstream_req.method_mut() = method.clone();
        *upstream_req.uri_mut() = target;
        *upstream_req.headers_mut() = headers;
        let response = self
            .send(upstream_req, routed.operation)
            .await
            .map_err(&rejected)?;
        self.translate_response(response, &routed, &method, &to_logical, batch_plan.as_ref())
            .await
            .map_err(&rejected)
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
        if let Some(url) = &self.settings.advertise_url {
            return LinkBase {
                scheme: url.scheme_str().unwrap_or("http").to_owned(),
                authority: url.authority().map(|a| a.to_string()).unwrap_or_default(),
                virtual_host: None,
            };
        }
        let listen = local.unwrap_or(self.settings.listen);
        let named = virtual_host.is_some() || listen.ip().is_unspecified();
        let authority = named.then(|| link_host(host)).flatten().map_or_else(
            || loopback_if_unspecified(listen).to_string(),
            |name| format!("{name}:{}", listen.port()),
        );
        LinkBase {
            scheme: "http".to_owned(),
            authority,
            virtual_host,
        }
    }

    /// The upstream URL: the raw path with each bucket segment replaced by the
    /// physical name (virtual-hosted requests become path style), the raw query.
    fn upstream_target(
        &self,
        routed: &Route,
        mapping: &Mapping,
        path: &str,
        query: Option<&str>,
    ) -> Result<Uri, ApiError> {
        let allow = self.settings.allow_physical_names;
        let physical: Vec<String> = routed
            .buckets
            .iter()
            .map(|slot| request_bucket(mapping, allow, &slot.name))
            .collect::<Result<_, _>>()?;
        let names: Vec<&str> = physical.iter().map(String::as_str).collect();
        let mut upstream_path = replace_slots(path, &routed.buckets, &names);
        if let Some(bucket) = &routed.virtual_host {
            let bucket = request_bucket(mapping, allow, bucket)?;
            upstream_path = if upstream_path == "/" {
                format!("/{bucket}")
            } else {
                format!("/{bucket}{upstream_path}")
            };
        }
        let path_and_query = match query {
            Some(q) => format!("{upstream_path}?{q}"),
            None => upstream_path,
        };
        let path_and_query = PathAndQuery::try_from(path_and_query)
            .map_err(|e| ApiError::bad_request(format!("cannot build the upstream path: {e}")))?;
        Uri::builder()
            .scheme(self.upstream_scheme.clone())
            .authority(self.upstream_authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| ApiError::bad_request(format!("cannot build the upstream URL: {e}")))
    }

    /// The client's headers minus hop-by-hop ones, with copy sources
    /// translated and credentials added when the client sent none.
    async fn upstream_headers(
        &self,
        incoming: &HeaderMap,
        routed: &Route,
        to_physical: &Translator<'_>,
    ) -> Result<HeaderMap, ApiError> {
        let mut headers = forwarded_headers(incoming);
        for name in ["x-goog-copy-source", "x-amz-copy-source"] {
            if let Some(value) = incoming.get(name) {
                let value = value
                    .to_str()
                    .map_err(|_| ApiError::bad_request(format!("{name} is not ASCII")))?;
                let new = rewrite_copy_source(value, to_physical)?;
                let new = HeaderValue::from_str(&new)
                    .map_err(|_| ApiError::bad_request(format!("{name} cannot be rewritten")))?;
                headers.insert(HeaderName::from_static(name), new);
            }
        }
        if routed.response_body != ResponseBody::Media {
            // Metadata responses are rewritten: ask for them uncompressed.
            headers.remove(header::ACCEPT_ENCODING);
        }
        if !headers.contains_key(header::AUTHORIZATION) {
            match self.auth.headers().await {
                Ok(Some(auth_headers)) => {
                    for (name, value) in &auth_headers {
                        if !headers.contains_key(name) {
                            headers.insert(name.clone(), value.clone());
                        }
                    }
                }
                Ok(None) => {}
                Err(detail) => {
                    tracing::warn!(error = %detail, "cannot obtain credentials");
                    return Err(ApiError::credentials_unavailable(&detail));
                }
            }
        }
        Ok(headers)
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
    ) -> Result<Outgoing, ApiError>
    where
        B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let limit = self.settings.max_metadata_bytes;
        let from_client = self.metrics.from_client();
        let content_type = header_str(incoming, header::CONTENT_TYPE)
            .unwrap_or_default()
            .to_owned();
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
        Ok(match routed.request_body {
            RequestBody::Stream => Outgoing::Body(boxed(Counted::new(body, from_client))),
            RequestBody::None => {
                let bytes = self.read_metadata(incoming, body).await?;
                from_client.inc_by(bytes.len() as u64);
                if !bytes.is_empty() {
                    return Err(ApiError::bad_request(format!(
                        "bucketmap-sidecar refuses a request body on {}, which takes none",
                        routed.operation
                    )));
                }
                headers.remove(header::TRANSFER_ENCODING);
                if incoming.contains_key(header::CONTENT_LENGTH)
                    || incoming.contains_key(header::TRANSFER_ENCODING)
                {
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
                }
                Outgoing::Body(empty())
            }
            RequestBody::Json(hint) => {
                let bytes = self.read_metadata(incoming, body).await?;
                from_client.inc_by(bytes.len() as u64);
                check_request_json(&bytes, routed.request_kind)?;
                let new = rewrite_json_bytes(&bytes, hint, to_physical)?;
                Outgoing::Body(replaced_body(headers, bytes, new))
            }
            RequestBody::Xml => {
                let bytes = self.read_metadata(incoming, body).await?;
                from_client.inc_by(bytes.len() as u64);
                let new = rewrite_xml(&bytes, to_physical)?;
                Outgoing::Body(replaced_body(headers, bytes, new))
            }
            RequestBody::Multipart(hint) => {
                let counted = Counted::new(body, from_client);
                let gzipped = encoding == Encoding::Gzip;
                let counted = if gzipped {
                    boxed(Gunzip::new(counted))
                } else {
                    boxed(counted)
                };
                let kind = routed.request_kind;
                let rewritten = upload::rewrite_related(counted, &content_type, limit, |part| {
                    check_request_json(part, kind)?;
                    rewrite_json_bytes(part, hint, to_physical)
                })
                .await
                .map_err(|e| e.into_api_error(limit))?;
                if gzipped {
                    // Decoded as it streams: its length is known only at the end.
                    headers.remove(header::CONTENT_LENGTH);
                } else if let Some(length) = content_length(incoming) {
                    let new_length = length.saturating_add_signed(rewritten.length_delta);
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(new_length));
                }
                Outgoing::Body(rewritten.body)
            }
            RequestBody::Batch => {
                let bytes = self.read_metadata(incoming, body).await?;
                from_client.inc_by(bytes.len() as u64);
                let plan = batch::prepare(&bytes, &content_type, to_physical)?;
                for reason in plan.refusals() {
                    self.metrics.refused(reason);
                }
                match plan.upstream_body.clone() {
                    Some(upstream) => {
                        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(upstream.len()));
                        Outgoing::Batch(full(upstream), plan)
                    }
                    // Every part was refused: answer without the upstream.
                    None => Outgoing::Answered(batch::local_response(&plan)),
                }
            }
        })
    }

    /// Sends upstream, timing the wait for response headers.
    async fn send(
        &self,
        request: Request<ProxyBody>,
        operation: &'static str,
    ) -> Result<Response<Incoming>, ApiError> {
        let sent = Instant::now();
        let result = match self.settings.upstream_timeout {
            Some(limit) => tokio::time::timeout(limit, self.client.request(request))
                .await
                .map_err(|_| ApiError::gateway_timeout())?,
            None => self.client.request(request).await,
        };
        let labels = OperationLabels { operation };
        self.metrics
            .upstream_latency
            .get_or_create(&labels)
            .observe(sent.elapsed().as_secs_f64());
        result.map_err(|e| {
            if let Some(gzip) = find_source::<GunzipError>(&e) {
                // The client's own body was bad, not the upstream.
                return ApiError::bad_request(format!(
                    "bucketmap-sidecar cannot read the request body (Content-Encoding: gzip): \
                     {gzip}"
                ));
            }
            let detail = error_chain(&e);
            tracing::warn!(operation, error = %detail, "upstream request failed");
            ApiError::bad_gateway(detail)
        })
    }

    async fn read_metadata<B>(&self, headers: &HeaderMap, body: B) -> Result<Bytes, ApiError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let limit = self.settings.max_metadata_bytes;
        let encoding = content_encoding(headers)
            .map_err(|e| ApiError::bad_request(format!("bucketmap-sidecar: {e}")))?;
        let bytes = collect_capped(body, limit).await.map_err(|e| match e {
            CollectError::TooLarge { limit } => ApiError::too_large(limit),
            CollectError::Body(err) => {
                ApiError::bad_request(format!("cannot read the request body: {err}"))
            }
        })?;
        match encoding {
            Encoding::Identity => Ok(bytes),
            Encoding::Gzip => gunzip(&bytes, limit).map_err(GunzipError::into_api_error),
        }
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
        for name in LINK_HEADERS {
            if let Some(value) = parts.headers.get(name).and_then(|v| v.to_str().ok()) {
                let absolute = if value.starts_with('/') {
                    format!("{}://{}{value}", tr.links.scheme, tr.links.authority)
                } else {
                    value.to_owned()
                };
                if let Some(new) =
                    rewrite_url(&absolute, tr).and_then(|v| HeaderValue::from_str(&v).ok())
                {
                    parts.headers.insert(HeaderName::from_static(name), new);
                }
            }
        }
        let content_type = header_str(&parts.headers, header::CONTENT_TYPE)
            .unwrap_or_default()
            .to_ascii_lowercase();
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
        let new = match kind {
            MetadataKind::Json(hint) => rewrite_json_bytes(&bytes, hint, tr).ok().flatten(),
            MetadataKind::Xml => rewrite_xml(&bytes, tr).ok().flatten(),
            MetadataKind::Text => std::str::from_utf8(&bytes).ok().map(|text| {
                replace_bucket_tokens(text, |n| tr.bucket_lenient(n))
                    .into_owned()
                    .into_bytes()
            }),
            MetadataKind::Batch => batch_plan.and_then(|plan| {
                let content_type =
                    header_str(&parts.headers, header::CONTENT_TYPE).unwrap_or_default();
                batch::translate_response(&bytes, content_type, plan, tr)
            }),
        };
        let body = replaced_body(&mut parts.headers, bytes, new);
        Ok(Response::from_parts(parts, body))
    }

    fn internal(&self, what: &str) -> Response<ProxyBody> {
        let text = |status: StatusCode, body: String, content_type: &'static str| {
            let mut response = Response::new(full(body));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        };
        match what {
            "healthz" => text(StatusCode::OK, "ok\n".into(), "text/plain"),
            "readyz" => readiness(&self.mapping, text),
            "metrics" => text(
                StatusCode::OK,
                self.metrics.encode(),
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
            _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
        }
    }
}

/// `/readyz` of both listeners: ready once the mapping sources have been read
/// successfully, even when they hold no entry (see [`MappingStore::is_ready`]).
pub fn readiness<R>(
    mapping: &MappingStore,
    text: impl Fn(StatusCode, String, &'static str) -> R,
) -> R {
    match (mapping.current(), mapping.not_ready_reason()) {
        (Some(m), _) => text(
            StatusCode::OK,
            format!("ready: {} buckets mapped\n", m.len()),
            "text/plain",
        ),
        (None, reason) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: {}\n",
                reason.as_deref().unwrap_or("no mapping loaded yet")
            ),
            "text/plain",
        ),
    }
}

/// What a response body is, when it must be rewritten.
enum MetadataKind {
    Json(Resource),
    Xml,
    Text,
    Batch,
}

/// The request body after translation.
enum Outgoing {
    Body(ProxyBody),
    Batch(ProxyBody, batch::Plan),
    /// Nothing to send: the sidecar answers itself.
    Answered(Response<ProxyBody>),
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

/// A request path in a log line, cut at 256 characters.
struct LogPath<'a>(&'a str);

impl std::fmt::Display for LogPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(256) {
            Some((end, _)) => write!(f, "{}…", &self.0[..end]),
            None => f.write_str(self.0),
        }
    }
}

/// Counts a request in the in-flight gauge for as long as it lives (also
/// when the client goes away and the handler future is dropped).
struct InFlight<'m>(&'m Metrics);

impl<'m> InFlight<'m> {
    fn new(metrics: &'m Metrics) -> Self {
        metrics.in_flight.inc();
        Self(metrics)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// The body to send after a rewrite (or the original), with `Content-Length` set.
fn replaced_body(headers: &mut HeaderMap, original: Bytes, new: Option<Vec<u8>>) -> ProxyBody {
    let bytes = new.map(Bytes::from).unwrap_or(original);
    headers.remove(header::TRANSFER_ENCODING);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    full(bytes)
}

/// The header some clients (Google's Java client on `HttpURLConnection`) use
/// to send a PATCH as a POST.
const METHOD_OVERRIDE: &str = "x-http-method-override";

/// The method a request is routed and forwarded as: `X-HTTP-Method-Override`
/// is honoured on a POST (the upstream then gets the real method, without
/// the header); on any other method, or given twice, or naming a method GCS
/// does not serve, it is refused.
fn effective_method(method: &Method, headers: &HeaderMap) -> Result<Method, ApiError> {
    let mut values = headers.get_all(METHOD_OVERRIDE).iter();
    let Some(value) = values.next() else {
        return Ok(method.clone());
    };
    let refuse = |why: String| {
        ApiError::bad_request(format!(
            "bucketmap-sidecar refuses X-HTTP-Method-Override here: {why}"
        ))
    };
    if values.next().is_some() {
        return Err(refuse("it is given more than once".to_owned()));
    }
    if *method != Method::POST {
        return Err(refuse(format!(
            "it is honoured on POST only, and this is a {method}"
        )));
    }
    let served = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
    ];
    value
        .to_str()
        .ok()
        .and_then(|v| Method::from_bytes(v.trim().as_bytes()).ok())
        .filter(|m| served.contains(m))
        .ok_or_else(|| refuse(format!("{value:?} is not a method GCS serves")))
}

fn forwarded_headers(incoming: &HeaderMap) -> HeaderMap {
    let mut headers = incoming.clone();
    headers.remove(METHOD_OVERRIDE);
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::EXPECT);
    headers
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers the `Connection` header lists are hop-by-hop too.
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&listed) {
        headers.remove(name);
    }
}

fn request_host<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .filter(|h| !h.is_empty())
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

fn header_str(headers: &HeaderMap, name: HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    header_str(headers, header::CONTENT_LENGTH).and_then(|v| v.trim().parse().ok())
}

/// The error format for a request that could not be routed.
fn guess_style(path: &str) -> ErrorStyle {
    let json = [
        "/storage/",
        "/upload/",
        "/download/",
        "/batch/",
        "/resumable/",
    ];
    if json.iter().any(|p| path.starts_with(p)) {
        ErrorStyle::Json
    } else {
        ErrorStyle::Xml
    }
}

/// The first error of type `E` in `err`'s source chain.
fn find_source<'e, E: std::error::Error + 'static>(
    err: &'e (dyn std::error::Error + 'static),
) -> Option<&'e E> {
    let mut current = Some(err);
    while let Some(inner) = current {
        if let Some(found) = inner.downcast_ref::<E>() {
            return Some(found);
        }
        current = inner.source();
    }
    None
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        out.push_str(": ");
        out.push_str(&inner.to_string());
        source = inner.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
