//! A fault-injecting proxy in front of the test's API server: the operator
//! talks plain HTTP to the proxy, which forwards every request with the
//! fixture's admin client unless the test's `intercept` answers it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::task::JoinHandle;

use super::Fixture;

/// Answers a request itself (`Some`) or lets it through (`None`).
pub type Intercept = Arc<dyn Fn(&Request) -> Option<Response> + Send + Sync>;

struct Proxy {
    upstream: kube::Client,
    intercept: Intercept,
}

/// True for a GET of `collection` (a path ending in it) with `watch=true`.
pub fn is_watch_of(req: &Request, collection: &str) -> bool {
    let query = req.uri().query().unwrap_or_default();
    req.method() == axum::http::Method::GET
        && req.uri().path().ends_with(collection)
        && query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1")
}

/// A watch that is open and silent for as long as the client listens.
pub fn silent_watch() -> Response {
    let never = futures::stream::pending::<Result<Bytes, Infallible>>();
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(never),
    )
        .into_response()
}

async fn handle(State(proxy): State<Arc<Proxy>>, req: Request) -> Response {
    if let Some(answer) = (proxy.intercept)(&req) {
        return answer;
    }
    match forward(&proxy.upstream, req).await {
        Ok(response) => response,
        Err(e) => (StatusCode::BAD_GATEWAY, format!("{e:#}")).into_response(),
    }
}

/// Sends `req` to the API server with the admin client; the response body
/// streams back (watches stay open).
async fn forward(upstream: &kube::Client, req: Request) -> anyhow::Result<Response> {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 16 << 20)
        .await
        .context("cannot read the request body")?;
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut out = axum::http::Request::builder()
        .method(parts.method)
        .uri(&path)
        .body(kube::client::Body::from(body.to_vec()))
        .context("cannot build the upstream request")?;
    for (name, value) in &parts.headers {
        if name != header::HOST && name != header::CONNECTION {
            out.headers_mut().append(name, value.clone());
        }
    }
    let response = upstream
        .send(out)
        .await
        .with_context(|| format!("cannot forward {path}"))?;
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts.headers.remove(header::CONNECTION);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Starts the proxy on a free loopback port, in front of `f`'s API server.
pub async fn start(f: &Fixture, intercept: Intercept) -> anyhow::Result<SocketAddr> {
    let proxy = Arc::new(Proxy {
        upstream: f.env.client().await?,
        intercept,
    });
    let app = axum::Router::new().fallback(handle).with_state(proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// The operator in-process, its API calls going through the proxy at `addr`.
pub async fn start_operator_via(f: &Fixture, addr: SocketAddr) -> anyhow::Result<JoinHandle<()>> {
    let config = kube::Config::new(format!("http://{addr}").parse()?);
    let client = kube::Client::try_from(config).context("cannot build the proxied client")?;
    f.spawn_operator(client, std::future::pending()).await
}
