//! The admin endpoints `healthz`, `readyz` and `metrics`, implemented once in
//! [`Admin`]: at the root of the `--admin-addr` listener ([`Admin`] is a
//! service of its own, which never proxies) and under `/_bucketmap/` on the
//! proxy listener ([`AdminLayer`], in front of the rest of the request path).

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode, header};
use tower::{Layer, Service};

use super::{Answer, Either};
use crate::body::{ProxyBody, full};
use crate::config::INTERNAL_PREFIX;
use crate::host::virtual_host;
use crate::mapping::MappingStore;
use crate::metrics::Metrics;

/// Health, readiness and metrics.
#[derive(Clone, Debug)]
pub struct Admin {
    metrics: Arc<Metrics>,
    mapping: Arc<MappingStore>,
}

impl Admin {
    /// Serves `metrics` and reports the readiness of `mapping`.
    pub fn new(metrics: Arc<Metrics>, mapping: Arc<MappingStore>) -> Self {
        Self { metrics, mapping }
    }

    /// The answer for `endpoint` (`healthz`, `readyz`, `metrics`); anything
    /// else is a 404.
    pub fn answer(&self, endpoint: &str) -> Response<ProxyBody> {
        match endpoint {
            "healthz" => text(StatusCode::OK, "ok\n".into(), "text/plain"),
            "readyz" => self.readiness(),
            "metrics" => text(
                StatusCode::OK,
                {
                    let age = self.mapping.map_age().map_or(f64::NAN, |a| a.as_secs_f64());
                    self.metrics.map_age.set(age);
                    self.metrics.encode()
                },
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
            _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
        }
    }

    /// Ready once the mapping sources have been read successfully, even when
    /// they hold no entry (see [`MappingStore::is_ready`]).
    fn readiness(&self) -> Response<ProxyBody> {
        match (self.mapping.current(), self.mapping.not_ready_reason()) {
            (Some(m), None) => text(
                StatusCode::OK,
                format!("ready: {} buckets mapped{}\n", m.len(), self.freshness()),
                "text/plain",
            ),
            (Some(_), Some(reason)) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
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
}

impl Admin {
    /// How fresh the map is, for readyz: a stale map keeps the sidecar
    /// ready (reads are served; an API server outage must not take every
    /// pod out of its Services) and says so.
    fn freshness(&self) -> String {
        let Some(age) = self.mapping.map_age() else {
            return String::new();
        };
        match self.mapping.staleness() {
            None => format!("; map confirmed by the API server {}s ago", age.as_secs()),
            Some(stale) => format!(
                "; map NOT confirmed for {}s, more than its bound of {}s: writes are refused, reads served",
                stale.age.as_secs(),
                stale.bound.as_secs()
            ),
        }
    }
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The `--admin-addr` listener: `/healthz`, `/readyz`, `/metrics`.
impl<B> Service<Request<B>> for Admin {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Ready<Result<Response<ProxyBody>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let endpoint = req.uri().path().strip_prefix('/').unwrap_or_default();
        ready(Ok(self.answer(endpoint)))
    }
}

/// Answers `/_bucketmap/<endpoint>` on the proxy listener with [`Admin`],
/// labelled `internal`, unless the request is virtual-hosted (then the path
/// names an object in the bucket of the `Host`, and goes on).
#[derive(Clone, Debug)]
pub struct AdminLayer {
    admin: Admin,
    /// The address the listener was configured with: the host of a request
    /// without `Host`.
    listen: SocketAddr,
}

impl AdminLayer {
    /// `listen` stands for the host of requests without `Host`.
    pub fn new(admin: Admin, listen: SocketAddr) -> Self {
        Self { admin, listen }
    }
}

impl<S> Layer<S> for AdminLayer {
    type Service = AdminEndpoints<S>;

    fn layer(&self, inner: S) -> AdminEndpoints<S> {
        AdminEndpoints {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`AdminLayer`].
#[derive(Clone, Debug)]
pub struct AdminEndpoints<S> {
    inner: S,
    layer: AdminLayer,
}

impl<S, B> Service<Request<B>> for AdminEndpoints<S>
where
    S: Service<Request<B>, Response = Answer, Error = Infallible>,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = Either<Ready<Result<Answer, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let AdminLayer { admin, listen } = &self.layer;
        if let Some(endpoint) = req.uri().path().strip_prefix(INTERNAL_PREFIX) {
            let mapping = admin.mapping.current();
            let (_, bucket) = virtual_host(&req, mapping.as_deref(), *listen);
            if bucket.is_none() {
                let answer = Answer::new(admin.answer(endpoint), "internal");
                return Either::left(ready(Ok(answer)));
            }
        }
        Either::right(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt as _;

    use super::*;
    use crate::layers::testing::{body, calls, counting};
    use crate::mapping::Mapping;

    fn store(mapped: bool) -> Arc<MappingStore> {
        let store = Arc::new(MappingStore::new(None, Vec::new()));
        if mapped {
            let entries = [("photos".to_owned(), "photos-k3x9q2mw".to_owned())];
            store.set(Mapping::new(entries).unwrap_or_else(|e| panic!("{e}")));
        }
        store
    }

    fn get(path: &str, host: Option<&str>) -> Request<()> {
        let mut req = Request::new(());
        *req.uri_mut() = path.parse().unwrap_or_else(|e| panic!("{path}: {e}"));
        if let Some(host) = host {
            let value = HeaderValue::from_str(host).unwrap_or_else(|e| panic!("{e}"));
            req.headers_mut().insert(header::HOST, value);
        }
        req
    }

    fn listen() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9023))
    }

    #[tokio::test]
    async fn the_admin_listener_serves_health_readiness_and_metrics() {
        let store = store(false);
        let admin = Admin::new(Arc::new(Metrics::new()), store.clone());
        let Ok(health) = admin.clone().oneshot(get("/healthz", None)).await;
        assert_eq!(health.status(), StatusCode::OK);
        assert_eq!(&body(health).await[..], b"ok\n");
        let Ok(unready) = admin.clone().oneshot(get("/readyz", None)).await;
        assert_eq!(unready.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(String::from_utf8_lossy(&body(unready).await).starts_with("not ready: "));
        store.set(Mapping::new([]).unwrap_or_else(|e| panic!("{e}")));
        let Ok(ready) = admin.clone().oneshot(get("/readyz", None)).await;
        assert_eq!(ready.status(), StatusCode::OK);
        assert_eq!(&body(ready).await[..], b"ready: 0 buckets mapped\n");
        let Ok(metrics) = admin.clone().oneshot(get("/metrics", None)).await;
        assert_eq!(metrics.status(), StatusCode::OK);
        let content_type = metrics.headers().get(header::CONTENT_TYPE).cloned();
        assert!(
            content_type.is_some_and(|ct| ct.as_bytes().starts_with(b"application/openmetrics"))
        );
        assert!(String::from_utf8_lossy(&body(metrics).await).contains("bucketmap_sidecar_"));
        for path in ["/", "/nope", "/_bucketmap/healthz", "/healthz/x"] {
            let Ok(other) = admin.clone().oneshot(get(path, None)).await;
            assert_eq!(other.status(), StatusCode::NOT_FOUND, "{path}");
        }
    }

    #[tokio::test]
    async fn the_proxy_listener_answers_internal_paths_without_the_inner_service() {
        let admin = Admin::new(Arc::new(Metrics::new()), store(true));
        let (inner_calls, inner) = counting();
        let service = AdminLayer::new(admin, listen()).layer(inner);
        let Ok(health) = service
            .clone()
            .oneshot(get("/_bucketmap/healthz", None))
            .await;
        assert_eq!(health.response.status(), StatusCode::OK);
        assert_eq!(health.operation, "internal");
        let Ok(ready) = service
            .clone()
            .oneshot(get("/_bucketmap/readyz", None))
            .await;
        assert_eq!(
            &body(ready.response).await[..],
            b"ready: 1 buckets mapped\n"
        );
        let Ok(unknown) = service.clone().oneshot(get("/_bucketmap/nope", None)).await;
        assert_eq!(unknown.response.status(), StatusCode::NOT_FOUND);
        assert_eq!(unknown.operation, "internal");
        assert_eq!(calls(&inner_calls), 0);
        // Anything else goes on, unanswered here.
        let Ok(other) = service
            .clone()
            .oneshot(get("/storage/v1/b/photos/o", None))
            .await;
        assert_eq!(other.operation, "inner");
        assert_eq!(calls(&inner_calls), 1);
    }

    #[tokio::test]
    async fn a_virtual_hosted_internal_path_is_an_object_name() {
        let admin = Admin::new(Arc::new(Metrics::new()), store(true));
        let (inner_calls, inner) = counting();
        let service = AdminLayer::new(admin, listen()).layer(inner);
        let req = get("/_bucketmap/healthz", Some("photos.localhost:9023"));
        let Ok(answer) = service.clone().oneshot(req).await;
        assert_eq!(answer.operation, "inner");
        assert_eq!(calls(&inner_calls), 1);
        // A host that names no mapped bucket is not virtual-hosted.
        let req = get("/_bucketmap/healthz", Some("other.localhost:9023"));
        let Ok(answer) = service.oneshot(req).await;
        assert_eq!(answer.operation, "internal");
        assert_eq!(calls(&inner_calls), 1);
    }
}
