//! Request routing: which GCS operation a request is, where bucket names sit
//! in its raw (still percent-encoded) path, and how its bodies are handled.
//!
//! Deny by default: a request is routed only when it matches a known
//! operation exactly — the JSON API from Google's discovery document
//! ([`crate::discovery`]), uploads, downloads, batches and the XML API from
//! the tables below — after strict segment parsing. Anything else is a
//! [`RouteError`], answered with a 400 that names what was refused.
//!
//! Object names are never decoded: only bucket segments are checked, and the
//! rewrite replaces exactly their byte ranges in the raw path.

use std::borrow::Cow;
use std::ops::Range;

use http::Method;
use percent_encoding::percent_decode_str;
use smallvec::SmallVec;

use crate::discovery::{self, Class, Segment};
use crate::errors::ErrorStyle;
use crate::names::is_valid_bucket_name;
pub use crate::resource::Resource;

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

/// How a request body is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestBody {
    /// The operation takes no body: a non-empty one is refused.
    None,
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

/// A bucket name in the raw path: its byte range and its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketSlot {
    /// Byte range of the segment in the raw path.
    pub range: Range<usize>,
    /// The bucket name (bucket segments are never percent-encoded).
    pub name: String,
}

/// The outcome of routing one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The API family, which also decides the error format.
    pub api: Api,
    /// Low-cardinality operation name, for metrics and logs.
    pub operation: &'static str,
    /// Bucket names in the path, left to right.
    pub buckets: Vec<BucketSlot>,
    /// The bucket named by the `Host` header (XML API, virtual-hosted style).
    pub virtual_host: Option<String>,
    /// How the request body is handled.
    pub request_body: RequestBody,
    /// The `kind` a JSON request body must have, when it has one.
    pub request_kind: Option<&'static str>,
    /// How a successful response body is handled.
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

/// A request the router refuses; answered with 400.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The path does not start with `/` (its first 64 characters).
    #[error("the request path {0:?} is not an absolute path")]
    NotAbsolute(String),
    /// A `%` not followed by two hex digits, at this byte offset.
    #[error("the request target has a malformed percent-encoding at byte {0}")]
    BadPercentEncoding(usize),
    /// A bucket segment (or virtual host) that is not a valid bucket name.
    #[error("{0:?} is not a valid bucket name (bucket segments are never percent-encoded)")]
    InvalidBucket(String),
    /// A bucket segment that is empty.
    #[error("the request names an empty bucket")]
    EmptyBucket,
    /// An empty segment (`//`) in a JSON API path or an XML API object name.
    #[error("the request path has an empty segment (`//`)")]
    EmptySegment,
    /// A `.` or `..` segment (also percent-encoded) in a JSON API path or an
    /// XML API object name.
    #[error("the request path has a {0:?} segment; relative segments are refused")]
    DotSegment(String),
    /// No known operation has this method and path.
    #[error("no GCS operation matches {method} {path}")]
    UnknownOperation {
        /// The request method.
        method: String,
        /// The raw path (its first 128 characters).
        path: String,
    },
    /// A known operation the sidecar does not forward.
    #[error("{operation} is refused: {reason}")]
    RefusedOperation {
        /// The operation's name.
        operation: &'static str,
        /// Why it is refused, and what to do instead.
        reason: &'static str,
    },
    /// A query parameter the routing depends on is given twice.
    #[error("the query parameter {0:?} appears more than once")]
    RepeatedParameter(&'static str),
    /// A query key that decodes or case-folds to one the routing depends on.
    #[error(
        "the query key {raw:?} stands for {key:?} but is spelt differently (percent-encoded or \
         in another case); spell it {key:?}"
    )]
    DisguisedParameter {
        /// The key as received (its first 64 characters).
        raw: String,
        /// The key it stands for.
        key: &'static str,
    },
    /// A query parameter with a value the sidecar cannot route.
    #[error("the query parameter {key}={value:?} is not supported here")]
    BadParameter {
        /// The parameter.
        key: &'static str,
        /// Its value, decoded (its first 32 characters).
        value: String,
    },
}

impl RouteError {
    /// A low-cardinality label for the refusal metric.
    pub fn reason(&self) -> &'static str {
        match self {
            RouteError::NotAbsolute(_) => "not_absolute",
            RouteError::BadPercentEncoding(_) => "bad_percent_encoding",
            RouteError::InvalidBucket(_) | RouteError::EmptyBucket => "invalid_bucket",
            RouteError::EmptySegment => "empty_segment",
            RouteError::DotSegment(_) => "dot_segment",
            RouteError::UnknownOperation { .. } => "unknown_operation",
            RouteError::RefusedOperation { .. } => "refused_operation",
            RouteError::RepeatedParameter(_) => "repeated_parameter",
            RouteError::DisguisedParameter { .. } => "disguised_parameter",
            RouteError::BadParameter { .. } => "bad_parameter",
        }
    }
}

/// First path segments that belong to the JSON API family; a path starting
/// with one of them never falls back to the XML API.
const JSON_FAMILY: [&str; 5] = ["storage", "upload", "resumable", "download", "batch"];

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
    let query = query.unwrap_or("");
    let segs = segments(path);
    let segs = segs.as_slice();
    if let Some(bucket) = virtual_host {
        if !is_valid_bucket_name(bucket) {
            return Err(RouteError::InvalidBucket(bucket.to_owned()));
        }
        let mut route = xml_route(method, segs, query)?;
        route.virtual_host = Some(bucket.to_owned());
        return Ok(route);
    }
    let first = segs.first().map_or("", |s| s.1);
    if !JSON_FAMILY.contains(&first) {
        return match segs {
            [(_, "")] => xml_service(method),
            [bucket, rest @ ..] => {
                let mut route = xml_route(method, rest, query)?;
                route.buckets.push(bucket_slot(*bucket)?);
                Ok(route)
            }
            [] => Err(RouteError::NotAbsolute(String::new())),
        };
    }
    check_strict_segments(segs)?;
    let mut names = SmallVec::<[&str; INLINE_SEGMENTS]>::new();
    segs.iter().for_each(|s| names.push(s.1));
    let unknown = || RouteError::UnknownOperation {
        method: method.to_string(),
        path: path.chars().take(128).collect(),
    };
    match names.as_slice() {
        ["storage", "v1", rest @ ..] => json_route(method, &segs[2..], rest, query, unknown),
        ["upload", "storage", "v1", rest @ ..] => upload_route(method, &segs[3..], rest, query),
        ["resumable", "upload", "storage", "v1", rest @ ..] => {
            upload_route(method, &segs[4..], rest, query)
        }
        // fake-gcs-server's resumable session URLs: no bucket in them.
        ["upload", "resumable", _] => upload_session(method, unknown),
        ["download", "storage", "v1", "b", _, "o", _] if is_read(method) => download_route(segs),
        ["batch", "storage", "v1"] if *method == Method::POST => Ok(Some(route_of(
            Api::Batch,
            "batch",
            RequestBody::Batch,
            ResponseBody::Batch,
        ))),
        _ => Err(unknown()),
    }
    .and_then(|route| route.ok_or_else(unknown))
}

/// The bucket named by a virtual-hosted-style `Host` (`photos.storage.googleapis.com`,
/// `photos.localhost:9023`): the first label, when `is_bucket` knows it and the
/// host is a name with more than one label (not an IP address).
pub fn virtual_host_bucket(host: &str, is_bucket: impl Fn(&str) -> bool) -> Option<String> {
    let host = host_without_port(host);
    let dot = memchr::memchr(b'.', host.as_bytes())?;
    let (first, rest) = (&host[..dot], &host[dot + 1..]);
    if rest.is_empty() {
        return None;
    }
    let first = if first.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(first.to_ascii_lowercase())
    } else {
        Cow::Borrowed(first)
    };
    if !is_bucket(&first) {
        return None;
    }
    // Only then: an IP address (`127.0.0.1`, whose first label a mapping
    // could hold) names no bucket. Parsing one costs more than the lookup.
    host.parse::<std::net::IpAddr>()
        .is_err()
        .then(|| first.into_owned())
}

/// The byte range of the bucket in an object's `selfLink` or `mediaLink`
/// path, when it has one of the two shapes GCS writes for them
/// (`/storage/v1/b/B/o/O`, `/download/storage/v1/b/B/o/O`; a query of at
/// most one `alt=json|media` and `generation=N` pairs), found without
/// routing it. Every answer is the one slot [`route`] finds for a `GET` of
/// the same path and query (property test); `None` means "route it".
///
/// Every object resource in a response carries both links, so this spares
/// the response rewrite two full routings per object.
pub fn object_link_slot(path: &str, query: Option<&str>) -> Option<Range<usize>> {
    const JSON: &str = "/storage/v1/b/";
    const DOWNLOAD: &str = "/download/storage/v1/b/";
    let start = if path.starts_with(JSON) {
        JSON.len()
    } else if path.starts_with(DOWNLOAD) {
        DOWNLOAD.len()
    } else {
        return None;
    };
    let rest = &path[start..];
    let slash = memchr::memchr(b'/', rest.as_bytes())?;
    let (bucket, object) = (&rest[..slash], rest[slash..].strip_prefix("/o/")?);
    let plain_object = !object.is_empty()
        && memchr::memchr(b'/', object.as_bytes()).is_none()
        && check_percent_encoding(object).is_ok()
        && !is_dot_segment(object);
    (plain_object && is_valid_bucket_name(bucket) && query.is_none_or(is_plain_link_query))
        .then(|| start..start + bucket.len())
}

/// A link's query the router reads the same way in every operation above:
/// `generation=DIGITS` pairs and at most one `alt` of `json` or `media`.
fn is_plain_link_query(query: &str) -> bool {
    let mut alt = false;
    query.as_bytes().split(|&b| b == b'&').all(|pair| {
        if let Some(n) = pair.strip_prefix(b"generation=") {
            !n.is_empty() && n.iter().all(u8::is_ascii_digit)
        } else {
            matches!(pair, b"alt=json" | b"alt=media") && !std::mem::replace(&mut alt, true)
        }
    })
}

fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| h.trim_start_matches('['));
    }
    match memchr::memrchr(b':', host.as_bytes()) {
        Some(colon) if host.as_bytes()[colon + 1..].iter().all(u8::is_ascii_digit) => {
            &host[..colon]
        }
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

fn check_percent_encoding(raw: &str) -> Result<(), RouteError> {
    let bytes = raw.as_bytes();
    let hex = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_hexdigit);
    // `%` signs are few: jump from one to the next.
    let mut from = 0;
    while let Some(at) = memchr::memchr(b'%', &bytes[from..]) {
        let i = from + at;
        if !(hex(i + 1) && hex(i + 2)) {
            return Err(RouteError::BadPercentEncoding(i));
        }
        from = i + 3;
        if from >= bytes.len() {
            break;
        }
    }
    Ok(())
}

/// Path segments after the leading `/`, each with its byte offset in `path`.
fn segments(path: &str) -> SmallVec<[(usize, &str); INLINE_SEGMENTS]> {
    let mut out = SmallVec::new();
    let mut start = 1;
    for slash in memchr::memchr_iter(b'/', &path.as_bytes()[1..]) {
        let end = slash + 1;
        out.push((start, &path[start..end]));
        start = end + 1;
    }
    out.push((start, &path[start..]));
    out
}

/// Segments of a path kept on the stack (they are listed on every routed
/// request and link, and almost never number more than a handful); longer
/// paths spill to the heap.
const INLINE_SEGMENTS: usize = 16;

/// `.` or `..`, also percent-encoded (`%2E`, `.%2e`).
fn is_dot_segment(raw: &str) -> bool {
    // `%2E%2E` is the longest spelling: longer segments decode to 3+ bytes.
    if raw.len() > 6 {
        return false;
    }
    if raw.bytes().any(|b| b == b'%') {
        let decoded = percent_decode_str(raw).collect::<Vec<u8>>();
        matches!(decoded.as_slice(), b"." | b"..")
    } else {
        matches!(raw, "." | "..")
    }
}

fn check_segment(raw: &str) -> Result<(), RouteError> {
    if raw.is_empty() {
        Err(RouteError::EmptySegment)
    } else if is_dot_segment(raw) {
        Err(RouteError::DotSegment(raw.to_owned()))
    } else {
        Ok(())
    }
}

/// No empty, `.` or `..` segment anywhere.
fn check_strict_segments(segs: &[(usize, &str)]) -> Result<(), RouteError> {
    segs.iter().try_for_each(|(_, raw)| check_segment(raw))
}

/// A bucket segment: a valid bucket name as it stands (never percent-encoded).
fn bucket_slot((offset, raw): (usize, &str)) -> Result<BucketSlot, RouteError> {
    if raw.is_empty() {
        return Err(RouteError::EmptyBucket);
    }
    if !is_valid_bucket_name(raw) {
        return Err(RouteError::InvalidBucket(raw.chars().take(64).collect()));
    }
    Ok(BucketSlot {
        range: offset..offset + raw.len(),
        name: raw.to_owned(),
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
        request_kind: None,
        response_body,
    }
}

fn is_read(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD)
}

/// Values of the routing parameters `keys` in a raw query, each present at
/// most once and spelt exactly: a key that decodes (or case-folds) to a
/// routing key without being spelt as it is refused, since GCS or a proxy on
/// the way might read it as that key while the sidecar would not.
fn routing_params<'q, const N: usize>(
    query: &'q str,
    keys: &[&'static str; N],
) -> Result<[Option<Cow<'q, str>>; N], RouteError> {
    let mut found: [Option<Cow<'q, str>>; N] = std::array::from_fn(|_| None);
    if query.is_empty() {
        return Ok(found);
    }
    for pair in query.split('&') {
        let (raw, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded: Cow<'_, [u8]> = if raw.contains(['%', '+']) {
            Cow::Owned(percent_decode_str(&raw.replace('+', " ")).collect())
        } else {
            Cow::Borrowed(raw.as_bytes())
        };
        let Some(i) = keys
            .iter()
            .position(|k| k.as_bytes().eq_ignore_ascii_case(&decoded))
        else {
            continue;
        };
        if raw != keys[i] {
            return Err(RouteError::DisguisedParameter {
                raw: raw.chars().take(64).collect(),
                key: keys[i],
            });
        }
        if found[i].is_some() {
            return Err(RouteError::RepeatedParameter(keys[i]));
        }
        found[i] = Some(percent_decode_str(value).decode_utf8_lossy());
    }
    Ok(found)
}

/// `/storage/v1/` + `segs`: an operation of the discovery document.
fn json_route(
    method: &Method,
    segs: &[(usize, &str)],
    names: &[&str],
    query: &str,
    unknown: impl Fn() -> RouteError,
) -> Result<Option<Route>, RouteError> {
    let Some(op) = discovery::table().find(method, names) else {
        return Err(unknown());
    };
    if let Class::Refused(reason) = op.class {
        return Err(RouteError::RefusedOperation {
            operation: &op.name,
            reason,
        });
    }
    let [alt] = routing_params(query, &["alt"])?;
    let media = match alt.as_deref() {
        None | Some("json") => false,
        Some("media") if op.media_download => true,
        Some(other) => {
            return Err(RouteError::BadParameter {
                key: "alt",
                value: other.chars().take(32).collect(),
            });
        }
    };
    let mut route = if media {
        route_of(
            Api::Json,
            "objects.download",
            RequestBody::None,
            ResponseBody::Media,
        )
    } else {
        let request = op
            .request_resource()
            .map_or(RequestBody::None, RequestBody::Json);
        let response = ResponseBody::Json(op.response_resource());
        let mut route = route_of(Api::Json, &op.name, request, response);
        route.request_kind = op.request_kind.as_deref();
        route
    };
    for (template, seg) in op.segments.iter().zip(segs) {
        if *template == Segment::Bucket {
            route.buckets.push(bucket_slot(*seg)?);
        }
    }
    Ok(Some(route))
}

/// `/upload/storage/v1/` + `segs` (also under `/resumable`): the upload
/// protocols of `objects.insert` and the resumable session.
fn upload_route(
    method: &Method,
    segs: &[(usize, &str)],
    names: &[&str],
    query: &str,
) -> Result<Option<Route>, RouteError> {
    use RequestBody as Req;
    let ["b", _, "o"] = names else {
        return Ok(None);
    };
    let [upload_type, upload_id] = routing_params(query, &["uploadType", "upload_id"])?;
    let upload = |op, req| route_of(Api::Upload, op, req, ResponseBody::Json(Resource::Object));
    let mut route = match (upload_id, method) {
        (None, &Method::POST) if upload_type.as_deref() != Some("media") => {
            let mut route = upload_start(upload_type.as_deref())?;
            route.request_kind = Some(OBJECT_KIND);
            route
        }
        (Some(_), &Method::DELETE) => upload("uploads.resumable.cancel", Req::Stream),
        (Some(_), &Method::PUT | &Method::POST) => upload("uploads.resumable.chunk", Req::Stream),
        (Some(_), _) => return Ok(None),
        (None, &Method::POST) => upload("uploads.media", Req::Stream),
        (None, _) => return Ok(None),
    };
    route.buckets.push(bucket_slot(segs[1])?);
    Ok(Some(route))
}

/// The `kind` of object metadata (multipart uploads, resumable starts).
const OBJECT_KIND: &str = "storage#object";

/// `POST` of a multipart upload or of a resumable session's start.
fn upload_start(upload_type: Option<&str>) -> Result<Route, RouteError> {
    use RequestBody as Req;
    let upload = |op, req| route_of(Api::Upload, op, req, ResponseBody::Json(Resource::Object));
    match upload_type {
        Some("multipart") => Ok(upload(
            "uploads.multipart",
            Req::Multipart(Resource::Object),
        )),
        Some("resumable") => Ok(upload(
            "uploads.resumable.start",
            Req::Json(Resource::Object),
        )),
        other => Err(RouteError::BadParameter {
            key: "uploadType",
            value: other.unwrap_or("(missing)").chars().take(32).collect(),
        }),
    }
}

/// A session URL of the emulator (`/upload/resumable/{id}`).
fn upload_session(
    method: &Method,
    unknown: impl Fn() -> RouteError,
) -> Result<Option<Route>, RouteError> {
    let op = match *method {
        Method::PUT | Method::POST => "uploads.resumable.chunk",
        Method::DELETE => "uploads.resumable.cancel",
        _ => return Err(unknown()),
    };
    Ok(Some(route_of(
        Api::Upload,
        op,
        RequestBody::Stream,
        ResponseBody::Json(Resource::Object),
    )))
}

/// `/download/storage/v1/b/{bucket}/o/{object}`.
fn download_route(segs: &[(usize, &str)]) -> Result<Option<Route>, RouteError> {
    let mut route = route_of(
        Api::Download,
        "objects.download",
        RequestBody::Stream,
        ResponseBody::Media,
    );
    route.buckets.push(bucket_slot(segs[4])?);
    Ok(Some(route))
}

/// XML API subresources: query keys that change what a request means.
const XML_SUBRESOURCES: [&str; 21] = [
    "acl",
    "billing",
    "compose",
    "cors",
    "defaultObjectAcl",
    "delete",
    "encryption",
    "encryptionConfig",
    "legalHold",
    "lifecycle",
    "location",
    "logging",
    "partNumber",
    "retention",
    "storageClass",
    "tagging",
    "uploadId",
    "uploads",
    "versioning",
    "website",
    "restore",
];

const DELETE: usize = 5;
const LOGGING: usize = 11;

/// `GET /`: the XML API's bucket list.
fn xml_service(method: &Method) -> Result<Route, RouteError> {
    if !is_read(method) {
        return Err(RouteError::UnknownOperation {
            method: method.to_string(),
            path: "/".to_owned(),
        });
    }
    Ok(route_of(
        Api::Xml,
        "xml.service",
        RequestBody::Stream,
        ResponseBody::Xml,
    ))
}

/// The XML API, once the bucket is known (from the path or the host); `rest`
/// are the segments after it. An object name may end with `/` (a trailing
/// empty segment) but holds no other empty, `.` or `..` segment.
fn xml_route(method: &Method, rest: &[(usize, &str)], query: &str) -> Result<Route, RouteError> {
    use RequestBody as Req;
    use ResponseBody as Resp;
    let object = match rest {
        [] | [(_, "")] => &[][..],
        [init @ .., (_, "")] => init,
        all => all,
    };
    check_strict_segments(object)?;
    let params = routing_params(query, &XML_SUBRESOURCES)?;
    let subresource = params.iter().any(Option::is_some);
    let xml = |op, req, resp| Ok(route_of(Api::Xml, op, req, resp));
    if matches!(rest, [] | [(_, "")]) {
        return match *method {
            Method::GET | Method::HEAD => xml("xml.bucket.get", Req::Stream, Resp::Xml),
            Method::PUT if params[LOGGING].is_some() => xml("xml.bucket.put", Req::Xml, Resp::Xml),
            Method::PUT => xml("xml.bucket.put", Req::Stream, Resp::Xml),
            // Multi-object delete; a bare POST is an HTML form upload, whose
            // policy document is signed for the bucket it names.
            Method::POST if params[DELETE].is_some() => {
                xml("xml.bucket.delete_objects", Req::Stream, Resp::Xml)
            }
            Method::DELETE => xml("xml.bucket.delete", Req::Stream, Resp::Xml),
            _ => Err(xml_unknown(method)),
        };
    }
    match *method {
        Method::GET | Method::HEAD if subresource => {
            xml("xml.object.subresource", Req::Stream, Resp::Xml)
        }
        Method::GET | Method::HEAD => xml("xml.object.get", Req::Stream, Resp::Media),
        Method::PUT => xml("xml.object.put", Req::Stream, Resp::Xml),
        Method::POST => xml("xml.object.post", Req::Stream, Resp::Xml),
        Method::DELETE => xml("xml.object.delete", Req::Stream, Resp::Xml),
        _ => Err(xml_unknown(method)),
    }
}

fn xml_unknown(method: &Method) -> RouteError {
    RouteError::UnknownOperation {
        method: method.to_string(),
        path: "(an XML API bucket or object)".to_owned(),
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
    #[allow(clippy::too_many_lines)] // a table of cases
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
                Req::None,
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
                Req::None,
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
                Req::None,
                Resp::Json(R::Generic),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/iam",
                Json,
                "buckets.getIamPolicy",
                &["photos"],
                Req::None,
                Resp::Json(R::Policy),
            ),
            case(
                put.clone(),
                "/storage/v1/b/photos/iam",
                Json,
                "buckets.setIamPolicy",
                &["photos"],
                Req::Json(R::Policy),
                Resp::Json(R::Policy),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/acl",
                Json,
                "bucketAccessControls.list",
                &["photos"],
                Req::None,
                Resp::Json(R::Acls),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/defaultObjectAcl",
                Json,
                "defaultObjectAccessControls.insert",
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
                Req::None,
                Resp::Json(R::Objects),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/o/a%2Fb.jpg",
                Json,
                "objects.get",
                &["photos"],
                Req::None,
                Resp::Json(R::Object),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/o/a%2Fb.jpg?alt=media",
                Json,
                "objects.download",
                &["photos"],
                Req::None,
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
                "/storage/v1/b/photos/o/x/moveTo/o/y",
                Json,
                "objects.move",
                &["photos"],
                Req::None,
                Resp::Json(R::Object),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/o/x/acl",
                Json,
                "objectAccessControls.list",
                &["photos"],
                Req::None,
                Resp::Json(R::Acls),
            ),
            case(
                get.clone(),
                "/storage/v1/b/photos/notificationConfigs",
                Json,
                "notifications.list",
                &["photos"],
                Req::None,
                Resp::Json(R::Notification),
            ),
            case(
                post.clone(),
                "/storage/v1/b/photos/folders",
                Json,
                "folders.insert",
                &["photos"],
                Req::Json(R::Generic),
                Resp::Json(R::Generic),
            ),
            case(
                get.clone(),
                "/storage/v1/projects/p/serviceAccount",
                Json,
                "projects.serviceAccount.get",
                &[],
                Req::None,
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
                "uploads.resumable.chunk",
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
            ("/storage/v1/b//o", RouteError::EmptySegment),
            (
                "/storage/v1/b/Photos/o",
                RouteError::InvalidBucket("Photos".into()),
            ),
            (
                "/storage/v1/b/ph%C3%B6tos",
                RouteError::InvalidBucket("ph%C3%B6tos".into()),
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
        assert_eq!(virtual_host_bucket("::1", |_| true), None);
        assert_eq!(
            virtual_host_bucket("a.b.c.d.example", |_| true).as_deref(),
            Some("a")
        );
    }

    #[test]
    fn the_table_finds_what_a_scan_in_table_order_finds() {
        let table = discovery::table();
        let methods = [
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ];
        let mut checked = 0;
        for op in &table.operations {
            let concrete: Vec<&str> = op
                .segments
                .iter()
                .map(|seg| match seg {
                    Segment::Literal(lit) => *lit,
                    Segment::Bucket => "photos",
                    Segment::Param => "o",
                })
                .collect();
            // The template itself, and one segment more or less.
            let longer = [concrete.as_slice(), &["x"]].concat();
            let shorter = &concrete[..concrete.len().saturating_sub(1)];
            for names in [concrete.as_slice(), &longer, shorter] {
                for method in &methods {
                    let found = table.find(method, names);
                    let want = table
                        .operations
                        .iter()
                        .find(|op| op.method == *method && op.matches(names));
                    assert_eq!(
                        found.map(|op| &op.name),
                        want.map(|op| &op.name),
                        "{method} {names:?}"
                    );
                    checked += usize::from(want.is_some());
                }
            }
        }
        assert!(checked >= table.operations.len(), "{checked}");
    }

    #[test]
    fn paths_with_many_segments_are_routed_as_short_ones() {
        let object: String = (0..40).map(|i| format!("/d{i}")).collect();
        let path = format!("/photos{object}");
        let routed = route(&Method::GET, &path, None, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(routed.operation, "xml.object.get");
        assert_eq!(routed.buckets.len(), 1);
        assert_eq!(routed.buckets[0].range, 1..7);
        let dotted = format!("/photos/a{}/./b", "/x".repeat(30));
        assert_eq!(
            route(&Method::GET, &dotted, None, None),
            Err(RouteError::DotSegment(".".to_owned()))
        );
        let json = format!("/storage/v1/b/photos/o/a{}", "/x".repeat(30));
        assert!(matches!(
            route(&Method::GET, &json, None, None),
            Err(RouteError::UnknownOperation { .. })
        ));
    }

    /// The byte-by-byte percent-encoding check the `memchr` one replaced.
    fn percent_check_by_bytes(raw: &str) -> Result<(), RouteError> {
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

    proptest::proptest! {
        #[test]
        fn dot_segments_are_found_in_every_spelling(raw in "(\\.|%2[eE]|a|%41){0,4}") {
            let decoded = percent_decode_str(&raw).collect::<Vec<u8>>();
            let dot = matches!(decoded.as_slice(), b"." | b"..");
            proptest::prop_assert_eq!(is_dot_segment(&raw), dot, "{}", raw);
        }

        #[test]
        fn percent_check_agrees_with_the_byte_by_byte_one(raw in "[%a-fA-G0-9/]{0,12}") {
            proptest::prop_assert_eq!(check_percent_encoding(&raw), percent_check_by_bytes(&raw));
        }
    }
}

#[cfg(test)]
#[path = "route_strict_tests.rs"]
pub(crate) mod strict_tests;
