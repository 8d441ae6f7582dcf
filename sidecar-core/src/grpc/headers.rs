//! The request metadata of a gRPC call on its way upstream: the routing
//! header `x-goog-request-params` translated key by key (keys from the
//! protos' routing annotations, [`super::schema::ROUTING_KEYS`]; any other
//! key is refused), hop-by-hop headers dropped, and no compression offered
//! for responses (so that their messages can be read and rewritten).

use std::borrow::Cow;
use std::ops::Range;
use std::time::Duration;

use super::status::Status;
use http::{HeaderMap, HeaderName, HeaderValue, header};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use super::resource::bucket_range;
use super::schema::ROUTING_KEYS;
use super::table::Kind;
use crate::rewrite::Translator;

/// The routing header of Google's client libraries.
pub const REQUEST_PARAMS: &str = "x-goog-request-params";

/// Keys of the routing header that hold no names and are not in the protos'
/// routing annotations: the Go client's diagnostics flag.
const EXTRA_KEYS: [&str; 1] = ["direct_connectivity_diagnostic"];

/// What the client libraries leave unescaped in routing values (RFC 3986
/// unreserved characters).
const ROUTING_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The percent-decoded value of routing key `key` (`raw`), which names a
/// bucket, and where the bucket name is in it.
fn routing_bucket(key: &str, raw: &str) -> Result<(String, Range<usize>), Status> {
    let invalid = |why: &str| {
        Status::invalid_argument(format!(
            "bucketmap-sidecar cannot read {key}={raw} in {REQUEST_PARAMS}: {why}"
        ))
    };
    let value = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| invalid("it is not UTF-8"))?;
    let range = bucket_range(&value, Kind::BucketName)
        .ok_or_else(|| invalid("it is not projects/_/buckets/NAME"))?;
    Ok((value.into_owned(), range))
}

/// Whether routing key `key` names a bucket; a key the sidecar does not
/// know is refused.
fn names_bucket(key: &str) -> Result<bool, Status> {
    ROUTING_KEYS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, bucket)| *bucket)
        .or_else(|| EXTRA_KEYS.contains(&key).then_some(false))
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "bucketmap-sidecar does not know the routing key {key:?} in {REQUEST_PARAMS}"
            ))
        })
}

/// The `key=value` pairs of a routing header value: each pair as sent,
/// its key and its raw value.
fn pairs(value: &str) -> impl Iterator<Item = (&str, &str, &str)> {
    value.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
        (pair, key, raw)
    })
}

/// Translates the value of routing key `key`, which names a bucket.
fn translate_value(key: &str, raw: &str, t: &Translator<'_>) -> Result<String, Status> {
    let (value, range) = routing_bucket(key, raw)?;
    let translated = match t
        .bucket(&value[range.clone()])
        .map_err(|e| e.grpc_status())?
    {
        Some(name) => Cow::Owned(format!("{}{name}", &value[..range.start])),
        None => Cow::Borrowed(value.as_str()),
    };
    if raw.contains('%') {
        Ok(utf8_percent_encode(&translated, ROUTING_VALUE).to_string())
    } else {
        Ok(translated.into_owned())
    }
}

/// Translates a routing header value: `key=value` pairs joined by `&`.
pub fn translate_request_params(value: &str, t: &Translator<'_>) -> Result<String, Status> {
    let mut out = Vec::new();
    for (pair, key, raw) in pairs(value) {
        if names_bucket(key)? {
            out.push(format!("{key}={}", translate_value(key, raw, t)?));
        } else {
            out.push(pair.to_owned());
        }
    }
    Ok(out.join("&"))
}

/// The bucket names the routing headers of a call name, in order, as
/// sent (untranslated): what the request policy checks before the call
/// goes upstream. A header the sidecar cannot read is refused.
pub fn routing_buckets(headers: &HeaderMap) -> Result<Vec<String>, Status> {
    let mut names = Vec::new();
    for value in headers.get_all(REQUEST_PARAMS) {
        let text = value.to_str().map_err(|_| {
            Status::invalid_argument(format!("{REQUEST_PARAMS} is not visible ASCII"))
        })?;
        for (_, key, raw) in pairs(text) {
            if names_bucket(key)? {
                let (value, range) = routing_bucket(key, raw)?;
                names.push(value[range].to_owned());
            }
        }
    }
    Ok(names)
}

/// The headers sent upstream for a request with `headers`.
pub fn upstream_headers(mut headers: HeaderMap, t: &Translator<'_>) -> Result<HeaderMap, Status> {
    crate::hop_by_hop::strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    // Responses come uncompressed, so that their names can be rewritten.
    headers.remove("grpc-accept-encoding");
    headers.remove(header::ACCEPT_ENCODING);
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    let params = HeaderName::from_static(REQUEST_PARAMS);
    let values: Vec<HeaderValue> = headers.get_all(&params).iter().cloned().collect();
    headers.remove(&params);
    for value in values {
        let text = value.to_str().map_err(|_| {
            Status::invalid_argument(format!("{REQUEST_PARAMS} is not visible ASCII"))
        })?;
        let translated = translate_request_params(text, t)?;
        let value = HeaderValue::try_from(translated)
            .map_err(|e| Status::internal(format!("cannot build {REQUEST_PARAMS}: {e}")))?;
        headers.append(&params, value);
    }
    Ok(headers)
}

/// The call's deadline from `grpc-timeout` (1 to 8 digits and a unit:
/// `H`ours, `M`inutes, `S`econds, `m`illi-, `u` micro-, `n` nanoseconds),
/// which the sidecar enforces itself as well as forwarding it.
pub fn deadline(headers: &HeaderMap) -> Result<Option<Duration>, Status> {
    let Some(value) = headers.get("grpc-timeout") else {
        return Ok(None);
    };
    let invalid = || {
        Status::invalid_argument(format!(
            "grpc-timeout {value:?} is not 1 to 8 digits and a unit (H, M, S, m, u, n)"
        ))
    };
    let text = value.to_str().map_err(|_| invalid())?;
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    let duration = match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(invalid()),
    };
    Ok(Some(duration))
}

/// The status of a call whose deadline passed in the sidecar.
pub fn deadline_exceeded() -> Status {
    Status::deadline_exceeded("the call's deadline (grpc-timeout) passed")
}

/// The response headers sent to the client: hop-by-hop ones dropped.
pub fn client_headers(mut headers: HeaderMap) -> HeaderMap {
    crate::hop_by_hop::strip_hop_by_hop(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    headers
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::grpc::Names;
    use crate::rewrite::Direction;
    use crate::rewrite::testing::mapping;

    fn names(allow_physical: bool) -> Names {
        Names {
            mapping: Arc::new(mapping()),
            allow_physical,
            access: crate::policy::Access::WRITE,
        }
    }

    fn request(value: &str, allow_physical: bool) -> Result<String, Status> {
        let names = names(allow_physical);
        translate_request_params(value, &names.translator(Direction::ToPhysical))
    }

    #[test]
    fn routing_values_are_translated_in_the_encoding_they_came_in() {
        let go = request(
            "bucket=projects/_/buckets/photos&direct_connectivity_diagnostic=no_auth",
            false,
        );
        assert_eq!(
            go.ok().as_deref(),
            Some(
                "bucket=projects/_/buckets/photos-k3x9q2mw&direct_connectivity_diagnostic=no_auth"
            )
        );
        let rust = request("bucket=projects%2F_%2Fbuckets%2Fphotos", false);
        assert_eq!(
            rust.ok().as_deref(),
            Some("bucket=projects%2F_%2Fbuckets%2Fphotos-k3x9q2mw")
        );
        let both = request(
            "source_bucket=projects/_/buckets/photos&bucket=projects/_/buckets/photos&project=projects/p",
            false,
        );
        assert_eq!(
            both.ok().as_deref(),
            Some(
                "source_bucket=projects/_/buckets/photos-k3x9q2mw&bucket=projects/_/buckets/photos-k3x9q2mw&project=projects/p"
            )
        );
    }

    #[test]
    fn unknown_keys_unmapped_and_physical_names_are_refused() {
        let code = |v: &str| request(v, false).map_err(|e| e.code()).err();
        assert_eq!(
            code("bucket=projects/_/buckets/nope"),
            Some(crate::grpc::status::Code::NotFound)
        );
        assert_eq!(
            code("bucket=projects/_/buckets/photos-k3x9q2mw"),
            Some(crate::grpc::status::Code::PermissionDenied)
        );
        assert_eq!(
            code("name=photos"),
            Some(crate::grpc::status::Code::InvalidArgument)
        );
        assert_eq!(
            code("bucket=photos"),
            Some(crate::grpc::status::Code::InvalidArgument)
        );
        assert_eq!(
            code("bucket=projects/_/buckets/a/b"),
            Some(crate::grpc::status::Code::InvalidArgument)
        );
        assert!(request("bucket=projects/_/buckets/photos-k3x9q2mw", true).is_ok());
    }

    #[test]
    fn deadlines_are_read_in_every_unit_and_bad_ones_refused() {
        let at = |v: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert("grpc-timeout", HeaderValue::from_static(v));
            deadline(&headers).map_err(|e| e.code())
        };
        assert_eq!(at("2H"), Ok(Some(Duration::from_secs(7200))));
        assert_eq!(at("3M"), Ok(Some(Duration::from_secs(180))));
        assert_eq!(at("30S"), Ok(Some(Duration::from_secs(30))));
        assert_eq!(at("99999999m"), Ok(Some(Duration::from_millis(99_999_999))));
        assert_eq!(at("5u"), Ok(Some(Duration::from_micros(5))));
        assert_eq!(at("7n"), Ok(Some(Duration::from_nanos(7))));
        for bad in ["", "S", "123456789S", "10s", "-1S", "1.5S", "10"] {
            assert_eq!(
                at(bad),
                Err(crate::grpc::status::Code::InvalidArgument),
                "{bad:?}"
            );
        }
        assert_eq!(deadline(&HeaderMap::new()).ok(), Some(None));
    }

    #[test]
    fn response_compression_is_not_offered_and_te_is_kept() {
        let names = names(false);
        let t = names.translator(Direction::ToPhysical);
        let mut headers = HeaderMap::new();
        headers.insert("grpc-accept-encoding", HeaderValue::from_static("gzip"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(
            REQUEST_PARAMS,
            HeaderValue::from_static("bucket=projects/_/buckets/photos"),
        );
        let out = upstream_headers(headers, &t).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.get("grpc-accept-encoding").is_none());
        assert_eq!(
            out.get(header::TE).map(|v| v.as_bytes()),
            Some(&b"trailers"[..])
        );
        assert_eq!(
            out.get(REQUEST_PARAMS).map(|v| v.as_bytes()),
            Some(&b"bucket=projects/_/buckets/photos-k3x9q2mw"[..])
        );
    }
}
