//! The one error type of the sidecar's own answers, [`Refusal`], and the
//! one table ([`TABLE`]) that gives each kind of refusal its GCS reason,
//! XML code, HTTP status and gRPC code. The HTTP front end renders a
//! refusal as a JSON or XML error document ([`Refusal::into_response`]),
//! the gRPC front end as a status ([`Refusal::grpc_status`]); neither
//! translates one protocol's status into the other's by hand.

use http::{HeaderValue, Response, StatusCode, header};

use crate::grpc::status::{BAD_REQUEST, Code, Status, TOO_LARGE};

/// Which API's error format the client expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorStyle {
    /// A JSON error document (`{"error": {…}}`).
    Json,
    /// An XML `<Error>` document.
    Xml,
}

/// What kind of refusal an error is: its row of [`TABLE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A bucket name that no entry of the map knows.
    UnknownBucket,
    /// A physical bucket name used while physical names are refused.
    PhysicalName,
    /// A signed URL or HMAC signature, which a rewrite would break.
    SignedRequest,
    /// A request that names no operation the sidecar knows (deny by default).
    UnsupportedOperation,
    /// A request the sidecar cannot read.
    BadRequest,
    /// A body or message beyond the sidecar's limit.
    TooLarge,
    /// No map has been loaded yet.
    NotReady,
    /// Credentials for the upstream could not be obtained.
    CredentialsUnavailable,
    /// The upstream could not be reached or answered unusably.
    BadGateway,
    /// The upstream did not answer in time.
    GatewayTimeout,
    /// A write while the map has not been confirmed for longer than the
    /// bound, or any request naming an entry a move has fenced while it has
    /// not.
    StaleMap,
    /// A write held while a move switches its bucket, answered when the
    /// hold limit passed, or a write in flight cut off by the switch.
    Moving,
}

/// One row of [`TABLE`]: how a kind of refusal is said in each protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The kind.
    pub kind: Kind,
    /// The gRPC status's `google.rpc.ErrorInfo.reason`.
    pub error_info: &'static str,
    /// The HTTP status (JSON and XML APIs).
    pub http: StatusCode,
    /// JSON API `errors[].reason`.
    pub reason: &'static str,
    /// XML API `<Code>`.
    pub xml_code: &'static str,
    /// The gRPC status code.
    pub grpc: Code,
}

const fn row(
    kind: Kind,
    error_info: &'static str,
    http: StatusCode,
    reason: &'static str,
    xml_code: &'static str,
    grpc: Code,
) -> Row {
    Row {
        kind,
        error_info,
        http,
        reason,
        xml_code,
        grpc,
    }
}

/// Every kind of refusal, once, in the order of [`Kind`].
#[rustfmt::skip]
pub const TABLE: [Row; 12] = {
    use Kind::*;
    [
        row(UnknownBucket, "UNKNOWN_BUCKET", StatusCode::NOT_FOUND, "notFound", "NoSuchBucket", Code::NotFound),
        row(PhysicalName, "PHYSICAL_NAME", StatusCode::FORBIDDEN, "forbidden", "AccessDenied", Code::PermissionDenied),
        row(SignedRequest, "SIGNED_REQUEST", StatusCode::BAD_REQUEST, "invalid", "InvalidArgument", Code::InvalidArgument),
        row(UnsupportedOperation, "UNSUPPORTED_OPERATION", StatusCode::BAD_REQUEST, "invalid", "InvalidArgument", Code::Unimplemented),
        row(BadRequest, BAD_REQUEST, StatusCode::BAD_REQUEST, "invalid", "InvalidArgument", Code::InvalidArgument),
        row(TooLarge, TOO_LARGE, StatusCode::PAYLOAD_TOO_LARGE, "payloadTooLarge", "EntityTooLarge", Code::ResourceExhausted),
        row(NotReady, "NOT_READY", StatusCode::SERVICE_UNAVAILABLE, "backendNotReady", "ServiceUnavailable", Code::Unavailable),
        row(CredentialsUnavailable, "CREDENTIALS_UNAVAILABLE", StatusCode::SERVICE_UNAVAILABLE, "backendError", "ServiceUnavailable", Code::Unavailable),
        row(BadGateway, "BAD_GATEWAY", StatusCode::BAD_GATEWAY, "backendError", "InternalError", Code::Unavailable),
        row(GatewayTimeout, "GATEWAY_TIMEOUT", StatusCode::GATEWAY_TIMEOUT, "backendError", "RequestTimeout", Code::DeadlineExceeded),
        row(StaleMap, "STALE_MAP", StatusCode::SERVICE_UNAVAILABLE, "backendNotReady", "ServiceUnavailable", Code::Unavailable),
        row(Moving, "BUCKET_MOVING", StatusCode::SERVICE_UNAVAILABLE, "backendNotReady", "ServiceUnavailable", Code::Unavailable),
    ]
};

impl Kind {
    /// This kind's row of [`TABLE`].
    pub fn row(self) -> &'static Row {
        &TABLE[self as usize]
    }
}

/// An error answered by the sidecar without (or instead of) the upstream,
/// in either protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The kind: its row of [`TABLE`].
    pub kind: Kind,
    /// The HTTP status of the answer (from [`TABLE`]).
    pub status: StatusCode,
    /// JSON API `errors[].reason` (from [`TABLE`]).
    pub reason: &'static str,
    /// XML API `<Code>` (from [`TABLE`]).
    pub xml_code: &'static str,
    /// Human-readable; it is the JSON `message`, the XML `<Message>` and
    /// the gRPC status message.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.reason,
            self.message
        )
    }
}

impl std::error::Error for Refusal {}

impl Refusal {
    /// A refusal of `kind` saying `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        let row = kind.row();
        Self {
            kind,
            status: row.http,
            reason: row.reason,
            xml_code: row.xml_code,
            message: message.into(),
        }
    }

    /// The gRPC code of this refusal (from [`TABLE`]).
    pub fn grpc_code(&self) -> Code {
        self.kind.row().grpc
    }

    /// The gRPC status the gRPC front end answers with: the code of
    /// [`TABLE`], the same message, and the kind's reason as a
    /// `google.rpc.ErrorInfo` in its details.
    pub fn grpc_status(&self) -> Status {
        let row = self.kind.row();
        Status::new(row.grpc, self.message.clone()).with_reason(row.error_info)
    }

    /// A bucket name that no entry of the mapping knows.
    pub fn unknown_bucket(name: &str) -> Self {
        Self::new(
            Kind::UnknownBucket,
            format!(
                "The bucket '{name}' is not known to bucketmap-sidecar: no Ready Gcs resource in \
                 this namespace maps the logical bucket name '{name}' (declare one with \
                 spec.bucketName: {name} and wait for it to be Ready)."
            ),
        )
    }

    /// A physical bucket name used directly while that is not allowed.
    pub fn physical_name_refused(physical: &str, logical: &str) -> Self {
        Self::new(
            Kind::PhysicalName,
            format!(
                "'{physical}' is the physical name of the logical bucket '{logical}': use \
                 '{logical}' through bucketmap-sidecar (physical names are refused unless the \
                 sidecar runs with --allow-physical-names)."
            ),
        )
    }

    /// A signed URL or an HMAC-signed request, whose signature a rewrite would break.
    pub fn signed_request(what: &str) -> Self {
        Self::new(
            Kind::SignedRequest,
            format!(
                "bucketmap-sidecar cannot forward {what}: the signature covers the host and the \
                 bucket name, which the sidecar rewrites, so the request would fail upstream. \
                 Send the request with OAuth credentials (or none) through the sidecar, or sign \
                 it for the physical bucket and send it to GCS directly."
            ),
        )
    }

    /// An HTTP request the router refuses: it matches no GCS operation the
    /// sidecar knows how to rewrite (deny by default).
    /// (`error` is a [`crate::route::RouteError`].)
    pub fn refused_request(error: &impl std::fmt::Display) -> Self {
        Self::new(
            Kind::UnsupportedOperation,
            format!(
                "bucketmap-sidecar refuses this request: {error}. It forwards only requests that \
                 match a known GCS operation exactly, so that every bucket name in them is checked."
            ),
        )
    }

    /// A gRPC call of a method the sidecar does not know (deny by default).
    pub fn unknown_grpc_method(path: &str) -> Self {
        Self::new(
            Kind::UnsupportedOperation,
            format!(
                "bucketmap-sidecar does not know the gRPC method {path}: it forwards only the \
                 methods of google.storage.v2.Storage and google.storage.control.v2.StorageControl \
                 whose bucket names it can rewrite"
            ),
        )
    }

    /// A gRPC call that did not come over HTTP/2 (`version` as `http`
    /// prints it).
    pub fn grpc_not_http2(path: &str, version: &impl std::fmt::Debug) -> Self {
        Self::bad_request(format!("gRPC needs HTTP/2; {path} came over {version:?}"))
    }

    /// A request the sidecar cannot parse.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Kind::BadRequest, message)
    }

    /// A metadata body beyond `--max-metadata-bytes`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            Kind::TooLarge,
            format!(
                "The metadata body is larger than {limit} bytes, the limit of bucketmap-sidecar \
                 (--max-metadata-bytes)."
            ),
        )
    }

    /// A gRPC message beyond `--grpc-max-message-bytes`.
    pub fn grpc_message_too_large(len: usize, limit: usize) -> Self {
        Self::new(
            Kind::TooLarge,
            format!(
                "a gRPC message of {len} bytes is larger than the sidecar's limit of {limit} \
                 bytes (--grpc-max-message-bytes)"
            ),
        )
    }

    /// A write while the map is older than the bound: the operator may have
    /// moved the bucket since, and relies on no sidecar writing past it.
    /// `age` counts from the last confirmation, or from the sidecar's start
    /// when there was none (`confirmed_once` false).
    pub fn stale_map(
        age: std::time::Duration,
        bound: std::time::Duration,
        confirmed_once: bool,
    ) -> Self {
        let since = since(age, confirmed_once);
        Self::new(
            Kind::StaleMap,
            format!(
                "bucketmap-sidecar refuses writes: its bucket map {since} with the Kubernetes API \
                 server, longer than the bound of {}s (--max-map-age), so the bucket may have \
                 moved. Reads are still served; writes resume as soon as the map is confirmed \
                 again. Retry later.",
                bound.as_secs()
            ),
        )
    }

    /// A request naming `bucket`, an entry a move has fenced, while the map
    /// is older than the bound: the sidecar knows a move is under way, so
    /// its entry may name a bucket that has since fallen behind, for reads
    /// as for writes.
    pub fn fenced_stale(
        bucket: &str,
        age: std::time::Duration,
        bound: std::time::Duration,
        confirmed_once: bool,
    ) -> Self {
        let since = since(age, confirmed_once);
        Self::new(
            Kind::StaleMap,
            format!(
                "bucketmap-sidecar refuses reads and writes of '{bucket}': a move of the bucket \
                 is under way, and the sidecar's bucket map {since} with the Kubernetes API \
                 server, longer than the bound of {}s (--max-map-age), so it may name a bucket \
                 that has fallen behind. Requests resume as soon as the map is confirmed again. \
                 Retry later.",
                bound.as_secs()
            ),
        )
    }

    /// A write naming `bucket` while a move switches it to another bucket:
    /// held, and answered so when the hold limit passed, or found where the
    /// sidecar cannot hold it (a name in a streamed body or a later gRPC
    /// message).
    pub fn moving(bucket: &str) -> Self {
        Self::new(
            Kind::Moving,
            format!(
                "bucketmap-sidecar holds writes to '{bucket}': a move of the bucket to another \
                 one is under way, and writes resume, to the new bucket, when it is over (in a \
                 few minutes). Retry later."
            ),
        )
    }

    /// A write whose body was still arriving when its bucket's entry was
    /// fenced or moved, or the map went stale: cut off so that the bucket
    /// it went to does not change any more.
    pub fn cut_off() -> Self {
        Self::new(
            Kind::Moving,
            "bucketmap-sidecar cut off this write before its body was complete: its bucket is \
             being moved to another one (or the sidecar's bucket map went stale), and nothing \
             may change in the old bucket any more. Nothing was written. Retry later.",
        )
    }

    /// No mapping has been loaded yet.
    pub fn not_ready() -> Self {
        Self::new(
            Kind::NotReady,
            "bucketmap-sidecar has not loaded a bucket mapping yet; retry shortly.",
        )
    }

    /// Credentials for the upstream could not be obtained.
    pub fn credentials_unavailable(detail: &str) -> Self {
        Self::new(
            Kind::CredentialsUnavailable,
            format!("bucketmap-sidecar cannot obtain Application Default Credentials: {detail}"),
        )
    }

    /// The upstream could not be reached or answered with something unusable.
    pub fn bad_gateway(detail: impl std::fmt::Display) -> Self {
        Self::new(
            Kind::BadGateway,
            format!("bucketmap-sidecar: upstream error: {detail}"),
        )
    }

    /// The upstream did not answer in time.
    pub fn gateway_timeout() -> Self {
        Self::new(
            Kind::GatewayTimeout,
            "bucketmap-sidecar: the upstream did not answer in time.",
        )
    }

    /// The JSON API error document.
    pub fn json_body(&self) -> String {
        let error = serde_json::json!({
            "error": {
                "code": self.status.as_u16(),
                "message": self.message,
                "errors": [{
                    "message": self.message,
                    "domain": "global",
                    "reason": self.reason,
                }],
            }
        });
        error.to_string()
    }

    /// The XML API error document.
    pub fn xml_body(&self) -> String {
        let message = quick_xml::escape::escape(self.message.as_str());
        format!(
            "<?xml version='1.0' encoding='UTF-8'?><Error><Code>{}</Code><Message>{}</Message>\
             <Details>{}</Details></Error>",
            self.xml_code, message, message
        )
    }

    /// The response for `style` (the shell boxes its body).
    pub fn into_response(self, style: ErrorStyle) -> Response<String> {
        let (content_type, body) = match style {
            ErrorStyle::Json => ("application/json; charset=UTF-8", self.json_body()),
            ErrorStyle::Xml => ("application/xml; charset=UTF-8", self.xml_body()),
        };
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
            .headers_mut()
            .insert("x-bucketmap-sidecar", HeaderValue::from_static("rejected"));
        response
    }
}

/// How long a map went unconfirmed, as the stale refusals say it.
fn since(age: std::time::Duration, confirmed_once: bool) -> String {
    if confirmed_once {
        format!("was last confirmed {}s ago", age.as_secs())
    } else {
        format!(
            "has not been confirmed since the sidecar started {}s ago",
            age.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_kind_in_order() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(row.kind as usize, i, "{row:?}");
            assert_eq!(row.kind.row(), row);
        }
        assert_eq!(TABLE.len(), 12);
        assert_eq!(TABLE.last().map(|r| r.kind), Some(Kind::Moving));
    }

    #[test]
    fn errors_of_the_http_path_keep_their_message() {
        let status = Refusal::unknown_bucket("nope").grpc_status();
        assert_eq!(status.code(), Code::NotFound);
        assert!(status.message().contains("'nope'"), "{status}");
        assert_eq!(
            Refusal::too_large(1).grpc_status().code(),
            Code::ResourceExhausted
        );
        assert_eq!(
            Refusal::bad_request("x").grpc_status().code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn an_unknown_operation_is_400_over_http_and_unimplemented_over_grpc() {
        for refusal in [
            Refusal::refused_request(&"no such path"),
            Refusal::unknown_grpc_method("/x.Y/Z"),
        ] {
            assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
            assert_eq!(refusal.reason, "invalid");
            assert_eq!(refusal.grpc_code(), Code::Unimplemented);
        }
    }
}
