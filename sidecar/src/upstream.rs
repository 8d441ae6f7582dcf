//! The client of the JSON and XML APIs' upstream: keep-alive HTTP/1.1
//! connections or one multiplexed HTTP/2 connection to the one origin the
//! sidecar forwards to, on hyper's connection API.
//!
//! hyper-util's pooled client, used before, serves any number of origins:
//! every request hashed its origin (SipHash, three times), checked a
//! connection out of a map of pools and back in, and ran a few futures
//! around it, on every proxied request, for origins the sidecar never has
//! (what that cost: docs/BENCHMARKS.md). The sidecar has a single
//! upstream, so its pool is a list: a checkout takes the most recently used
//! connection that is ready (LIFO keeps the warm ones warm), a connection
//! goes back on the list as soon as its response head arrives and is ready
//! again once hyper has read that response's body. What hyper-util did
//! beyond that is kept: an unstarted request on a reused connection the
//! upstream has just closed is sent again on another; HTTP/1.1 requests
//! get `Host` and the origin form; under ALPN, once the upstream picks
//! HTTP/2, requests share that connection, and only one is opened at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection as _, HttpConnector};
use hyper_util::rt::TokioExecutor;
use tower::Service;

use crate::body::{BoxError, ProxyBody};
use crate::config::UpstreamHttp;
use crate::layers::{BorrowingBoxFuture, BoxFuture};

/// Each upstream TLS connection's buffer of records not yet written to its
/// socket, in bytes. rustls's default is 64 KiB, which many concurrent
/// uploads to a TLS upstream over HTTP/1.1 (a connection each) can fill at
/// once. Half of it lowers the sidecar's peak memory under such a load
/// without slowing a single upload; a quarter slows uploads down.
const TLS_SEND_BUFFER: usize = 32 * 1024;

/// hyper lets each upstream connection's read buffer grow to ~400 KiB;
/// with many concurrent streams that dominates the sidecar's memory. This
/// cap keeps the peak of concurrent streams under the sidecar's memory
/// target at a small cost in single-stream download speed; a smaller one
/// costs downloads much more (the figures: docs/BENCHMARKS.md).
const HTTP1_MAX_BUF: usize = 32 * 1024;

/// hyper-rustls's connector, with each TLS connection's send buffer capped
/// at [`TLS_SEND_BUFFER`].
#[derive(Clone, Debug)]
pub struct UpstreamConnector(HttpsConnector<HttpConnector>);

/// What [`UpstreamConnector`] connects.
pub type UpstreamStream =
    hyper_rustls::MaybeHttpsStream<hyper_util::rt::TokioIo<tokio::net::TcpStream>>;

impl Service<Uri> for UpstreamConnector {
    type Response = UpstreamStream;
    type Error = BoxError;
    type Future = BoxFuture<Result<UpstreamStream, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let connecting = self.0.call(dst);
        Box::pin(async move {
            let mut stream = connecting.await?;
            if let hyper_rustls::MaybeHttpsStream::Https(tls) = &mut stream {
                let (_, connection) = tls.inner_mut().get_mut();
                connection.set_buffer_limit(Some(TLS_SEND_BUFFER));
            }
            Ok(stream)
        })
    }
}

/// The TCP side of the upstream clients' connectors: https:// URLs allowed
/// (TLS is layered on top), `connect_timeout`, no Nagle delay.
pub fn tcp_connector(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http
}

/// Builds the client of `origin` (`scheme://host[:port]`) over rustls with
/// `tls`, or plain HTTP, speaking the HTTP version `http`
/// (`--upstream-http`): both offered by ALPN (auto), HTTP/1.1 only (a
/// keep-alive pool) or HTTP/2 only (one multiplexed connection, h2c prior
/// knowledge on http://). Connections idle longer than `idle_timeout` are
/// not reused.
pub fn build_client(
    origin: &Uri,
    connect_timeout: Duration,
    idle_timeout: Duration,
    tls: rustls::ClientConfig,
    http: UpstreamHttp,
) -> anyhow::Result<UpstreamClient> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let tcp = tcp_connector(connect_timeout);
    let https = match http {
        UpstreamHttp::Auto => builder.enable_http1().enable_http2().wrap_connector(tcp),
        UpstreamHttp::Http1 => builder.enable_http1().wrap_connector(tcp),
        UpstreamHttp::Http2 => builder.enable_http2().wrap_connector(tcp),
    };
    let client = UpstreamClient::new(UpstreamConnector(https), origin, http, idle_timeout)?;
    // HTTP/2 only never fills the HTTP/1.1 list: nothing to close.
    if http != UpstreamHttp::Http2
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        runtime.spawn(close_idle(Arc::downgrade(&client.idle), idle_timeout));
    }
    Ok(client)
}

/// Closes the HTTP/1.1 connections idle longer than `idle_timeout` (and
/// forgets closed ones), checking every `idle_timeout` (at least every
/// second), until the client is gone. Checkouts skip expired ones too.
async fn close_idle(idle: Weak<Mutex<Vec<Idle>>>, idle_timeout: Duration) {
    let mut every = tokio::time::interval(idle_timeout.max(Duration::from_secs(1)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(idle) = idle.upgrade() else {
            return;
        };
        let now = Instant::now();
        lock(&idle).retain(|entry| !entry.expired(now, idle_timeout) && !entry.sender.is_closed());
    }
}

/// An upstream call that failed before a response head arrived.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No connection could be made (TCP, TLS or the HTTP handshake).
    #[error("cannot connect to the upstream {origin}")]
    Connect {
        /// The upstream's origin.
        origin: Uri,
        /// What failed.
        #[source]
        source: BoxError,
    },
    /// The request was sent, or the connection failed under it.
    #[error("the upstream request failed")]
    Send(#[source] hyper::Error),
}

/// The upstream client: see the module documentation.
pub struct UpstreamClient {
    connector: UpstreamConnector,
    /// `scheme://authority/`: what the connector dials.
    origin: Uri,
    http: UpstreamHttp,
    idle_timeout: Duration,
    /// `Host` of HTTP/1.1 requests that carry none, as hyper-util set it.
    host: HeaderValue,
    /// HTTP/1.1 connections not in use, or finishing a response body; the
    /// most recently used last. Shared with the task that closes the ones
    /// idle too long ([`close_idle`]).
    idle: Arc<Mutex<Vec<Idle>>>,
    /// The HTTP/2 connection, once there is one.
    shared: Mutex<Option<http2::SendRequest<ProxyBody>>>,
    /// Held while an HTTP/2 connection is being made: requests meanwhile
    /// wait for it rather than open their own.
    connecting: tokio::sync::Mutex<()>,
    /// The upstream picked HTTP/2 by ALPN on the latest connection (auto,
    /// and set under HTTP/2 only too, which ignores it).
    alpn_h2: AtomicBool,
}

impl std::fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamClient")
            .field("origin", &self.origin)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

/// An HTTP/1.1 connection on the list, and since when (its last response head).
struct Idle {
    sender: http1::SendRequest<ProxyBody>,
    since: Instant,
}

/// A connection to send one request on.
enum Checkout {
    Http1(http1::SendRequest<ProxyBody>),
    Http2(http2::SendRequest<ProxyBody>),
}

/// A checked-out connection, and whether it served requests before (only
/// those are retried when they turn out closed).
struct Checked {
    conn: Checkout,
    reused: bool,
}

impl Checked {
    fn reused(conn: Checkout) -> Self {
        Checked { conn, reused: true }
    }

    fn fresh(conn: Checkout) -> Self {
        Checked {
            conn,
            reused: false,
        }
    }
}

impl Idle {
    /// Done with its last response (hyper has read the body) longer than
    /// `idle_timeout` ago, as of `now`. One still busy never is.
    fn expired(&self, now: Instant, idle_timeout: Duration) -> bool {
        self.sender.is_ready() && now.duration_since(self.since) > idle_timeout
    }
}

impl UpstreamClient {
    fn new(
        connector: UpstreamConnector,
        origin: &Uri,
        http: UpstreamHttp,
        idle_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let (Some(scheme), Some(authority)) = (origin.scheme(), origin.authority()) else {
            anyhow::bail!("the upstream {origin} has no scheme or no host");
        };
        let origin = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()?;
        let host = host_header(scheme, authority)?;
        Ok(Self {
            connector,
            origin,
            http,
            idle_timeout,
            host,
            idle: Arc::default(),
            shared: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            alpn_h2: AtomicBool::new(false),
        })
    }

    /// Sends `request` (an absolute URI on the upstream's origin) and
    /// returns the response head, its body still to read.
    pub async fn send(
        &self,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, CallError> {
        let uri = request.uri().clone();
        loop {
            let Checked { conn, reused } = self.checkout().await?;
            let sent = match conn {
                Checkout::Http1(mut sender) => {
                    for_http1(&mut request, &self.host);
                    let sent = sender.try_send_request(request).await;
                    self.put_idle(sender);
                    sent
                }
                Checkout::Http2(mut sender) => sender.try_send_request(request).await,
            };
            match sent {
                Ok(response) => return Ok(response),
                Err(err) => request = retryable(err, reused)?,
            }
            *request.uri_mut() = uri.clone();
        }
    }

    /// A connection for one request: an idle HTTP/1.1 one, the HTTP/2 one,
    /// or a new one.
    async fn checkout(&self) -> Result<Checked, CallError> {
        if self.speaks_http2() {
            return self.checkout_http2().await;
        }
        if let Some(sender) = self.take_idle() {
            return Ok(Checked::reused(Checkout::Http1(sender)));
        }
        Ok(Checked::fresh(self.connect().await?))
    }

    /// Whether requests go over the shared HTTP/2 connection.
    fn speaks_http2(&self) -> bool {
        self.http == UpstreamHttp::Http2 || self.alpn_h2.load(Ordering::Relaxed)
    }

    /// The HTTP/2 connection, made first when there is none alive.
    async fn checkout_http2(&self) -> Result<Checked, CallError> {
        if let Some(sender) = self.live_shared() {
            return Ok(Checked::reused(Checkout::Http2(sender)));
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(sender) = self.live_shared() {
            return Ok(Checked::reused(Checkout::Http2(sender)));
        }
        Ok(Checked::fresh(self.connect().await?))
    }

    fn live_shared(&self) -> Option<http2::SendRequest<ProxyBody>> {
        let shared = lock(&self.shared);
        shared
            .as_ref()
            .filter(|sender| !sender.is_closed())
            .cloned()
    }

    /// The most recently used ready HTTP/1.1 connection; closed ones, and
    /// ready ones idle longer than the idle timeout, are dropped on the way.
    fn take_idle(&self) -> Option<http1::SendRequest<ProxyBody>> {
        let mut idle = lock(&self.idle);
        let mut now = None;
        let mut at = idle.len();
        while at > 0 {
            at -= 1;
            let entry = &idle[at];
            if entry.sender.is_closed() {
                idle.remove(at);
            } else if entry.sender.is_ready() {
                let now = *now.get_or_insert_with(Instant::now);
                let entry = idle.remove(at);
                if !entry.expired(now, self.idle_timeout) {
                    return Some(entry.sender);
                }
            }
        }
        None
    }

    /// Puts an HTTP/1.1 connection back on the list after a response head
    /// (or a failure, when it is still open): ready again once hyper has
    /// read the response's body.
    fn put_idle(&self, sender: http1::SendRequest<ProxyBody>) {
        if sender.is_closed() {
            return;
        }
        let since = Instant::now();
        lock(&self.idle).push(Idle { sender, since });
    }

    /// A new connection: TCP, TLS, then the HTTP handshake of the version
    /// asked for or picked by ALPN. Its task runs on the runtime.
    ///
    /// Boxed: connecting is rare, and its state (TCP and TLS, several KiB)
    /// would otherwise be part of every request's future, copied with it.
    fn connect(&self) -> BorrowingBoxFuture<'_, Result<Checkout, CallError>> {
        Box::pin(self.open_connection())
    }

    async fn open_connection(&self) -> Result<Checkout, CallError> {
        let connect_error = |source: BoxError| CallError::Connect {
            origin: self.origin.clone(),
            source,
        };
        let io = self
            .connector
            .clone()
            .call(self.origin.clone())
            .await
            .map_err(connect_error)?;
        let http2 = match self.http {
            UpstreamHttp::Http2 => true,
            UpstreamHttp::Http1 => false,
            UpstreamHttp::Auto => io.connected().is_negotiated_h2(),
        };
        // Under ALPN the upstream's latest choice holds (one that stops
        // offering HTTP/2 gets a keep-alive pool again).
        self.alpn_h2.store(http2, Ordering::Relaxed);
        if !http2 {
            let (mut sender, conn) = http1::Builder::new()
                .max_buf_size(HTTP1_MAX_BUF)
                .handshake(io)
                .await
                .map_err(|e| connect_error(e.into()))?;
            tokio::spawn(drive(conn));
            sender.ready().await.map_err(|e| connect_error(e.into()))?;
            return Ok(Checkout::Http1(sender));
        }
        let (mut sender, conn) = http2::Builder::new(TokioExecutor::new())
            .handshake(io)
            .await
            .map_err(|e| connect_error(e.into()))?;
        tokio::spawn(drive(conn));
        sender.ready().await.map_err(|e| connect_error(e.into()))?;
        *lock(&self.shared) = Some(sender.clone());
        Ok(Checkout::Http2(sender))
    }
}

/// The `Host` of HTTP/1.1 requests to `scheme://authority`: the host, and
/// the port unless it is the scheme's default (as hyper-util set it). The
/// client adds it to every HTTP/1.1 request, which carries none (the
/// application's own `Host` is not forwarded); HTTP/2 carries the
/// authority in `:authority` instead.
fn host_header(scheme: &Scheme, authority: &Authority) -> anyhow::Result<HeaderValue> {
    let default_port = match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    let host = match authority.port_u16() {
        Some(port) if Some(port) != default_port => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    };
    HeaderValue::from_str(&host)
        .map_err(|e| anyhow::anyhow!("the upstream host {host:?} is no header value: {e}"))
}

/// Runs a connection's task until it closes; its failure reaches the
/// request it failed under, so it is only logged here.
async fn drive<F: std::future::Future<Output = hyper::Result<()>>>(conn: F) {
    if let Err(err) = conn.await {
        tracing::debug!(error = %err, "upstream connection closed with an error");
    }
}

/// An HTTP/1.1 request: `Host` when it has none, and the origin form of
/// its target (what a client sends to a server, not to a proxy).
fn for_http1(request: &mut Request<ProxyBody>, host: &HeaderValue) {
    request
        .headers_mut()
        .entry(header::HOST)
        .or_insert_with(|| host.clone());
    if request.uri().scheme().is_some() {
        let origin_form = request
            .uri()
            .path_and_query()
            .cloned()
            .map_or_else(Uri::default, Uri::from);
        *request.uri_mut() = origin_form;
    }
}

/// The request back, when it never left and its connection was a reused
/// one the upstream had closed (it goes again on another connection);
/// otherwise the failure.
fn retryable(
    mut err: TrySendError<Request<ProxyBody>>,
    reused: bool,
) -> Result<Request<ProxyBody>, CallError> {
    match err.take_message() {
        Some(request) if reused => {
            tracing::debug!(error = %err.error(), "unsent request goes on another upstream connection");
            Ok(request)
        }
        _ => Err(CallError::Send(err.into_error())),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The lists hold no invariant a panic could break half-way.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<'a> Service<Request<ProxyBody>> for &'a UpstreamClient {
    type Response = Response<Incoming>;
    type Error = CallError;
    type Future = BorrowingBoxFuture<'a, Result<Response<Incoming>, CallError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ProxyBody>) -> Self::Future {
        let client: &'a UpstreamClient = self;
        Box::pin(client.send(request))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt as _;
    use hyper::server::conn::{http1 as server1, http2 as server2};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;

    use super::*;
    use crate::body::empty;

    /// A loopback upstream that counts the connections it accepts and
    /// answers each request with its target and `Host`; with `close_after`
    /// it closes each connection after that many requests.
    struct Counting {
        addr: SocketAddr,
        connections: Arc<AtomicUsize>,
        /// Connections that have ended.
        ended: Arc<AtomicUsize>,
    }

    impl Counting {
        async fn start(http2: bool, close_after: Option<usize>) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let connections = Arc::new(AtomicUsize::new(0));
            let ended = Arc::new(AtomicUsize::new(0));
            let (accepted, finished) = (connections.clone(), ended.clone());
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let finished = finished.clone();
                    tokio::spawn(async move {
                        serve(TokioIo::new(tcp), http2, close_after).await;
                        finished.fetch_add(1, Ordering::SeqCst);
                    });
                }
            });
            Self {
                addr,
                connections,
                ended,
            }
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }

        fn client(&self, http: UpstreamHttp, idle_timeout: Duration) -> UpstreamClient {
            let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
            let origin: Uri = format!("http://{}", self.addr).parse().expect("origin");
            build_client(&origin, Duration::from_secs(5), idle_timeout, tls, http).expect("client")
        }

        fn uri(&self, path: &str) -> Uri {
            format!("http://{}{path}", self.addr).parse().expect("uri")
        }
    }

    async fn serve(io: TokioIo<tokio::net::TcpStream>, http2: bool, close_after: Option<usize>) {
        let served = Arc::new(AtomicUsize::new(0));
        let (closing_tx, mut closing) = tokio::sync::watch::channel(false);
        let service = service_fn(move |req: Request<Incoming>| {
            let host = req.headers().get(header::HOST).cloned();
            let answer = format!("{} {:?} {:?}", req.uri(), host, req.version());
            let count = served.fetch_add(1, Ordering::SeqCst) + 1;
            if close_after == Some(count) {
                let _ = closing_tx.send(true);
            }
            async move {
                Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                    bytes::Bytes::from(answer),
                )))
            }
        });
        if http2 {
            let _ = server2::Builder::new(TokioExecutor::new())
                .serve_connection(io, service)
                .await;
            return;
        }
        let conn = server1::Builder::new().serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = async { closing.wait_for(|closing| *closing).await.map(drop) } => {
                // Finish the answer in flight, then close without a word.
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }

    async fn get(client: &UpstreamClient, uri: Uri) -> String {
        let request = Request::get(uri).body(empty()).expect("request");
        let response = client.send(request).await.expect("an answer");
        let body = response.into_body().collect().await.expect("a body");
        String::from_utf8(body.to_bytes().to_vec()).expect("UTF-8")
    }

    #[test]
    fn the_host_of_http1_requests_is_what_the_application_would_send() {
        let cases = [
            ("http://127.0.0.1:4443", "127.0.0.1:4443"),
            ("http://gcs.local:80", "gcs.local"),
            ("https://storage.googleapis.com", "storage.googleapis.com"),
            (
                "https://storage.googleapis.com:443",
                "storage.googleapis.com",
            ),
            ("https://gcs.local:80", "gcs.local:80"),
            ("http://[::1]:9000", "[::1]:9000"),
            ("http://gcs.local:8080", "gcs.local:8080"),
        ];
        for (url, want) in cases {
            let uri: Uri = url.parse().expect("url");
            let (scheme, authority) = (
                uri.scheme().expect("scheme"),
                uri.authority().expect("host"),
            );
            let host = host_header(scheme, authority).expect("host");
            assert_eq!(host.to_str().expect("ascii"), want, "{url}");
        }
    }

    /// Every request's future holds `send`'s: connecting (TCP and TLS,
    /// several KiB of state) is boxed apart, so that it is not copied with
    /// each request. Unboxed, this future would hold that state too.
    #[tokio::test]
    async fn a_request_future_does_not_carry_the_state_of_connecting() {
        let upstream = Counting::start(false, None).await;
        let client = upstream.client(UpstreamHttp::Http1, Duration::from_secs(90));
        let send = client.send(Request::new(empty()));
        let size = std::mem::size_of_val(&send);
        assert!(size < 2048, "the send future takes {size} bytes");
        drop(send);
        assert!(std::mem::size_of_val(&client.connect()) <= 16);
    }

    #[tokio::test]
    async fn sequential_requests_share_one_http1_connection_with_host_and_origin_form() {
        let upstream = Counting::start(false, None).await;
        let client = upstream.client(UpstreamHttp::Http1, Duration::from_secs(90));
        for i in 0..20 {
            let seen = get(&client, upstream.uri(&format!("/o/{i}?alt=json"))).await;
            let host = upstream.addr.to_string();
            assert_eq!(seen, format!("/o/{i}?alt=json Some({host:?}) HTTP/1.1"));
        }
        assert_eq!(upstream.connections(), 1);
    }

    #[tokio::test]
    async fn concurrent_requests_open_connections_that_are_then_reused() {
        let upstream = Counting::start(false, None).await;
        let client = Arc::new(upstream.client(UpstreamHttp::Http1, Duration::from_secs(90)));
        let concurrent = |round: usize| {
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let (client, uri) = (client.clone(), upstream.uri(&format!("/{round}/{i}")));
                    tokio::spawn(async move { get(&client, uri).await })
                })
                .collect();
            futures::future::join_all(tasks)
        };
        for answer in concurrent(0).await {
            assert!(answer.expect("task").starts_with("/0/"));
        }
        let opened = upstream.connections();
        assert!(
            (1..=8).contains(&opened),
            "{opened} connections for 8 requests"
        );
        for round in 1..4 {
            for answer in concurrent(round).await {
                answer.expect("task");
            }
        }
        assert!(
            upstream.connections() <= 8,
            "{} connections",
            upstream.connections()
        );
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_not_reused() {
        let upstream = Counting::start(false, Some(1)).await;
        let client = upstream.client(UpstreamHttp::Http1, Duration::from_secs(90));
        for i in 0..5 {
            get(&client, upstream.uri(&format!("/{i}"))).await;
            // Wait until the client saw the close (a request racing the
            // close is retried only when hyper has not written it: not this
            // test): the upstream closes every connection after one request.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while lock(&client.idle)
                .iter()
                .any(|idle| !idle.sender.is_closed())
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        assert_eq!(upstream.connections(), 5);
        assert!(
            lock(&client.idle)
                .iter()
                .all(|idle| !idle.sender.is_ready())
        );
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_timeout_is_not_reused() {
        let upstream = Counting::start(false, None).await;
        let client = upstream.client(UpstreamHttp::Http1, Duration::from_millis(50));
        get(&client, upstream.uri("/a")).await;
        get(&client, upstream.uri("/b")).await;
        assert_eq!(upstream.connections(), 1);
        tokio::time::sleep(Duration::from_millis(120)).await;
        get(&client, upstream.uri("/c")).await;
        assert_eq!(upstream.connections(), 2);
        assert_eq!(lock(&client.idle).len(), 1, "the expired one was dropped");
    }

    #[tokio::test]
    async fn connections_idle_past_the_timeout_are_closed_without_a_request() {
        let upstream = Counting::start(false, None).await;
        let client = upstream.client(UpstreamHttp::Http1, Duration::from_millis(50));
        get(&client, upstream.uri("/a")).await;
        assert_eq!(upstream.ended.load(Ordering::SeqCst), 0);
        // The closing task looks every second at the shortest: wait until
        // the upstream saw the close.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while upstream.ended.load(Ordering::SeqCst) == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(lock(&client.idle).is_empty());
        assert_eq!(
            upstream.ended.load(Ordering::SeqCst),
            1,
            "the upstream saw it close"
        );
    }

    #[tokio::test]
    async fn http2_requests_share_one_connection_opened_once() {
        let upstream = Counting::start(true, None).await;
        let client = Arc::new(upstream.client(UpstreamHttp::Http2, Duration::from_secs(90)));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let (client, uri) = (client.clone(), upstream.uri(&format!("/{i}")));
                tokio::spawn(async move { get(&client, uri).await })
            })
            .collect();
        for (i, answer) in futures::future::join_all(tasks)
            .await
            .into_iter()
            .enumerate()
        {
            let answer = answer.expect("task");
            let authority = upstream.addr;
            assert_eq!(answer, format!("http://{authority}/{i} None HTTP/2.0"));
        }
        assert_eq!(upstream.connections(), 1);
    }

    #[tokio::test]
    async fn an_upstream_that_refuses_connections_is_an_error_naming_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let upstream = Counting {
            addr,
            connections: Arc::default(),
            ended: Arc::default(),
        };
        let client = upstream.client(UpstreamHttp::Http1, Duration::from_secs(90));
        let request = Request::get(upstream.uri("/"))
            .body(empty())
            .expect("request");
        let err = client.send(request).await.expect_err("nobody listens");
        assert!(matches!(err, CallError::Connect { .. }), "{err:?}");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}
