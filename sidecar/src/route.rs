//! Request routing: which API a request belongs to, where bucket names sit in
//! its raw (still percent-encoded) path, and how its bodies must be handled.
//!
//! Object names are never decoded: only bucket segments are, and the rewrite
//! replaces exactly their byte ranges in the raw path.

use std::borrow::Cow;
use std::ops::Range;

use http::Method;
use percent_encoding::percent_decode_str;

use crate::errors::ErrorStyle;
use crate::names::is_valid_bucket_name;

/// The GCS API a request belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/storage/v1/...`
    Json,
    /// `/upload/storage/v1/...` and `/resumable/upload/storage/v1/...`
    Upload,
    /// `/download/storage/v1/...`
    Download,
    /// `/batch/storage/v1`
    Batch,
    /// Everything else: the XML API, path style or virtual-hosted style.
    Xml,
}

impl Api {
    /// The error format clients of this API understand.
    pub fn error_style(self) -> ErrorStyle {
        match self {
            Api::Xml => ErrorStyle::Xml,
            _ => ErrorStyle::Json,
        }
    }
}

/// The JSON resource a metadata body holds, used when the body has no `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Bucket,
    Buckets,
    Object,
    Objects,
    Acl,
    Acls,
    Policy,
    Notification,
    RewriteResponse,
    ComposeRequest,
    Operation,
    Generic,
}

/// How a request body is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestBody {
    /// Forwarded as a stream, untouched (object data, or bodies without bucket names).
    Stream,
    /// A JSON metadata document, read whole and rewritten.
    Json(Resource),
    /// `multipart/related` upload: the first part is JSON metadata, the rest streams.
    Multipart(Resource),
    /// `multipart/mixed` batch of nested requests.
    Batch,
    /// An XML document naming buckets (`?logging`).
    Xml,
}

/// How a successful response body is handled (error bodies are always rewritten).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// JSON metadata.
    Json(Resource),
    /// XML metadata.
    Xml,
    /// Object data: streamed untouched.
    Media,
    /// `multipart/mixed` batch of nested responses.
    Batch,
}

/// A bucket name in the raw path: its byte range and its decoded value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketSlot {
    pub range: Range<usize>,
    pub name: String,
}

/// The outcome of routing one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub api: Api,
    /// Low-cardinality operation name, for metrics and logs.
    pub operation: &'static str,
    /// Bucket names in the path, left to right.
    pub buckets: Vec<BucketSlot>,
    /// The bucket named by the `Host` header (XML API, virtual-hosted style).
    pub virtual_host: Option<String>,
    pub request_body: RequestBody,
    pub response_body: ResponseBody,
}

impl Route {
    /// Every bucket name the request addresses (path and host).
    pub fn bucket_names(&self) -> impl Iterator<Item = &str> {
        self.virtual_host
            .iter()
            .map(String::as_str)
            .chain(self.buckets.iter().map(|s| s.name.as_str()))
    }
}

/// A request the router cannot make sense of; answered with 400.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("the request path {0:?} is not an absolute path")]
    NotAbsolute(String),
    #[error("the request path has a malformed percent-encoding at byte {0}")]
    BadPercentEncoding(usize),
    #[error("{0:?} is not a valid bucket name")]
    InvalidBucket(String),
    #[error("the request names an empty bucket")]
    EmptyBucket,
}

/// Routes a request. `path` and `query` are raw (as received); `virtual_host`
/// is the bucket named by the `Host` header, when [`virtual_host_bucket`] found one.
pub fn route(
    method: &Method,
    path: &str,
    query: Option<&str>,
    virtual_host: Option<&str>,
) -> Result<Route, RouteError> {
    if !path.starts_with('/') {
        return Err(RouteError::NotAbsolute(path.chars().take(64).collect()));
    }
    check_percent_encoding(path)?;
    if let Some(query) = query {
        check_percent_encoding(query)?;
    }
    let query = Query(query.unwrap_or(""));
    if let Some(bucket) = virtual_host {
        if !is_valid_bucket_name(bucket) {
            return Err(RouteError::InvalidBucket(bucket.to_owned()));
        }
        let object_level = path.len() > 1;
        let mut route = xml_route(method, object_level, &query);
        route.virtual_host = Some(bucket.to_owned());
        return Ok(route);
    }
    let segs = segments(path);
    let names: Vec<&str> = segs.iter().map(|s| s.1).collect();
    match names.as_slice() {
        ["storage", "v1", ..] => json_route(method, &segs[2..], &query),
        ["upload", "storage", "v1", ..] => upload_route(method, &segs[3..], &query),
        ["resumable", "upload", "storage", "v1", ..] => upload_route(method, &segs[4..], &query),
        // Session URLs of other shapes (emulators): no bucket in them.
        ["upload" | "resumable", ..] => upload_route(method, &[], &query),
        ["download", "storage", "v1", ..] => download_route(&segs[3..]),
        ["download", ..] => download_route(&[]),
        ["batch", "storage", "v1"] => Ok(Route {
            api: Api::Batch,
            operation: "batch",
            buckets: Vec::new(),
            virtual_host: None,
            request_body: RequestBody::Batch,
            response_body: ResponseBody::Batch,
        }),
        [""] => Ok(Route {
            api: Api::Xml,
            operation: "xml.service",
            buckets: Vec::new(),
            virtual_host: None,
            request_body: RequestBody::Stream,
            response_body: ResponseBody::Xml,
        }),
        [_, rest @ ..] => {
            let object_level = !(rest.is_empty() || rest == [""]);
            let mut route = xml_route(method, object_level, &query);
            route.buckets.push(bucket_slot(segs[0])?);
            Ok(route)
        }
        [] => Err(RouteError::NotAbsolute(String::new())),
    }
}

/// The bucket named by a virtual-hosted-style `Host` (`photos.storage.googleapis.com`,
/// `photos.localhost:9023`): the first label, when `is_bucket` knows it and the
/// host is a name with more than one label (not an IP address).
pub fn virtual_host_bucket(host: &str, is_bucket: impl Fn(&str) -> bool) -> Option<String> {
    let host = host_without_port(host);
    if host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    let (first, rest) = host.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    let first = first.to_ascii_lowercase();
    is_bucket(&first).then_some(first)
}

fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| h.trim_start_matches('['));
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// Replaces each slot's range in `path` with the matching name from `names`.
pub fn replace_slots(path: &str, slots: &[BucketSlot], names: &[&str]) -> String {
    let mut out = String::with_capacity(path.len() + 32);
    let mut at = 0;
    for (slot, name) in slots.iter().zip(names) {
        out.push_str(&path[at..slot.range.start]);
        out.push_str(name);
        at = slot.range.end;
    }
    out.push_str(&path[at..]);
    out
}

/// The value of the first query parameter `key`, percent-decoded.
pub fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<Cow<'a, str>> {
    Query(query.unwrap_or("")).get(key)
}

struct Query<'a>(&'a str);

impl<'a> Query<'a> {
    fn get(&self, key: &str) -> Option<Cow<'a, str>> {
        self.0.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k == key).then(|| percent_decode_str(v).decode_utf8_lossy())
        })
    }

    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}

fn check_percent_encoding(raw: &str) -> Result<(), RouteError> {
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let ok = bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
            if !ok {
                return Err(RouteError::BadPercentEncoding(i));
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    Ok(())
}

/// Path segments after the leading `/`, each with its byte offset in `path`.
fn segments(path: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::with_capacity(8);
    let mut start = 1;
    for slash in memchr::memchr_iter(b'/', &path.as_bytes()[1..]) {
        let end = slash + 1;
        out.push((start, &path[start..end]));
        start = end + 1;
    }
    out.push((start, &path[start..]));
    out
}

fn bucket_slot((offset, raw): (usize, &str)) -> Result<BucketSlot, RouteError> {
    if raw.is_empty() {
        return Err(RouteError::EmptyBucket);
    }
    let name = if raw.contains('%') {
        percent_decode_str(raw)
            .decode_utf8()
            .map_err(|_| RouteError::InvalidBucket(raw.chars().take(64).collect()))?
    } else {
        Cow::Borrowed(raw)
    };
    if !is_valid_bucket_name(&name) {
        return Err(RouteError::InvalidBucket(name.chars().take(64).collect()));
    }
    Ok(BucketSlot {
        range: offset..offset + raw.len(),
        name: name.into_owned(),
    })
}

fn route_of(
    api: Api,
    operation: &'static str,
    request_body: RequestBody,
    response_body: ResponseBody,
) -> Route {
    Route {
        api,
        operation,
        buckets: Vec::new(),
        virtual_host: None,
        request_body,
        response_body,
    }
}

/// `/storage/v1/` + `segs`.
fn json_route(
    method: &Method,
    segs: &[(usize, &str)],
    query: &Query<'_>,
) -> Result<Route, RouteError> {
    use RequestBody as Req;
    use Resource as R;
    use ResponseBody as Resp;
    let names: Vec<&str> = segs.iter().map(|s| s.1).collect();
    let json = |op, req, resp| Ok(route_of(Api::Json, op, req, Resp::Json(resp)));
    let writes = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    let body = |res| if writes { Req::Json(res) } else { Req::Stream };

    let Some((&"b", after_b)) = names.split_first() else {
        // No bucket in the path (projects/…/hmacKeys, serviceAccount, …).
        return json("json.other", Req::Stream, R::Generic);
    };
    let Some(_) = after_b.first() else {
        return match *method {
            Method::GET => json("buckets.list", Req::Stream, R::Buckets),
            Method::POST => json("buckets.insert", Req::Json(R::Bucket), R::Bucket),
            _ => json("buckets.other", Req::Stream, R::Generic),
        };
    };
    let mut route = json_bucket_route(method, &after_b[1..], query, body)?;
    route.buckets.insert(0, bucket_slot(segs[1])?);
    if let Some(dst) = destination_bucket_index(&names) {
        route.buckets.push(bucket_slot(segs[dst])?);
    }
    Ok(route)
}

/// Index (in the segments after `v1`) of the destination bucket of
/// `copyTo`/`rewriteTo`: `b/B/o/OBJ/copyTo/b/DST/o/OBJ2`. Object names are
/// normally one encoded segment; if a client left `/` unencoded, the first
/// `copyTo|rewriteTo` `b` pair after the source object is taken.
fn destination_bucket_index(names: &[&str]) -> Option<usize> {
    if names.get(2) != Some(&"o") {
        return None;
    }
    (4..names.len())
        .find(|&i| {
            matches!(names[i], "copyTo" | "rewriteTo")
                && names.get(i + 1) == Some(&"b")
                && i + 2 < names.len()
        })
        .map(|i| i + 2)
}

/// Everything after `/storage/v1/b/{bucket}`.
fn json_bucket_route(
    method: &Method,
    rest: &[&str],
    query: &Query<'_>,
    body: impl Fn(Resource) -> RequestBody,
) -> Result<Route, RouteError> {
    use RequestBody as Req;
    use Resource as R;
    use ResponseBody as Resp;
    let get = *method == Method::GET;
    let json = |op, req, resp| Ok(route_of(Api::Json, op, req, Resp::Json(resp)));
    match rest {
        [] => json(bucket_op(method), body(R::Bucket), R::Bucket),
        ["acl" | "defaultObjectAcl"] if get => json("bucketAccessControls", Req::Stream, R::Acls),
        ["acl" | "defaultObjectAcl", ..] => json("bucketAccessControls", body(R::Acl), R::Acl),
        ["iam", "testPermissions"] => json("buckets.testIamPermissions", Req::Stream, R::Generic),
        ["iam"] => json("buckets.iam", body(R::Policy), R::Policy),
        ["lockRetentionPolicy"] => json("buckets.lockRetentionPolicy", Req::Stream, R::Bucket),
        ["restore"] => json("buckets.restore", Req::Stream, R::Bucket),
        ["relocate"] => json("buckets.relocate", body(R::Generic), R::Operation),
        ["operations", ..] => json("buckets.operations", Req::Stream, R::Generic),
        ["notificationConfigs", ..] => {
            json("notifications", body(R::Notification), R::Notification)
        }
        ["o"] if get => json("objects.list", Req::Stream, R::Objects),
        ["o"] => json("objects.insert", body(R::Object), R::Object),
        ["o", "bulkRestore"] if *method == Method::POST => {
            json("objects.bulkRestore", Req::Stream, R::Operation)
        }
        ["o", _, tail @ ..] => Ok(json_object_route(method, tail, query, body)),
        _ => json("buckets.subresource", body(R::Generic), R::Generic),
    }
}

fn bucket_op(method: &Method) -> &'static str {
    match *method {
        Method::GET => "buckets.get",
        Method::PATCH => "buckets.patch",
        Method::PUT => "buckets.update",
        Method::DELETE => "buckets.delete",
        _ => "buckets.other",
    }
}

/// Everything after `/storage/v1/b/{bucket}/o/{object}`.
fn json_object_route(
    method: &Method,
    tail: &[&str],
    query: &Query<'_>,
    body: impl Fn(Resource) -> RequestBody,
) -> Route {
    use RequestBody as Req;
    use Resource as R;
    use ResponseBody as Resp;
    let get = *method == Method::GET;
    let json = |op, req, resp| route_of(Api::Json, op, req, Resp::Json(resp));
    match tail {
        [] if get && query.get("alt").as_deref() == Some("media") => {
            route_of(Api::Json, "objects.download", Req::Stream, Resp::Media)
        }
        [] => {
            let op = match *method {
                Method::GET => "objects.get",
                Method::PATCH => "objects.patch",
                Method::PUT => "objects.update",
                Method::DELETE => "objects.delete",
                _ => "objects.other",
            };
            json(op, body(R::Object), R::Object)
        }
        ["acl"] if get => json("objectAccessControls", Req::Stream, R::Acls),
        ["acl", ..] => json("objectAccessControls", body(R::Acl), R::Acl),
        ["iam", "testPermissions"] => json("objects.testIamPermissions", Req::Stream, R::Generic),
        ["iam"] => json("objects.iam", body(R::Policy), R::Policy),
        ["restore"] => json("objects.restore", Req::Stream, R::Object),
        ["compose"] => json("objects.compose", Req::Json(R::ComposeRequest), R::Object),
        ["moveTo", ..] => json("objects.move", Req::Stream, R::Object),
        _ => {
            // copyTo / rewriteTo (possibly after unencoded object-name segments).
            if let Some(i) = tail
                .iter()
                .position(|s| matches!(*s, "copyTo" | "rewriteTo"))
            {
                if tail[i] == "rewriteTo" {
                    return json("objects.rewrite", Req::Json(R::Object), R::RewriteResponse);
                }
                return json("objects.copy", Req::Json(R::Object), R::Object);
            }
            // An object name with unencoded `/`.
            json("objects.other", body(R::Object), R::Object)
        }
    }
}

/// `/upload/storage/v1/` + `segs` (also under `/resumable`).
fn upload_route(
    method: &Method,
    segs: &[(usize, &str)],
    query: &Query<'_>,
) -> Result<Route, RouteError> {
    use RequestBody as Req;
    use Resource as R;
    use ResponseBody as Resp;
    let names: Vec<&str> = segs.iter().map(|s| s.1).collect();
    let upload = |op, req| route_of(Api::Upload, op, req, Resp::Json(R::Object));
    let mut route = if query.has("upload_id") {
        match *method {
            Method::DELETE => upload("uploads.resumable.cancel", Req::Stream),
            Method::PUT | Method::POST => upload("uploads.resumable.chunk", Req::Stream),
            _ => upload("uploads.resumable.status", Req::Stream),
        }
    } else {
        match query.get("uploadType").as_deref() {
            Some("multipart") => upload("uploads.multipart", Req::Multipart(R::Object)),
            Some("resumable") => upload("uploads.resumable.start", Req::Json(R::Object)),
            _ => upload("uploads.media", Req::Stream),
        }
    };
    match names.as_slice() {
        ["b", _, ..] => route.buckets.push(bucket_slot(segs[1])?),
        _ => route.operation = "uploads.other",
    }
    Ok(route)
}

/// `/download/storage/v1/` + `segs`.
fn download_route(segs: &[(usize, &str)]) -> Result<Route, RouteError> {
    let mut route = route_of(
        Api::Download,
        "objects.download",
        RequestBody::Stream,
        ResponseBody::Media,
    );
    if segs.first().map(|s| s.1) == Some("b") && segs.len() >= 2 {
        route.buckets.push(bucket_slot(segs[1])?);
    } else {
        route.operation = "downloads.other";
    }
    Ok(route)
}

/// The XML API, once the bucket is known (from the path or the host).
fn xml_route(method: &Method, object_level: bool, query: &Query<'_>) -> Route {
    use RequestBody as Req;
    use ResponseBody as Resp;
    let xml = |op, req, resp| route_of(Api::Xml, op, req, resp);
    if !object_level {
        let op = match *method {
            Method::GET | Method::HEAD => "xml.bucket.get",
            Method::PUT => "xml.bucket.put",
            Method::DELETE => "xml.bucket.delete",
            _ => "xml.bucket.other",
        };
        let req = if *method == Method::PUT && query.has("logging") {
            Req::Xml
        } else {
            Req::Stream
        };
        return xml(op, req, Resp::Xml);
    }
    let subresource = [
        "uploadId",
        "uploads",
        "acl",
        "tagging",
        "retention",
        "legalHold",
        "encryption",
    ]
    .iter()
    .any(|k| query.has(k));
    match *method {
        Method::GET | Method::HEAD if subresource => {
            xml("xml.object.subresource", Req::Stream, Resp::Xml)
        }
        Method::GET | Method::HEAD => xml("xml.object.get", Req::Stream, Resp::Media),
        Method::PUT => xml("xml.object.put", Req::Stream, Resp::Xml),
        Method::POST => xml("xml.object.post", Req::Stream, Resp::Xml),
        Method::DELETE => xml("xml.object.delete", Req::Stream, Resp::Xml),
        _ => xml("xml.object.other", Req::Stream, Resp::Xml),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        method: Method,
        target: &'static str,
        host_bucket: Option<&'static str>,
        api: Api,
        operation: &'static str,
        buckets: &'static [&'static str],
        request: RequestBody,
        response: ResponseBody,
    }

    fn case(
        method: Method,
        target: &'static str,
        api: Api,
        operation: &'static str,
        buckets: &'static [&'static str],
        request: RequestBody,
        response: ResponseBody,
    ) -> Case {
        Case {
            method,
            target,
            host_bucket: None,
            api,
            operation,
            buckets,
            request,
            response,
        }
    }

    fn split(target: &str) -> (&str, Option<&str>) {
        match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        }
    }

    #[test]
    fn routes_the_gcs_surface() {
        use Api::*;
        use RequestBody as Req;
        use Resource as R;
        use ResponseBody as Resp;
        let (get, post, put, patch, delete) = (
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        );
        let cases = vec![
            case(
                get.clone(),
                "/storage/v1/b?project=p",
                Json,
                "buckets.list",
                &[],
                Req::Stream,
                Resp::Json(R::Buckets),
            ),
            case(
                post.clone(),
                "/storage/v1/b?project=p",
                Json,
                "buckets.insert",
                &[],
                Req::Json(R::Bucket),
                Resp::Json(R::Bucket),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos",
                Json,
                "buckets.get",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Bucket),
            ),
            case(
                patch.clone(),
                "/storage/v1/b/photos",
                Json,
                "buckets.patch",
                &["photos"],
                Req::Json(R::Bucket),
                Resp::Json(R::Bucket),
            ),
            case(
                delete.clone(),
                "/storage/v1/b/photos",
                Json,
                "buckets.delete",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Bucket),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/iam",
                Json,
                "buckets.iam",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Policy),
            ),
            case(
                put.clone(),
                "/storage/v1/b/photos/iam",
                Json,
                "buckets.iam",
                &["photos"],
                Req::Json(R::Policy),
                Resp::Json(R::Policy),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/acl",
                Json,
                "bucketAccessControls",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Acls),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/defaultObjectAcl",
                Json,
                "bucketAccessControls",
                &["photos"],
                Req::Json(R::Acl),
                Resp::Json(R::Acl),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/o?prefix=a",
                Json,
                "objects.list",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Objects),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/o/a%2Fb.jpg",
                Json,
                "objects.get",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Object),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/o/a%2Fb.jpg?alt=media",
                Json,
                "objects.download",
                &["photos"],
                Req::Stream,
                Resp::Media,
            ),
            case(
                patch.clone(),
                "/storage/v1/b/photos/o/x",
                Json,
                "objects.patch",
                &["photos"],
                Req::Json(R::Object),
                Resp::Json(R::Object),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/o/x/compose",
                Json,
                "objects.compose",
                &["photos"],
                Req::Json(R::ComposeRequest),
                Resp::Json(R::Object),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/o/x/copyTo/b/logs/o/y",
                Json,
                "objects.copy",
                &["photos", "logs"],
                Req::Json(R::Object),
                Resp::Json(R::Object),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/o/x/rewriteTo/b/logs/o/y",
                Json,
                "objects.rewrite",
                &["photos", "logs"],
                Req::Json(R::Object),
                Resp::Json(R::RewriteResponse),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/o/dir/x/copyTo/b/logs/o/y",
                Json,
                "objects.copy",
                &["photos", "logs"],
                Req::Json(R::Object),
                Resp::Json(R::Object),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/o/x/moveTo/o/y",
                Json,
                "objects.move",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Object),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/o/x/acl",
                Json,
                "objectAccessControls",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Acls),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/notificationConfigs",
                Json,
                "notifications",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Notification),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/folders",
                Json,
                "buckets.subresource",
                &["photos"],
                Req::Json(R::Generic),
                Resp::Json(R::Generic),
            ),
            case(
                get.clone(),
                "/storage/v1/projects/p/serviceAccount",
                Json,
                "json.other",
                &[],
                Req::Stream,
                Resp::Json(R::Generic),
            ),
            case(
                post.clone(),
                "/upload/storage/v1/b/photos/o?uploadType=media&name=x",
                Upload,
                "uploads.media",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Object),
            ),
            case(
                post.clone(),
                "/upload/storage/v1/b/photos/o?uploadType=multipart",
                Upload,
                "uploads.multipart",
                &["photos"],
                Req::Multipart(R::Object),
                Resp::Json(R::Object),
            ),
            case(
                post.clone(),
                "/upload/storage/v1/b/photos/o?uploadType=resumable&name=x",
                Upload,
                "uploads.resumable.start",
                &["photos"],
                Req::Json(R::Object),
                Resp::Json(R::Object),
            ),
            case(
                put.clone(),
                "/upload/storage/v1/b/photos/o?uploadType=resumable&upload_id=abc",
                Upload,
                "uploads.resumable.chunk",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Object),
            ),
            case(
                delete.clone(),
                "/upload/storage/v1/b/photos/o?uploadType=resumable&upload_id=abc",
                Upload,
                "uploads.resumable.cancel",
                &["photos"],
                Req::Stream,
                Resp::Json(R::Object),
            ),
            case(
                post.clone(),
                "/resumable/upload/storage/v1/b/photos/o?uploadType=resumable",
                Upload,
                "uploads.resumable.start",
                &["photos"],
                Req::Json(R::Object),
                Resp::Json(R::Object),
            ),
            case(
                put.clone(),
                "/upload/resumable/abc",
                Upload,
                "uploads.other",
                &[],
                Req::Stream,
                Resp::Json(R::Object),
            ),
            case(
                get.clone(),
                "/download/storage/v1/b/photos/o/a%2Fb?alt=media",
                Download,
                "objects.download",
                &["photos"],
                Req::Stream,
                Resp::Media,
            ),
            case(
                post.clone(),
                "/batch/storage/v1",
                Batch,
                "batch",
                &[],
                Req::Batch,
                Resp::Batch,
            ),
            case(
                get.clone(),
                "/",
                Xml,
                "xml.service",
                &[],
                Req::Stream,
                Resp::Xml,
            ),
            case(
                get.clone(),
                "/photos",
                Xml,
                "xml.bucket.get",
                &["photos"],
                Req::Stream,
                Resp::Xml,
            ),
            case(
                get.clone(),
                "/photos/?prefix=a",
                Xml,
                "xml.bucket.get",
                &["photos"],
                Req::Stream,
                Resp::Xml,
            ),
            case(
                put.clone(),
                "/photos?logging",
                Xml,
                "xml.bucket.put",
                &["photos"],
                Req::Xml,
                Resp::Xml,
            ),
            case(
                get.clone(),
                "/photos/a/b.jpg",
                Xml,
                "xml.object.get",
                &["photos"],
                Req::Stream,
                Resp::Media,
            ),
            case(
                Method::HEAD,
                "/photos/a",
                Xml,
                "xml.object.get",
                &["photos"],
                Req::Stream,
                Resp::Media,
            ),
            case(
                put.clone(),
                "/photos/a?partNumber=1&uploadId=u",
                Xml,
                "xml.object.put",
                &["photos"],
                Req::Stream,
                Resp::Xml,
            ),
            case(
                post.clone(),
                "/photos/a?uploads",
                Xml,
                "xml.object.post",
                &["photos"],
                Req::Stream,
                Resp::Xml,
            ),
            case(
                get.clone(),
                "/photos/a?uploadId=u",
                Xml,
                "xml.object.subresource",
                &["photos"],
                Req::Stream,
                Resp::Xml,
            ),
            Case {
                host_bucket: Some("photos"),
                ..case(
                    get.clone(),
                    "/a/b.jpg",
                    Xml,
                    "xml.object.get",
                    &[],
                    Req::Stream,
                    Resp::Media,
                )
            },
            Case {
                host_bucket: Some("photos"),
                ..case(
                    get.clone(),
                    "/?list-type=2",
                    Xml,
                    "xml.bucket.get",
                    &[],
                    Req::Stream,
                    Resp::Xml,
                )
            },
        ];
        for c in cases {
            let (path, query) = split(c.target);
            let route = route(&c.method, path, query, c.host_bucket)
                .unwrap_or_else(|e| panic!("{} {}: {e}", c.method, c.target));
            assert_eq!(route.api, c.api, "{} {}", c.method, c.target);
            assert_eq!(route.operation, c.operation, "{} {}", c.method, c.target);
            let names: Vec<&str> = route.buckets.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(names, c.buckets, "{} {}", c.method, c.target);
            for slot in &route.buckets {
                assert_eq!(&path[slot.range.clone()], slot.name, "{}", c.target);
            }
            assert_eq!(route.virtual_host.as_deref(), c.host_bucket, "{}", c.target);
            assert_eq!(route.request_body, c.request, "{} {}", c.method, c.target);
            assert_eq!(route.response_body, c.response, "{} {}", c.method, c.target);
        }
    }

    #[test]
    fn rejects_malformed_requests() {
        let cases = [
            (
                "/storage/v1/b/photos/o/a%zz",
                RouteError::BadPercentEncoding(24),
            ),
            ("/storage/v1/b//o", RouteError::EmptyBucket),
            (
                "/storage/v1/b/Photos/o",
                RouteError::InvalidBucket("Photos".into()),
            ),
            (
                "/storage/v1/b/ph%C3%B6tos",
                RouteError::InvalidBucket("phötos".into()),
            ),
            (
                "/storage/v1/b/ph%FFtos",
                RouteError::InvalidBucket("ph%FFtos".into()),
            ),
            ("/UPPER/x", RouteError::InvalidBucket("UPPER".into())),
            ("//x", RouteError::EmptyBucket),
            (
                "storage/v1/b",
                RouteError::NotAbsolute("storage/v1/b".into()),
            ),
        ];
        for (path, want) in cases {
            assert_eq!(route(&Method::GET, path, None, None), Err(want), "{path}");
        }
        assert_eq!(
            route(&Method::GET, "/photos", Some("a=%"), None),
            Err(RouteError::BadPercentEncoding(2))
        );
    }

    #[test]
    fn encoded_bucket_segments_are_decoded_and_replaced_whole() {
        let path = "/storage/v1/b/%70hotos/o/photos%2Fphotos";
        let r = route(&Method::GET, path, None, None).expect("routes");
        assert_eq!(r.buckets[0].name, "photos");
        assert_eq!(
            replace_slots(path, &r.buckets, &["photos-k3x9q2mw"]),
            "/storage/v1/b/photos-k3x9q2mw/o/photos%2Fphotos"
        );
    }

    #[test]
    fn virtual_host_detection() {
        let known = |n: &str| n == "photos";
        assert_eq!(
            virtual_host_bucket("photos.storage.googleapis.com", known).as_deref(),
            Some("photos")
        );
        assert_eq!(
            virtual_host_bucket("Photos.localhost:9023", known).as_deref(),
            Some("photos")
        );
        assert_eq!(virtual_host_bucket("photos", known), None);
        assert_eq!(virtual_host_bucket("photos.", known), None);
        assert_eq!(virtual_host_bucket("127.0.0.1:9023", |_| true), None);
        assert_eq!(virtual_host_bucket("[::1]:9023", |_| true), None);
        assert_eq!(virtual_host_bucket("other.localhost", known), None);
    }

    #[test]
    fn query_params_are_decoded() {
        assert_eq!(
            query_param(Some("a=1&name=x%2Fy&b"), "name").as_deref(),
            Some("x/y")
        );
        assert_eq!(query_param(Some("a=1&b"), "b").as_deref(), Some(""));
        assert_eq!(query_param(None, "b"), None);
    }
}
