//! A streaming body that rewrites each gRPC message as it passes: data is
//! read frame by frame (HTTP/2 flow control stays end to end: nothing is
//! read ahead of what the other side takes), cut into messages, rewritten
//! one at a time, and sent on as prefix + payload without further copies.

use std::collections::VecDeque;
use std::future::{Future as _, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};
use tonic::Status;

use super::frame::{Decoded, Decoder, Message};
use super::status::from_core;
use crate::body::BoxError;
use bucketmap_sidecar_core::grpc::status::Status as CoreStatus;

/// What one direction does with its messages and its end.
pub trait Side: Send + Sync + Unpin + 'static {
    /// Rewrites one message (or refuses it).
    fn message(&mut self, message: Message) -> Result<Message, Status>;

    /// Whether a message that came in several data frames, given its
    /// compressed flag and its payload in the frames' pieces, goes on as
    /// it came, in those pieces, without [`Side::message`]. The default
    /// gathers every message into one buffer.
    fn as_it_came(&self, _compressed: bool, _payload: &[&[u8]]) -> bool {
        false
    }

    /// The end of the stream, with the trailers received (if any): the
    /// trailers to send on, or an error to abort the stream with.
    fn finish(&mut self, trailers: Option<HeaderMap>) -> Result<Option<HeaderMap>, BoxError>;

    /// A refused message or a broken inner stream: trailers that end the
    /// stream with `status`, or an error to abort it with.
    fn fail(&mut self, status: Status) -> Result<HeaderMap, BoxError>;

    /// Before a frame goes on (`last`: the last of what the messages so far
    /// produced): a status to end the stream with instead (a write cut off
    /// by a move's fence). The default lets everything go.
    fn passing(&mut self, _last: bool) -> Option<Status> {
        None
    }

    /// Before the stream waits for more of the inner stream: a status to end
    /// it with (a write cut off); otherwise `cx` is woken when there is one.
    fn poll_cut(&mut self, _cx: &Context<'_>) -> Option<Status> {
        None
    }
}

/// See the module documentation.
pub struct RewriteBody<B, S> {
    inner: B,
    side: S,
    decoder: Decoder,
    out: VecDeque<Bytes>,
    messages: u64,
    done: bool,
    pending_trailers: Option<HeaderMap>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B, S> RewriteBody<B, S>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
    S: Side,
{
    /// Rewrites the messages of `inner` (none larger than `limit` bytes) with `side`.
    pub fn new(inner: B, side: S, limit: usize) -> Self {
        Self {
            inner,
            side,
            decoder: Decoder::new(limit),
            out: VecDeque::new(),
            messages: 0,
            done: false,
            pending_trailers: None,
            deadline: None,
        }
    }

    /// Ends the stream with DEADLINE_EXCEEDED (through [`Side::fail`]) at `at`.
    pub fn with_deadline(mut self, at: Option<tokio::time::Instant>) -> Self {
        self.deadline = at.map(|at| Box::pin(tokio::time::sleep_until(at)));
        self
    }

    /// Reads the first message as it came (or `None` when the stream ends
    /// without one), so that it is checked before anything is sent on; it is
    /// sent first once [`RewriteBody::put_first`] has rewritten it.
    pub async fn first(&mut self) -> Result<Option<Message>, BoxError> {
        match poll_fn(|cx| self.poll_first(cx)).await {
            Ok(message) => Ok(Some(message)),
            // The stream ended before a whole message: its end goes on.
            Err(Some(Ok(frame))) => {
                self.pending_trailers = frame.into_trailers().ok();
                Ok(None)
            }
            Err(Some(Err(e))) => Err(e),
            Err(None) => Ok(None),
        }
    }

    /// Reads until a whole message is decoded; or how the stream ended
    /// before one (as [`RewriteBody::poll_frame`] would say it).
    #[allow(clippy::type_complexity)] // the body's own frame type
    fn poll_first(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Message, Option<Result<Frame<Bytes>, BoxError>>>> {
        loop {
            match self.decoder.next_message() {
                Ok(Some(message)) => return Poll::Ready(Ok(message)),
                Ok(None) => {}
                Err(status) => return Poll::Ready(Err(Some(self.fail(from_core(status))))),
            }
            match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.decoder.push(data),
                    Err(frame) => return Poll::Ready(Err(self.end(frame.into_trailers().ok()))),
                },
                Some(Err(e)) => {
                    let status = Status::unavailable(format!("the stream broke: {e}"));
                    return Poll::Ready(Err(Some(self.fail(status))));
                }
                None => return Poll::Ready(Err(self.end(None))),
            }
        }
    }

    /// Rewrites the first message (from [`RewriteBody::first`]) with the
    /// side as it is now; sent first. A refusal leaves the body as it was:
    /// the message may be put again, with another side.
    pub fn put_first(&mut self, message: Message) -> Result<(), Status> {
        self.rewrite(message)
    }

    /// The side, to change it between tries of [`RewriteBody::put_first`].
    pub fn side_mut(&mut self) -> &mut S {
        &mut self.side
    }

    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(chunk) = self.out.pop_front() {
                if let Some(status) = self.side.passing(self.out.is_empty()) {
                    return Poll::Ready(Some(self.fail(status)));
                }
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if self.done {
                return Poll::Ready(self.pending_trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let side = &self.side;
            match self
                .decoder
                .next(|compressed, payload| side.as_it_came(compressed, payload))
            {
                Ok(Some(Decoded::Message(message))) => {
                    if let Err(status) = self.rewrite(message) {
                        return Poll::Ready(Some(self.fail(status)));
                    }
                    continue;
                }
                Ok(Some(Decoded::AsItCame(pieces))) => {
                    self.out.extend(pieces);
                    self.messages += 1;
                    continue;
                }
                Ok(None) => {}
                Err(status) => return Poll::Ready(Some(self.fail(from_core(status)))),
            }
            if let Some(deadline) = self.deadline.as_mut()
                && deadline.as_mut().poll(cx).is_ready()
            {
                let status = from_core(super::headers::deadline_exceeded());
                return Poll::Ready(Some(self.fail(status)));
            }
            if let Some(status) = self.side.poll_cut(cx) {
                return Poll::Ready(Some(self.fail(status)));
            }
            match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.decoder.push(data),
                    Err(frame) => return Poll::Ready(self.end(frame.into_trailers().ok())),
                },
                Some(Err(e)) => {
                    let status = Status::unavailable(format!("the stream broke: {e}"));
                    return Poll::Ready(Some(self.fail(status)));
                }
                None => return Poll::Ready(self.end(None)),
            }
        }
    }

    fn rewrite(&mut self, message: Message) -> Result<(), Status> {
        let message = self.side.message(message)?;
        self.out.push_back(message.prefix().map_err(from_core)?);
        if !message.payload.is_empty() {
            self.out.push_back(message.payload);
        }
        self.messages += 1;
        Ok(())
    }

    fn end(&mut self, trailers: Option<HeaderMap>) -> Option<Result<Frame<Bytes>, BoxError>> {
        self.done = true;
        if !self.decoder.is_empty() {
            let status = from_core(CoreStatus::invalid_argument(
                "the stream ended inside a gRPC message",
            ));
            return Some(self.fail(status));
        }
        match self.side.finish(trailers) {
            Ok(trailers) => trailers.map(|t| Ok(Frame::trailers(t))),
            Err(e) => Some(Err(e)),
        }
    }

    fn fail(&mut self, status: Status) -> Result<Frame<Bytes>, BoxError> {
        self.done = true;
        self.out.clear();
        self.side.fail(status).map(Frame::trailers)
    }
}

impl<B, S> Body for RewriteBody<B, S>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
    S: Side,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.get_mut().poll_step(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.out.is_empty() && self.pending_trailers.is_none()
    }
}
