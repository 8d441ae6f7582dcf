//! `Content-Encoding` of metadata bodies. Google's Java client gzips its
//! JSON bodies and multipart uploads; the sidecar must read them to rewrite
//! them, so it decodes them (with flate2) and forwards them uncompressed,
//! which GCS accepts. Object data (media uploads, downloads) is never decoded.

use std::io::{Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use flate2::write::GzDecoder;
use http::HeaderMap;
use http::header::CONTENT_ENCODING;
use http_body::{Body, Frame, SizeHint};

use crate::body::BoxError;
use crate::errors::ApiError;

/// A metadata body's encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// No coding (absent, or `identity`).
    Identity,
    /// `gzip` or `x-gzip`, exactly once.
    Gzip,
}

/// The `Content-Encoding` of a message whose body the sidecar must read:
/// identity or gzip; anything else cannot be rewritten.
pub fn content_encoding(headers: &HeaderMap) -> Result<Encoding, String> {
    let mut encoding = Encoding::Identity;
    for value in headers.get_all(CONTENT_ENCODING) {
        let value = value
            .to_str()
            .map_err(|_| "Content-Encoding is not ASCII".to_owned())?;
        for coding in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if coding.eq_ignore_ascii_case("identity") {
                continue;
            }
            let gzip = coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip");
            if !gzip || encoding == Encoding::Gzip {
                return Err(format!(
                    "a metadata body with Content-Encoding {value:?} cannot be read (gzip or \
                     identity only)"
                ));
            }
            encoding = Encoding::Gzip;
        }
    }
    Ok(encoding)
}

/// Why a gzip body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum GunzipError {
    /// The decoded body went past the limit; decoding stopped there.
    #[error("the decoded body is larger than {limit} bytes")]
    TooLarge {
        /// The limit on the decoded size, in bytes.
        limit: usize,
    },
    /// The compressed data is not valid gzip or ends early.
    #[error("the gzip body is corrupt or truncated: {0}")]
    Corrupt(std::io::Error),
}

impl GunzipError {
    /// The answer to a client whose request body this is.
    pub fn into_api_error(self) -> ApiError {
        match self {
            GunzipError::TooLarge { limit } => ApiError::too_large(limit),
            GunzipError::Corrupt(_) => ApiError::bad_request(format!(
                "bucketmap-sidecar cannot read the request body (Content-Encoding: gzip): {self}"
            )),
        }
    }
}

/// Decodes a whole gzip body (one member, nothing after it), at most `limit`
/// decoded bytes.
pub fn gunzip(compressed: &[u8], limit: usize) -> Result<Bytes, GunzipError> {
    let mut decoder = flate2::bufread::GzDecoder::new(compressed);
    let mut out = Vec::with_capacity(compressed.len().saturating_mul(4).min(limit));
    let read = (&mut decoder)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(GunzipError::Corrupt)?;
    if read > limit {
        return Err(GunzipError::TooLarge { limit });
    }
    if !decoder.into_inner().is_empty() {
        return Err(GunzipError::Corrupt(std::io::Error::other(
            "there is data after the gzip stream",
        )));
    }
    Ok(Bytes::from(out))
}

pin_project_lite::pin_project! {
    /// A gzip-encoded body decoded as it streams (multipart uploads, whose
    /// data part must not be held in memory). A corrupt or truncated stream
    /// ends in an error.
    pub struct Gunzip<B> {
        #[pin]
        inner: B,
        decoder: Option<GzDecoder<Vec<u8>>>,
    }
}

impl<B> Gunzip<B> {
    /// Decodes `inner`, a gzip body.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            decoder: Some(GzDecoder::new(Vec::new())),
        }
    }
}

fn corrupt(e: std::io::Error) -> BoxError {
    Box::new(GunzipError::Corrupt(e))
}

impl<B> Body for Gunzip<B>
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
        let mut this = self.project();
        loop {
            let Some(decoder) = this.decoder.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue; // trailers: none on a decoded body
                    };
                    decoder.write_all(&data).map_err(corrupt)?;
                    let out = std::mem::take(decoder.get_mut());
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    let Some(decoder) = this.decoder.take() else {
                        return Poll::Ready(None);
                    };
                    let out = decoder.finish().map_err(corrupt)?;
                    return Poll::Ready(
                        (!out.is_empty()).then(|| Ok(Frame::data(Bytes::from(out)))),
                    );
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::full;
    use http_body_util::BodyExt;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let _ = encoder.write_all(data);
        encoder.finish().unwrap_or_default()
    }

    #[test]
    fn whole_bodies_are_decoded_strictly() {
        let data = br#"{"bucket":"photos"}"#.repeat(100);
        let packed = gzip(&data);
        assert_eq!(gunzip(&packed, 1 << 20).ok().as_deref(), Some(&data[..]));
        assert!(matches!(
            gunzip(&packed, 100),
            Err(GunzipError::TooLarge { limit: 100 })
        ));
        let truncated = &packed[..packed.len() - 6];
        assert!(matches!(
            gunzip(truncated, 1 << 20),
            Err(GunzipError::Corrupt(_))
        ));
        assert!(matches!(
            gunzip(b"not gzip", 1 << 20),
            Err(GunzipError::Corrupt(_))
        ));
        let mut trailing = packed.clone();
        trailing.extend_from_slice(b"x");
        assert!(matches!(
            gunzip(&trailing, 1 << 20),
            Err(GunzipError::Corrupt(_))
        ));
    }

    #[tokio::test]
    async fn streamed_bodies_are_decoded_and_truncation_is_an_error() {
        let data = b"--b\r\n\r\n{}\r\n--b\r\n\r\nobject data\r\n--b--".repeat(50);
        let packed = gzip(&data);
        let frames =
            futures::stream::iter(packed.chunks(7).map(|c| {
                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::copy_from_slice(c)))
            }));
        let decoded = Gunzip::new(http_body_util::StreamBody::new(frames))
            .collect()
            .await
            .map(|c| c.to_bytes());
        assert_eq!(decoded.ok().as_deref(), Some(&data[..]));
        let truncated = Gunzip::new(full(packed[..packed.len() / 2].to_vec()))
            .collect()
            .await;
        assert!(truncated.is_err(), "a truncated stream is an error");
    }

    #[test]
    fn only_gzip_and_identity_are_read() {
        let mut headers = HeaderMap::new();
        assert_eq!(content_encoding(&headers), Ok(Encoding::Identity));
        headers.insert(CONTENT_ENCODING, "gzip".parse().expect("value"));
        assert_eq!(content_encoding(&headers), Ok(Encoding::Gzip));
        headers.insert(CONTENT_ENCODING, "br".parse().expect("value"));
        assert!(content_encoding(&headers).is_err());
        headers.insert(CONTENT_ENCODING, "gzip, gzip".parse().expect("value"));
        assert!(content_encoding(&headers).is_err());
    }
}
