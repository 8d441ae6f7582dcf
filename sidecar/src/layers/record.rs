//! Request recording: the `rejected` and `served` log lines, the `requests`
//! metric by operation and status, the in-flight gauge, and the count of body
//! bytes sent to the client. The outermost layer of the request path: every
//! request the proxy listener accepts is recorded, the internal endpoints'
//! too.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http::{Method, Request, Response, Uri};
use tower::{Layer, Service};

use super::Answer;
use crate::body::{Counted, ProxyBody, boxed};
use crate::metrics::Metrics;

/// Records every request through the service it wraps.
#[derive(Clone, Debug)]
pub struct RecordLayer {
    metrics: Arc<Metrics>,
}

impl RecordLayer {
    /// Records into `metrics` (and the log).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Record<S> {
        Record {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// See [`RecordLayer`].
#[derive(Clone, Debug)]
pub struct Record<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B> Service<Request<B>> for Record<S>
where
    S: Service<Request<B>, Response = Answer, Error = Infallible>,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Recording<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let seen = Seen {
            // Only the `served` line needs the time (two clock reads).
            started: tracing::enabled!(tracing::Level::DEBUG).then(Instant::now),
            method: req.method().clone(),
            // For the log lines (a `Uri` clone shares its bytes).
            uri: req.uri().clone(),
        };
        let in_flight = InFlight::new(self.metrics.clone());
        Recording {
            inner: self.inner.call(req),
            seen,
            in_flight,
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of a recorded request: the inner service's, then the
    /// record. A named type rather than an `async` block, which would be
    /// boxed: one allocation less per request.
    pub struct Recording<F> {
        #[pin]
        inner: F,
        seen: Seen,
        in_flight: InFlight,
    }
}

impl<F> Future for Recording<F>
where
    F: Future<Output = Result<Answer, Infallible>>,
{
    type Output = Result<Response<ProxyBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(answer) = ready!(this.inner.poll(cx));
        Poll::Ready(Ok(record(&this.in_flight.0, this.seen, answer)))
    }
}

/// What the log lines say of the request.
struct Seen {
    method: Method,
    uri: Uri,
    /// When the request came, if the `served` line is logged.
    started: Option<Instant>,
}

/// Logs and counts one answered request; its body is counted as it streams.
fn record(metrics: &Metrics, seen: &Seen, answer: Answer) -> Response<ProxyBody> {
    let Answer {
        response,
        operation,
        rejected,
    } = answer;
    let method = &seen.method;
    let target = LogPath(seen.uri.path());
    let status = response.status().as_u16();
    if let Some(rejected) = rejected {
        tracing::info!(
            %method,
            path = %target,
            operation,
            status,
            reason = rejected.reason,
            message = %rejected.message,
            "rejected"
        );
    }
    metrics.count_request(operation, status);
    if let Some(started) = seen.started {
        let elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::debug!(%method, path = %target, operation, status, elapsed_ms, "served");
    }
    let to_client = metrics.to_client();
    response.map(|body| boxed(Counted::new(body, to_client)))
}

/// A request path in a log line, cut at 256 characters.
struct LogPath<'a>(&'a str);

impl std::fmt::Display for LogPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(256) {
            Some((end, _)) => write!(f, "{}…", &self.0[..end]),
            None => f.write_str(self.0),
        }
    }
}

/// Counts a request in the in-flight gauge for as long as it lives (also
/// when the client goes away and the request's future is dropped).
struct InFlight(Arc<Metrics>);

impl InFlight {
    fn new(metrics: Arc<Metrics>) -> Self {
        metrics.in_flight.inc();
        Self(metrics)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;

    use tower::{ServiceExt as _, service_fn};

    use super::*;
    use crate::body::full;
    use crate::errors::{ApiError, ErrorStyle};
    use crate::layers::rejection;
    use crate::layers::testing::body;
    use crate::metrics::RequestLabels;

    fn count(metrics: &Metrics, operation: &'static str, status: u16) -> u64 {
        let labels = RequestLabels { operation, status };
        metrics.requests.get_or_create(&labels).get()
    }

    fn get(path: &str) -> Request<()> {
        let mut req = Request::new(());
        *req.uri_mut() = path.parse().unwrap_or_else(|e| panic!("{path}: {e}"));
        req
    }

    #[tokio::test]
    async fn counts_the_request_by_its_label_and_the_body_bytes() {
        let metrics = Arc::new(Metrics::new());
        let gauge = metrics.clone();
        // The inner service answers with the in-flight gauge as it saw it.
        let inner = service_fn(move |_: Request<()>| {
            let in_flight = gauge.in_flight.get();
            let answer = Answer::new(Response::new(full(in_flight.to_string())), "objects.get");
            std::future::ready(Ok::<_, Infallible>(answer))
        });
        let record = RecordLayer::new(metrics.clone()).layer(inner);
        let Ok(response) = record.oneshot(get("/storage/v1/b/photos/o/x")).await;
        assert_eq!(metrics.in_flight.get(), 0, "the gauge goes back to 0");
        assert_eq!(&body(response).await[..], b"1", "in flight while served");
        assert_eq!(count(&metrics, "objects.get", 200), 1);
        assert_eq!(metrics.to_client().get(), 1, "body bytes to the client");
    }

    #[tokio::test]
    async fn a_dropped_request_leaves_the_gauge() {
        let metrics = Arc::new(Metrics::new());
        let inner =
            service_fn(|_: Request<()>| std::future::pending::<Result<Answer, Infallible>>());
        let mut record = RecordLayer::new(metrics.clone()).layer(inner);
        let future = record.call(get("/x"));
        assert_eq!(metrics.in_flight.get(), 1);
        drop(future);
        assert_eq!(metrics.in_flight.get(), 0);
        assert_eq!(count(&metrics, "objects.get", 200), 0, "never answered");
    }

    /// Log lines written by `tracing`, kept for the test.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Logs {
        fn text(&self) -> String {
            let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    #[tokio::test]
    async fn a_rejection_is_logged_with_its_reason_and_operation() {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let metrics = Arc::new(Metrics::new());
        let inner = service_fn(|_: Request<()>| async {
            let error = ApiError::unknown_bucket("nope");
            Ok::<_, Infallible>(rejection(error, ErrorStyle::Json, "objects.get"))
        });
        let record = RecordLayer::new(metrics.clone()).layer(inner);
        let Ok(response) = record.oneshot(get("/storage/v1/b/nope/o/x")).await;
        assert_eq!(response.status(), 404);
        assert_eq!(count(&metrics, "objects.get", 404), 1);
        let text = logs.text();
        let line = text
            .lines()
            .find(|l| l.contains("rejected"))
            .unwrap_or_else(|| panic!("no rejected line in {text:?}"));
        for want in [
            "objects.get",
            "notFound",
            "404",
            "/storage/v1/b/nope/o/x",
            "not known",
        ] {
            assert!(line.contains(want), "{want:?} missing from {line:?}");
        }
    }

    #[test]
    fn long_paths_are_cut_in_log_lines() {
        let long = "/".repeat(300);
        let shown = LogPath(&long).to_string();
        assert_eq!(shown.chars().count(), 257);
        assert!(shown.ends_with('…'));
        assert_eq!(LogPath("/short").to_string(), "/short");
    }
}
