//! Errors the sidecar answers itself, rendered the way GCS renders them: a JSON
//! error document for the JSON API, an XML `<Error>` for the XML API.

use http::{HeaderValue, Response, StatusCode, header};

/// Which API's error format the client expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorStyle {
    /// A JSON error document (`{"error": {…}}`).
    Json,
    /// An XML `<Error>` document.
    Xml,
}

/// An error answered by the sidecar without (or instead of) the upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status of the answer.
    pub status: StatusCode,
    /// JSON API `errors[].reason`.
    pub reason: &'static str,
    /// XML API `<Code>`.
    pub xml_code: &'static str,
    /// Human-readable; it is the JSON `message` and the XML `<Message>`.
    pub message: String,
}

impl std::fmt::Display for ApiError {
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

impl std::error::Error for ApiError {}

impl ApiError {
    fn new(
        status: StatusCode,
        reason: &'static str,
        xml_code: &'static str,
        message: String,
    ) -> Self {
        Self {
            status,
            reason,
            xml_code,
            message,
        }
    }

    /// A bucket name that no entry of the mapping knows.
    pub fn unknown_bucket(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "notFound",
            "NoSuchBucket",
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
            StatusCode::FORBIDDEN,
            "forbidden",
            "AccessDenied",
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
            StatusCode::BAD_REQUEST,
            "invalid",
            "InvalidArgument",
            format!(
                "bucketmap-sidecar cannot forward {what}: the signature covers the host and the \
                 bucket name, which the sidecar rewrites, so the request would fail upstream. \
                 Send the request with OAuth credentials (or none) through the sidecar, or sign \
                 it for the physical bucket and send it to GCS directly."
            ),
        )
    }

    /// A request the router refuses: it matches no GCS operation the sidecar
    /// knows how to rewrite (deny by default).
    /// (`error` is a [`crate::route::RouteError`].)
    pub fn refused_request(error: &impl std::fmt::Display) -> Self {
        Self::bad_request(format!(
            "bucketmap-sidecar refuses this request: {error}. It forwards only requests that \
             match a known GCS operation exactly, so that every bucket name in them is checked."
        ))
    }

    /// A request the sidecar cannot parse.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            "InvalidArgument",
            message.into(),
        )
    }

    /// A metadata body beyond `--max-metadata-bytes`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payloadTooLarge",
            "EntityTooLarge",
            format!(
                "The metadata body is larger than {limit} bytes, the limit of bucketmap-sidecar \
                 (--max-metadata-bytes)."
            ),
        )
    }

    /// No mapping has been loaded yet.
    pub fn not_ready() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backendNotReady",
            "ServiceUnavailable",
            "bucketmap-sidecar has not loaded a bucket mapping yet; retry shortly.".to_owned(),
        )
    }

    /// Credentials for the upstream could not be obtained.
    pub fn credentials_unavailable(detail: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backendError",
            "ServiceUnavailable",
            format!("bucketmap-sidecar cannot obtain Application Default Credentials: {detail}"),
        )
    }

    /// The upstream could not be reached or answered with something unusable.
    pub fn bad_gateway(detail: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "backendError",
            "InternalError",
            format!("bucketmap-sidecar: upstream error: {detail}"),
        )
    }

    /// The upstream did not answer in time.
    pub fn gateway_timeout() -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "backendError",
            "RequestTimeout",
            "bucketmap-sidecar: the upstream did not answer in time.".to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_error_has_the_gcs_shape() {
        let err = ApiError::unknown_bucket("photos");
        let doc: serde_json::Value = serde_json::from_str(&err.json_body()).unwrap_or_default();
        assert_eq!(doc["error"]["code"], 404);
        assert_eq!(doc["error"]["errors"][0]["reason"], "notFound");
        let message = doc["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("'photos'") && message.contains("no Ready Gcs resource"));
    }

    #[test]
    fn xml_error_escapes_and_names_the_code() {
        let err = ApiError::bad_request("a <b> & c");
        let xml = err.xml_body();
        assert!(xml.contains("<Code>InvalidArgument</Code>"));
        assert!(xml.contains("a &lt;b&gt; &amp; c"));
    }
}
