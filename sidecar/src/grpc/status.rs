//! gRPC statuses on the wire: the sidecar's own refusals as trailers-only
//! responses, and upstream statuses with physical names turned back into
//! logical ones. The codes, the refusals' rule and the code names are the
//! core's ([`bucketmap_sidecar_core::grpc::status`]).

use http::{HeaderMap, HeaderValue, Response, header};
use tonic::{Code, Status};

use bucketmap_sidecar_core::grpc::status as rules;
use bucketmap_sidecar_core::grpc::wire::rewrite_status_details;
use bucketmap_sidecar_core::mapping::Mapping;
use bucketmap_sidecar_core::rewrite::text::replace_bucket_tokens;

use crate::body::{ProxyBody, empty};

/// The core's status as tonic's, which encodes trailers (with the
/// `google.rpc.Status` details of a refusal).
pub fn from_core(status: rules::Status) -> Status {
    let code = from_core_code(status.code());
    match status.details() {
        Some(details) => Status::with_details(code, status.message().to_owned(), details.into()),
        None => Status::new(code, status.message().to_owned()),
    }
}

/// The core's code as tonic's (the same number).
fn from_core_code(code: rules::Code) -> Code {
    Code::from_i32(code as i32)
}

/// The canonical name of `code` (`NOT_FOUND`), as gRPC tools print it.
pub fn code_name(code: Code) -> &'static str {
    rules::code_name(rules::Code::from_i32(code.into()))
}

/// `status` as trailers (`grpc-status`, `grpc-message`, details).
pub fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        // Only an unencodable details blob gets here: keep code and message.
        let plain = Status::new(status.code(), status.message().to_owned());
        let _ = plain.add_header(&mut map);
    }
    map
}

/// A trailers-only response carrying `status`.
pub fn response(status: &Status) -> Response<ProxyBody> {
    let mut response = Response::new(empty());
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.extend(trailers(status));
    response
}

/// The code a status-carrying header map announces, if it has one.
pub fn code_in(headers: &HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?;
    let text = value.to_str().ok()?;
    Some(Code::from_i32(text.trim().parse().ok()?))
}

/// Turns the physical names in the status carried by `headers` (trailers,
/// or the headers of a trailers-only response) into logical names: the
/// message as whole bucket-name tokens, the details through
/// [`rewrite_status_details`]. Other headers are kept.
pub fn rewrite_status_headers(headers: &mut HeaderMap, mapping: &Mapping) {
    let Some(status) = Status::from_header_map(headers) else {
        return;
    };
    let message = replace_bucket_tokens(status.message(), |name| {
        mapping.logical(name).map(str::to_owned)
    });
    let details = rewrite_status_details(status.details(), mapping);
    if matches!(message, std::borrow::Cow::Borrowed(_)) && details.is_none() {
        return;
    }
    let details = details.unwrap_or_else(|| bytes::Bytes::copy_from_slice(status.details()));
    let rewritten = Status::with_details(status.code(), message.into_owned(), details);
    for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
        headers.remove(name);
    }
    headers.extend(trailers(&rewritten));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping() -> Mapping {
        Mapping::new([("photos".to_owned(), "photos-k3x9q2mw".to_owned())]).unwrap_or_default()
    }

    #[test]
    fn upstream_messages_name_logical_buckets() {
        let upstream = Status::not_found("No such object: photos-k3x9q2mw/a b.txt");
        let mut headers = trailers(&upstream);
        headers.insert("x-other", HeaderValue::from_static("kept"));
        rewrite_status_headers(&mut headers, &mapping());
        let status = Status::from_header_map(&headers).expect("a status");
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "No such object: photos/a b.txt");
        assert_eq!(
            headers.get("x-other").map(|v| v.as_bytes()),
            Some(&b"kept"[..])
        );
        assert_eq!(code_in(&headers), Some(Code::NotFound));
    }

    #[test]
    fn refusals_are_trailers_only() {
        let r = response(&Status::unimplemented("no such method"));
        assert_eq!(code_in(r.headers()), Some(Code::Unimplemented));
        assert_eq!(
            r.headers().get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
            Some(&b"application/grpc"[..])
        );
    }
}
