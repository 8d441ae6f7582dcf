//! The request path as a tower stack of small layers around one core
//! service ([`crate::proxy::Core`]), composed in [`crate::server::proxy_stack`]:
//!
//! 1. [`record`]: the log lines, the `requests` metric, the in-flight gauge
//!    and the count of body bytes sent to the client;
//! 2. [`admin`]: `/_bucketmap/{healthz,readyz,metrics}` (the same
//!    [`admin::Admin`] serves the `--admin-addr` listener);
//! 3. [`crate::grpc::layer`]: gRPC calls leave for [`crate::grpc`];
//! 4. [`refuse`]: refuses what cannot be rewritten (a bad
//!    `X-HTTP-Method-Override`, shapes the router does not know, signed
//!    URLs and HMAC signatures, names the map cannot translate), holds the
//!    writes a move's fence holds ([`crate::hold`]), and hands the routed
//!    request on as a [`refuse::Routed`];
//! 5. [`credentials`]: Application Default Credentials for requests whose
//!    own `Authorization` does not reach the upstream;
//! 6. the core: rewrite, forward through [`timeout`] (the upstream call's
//!    time limit), rewrite back; a write's body is registered among the
//!    writes in flight ([`crate::flights`]) until it is complete.
//!
//! Layers below [`record`] answer with an [`Answer`]: the response, its
//! operation label and, for answers the sidecar gave itself, [`Rejected`].
//! A field rather than the response's extensions: an extension costs three
//! allocations per request (the map, its table, the boxed value), on the
//! path every proxied request takes.

pub mod admin;
pub mod credentials;
pub mod record;
pub mod refuse;
pub mod timeout;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use crate::body::{ProxyBody, full};
use crate::errors::{ApiError, ErrorStyle};

/// A response and what [`record`] logs and counts of it.
#[derive(Debug)]
pub struct Answer {
    /// What the client gets.
    pub response: Response<ProxyBody>,
    /// The operation label (metrics and logs): the GCS operation
    /// (`objects.get`), `internal`, `grpc`, or `unrouted`.
    pub operation: &'static str,
    /// Set when the sidecar answered itself with an error.
    pub rejected: Option<Rejected>,
}

impl Answer {
    /// `response`, labelled `operation`.
    pub fn new(response: Response<ProxyBody>, operation: &'static str) -> Self {
        Self {
            response,
            operation,
            rejected: None,
        }
    }
}

/// Marks an error the sidecar answered itself, with what its log line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// The JSON API `reason` (`badRequest`, `forbidden`, …).
    pub reason: &'static str,
    /// The message the client got.
    pub message: String,
}

/// The GCS-style answer to a request the sidecar refuses or cannot serve.
pub fn rejection(error: ApiError, style: ErrorStyle, operation: &'static str) -> Answer {
    let rejected = Rejected {
        reason: error.reason,
        message: error.message.clone(),
    };
    Answer {
        response: error.into_response(style).map(full),
        operation,
        rejected: Some(rejected),
    }
}

/// A boxed future, for layers whose work is asynchronous.
pub type BoxFuture<T> = BorrowingBoxFuture<'static, T>;

/// A boxed future that may borrow for `'a` (the upstream client's calls).
pub type BorrowingBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pin_project_lite::pin_project! {
    /// One of two futures with the same output: a layer that answers itself
    /// or calls its inner service, without boxing either.
    #[project = EitherProj]
    pub enum Either<A, B> {
        // pin_project_lite takes no doc comment on a variant's field: the
        // variant's own says what `future` is.
        /// A future of the first type, in `future`.
        #[allow(missing_docs)]
        Left { #[pin] future: A },
        /// A future of the second type, in `future`.
        #[allow(missing_docs)]
        Right { #[pin] future: B },
    }
}

impl<A, B> Either<A, B> {
    /// Wraps a future of the first type.
    pub fn left(future: A) -> Self {
        Self::Left { future }
    }

    /// Wraps a future of the second type.
    pub fn right(future: B) -> Self {
        Self::Right { future }
    }
}

impl<A, B> Future for Either<A, B>
where
    A: Future,
    B: Future<Output = A::Output>,
{
    type Output = A::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<A::Output> {
        match self.project() {
            EitherProj::Left { future } => future.poll(cx),
            EitherProj::Right { future } => future.poll(cx),
        }
    }
}

/// Shared by the layers' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http::Response;
    use http_body_util::BodyExt as _;

    use crate::body::{ProxyBody, full};

    /// An inner service that counts its calls and answers 200 `inner`,
    /// labelled `inner`.
    #[derive(Clone, Default)]
    pub(crate) struct Counting(Arc<AtomicUsize>);

    impl<R> tower::Service<R> for Counting {
        type Response = super::Answer;
        type Error = Infallible;
        type Future = std::future::Ready<Result<super::Answer, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: R) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            let answer = super::Answer::new(Response::new(full("inner")), "inner");
            std::future::ready(Ok(answer))
        }
    }

    /// A [`Counting`] service and its count.
    pub(crate) fn counting() -> (Arc<AtomicUsize>, Counting) {
        let service = Counting::default();
        (service.0.clone(), service)
    }

    pub(crate) fn calls(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }

    pub(crate) async fn body(response: Response<ProxyBody>) -> Bytes {
        match response.into_body().collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(err) => panic!("cannot read the body: {err}"),
        }
    }
}
