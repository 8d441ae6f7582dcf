//! The loopback harness: a tiny hyper upstream standing in for GCS, the
//! proxy in front of it (built through the crate's public API), a hyper
//! client, and helpers shared by the test modules.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use bucketmap_sidecar::auth::Auth;
use bucketmap_sidecar::body::{BoxError, ProxyBody, empty, full};
use bucketmap_sidecar::config::UpstreamHttp;
use bucketmap_sidecar::grpc::service::{GrpcProxy, GrpcSettings, build_grpc_client};
use bucketmap_sidecar::mapping::{Mapping, MappingStore};
use bucketmap_sidecar::metrics::Metrics;
use bucketmap_sidecar::proxy::{Proxy, ProxySettings};
use bucketmap_sidecar::server::{ServerSettings, proxy_stack, serve};
use bucketmap_sidecar::upstream::build_client;

pub const PHYSICAL: &str = "photos-k3x9q2mw";
pub const TIMEOUT: Duration = Duration::from_secs(60);

pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>>
        + Send
        + Sync,
>;

/// What the upstream saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub target: String,
    pub version: http::Version,
    pub headers: http::HeaderMap,
}

/// A loopback HTTP server standing in for GCS.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// `https` when the upstream speaks TLS.
    scheme: &'static str,
    _stop: watch::Sender<bool>,
}

type UpstreamService = tower::util::BoxCloneSyncService<
    Request<Incoming>,
    Response<ProxyBody>,
    std::convert::Infallible,
>;

/// `handler`, recording each request in `seen`.
fn recording(handler: Handler, seen: Arc<Mutex<Vec<Seen>>>) -> UpstreamService {
    let serve_fn = move |req: Request<Incoming>| {
        let target = req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default();
        seen.lock().expect("lock").push(Seen {
            target,
            version: req.version(),
            headers: req.headers().clone(),
        });
        let answer = handler(req);
        async move { Ok::<_, std::convert::Infallible>(answer.await) }
    };
    tower::util::BoxCloneSyncService::new(tower::service_fn(serve_fn))
}

impl Upstream {
    pub async fn start(handler: Handler) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = watch::channel(false);
        let service = recording(handler, seen.clone());
        tokio::spawn(serve(listener, settings(), service, stopped));
        Self {
            addr,
            seen,
            scheme: "http",
            _stop: stop,
        }
    }

    /// An upstream speaking TLS (ALPN `h2` and `http/1.1`) with `server`'s
    /// certificate, as GCS does.
    pub async fn start_tls(handler: Handler, server: rustls::ServerConfig) -> Self {
        use hyper_util::rt::TokioIo;
        use hyper_util::server::conn::auto;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, _) = watch::channel(false);
        let service = recording(handler, seen.clone());
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, service) = (acceptor.clone(), service.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(service);
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            seen,
            scheme: "https",
            _stop: stop,
        }
    }

    /// Waits (up to 20 s) until a request has reached the upstream.
    pub async fn wait_for_a_request(&self) {
        tokio::time::timeout(Duration::from_secs(20), async {
            while self.seen().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a request reached the upstream");
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    /// The upstream's URL (`https://localhost:PORT` for a TLS upstream,
    /// the name its certificate holds).
    pub fn url(&self) -> http::Uri {
        let host = match self.scheme {
            "https" => format!("localhost:{}", self.addr.port()),
            _ => self.addr.to_string(),
        };
        format!("{}://{host}", self.scheme).parse().expect("uri")
    }
}

/// The upstream clients' TLS: the bundled roots, and those of `ca_file`.
pub fn tls(ca_file: Option<&std::path::Path>) -> rustls::ClientConfig {
    bucketmap_sidecar::tls::client_config(ca_file).expect("TLS")
}

pub fn settings() -> ServerSettings {
    ServerSettings {
        header_read_timeout: Duration::from_secs(10),
        max_header_bytes: 64 * 1024,
        drain_timeout: Duration::from_secs(10),
        max_concurrent_requests: 64,
        // Every request tells the proxy its connection's local address.
        proxy_listen: None,
    }
}

/// The proxy under test.
pub struct Sidecar {
    pub addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    pub store: Arc<MappingStore>,
    pub proxy: Arc<Proxy>,
    pub stop: watch::Sender<bool>,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

pub struct Options {
    /// The address the proxy binds (default `127.0.0.1:0`).
    pub bind: &'static str,
    /// The listen address the proxy is configured with, when it differs
    /// from the bound one (as `--listen 127.0.0.2:0`, an ephemeral port).
    pub configured_listen: Option<SocketAddr>,
    pub allow_physical: bool,
    pub advertise_url: Option<http::Uri>,
    pub max_metadata_bytes: usize,
    pub auth: Auth,
    pub mapping: Option<Mapping>,
    pub upstream_timeout: Option<Duration>,
    /// `--upstream-ca-file`.
    pub upstream_ca_file: Option<std::path::PathBuf>,
    /// `--upstream-http`.
    pub upstream_http: UpstreamHttp,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:0",
            configured_listen: None,
            allow_physical: false,
            advertise_url: None,
            max_metadata_bytes: 1024 * 1024,
            auth: Auth::None,
            mapping: Some(mapping(PHYSICAL)),
            upstream_timeout: None,
            upstream_ca_file: None,
            upstream_http: UpstreamHttp::default(),
        }
    }
}

pub fn mapping(physical: &str) -> Mapping {
    Mapping::new([
        ("photos".to_owned(), physical.to_owned()),
        ("logs".to_owned(), "logs-aaaa1111".to_owned()),
    ])
    .expect("valid mapping")
}

/// The proxy core of a test sidecar listening on `addr`.
fn proxy(
    upstream: &Upstream,
    options: &Options,
    addr: SocketAddr,
    store: Arc<MappingStore>,
    metrics: Arc<Metrics>,
) -> Proxy {
    let settings = ProxySettings {
        allow_physical_names: options.allow_physical,
        max_metadata_bytes: options.max_metadata_bytes,
        upstream_timeout: options.upstream_timeout,
        listen: options.configured_listen.unwrap_or(addr),
        advertise_url: options.advertise_url.clone(),
        upstream_http: options.upstream_http,
        hold_limit: Duration::from_secs(30),
    };
    let client = build_client(
        &upstream.url(),
        Duration::from_secs(5),
        Duration::from_secs(30),
        tls(options.upstream_ca_file.as_deref()),
        options.upstream_http,
    )
    .expect("client");
    Proxy::new(store, client, &upstream.url(), metrics, settings).expect("proxy")
}

impl Sidecar {
    pub async fn start(upstream: &Upstream, options: Options) -> Self {
        let listener = TcpListener::bind(options.bind).await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let store = Arc::new(MappingStore::new(None, Vec::new()));
        if let Some(m) = options.mapping.clone() {
            store.set(m);
        }
        let metrics = Arc::new(Metrics::new());
        let proxy = Arc::new(proxy(
            upstream,
            &options,
            addr,
            store.clone(),
            metrics.clone(),
        ));
        let (stop, stopped) = watch::channel(false);
        let grpc_settings = GrpcSettings {
            upstream: upstream.url(),
            allow_physical_names: options.allow_physical,
            max_message_bytes: 1 << 20,
            hold_limit: Duration::from_secs(30),
        };
        let grpc = Arc::new(GrpcProxy::new(
            build_grpc_client(
                &upstream.url(),
                Duration::from_secs(5),
                tls(options.upstream_ca_file.as_deref()),
            )
            .expect("gRPC client"),
            grpc_settings,
            store.clone(),
            metrics.clone(),
            Arc::new(options.auth.clone()),
        ));
        let stack = proxy_stack(proxy.clone(), grpc, options.auth);
        // As the binary wires it: the proxy's listen address needs no
        // per-request local address (a configured one that differs does).
        let server = ServerSettings {
            proxy_listen: Some(options.configured_listen.unwrap_or(addr)),
            ..settings()
        };
        let task = tokio::spawn(serve(listener, server, stack, stopped));
        Self {
            addr,
            metrics,
            store,
            proxy,
            stop,
            task,
        }
    }

    pub fn url(&self, target: &str) -> String {
        format!("http://{}{target}", self.addr)
    }

    /// `GET target` without a body.
    pub async fn get(&self, target: &str) -> Answer {
        send(request(Method::GET, &self.url(target), empty())).await
    }
}

pub fn client() -> Client<HttpConnector, ProxyBody> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn send(req: Request<ProxyBody>) -> Answer {
    let response = tokio::time::timeout(TIMEOUT, client().request(req))
        .await
        .expect("no timeout")
        .expect("response");
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(TIMEOUT, body.collect())
        .await
        .expect("no timeout")
        .expect("body")
        .to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub fn request(method: Method, url: &str, body: ProxyBody) -> Request<ProxyBody> {
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = url.parse().expect("url");
    req
}

pub fn json_response(status: StatusCode, value: Value) -> Response<ProxyBody> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    response
}

pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    Arc::new(move |req| Box::pin(f(req)))
}

/// An object resource as GCS returns it, for `bucket`/`name`.
pub fn object(base: &str, bucket: &str, name_encoded: &str, name: &str) -> Value {
    json!({
        "kind": "storage#object",
        "id": format!("{bucket}/{name}/1"),
        "bucket": bucket,
        "name": name,
        "selfLink": format!("{base}/storage/v1/b/{bucket}/o/{name_encoded}"),
        "mediaLink": format!("{base}/download/storage/v1/b/{bucket}/o/{name_encoded}?generation=1&alt=media"),
        "generation": "1",
    })
}

pub fn echo_object_handler() -> Handler {
    handler(|req: Request<Incoming>| async move {
        let path = req.uri().path().to_owned();
        let parts: Vec<&str> = path.split('/').collect();
        // /storage/v1/b/{bucket}/o/{object}
        let bucket = parts.get(4).copied().unwrap_or_default();
        let name_encoded = parts.get(6).copied().unwrap_or_default();
        let name = percent_encoding::percent_decode_str(name_encoded)
            .decode_utf8_lossy()
            .into_owned();
        json_response(
            StatusCode::OK,
            object(
                "https://storage.googleapis.com",
                bucket,
                name_encoded,
                &name,
            ),
        )
    })
}

/// A client body fed through a channel, so the test decides when each piece goes.
pub fn channel_body() -> (
    futures::channel::mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    ProxyBody,
) {
    let (tx, rx) = futures::channel::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
    (tx, BodyExt::boxed(StreamBody::new(rx)))
}

impl Upstream {
    /// An upstream that hands each accepted connection, raw, to `serve`:
    /// for faults HTTP servers do not commit on their own (a reset in the
    /// middle of a body). `seen` stays empty.
    pub async fn start_raw<F, Fut>(serve: F) -> Self
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((tcp, _)) => drop(tokio::spawn(serve(tcp))),
                        Err(_) => break,
                    },
                    _ = stopped.changed() => break,
                }
            }
        });
        Self {
            addr,
            seen: Arc::default(),
            scheme: "http",
            _stop: stop,
        }
    }
}

impl Upstream {
    /// Like [`Upstream::start`], without recording what it sees: for long
    /// runs, whose record would look like a leak.
    pub async fn start_unrecorded(handler: Handler) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = watch::channel(false);
        let serve_fn = move |req: Request<Incoming>| {
            let answer = handler(req);
            async move { Ok::<_, std::convert::Infallible>(answer.await) }
        };
        let service: UpstreamService =
            tower::util::BoxCloneSyncService::new(tower::service_fn(serve_fn));
        tokio::spawn(serve(listener, settings(), service, stopped));
        Self {
            addr,
            seen: Arc::default(),
            scheme: "http",
            _stop: stop,
        }
    }
}
