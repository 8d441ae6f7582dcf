//! Generated bodies: slices of one shared buffer.

use super::*;

/// A body of `remaining` bytes sliced from one shared buffer (no copies).
pub(crate) struct Generated {
    pub(crate) remaining: u64,
    pub(crate) chunk: Bytes,
}

impl Generated {
    pub(crate) fn new(size: u64, chunk: &Bytes) -> Self {
        Generated {
            remaining: size,
            chunk: chunk.clone(),
        }
    }
}

impl Body for Generated {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(self.chunk.len() as u64) as usize;
        self.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

pub(crate) type BenchBody = BoxBody<Bytes, Infallible>;

pub(crate) fn empty() -> BenchBody {
    Empty::new().boxed()
}

pub(crate) fn pattern_chunk() -> Bytes {
    (0..CHUNK)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}
