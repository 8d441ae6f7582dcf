//! The HTTP relay: this bench binary again, as a child process, forwarding
//! each HTTP/1.1 request to the upstream and its answer back with the
//! machinery the sidecar is built on (a hyper server, the sidecar's
//! upstream client of `bucketmap_sidecar::upstream`, one tokio thread) and nothing else: no routing, no rewriting,
//! no layers. What it costs above the TCP relay is the price of speaking
//! HTTP with hyper; what the sidecar costs above it is the sidecar's own
//! work. Counted in the instructions phase, next to nginx-rewrite.

use super::*;

/// Environment variable that turns this bench binary into the HTTP relay:
/// `LISTEN_ADDR,UPSTREAM_ADDR`.
pub(crate) const HTTP_RELAY_ENV: &str = "BUCKETMAP_BENCH_HTTP_RELAY";
/// The HTTP relay's label in the figures.
pub(crate) const HTTP_RELAY: &str = "HTTP relay (hyper)";

/// The HTTP relay process; serves until killed.
pub(crate) fn http_relay_main(spec: &str) -> std::process::ExitCode {
    let Some((listen, upstream)) = spec.split_once(',') else {
        eprintln!("http relay: {HTTP_RELAY_ENV} must be LISTEN_ADDR,UPSTREAM_ADDR, not {spec:?}");
        return std::process::ExitCode::FAILURE;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("http relay runtime");
    let served = runtime.block_on(serve(listen.to_owned(), upstream.to_owned()));
    if let Err(e) = served {
        eprintln!("http relay on {listen}: {e:#}");
    }
    std::process::ExitCode::FAILURE
}

async fn serve(listen: String, upstream: String) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    let base: Arc<str> = format!("http://{upstream}").into();
    let client = Arc::new(bucketmap_sidecar::upstream::build_client(
        &base.parse()?,
        Duration::from_secs(5),
        Duration::from_secs(90),
        // A plain upstream: no certificate is ever checked.
        rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        bucketmap_sidecar::config::UpstreamHttp::Http1,
    )?);
    loop {
        let (inbound, _) = listener.accept().await?;
        let _ = inbound.set_nodelay(true);
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| forward(client.clone(), base.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(inbound), service)
                .await;
        });
    }
}

/// Sends `req` to the upstream at `base` as it came, path and headers
/// included, and answers with the upstream's response as it came.
async fn forward(
    client: Arc<bucketmap_sidecar::upstream::UpstreamClient>,
    base: Arc<str>,
    req: Request<Incoming>,
) -> Result<Response<Incoming>> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri = format!("{base}{path}").parse::<Uri>()?;
    let mut req = req.map(|body| {
        body.map_err(bucketmap_sidecar::body::BoxError::from)
            .boxed()
    });
    *req.uri_mut() = uri;
    Ok(client.send(req).await?)
}

/// Starts the HTTP relay to `upstream` on a free port; ready once a
/// metadata GET passes through it.
pub(crate) async fn start_http_relay(
    client: &HttpClient,
    upstream: SocketAddr,
    dir: &Path,
    tag: &str,
    launch: Launch<'_>,
) -> Result<(Proc, SocketAddr)> {
    let log = dir.join(format!("http-relay-{tag}"));
    let spec = |addr: SocketAddr| format!("{addr},{upstream}");
    start_bench_child(client, "http relay", (HTTP_RELAY_ENV, spec), &log, launch).await
}
