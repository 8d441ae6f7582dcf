//! The operator's mutating admission webhooks, served over HTTPS by every
//! operator replica (leader or not):
//!
//! - `POST /mutate-pods` injects `bucketmap-sidecar` into pods labelled
//!   `bucketmap.dev/inject: "true"`. A pod it cannot read is admitted
//!   unchanged (and logged). Pods it does not target never reach it: the
//!   MutatingWebhookConfiguration selects them by label (see
//!   `deploy/webhook.yaml` for the failure policy and why).
//! - `POST /mutate-gcs` sets the operator's finalizer on a new `Gcs`
//!   ([`finalizer`]); the controller does not depend on it.
//! - `POST /validate-gcs` refuses a `Gcs` the tenancy policy does not
//!   allow ([`policy`]); it changes nothing.

pub mod finalizer;
pub mod inject;
pub mod policy;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Json;
use axum::extract::State;
use axum::routing::post;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use tracing::{debug, info, warn};

pub use inject::InjectionConfig;
pub use policy::PolicyCheck;
use tls::CertResolver;

/// The request of an AdmissionReview, or the answer to a malformed one
/// (logged): both webhooks read their reviews through it.
fn admission_request(
    review: AdmissionReview<DynamicObject>,
) -> Result<AdmissionRequest<DynamicObject>, Box<AdmissionReview<DynamicObject>>> {
    review.try_into().map_err(|e| {
        warn!(error = %e, "malformed AdmissionReview");
        Box::new(
            AdmissionResponse::invalid(format!("malformed AdmissionReview: {e}")).into_review(),
        )
    })
}

/// Answers one AdmissionReview.
pub fn review(
    review: AdmissionReview<DynamicObject>,
    cfg: &InjectionConfig,
) -> AdmissionReview<DynamicObject> {
    let request = match admission_request(review) {
        Ok(r) => r,
        Err(answer) => return *answer,
    };
    let mut response = AdmissionResponse::from(&request);
    let pod = request
        .object
        .as_ref()
        .map(|o| serde_json::to_value(o).and_then(serde_json::from_value::<Pod>));
    if let Some(Ok(pod)) = &pod
        && let Some(why) = inject::refusal(pod)
    {
        info!(namespace = ?request.namespace, pod = %request.name, "refusing injection: {why}");
        return response.deny(why).into_review();
    }
    let (patch, warning) = match pod {
        Some(Ok(pod)) => (
            inject::patch(&pod, cfg),
            inject::default_account_warning(&pod),
        ),
        Some(Err(e)) => (Err(e), None),
        None => (Ok(None), None),
    };
    match patch {
        Ok(Some(patch)) => {
            info!(namespace = ?request.namespace, pod = %request.name, "injecting bucketmap-sidecar");
            response.warnings = warning.map(|w| vec![w]);
            match response.clone().with_patch(patch) {
                Ok(r) => r.into_review(),
                Err(e) => {
                    warn!(error = %e, "cannot serialize the injection patch; admitting unchanged");
                    response.into_review()
                }
            }
        }
        Ok(None) => response.into_review(),
        Err(e) => {
            warn!(error = %e, "cannot read the pod; admitting unchanged");
            response.into_review()
        }
    }
}

async fn mutate_gcs(
    State(watched): State<Arc<Option<Vec<String>>>>,
    Json(body): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(finalizer::review(body, watched.as_deref()))
}

async fn validate_gcs(
    State(check): State<Arc<PolicyCheck>>,
    Json(body): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(policy::review(body, &check).await)
}

async fn mutate_pods(
    State(cfg): State<Arc<InjectionConfig>>,
    Json(body): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(review(body, &cfg))
}

/// Serves the webhooks over TLS on `addr` until `shutdown`, then stops
/// accepting connections and lets the requests in flight finish, for at
/// most `drain` (connections still open then are closed). The finalizer
/// is set only in `watched` namespaces when the operator watches only some.
pub async fn serve(
    addr: SocketAddr,
    certs: Arc<CertResolver>,
    cfg: InjectionConfig,
    watched: Option<Vec<String>>,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) -> anyhow::Result<()> {
    serve_checked(addr, certs, cfg, watched, None, shutdown, drain).await
}

/// [`serve`], with the tenancy policy's webhook when `policy` is given.
pub async fn serve_checked(
    addr: SocketAddr,
    certs: Arc<CertResolver>,
    cfg: InjectionConfig,
    watched: Option<Vec<String>>,
    policy: Option<PolicyCheck>,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) -> anyhow::Result<()> {
    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(certs);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let mut app = axum::Router::new()
        .route("/mutate-pods", post(mutate_pods))
        .route(
            "/mutate-gcs",
            post(mutate_gcs).with_state(Arc::new(watched)),
        )
        .with_state(Arc::new(cfg));
    if let Some(check) = policy {
        app = app.route(
            "/validate-gcs",
            post(validate_gcs).with_state(Arc::new(check)),
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for the webhook"))?;
    info!(%addr, "serving the admission webhooks");
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            // Reap finished connections as they go.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "webhook accept failed");
                    continue;
                }
            },
        };
        let connection = serve_connection(acceptor.clone(), app.clone(), stream, stopping.clone());
        connections.spawn(async move { connection.await.log(peer) });
    }
    drop(listener);
    let _ = stop.send(true);
    drain_connections(connections, drain).await;
    Ok(())
}

/// Waits for the connections to finish their requests, for at most `drain`.
async fn drain_connections(mut connections: tokio::task::JoinSet<()>, drain: Duration) {
    let open = connections.len();
    info!(
        open,
        ?drain,
        "webhook stopped accepting; draining requests in flight"
    );
    let drained = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            open = connections.len(),
            "webhook connections still open after the drain timeout; closing them"
        );
        connections.shutdown().await;
    } else {
        info!("webhook drained");
    }
}

/// How a webhook connection ended.
enum Ended {
    Done,
    Handshake(std::io::Error),
    Failed(Box<dyn std::error::Error + Send + Sync>),
}

impl Ended {
    fn log(self, peer: SocketAddr) {
        match self {
            Ended::Done => {}
            // A TCP probe (a load balancer's, a test's) connects and leaves.
            Ended::Handshake(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                debug!(%peer, error = %e, "webhook connection closed before the TLS handshake");
            }
            Ended::Handshake(e) => warn!(%peer, error = %e, "webhook TLS handshake failed"),
            Ended::Failed(e) => warn!(%peer, error = %e, "webhook connection failed"),
        }
    }
}

/// Serves one connection; once `stopping` turns true, finishes the
/// request in flight and closes (HTTP/1: no keep-alive; HTTP/2: GOAWAY).
async fn serve_connection(
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
    stream: tokio::net::TcpStream,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Ended {
    let stream = match acceptor.accept(stream).await {
        Ok(s) => s,
        Err(e) => return Ended::Handshake(e),
    };
    let service = hyper_util::service::TowerToHyperService::new(app);
    let builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(connection);
    let stop = async move {
        // The guard `wait_for` returns is not `Send`: drop it at once.
        let _ = stopping.wait_for(|stop| *stop).await.map(|_| ());
    };
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stop => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    match result {
        Ok(()) => Ended::Done,
        Err(e) => Ended::Failed(e),
    }
}
