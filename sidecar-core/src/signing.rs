//! Detection of signed URLs and HMAC-signed requests, which cannot be
//! rewritten: their signature covers the host and the bucket name.

use http::HeaderMap;
use http::header::AUTHORIZATION;

/// Describes the signature a request carries, if any.
pub fn signature_kind(query: Option<&str>, headers: &HeaderMap) -> Option<&'static str> {
    if let Some(query) = query {
        let has = |key: &str| {
            query.split('&').any(|pair| {
                pair.split_once('=')
                    .map_or(pair, |(k, _)| k)
                    .eq_ignore_ascii_case(key)
            })
        };
        if has("X-Goog-Signature") || has("X-Goog-Algorithm") {
            return Some("a V4 signed URL (X-Goog-Signature)");
        }
        if has("X-Amz-Signature") || has("X-Amz-Algorithm") {
            return Some("a signed URL (X-Amz-Signature)");
        }
        if has("Signature") && has("GoogleAccessId") {
            return Some("a V2 signed URL (GoogleAccessId/Signature)");
        }
    }
    let authorization = headers.get(AUTHORIZATION)?.to_str().ok()?.trim_start();
    let scheme = authorization.split_ascii_whitespace().next()?;
    ["GOOG4-HMAC-SHA256", "AWS4-HMAC-SHA256", "GOOG1", "AWS"]
        .iter()
        .any(|s| scheme.eq_ignore_ascii_case(s))
        .then_some(
            "an HMAC-signed request (Authorization: GOOG4-HMAC-SHA256/AWS4-HMAC-SHA256/GOOG1/AWS)",
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn auth(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn detects_signatures() {
        let none = HeaderMap::new();
        assert!(
            signature_kind(
                Some("X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature=ab"),
                &none
            )
            .is_some()
        );
        assert!(signature_kind(Some("x-goog-signature=ab"), &none).is_some());
        assert!(signature_kind(Some("X-Amz-Signature=ab"), &none).is_some());
        assert!(signature_kind(Some("GoogleAccessId=a&Expires=1&Signature=x"), &none).is_some());
        assert!(
            signature_kind(None, &auth("GOOG4-HMAC-SHA256 Credential=x, Signature=y")).is_some()
        );
        assert!(signature_kind(None, &auth("AWS4-HMAC-SHA256 Credential=x")).is_some());
        assert!(signature_kind(None, &auth("GOOG1 key:sig")).is_some());
        assert!(signature_kind(None, &auth("AWS key:sig")).is_some());
    }

    #[test]
    fn ordinary_requests_are_not_signed() {
        assert!(signature_kind(Some("alt=media&Signature=only"), &auth("Bearer ya29.x")).is_none());
        assert!(signature_kind(Some("prefix=X-Goog-Signature"), &HeaderMap::new()).is_none());
        assert!(signature_kind(None, &HeaderMap::new()).is_none());
    }
}
