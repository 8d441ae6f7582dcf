//! Body types used on both sides of the proxy: a boxed streaming body, small
//! constructors, capped collection for metadata bodies and a byte counter.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};
use prometheus_client::metrics::counter::Counter;

/// Error type carried by proxied bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every request sent upstream and every response sent to the app.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Boxes any body whose error converts into [`BoxError`].
pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// Why a metadata body could not be collected.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The body went past the limit; reading stopped there.
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// Reading the body failed (the connection broke, or the client's body errored).
    #[error("cannot read body: {0}")]
    Body(BoxError),
}

/// Reads a whole body into memory, failing once it exceeds `limit` bytes.
pub async fn collect_capped<B>(mut body: B, limit: usize) -> Result<Bytes, CollectError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > limit as u64 {
        return Err(CollectError::TooLarge { limit });
    }
    // Most metadata bodies arrive in one frame: keep it as it is, copy only
    // when a second one comes.
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| CollectError::Body(e.into()))?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            if len > limit {
                return Err(CollectError::TooLarge { limit });
            }
            if first.is_none() && buf.is_empty() {
                first = Some(data);
                continue;
            }
            if let Some(first) = first.take() {
                buf.reserve(len);
                buf.extend_from_slice(&first);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(match first {
        Some(only) => only,
        None => buf.freeze(),
    })
}

pin_project_lite::pin_project! {
    /// Counts the data bytes flowing through a body.
    pub struct Counted<B> {
        #[pin]
        inner: B,
        counter: Counter,
    }
}

impl<B> Counted<B> {
    /// Wraps `inner`, adding each data frame's length to `counter`.
    pub fn new(inner: B, counter: Counter) -> Self {
        Self { inner, counter }
    }
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.counter.inc_by(data.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A request body as the client sends it, or as it was read whole
    /// before the request was held by a move's fence: the request is then
    /// decided again and sent with the bytes read.
    #[project = ReplayProj]
    pub enum Replay<B> {
        /// The client's body, read as it comes (`body`).
        #[allow(missing_docs)]
        Unread { #[pin] body: B },
        /// The bytes read, until they are sent (`bytes`).
        #[allow(missing_docs)]
        Read { bytes: Option<Bytes> },
    }
}

impl<B> Replay<B> {
    /// The client's body, not read yet.
    pub fn unread(body: B) -> Self {
        Replay::Unread { body }
    }

    /// The bytes read of a body; `headers` (the request's) are made to
    /// describe them: their length, and no encoding when the sidecar
    /// decoded them (`gzipped`).
    pub fn read(bytes: Bytes, headers: &mut http::HeaderMap, gzipped: bool) -> Self {
        if gzipped {
            headers.remove(http::header::CONTENT_ENCODING);
        }
        headers.remove(http::header::TRANSFER_ENCODING);
        headers.insert(http::header::CONTENT_LENGTH, bytes.len().into());
        Replay::Read { bytes: Some(bytes) }
    }
}

impl<B> Body for Replay<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            ReplayProj::Unread { body } => body.poll_frame(cx).map_err(Into::into),
            ReplayProj::Read { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Replay::Unread { body } => body.is_end_stream(),
            Replay::Read { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Replay::Unread { body } => body.size_hint(),
            Replay::Read { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn collect_capped_enforces_the_limit() {
        let ok = collect_capped(full("hello"), 5).await;
        assert_eq!(ok.ok(), Some(Bytes::from("hello")));
        let too_big = collect_capped(full("hello!"), 5).await;
        assert!(matches!(too_big, Err(CollectError::TooLarge { limit: 5 })));
        let frames = futures::stream::iter(["he", "", "ll", "o"].map(|part| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(part.as_bytes())))
        }));
        let joined = collect_capped(http_body_util::StreamBody::new(frames), 5).await;
        assert_eq!(joined.ok(), Some(Bytes::from("hello")));
    }

    #[tokio::test]
    async fn counted_counts_data_bytes() {
        let counter = Counter::default();
        let body = Counted::new(full("abcdef"), counter.clone());
        let bytes = body.collect().await.map(|c| c.to_bytes()).ok();
        assert_eq!(bytes, Some(Bytes::from("abcdef")));
        assert_eq!(counter.get(), 6);
    }
}
