//! gRPC message framing (gRPC over HTTP/2: each message is a compressed
//! flag, a 4-byte big-endian length, and the payload): a decoder that cuts
//! a body's data frames into whole messages — without copying when a
//! message lies inside one data frame, with one copy when it spans several
//! — and the prefix of a message sent on. The copy is the default: a
//! message sent on as one buffer costs less in hyper's HTTP/2 send path
//! than the same message in the frames' pieces, on the way to the
//! upstream. A caller that knows a message goes on unchanged may keep it
//! in its pieces instead ([`Decoder::next`]); the response direction does
//! (docs/BENCHMARKS.md, gRPC).
//!
//! Hand-written (a hundred lines): tonic's decoder is bound to its codecs
//! and yields decoded types, while the sidecar needs the raw payload (or
//! its pieces) to rewrite at the wire level and send on unchanged when
//! nothing matters.

use std::collections::VecDeque;

use super::status::Status;
use crate::policy::Refusal;
use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};

/// Length of the prefix in front of each message.
pub const PREFIX_LEN: usize = 5;

/// One gRPC message as it travels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The compressed flag: the payload is encoded with the stream's `grpc-encoding`.
    pub compressed: bool,
    /// The payload (a serialized protobuf message, or its compressed form).
    pub payload: Bytes,
}

impl Message {
    /// The 5-byte prefix announcing this message.
    pub fn prefix(&self) -> Result<Bytes, Status> {
        let len = u32::try_from(self.payload.len())
            .map_err(|_| Status::resource_exhausted("a gRPC message of 4 GiB or more"))?;
        let mut prefix = BytesMut::with_capacity(PREFIX_LEN);
        prefix.put_u8(u8::from(self.compressed));
        prefix.put_u32(len);
        Ok(prefix.freeze())
    }
}

/// What the decoder cut: a message, or one left in the pieces it came in.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A whole message.
    Message(Message),
    /// A message to send on as it came: its prefix, then its payload in
    /// the pieces of the data frames it came in.
    AsItCame(Vec<Bytes>),
}

/// Cuts data frames into whole messages.
#[derive(Debug)]
pub struct Decoder {
    chunks: VecDeque<Bytes>,
    buffered: usize,
    limit: usize,
}

impl Decoder {
    /// A decoder refusing messages larger than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            buffered: 0,
            limit,
        }
    }

    /// Adds the data of one frame.
    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.buffered += chunk.len();
            self.chunks.push_back(chunk);
        }
    }

    /// Whether no part of a message is waiting for more data.
    pub fn is_empty(&self) -> bool {
        self.buffered == 0
    }

    /// The next whole message, if one is buffered.
    pub fn next_message(&mut self) -> Result<Option<Message>, Status> {
        match self.next(|_, _| false)? {
            Some(Decoded::Message(message)) => Ok(Some(message)),
            Some(Decoded::AsItCame(_)) | None => Ok(None),
        }
    }

    /// The next whole message, if one is buffered. One that spans several
    /// data frames is not gathered when `as_it_came`, given its compressed
    /// flag and its payload in the frames' pieces, says it goes on as it
    /// came: then its prefix and pieces are returned, uncopied.
    pub fn next(
        &mut self,
        as_it_came: impl FnOnce(bool, &[&[u8]]) -> bool,
    ) -> Result<Option<Decoded>, Status> {
        let Some((compressed, len)) = self.whole()? else {
            return Ok(None);
        };
        let in_pieces = self
            .chunks
            .front()
            .is_some_and(|c| c.len() < PREFIX_LEN + len);
        if in_pieces && as_it_came(compressed, &self.pieces(PREFIX_LEN, len)) {
            let mut pieces = vec![self.take(PREFIX_LEN)];
            let mut left = len;
            while left > 0 {
                let n = self.chunks.front().map_or(0, |c| c.len().min(left));
                if n == 0 {
                    break;
                }
                pieces.push(self.take(n));
                left -= n;
            }
            return Ok(Some(Decoded::AsItCame(pieces)));
        }
        self.take(PREFIX_LEN);
        let payload = self.take(len);
        Ok(Some(Decoded::Message(Message {
            compressed,
            payload,
        })))
    }

    /// The compressed flag and length of the first message, when all of
    /// it is buffered.
    fn whole(&self) -> Result<Option<(bool, usize)>, Status> {
        if self.buffered < PREFIX_LEN {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX_LEN];
        self.peek(&mut prefix);
        let compressed = match prefix[0] {
            0 => false,
            1 => true,
            flag => {
                return Err(Status::invalid_argument(format!(
                    "a gRPC message with compressed flag {flag} (only 0 and 1 exist)"
                )));
            }
        };
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.limit {
            return Err(Refusal::grpc_message_too_large(len, self.limit).grpc_status());
        }
        Ok((self.buffered >= PREFIX_LEN + len).then_some((compressed, len)))
    }

    /// The buffered bytes `skip..skip + len`, in the chunks' pieces.
    fn pieces(&self, mut skip: usize, mut len: usize) -> Vec<&[u8]> {
        let mut pieces = Vec::new();
        for chunk in &self.chunks {
            if len == 0 {
                break;
            }
            if skip >= chunk.len() {
                skip -= chunk.len();
                continue;
            }
            let n = (chunk.len() - skip).min(len);
            pieces.push(&chunk[skip..skip + n]);
            (skip, len) = (0, len - n);
        }
        pieces
    }

    /// Copies the first `out.len()` buffered bytes into `out`.
    fn peek(&self, out: &mut [u8]) {
        let mut filled = 0;
        for chunk in &self.chunks {
            let n = chunk.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&chunk[..n]);
            filled += n;
            if filled == out.len() {
                break;
            }
        }
    }

    /// Removes and returns the first `n` buffered bytes (`n <= buffered`):
    /// a slice of the first chunk when it holds them all, else one copy.
    fn take(&mut self, n: usize) -> Bytes {
        self.buffered -= n;
        if let Some(first) = self.chunks.front_mut()
            && first.len() >= n
        {
            let out = first.split_to(n);
            if first.is_empty() {
                self.chunks.pop_front();
            }
            return out;
        }
        let mut out = BytesMut::with_capacity(n);
        while out.len() < n {
            let Some(first) = self.chunks.front_mut() else {
                break;
            };
            let want = (n - out.len()).min(first.len());
            out.put_slice(&first[..want]);
            first.advance(want);
            if first.is_empty() {
                self.chunks.pop_front();
            }
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn framed(messages: &[Message]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.extend_from_slice(&m.prefix().unwrap_or_else(|e| panic!("{e}")));
            out.extend_from_slice(&m.payload);
        }
        out
    }

    fn message(compressed: bool, payload: Vec<u8>) -> Message {
        Message {
            compressed,
            payload: Bytes::from(payload),
        }
    }

    proptest! {
        /// Any cut of a framed stream into data frames yields the same messages.
        #[test]
        fn messages_survive_any_chunking(
            payloads in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<u8>(), 0..300)), 0..6),
            cuts in proptest::collection::vec(0usize..2000, 0..10),
        ) {
            let messages: Vec<Message> = payloads.into_iter().map(|(c, p)| message(c, p)).collect();
            let wire = framed(&messages);
            let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
            points.push(0);
            points.push(wire.len());
            points.sort_unstable();
            let mut decoder = Decoder::new(1 << 20);
            let mut out = Vec::new();
            for pair in points.windows(2) {
                decoder.push(Bytes::copy_from_slice(&wire[pair[0]..pair[1]]));
                while let Some(m) = decoder.next_message().map_err(|e| TestCaseError::fail(e.to_string()))? {
                    out.push(m);
                }
            }
            prop_assert_eq!(out, messages);
            prop_assert!(decoder.is_empty());
        }
    }

    proptest! {
        /// Messages left in their pieces, or gathered, go on as they came:
        /// any cut, any choice.
        #[test]
        fn messages_in_pieces_go_on_as_they_came(
            payloads in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<u8>(), 0..300)), 0..6),
            cuts in proptest::collection::vec(0usize..2000, 0..10),
            keep in any::<u64>(),
        ) {
            let messages: Vec<Message> = payloads.into_iter().map(|(c, p)| message(c, p)).collect();
            let wire = framed(&messages);
            let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
            points.extend([0, wire.len()]);
            points.sort_unstable();
            let mut decoder = Decoder::new(1 << 20);
            let (mut out, mut count) = (Vec::new(), 0u32);
            for pair in points.windows(2) {
                decoder.push(Bytes::copy_from_slice(&wire[pair[0]..pair[1]]));
                let next = |d: &mut Decoder, count: u32| d.next(|_, _| keep >> (count % 64) & 1 == 1);
                while let Some(d) = next(&mut decoder, count).map_err(|e| TestCaseError::fail(e.to_string()))? {
                    count += 1;
                    match d {
                        Decoded::Message(m) => out.extend(framed(&[m])),
                        Decoded::AsItCame(pieces) => pieces.iter().for_each(|p| out.extend_from_slice(p)),
                    }
                }
            }
            prop_assert_eq!(out, wire);
            prop_assert!(decoder.is_empty());
        }
    }

    #[test]
    fn a_message_left_in_pieces_is_not_copied() {
        let wire = Bytes::from(framed(&[message(false, vec![7; 64])]));
        let (head, tail) = (wire.slice(..30), wire.slice(30..));
        let mut decoder = Decoder::new(1024);
        decoder.push(head.clone());
        decoder.push(tail.clone());
        let mut seen = Vec::new();
        let decoded = decoder.next(|compressed, payload| {
            seen = payload.iter().map(|p| p.len()).collect();
            !compressed
        });
        let Ok(Some(Decoded::AsItCame(pieces))) = decoded else {
            panic!("left in pieces: {decoded:?}");
        };
        assert_eq!(seen, [25, 39], "the payload, in the frames' pieces");
        assert_eq!(pieces.len(), 3, "the prefix and two pieces");
        assert_eq!(pieces[1].as_ptr(), head[PREFIX_LEN..].as_ptr());
        assert_eq!(pieces[2].as_ptr(), tail.as_ptr());
        assert!(decoder.is_empty());
    }

    #[test]
    fn a_message_inside_one_frame_is_not_copied() {
        let wire = Bytes::from(framed(&[message(false, vec![7; 64])]));
        let mut decoder = Decoder::new(1024);
        decoder.push(wire.clone());
        let m = decoder.next_message().ok().flatten().expect("a message");
        assert_eq!(m.payload.as_ptr(), wire[PREFIX_LEN..].as_ptr());
    }

    #[test]
    fn oversized_messages_and_bad_flags_are_refused() {
        let mut decoder = Decoder::new(10);
        decoder.push(Bytes::from(framed(&[message(false, vec![0; 11])])));
        let e = decoder.next_message().expect_err("too large");
        assert_eq!(e.code(), crate::grpc::status::Code::ResourceExhausted);
        let mut decoder = Decoder::new(10);
        decoder.push(Bytes::from_static(&[2, 0, 0, 0, 0]));
        let e = decoder.next_message().expect_err("bad flag");
        assert_eq!(e.code(), crate::grpc::status::Code::InvalidArgument);
    }

    #[test]
    fn a_partial_message_waits() {
        let mut decoder = Decoder::new(100);
        decoder.push(Bytes::from_static(&[0, 0, 0, 0, 3, 1]));
        assert_eq!(decoder.next_message().ok(), Some(None));
        assert!(!decoder.is_empty());
    }
}
