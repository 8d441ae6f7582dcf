//! The upstream timeout (`--upstream-timeout`): a limit on one upstream
//! call, from sending the request to the upstream's response head.
//!
//! [`UpstreamTimeoutLayer`] wraps the upstream client (the core's last step),
//! not the request path: the limit covers connecting, sending the request —
//! including a streamed upload body, which the upstream reads before it
//! answers — and the upstream's work until its status and headers arrive.
//! It does not cover what comes before the call (reading and rewriting a
//! metadata request body) or after it (the response body, streamed or read
//! to be rewritten). When it runs out the call is dropped and the client gets
//! the GCS-style 504 of [`ApiError::gateway_timeout`]; a call that fails
//! otherwise gets a 502 ([`UpstreamError::into_api_error`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

use crate::body::BoxError;
use crate::encoding::GunzipError;
use crate::errors::ApiError;

/// An upstream call that did not give a response head.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No response head within the limit (answered 504).
    #[error("the upstream did not answer in time")]
    TimedOut,
    /// The call failed: connection, TLS, or the request body (answered 502,
    /// or 400 when the client's gzip body was bad).
    #[error(transparent)]
    Failed(BoxError),
}

impl UpstreamError {
    /// The answer to the client; `operation` labels the log line of a failure.
    pub fn into_api_error(self, operation: &'static str) -> ApiError {
        let err = match self {
            UpstreamError::TimedOut => return ApiError::gateway_timeout(),
            UpstreamError::Failed(err) => err,
        };
        if let Some(gzip) = find_source::<GunzipError>(err.as_ref()) {
            // The client's own body was bad, not the upstream.
            return ApiError::bad_request(format!(
                "bucketmap-sidecar cannot read the request body (Content-Encoding: gzip): {gzip}"
            ));
        }
        let detail = error_chain(err.as_ref());
        tracing::warn!(operation, error = %detail, "upstream request failed");
        ApiError::bad_gateway(detail)
    }
}

/// Limits the calls of the service it wraps to `limit` (none when `None`).
#[derive(Clone, Copy, Debug)]
pub struct UpstreamTimeoutLayer {
    limit: Option<Duration>,
}

impl UpstreamTimeoutLayer {
    /// `None`: no limit.
    pub fn new(limit: Option<Duration>) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for UpstreamTimeoutLayer {
    type Service = UpstreamTimeout<S>;

    fn layer(&self, inner: S) -> UpstreamTimeout<S> {
        UpstreamTimeout {
            inner,
            limit: self.limit,
        }
    }
}

/// See [`UpstreamTimeoutLayer`].
#[derive(Clone, Debug)]
pub struct UpstreamTimeout<S> {
    inner: S,
    limit: Option<Duration>,
}

impl<S> UpstreamTimeout<S> {
    /// The same limit around a borrowed inner service (the hyper client
    /// serves `&Client` too), so a call needs no clone of the client.
    pub fn by_ref(&self) -> UpstreamTimeout<&S> {
        UpstreamTimeout {
            inner: &self.inner,
            limit: self.limit,
        }
    }
}

impl<S, R> Service<R> for UpstreamTimeout<S>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = UpstreamError;
    type Future = TimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), UpstreamError>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| UpstreamError::Failed(e.into()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        TimeoutFuture {
            inner: self.inner.call(request),
            sleep: self.limit.map(tokio::time::sleep),
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner call, raced against the limit.
    pub struct TimeoutFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
    }
}

impl<F, T, E> Future for TimeoutFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, UpstreamError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.inner.poll(cx) {
            return Poll::Ready(result.map_err(|e| UpstreamError::Failed(e.into())));
        }
        if let Some(sleep) = this.sleep.as_pin_mut()
            && sleep.poll(cx).is_ready()
        {
            return Poll::Ready(Err(UpstreamError::TimedOut));
        }
        Poll::Pending
    }
}

/// The first error of type `E` in `err`'s source chain.
fn find_source<'e, E: std::error::Error + 'static>(
    err: &'e (dyn std::error::Error + 'static),
) -> Option<&'e E> {
    let mut current = Some(err);
    while let Some(inner) = current {
        if let Some(found) = inner.downcast_ref::<E>() {
            return Some(found);
        }
        current = inner.source();
    }
    None
}

/// `err` and its sources, joined by `: ` (what a log line or an answer
/// should say of a failure several layers deep).
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        out.push_str(": ");
        out.push_str(&inner.to_string());
        source = inner.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{ServiceExt as _, service_fn};

    use super::*;
    use crate::errors::ErrorStyle;

    #[tokio::test]
    async fn an_upstream_that_does_not_answer_in_time_gets_the_gcs_style_504() {
        let never = service_fn(|_: ()| std::future::pending::<Result<(), Infallible>>());
        let limited = UpstreamTimeoutLayer::new(Some(Duration::from_millis(20))).layer(never);
        let result = limited.oneshot(()).await;
        assert!(matches!(result, Err(UpstreamError::TimedOut)), "{result:?}");
        let Err(err) = result else { return };
        let error = err.into_api_error("objects.get");
        assert_eq!(error.status, http::StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(error.reason, "backendError");
        let response = error.into_response(ErrorStyle::Json);
        assert_eq!(response.status(), 504);
        assert_eq!(
            response
                .headers()
                .get("x-bucketmap-sidecar")
                .map(|v| v.as_bytes()),
            Some(&b"rejected"[..])
        );
    }

    #[tokio::test]
    async fn an_answer_in_time_or_without_a_limit_passes() {
        let quick = service_fn(|n: u32| std::future::ready(Ok::<_, Infallible>(n + 1)));
        let limited = UpstreamTimeoutLayer::new(Some(Duration::from_secs(3600))).layer(quick);
        assert!(matches!(limited.oneshot(1).await, Ok(2)));
        let unlimited = UpstreamTimeoutLayer::new(None).layer(quick);
        assert!(matches!(unlimited.oneshot(1).await, Ok(2)));
    }

    #[tokio::test]
    async fn other_failures_are_bad_gateways_or_the_clients_bad_gzip() {
        let failing = service_fn(|_: ()| {
            let io = std::io::Error::other("connection refused");
            std::future::ready(Err::<(), _>(io))
        });
        let result = UpstreamTimeoutLayer::new(None)
            .layer(failing)
            .oneshot(())
            .await;
        let Err(err) = result else { panic!("no error") };
        let error = err.into_api_error("objects.get");
        assert_eq!(error.status, http::StatusCode::BAD_GATEWAY);
        assert!(
            error.message.contains("connection refused"),
            "{}",
            error.message
        );
        let gzip = UpstreamError::Failed(Box::new(GunzipError::TooLarge { limit: 1 }));
        assert_eq!(
            gzip.into_api_error("objects.insert").status,
            http::StatusCode::BAD_REQUEST
        );
    }
}
