//! JSON API documents: the structured fields that carry bucket names, by
//! resource kind. Nothing else is touched; object names never are.
//!
//! Documents are not parsed into a tree. Each object on the way to a field
//! that may name a bucket is split into its members, borrowed from the body
//! ([`scan`]); members that need no change are copied back byte for byte
//! and only the rewritten ones are serialised anew. A metadata response is
//! rewritten on every proxied request, and this keeps that cost to a scan of
//! the body plus the few fields that change.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, Visitor};
use smallvec::SmallVec;

use super::scan;
use super::text::replace_bucket_tokens;
use super::url::push_rewritten_url;
use super::{Direction, Translator};
use crate::errors::ApiError;
use crate::route::Resource;

/// What a rewrite made of a JSON body.
#[derive(Debug, PartialEq, Eq)]
pub enum JsonBody {
    /// Empty, or nothing to change.
    Unchanged,
    /// The body to send instead.
    Changed(Vec<u8>),
    /// Not a UTF-8 JSON object: the rewriter cannot read it.
    Unreadable,
}

/// Rewrites a request's JSON body. Returns `Ok(None)` when nothing changes
/// or the body is empty, `Err` when a request names a bucket it may not use
/// or the body cannot be read: a body the rewriter cannot read is refused,
/// never forwarded as it came (callers check its shape first, with
/// [`super::strict::check_request_json`], for a precise message). Responses
/// use [`rewrite_json_body`], which says when a body cannot be read.
pub fn rewrite_json_bytes(
    body: &[u8],
    hint: Resource,
    tr: &Translator<'_>,
) -> Result<Option<Vec<u8>>, ApiError> {
    match rewrite_json_body(body, hint, tr)? {
        JsonBody::Changed(new) => Ok(Some(new)),
        JsonBody::Unchanged => Ok(None),
        JsonBody::Unreadable => Err(ApiError::bad_request(
            "bucketmap-sidecar refuses this JSON request body: it is not one JSON object \
             it can read"
                .to_owned(),
        )),
    }
}

/// Rewrites a JSON body, telling a body it cannot read from one it need
/// not change.
pub fn rewrite_json_body(
    body: &[u8],
    hint: Resource,
    tr: &Translator<'_>,
) -> Result<JsonBody, ApiError> {
    if super::strict::is_no_document(body) {
        return Ok(JsonBody::Unchanged);
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return Ok(JsonBody::Unreadable);
    };
    let Some(obj) = Object::parse_str(text) else {
        return Ok(JsonBody::Unreadable);
    };
    Ok(match document(obj, hint, tr)? {
        Some(new) => JsonBody::Changed(new),
        None => JsonBody::Unchanged,
    })
}

/// Rewrites a parsed document (test helper): the same path as bodies take.
#[cfg(test)]
pub(crate) fn rewrite_document(
    doc: &mut serde_json::Value,
    hint: Resource,
    tr: &Translator<'_>,
) -> Result<(), ApiError> {
    let body = serde_json::to_vec(doc).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Some(new) = rewrite_json_bytes(&body, hint, tr)? {
        *doc = serde_json::from_slice(&new).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    Ok(())
}

/// An error document or a resource.
fn document(
    mut obj: Object<'_>,
    hint: Resource,
    tr: &Translator<'_>,
) -> Result<Option<Vec<u8>>, ApiError> {
    if obj.has_object("error") {
        if tr.direction == Direction::ToLogical {
            obj.each_value("error", |error| Ok(rewrite_error(error, tr)))?;
        }
        return Ok(obj.into_json());
    }
    resource_members(&mut obj, hint, tr)?;
    Ok(obj.into_json())
}

fn kind_resource(kind: &str) -> Option<Resource> {
    Some(match kind {
        "storage#bucket" => Resource::Bucket,
        "storage#buckets" => Resource::Buckets,
        "storage#object" => Resource::Object,
        "storage#objects" => Resource::Objects,
        "storage#bucketAccessControl" | "storage#objectAccessControl" => Resource::Acl,
        "storage#bucketAccessControls" | "storage#objectAccessControls" => Resource::Acls,
        "storage#policy" => Resource::Policy,
        "storage#notification" => Resource::Notification,
        "storage#rewriteResponse" => Resource::RewriteResponse,
        "storage#composeRequest" => Resource::ComposeRequest,
        "storage#operation" => Resource::Operation,
        k if k.starts_with("storage#") => Resource::Generic,
        _ => return None,
    })
}

/// A resource nested in a document; `None` when it is unchanged or not an object.
fn resource(value: &str, hint: Resource, tr: &Translator<'_>) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(mut obj) = Object::parse_str(value) else {
        return Ok(None);
    };
    resource_members(&mut obj, hint, tr)?;
    Ok(obj.into_json())
}

/// Translates the members of a resource of the given kind (its `kind`
/// member, when known, wins over `hint`).
fn resource_members(
    obj: &mut Object<'_>,
    hint: Resource,
    tr: &Translator<'_>,
) -> Result<(), ApiError> {
    let kind = obj
        .string("kind")
        .as_deref()
        .and_then(kind_resource)
        .unwrap_or(hint);
    match kind {
        Resource::Buckets => bucket_list_members(obj, tr)?,
        Resource::Objects => items(obj, Resource::Object, tr)?,
        Resource::Acls => items(obj, Resource::Acl, tr)?,
        Resource::Bucket => bucket_members(obj, tr)?,
        Resource::Object => object_members(obj, tr)?,
        Resource::Acl => acl_members(obj, tr)?,
        Resource::Policy => resource_name(obj, "resourceId", tr)?,
        Resource::Notification => {
            link(obj, "selfLink", tr);
            items(obj, Resource::Notification, tr)?;
        }
        Resource::RewriteResponse => {
            obj.each_value("resource", |res| resource(res, Resource::Object, tr))?;
        }
        Resource::ComposeRequest => {
            obj.each_value("destination", |dest| resource(dest, Resource::Object, tr))?;
        }
        Resource::Operation => {
            resource_name(obj, "name", tr)?;
            link(obj, "selfLink", tr);
        }
        Resource::Generic => generic_members(obj, tr)?,
    }
    Ok(())
}

/// A bucket list's items; buckets the mapping does not know are hidden from
/// the application unless it may see unmapped buckets.
fn bucket_list_members(obj: &mut Object<'_>, tr: &Translator<'_>) -> Result<(), ApiError> {
    // Buckets the mapping does not know are not this app's: hide them.
    let hide = tr.direction == Direction::ToLogical && !tr.shows_unmapped();
    obj.each_array("items", |item| {
        if hide
            && let Some(bucket) = Object::parse_str(item)
            && let Some(name) = bucket.string("name")
            && tr.mapping.logical(&name).is_none()
        {
            return Ok(Element::Drop);
        }
        Ok(Element::from(resource(item, Resource::Bucket, tr)?))
    })?;
    Ok(())
}

/// A bucket's name, id, link, logging bucket and ACLs.
fn bucket_members(obj: &mut Object<'_>, tr: &Translator<'_>) -> Result<(), ApiError> {
    strict(obj, "name", tr)?;
    lenient(obj, "id", tr);
    link(obj, "selfLink", tr);
    obj.each_value("logging", |logging| {
        let Some(mut logging) = Object::parse_str(logging) else {
            return Ok(None);
        };
        strict(&mut logging, "logBucket", tr)?;
        Ok(logging.into_json())
    })?;
    each(obj, "acl", Resource::Acl, tr)?;
    each(obj, "defaultObjectAcl", Resource::Acl, tr)?;
    Ok(())
}

/// A resource of unknown kind: every member that may name a bucket.
fn generic_members(obj: &mut Object<'_>, tr: &Translator<'_>) -> Result<(), ApiError> {
    strict(obj, "bucket", tr)?;
    let _ = obj.each_string("id", |id, new| Ok(id_prefix(id, new, tr)));
    link(obj, "selfLink", tr);
    link(obj, "mediaLink", tr);
    resource_name(obj, "resourceId", tr)?;
    items(obj, Resource::Generic, tr)?;
    obj.each_value("resource", |res| resource(res, Resource::Generic, tr))?;
    Ok(())
}

fn items(obj: &mut Object<'_>, item: Resource, tr: &Translator<'_>) -> Result<(), ApiError> {
    each(obj, "items", item, tr)
}

fn each(
    obj: &mut Object<'_>,
    key: &str,
    item: Resource,
    tr: &Translator<'_>,
) -> Result<(), ApiError> {
    obj.each_array(key, |value| Ok(Element::from(resource(value, item, tr)?)))
}

/// An object's members, read in one pass: the object resource is in every
/// metadata response about an object, and a pass per field cost more than
/// the rewrite of the fields.
fn object_members(obj: &mut Object<'_>, tr: &Translator<'_>) -> Result<(), ApiError> {
    obj.each_member(|key, raw, out, scratch| object_or_acl_member(key, raw, out, scratch, tr, true))
}

/// An access control entry's members, in one pass (see [`object_members`]).
fn acl_members(obj: &mut Object<'_>, tr: &Translator<'_>) -> Result<(), ApiError> {
    obj.each_member(|key, raw, out, scratch| {
        object_or_acl_member(key, raw, out, scratch, tr, false)
    })
}

/// One member of an object (`object`) or of an access control entry, which
/// has the object's `bucket`, `id` and `selfLink`; see
/// [`Object::each_member`] for the arguments. One `match` for every member,
/// inlined: a second function call per member adds up over the many
/// members of an object resource, on every metadata response.
#[inline(always)]
fn object_or_acl_member(
    key: &str,
    raw: &str,
    out: &mut Vec<u8>,
    scratch: &mut String,
    tr: &Translator<'_>,
    object: bool,
) -> Result<bool, ApiError> {
    match key {
        "bucket" => string_member(raw, out, scratch, |name, new| strict_name(name, new, tr)),
        "id" => string_member(raw, out, scratch, |id, new| Ok(id_prefix(id, new, tr))),
        "selfLink" => string_member(raw, out, scratch, |url, new| link_value(url, new, tr)),
        "mediaLink" if object => {
            string_member(raw, out, scratch, |url, new| link_value(url, new, tr))
        }
        "acl" if object => array_member(raw, out, |acl| {
            Ok(Element::from(resource(acl, Resource::Acl, tr)?))
        }),
        _ => Ok(false),
    }
}

/// A field that names a bucket the request must be allowed to use.
fn strict(obj: &mut Object<'_>, key: &str, tr: &Translator<'_>) -> Result<(), ApiError> {
    obj.each_string(key, |name, new| strict_name(name, new, tr))
}

/// Writes the translation of `name`, a bucket the request must be allowed
/// to use, into `new`; `false` when it stays as it is.
fn strict_name(name: &str, new: &mut String, tr: &Translator<'_>) -> Result<bool, ApiError> {
    if name.is_empty() {
        return Ok(false);
    }
    Ok(tr
        .bucket_str(name)?
        .map(|name| new.push_str(name))
        .is_some())
}

/// A field equal to a bucket name, informational only.
fn lenient(obj: &mut Object<'_>, key: &str, tr: &Translator<'_>) {
    let _ = obj.each_string(key, |name, new| {
        Ok(tr
            .bucket_lenient_str(name)
            .map(|name| new.push_str(name))
            .is_some())
    });
}

/// Writes `id` with its first `/`-separated component, the bucket
/// (`B/OBJECT/GEN`, `B/entity`), translated into `new`; `false` when the
/// mapping does not know it.
fn id_prefix(id: &str, new: &mut String, tr: &Translator<'_>) -> bool {
    let (bucket, rest) = id.split_at(memchr::memchr(b'/', id.as_bytes()).unwrap_or(id.len()));
    let Some(bucket) = tr.bucket_lenient_str(bucket) else {
        return false;
    };
    new.push_str(bucket);
    new.push_str(rest);
    true
}

fn link(obj: &mut Object<'_>, key: &str, tr: &Translator<'_>) {
    let _ = obj.each_string(key, |url, new| link_value(url, new, tr));
}

/// Writes `url`, a link, pointed at `tr.links` and with its buckets
/// translated, into `new`; `false` when it is not an absolute http(s) URL.
fn link_value(url: &str, new: &mut String, tr: &Translator<'_>) -> Result<bool, ApiError> {
    Ok(push_rewritten_url(new, url, tr))
}

/// A resource name `projects/_/buckets/B[/…]`.
fn resource_name(obj: &mut Object<'_>, key: &str, tr: &Translator<'_>) -> Result<(), ApiError> {
    const PREFIX: &str = "projects/_/buckets/";
    obj.each_string(key, |name, new| {
        let Some(after) = name.strip_prefix(PREFIX) else {
            return Ok(false);
        };
        let (bucket, rest) = after.split_at(after.find('/').unwrap_or(after.len()));
        if bucket.is_empty() {
            return Ok(false);
        }
        let Some(bucket) = tr.bucket_str(bucket)? else {
            return Ok(false);
        };
        new.push_str(PREFIX);
        new.push_str(bucket);
        new.push_str(rest);
        Ok(true)
    })
}

/// The `error` object of an error document: bucket names in its messages.
fn rewrite_error(error: &str, tr: &Translator<'_>) -> Option<Vec<u8>> {
    let mut error = Object::parse_str(error)?;
    let message = |text: &str, new: &mut String| {
        let replaced = replace_bucket_tokens(text, |name| tr.bucket_lenient(name));
        let changed = matches!(replaced, Cow::Owned(_));
        new.push_str(&replaced);
        Ok(changed)
    };
    let _ = error.each_string("message", message);
    let _ = error.each_array("errors", |entry| {
        let Some(mut entry) = Object::parse_str(entry) else {
            return Ok(Element::Keep);
        };
        entry.each_string("message", message)?;
        Ok(Element::from(entry.into_json()))
    });
    error.into_json()
}

/// A JSON object split into its members, in order (duplicates included:
/// every member with a key is rewritten, so a repeated key cannot smuggle an
/// untranslated name past the checks).
///
/// A member is 32 bytes, so that the members of a resource fit in one
/// allocation glibc serves from its per-thread cache, and every rewritten
/// value is written into one buffer, `new_values`: a metadata response is
/// rewritten on every proxied request, and allocating for each member and
/// value cost more than the rewrite itself.
struct Object<'a> {
    /// The object's text, as it came.
    text: &'a str,
    /// Each member's key and its value's text as it came (a slice of `text`).
    members: Vec<(Key<'a>, &'a str)>,
    /// The keys that had escapes, decoded.
    decoded_keys: Vec<String>,
    /// The rewritten values, serialised, one after another.
    new_values: Vec<u8>,
    /// For each rewritten value: the range of `text` it replaces and its
    /// range in `new_values`.
    changes: SmallVec<[(Range<usize>, Range<usize>); 8]>,
    /// Where a rewrite writes a new string before it is serialised.
    scratch: String,
}

/// A member's key.
#[derive(Clone, Copy)]
enum Key<'a> {
    /// A key without escapes: its text in the object's.
    Text(&'a str),
    /// A key with escapes: its place in [`Object::decoded_keys`].
    Decoded(usize),
}

// 32 members of 32 bytes: one allocation from glibc's per-thread cache.
const _: () = assert!(std::mem::size_of::<(Key<'static>, &str)>() == 32);

/// Bytes reserved for an object's rewritten values: enough for the few
/// members of a resource that change (its bucket, id and two links).
const NEW_VALUES_ROOM: usize = 512;

/// What becomes of an array element.
enum Element {
    Keep,
    Replace(Vec<u8>),
    Drop,
}

impl From<Option<Vec<u8>>> for Element {
    fn from(new: Option<Vec<u8>>) -> Self {
        new.map_or(Element::Keep, Element::Replace)
    }
}

impl<'a> Object<'a> {
    /// `None` when `text` is not a JSON object (whole documents included:
    /// trailing garbage fails).
    fn parse_str(text: &'a str) -> Option<Self> {
        let mut decoded_keys = Vec::new();
        let members = scan::object_members(text, |key, raw, _| match key {
            Cow::Borrowed(key) => (Key::Text(key), raw),
            Cow::Owned(key) => {
                decoded_keys.push(key);
                (Key::Decoded(decoded_keys.len() - 1), raw)
            }
        })?;
        Some(Object {
            text,
            members,
            decoded_keys,
            new_values: Vec::new(),
            changes: SmallVec::new(),
            scratch: String::new(),
        })
    }

    /// The values as they came (not rewritten yet) of the members named `key`.
    fn raw_values(&self, key: &str) -> impl Iterator<Item = &'a str> {
        self.members
            .iter()
            .filter(move |&&(k, raw)| self.key_is(k, key) && !self.is_changed(self.offset(raw)))
            .map(|&(_, raw)| raw)
    }

    fn key_is(&self, k: Key<'_>, key: &str) -> bool {
        key_text(&self.decoded_keys, k) == Some(key)
    }

    /// Where `raw`, a value of this object, starts in its text.
    fn offset(&self, raw: &str) -> usize {
        raw.as_ptr() as usize - self.text.as_ptr() as usize
    }

    fn is_changed(&self, at: usize) -> bool {
        self.changes.iter().any(|(old, _)| old.start == at)
    }

    /// The first string member named `key`.
    fn string(&self, key: &str) -> Option<Cow<'a, str>> {
        self.raw_values(key).find_map(string_value)
    }

    fn has_object(&self, key: &str) -> bool {
        self.raw_values(key).any(|raw| raw.starts_with('{'))
    }

    /// Calls `write` on every member not rewritten yet, with its key, its
    /// value, the buffer of new values and the scratch string; when it
    /// answers `true`, what it appended to the buffer is the member's new
    /// value.
    fn each_member(
        &mut self,
        mut write: impl FnMut(&str, &'a str, &mut Vec<u8>, &mut String) -> Result<bool, ApiError>,
    ) -> Result<(), ApiError> {
        for &(k, raw) in &self.members {
            let at = self.offset(raw);
            if self.is_changed(at) {
                continue;
            }
            let Some(key) = key_text(&self.decoded_keys, k) else {
                continue;
            };
            let start = self.new_values.len();
            if write(key, raw, &mut self.new_values, &mut self.scratch)? {
                let new = start..self.new_values.len();
                self.changes.push((at..at + raw.len(), new));
            } else {
                self.new_values.truncate(start);
            }
        }
        Ok(())
    }

    /// Calls `write` on every member named `key` not rewritten yet (see
    /// [`Object::each_member`]).
    fn each_raw(
        &mut self,
        key: &str,
        mut write: impl FnMut(&'a str, &mut Vec<u8>, &mut String) -> Result<bool, ApiError>,
    ) -> Result<(), ApiError> {
        self.each_member(|k, raw, out, scratch| match k == key {
            true => write(raw, out, scratch),
            false => Ok(false),
        })
    }

    /// Calls `f` on every member named `key`; a `Some` answer replaces it.
    fn each_value(
        &mut self,
        key: &str,
        mut f: impl FnMut(&'a str) -> Result<Option<Vec<u8>>, ApiError>,
    ) -> Result<(), ApiError> {
        self.each_raw(key, |raw, out, _| {
            let new = f(raw)?;
            if let Some(new) = &new {
                out.extend_from_slice(new);
            }
            Ok(new.is_some())
        })
    }

    /// Calls `f` on every string member named `key` (see [`string_member`]).
    fn each_string(
        &mut self,
        key: &str,
        mut f: impl FnMut(&str, &mut String) -> Result<bool, ApiError>,
    ) -> Result<(), ApiError> {
        self.each_raw(key, |raw, out, scratch| {
            string_member(raw, out, scratch, &mut f)
        })
    }

    /// Calls `f` on every element of every array member named `key` (see
    /// [`array_member`]).
    fn each_array(
        &mut self,
        key: &str,
        mut f: impl FnMut(&'a str) -> Result<Element, ApiError>,
    ) -> Result<(), ApiError> {
        self.each_raw(key, |raw, out, _| array_member(raw, out, &mut f))
    }

    /// The object's text with the rewritten values in place of the old
    /// ones (everything else as it came, whitespace included), or `None`
    /// when nothing changed.
    fn into_json(mut self) -> Option<Vec<u8>> {
        if self.changes.is_empty() {
            return None;
        }
        self.changes.sort_unstable_by_key(|(old, _)| old.start);
        let text = self.text.as_bytes();
        // Exactly the length of the result: a vector as long as its
        // capacity becomes `Bytes` without another allocation.
        let length = self.changes.iter().fold(text.len(), |n, (old, new)| {
            (n + new.len()).saturating_sub(old.len())
        });
        let mut out = Vec::with_capacity(length);
        let mut at = 0;
        for (old, new) in &self.changes {
            out.extend_from_slice(&text[at..old.start]);
            out.extend_from_slice(&self.new_values[new.clone()]);
            at = old.end;
        }
        out.extend_from_slice(&text[at..]);
        Some(out)
    }
}

/// A member's key as text: its own, or its decoded form in `decoded`.
fn key_text<'k>(decoded: &'k [String], k: Key<'k>) -> Option<&'k str> {
    match k {
        Key::Text(text) => Some(text),
        Key::Decoded(i) => decoded.get(i).map(String::as_str),
    }
}

/// Room in `out` for a new value in place of `raw`; the first reservation
/// is for all of an object's few rewrites.
fn room(out: &mut Vec<u8>, raw: &str) {
    if out.capacity() == 0 {
        out.reserve(NEW_VALUES_ROOM);
    }
    out.reserve(raw.len());
}

/// A string member's value `raw`: `f` gets the string and an empty one to
/// write its new value into; when it answers `true`, that value, serialised
/// into `out`, replaces the member.
fn string_member(
    raw: &str,
    out: &mut Vec<u8>,
    scratch: &mut String,
    mut f: impl FnMut(&str, &mut String) -> Result<bool, ApiError>,
) -> Result<bool, ApiError> {
    let Some(text) = string_value(raw) else {
        return Ok(false);
    };
    scratch.clear();
    scratch.reserve(raw.len().max(NEW_VALUES_ROOM / 2));
    if !f(&text, scratch)? {
        return Ok(false);
    }
    room(out, raw);
    push_json_string(out, scratch);
    Ok(true)
}

/// An array member's value `raw`: `f` decides of each element; the new
/// array goes to `out` when one changed.
fn array_member<'a>(
    raw: &'a str,
    out: &mut Vec<u8>,
    mut f: impl FnMut(&'a str) -> Result<Element, ApiError>,
) -> Result<bool, ApiError> {
    if !raw.starts_with('[') {
        return Ok(false);
    }
    let Some(elements) = scan::array_elements(raw) else {
        return Ok(false);
    };
    room(out, raw);
    let mut changed = false;
    out.push(b'[');
    let mut first = true;
    for element in elements {
        let new = f(element)?;
        changed |= !matches!(new, Element::Keep);
        let bytes = match &new {
            Element::Keep => element.as_bytes(),
            Element::Replace(bytes) => bytes,
            Element::Drop => continue,
        };
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(bytes);
    }
    out.push(b']');
    Ok(changed)
}

/// A JSON string value, borrowed when it has no escapes.
fn string_value(raw: &str) -> Option<Cow<'_, str>> {
    let text = raw;
    if !text.starts_with('"') {
        return None;
    }
    // A raw value is valid JSON: a string without escapes is its own text.
    if let Some(inner) = text[1..].strip_suffix('"')
        && memchr::memchr(b'\\', inner.as_bytes()).is_none()
    {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<Text<'_>>(text).ok().map(|t| t.0)
}

/// Appends `text` to `out` as a JSON string.
fn push_json_string(out: &mut Vec<u8>, text: &str) {
    // Nothing to escape (the usual case: names, ids, links): quotes around.
    if scan::plain_run(text.as_bytes()) == text.len() {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
        return;
    }
    // Serialising a string into a vector cannot fail.
    let _ = serde_json::to_writer(out, text);
}

/// A JSON string (a member's key or a string value), borrowed from the body
/// when it has no escapes, owned otherwise.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    use super::*;
    use serde_json::json;

    proptest::proptest! {
        #[test]
        fn strings_are_written_and_read_as_serde_json_does(text in "\\PC{0,12}|[\"\\\\\\x00-\\x1fa/é]{0,8}") {
            let mut written = Vec::new();
            push_json_string(&mut written, &text);
            proptest::prop_assert_eq!(&written, &serde_json::to_vec(&text).unwrap_or_default());
            let raw = std::str::from_utf8(&written).unwrap_or_else(|e| panic!("{e}"));
            let read = string_value(raw);
            proptest::prop_assert_eq!(read.as_deref(), Some(text.as_str()));
        }
    }

    #[test]
    fn object_response_fields() {
        let (m, links) = (mapping(), sidecar_base());
        let mut doc = json!({
            "kind": "storage#object",
            "id": "photos-k3x9q2mw/photos-k3x9q2mw/a.jpg/17",
            "name": "photos-k3x9q2mw/a.jpg",
            "bucket": "photos-k3x9q2mw",
            "selfLink": "https://www.googleapis.com/storage/v1/b/photos-k3x9q2mw/o/photos-k3x9q2mw%2Fa.jpg",
            "mediaLink": "https://storage.googleapis.com/download/storage/v1/b/photos-k3x9q2mw/o/photos-k3x9q2mw%2Fa.jpg?generation=17&alt=media",
            "metadata": {"bucket": "photos-k3x9q2mw"},
            "acl": [{"kind": "storage#objectAccessControl", "bucket": "photos-k3x9q2mw", "id": "photos-k3x9q2mw/photos-k3x9q2mw/a.jpg/17/user-x"}],
        });
        rewrite_document(
            &mut doc,
            Resource::Object,
            &translator(&m, &links, Direction::ToLogical),
        )
        .expect("rewrites");
        assert_eq!(doc["bucket"], "photos");
        assert_eq!(
            doc["name"], "photos-k3x9q2mw/a.jpg",
            "object names are data"
        );
        assert_eq!(
            doc["metadata"]["bucket"], "photos-k3x9q2mw",
            "custom metadata is data"
        );
        assert_eq!(doc["id"], "photos/photos-k3x9q2mw/a.jpg/17");
        assert_eq!(
            doc["selfLink"],
            "http://127.0.0.1:9023/storage/v1/b/photos/o/photos-k3x9q2mw%2Fa.jpg"
        );
        assert_eq!(
            doc["mediaLink"],
            "http://127.0.0.1:9023/download/storage/v1/b/photos/o/photos-k3x9q2mw%2Fa.jpg?generation=17&alt=media"
        );
        assert_eq!(doc["acl"][0]["bucket"], "photos");
        assert_eq!(
            doc["acl"][0]["id"],
            "photos/photos-k3x9q2mw/a.jpg/17/user-x"
        );
    }

    #[test]
    fn a_rewritten_body_fills_its_buffer_exactly() {
        // `Bytes::from` takes a vector as long as its capacity without
        // allocating again.
        let (m, links) = (mapping(), sidecar_base());
        let tr = translator(&m, &links, Direction::ToLogical);
        let body = br#"{"kind": "storage#object", "bucket": "photos-k3x9q2mw",
            "id": "photos-k3x9q2mw/x/1", "name": "x",
            "selfLink": "https://www.googleapis.com/storage/v1/b/photos-k3x9q2mw/o/x",
            "acl": [{"bucket": "photos-k3x9q2mw", "entity": "user-x"}]}"#;
        let JsonBody::Changed(new) =
            rewrite_json_body(body, Resource::Object, &tr).expect("rewrites")
        else {
            panic!("the body changes");
        };
        assert_eq!(new.len(), new.capacity());
        let text = String::from_utf8_lossy(&new);
        assert!(text.contains(r#""bucket": "photos","#), "{text}");
        assert!(
            text.contains(r#"[{"bucket": "photos", "entity": "user-x"}]"#),
            "{text}"
        );
    }

    #[test]
    fn bucket_list_hides_buckets_that_are_not_mapped() {
        let (m, links) = (mapping(), sidecar_base());
        let mut doc = json!({"kind": "storage#buckets", "items": [
            {"kind": "storage#bucket", "name": "photos-k3x9q2mw", "id": "photos-k3x9q2mw",
             "logging": {"logBucket": "logs-aaaa1111"}, "defaultObjectAcl": [{"bucket": "photos-k3x9q2mw"}]},
            {"kind": "storage#bucket", "name": "someone-elses", "id": "someone-elses"},
        ]});
        rewrite_document(
            &mut doc,
            Resource::Buckets,
            &translator(&m, &links, Direction::ToLogical),
        )
        .expect("rewrites");
        assert_eq!(doc["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(doc["items"][0]["name"], "photos");
        assert_eq!(doc["items"][0]["id"], "photos");
        assert_eq!(doc["items"][0]["logging"]["logBucket"], "logs");
        assert_eq!(doc["items"][0]["defaultObjectAcl"][0]["bucket"], "photos");
    }

    #[test]
    fn request_bodies_are_translated_strictly() {
        let (m, links) = (mapping(), upstream_base());
        let t = translator(&m, &links, Direction::ToPhysical);
        let mut compose = json!({"destination": {"bucket": "photos", "name": "x", "contentType": "a/b"}, "sourceObjects": [{"name": "photos"}]});
        rewrite_document(&mut compose, Resource::ComposeRequest, &t).expect("rewrites");
        assert_eq!(compose["destination"]["bucket"], "photos-k3x9q2mw");
        assert_eq!(compose["sourceObjects"][0]["name"], "photos");

        let mut policy = json!({"resourceId": "projects/_/buckets/photos", "bindings": [{"role": "r", "condition": {"expression": "photos"}}]});
        rewrite_document(&mut policy, Resource::Policy, &t).expect("rewrites");
        assert_eq!(policy["resourceId"], "projects/_/buckets/photos-k3x9q2mw");
        assert_eq!(policy["bindings"][0]["condition"]["expression"], "photos");

        let mut insert = json!({"name": "unmapped"});
        let err =
            rewrite_document(&mut insert, Resource::Bucket, &t).map_err(|e| e.status.as_u16());
        assert_eq!(err, Err(404));
        let mut physical = json!({"bucket": "logs-aaaa1111", "name": "o"});
        let err =
            rewrite_document(&mut physical, Resource::Object, &t).map_err(|e| e.status.as_u16());
        assert_eq!(err, Err(403));
    }

    #[test]
    fn error_messages_name_the_logical_bucket() {
        let (m, links) = (mapping(), sidecar_base());
        let mut doc = json!({"error": {"code": 404, "message": "No such object: photos-k3x9q2mw/a",
            "errors": [{"message": "No such object: photos-k3x9q2mw/a", "reason": "notFound"}]}});
        rewrite_document(
            &mut doc,
            Resource::Object,
            &translator(&m, &links, Direction::ToLogical),
        )
        .expect("rewrites");
        assert_eq!(doc["error"]["message"], "No such object: photos/a");
        assert_eq!(
            doc["error"]["errors"][0]["message"],
            "No such object: photos/a"
        );
    }

    /// A request body the rewriter cannot read is refused, whatever the
    /// caller checked before: it is never forwarded as it came.
    #[test]
    fn request_bodies_it_cannot_read_are_refused() {
        let (m, links) = (mapping(), sidecar_base());
        let to_physical = translator(&m, &links, Direction::ToPhysical);
        let unreadable: [&[u8]; 6] = [
            b"[{\"bucket\": \"photos\"}]",
            b"\"photos\"",
            b"{\"bucket\": \"photos\"",
            b"{\"bucket\": \"photos\"} {}",
            b"\xff{}",
            b"nul",
        ];
        for body in unreadable {
            let got = rewrite_json_bytes(body, Resource::Object, &to_physical)
                .map_err(|e| e.status.as_u16());
            assert_eq!(got, Err(400), "{}", String::from_utf8_lossy(body));
        }
        for nothing in [&b" \n"[..], b"null", b" null\n"] {
            assert_eq!(
                rewrite_json_bytes(nothing, Resource::Object, &to_physical).ok(),
                Some(None),
                "no document is sent as it is: {}",
                String::from_utf8_lossy(nothing)
            );
        }
    }

    #[test]
    fn untouched_members_keep_their_bytes_and_repeated_keys_are_all_checked() {
        let (m, links) = (mapping(), sidecar_base());
        let to_logical = translator(&m, &links, Direction::ToLogical);
        let body = br#"{ "kind" : "storage#object", "bu\u0063ket": "photos-k3x9q2mw",
            "metadata": {"note": "caf\u00e9 \"photos-k3x9q2mw\"", "n": [1.50, 2e3]}, "size": "7" }"#;
        let new = rewrite_json_bytes(body, Resource::Object, &to_logical)
            .ok()
            .flatten()
            .expect("the escaped key is the bucket field");
        let text = String::from_utf8(new).expect("UTF-8");
        assert!(
            text.contains(r#"{ "kind" : "storage#object", "bu\u0063ket": "photos","#),
            "only the value changes, keys and spacing stay: {text}"
        );
        assert!(
            text.contains(r#"{"note": "caf\u00e9 \"photos-k3x9q2mw\"", "n": [1.50, 2e3]}"#),
            "other members are copied byte for byte: {text}"
        );
        let unchanged =
            br#"{"kind": "storage#object", "bucket": "not-mapped", "name": "photos-k3x9q2mw"}"#;
        assert_eq!(
            rewrite_json_bytes(unchanged, Resource::Object, &to_logical).ok(),
            Some(None),
            "nothing to change: the body is forwarded as it came"
        );

        let to_physical = translator(&m, &links, Direction::ToPhysical);
        let smuggled = br#"{"bucket": "photos", "name": "o", "bucket": "logs-aaaa1111"}"#;
        let err = rewrite_json_bytes(smuggled, Resource::Object, &to_physical)
            .map_err(|e| e.status.as_u16());
        assert_eq!(err, Err(403), "the second bucket member is a physical name");
        let both = br#"{"bucket": "photos", "bucket": "logs"}"#;
        let new = rewrite_json_bytes(both, Resource::Object, &to_physical)
            .ok()
            .flatten()
            .expect("rewritten");
        assert_eq!(
            new,
            br#"{"bucket": "photos-k3x9q2mw", "bucket": "logs-aaaa1111"}"#.to_vec()
        );
    }

    #[test]
    fn empty_bodies_are_left_alone_and_non_json_is_refused() {
        let (m, links) = (mapping(), sidecar_base());
        let t = translator(&m, &links, Direction::ToLogical);
        assert_eq!(
            rewrite_json_bytes(b"", Resource::Object, &t).ok(),
            Some(None)
        );
        assert_eq!(
            rewrite_json_bytes(b"not json", Resource::Object, &t).map_err(|e| e.status.as_u16()),
            Err(400)
        );
        assert!(
            rewrite_json_bytes(b"{\"bucket\":\"photos-k3x9q2mw\"}", Resource::Object, &t)
                .ok()
                .flatten()
                .is_some()
        );
    }
}
