//! Buckets' Pub/Sub notification configurations: the JSON API's
//! `notifications` resource (`/storage/v1/b/BUCKET/notificationConfigs`),
//! which the gRPC API lacks. Served over HTTP/1.1 on the gRPC port, as GCS
//! serves both APIs on one host.
//!
//! As GCS: a configuration gets an id, an etag, a self link and kind
//! `storage#notification`; the topic must be given as
//! `//pubsub.googleapis.com/projects/P/topics/T`, exist, and be open to the
//! project's Cloud Storage service agent (the mock knows only the topics
//! tests make with [`MockHandle::add_topic`]), else the insert is refused
//! with GCS's 400 `invalid` naming both causes; at most 100 configurations
//! per bucket and 10 per event type; list leaves `items` out when there
//! are none; delete answers 204. Configurations go with their bucket.
//! `payload_format` is required here: the operator always sends it, and
//! the mock does not guess GCS's default. Faults, latency and the call
//! log apply as to every other call (methods `ListNotificationConfigs`,
//! `GetNotificationConfig`, `CreateNotificationConfig`,
//! `DeleteNotificationConfig`).

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use prost_types::Timestamp;
use serde_json::{Value, json};
use tonic::{Code, Status};

use super::state::{State, Target};
use super::{MockHandle, lock};

/// The topic form GCS takes and returns.
const TOPIC_PREFIX: &str = "//pubsub.googleapis.com/projects/";
const EVENT_TYPES: &[&str] = &[
    "OBJECT_FINALIZE",
    "OBJECT_METADATA_UPDATE",
    "OBJECT_DELETE",
    "OBJECT_ARCHIVE",
];
const MAX_PER_BUCKET: usize = 100;
const MAX_PER_EVENT: usize = 10;

/// The configurations of all buckets and the topics that exist.
#[derive(Debug, Default)]
pub(crate) struct Notifications {
    /// By bucket id, with the create time of the bucket they belong to (a
    /// bucket deleted and created again starts with none).
    by_bucket: BTreeMap<String, (Option<Timestamp>, Vec<Value>)>,
    last_id: u64,
    /// Topics (full form) the Cloud Storage service agent may publish to.
    topics: BTreeSet<String>,
}

impl MockHandle {
    /// Makes topic `projects/P/topics/T` exist, open to the Cloud Storage
    /// service agent.
    pub fn add_topic(&self, topic: &str) {
        let full = format!("//pubsub.googleapis.com/{topic}");
        self.lock().notifications.topics.insert(full);
    }

    /// The notification configurations of bucket `id`, as GCS returns them.
    pub fn notifications(&self, id: &str) -> Vec<Value> {
        let mut state = self.lock();
        configs(&mut state, id)
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// Deletes every notification configuration of bucket `id` out of
    /// band (as another tool would).
    pub fn clear_notifications(&self, id: &str) {
        if let Ok(list) = configs(&mut self.lock(), id) {
            list.clear();
        }
    }

    /// Adds a configuration to bucket `id` out of band (as another tool
    /// would): `config` as a client sends it; returns it as stored.
    pub fn insert_notification(&self, id: &str, config: Value) -> Result<Value, Status> {
        insert(&mut self.lock(), id, &config)
    }
}

/// The configurations of bucket `id`, emptied if the bucket was re-created.
fn configs<'a>(state: &'a mut State, id: &str) -> Result<&'a mut Vec<Value>, Status> {
    let created = state.existing_bucket(id)?.create_time;
    let entry = state
        .notifications
        .by_bucket
        .entry(id.to_owned())
        .or_insert_with(|| (created, Vec::new()));
    if entry.0 != created {
        *entry = (created, Vec::new());
    }
    Ok(&mut entry.1)
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

fn insert(state: &mut State, bucket: &str, body: &Value) -> Result<Value, Status> {
    let project = state.bucket_project(bucket).unwrap_or_default();
    let Some(topic) = body.get("topic").and_then(Value::as_str) else {
        return Err(invalid("Required: topic".into()));
    };
    let shape_ok = topic
        .strip_prefix(TOPIC_PREFIX)
        .and_then(|rest| rest.split_once("/topics/"))
        .is_some_and(|(p, t)| !p.is_empty() && !t.is_empty() && !t.contains('/'));
    if !shape_ok {
        return Err(invalid(format!(
            "Invalid Google Cloud Pub/Sub topic '{topic}'. It should look like '//pubsub.googleapis.com/projects/*/topics/*'."
        )));
    }
    match body.get("payload_format").and_then(Value::as_str) {
        Some("JSON_API_V1" | "NONE") => {}
        Some(other) => return Err(invalid(format!("Invalid payload_format: {other}"))),
        None => return Err(invalid("Required: payload_format".into())),
    }
    let events: Vec<&str> = match body.get("event_types") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default(),
    };
    if let Some(bad) = events.iter().find(|e| !EVENT_TYPES.contains(e)) {
        return Err(invalid(format!("Invalid event type: {bad}")));
    }
    if !state.notifications.topics.contains(topic) {
        return Err(invalid(format!(
            "Cloud Pub/Sub topic '{topic}' not found, or user 'service-{project}@gs-project-accounts.iam.gserviceaccount.com' does not have permission to it."
        )));
    }
    check_limits(configs(state, bucket)?, &events)?;
    state.notifications.last_id += 1;
    let id = state.notifications.last_id.to_string();
    let mut stored = json!({
        "kind": "storage#notification",
        "id": id,
        "etag": id,
        "selfLink": format!("https://www.googleapis.com/storage/v1/b/{bucket}/notificationConfigs/{id}"),
        "topic": topic,
        "payload_format": body["payload_format"],
    });
    for field in ["event_types", "object_name_prefix", "custom_attributes"] {
        if let Some(v) = body.get(field).filter(|v| !is_empty(v)) {
            stored[field] = v.clone();
        }
    }
    configs(state, bucket)?.push(stored.clone());
    Ok(stored)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// GCS's limits: configurations per bucket, and per event type (one
/// without event types counts for every type).
fn check_limits(existing: &[Value], events: &[&str]) -> Result<(), Status> {
    if existing.len() >= MAX_PER_BUCKET {
        return Err(invalid(format!(
            "A bucket can have at most {MAX_PER_BUCKET} notification configurations."
        )));
    }
    let covers = |config: &Value, event: &str| match config.get("event_types") {
        Some(Value::Array(list)) => list.iter().any(|e| e == event),
        _ => true,
    };
    for event in EVENT_TYPES {
        let asked = events.is_empty() || events.contains(event);
        let count = existing.iter().filter(|c| covers(c, event)).count();
        if asked && count >= MAX_PER_EVENT {
            return Err(invalid(format!(
                "At most {MAX_PER_EVENT} notification configurations can trigger for {event} on one bucket."
            )));
        }
    }
    Ok(())
}

/// What one request asks, parsed from its method and path.
enum Call {
    List,
    Get(String),
    Insert,
    Delete(String),
}

impl Call {
    fn method(&self) -> &'static str {
        match self {
            Call::List => "ListNotificationConfigs",
            Call::Get(_) => "GetNotificationConfig",
            Call::Insert => "CreateNotificationConfig",
            Call::Delete(_) => "DeleteNotificationConfig",
        }
    }
}

/// `(bucket, call)` for `/storage/v1/b/BUCKET/notificationConfigs[/ID]`.
fn parse(method: &Method, path: &str) -> Option<(String, Call)> {
    let rest = path.strip_prefix("/storage/v1/b/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let call = match (method, parts.as_slice()) {
        (&Method::GET, [_, "notificationConfigs"]) => Call::List,
        (&Method::POST, [_, "notificationConfigs"]) => Call::Insert,
        (&Method::GET, [_, "notificationConfigs", id]) => Call::Get((*id).to_owned()),
        (&Method::DELETE, [_, "notificationConfigs", id]) => Call::Delete((*id).to_owned()),
        _ => return None,
    };
    Some((parts[0].to_owned(), call))
}

fn run(state: &mut State, bucket: &str, call: &Call, body: &[u8]) -> Result<Value, Status> {
    match call {
        Call::List => {
            let items = configs(state, bucket)?.clone();
            let mut list = json!({"kind": "storage#notifications"});
            if !items.is_empty() {
                list["items"] = Value::Array(items);
            }
            Ok(list)
        }
        Call::Get(id) => configs(state, bucket)?
            .iter()
            .find(|c| c["id"] == id.as_str())
            .cloned()
            .ok_or_else(|| Status::not_found("Not Found")),
        Call::Insert => {
            let body: Value =
                serde_json::from_slice(body).map_err(|e| invalid(format!("Parse Error: {e}")))?;
            insert(state, bucket, &body)
        }
        Call::Delete(id) => {
            let list = configs(state, bucket)?;
            let before = list.len();
            list.retain(|c| c["id"] != id.as_str());
            if list.len() == before {
                return Err(Status::not_found("Not Found"));
            }
            Ok(Value::Null)
        }
    }
}

/// The HTTP status GCS's JSON API answers a gRPC code with.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn respond(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let bytes = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let mut response = Response::new(Full::new(bytes));
    *response.status_mut() = status;
    if !body.is_null() {
        let json = http::HeaderValue::from_static("application/json; charset=UTF-8");
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, json);
    }
    response
}

fn error_body(status: &Status) -> (StatusCode, Value) {
    let code = http_status(status.code());
    let reason = match code {
        StatusCode::BAD_REQUEST => "invalid",
        StatusCode::NOT_FOUND => "notFound",
        StatusCode::FORBIDDEN => "forbidden",
        _ => "backendError",
    };
    let body = json!({"error": {
        "code": code.as_u16(),
        "message": status.message(),
        "errors": [{"message": status.message(), "domain": "global", "reason": reason}],
    }});
    (code, body)
}

/// The JSON API calls, as a service for the mock's router.
#[derive(Clone)]
pub(crate) struct JsonApi(pub(crate) Arc<Mutex<State>>);

impl tonic::codegen::Service<http::Request<axum::body::Body>> for JsonApi {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<axum::body::Body>) -> Self::Future {
        Box::pin(serve(self.0.clone(), request))
    }
}

/// Serves one JSON API request against `state`.
async fn serve(
    state: Arc<Mutex<State>>,
    request: http::Request<axum::body::Body>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let Some((bucket, call)) = parse(&parts.method, parts.uri.path()) else {
        let status = Status::not_found(format!("No such JSON API call: {}", parts.uri.path()));
        let (code, body) = error_body(&status);
        return Ok(respond(code, &body));
    };
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let target = Target {
        method: call.method(),
        project: None,
        bucket: Some(bucket.clone()),
    };
    let result = lock(&state).execute(target, |s| run(s, &bucket, &call, &body));
    Ok(match result {
        Ok(Value::Null) => respond(StatusCode::NO_CONTENT, &Value::Null),
        Ok(value) => respond(StatusCode::OK, &value),
        Err(status) => {
            let (code, body) = error_body(&status);
            respond(code, &body)
        }
    })
}
