//! An in-memory Kubernetes API server for the reconciler's unit tests: a
//! `kube::Client` over a `tower::service_fn`, as kube-rs's controller-rs
//! example tests its reconciler.
//!
//! Objects are JSON, keyed by (collection, namespace, name); the collection
//! is the URL path of the resource type (`/api/v1/configmaps`,
//! `/apis/storage.bucketmap.dev/v1alpha1/gcs`). It answers GET, LIST (label
//! and field selectors, metadata-only lists), POST, PUT, PATCH (merge, JSON
//! patch, server-side apply: module `ssa`) and DELETE, on objects and on the
//! status subresource, as the API server does where the reconciler relies
//! on it: every write bumps `resourceVersion`; a write that names another
//! `resourceVersion` than the stored one is a 409; a failed JSON patch
//! `test` is a 422; a missing object is a 404; a deleted object with
//! finalizers gets a `deletionTimestamp` (and a new generation) and goes
//! when its last finalizer is removed; writes to an object leave its status
//! alone and writes to its status leave the rest alone. Every request is
//! logged. Watches are not served: the tests fill the caches themselves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::http::{Method, Request, Response, StatusCode};
use kube::Resource;
use kube::client::Body;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::ssa;

/// (collection, namespace, name); the namespace is empty for cluster objects.
type Key = (String, String, String);

/// One request the fake answered (tests print it when a check fails).
#[derive(Clone, Debug)]
pub(crate) struct Logged {
    pub method: Method,
    /// The collection's URL path (see the module's documentation).
    pub collection: String,
    #[allow(dead_code, reason = "read through Debug in assertion messages")]
    pub name: Option<String>,
    /// `status` for the status subresource.
    #[allow(dead_code, reason = "read through Debug in assertion messages")]
    pub subresource: Option<String>,
    /// The answer's status code.
    pub code: u16,
}

impl Logged {
    /// A request that may have changed something.
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }
}

#[derive(Default)]
struct State {
    objects: BTreeMap<Key, Value>,
    revision: u64,
    uids: u64,
    log: Vec<Logged>,
    /// Every version stored, in order.
    history: Vec<(Key, Value)>,
}

/// The fake API server; cheap to clone, clones share the objects.
#[derive(Clone, Default)]
pub(crate) struct FakeApi {
    state: Arc<Mutex<State>>,
}

/// A refusal, rendered as the API server's `Status`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `(field, message)` of each cause (a server-side apply conflict).
    pub causes: Vec<(String, String)>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            causes: Vec::new(),
        }
    }

    fn not_found(key: &Key) -> Self {
        Self::new(404, "NotFound", format!("{} {:?} not found", key.0, key.2))
    }

    fn to_status(&self) -> Value {
        let causes: Vec<Value> = self
            .causes
            .iter()
            .map(|(field, message)| json!({"reason": "FieldManagerConflict", "field": field, "message": message}))
            .collect();
        json!({
            "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
            "details": {"causes": causes},
        })
    }
}

type Answer = Result<(u16, Value), ApiError>;

/// What a request addresses.
struct Target {
    collection: String,
    namespace: String,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn key(&self) -> Result<Key, ApiError> {
        let name = self
            .name
            .clone()
            .ok_or_else(|| ApiError::new(405, "MethodNotAllowed", "no name"))?;
        Ok((self.collection.clone(), self.namespace.clone(), name))
    }
}

/// `/api/v1/...` or `/apis/GROUP/VERSION/...` into what it addresses.
fn target(path: &str) -> Result<Target, ApiError> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let prefix = match parts.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return Err(ApiError::new(404, "NotFound", format!("no route {path}"))),
    };
    let (head, rest) = parts.split_at(prefix.min(parts.len()));
    let namespaced = rest.len() >= 3 && rest[0] == "namespaces" && rest[2] != "status";
    let (namespace, rest) = if namespaced {
        (rest[1].to_owned(), &rest[2..])
    } else {
        (String::new(), rest)
    };
    let plural = rest
        .first()
        .ok_or_else(|| ApiError::new(404, "NotFound", format!("no resource in {path}")))?;
    Ok(Target {
        collection: format!("/{}/{plural}", head.join("/")),
        namespace,
        name: rest.get(1).map(|s| (*s).to_owned()),
        subresource: rest.get(2).map(|s| (*s).to_owned()),
    })
}

/// The query's parameters, decoded.
fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl FakeApi {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A client of this server.
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |req: Request<Body>| {
            let api = api.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect_bytes().await?;
                let (code, answer) = api.answer(&parts, &body);
                let response = Response::builder()
                    .status(StatusCode::from_u16(code)?)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer)?))?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    fn answer(&self, parts: &axum::http::request::Parts, body: &[u8]) -> (u16, Value) {
        let found = target(parts.uri.path());
        let answer = found
            .as_ref()
            .map_err(|e| ApiError::new(e.code, e.reason, &e.message));
        let answer = answer.and_then(|t| self.dispatch(parts, t, body));
        let (code, value) = match answer {
            Ok(ok) => ok,
            Err(e) => (e.code, e.to_status()),
        };
        if let Ok(t) = found {
            self.lock().log.push(Logged {
                method: parts.method.clone(),
                collection: t.collection,
                name: t.name,
                subresource: t.subresource,
                code,
            });
        }
        (code, value)
    }

    fn dispatch(&self, parts: &axum::http::request::Parts, t: &Target, body: &[u8]) -> Answer {
        let params = query(&parts.uri);
        let header = |name: &str| {
            let value = parts.headers.get(name).and_then(|v| v.to_str().ok());
            value.unwrap_or_default().to_owned()
        };
        let metadata_only = header("accept").contains("as=PartialObjectMetadata");
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::new(400, "BadRequest", e.to_string()))?
        };
        let mut state = self.lock();
        match (&parts.method, &t.name) {
            (&Method::GET, None) if params.contains_key("watch") => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "the fake API serves no watches",
            )),
            (&Method::GET, None) => Ok((200, state.list(t, &params, metadata_only))),
            (&Method::GET, Some(_)) => state.get(t, metadata_only).map(|v| (200, v)),
            (&Method::POST, None) => state.create(t, body).map(|v| (201, v)),
            (&Method::PUT, Some(_)) => state.replace(t, body).map(|v| (200, v)),
            (&Method::PATCH, Some(_)) => state
                .patch(t, &header("content-type"), &params, body)
                .map(|v| (200, v)),
            (&Method::DELETE, Some(_)) => state.delete(t, &body).map(|v| (200, v)),
            (method, _) => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{method} {}", t.collection),
            )),
        }
    }

    /// Every request answered so far, in order.
    pub fn log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// Writes answered so far to objects of `K` (whatever their outcome).
    pub fn writes<K: Resource<DynamicType = ()>>(&self) -> Vec<Logged> {
        let collection = K::url_path(&(), None);
        let log = self.log();
        log.into_iter()
            .filter(|l| l.collection == collection && l.is_write())
            .collect()
    }

    /// The stored object `name` of `K` in `ns` (`""` for cluster objects).
    pub fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        ns: &str,
        name: &str,
    ) -> Option<K> {
        let key = (K::url_path(&(), None), ns.to_owned(), name.to_owned());
        let value = self.lock().objects.get(&key).cloned()?;
        Some(serde_json::from_value(value).expect("a stored object deserializes"))
    }

    /// Every stored object of `K`.
    pub fn list<K: Resource<DynamicType = ()> + DeserializeOwned>(&self) -> Vec<K> {
        let collection = K::url_path(&(), None);
        let state = self.lock();
        let objects = state.objects.iter().filter(|(k, _)| k.0 == collection);
        objects
            .map(|(_, v)| serde_json::from_value(v.clone()).expect("a stored object deserializes"))
            .collect()
    }

    /// Every version of object `name` of `K` in `ns` stored so far, oldest
    /// first.
    pub fn versions<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        ns: &str,
        name: &str,
    ) -> Vec<K> {
        let key = (K::url_path(&(), None), ns.to_owned(), name.to_owned());
        let state = self.lock();
        let versions = state.history.iter().filter(|(k, _)| *k == key);
        versions
            .map(|(_, v)| serde_json::from_value(v.clone()).expect("a stored object deserializes"))
            .collect()
    }

    /// Creates `obj` as a POST would (uid, timestamps, resourceVersion).
    pub fn create<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned>(
        &self,
        obj: &K,
    ) -> K {
        let t = Target {
            collection: K::url_path(&(), None),
            namespace: obj.meta().namespace.clone().unwrap_or_default(),
            name: None,
            subresource: None,
        };
        let value = serde_json::to_value(obj).expect("an object serializes");
        let created = self
            .lock()
            .create(&t, value)
            .expect("the fake API creates it");
        serde_json::from_value(created).expect("a stored object deserializes")
    }

    /// Changes the stored object as another client would (a PUT).
    pub fn modify<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        ns: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) {
        let collection = K::url_path(&(), None);
        let mut state = self.lock();
        let key = (collection.clone(), ns.to_owned(), name.to_owned());
        let mut value = state.objects.get(&key).cloned().expect("the object exists");
        change(&mut value);
        let t = Target {
            collection,
            namespace: ns.to_owned(),
            name: Some(name.to_owned()),
            subresource: None,
        };
        state
            .replace(&t, value)
            .expect("the fake API accepts the change");
    }
}

impl State {
    fn next_revision(&mut self) -> String {
        self.revision += 1;
        self.revision.to_string()
    }

    fn list(&self, t: &Target, params: &BTreeMap<String, String>, metadata_only: bool) -> Value {
        let labels = params
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or("");
        let fields = params
            .get("fieldSelector")
            .map(String::as_str)
            .unwrap_or("");
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(k, _)| k.0 == t.collection && (t.namespace.is_empty() || k.1 == t.namespace))
            .map(|(_, v)| v)
            .filter(|v| ssa::labels_match(v, labels) && ssa::fields_match(v, fields))
            .map(|v| {
                if metadata_only {
                    metadata_of(v)
                } else {
                    v.clone()
                }
            })
            .collect();
        let (api_version, kind) = if metadata_only {
            (
                "meta.k8s.io/v1".to_owned(),
                "PartialObjectMetadataList".to_owned(),
            )
        } else {
            let first = items.first();
            let api_version = first.and_then(|v| v["apiVersion"].as_str()).unwrap_or("v1");
            let kind = first.and_then(|v| v["kind"].as_str()).unwrap_or("");
            (api_version.to_owned(), format!("{kind}List"))
        };
        json!({
            "apiVersion": api_version, "kind": kind,
            "metadata": {"resourceVersion": self.revision.to_string()},
            "items": items,
        })
    }

    fn get(&self, t: &Target, metadata_only: bool) -> Result<Value, ApiError> {
        let key = t.key()?;
        let found = self
            .objects
            .get(&key)
            .ok_or_else(|| ApiError::not_found(&key))?;
        Ok(if metadata_only {
            metadata_of(found)
        } else {
            found.clone()
        })
    }

    fn create(&mut self, t: &Target, mut obj: Value) -> Result<Value, ApiError> {
        let meta = &obj["metadata"];
        let name = match (meta["name"].as_str(), meta["generateName"].as_str()) {
            (Some(name), _) => name.to_owned(),
            (None, Some(prefix)) => format!("{prefix}{:05x}", self.uids + 1),
            (None, None) => return Err(ApiError::new(422, "Invalid", "metadata.name is required")),
        };
        let key = (t.collection.clone(), t.namespace.clone(), name.clone());
        if self.objects.contains_key(&key) {
            let message = format!("{} {name:?} already exists", t.collection);
            return Err(ApiError::new(409, "AlreadyExists", message));
        }
        self.uids += 1;
        let revision = self.next_revision();
        let meta = obj["metadata"]
            .as_object_mut()
            .ok_or_else(|| ApiError::new(400, "BadRequest", "no metadata"))?;
        meta.insert("name".into(), json!(name));
        if !t.namespace.is_empty() {
            meta.insert("namespace".into(), json!(t.namespace));
        }
        meta.insert(
            "uid".into(),
            json!(format!("00000000-0000-0000-0000-{:012}", self.uids)),
        );
        meta.insert("creationTimestamp".into(), json!(now()));
        meta.insert("resourceVersion".into(), json!(revision));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        if t.collection == "/api/v1/namespaces" {
            // The API server labels every namespace with its name.
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            labels["kubernetes.io/metadata.name"] = json!(name);
        }
        if let Some(o) = obj.as_object_mut() {
            // Created through the object, never its status subresource.
            o.remove("status");
        }
        ssa::normalize(&mut obj);
        self.history.push((key.clone(), obj.clone()));
        self.objects.insert(key, obj.clone());
        Ok(obj)
    }

    fn replace(&mut self, t: &Target, proposed: Value) -> Result<Value, ApiError> {
        let key = t.key()?;
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&key))?;
        self.store(&key, &old, proposed, t.subresource.as_deref(), None)
    }

    fn patch(
        &mut self,
        t: &Target,
        content_type: &str,
        params: &BTreeMap<String, String>,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let key = t.key()?;
        let old = self.objects.get(&key).cloned();
        let sub = t.subresource.as_deref();
        if content_type.starts_with("application/apply-patch") {
            let manager = params.get("fieldManager").ok_or_else(|| {
                ApiError::new(422, "Invalid", "fieldManager is required for apply patch")
            })?;
            let force = params.get("force").is_some_and(|f| f == "true");
            let (proposed, managed) = ssa::apply(old.as_ref(), &patch, manager, force, sub)?;
            return match old {
                Some(old) => self.store(&key, &old, proposed, sub, Some(managed)),
                None if sub.is_none() => {
                    let mut created = self.create(t, proposed)?;
                    created["metadata"]["managedFields"] = managed;
                    ssa::normalize(&mut created);
                    self.history.push((key.clone(), created.clone()));
                    self.objects.insert(key, created.clone());
                    Ok(created)
                }
                None => Err(ApiError::not_found(&key)),
            };
        }
        let old = old.ok_or_else(|| ApiError::not_found(&key))?;
        let mut proposed = old.clone();
        match content_type {
            "application/json-patch+json" => ssa::json_patch(&mut proposed, &patch)?,
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                json_patch::merge(&mut proposed, &patch);
            }
            other => {
                return Err(ApiError::new(415, "UnsupportedMediaType", other.to_owned()));
            }
        }
        self.store(&key, &old, proposed, sub, None)
    }

    /// Stores `proposed` in place of `old`: the write path of PUT and PATCH.
    fn store(
        &mut self,
        key: &Key,
        old: &Value,
        mut proposed: Value,
        subresource: Option<&str>,
        managed: Option<Value>,
    ) -> Result<Value, ApiError> {
        let sent = proposed["metadata"]["resourceVersion"].clone();
        if !sent.is_null() && sent != old["metadata"]["resourceVersion"] {
            let message = format!(
                "Operation cannot be fulfilled on {} {:?}: the object has been modified; please apply your changes to the latest version and try again",
                key.0, key.2
            );
            return Err(ApiError::new(409, "Conflict", message));
        }
        let mut next = match subresource {
            Some("status") => with_field(old, "status", &proposed),
            Some(other) => {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    format!("no subresource {other}"),
                ));
            }
            None => with_field(&proposed, "status", old),
        };
        for field in [
            "uid",
            "creationTimestamp",
            "name",
            "namespace",
            "generation",
            "deletionTimestamp",
            "managedFields",
        ] {
            set_field(&mut next["metadata"], field, &old["metadata"]);
        }
        if let Some(managed) = managed {
            next["metadata"]["managedFields"] = managed;
        }
        if content(&next) != content(old) {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(0);
            next["metadata"]["generation"] = json!(generation + 1);
        }
        next["metadata"]["resourceVersion"] = json!(self.next_revision());
        ssa::normalize(&mut next);
        proposed = next;
        self.commit(key, proposed)
    }

    /// Keeps `obj`, or removes it when it is being deleted and no
    /// finalizer is left.
    fn commit(&mut self, key: &Key, obj: Value) -> Result<Value, ApiError> {
        let finalizers = obj["metadata"]["finalizers"].as_array().map_or(0, Vec::len);
        if !obj["metadata"]["deletionTimestamp"].is_null() && finalizers == 0 {
            self.objects.remove(key);
        } else {
            self.history.push((key.clone(), obj.clone()));
            self.objects.insert(key.clone(), obj.clone());
        }
        Ok(obj)
    }

    fn delete(&mut self, t: &Target, options: &Value) -> Result<Value, ApiError> {
        let key = t.key()?;
        let mut obj = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&key))?;
        let preconditions = &options["preconditions"];
        for field in ["uid", "resourceVersion"] {
            let expected = &preconditions[field];
            if !expected.is_null() && *expected != obj["metadata"][field] {
                let message = format!(
                    "Precondition failed: {field} in precondition: {expected}, {field} in object meta: {}",
                    obj["metadata"][field]
                );
                return Err(ApiError::new(409, "Conflict", message));
            }
        }
        if obj["metadata"]["deletionTimestamp"].is_null() {
            obj["metadata"]["deletionTimestamp"] = json!(now());
            let generation = obj["metadata"]["generation"].as_i64().unwrap_or(0);
            obj["metadata"]["generation"] = json!(generation + 1);
            obj["metadata"]["resourceVersion"] = json!(self.next_revision());
        }
        self.commit(&key, obj)
    }
}

/// `base` with its field `name` taken from `from` (removed when `from` has none).
fn with_field(base: &Value, name: &str, from: &Value) -> Value {
    let mut out = base.clone();
    set_field(&mut out, name, from);
    out
}

fn set_field(target: &mut Value, name: &str, from: &Value) {
    if let Some(o) = target.as_object_mut() {
        match from.get(name) {
            Some(v) if !v.is_null() => {
                o.insert(name.to_owned(), v.clone());
            }
            _ => {
                o.remove(name);
            }
        }
    }
}

/// What a change of bumps the generation: all but metadata and status.
fn content(obj: &Value) -> Value {
    let mut out = obj.clone();
    if let Some(o) = out.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
    }
    out
}

/// The object as a metadata-only read returns it.
fn metadata_of(obj: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": obj["metadata"]})
}

/// Now, as the API server writes timestamps (whole seconds).
fn now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
