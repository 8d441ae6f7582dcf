//! Listeners, connection handling, graceful drain, and the whole process's wiring.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::{Service, ServiceBuilder, ServiceExt as _};

use crate::auth::Auth;
use crate::body::ProxyBody;
use crate::config::Config;
use crate::flights::Flights;
use crate::grpc::layer::GrpcLayer;
use crate::grpc::service::{GrpcProxy, GrpcSettings, build_grpc_client};
use crate::layers::admin::{Admin, AdminLayer};
use crate::layers::credentials::CredentialsLayer;
use crate::layers::record::RecordLayer;
use crate::mapping::MappingStore;
use crate::metrics::Metrics;
use crate::proxy::{ConnectionLocalAddr, Core, Proxy, ProxySettings};
use crate::upstream::build_client;

/// Connection-level limits.
#[derive(Clone, Copy, Debug)]
pub struct ServerSettings {
    /// Time a client has to send its request headers (HTTP/1).
    pub header_read_timeout: Duration,
    /// Largest request head accepted, in bytes; also what a connection buffers.
    pub max_header_bytes: usize,
    /// On shutdown, how long in-flight requests may take to finish.
    pub drain_timeout: Duration,
    /// Requests served at once across all connections; more wait their turn.
    pub max_concurrent_requests: usize,
    /// The address the proxy takes a request to have arrived on when it
    /// is not told ([`ProxySettings::listen`]), when known: requests on
    /// connections to it need no [`ConnectionLocalAddr`] (an extension
    /// costs three allocations per request).
    pub proxy_listen: Option<SocketAddr>,
}

fn connection_builder(settings: ServerSettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

/// The proxy listener's request path, outermost first: recording, the
/// admin endpoints, gRPC calls diverted to `grpc`, refusal of what cannot
/// be rewritten, credentials, and the core (route → rewrite → forward
/// under the upstream timeout → rewrite back). See [`crate::layers`].
pub fn proxy_stack(
    proxy: Arc<Proxy>,
    grpc: Arc<GrpcProxy>,
    auth: Auth,
) -> impl Service<
    Request<Incoming>,
    Response = Response<ProxyBody>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    let metrics = proxy.metrics.clone();
    let mapping = proxy.mapping.clone();
    let listen = proxy.settings.listen;
    ServiceBuilder::new()
        .layer(RecordLayer::new(metrics.clone()))
        .layer(AdminLayer::new(Admin::new(metrics, mapping), listen))
        .layer(GrpcLayer::new(grpc))
        .layer(proxy.refuse.clone())
        .layer(CredentialsLayer::new(auth))
        .service(Core(proxy))
}

/// Serves `service` on `listener` until `shutdown` turns true, then drains
/// in-flight requests for at most `settings.drain_timeout`.
pub async fn serve<S>(
    listener: TcpListener,
    settings: ServerSettings,
    service: S,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()>
where
    S: Service<Request<Incoming>, Response = Response<ProxyBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let builder = connection_builder(settings);
    let graceful = GracefulShutdown::new();
    // One tower stack shared by every connection (clones share the limit).
    let service = ServiceBuilder::new()
        .concurrency_limit(settings.max_concurrent_requests.max(1))
        .service(service);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors and the like: back off a little.
                        tracing::warn!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                // Links in responses point at the address this client connected to.
                let local = stream
                    .local_addr()
                    .ok()
                    .filter(|local| Some(*local) != settings.proxy_listen)
                    .map(ConnectionLocalAddr);
                let service = service.clone().map_request(move |mut req: Request<Incoming>| {
                    if let Some(local) = local {
                        req.extensions_mut().insert(local);
                    }
                    req
                });
                let service = TowerToHyperService::new(service);
                let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(err) = connection.await {
                        tracing::debug!(%peer, error = %err, "connection ended with an error");
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections drained"),
        _ = tokio::time::sleep(settings.drain_timeout) => {
            tracing::warn!(timeout = ?settings.drain_timeout, "drain timeout: closing remaining connections");
        }
    }
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM: draining"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM; only SIGINT stops the sidecar");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The proxy of the process: its upstream client, settings and mapping store.
fn build_proxy(
    config: &Config,
    store: &Arc<MappingStore>,
    metrics: &Arc<Metrics>,
    flights: &Arc<Flights>,
    tls: rustls::ClientConfig,
) -> anyhow::Result<Arc<Proxy>> {
    let client = build_client(
        &config.upstream,
        config.connect_timeout,
        config.pool_idle_timeout,
        tls,
        config.upstream_http,
    )?;
    let settings = ProxySettings {
        allow_physical_names: config.allow_physical_names,
        max_metadata_bytes: config.max_metadata_bytes,
        upstream_timeout: (!config.upstream_timeout.is_zero()).then_some(config.upstream_timeout),
        listen: config.listen,
        advertise_url: config.advertise_url.clone(),
        upstream_http: config.upstream_http,
        hold_limit: config.hold_limit,
    };
    Ok(Arc::new(
        Proxy::new(
            store.clone(),
            client,
            &config.upstream,
            metrics.clone(),
            settings,
        )?
        .with_flights(flights.clone()),
    ))
}

/// The gRPC path of the process.
pub fn build_grpc_proxy(
    config: &Config,
    store: &Arc<MappingStore>,
    metrics: &Arc<Metrics>,
    flights: &Arc<Flights>,
    auth: &Auth,
    tls: rustls::ClientConfig,
) -> anyhow::Result<Arc<GrpcProxy>> {
    let settings = GrpcSettings {
        upstream: config.grpc_upstream.clone(),
        allow_physical_names: config.allow_physical_names,
        max_message_bytes: config.grpc_max_message_bytes,
        hold_limit: config.hold_limit,
    };
    Ok(Arc::new(
        GrpcProxy::new(
            build_grpc_client(&config.grpc_upstream, config.connect_timeout, tls)?,
            settings,
            store.clone(),
            metrics.clone(),
            Arc::new(auth.clone()),
        )
        .with_flights(flights.clone()),
    ))
}

/// The connection-level limits from the configuration.
fn server_settings(config: &Config) -> ServerSettings {
    ServerSettings {
        header_read_timeout: config.header_read_timeout,
        max_header_bytes: config.max_header_bytes,
        drain_timeout: config.drain_timeout,
        max_concurrent_requests: config.max_concurrent_requests,
        proxy_listen: Some(config.listen),
    }
}

/// Binds the proxy listener, then the admin listener when one is configured.
async fn bind(config: &Config) -> anyhow::Result<(TcpListener, Option<TcpListener>)> {
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let metrics_listener = match config.admin_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--admin-addr)"))?,
        ),
        None => None,
    };
    Ok((listener, metrics_listener))
}

/// Runs the sidecar until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    run_until(config, termination()).await
}

/// Keeps the map current until `stopped`: the directory's watch, and the
/// API server's when `live` is set. `last_error` is the first read's.
fn follow_map(
    config: &Config,
    live: Option<crate::live::LiveConfig>,
    store: &Arc<MappingStore>,
    metrics: &Arc<Metrics>,
    stopped: &watch::Receiver<bool>,
    last_error: Option<String>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = vec![tokio::spawn(crate::watch::run(
        store.clone(),
        metrics.clone(),
        config.mapping_poll_interval,
        last_error,
        stopped.clone(),
    ))];
    if let Some(live) = live {
        tasks.push(tokio::spawn(crate::live::run(
            live,
            store.clone(),
            metrics.clone(),
            stopped.clone(),
        )));
    }
    tasks
}

/// Runs the sidecar until `stop` completes, then drains as on SIGTERM: the
/// binary stops on a signal ([`run`]), `cargo dev`'s demo, which runs the
/// sidecar inside its own process, when the demo ends.
pub async fn run_until(config: Config, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let live = crate::live::config_of(&config)?;
    let mut store = MappingStore::new(config.mapping_dir.clone(), config.maps.clone());
    if live.is_some() {
        store = store.following(config.max_map_age);
    }
    let store = Arc::new(store);
    // The map is read before anything else can fail, so that a start-up
    // failure's log says which map the sidecar had.
    let mut last_error = None;
    crate::watch::reload_and_report(&store, &metrics, &mut last_error);

    let auth = if config.no_auth {
        Auth::None
    } else {
        Auth::application_default()?
    };
    // Both upstream clients trust the same roots (read once).
    let tls = crate::tls::client_config(config.upstream_ca_file.as_deref())?;
    let flights = Flights::new(store.clone(), metrics.clone());
    let proxy = build_proxy(&config, &store, &metrics, &flights, tls.clone())?;
    let grpc = build_grpc_proxy(&config, &store, &metrics, &flights, &auth, tls)?;
    let server_settings = server_settings(&config);

    let (listener, metrics_listener) = bind(&config).await?;
    tracing::info!(
        listen = %config.listen,
        upstream = %config.upstream,
        grpc_upstream = %config.grpc_upstream,
        auth = if config.no_auth { "none" } else { "application-default" },
        admin = ?config.admin_addr,
        "bucketmap-sidecar started"
    );

    let (stop_tx, stopped) = watch::channel(false);
    let mut sources = follow_map(&config, live, &store, &metrics, &stopped, last_error);
    // Writes in flight cut off when the map fences their bucket.
    sources.push(tokio::spawn(crate::flights::run(flights, stopped.clone())));
    let metrics_server = metrics_listener.map(|listener| {
        tokio::spawn(serve(
            listener,
            server_settings,
            // The admin listener never proxies.
            Admin::new(metrics.clone(), store.clone()),
            stopped.clone(),
        ))
    });
    let main_server = tokio::spawn(serve(
        listener,
        server_settings,
        proxy_stack(proxy, grpc, auth),
        stopped,
    ));

    stop.await;
    let _ = stop_tx.send(true);
    main_server
        .await
        .context("the proxy listener task failed")??;
    if let Some(task) = metrics_server {
        task.await.context("the metrics listener task failed")??;
    }
    for task in sources {
        let _ = task.await;
    }
    tracing::info!("bucketmap-sidecar stopped");
    Ok(())
}
