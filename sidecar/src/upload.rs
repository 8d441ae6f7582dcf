//! `uploadType=multipart` uploads (`multipart/related`): the first part is
//! the object's JSON metadata, the second its data. The metadata part is
//! read (bounded) and rewritten; the data streams through untouched.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use memchr::memmem;

use crate::body::{BoxError, ProxyBody, boxed};
use crate::errors::ApiError;
use crate::multipart::{boundary, delimiter_line, headers_well_formed};

/// Room for the delimiter and the part headers on top of the metadata limit.
const HEADER_ALLOWANCE: usize = 16 * 1024;

/// The rewritten body, and how much longer (or shorter) it is than the original.
pub struct Rewritten {
    /// The body to send upstream: what was read (with the metadata part
    /// translated, when it was), then the rest as it streams.
    pub body: ProxyBody,
    /// New length minus original length, in bytes (negative when shorter).
    pub length_delta: i64,
}

/// Why a `multipart/related` upload could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The metadata part (with its headers) is larger than the limit.
    #[error("the metadata part is too large")]
    TooLarge,
    /// The metadata was refused by the check or the translation.
    #[error(transparent)]
    Api(ApiError),
    /// Reading the client's body failed.
    #[error("cannot read the request body: {0}")]
    Body(BoxError),
    /// The body is not `multipart/related` as GCS uploads send it; says what is wrong.
    #[error("malformed multipart/related body: {0}")]
    Malformed(&'static str),
}

impl UploadError {
    /// The answer to the client; `limit` is the metadata limit, in bytes (for 413).
    pub fn into_api_error(self, limit: usize) -> ApiError {
        match self {
            UploadError::TooLarge => ApiError::too_large(limit),
            UploadError::Api(err) => err,
            UploadError::Body(err) => {
                ApiError::bad_request(format!("cannot read the request body: {err}"))
            }
            UploadError::Malformed(what) => ApiError::bad_request(format!(
                "bucketmap-sidecar: malformed multipart/related upload: {what}"
            )),
        }
    }
}

/// Rewrites the first part of a `multipart/related` body with `rewrite`
/// (which returns `None` to keep it) and streams the rest. A body that is not
/// `multipart/related` is forwarded untouched.
pub async fn rewrite_related<B>(
    mut body: B,
    content_type: &str,
    limit: usize,
    rewrite: impl FnOnce(&[u8]) -> Result<Option<Vec<u8>>, ApiError>,
) -> Result<Rewritten, UploadError>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let Some(boundary) = boundary(content_type) else {
        return Ok(Rewritten {
            body: boxed(body),
            length_delta: 0,
        });
    };
    let opening = format!("--{boundary}");
    // Found after a bare LF too; a CR before it belongs to the line break.
    let closing = format!("\n--{boundary}");
    let cap = limit.saturating_add(HEADER_ALLOWANCE);
    let mut buf = BytesMut::new();
    let mut scan = Scan::default();
    let (content_start, content_end) = loop {
        if let Some(found) = scan.advance(&buf, opening.as_bytes(), closing.as_bytes())? {
            break found;
        }
        if buf.len() > cap {
            return Err(UploadError::TooLarge);
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
            Some(Err(err)) => return Err(UploadError::Body(err.into())),
            None => {
                return Err(UploadError::Malformed(
                    "the metadata part is not followed by a data part",
                ));
            }
        }
    };
    if content_end - content_start > limit {
        return Err(UploadError::TooLarge);
    }
    let original = &buf[content_start..content_end];
    let Some(new) = rewrite(original).map_err(UploadError::Api)? else {
        return Ok(Rewritten {
            body: boxed(Prefixed::new(buf.freeze(), body)),
            length_delta: 0,
        });
    };
    let length_delta = new.len() as i64 - original.len() as i64;
    let mut prefix = BytesMut::with_capacity(buf.len() + new.len());
    prefix.extend_from_slice(&buf[..content_start]);
    prefix.extend_from_slice(&new);
    prefix.extend_from_slice(&buf[content_end..]);
    Ok(Rewritten {
        body: boxed(Prefixed::new(prefix.freeze(), body)),
        length_delta,
    })
}

/// Incremental search for the first part's content bounds, resuming where
/// the previous search stopped so that many small frames stay linear.
#[derive(Default)]
struct Scan {
    opening_end: Option<usize>,
    headers_end: Option<usize>,
    searched: usize,
}

impl Scan {
    fn advance(
        &mut self,
        buf: &[u8],
        opening: &[u8],
        closing: &[u8],
    ) -> Result<Option<(usize, usize)>, UploadError> {
        if self.opening_end.is_none() {
            let Some(line_end) = self.find_opening(buf, opening)? else {
                return Ok(None);
            };
            self.opening_end = Some(line_end);
            self.searched = line_end;
        }
        let Some(opening_end) = self.opening_end else {
            return Ok(None);
        };
        if self.headers_end.is_none() {
            // From the opening line's own line break: a part without headers
            // starts with the empty line.
            let from = self.searched.max(opening_end) - 1;
            let Some(end) = blank_line_end(buf, from) else {
                self.searched = buf.len().saturating_sub(2).max(opening_end);
                return Ok(None);
            };
            // Header lines other parsers would read differently are refused.
            if !headers_well_formed(&buf[opening_end..end]) {
                return Err(UploadError::Malformed(
                    "the metadata part has a malformed header line",
                ));
            }
            self.headers_end = Some(end);
            self.searched = end - 1; // the closing delimiter may follow an empty part
        }
        let Some(headers_end) = self.headers_end else {
            return Ok(None);
        };
        Ok(self.find_closing(buf, closing, headers_end))
    }

    /// The end of the metadata content: the line break before the next
    /// delimiter line (`\n--B`, then optional `--`, blanks, the line end).
    fn find_closing(
        &mut self,
        buf: &[u8],
        closing: &[u8],
        headers_end: usize,
    ) -> Option<(usize, usize)> {
        let mut from = self.searched.max(headers_end.saturating_sub(1));
        while let Some(found) = memmem::find(&buf[from..], closing) {
            let at = from + found;
            match delimiter_line(&buf[at + closing.len()..], false) {
                Some(true) => {
                    let mut end = at;
                    if end > headers_end && buf[end - 1] == b'\r' {
                        end -= 1;
                    }
                    return Some((headers_end, end.max(headers_end)));
                }
                // `--B--junk` or `--Bjunk`: content, as RFC 2046 parsers read it.
                Some(false) => from = at + 1,
                None => {
                    self.searched = at;
                    return None;
                }
            }
        }
        self.searched = buf
            .len()
            .saturating_sub(closing.len())
            .max(from)
            .max(headers_end.saturating_sub(1));
        None
    }

    /// The end of the opening delimiter line (`--B` at the start of a line,
    /// then optional blanks and the line end), `None` until the buffer holds
    /// it. Lines before it are a preamble; a close delimiter first means the
    /// body has no parts.
    fn find_opening(&mut self, buf: &[u8], opening: &[u8]) -> Result<Option<usize>, UploadError> {
        let mut from = self.searched;
        while let Some(found) = memmem::find(&buf[from..], opening) {
            let at = from + found;
            let rest = &buf[at + opening.len()..];
            if at > 0 && buf[at - 1] != b'\n' {
                from = at + 1;
                continue;
            }
            match delimiter_line(rest, false) {
                Some(true) if rest.starts_with(b"--") => {
                    return Err(UploadError::Malformed("the body has no parts"));
                }
                Some(true) => {
                    let line = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
                    return Ok(Some(at + opening.len() + line + 1));
                }
                Some(false) => from = at + 1,
                None => {
                    self.searched = at;
                    return Ok(None);
                }
            }
        }
        self.searched = buf.len().saturating_sub(opening.len()).max(from);
        Ok(None)
    }
}

/// The end of the first empty line at or after `from` — the line break
/// ending the delimiter line or the last header, then CRLF or a bare LF —
/// or `None` when the buffer does not hold one yet.
fn blank_line_end(buf: &[u8], from: usize) -> Option<usize> {
    memchr::memchr_iter(b'\n', &buf[from..])
        .map(|i| from + i + 1)
        .find_map(|next| match buf.get(next..next + 2) {
            Some([b'\n', _]) => Some(next + 1),
            Some([b'\r', b'\n']) => Some(next + 2),
            None if buf.get(next) == Some(&b'\n') => Some(next + 1),
            _ => None,
        })
}

pin_project_lite::pin_project! {
    /// A body that yields `prefix` and then the rest of `inner`.
    pub struct Prefixed<B> {
        prefix: Option<Bytes>,
        #[pin]
        inner: B,
    }
}

impl<B> Prefixed<B> {
    /// Yields `prefix` first, then `inner`.
    pub fn new(prefix: Bytes, inner: B) -> Self {
        Self {
            prefix: Some(prefix),
            inner,
        }
    }
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(prefix) = this.prefix.take()
            && !prefix.is_empty()
        {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.as_ref().is_none_or(Bytes::is_empty) && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let extra = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + extra);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + extra);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    fn chunked(
        data: &[u8],
        size: usize,
    ) -> impl Body<Data = Bytes, Error = BoxError> + Send + Sync + Unpin + 'static {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = data
            .chunks(size)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        StreamBody::new(futures::stream::iter(frames))
    }

    fn upload_body(meta: &str, media: &[u8]) -> Vec<u8> {
        let mut body = format!("--xyz\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n--xyz\r\nContent-Type: image/jpeg\r\n\r\n").into_bytes();
        body.extend_from_slice(media);
        body.extend_from_slice(b"\r\n--xyz--\r\n");
        body
    }

    async fn run(body: Vec<u8>, frame: usize, limit: usize) -> Result<(Vec<u8>, i64), UploadError> {
        let rewritten = rewrite_related(
            chunked(&body, frame),
            "multipart/related; boundary=xyz",
            limit,
            |part| {
                let text = String::from_utf8_lossy(part)
                    .replace("\"bucket\":\"photos\"", "\"bucket\":\"photos-k3x9q2mw\"");
                Ok(Some(text.into_bytes()))
            },
        )
        .await?;
        let out = rewritten
            .body
            .collect()
            .await
            .map_err(UploadError::Body)?
            .to_bytes()
            .to_vec();
        Ok((out, rewritten.length_delta))
    }

    #[tokio::test]
    async fn rewrites_the_metadata_part_whatever_the_framing() {
        let media: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let body = upload_body(r#"{"name":"photos","bucket":"photos"}"#, &media);
        let want = upload_body(r#"{"name":"photos","bucket":"photos-k3x9q2mw"}"#, &media);
        for frame in [1, 2, 3, 7, 64, 100_000] {
            let (out, delta) = run(body.clone(), frame, 1024)
                .await
                .unwrap_or_else(|e| panic!("frame {frame}: {e}"));
            assert!(
                out == want,
                "frame {frame}: {}",
                String::from_utf8_lossy(&out[..out.len().min(200)])
            );
            assert_eq!(delta, want.len() as i64 - body.len() as i64);
        }
    }

    /// Delimiter and header lines ending in bare LF, a metadata part without
    /// headers, a data part without a Content-Type: all framings GCS accepts.
    #[tokio::test]
    async fn bare_lf_and_headerless_parts_are_accepted() {
        let media = b"\x00\r\n--xy not a delimiter\n\xff";
        let bodies = [
            (
                "--xyz\nContent-Type: application/json\n\n{\"bucket\":\"photos\"}\n--xyz\n\n",
                "\n--xyz--\n",
            ),
            (
                "--xyz\r\n\r\n{\"bucket\":\"photos\"}\r\n--xyz\r\n\r\n",
                "\r\n--xyz--",
            ),
            ("--xyz\n\n{\"bucket\":\"photos\"}\r\n--xyz\n\n", "\n--xyz--"),
        ];
        for (head, tail) in bodies {
            let mut body = head.as_bytes().to_vec();
            body.extend_from_slice(media);
            body.extend_from_slice(tail.as_bytes());
            for frame in [1, 5, 1000] {
                let (out, _) = run(body.clone(), frame, 1024)
                    .await
                    .unwrap_or_else(|e| panic!("{head:?} frame {frame}: {e}"));
                let want = String::from_utf8_lossy(&body)
                    .replace("\"bucket\":\"photos\"", "\"bucket\":\"photos-k3x9q2mw\"");
                assert_eq!(
                    String::from_utf8_lossy(&out),
                    want,
                    "{head:?} frame {frame}"
                );
                assert!(out.ends_with(tail.as_bytes()));
                assert!(out.windows(media.len()).any(|w| w == media));
            }
        }
    }

    /// `--B--junk` and `--Bjunk` lines are content for RFC 2046 parsers, so
    /// they neither open nor close the metadata part: the part the sidecar
    /// checks is the part the upstream reads. Malformed header lines in the
    /// metadata part are refused.
    #[tokio::test]
    async fn delimiter_look_alikes_are_content() {
        let tail = "\r\n--xyz\r\n\r\ndata\r\n--xyz--\r\n";
        let cases = [
            (
                "--xyz\r\n\r\n{\"bucket\":\"photos\"}\r\n--xyzjunk\r\n--xyz--junk",
                "{\"bucket\":\"photos\"}\r\n--xyzjunk\r\n--xyz--junk",
            ),
            (
                "--xyzjunk\r\n\r\n{\"bucket\":\"a\"}\r\n--xyz \t\r\n\r\n{\"bucket\":\"photos\"}",
                "{\"bucket\":\"photos\"}",
            ),
        ];
        for (head, metadata) in cases {
            let body = format!("{head}{tail}");
            for frame in [1, 3, 1000] {
                let seen = std::sync::Mutex::new(Vec::new());
                let result = rewrite_related(
                    chunked(body.as_bytes(), frame),
                    "multipart/related; boundary=xyz",
                    1024,
                    |part| {
                        seen.lock().map(|mut s| s.extend_from_slice(part)).ok();
                        Ok(None)
                    },
                )
                .await;
                assert!(result.is_ok(), "{head:?} frame {frame}");
                let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
                assert_eq!(String::from_utf8_lossy(&seen), metadata, "frame {frame}");
            }
        }
        for head in ["--xyz\r\nbad line\r\n\r\n{}", "--xyz\r\n folded\r\n\r\n{}"] {
            let body = format!("{head}{tail}");
            assert!(
                matches!(
                    run(body.into_bytes(), 4, 1024).await,
                    Err(UploadError::Malformed(_))
                ),
                "{head:?}"
            );
        }
        let no_parts = "--xyz--\r\n--xyz\r\n\r\n{}\r\n--xyz--";
        assert!(matches!(
            run(no_parts.as_bytes().to_vec(), 4, 1024).await,
            Err(UploadError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn oversized_or_truncated_metadata_is_refused() {
        let big = format!(r#"{{"bucket":"photos","x":"{}"}}"#, "a".repeat(100));
        assert!(matches!(
            run(upload_body(&big, b"m"), 10, 50).await,
            Err(UploadError::TooLarge)
        ));
        let truncated =
            b"--xyz\r\nContent-Type: application/json\r\n\r\n{\"bucket\":\"photos\"}".to_vec();
        assert!(matches!(
            run(truncated, 5, 1024).await,
            Err(UploadError::Malformed(_))
        ));
        assert!(matches!(
            run(b"garbage --xyz\r\n".to_vec(), 5, 1024).await,
            Err(UploadError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn non_multipart_bodies_pass_untouched() {
        let rewritten = rewrite_related(chunked(b"raw", 1), "application/octet-stream", 10, |_| {
            Ok(None)
        })
        .await;
        let out = match rewritten {
            Ok(r) => r.body.collect().await.map(|c| c.to_bytes()).ok(),
            Err(_) => None,
        };
        assert_eq!(out.as_deref(), Some(&b"raw"[..]));
    }
}
