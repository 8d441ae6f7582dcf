//! Answers the rewriter cannot read as a resource: what is done with them
//! (fail closed), for the proxy and for the parts of a batch alike.

use http::StatusCode;

use crate::errors::ApiError;
use crate::rewrite::Translator;
use crate::rewrite::text::replace_bucket_tokens;

/// A JSON or XML answer the rewriter cannot read as a resource (fail
/// closed). A body that is not UTF-8, or a success that is not well-formed
/// (`well_formed`: JSON of another shape than an object, such as an array;
/// `null` never gets here, it is no document), is refused with a 502: what
/// cannot be read cannot be translated, and may carry physical names.
/// Otherwise every token that names a bucket is translated, as in a text
/// error.
pub fn unreadable_answer(
    status: StatusCode,
    bytes: &[u8],
    well_formed: bool,
    tr: &Translator<'_>,
    what: &str,
) -> Result<Vec<u8>, ApiError> {
    match std::str::from_utf8(bytes) {
        Ok(text) if well_formed || status.as_u16() >= 400 => {
            Ok(replace_bucket_tokens(text, |n| tr.bucket_lenient(n))
                .into_owned()
                .into_bytes())
        }
        _ => Err(ApiError::bad_gateway(format!(
            "the upstream answered {status} with a {what} body the sidecar cannot read; not forwarded"
        ))),
    }
}

/// Whether `bytes` is JSON of any shape.
pub fn is_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}
