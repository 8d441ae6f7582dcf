//! Prometheus metrics of the sidecar.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard, PoisonError};

use foldhash::HashMap;
use prometheus_client::encoding::{EncodeLabelSet, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The GCS operation (`objects.get`), `internal`, or `unrouted`.
    pub operation: &'static str,
    /// The HTTP status of the answer.
    pub status: u16,
}

/// Labels of `upstream_latency_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The GCS operation (`objects.get`).
    pub operation: &'static str,
}

/// Labels of `body_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `from_client` (request bodies) or `to_client` (response bodies).
    pub direction: &'static str,
}

/// Labels of `refused_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why the request was refused, low-cardinality (`unknown_operation`, …).
    pub reason: &'static str,
}

/// Labels of `mapping_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success` (the map changed) or `failure`.
    pub result: &'static str,
}

/// Labels of `held_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HoldLabels {
    /// How the hold ended: `forwarded` (decided again and forwarded),
    /// `timed_out` (refused when the hold limit passed), `refused` (decided
    /// again and refused: the map went stale, the name left the map).
    pub outcome: &'static str,
}

/// Labels of `grpc_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    /// `package.Service/Method` of a method the sidecar knows, else `unknown`.
    pub method: &'static str,
    /// The canonical status code name (`OK`, `NOT_FOUND`, …).
    pub code: &'static str,
}

/// Every metric the sidecar exports.
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by operation and HTTP status.
    pub requests: Family<RequestLabels, Counter>,
    /// Seconds from sending a request upstream to its response headers, by operation.
    pub upstream_latency: Family<OperationLabels, Histogram>,
    /// Body bytes proxied, by direction.
    pub bytes: Family<DirectionLabels, Counter>,
    /// gRPC calls ended, by method and status code.
    pub grpc_requests: Family<GrpcLabels, Counter>,
    /// Mapping reloads that changed the map or failed, by result.
    pub mapping_reloads: Family<ResultLabels, Counter>,
    /// Requests refused by the router (deny by default), by reason.
    pub refusals: Family<ReasonLabels, Counter>,
    /// Entries in the mapping in force.
    pub mapping_entries: Gauge,
    /// Requests being served now.
    pub in_flight: Gauge,
    /// Seconds since the API server last confirmed the map (NaN when the
    /// map is not followed through it); set when scraped.
    pub map_age: Gauge<f64, AtomicU64>,
    /// Failed lists and watches of the map through the API server.
    pub map_follow_failures: Counter,
    /// Requests held by a move's fence, by how the hold ended.
    pub held_requests: Family<HoldLabels, Counter>,
    /// Writes in flight cut off by a move's fence or a stale map.
    pub cut_off_writes: Counter,
    /// The two series of `bytes`, looked up once.
    from_client: Counter,
    to_client: Counter,
    /// The series of `requests` and `upstream_latency` looked up so far, by
    /// operation name.
    series: Mutex<Series>,
}

/// Series already looked up, keyed by the operation's name (and status).
/// A family's own lookup takes its lock and hashes its whole label set
/// with SipHash, twice per proxied request; these maps hash the name with
/// foldhash, as the bucket map does.
#[derive(Default)]
struct Series {
    requests: HashMap<(&'static str, u16), Counter>,
    upstream_latency: HashMap<&'static str, Histogram>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric registered under the `bucketmap_sidecar` prefix, all at zero.
    pub fn new() -> Self {
        let bytes = Family::<DirectionLabels, Counter>::default();
        let series = |direction| bytes.get_or_create(&DirectionLabels { direction }).clone();
        let (from_client, to_client) = (series("from_client"), series("to_client"));
        let mut metrics = Self {
            registry: Registry::with_prefix("bucketmap_sidecar"),
            requests: Family::default(),
            upstream_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
            bytes,
            grpc_requests: Family::default(),
            mapping_reloads: Family::default(),
            refusals: Family::default(),
            mapping_entries: Gauge::default(),
            in_flight: Gauge::default(),
            map_age: Gauge::default(),
            map_follow_failures: Counter::default(),
            held_requests: Family::default(),
            cut_off_writes: Counter::default(),
            from_client,
            to_client,
            series: Mutex::default(),
        };
        metrics.register_all();
        metrics
    }

    /// Registers every metric (clones share their values).
    fn register_all(&mut self) {
        let r = &mut self.registry;
        r.register(
            "requests",
            "Requests answered, by operation and HTTP status",
            self.requests.clone(),
        );
        r.register(
            "upstream_latency_seconds",
            "Time from sending a request upstream to its response headers",
            self.upstream_latency.clone(),
        );
        r.register(
            "body_bytes",
            "Body bytes proxied, by direction",
            self.bytes.clone(),
        );
        r.register(
            "grpc_requests",
            "gRPC calls ended, by method and status code",
            self.grpc_requests.clone(),
        );
        r.register(
            "mapping_reloads",
            "Mapping reloads that changed the map or failed",
            self.mapping_reloads.clone(),
        );
        r.register(
            "refused_requests",
            "Requests refused because they match no GCS operation the sidecar rewrites, by reason",
            self.refusals.clone(),
        );
        r.register(
            "mapping_entries",
            "Entries in the mapping in force",
            self.mapping_entries.clone(),
        );
        r.register(
            "in_flight_requests",
            "Requests being served",
            self.in_flight.clone(),
        );
        r.register(
            "map_age_seconds",
            "Seconds since the Kubernetes API server last confirmed the bucket map (NaN when it is not followed there)",
            self.map_age.clone(),
        );
        r.register(
            "map_follow_failures",
            "Lists and watches of the bucket map through the API server that failed",
            self.map_follow_failures.clone(),
        );
        self.register_moves();
    }

    /// Registers what a move of a bucket does to requests.
    fn register_moves(&mut self) {
        let r = &mut self.registry;
        r.register(
            "held_requests",
            "Requests held while a move switched their bucket, by how the hold ended",
            self.held_requests.clone(),
        );
        r.register(
            "cut_off_writes",
            "Writes cut off before their body was complete: their bucket's entry was fenced or moved, or the map went stale",
            self.cut_off_writes.clone(),
        );
    }

    /// Counts a hold that ended with `outcome` ([`HoldLabels`]).
    pub fn count_hold(&self, outcome: &'static str) {
        self.held_requests
            .get_or_create(&HoldLabels { outcome })
            .inc();
    }

    /// Counts a failed list or watch of the map through the API server.
    pub fn count_live_failure(&self) {
        self.map_follow_failures.inc();
    }

    /// Body bytes read from the application (request bodies).
    pub fn from_client(&self) -> Counter {
        self.from_client.clone()
    }

    /// Body bytes sent to the application (response bodies).
    pub fn to_client(&self) -> Counter {
        self.to_client.clone()
    }

    /// Counts a request answered with `status`, by its operation label.
    pub fn count_request(&self, operation: &'static str, status: u16) {
        self.series()
            .requests
            .entry((operation, status))
            .or_insert_with(|| {
                let labels = RequestLabels { operation, status };
                self.requests.get_or_create(&labels).clone()
            })
            .inc();
    }

    /// Records the wait of an upstream call for its response headers.
    pub fn observe_upstream(&self, operation: &'static str, seconds: f64) {
        self.series()
            .upstream_latency
            .entry(operation)
            .or_insert_with(|| {
                let labels = OperationLabels { operation };
                self.upstream_latency.get_or_create(&labels).clone()
            })
            .observe(seconds);
    }

    fn series(&self) -> MutexGuard<'_, Series> {
        // The maps hold no invariant a panic could break half-way.
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a request the router refused.
    pub fn refused(&self, reason: &'static str) {
        self.refusals.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_metrics() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels {
                operation: "objects.get",
                status: 200,
            })
            .inc();
        m.to_client().inc_by(5);
        m.mapping_entries.set(2);
        m.refused("dot_segment");
        let text = m.encode();
        assert!(
            text.contains(
                "bucketmap_sidecar_requests_total{operation=\"objects.get\",status=\"200\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("bucketmap_sidecar_body_bytes_total{direction=\"to_client\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("bucketmap_sidecar_refused_requests_total{reason=\"dot_segment\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("bucketmap_sidecar_mapping_entries 2"),
            "{text}"
        );
    }

    #[test]
    fn series_are_looked_up_by_name_and_are_the_families_series() {
        let m = Metrics::new();
        // One name at two addresses: one key, one series.
        let copy: &'static str = Box::leak(String::from("objects.get").into_boxed_str());
        assert_ne!(copy.as_ptr(), "objects.get".as_ptr());
        for operation in ["objects.get", copy, "objects.get"] {
            m.count_request(operation, 200);
            m.observe_upstream(operation, 0.001);
        }
        m.count_request("objects.get", 404);
        m.count_request("objects.getx", 200);
        m.observe_upstream("buckets.get", 0.001);
        let text = m.encode();
        for line in [
            "bucketmap_sidecar_requests_total{operation=\"objects.get\",status=\"200\"} 3",
            "bucketmap_sidecar_requests_total{operation=\"objects.get\",status=\"404\"} 1",
            "bucketmap_sidecar_requests_total{operation=\"objects.getx\",status=\"200\"} 1",
            "bucketmap_sidecar_upstream_latency_seconds_count{operation=\"objects.get\"} 3",
            "bucketmap_sidecar_upstream_latency_seconds_count{operation=\"buckets.get\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        let series = m.series();
        assert_eq!(series.requests.len(), 3, "one key per name and status");
        assert_eq!(series.upstream_latency.len(), 2, "one key per name");
    }
}
