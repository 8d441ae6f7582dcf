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

pub mod finalizer;
pub mod inject;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Json;
use axum::extract::State;
use axum::routing::post;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use tracing::{info, warn};

pub use inject::InjectionConfig;
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
    State(watched): State<Arc<Option<String>>>,
    Json(body): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(finalizer::review(body, watched.as_deref()))
}

async fn mutate_pods(
    State(cfg): State<Arc<InjectionConfig>>,
    Json(body): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    Json(review(body, &cfg))
}

/// Serves the webhooks over TLS on `addr` until `shutdown`. The finalizer
/// is set only in `watched_namespace` when the operator watches only one.
pub async fn serve(
    addr: SocketAddr,
    certs: Arc<CertResolver>,
    cfg: InjectionConfig,
    watched_namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(certs);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let app = axum::Router::new()
        .route("/mutate-pods", post(mutate_pods))
        .route(
            "/mutate-gcs",
            post(mutate_gcs).with_state(Arc::new(watched_namespace)),
        )
        .with_state(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for the webhook"))?;
    info!(%addr, "serving the admission webhooks");
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "webhook accept failed");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(stream).await {
                Ok(s) => s,
                Err(e) => {
                    warn!(%peer, error = %e, "webhook TLS handshake failed");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            if let Err(e) = builder
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await
            {
                warn!(%peer, error = %e, "webhook connection failed");
            }
        });
    }
}
