//! What the mock records about each call besides its target: an arrival
//! number and the request metadata a proxy must forward
//! (`x-goog-request-params`, `authorization`, `grpc-timeout`, ...).
//!
//! [`Recorded`] wraps the generated server: it reads the headers of every
//! HTTP/2 request and runs the call inside a task-local [`CallContext`], so
//! every handler, unary or streaming, logs them without taking them as an
//! argument.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use super::lock;
use super::state::State;

/// Request headers that are HTTP/2 or gRPC framing, not call metadata.
const FRAMING_HEADERS: &[&str] = &["content-type", "te", "grpc-accept-encoding"];

/// Arrival numbers; unique within the process, so within every mock.
static NEXT_CALL_ID: AtomicU64 = AtomicU64::new(1);

tokio::task_local! {
    static CURRENT: CallContext;
}

/// The identity and metadata of the call being served.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallContext {
    /// Arrival number (0 outside a served call).
    pub(crate) id: u64,
    /// ASCII request metadata by lowercase name (framing headers left out);
    /// repeated headers are joined with `, `.
    pub(crate) metadata: BTreeMap<String, String>,
}

impl CallContext {
    fn from_headers(headers: &http::HeaderMap) -> Self {
        let mut metadata = BTreeMap::<String, String>::new();
        for (name, value) in headers {
            let name = name.as_str();
            if FRAMING_HEADERS.contains(&name) || name.ends_with("-bin") {
                continue;
            }
            let Ok(value) = value.to_str() else { continue };
            metadata
                .entry(name.to_string())
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(value);
                })
                .or_insert_with(|| value.to_string());
        }
        Self {
            id: NEXT_CALL_ID.fetch_add(1, Ordering::Relaxed),
            metadata,
        }
    }

    /// The context of the call the current task serves (an empty one when
    /// none, e.g. state used directly by a test).
    pub(crate) fn current() -> Self {
        CURRENT.try_with(Clone::clone).unwrap_or_default()
    }

    /// Runs `f` with this context as the current one.
    pub(crate) fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(self, f)
    }

    /// Runs `future` with this context as the current one.
    pub(crate) fn scope<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, future)
    }
}

/// Marks the current call cancelled when dropped before
/// [`completed`](Self::completed): the client gave up on a unary call
/// whose work may still finish (and be logged) on the server.
#[derive(Debug)]
pub(crate) struct CancelGuard {
    state: Arc<Mutex<State>>,
    id: u64,
    armed: bool,
}

impl CancelGuard {
    /// Guards the call `id` of the mock with `state`.
    pub(crate) fn new(state: Arc<Mutex<State>>, id: u64) -> Self {
        Self {
            state,
            id,
            armed: true,
        }
    }

    /// The call was answered.
    pub(crate) fn completed(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.state).controls.mark_cancelled(self.id);
        }
    }
}

/// The generated server with a [`CallContext`] around each call.
#[derive(Debug, Clone)]
pub(crate) struct Recorded<S>(pub(crate) S);

impl<S: NamedService> NamedService for Recorded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Recorded<S>
where
    S: Service<http::Request<B>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let context = CallContext::from_headers(request.headers());
        Box::pin(context.scope(self.0.call(request)))
    }
}
