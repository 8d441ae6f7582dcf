//! The HTTP relay: this bench binary again, as a child process, forwarding
//! each HTTP/1.1 request to the upstream and its answer back with the
//! machinery the sidecar is built on (a hyper server, the sidecar's
//! upstream client of `bucketmap_sidecar::upstream`, one tokio thread) and nothing else: no routing, no rewriting,
//! no layers. What it costs above the TCP relay is the price of speaking
//! HTTP with hyper; what the sidecar costs above it is the sidecar's own
//! work. Counted in the instructions phase, next to nginx-rewrite.
//!
//! The h2 relay is the same for gRPC: an HTTP/2 (h2c) server forwarding
//! each stream over the sidecar's HTTP/2 upstream client, frames and
//! trailers passed on as they come. It is the floor of the gRPC phase.

use super::*;
use bucketmap_sidecar::config::UpstreamHttp;

/// Environment variable that turns this bench binary into the HTTP relay:
/// `LISTEN_ADDR,UPSTREAM_ADDR`.
pub(crate) const HTTP_RELAY_ENV: &str = "BUCKETMAP_BENCH_HTTP_RELAY";
/// The HTTP relay's label in the figures.
pub(crate) const HTTP_RELAY: &str = "HTTP relay (hyper)";

/// The HTTP relay process; serves until killed.
pub(crate) fn http_relay_main(spec: &str) -> std::process::ExitCode {
    relay_process(HTTP_RELAY_ENV, spec, UpstreamHttp::Http1)
}

/// Environment variable that turns this bench binary into the h2 relay:
/// `LISTEN_ADDR,UPSTREAM_ADDR`.
pub(crate) const H2_RELAY_ENV: &str = "BUCKETMAP_BENCH_H2_RELAY";

/// The h2 relay process; serves until killed.
pub(crate) fn h2_relay_main(spec: &str) -> std::process::ExitCode {
    relay_process(H2_RELAY_ENV, spec, UpstreamHttp::Http2)
}

/// A relay process speaking `http` on both sides, told where by `spec`
/// (the value of `env`).
fn relay_process(env: &str, spec: &str, http: UpstreamHttp) -> std::process::ExitCode {
    let Some((listen, upstream)) = spec.split_once(',') else {
        eprintln!("relay: {env} must be LISTEN_ADDR,UPSTREAM_ADDR, not {spec:?}");
        return std::process::ExitCode::FAILURE;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("http relay runtime");
    let served = runtime.block_on(serve(listen.to_owned(), upstream.to_owned(), http));
    if let Err(e) = served {
        eprintln!("relay on {listen}: {e:#}");
    }
    std::process::ExitCode::FAILURE
}

async fn serve(listen: String, upstream: String, http: UpstreamHttp) -> Result<()> {
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
        http,
    )?);
    loop {
        let (inbound, _) = listener.accept().await?;
        let _ = inbound.set_nodelay(true);
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| forward(client.clone(), base.clone(), req));
            let io = TokioIo::new(inbound);
            let _ = match http {
                UpstreamHttp::Http2 => {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .timer(hyper_util::rt::TokioTimer::new())
                        .serve_connection(io, service)
                        .await
                }
                _ => {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await
                }
            };
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

/// Starts the h2 relay to the gRPC upstream `upstream` on a free port;
/// ready once a `GetObject` of the physical bucket passes through it.
pub(crate) async fn start_h2_relay(upstream: SocketAddr, dir: &Path) -> Result<(Proc, SocketAddr)> {
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    let mut last = None;
    for attempt in 0..3 {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let log = dir.join(format!("h2-relay-{attempt}.log"));
        let mut cmd = Command::new(&exe);
        cmd.env(H2_RELAY_ENV, format!("{addr},{upstream}"));
        let mut proc = Proc::spawn("h2 relay", &mut cmd, log)?;
        match wait_grpc_ready(&mut proc, addr).await {
            Ok(()) => return Ok((proc, addr)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("the h2 relay did not start")))
}

/// Calls `GetObject` at `addr` until it answers; fails if `proc` exits.
async fn wait_grpc_ready(proc: &mut Proc, addr: SocketAddr) -> Result<()> {
    let mut client = grpc_client(addr)?;
    poll_until(proc, addr, async || {
        Ok(grpc_get(&mut client, PHYSICAL).await.is_ok())
    })
    .await
}
