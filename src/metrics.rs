//! Prometheus metrics and the operator's HTTP endpoints (`/metrics`,
//! `/healthz`, `/readyz`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GcsCallLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

/// The operator's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Counter,
    failures: Family<ErrorLabels, Counter>,
    conflicts: Counter,
    /// All failures (the sum of `failures`, which has no iterator); not exported.
    failed: Counter,
    /// Reconciles that ended, their outcome counted; not exported.
    ended: Counter,
    reconcile_duration: Histogram,
    gcs_calls: Family<GcsCallLabels, Counter>,
    gcs_duration: Family<MethodLabels, Histogram>,
    map_writes: Family<ResultLabels, Counter>,
    events_dropped: Counter,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("bucketmap");
        let reconciles = Counter::default();
        let failures = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration = latency_histogram();
        let conflicts = Counter::default();
        registry.register(
            "reconcile_conflicts",
            "Reconciliations that met a conflict with another writer and were retried",
            conflicts.clone(),
        );
        let gcs_calls = Family::<GcsCallLabels, Counter>::default();
        let gcs_duration = Family::<MethodLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register("reconciles", "Reconciliations started", reconciles.clone());
        registry.register(
            "reconcile_failures",
            "Failed reconciliations by error",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciliations",
            reconcile_duration.clone(),
        );
        registry.register(
            "gcs_calls",
            "GCS API calls by method and result code",
            gcs_calls.clone(),
        );
        registry.register(
            "gcs_call_duration_seconds",
            "Duration of GCS API calls by method",
            gcs_duration.clone(),
        );
        let map_writes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "bucket_map_writes",
            "Writes of namespaces' bucket map ConfigMaps by result (written, conflict, error)",
            map_writes.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            "Kubernetes Events not written because the event queue was full",
            events_dropped.clone(),
        );
        Metrics {
            registry,
            map_writes,
            events_dropped,
            reconciles,
            failures,
            conflicts,
            failed: Counter::default(),
            ended: Counter::default(),
            reconcile_duration,
            gcs_calls,
            gcs_duration,
        }
    }
}

impl Metrics {
    /// Counts a reconcile; the returned guard records its duration when dropped.
    pub fn reconcile_started(&self) -> ReconcileMeasurer<'_> {
        self.reconciles.inc();
        ReconcileMeasurer {
            started: Instant::now(),
            metrics: self,
        }
    }

    /// Counts a failed reconcile by its error label.
    pub fn reconcile_failed(&self, error: &str) {
        self.failed.inc();
        self.failures
            .get_or_create(&ErrorLabels {
                error: error.to_owned(),
            })
            .inc();
    }

    /// Counts a reconcile that met an expected conflict (retried quietly).
    pub fn reconcile_conflict(&self) {
        self.conflicts.inc();
    }

    /// Reconciles that ended so far. A reconcile's outcome (failure or
    /// conflict) is counted before it counts as ended.
    pub fn reconcile_ended_count(&self) -> u64 {
        self.ended.get()
    }

    /// Failed reconciles so far, over all errors.
    pub fn reconcile_failure_count(&self) -> u64 {
        self.failed.get()
    }

    /// Reconciles that met an expected conflict so far.
    pub fn reconcile_conflict_count(&self) -> u64 {
        self.conflicts.get()
    }

    /// Counts one write of a bucket map by its result.
    pub fn map_written(&self, result: &'static str) {
        self.map_writes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Bucket map writes so far with this result.
    pub fn map_writes(&self, result: &'static str) -> u64 {
        self.map_writes
            .get_or_create(&ResultLabels { result })
            .get()
    }

    /// Counts one Kubernetes Event dropped; returns how many were so far.
    pub fn event_dropped(&self) -> u64 {
        self.events_dropped.inc().saturating_add(1)
    }

    /// Records one GCS call.
    pub fn observe_gcs_call(&self, method: &str, code: &str, took: Duration) {
        self.gcs_calls
            .get_or_create(&GcsCallLabels {
                method: method.to_owned(),
                code: code.to_owned(),
            })
            .inc();
        self.gcs_duration
            .get_or_create(&MethodLabels {
                method: method.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// Total GCS calls of `method` (all codes) so far.
    pub fn gcs_call_count(&self, method: &str) -> u64 {
        [
            "OK",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "UNAVAILABLE",
            "FAILED_PRECONDITION",
            "INVALID_ARGUMENT",
            "OTHER",
        ]
        .iter()
        .map(|code| {
            self.gcs_calls
                .get_or_create(&GcsCallLabels {
                    method: method.to_owned(),
                    code: (*code).to_owned(),
                })
                .get()
        })
        .sum()
    }

    /// Total reconciles so far.
    pub fn reconcile_count(&self) -> u64 {
        self.reconciles.get()
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Records a reconcile's duration when dropped.
pub struct ReconcileMeasurer<'a> {
    started: Instant,
    metrics: &'a Metrics,
}

impl Drop for ReconcileMeasurer<'_> {
    fn drop(&mut self) {
        self.metrics.ended.inc();
        self.metrics
            .reconcile_duration
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// Shared state of the HTTP endpoints.
#[derive(Clone, Debug)]
pub struct Health {
    /// The registry `/metrics` renders.
    pub metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
}

impl Health {
    /// Alive and not ready (until [`Health::set_ready`]).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Health {
            metrics,
            ready: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Marks the operator ready (caches synced) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
}

async fn metrics_handler(State(health): State<Health>) -> impl IntoResponse {
    match health.metrics.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode metrics: {e}"),
        )
            .into_response(),
    }
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    health: Health,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = axum::Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for metrics and probes: {e}"))?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcs_calls_are_counted_by_method_and_code() {
        let m = Metrics::default();
        m.observe_gcs_call("CreateBucket", "OK", Duration::from_millis(3));
        m.observe_gcs_call("CreateBucket", "ALREADY_EXISTS", Duration::from_millis(3));
        m.observe_gcs_call("GetBucket", "OK", Duration::from_millis(1));
        assert_eq!(m.gcs_call_count("CreateBucket"), 2);
        let text = m.encode().expect("encodes");
        assert!(
            text.contains(
                r#"bucketmap_gcs_calls_total{method="CreateBucket",code="ALREADY_EXISTS"} 1"#
            ),
            "{text}"
        );
    }
}
