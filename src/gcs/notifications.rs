//! Pub/Sub notification configurations of a bucket, through the GCS JSON
//! API (`/storage/v1/b/BUCKET/notificationConfigs`): the gRPC API, and with
//! it `StorageControl`, has no notification methods. The calls use the
//! same endpoint, credentials and metrics as the gRPC ones and return the
//! same [`GcsError`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use google_cloud_auth::credentials::{CacheableResource, Credentials};
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

use super::{GcsClient, GcsError, GcsErrorKind, GcsResult};

/// How long one JSON API call may take; the reconcile retries with backoff.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A notification configuration as the JSON API writes and returns it
/// (its field names are snake_case, unlike the rest of that API).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct NotificationResource {
    /// Assigned by GCS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `//pubsub.googleapis.com/projects/PROJECT/topics/TOPIC`.
    pub topic: String,
    /// `JSON_API_V1` or `NONE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_format: Option<String>,
    /// Empty: every event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_types: Vec<String>,
    /// Only objects whose names start with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_name_prefix: Option<String>,
    /// Attributes of every message.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom_attributes: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct NotificationList {
    #[serde(default)]
    items: Vec<NotificationResource>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    message: String,
}

/// The JSON API half of [`GcsClient`].
#[derive(Clone, Debug)]
pub(super) struct JsonApi {
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `https://storage.googleapis.com/storage/v1`, or the endpoint's.
    base: String,
    credentials: Credentials,
}

impl JsonApi {
    /// A client for `endpoint` (the gRPC endpoint's scheme, host and port).
    pub(super) fn new(endpoint: Option<&str>, credentials: Credentials) -> anyhow::Result<Self> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| anyhow::anyhow!("cannot load the system's root certificates: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let http = Client::builder(TokioExecutor::new()).build(connector);
        let endpoint = endpoint.unwrap_or("https://storage.googleapis.com");
        let base = format!("{}/storage/v1", endpoint.trim_end_matches('/'));
        Ok(JsonApi {
            http,
            base,
            credentials,
        })
    }

    /// Sends one call; the body of a 2xx answer, else the GCS error.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, (GcsErrorKind, String)> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        let headers = self
            .credentials
            .headers(http::Extensions::new())
            .await
            .map_err(|e| {
                (
                    GcsErrorKind::PermissionDenied,
                    format!("no credentials: {e}"),
                )
            })?;
        if let CacheableResource::New { data, .. } = headers {
            for (name, value) in &data {
                request = request.header(name, value);
            }
        }
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| {
                (
                    GcsErrorKind::Other,
                    format!("cannot build the request: {e}"),
                )
            })?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((status, body.to_bytes()))
        };
        let (status, body) = tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| (GcsErrorKind::Unavailable, "timed out".to_owned()))?
            .map_err(|e| (GcsErrorKind::Unavailable, e))?;
        if status.is_success() {
            return Ok(body);
        }
        let message = serde_json::from_slice::<ErrorBody>(&body)
            .map(|b| b.error.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
        Err((classify_http(status), format!("HTTP {status}: {message}")))
    }
}

fn classify_http(status: StatusCode) -> GcsErrorKind {
    match status.as_u16() {
        404 => GcsErrorKind::NotFound,
        409 => GcsErrorKind::AlreadyExists,
        401 | 403 => GcsErrorKind::PermissionDenied,
        429 => GcsErrorKind::ResourceExhausted,
        412 => GcsErrorKind::FailedPrecondition,
        400 => GcsErrorKind::InvalidArgument,
        500..=599 | 408 => GcsErrorKind::Unavailable,
        _ => GcsErrorKind::Other,
    }
}

fn notifications_path(bucket: &str) -> String {
    format!("/b/{bucket}/notificationConfigs")
}

impl GcsClient {
    fn record_json<T>(
        &self,
        method: &'static str,
        bucket: &str,
        started: Instant,
        result: Result<T, (GcsErrorKind, String)>,
    ) -> GcsResult<T> {
        let result = result.map_err(|(kind, message)| GcsError {
            kind,
            operation: method,
            bucket: bucket.to_owned(),
            message,
        });
        self.observe(method, started, result)
    }

    /// The bucket's notification configurations.
    pub async fn list_notifications(&self, bucket: &str) -> GcsResult<Vec<NotificationResource>> {
        let started = Instant::now();
        let result = self
            .json
            .call(Method::GET, &notifications_path(bucket), None)
            .await
            .and_then(|body| parse::<NotificationList>(&body).map(|l| l.items));
        self.record_json("ListNotificationConfigs", bucket, started, result)
    }

    /// Creates a notification configuration; GCS answers with its id.
    pub async fn insert_notification(
        &self,
        bucket: &str,
        config: &NotificationResource,
    ) -> GcsResult<NotificationResource> {
        let started = Instant::now();
        let body = serde_json::to_vec(config).map_err(|e| GcsError {
            kind: GcsErrorKind::Other,
            operation: "CreateNotificationConfig",
            bucket: bucket.to_owned(),
            message: e.to_string(),
        })?;
        let result = self
            .json
            .call(Method::POST, &notifications_path(bucket), Some(body))
            .await
            .and_then(|body| parse::<NotificationResource>(&body));
        self.record_json("CreateNotificationConfig", bucket, started, result)
    }

    /// Deletes notification configuration `id`; one already gone is fine.
    pub async fn delete_notification(&self, bucket: &str, id: &str) -> GcsResult<()> {
        let started = Instant::now();
        let path = format!("{}/{id}", notifications_path(bucket));
        let result = match self.json.call(Method::DELETE, &path, None).await {
            Err((GcsErrorKind::NotFound, _)) => Ok(()),
            other => other.map(|_| ()),
        };
        self.record_json("DeleteNotificationConfig", bucket, started, result)
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, (GcsErrorKind, String)> {
    serde_json::from_slice(body).map_err(|e| {
        (
            GcsErrorKind::Other,
            format!("unexpected answer from GCS: {e}"),
        )
    })
}
