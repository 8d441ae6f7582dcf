//! Diverts gRPC calls (`content-type: application/grpc…`) to the gRPC
//! path; every other request goes on to the JSON/XML stack.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, header};
use http_body::Body;
use tower::{Layer, Service};

use super::service::GrpcProxy;
use crate::body::BoxError;
use crate::layers::{Answer, BoxFuture, Either};

/// Whether `req` is a gRPC call.
pub fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct == "application/grpc"
                || ct.starts_with("application/grpc+")
                || ct.starts_with("application/grpc;")
        })
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct GrpcLayer {
    proxy: Arc<GrpcProxy>,
}

impl GrpcLayer {
    /// Sends gRPC calls to `proxy`.
    pub fn new(proxy: Arc<GrpcProxy>) -> Self {
        Self { proxy }
    }
}

impl<S> Layer<S> for GrpcLayer {
    type Service = Grpc<S>;

    fn layer(&self, inner: S) -> Grpc<S> {
        Grpc {
            inner,
            proxy: self.proxy.clone(),
        }
    }
}

/// See [`GrpcLayer`].
#[derive(Clone, Debug)]
pub struct Grpc<S> {
    inner: S,
    proxy: Arc<GrpcProxy>,
}

impl<S, B> Service<Request<B>> for Grpc<S>
where
    S: Service<Request<B>, Response = Answer, Error = Infallible>,
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<Result<Answer, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if !is_grpc(&req) {
            return Either::left(self.inner.call(req));
        }
        let proxy = self.proxy.clone();
        Either::right(Box::pin(async move { Ok(proxy.call(req).await) }))
    }
}
