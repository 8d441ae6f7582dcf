//! Errors the sidecar answers itself, rendered the way GCS renders them: a JSON
//! error document for the JSON API, an XML `<Error>` for the XML API (and a
//! status for gRPC). The type and its table are the policy's
//! ([`crate::policy::refusal`]); `ApiError` is the name the rewriters and
//! the HTTP shell know it by.

pub use crate::policy::refusal::{ErrorStyle, Refusal as ApiError};

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
