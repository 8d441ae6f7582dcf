//! `POST /batch/storage/v1`: a `multipart/mixed` body of nested JSON API
//! requests, answered by a `multipart/mixed` body of nested responses.
//!
//! Each nested request is routed and translated like a top-level one. A part
//! naming a bucket it may not use is answered locally (its nested response
//! is a GCS-style error) while the others go upstream; the responses are put
//! back in the original order.

use std::collections::HashMap;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Response, StatusCode, Uri};

use crate::errors::ApiError;
use crate::multipart::{boundary, find_header, part_headers, split};
use crate::policy::{self, Access};
use crate::rewrite::Translator;
use crate::rewrite::json::{JsonBody, rewrite_json_body, rewrite_json_bytes};
use crate::rewrite::strict::check_request_json;
use crate::route::{Api, RequestBody, Resource, ResponseBody, Route, replace_slots, route};

/// GCS accepts at most this many parts per batch.
pub const MAX_PARTS: usize = 100;

const MAX_NESTED_HEADERS: usize = 64;

/// A translated batch: the body to send upstream, and how to put the answer together.
#[derive(Debug)]
pub struct Plan {
    /// `None` when every part was answered locally.
    pub upstream_body: Option<Vec<u8>>,
    boundary: String,
    entries: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    content_id: Option<String>,
    hint: Resource,
    local: Option<ApiError>,
    /// The refusal-metric reason, when the part was refused as a top-level
    /// request would be (an unknown operation, a method override).
    refusal: Option<&'static str>,
}

/// Why a nested request is answered locally.
struct PartError {
    error: ApiError,
    refusal: Option<&'static str>,
}

impl From<ApiError> for PartError {
    fn from(error: ApiError) -> Self {
        Self {
            error,
            refusal: None,
        }
    }
}

impl Plan {
    /// The refusal-metric reason of each part refused as a request the
    /// sidecar does not forward, for `bucketmap_sidecar_refused_requests_total`.
    pub fn refusals(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.entries.iter().filter_map(|e| e.refusal)
    }

    /// The refusal of a part that writes to a bucket a move has fenced, if
    /// one does: the shell holds the whole batch and prepares it again.
    pub fn held(&self) -> Option<&ApiError> {
        self.entries
            .iter()
            .filter_map(|e| e.local.as_ref())
            .find(|error| policy::holds(error))
    }
}

/// Translates a batch request.
pub fn prepare(body: &[u8], content_type: &str, tr: &Translator<'_>) -> Result<Plan, ApiError> {
    let boundary = boundary(content_type).ok_or_else(|| {
        ApiError::bad_request("a batch request must be multipart/mixed with a boundary")
    })?;
    let parts = split(body, &boundary).ok_or_else(|| {
        ApiError::bad_request(
            "the batch body has no parts, or a part lacks the empty line that ends its headers",
        )
    })?;
    if parts.len() > MAX_PARTS {
        return Err(ApiError::bad_request(format!(
            "a batch request may hold at most {MAX_PARTS} parts; this one has {}",
            parts.len()
        )));
    }
    let mut out = Vec::with_capacity(body.len() + 256);
    let mut entries = Vec::with_capacity(parts.len());
    for part in parts {
        let (headers, payload) = part_headers(part);
        let content_id = find_header(&headers, "Content-ID")
            .map(|id| id.trim_matches(|c| c == '<' || c == '>').to_owned());
        match translate_request(payload, tr) {
            Ok((nested, hint)) => {
                out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
                for (name, value) in &headers {
                    out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&nested);
                out.extend_from_slice(b"\r\n");
                entries.push(Entry {
                    content_id,
                    hint,
                    local: None,
                    refusal: None,
                });
            }
            Err(PartError { error, refusal }) => entries.push(Entry {
                content_id,
                hint: Resource::Generic,
                local: Some(error),
                refusal,
            }),
        }
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let forwarded = entries.iter().any(|e| e.local.is_none());
    Ok(Plan {
        upstream_body: forwarded.then_some(out),
        boundary,
        entries,
    })
}

/// One nested request, translated; with the resource its response holds.
fn translate_request(
    payload: &[u8],
    tr: &Translator<'_>,
) -> Result<(Vec<u8>, Resource), PartError> {
    let mut header_buf = [httparse::EMPTY_HEADER; MAX_NESTED_HEADERS];
    let (head_len, parsed) = parse_part(payload, &mut header_buf)?;
    let method_text = parsed.method.unwrap_or("GET");
    let method = part_method(method_text, parsed.headers)?;
    let target = parsed.path.unwrap_or("/");
    let uri: Uri = target
        .parse()
        .map_err(|_| ApiError::bad_request(format!("bad URL in a batch part: {target:?}")))?;
    let query = uri.query();
    // A part reads or writes as its own method says: a batch of reads of
    // a bucket a move has fenced goes on.
    let tr = &Translator {
        access: Access {
            writes: !policy::is_read_method(&method),
            ..tr.access
        },
        ..*tr
    };
    let (routed, new_path) = route_part(&method, uri.path(), query, tr)?;

    let (body, declared) = declared_body(&payload[head_len..], parsed.headers);
    let rewritten = rewrite_part_body(body, &routed, tr)?;
    let body = rewritten.as_deref().unwrap_or(body);
    let head = PartHead {
        method: method_text,
        path: &new_path,
        query,
        headers: parsed.headers,
    };
    let out = write_part(&head, body, declared);
    let hint = match routed.response_body {
        ResponseBody::Json(hint) => hint,
        _ => Resource::Generic,
    };
    Ok((out, hint))
}

/// Parses a nested request's head; returns its length and the parsed request.
fn parse_part<'h, 'b>(
    payload: &'b [u8],
    header_buf: &'h mut [httparse::Header<'b>],
) -> Result<(usize, httparse::Request<'h, 'b>), PartError> {
    let mut parsed = httparse::Request::new(header_buf);
    match parsed.parse(payload) {
        Ok(httparse::Status::Complete(n)) => Ok((n, parsed)),
        Ok(httparse::Status::Partial) => {
            Err(ApiError::bad_request("a batch part holds an incomplete HTTP request").into())
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "a batch part holds a malformed HTTP request: {e}"
        ))
        .into()),
    }
}

/// The nested request's method; a method override header is refused.
fn part_method(method_text: &str, headers: &[httparse::Header<'_>]) -> Result<Method, PartError> {
    let method = Method::from_bytes(method_text.as_bytes())
        .map_err(|_| ApiError::bad_request("bad method in a batch part"))?;
    if headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("x-http-method-override"))
    {
        return Err(PartError {
            error: ApiError::bad_request(
                "bucketmap-sidecar refuses X-HTTP-Method-Override in a batch part: put the \
                 method in the part's request line",
            ),
            refusal: Some("method_override"),
        });
    }
    Ok(method)
}

/// Routes a nested request (JSON API only) and maps its buckets; returns the
/// route and the path naming the physical buckets.
fn route_part(
    method: &Method,
    path: &str,
    query: Option<&str>,
    tr: &Translator<'_>,
) -> Result<(Route, String), PartError> {
    let routed = route(method, path, query, None).map_err(|e| PartError {
        error: ApiError::bad_request(format!("batch part: {e}")),
        refusal: Some(e.reason()),
    })?;
    if routed.api != Api::Json {
        return Err(PartError {
            error: ApiError::bad_request(format!(
                "batch parts must be JSON API requests (/storage/v1/…), not {path:?}"
            )),
            refusal: Some("unknown_operation"),
        });
    }
    let names: Vec<&str> = routed
        .buckets
        .iter()
        .map(|slot| Ok(tr.bucket_str(&slot.name)?.unwrap_or(&slot.name)))
        .collect::<Result<_, ApiError>>()?;
    let new_path = replace_slots(path, &routed.buckets, &names);
    Ok((routed, new_path))
}

/// The nested body, cut to its `Content-Length` when one is declared and
/// fits; with the declared length.
fn declared_body<'b>(
    rest: &'b [u8],
    headers: &[httparse::Header<'_>],
) -> (&'b [u8], Option<usize>) {
    let declared = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    match declared {
        Some(length) if length <= rest.len() => (&rest[..length], declared),
        _ => (rest, declared),
    }
}

/// Checks and translates a nested request body; `None` when it is sent as is.
fn rewrite_part_body(
    body: &[u8],
    routed: &Route,
    tr: &Translator<'_>,
) -> Result<Option<Vec<u8>>, PartError> {
    match routed.request_body {
        RequestBody::Json(hint) => {
            check_request_json(body, routed.request_kind)?;
            Ok(rewrite_json_bytes(body, hint, tr)?)
        }
        RequestBody::None if !body.is_empty() => Err(ApiError::bad_request(format!(
            "bucketmap-sidecar refuses a request body on {}, which takes none",
            routed.operation
        ))
        .into()),
        _ => Ok(None),
    }
}

/// The request line and headers of a translated nested request.
struct PartHead<'a> {
    method: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    headers: &'a [httparse::Header<'a>],
}

/// Serializes a translated nested request: its own headers but `Host` and
/// `Content-Length`, which is recomputed when there is a body or one was declared.
fn write_part(head: &PartHead<'_>, body: &[u8], declared: Option<usize>) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 1024);
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(head.path.as_bytes());
    if let Some(query) = head.query {
        out.push(b'?');
        out.extend_from_slice(query.as_bytes());
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for h in head.headers {
        if h.name.eq_ignore_ascii_case("content-length") || h.name.eq_ignore_ascii_case("host") {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() || declared.is_some() {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// Translates the upstream's batch response and merges in the parts answered
/// locally. A multipart response that cannot be split into its parts is an
/// error (nothing of it reaches the client untranslated); a part whose nested
/// response cannot be read is replaced by a GCS-style 502 for that part.
pub fn translate_response(
    body: &[u8],
    content_type: &str,
    plan: &Plan,
    tr: &Translator<'_>,
) -> Result<Vec<u8>, ApiError> {
    let boundary = boundary(content_type)
        .ok_or_else(|| ApiError::bad_gateway("the batch response has no multipart boundary"))?;
    let parts = split(body, &boundary).ok_or_else(|| {
        ApiError::bad_gateway("the batch response cannot be split into its parts")
    })?;
    let mut by_id: HashMap<String, Vec<u8>> = HashMap::new();
    let mut in_order: Vec<Vec<u8>> = Vec::new();
    let forwarded: Vec<&Entry> = plan.entries.iter().filter(|e| e.local.is_none()).collect();
    for (index, part) in parts.into_iter().enumerate() {
        let (id, rendered) = render_part(part, index, &forwarded, tr);
        match id {
            Some(id)
                if forwarded
                    .iter()
                    .any(|e| e.content_id.as_deref() == Some(id.as_str())) =>
            {
                by_id.insert(id, rendered);
            }
            _ => in_order.push(rendered),
        }
    }
    let mut in_order = in_order.into_iter();
    let mut out = Vec::with_capacity(body.len() + 256);
    for entry in &plan.entries {
        let rendered = match (&entry.local, &entry.content_id) {
            (Some(error), _) => Some(local_part(entry.content_id.as_deref(), error)),
            (None, Some(id)) => by_id.remove(id).or_else(|| in_order.next()),
            (None, None) => in_order.next(),
        };
        if let Some(rendered) = rendered {
            out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
            out.extend_from_slice(&rendered);
            out.extend_from_slice(b"\r\n");
        }
    }
    for rendered in in_order.chain(by_id.into_values()) {
        out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        out.extend_from_slice(&rendered);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    Ok(out)
}

/// One part of the upstream's batch response, translated: its response id
/// (`Content-ID` without `response-`) and its headers and nested response.
fn render_part(
    part: &[u8],
    index: usize,
    forwarded: &[&Entry],
    tr: &Translator<'_>,
) -> (Option<String>, Vec<u8>) {
    let (headers, payload) = part_headers(part);
    let id = find_header(&headers, "Content-ID")
        .map(|id| id.trim_matches(|c| c == '<' || c == '>'))
        .map(|id| id.strip_prefix("response-").unwrap_or(id).to_owned());
    let entry = id
        .as_deref()
        .and_then(|id| {
            forwarded
                .iter()
                .find(|e| e.content_id.as_deref() == Some(id))
        })
        .or_else(|| forwarded.get(index));
    let hint = entry.map_or(Resource::Generic, |e| e.hint);
    let nested = translate_nested_response(payload, hint, tr).unwrap_or_else(|| {
        error_response(&ApiError::bad_gateway(
            "a part of the batch response is not an HTTP response",
        ))
    });
    let mut rendered = Vec::with_capacity(nested.len() + 128);
    for (name, value) in &headers {
        rendered.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    rendered.extend_from_slice(b"\r\n");
    rendered.extend_from_slice(&nested);
    (id, rendered)
}

fn translate_nested_response(
    payload: &[u8],
    hint: Resource,
    tr: &Translator<'_>,
) -> Option<Vec<u8>> {
    let mut header_buf = [httparse::EMPTY_HEADER; MAX_NESTED_HEADERS];
    let mut parsed = httparse::Response::new(&mut header_buf);
    let head_len = match parsed.parse(payload) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    let body = &payload[head_len..];
    let is_json = parsed.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("content-type")
            && String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("json")
    });
    let declared = parsed
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    let body = match declared {
        Some(length) if length <= body.len() => &body[..length],
        _ => body,
    };
    let code = parsed.code.unwrap_or(200);
    let new_body = match is_json {
        true => match rewrite_json_body(body, hint, tr) {
            Ok(JsonBody::Changed(new)) => Some(new),
            Ok(JsonBody::Unchanged) => None,
            Ok(JsonBody::Unreadable) | Err(_) => {
                let status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
                let well_formed = crate::answer::is_json(body);
                match crate::answer::unreadable_answer(status, body, well_formed, tr, "JSON") {
                    Ok(new) => Some(new),
                    Err(e) => return Some(error_response(&e)),
                }
            }
        },
        false => None,
    };
    let body = new_body.as_deref().unwrap_or(body);
    let mut out = Vec::with_capacity(payload.len() + 32);
    let reason = parsed.reason.unwrap_or("");
    out.extend_from_slice(format!("HTTP/1.1 {code} {reason}\r\n").as_bytes());
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    Some(out)
}

/// A part (headers, blank line, nested response) holding a local error.
fn local_part(content_id: Option<&str>, error: &ApiError) -> Vec<u8> {
    let mut out = String::from("Content-Type: application/http\r\n");
    if let Some(id) = content_id {
        out.push_str(&format!("Content-ID: <response-{id}>\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(&error_response(error));
    out
}

/// The nested HTTP response of a part answering `error`.
fn error_response(error: &ApiError) -> Vec<u8> {
    let json = error.json_body();
    format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json; charset=UTF-8\r\nContent-Length: {}\r\n\r\n{json}",
        error.status.as_u16(),
        error.status.canonical_reason().unwrap_or(""),
        json.len()
    )
    .into_bytes()
}

/// The answer to a batch whose every part was refused (the shell boxes its
/// body).
pub fn local_response(plan: &Plan) -> Response<Bytes> {
    let mut body = Vec::new();
    for entry in &plan.entries {
        if let Some(error) = &entry.local {
            body.extend_from_slice(format!("--{}\r\n", plan.boundary).as_bytes());
            body.extend_from_slice(&local_part(entry.content_id.as_deref(), error));
            body.extend_from_slice(b"\r\n");
        }
    }
    body.extend_from_slice(format!("--{}--\r\n", plan.boundary).as_bytes());
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = StatusCode::OK;
    if let Ok(value) =
        HeaderValue::from_str(&format!("multipart/mixed; boundary={}", plan.boundary))
    {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::Direction;
    use crate::rewrite::testing::*;

    /// What the Python client sends: LF line ends, absolute URLs.
    const PYTHON_BATCH: &str = "--===1==\nContent-Type: application/http\nContent-Transfer-Encoding: binary\nContent-ID: <a+1>\n\n\
        PATCH http://127.0.0.1:9023/storage/v1/b/photos/o/photos%2Fx?projection=full HTTP/1.1\nContent-Type: application/json\nContent-Length: 40\n\n\
        {\"metadata\":{\"k\":\"v\"},\"bucket\":\"photos\"}\n\
        --===1==\nContent-Type: application/http\nContent-ID: <a+2>\n\n\
        DELETE /storage/v1/b/unmapped/o/y HTTP/1.1\n\n\n\
        --===1==\nContent-Type: application/http\nContent-ID: <a+3>\n\n\
        GET /storage/v1/b/logs/o/z HTTP/1.1\n\n\n\
        --===1==--";

    /// The plan of [`PYTHON_BATCH`] under mapping `m`.
    fn python_plan(m: &crate::mapping::Mapping) -> Plan {
        let up = upstream_base();
        prepare(
            PYTHON_BATCH.as_bytes(),
            "multipart/mixed; boundary=\"===1==\"",
            &translator(m, &up, Direction::ToPhysical),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn translates_parts_and_answers_refused_ones_locally() {
        let m = mapping();
        let plan = python_plan(&m);
        let upstream =
            String::from_utf8(plan.upstream_body.clone().unwrap_or_default()).unwrap_or_default();
        assert!(
            upstream.contains(
                "PATCH /storage/v1/b/photos-k3x9q2mw/o/photos%2Fx?projection=full HTTP/1.1\r\n"
            ),
            "{upstream}"
        );
        assert!(
            upstream.contains("\"bucket\":\"photos-k3x9q2mw\""),
            "{upstream}"
        );
        assert!(
            upstream.contains("GET /storage/v1/b/logs-aaaa1111/o/z HTTP/1.1\r\n"),
            "{upstream}"
        );
        assert!(!upstream.contains("unmapped"), "{upstream}");
        assert!(!upstream.contains("Content-ID: <a+2>"), "{upstream}");

        let response = "--resp\r\nContent-Type: application/http\r\nContent-ID: <response-a+3>\r\n\r\n\
            HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n\r\n{\"error\":{\"code\":404,\"message\":\"No such object: logs-aaaa1111/z\"}}\r\n\
            --resp\r\nContent-Type: application/http\r\nContent-ID: <response-a+1>\r\n\r\n\
            HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=UTF-8\r\nContent-Length: 63\r\n\r\n\
            {\"kind\":\"storage#object\",\"bucket\":\"photos-k3x9q2mw\",\"name\":\"x\"}\r\n--resp--\r\n";
        let sc = sidecar_base();
        let out = translate_response(
            response.as_bytes(),
            "multipart/mixed; boundary=resp",
            &plan,
            &translator(&m, &sc, Direction::ToLogical),
        )
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
        let first = out.find("response-a+1").unwrap_or(usize::MAX);
        let second = out.find("response-a+2").unwrap_or(usize::MAX);
        let third = out.find("response-a+3").unwrap_or(usize::MAX);
        assert!(
            first < second && second < third,
            "parts in request order: {out}"
        );
        assert!(out.contains("\"bucket\":\"photos\""), "{out}");
        assert!(out.contains("No such object: logs/z"), "{out}");
        assert!(
            out.contains("HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=UTF-8"),
            "{out}"
        );
        assert!(out.contains("not known to bucketmap-sidecar"), "{out}");
        assert!(
            !out.contains("k3x9q2mw") && !out.contains("aaaa1111"),
            "{out}"
        );
        assert!(out.ends_with("--resp--\r\n"), "{out}");
    }

    #[test]
    fn a_batch_response_that_cannot_be_read_is_never_forwarded_as_it_is() {
        let m = mapping();
        let plan = python_plan(&m);
        let sc = sidecar_base();
        let tr = translator(&m, &sc, Direction::ToLogical);
        let leaky = "--resp\r\nContent-ID: <response-a+1>\r\n\r\n\
            HTTP/1.1 200 OK\r\n\r\n{\"bucket\":\"photos-k3x9q2mw\"}\r\n--resp--\r\n";
        // No boundary in the content type, or none in the body: the whole
        // answer is a 502, not the upstream's bytes.
        for (content_type, body) in [
            ("multipart/mixed", leaky),
            ("multipart/mixed; boundary=other", leaky),
        ] {
            let error = translate_response(body.as_bytes(), content_type, &plan, &tr)
                .expect_err(content_type);
            assert_eq!(error.status, StatusCode::BAD_GATEWAY, "{content_type}");
        }
        let translate = |body: &str| {
            translate_response(
                body.as_bytes(),
                "multipart/mixed; boundary=resp",
                &plan,
                &tr,
            )
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| panic!("{e}"))
        };
        // A part that is not an HTTP response becomes a 502 for that part.
        let garbled = "--resp\r\nContent-ID: <response-a+1>\r\n\r\n\
            {\"bucket\":\"photos-k3x9q2mw\"}\r\n\
            --resp\r\nContent-ID: <response-a+3>\r\n\r\n\
            HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"kind\":\"storage#object\",\"bucket\":\"logs-aaaa1111\",\"name\":\"z\"}\r\n--resp--\r\n";
        let out = translate(garbled);
        assert!(!out.contains("k3x9q2mw"), "{out}");
        assert!(out.contains("HTTP/1.1 502 Bad Gateway"), "{out}");
        assert!(out.contains("not an HTTP response"), "{out}");
        assert!(
            out.contains("\"bucket\":\"logs\""),
            "the readable part: {out}"
        );

        // A JSON part that cannot be read: a success becomes a 502 part, an
        // error keeps its status with the name translated as in text.
        let unreadable = "--resp\r\nContent-ID: <response-a+1>\r\n\r\n\
            HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"bucket\":\"photos-k3x9q2mw\r\n\
            --resp\r\nContent-ID: <response-a+3>\r\n\r\n\
            HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n\r\n<p>photos-k3x9q2mw</p>\r\n--resp--\r\n";
        let out = translate(unreadable);
        assert!(!out.contains("k3x9q2mw"), "{out}");
        assert!(out.contains("HTTP/1.1 502 Bad Gateway"), "{out}");
        assert!(out.contains("HTTP/1.1 404 Not Found"), "{out}");
        assert!(out.contains("<p>photos</p>"), "{out}");
    }

    #[test]
    fn refuses_oversized_and_non_multipart_batches() {
        let m = mapping();
        let up = upstream_base();
        let tr = translator(&m, &up, Direction::ToPhysical);
        let mut big = String::new();
        for i in 0..101 {
            big.push_str(&format!(
                "--b\r\nContent-ID: <{i}>\r\n\r\nGET /storage/v1/b/photos HTTP/1.1\r\n\r\n\r\n"
            ));
        }
        big.push_str("--b--");
        assert_eq!(
            prepare(big.as_bytes(), "multipart/mixed; boundary=b", &tr)
                .map(|_| ())
                .map_err(|e| e.status.as_u16()),
            Err(400)
        );
        assert_eq!(
            prepare(b"{}", "application/json", &tr)
                .map(|_| ())
                .map_err(|e| e.status.as_u16()),
            Err(400)
        );
    }

    /// `boundary=` inside a quoted parameter is not the boundary: the sidecar
    /// splits where RFC 2046 parsers (and so the upstream) split, on `abc`,
    /// and the part hidden behind `xyz` is read as the body of a GET, which
    /// takes none: it is refused, and nothing names the other bucket.
    #[test]
    fn a_boundary_inside_a_quoted_parameter_is_not_the_boundary() {
        let m = mapping();
        let up = upstream_base();
        let body = "--abc\r\nContent-Type: application/http\r\nContent-ID: <1>\r\n\r\n\
                    GET /storage/v1/b/photos/o HTTP/1.1\r\n\r\n\
                    --xyz\r\nContent-Type: application/http\r\n\r\n\
                    GET /storage/v1/b/other/o HTTP/1.1\r\n\r\n\
                    --xyz--\r\n--abc--\r\n";
        let plan = prepare(
            body.as_bytes(),
            r#"multipart/mixed; foo="x; boundary=xyz"; boundary=abc"#,
            &translator(&m, &up, Direction::ToPhysical),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plan.boundary, "abc");
        assert_eq!(plan.entries.len(), 1);
        assert!(
            plan.upstream_body.is_none(),
            "the smuggled request is not forwarded"
        );
        let message = plan.entries[0].local.as_ref().map(|e| e.message.clone());
        assert!(
            message.as_deref().is_some_and(|m| m.contains("takes none")),
            "{message:?}"
        );
    }

    /// Parts refused as requests the sidecar does not forward carry the
    /// reason the refusal metric counts; parts refused for their bucket or
    /// body (not router refusals) carry none.
    #[test]
    fn refused_parts_report_their_refusal_reason() {
        let m = mapping();
        let up = upstream_base();
        let body = "--b\r\nContent-ID: <1>\r\n\r\nGET /storage/v1//b/other/o/x HTTP/1.1\r\n\r\n\r\n\
            --b\r\nContent-ID: <2>\r\n\r\nGET /storage/v1/b/photos/o/../../other HTTP/1.1\r\n\r\n\r\n\
            --b\r\nContent-ID: <3>\r\n\r\nPOST /storage/v1/b/photos/o/x HTTP/1.1\r\nX-HTTP-Method-Override: DELETE\r\n\r\n\r\n\
            --b\r\nContent-ID: <4>\r\n\r\nGET /photos/x HTTP/1.1\r\n\r\n\r\n\
            --b\r\nContent-ID: <5>\r\n\r\nGET /storage/v1/b/unmapped/o/x HTTP/1.1\r\n\r\n\r\n\
            --b\r\nContent-ID: <6>\r\n\r\nGET /storage/v1/b/photos/o/x HTTP/1.1\r\n\r\n\r\n\
            --b--";
        let plan = prepare(
            body.as_bytes(),
            "multipart/mixed; boundary=b",
            &translator(&m, &up, Direction::ToPhysical),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let refusals: Vec<&str> = plan.refusals().collect();
        assert_eq!(
            refusals,
            [
                "empty_segment",
                "dot_segment",
                "method_override",
                "unknown_operation"
            ]
        );
        let local = plan.entries.iter().filter(|e| e.local.is_some()).count();
        assert_eq!(local, 5, "the unmapped bucket is refused but not counted");
    }

    #[test]
    fn all_refused_is_answered_locally() {
        let m = mapping();
        let up = upstream_base();
        let body = "--b\r\nContent-ID: <x>\r\n\r\nGET /storage/v1/b/nope HTTP/1.1\r\n\r\n\r\n--b--";
        let plan = prepare(
            body.as_bytes(),
            "multipart/mixed; boundary=b",
            &translator(&m, &up, Direction::ToPhysical),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(plan.upstream_body.is_none());
        let response = local_response(&plan);
        assert_eq!(response.status(), StatusCode::OK);
    }

    #[test]
    fn a_part_writing_to_a_fenced_entry_holds_the_batch_and_reads_go_on() {
        let fenced = crate::mapping::Mapping::new([
            ("photos".to_owned(), "photos-k3x9q2mw;fenced".to_owned()),
            ("logs".to_owned(), "logs-aaaa1111".to_owned()),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        // The PATCH writes to `photos`, in its path and its body.
        let plan = python_plan(&fenced);
        let held = plan.held().map(|e| e.kind);
        assert_eq!(held, Some(crate::policy::Kind::Moving));
        let up = upstream_base();
        let tr = translator(&fenced, &up, Direction::ToPhysical);
        let reads = "--b\r\nContent-ID: <1>\r\n\r\nGET /storage/v1/b/photos/o/x HTTP/1.1\r\n\r\n\r\n\
            --b\r\nContent-ID: <2>\r\n\r\nDELETE /storage/v1/b/logs/o/y HTTP/1.1\r\n\r\n\r\n--b--";
        let plan = prepare(reads.as_bytes(), "multipart/mixed; boundary=b", &tr)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(plan.held().is_none(), "{plan:?}");
        let upstream =
            String::from_utf8(plan.upstream_body.clone().unwrap_or_default()).unwrap_or_default();
        assert!(
            upstream.contains("GET /storage/v1/b/photos-k3x9q2mw/o/x HTTP/1.1"),
            "{upstream}"
        );
        assert!(
            upstream.contains("DELETE /storage/v1/b/logs-aaaa1111/o/y HTTP/1.1"),
            "{upstream}"
        );
        // Nothing fenced: nothing held.
        assert!(python_plan(&mapping()).held().is_none());
    }
}
