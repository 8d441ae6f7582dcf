//! Bucket names rewritten in serialized protobuf messages, at the wire level.
//!
//! The walker reads fields in order and looks each one up in the generated
//! table ([`super::schema::MESSAGES`]); only the fields that hold bucket
//! names (directly or nested) are decoded. Every other field — unknown to
//! the table, unknown to the sidecar's protos, object data — reaches the
//! other side byte for byte, in its place.
//!
//! A walk first builds a [`Plan`] (which fields change, and the new lengths
//! of the nested messages that hold them) without copying anything; when
//! nothing changes the original bytes are forwarded (zero copy). Otherwise
//! the output is written once, with the exact capacity, the unchanged spans
//! copied from the input.
//!
//! Requests (logical → physical) are checked strictly: a malformed message,
//! a bucket field of the wrong wire type or shape, or a name the mapping
//! refuses is an error. Responses come from the trusted upstream: whatever
//! cannot be read is forwarded as it is.

use std::ops::Range;

use super::status::Status;
use bytes::{Bytes, BytesMut};
use prost::DecodeError;
use prost::encoding::{
    DecodeContext, WireType, decode_key, decode_varint, encode_varint, encoded_len_varint,
    skip_field,
};

use super::resource::{bucket_range, expected_shape};
use super::schema::MESSAGES;
use super::table::{Field, Kind, Message};
use crate::mapping::Mapping;
use crate::rewrite::text::replace_bucket_tokens;
use crate::rewrite::{Direction, Translator};

/// How deep messages may nest before a request is refused.
pub const MAX_DEPTH: usize = 32;

/// Rewrites the bucket names in one serialized protobuf message of type
/// `schema::MESSAGES[message]`. Ok(None): nothing to change (forward the
/// original bytes, zero copy). Ok(Some(bytes)): the rewritten message.
///
/// Errors (requests only; a response that cannot be read is forwarded
/// unchanged): `INVALID_ARGUMENT` for a malformed message or bucket field,
/// `NOT_FOUND` for an unknown bucket, `PERMISSION_DENIED` for a physical
/// name used where it is refused; `INTERNAL` for a `message` index outside
/// the table.
pub fn rewrite_message(
    msg: &Bytes,
    message: usize,
    t: &Translator<'_>,
) -> Result<Option<Bytes>, Status> {
    let Some(schema) = MESSAGES.get(message) else {
        return Err(Status::internal(format!(
            "no message type #{message} in the gRPC bucket-name table"
        )));
    };
    let walker = Walker {
        t,
        request: t.direction == Direction::ToPhysical,
    };
    match walker.walk(msg, schema, 0) {
        Ok(walked) => Ok(walked.plan.map(|plan| render(msg, &plan))),
        Err(status) if walker.request => Err(status),
        Err(_) => Ok(None),
    }
}

/// Whether `rewrite_message` would leave a message of type
/// `schema::MESSAGES[message]` as it is, judged from its payload in pieces
/// (`parts`, the data frames it came in) without joining them: every
/// top-level field is well formed and none is one the table holds. `false`
/// when that cannot be told cheaply (a field of the table, a group, a
/// malformed field): then the whole message goes through
/// [`rewrite_message`], which decides, so that a message judged here
/// meets exactly the checks it would meet there. Object data (the
/// `checksummed_data` of reads and writes) is in fields the table does not
/// hold: it is skipped by its length, unread.
pub fn unchanged_at_top(parts: &[&[u8]], message: usize) -> bool {
    let Some(schema) = MESSAGES.get(message) else {
        return false;
    };
    let mut cursor = Pieces { parts, at: (0, 0) };
    while !cursor.is_empty() {
        let Some((number, wire_type)) = cursor.varint_with(|b| decode_key(b)) else {
            return false;
        };
        if schema.field(number).is_some() {
            return false;
        }
        let skipped = match wire_type {
            WireType::Varint => cursor.varint_with(|b| decode_varint(b)).is_some(),
            WireType::SixtyFourBit => cursor.skip(8),
            WireType::ThirtyTwoBit => cursor.skip(4),
            WireType::LengthDelimited => cursor
                .varint_with(|b| decode_varint(b))
                .and_then(|len| usize::try_from(len).ok())
                .is_some_and(|len| cursor.skip(len)),
            WireType::StartGroup | WireType::EndGroup => false,
        };
        if !skipped {
            return false;
        }
    }
    true
}

/// Whether a request message of type `schema::MESSAGES[message]` finishes
/// a write: a `WriteObjectRequest` or `BidiWriteObjectRequest` with
/// `finish_write` set (the last value given wins, as protobuf reads it).
/// GCS commits no object of a write stream before that message, so the
/// shell cuts off a write in flight only until it has forwarded it. A
/// message it cannot read does not finish anything.
pub fn finishes_write(msg: &[u8], message: usize) -> bool {
    let number = match MESSAGES.get(message).map(|m| m.name) {
        Some("google.storage.v2.WriteObjectRequest") => 7,
        Some("google.storage.v2.BidiWriteObjectRequest") => 9,
        _ => return false,
    };
    let mut buf = msg;
    let mut finishes = false;
    while !buf.is_empty() {
        let Ok((field, wire_type)) = decode_key(&mut buf) else {
            return false;
        };
        if field == number && wire_type == WireType::Varint {
            match decode_varint(&mut buf) {
                Ok(value) => finishes = value != 0,
                Err(_) => return false,
            }
        } else if skip_field(wire_type, field, &mut buf, DecodeContext::default()).is_err() {
            return false;
        }
    }
    finishes
}

/// A read position in a message held in pieces.
struct Pieces<'a> {
    parts: &'a [&'a [u8]],
    /// The piece, and the offset in it.
    at: (usize, usize),
}

impl Pieces<'_> {
    fn is_empty(&self) -> bool {
        let (mut part, mut offset) = self.at;
        while let Some(p) = self.parts.get(part) {
            if offset < p.len() {
                return false;
            }
            (part, offset) = (part + 1, 0);
        }
        true
    }

    /// Decodes a varint (or a key) with `decode` from the next bytes, at
    /// most ten, as prost reads it from one buffer; moves past it.
    fn varint_with<T>(
        &mut self,
        decode: impl FnOnce(&mut &[u8]) -> Result<T, DecodeError>,
    ) -> Option<T> {
        let mut bytes = [0u8; 10];
        let mut n = 0;
        let (mut part, mut offset) = self.at;
        while n < bytes.len() {
            let Some(p) = self.parts.get(part) else { break };
            let take = (p.len() - offset).min(bytes.len() - n);
            bytes[n..n + take].copy_from_slice(&p[offset..offset + take]);
            n += take;
            (part, offset) = (part + 1, 0);
        }
        let mut rest = &bytes[..n];
        let value = decode(&mut rest).ok()?;
        self.skip(n - rest.len()).then_some(value)
    }

    /// Moves `n` bytes on; `false` when fewer are left.
    fn skip(&mut self, mut n: usize) -> bool {
        let (mut part, mut offset) = self.at;
        loop {
            let Some(p) = self.parts.get(part) else {
                return n == 0;
            };
            let left = p.len() - offset;
            if n <= left {
                self.at = (part, offset + n);
                return true;
            }
            n -= left;
            (part, offset) = (part + 1, 0);
        }
    }
}

/// What changes in one message.
#[derive(Debug)]
struct Plan {
    /// Changed fields, in wire order.
    edits: Vec<Edit>,
    /// The length of the rewritten message.
    len: usize,
}

/// One changed field; positions are offsets into the message's bytes.
#[derive(Debug)]
struct Edit {
    /// Where the field (its key) starts.
    start: usize,
    /// Where its key ends and its length prefix starts.
    key_end: usize,
    /// Its value (after the length prefix).
    value: Range<usize>,
    change: Change,
}

#[derive(Debug)]
enum Change {
    /// The field is left out.
    Drop,
    /// A new string value.
    Text(String),
    /// The nested message, rewritten.
    Nested(Plan),
}

impl Edit {
    /// The length of the field once rewritten.
    fn new_len(&self) -> usize {
        let body = match &self.change {
            Change::Drop => return 0,
            Change::Text(text) => text.len(),
            Change::Nested(plan) => plan.len,
        };
        (self.key_end - self.start) + encoded_len_varint(body as u64) + body
    }
}

/// Collects the edits of one message and its new length.
struct PlanBuilder {
    edits: Vec<Edit>,
    len: usize,
}

impl PlanBuilder {
    fn new(len: usize) -> Self {
        Self {
            edits: Vec::new(),
            len,
        }
    }

    fn push(&mut self, field: &Delimited, change: Change) {
        let edit = Edit {
            start: field.start,
            key_end: field.key_end,
            value: field.value.clone(),
            change,
        };
        self.len = self.len - (field.value.end - field.start) + edit.new_len();
        self.edits.push(edit);
    }

    fn finish(self) -> Option<Plan> {
        (!self.edits.is_empty()).then_some(Plan {
            edits: self.edits,
            len: self.len,
        })
    }
}

/// Writes the message `buf` rewritten by `plan`, in one allocation.
fn render(buf: &[u8], plan: &Plan) -> Bytes {
    let mut out = BytesMut::with_capacity(plan.len);
    emit(buf, plan, &mut out);
    out.freeze()
}

fn emit(buf: &[u8], plan: &Plan, out: &mut BytesMut) {
    let mut copied = 0;
    for edit in &plan.edits {
        out.extend_from_slice(&buf[copied..edit.start]);
        copied = edit.value.end;
        let key = &buf[edit.start..edit.key_end];
        match &edit.change {
            Change::Drop => {}
            Change::Text(text) => {
                out.extend_from_slice(key);
                encode_varint(text.len() as u64, out);
                out.extend_from_slice(text.as_bytes());
            }
            Change::Nested(nested) => {
                out.extend_from_slice(key);
                encode_varint(nested.len as u64, out);
                emit(&buf[edit.value.clone()], nested, out);
            }
        }
    }
    out.extend_from_slice(&buf[copied..]);
}

/// Reads the fields of one message, in order.
struct Reader<'b> {
    buf: &'b [u8],
    rest: &'b [u8],
}

/// A length-delimited field.
struct Delimited {
    start: usize,
    key_end: usize,
    value: Range<usize>,
}

impl<'b> Reader<'b> {
    fn new(buf: &'b [u8]) -> Self {
        Self { buf, rest: buf }
    }

    fn offset(&self) -> usize {
        self.buf.len() - self.rest.len()
    }

    /// The next field's number, wire type and start; `None` at the end.
    fn key(&mut self) -> Result<Option<(u32, WireType, usize)>, DecodeError> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let start = self.offset();
        let (number, wire_type) = decode_key(&mut self.rest)?;
        Ok(Some((number, wire_type, start)))
    }

    /// Skips the value of a field whose key was just read.
    fn skip(&mut self, number: u32, wire_type: WireType) -> Result<(), DecodeError> {
        skip_field(wire_type, number, &mut self.rest, DecodeContext::default())
    }

    /// Reads the length and value of a length-delimited field whose key
    /// (starting at `start`) was just read.
    fn delimited(&mut self, start: usize) -> Result<Delimited, ReadError> {
        let key_end = self.offset();
        let len = decode_varint(&mut self.rest)?;
        let fits = usize::try_from(len).ok().filter(|&n| n <= self.rest.len());
        let Some(n) = fits else {
            return Err(ReadError::PastEnd { len });
        };
        let value_start = self.offset();
        self.rest = &self.rest[n..];
        Ok(Delimited {
            start,
            key_end,
            value: value_start..value_start + n,
        })
    }
}

/// Why a field could not be read.
#[derive(Debug)]
enum ReadError {
    /// A bad key or varint, a group out of place.
    Decode(DecodeError),
    /// A length-delimited value longer than what is left of the message.
    PastEnd { len: u64 },
}

impl From<DecodeError> for ReadError {
    fn from(e: DecodeError) -> Self {
        Self::Decode(e)
    }
}

/// The result of walking one message.
struct Walked {
    plan: Option<Plan>,
    /// In a response: a bucket name field named a bucket the map does not hold.
    unmapped: bool,
}

/// Walks messages of the table in one direction.
struct Walker<'a, 't> {
    t: &'a Translator<'t>,
    request: bool,
}

impl Walker<'_, '_> {
    fn walk(&self, buf: &[u8], schema: &Message, depth: usize) -> Result<Walked, Status> {
        if depth > MAX_DEPTH {
            return Err(Status::invalid_argument(format!(
                "{}: messages nested more than {MAX_DEPTH} deep",
                schema.name
            )));
        }
        let malformed = |e: DecodeError| {
            Status::invalid_argument(format!("{}: malformed message: {e}", schema.name))
        };
        let mut reader = Reader::new(buf);
        let mut plan = PlanBuilder::new(buf.len());
        let mut unmapped = false;
        while let Some((number, wire_type, start)) = reader.key().map_err(malformed)? {
            let Some(field) = schema.field(number) else {
                self.check_unknown(schema, number, wire_type)?;
                reader.skip(number, wire_type).map_err(malformed)?;
                continue;
            };
            if wire_type != WireType::LengthDelimited {
                return Err(Status::invalid_argument(format!(
                    "field {} of {} has wire type {}",
                    field.name, schema.name, wire_type as u8
                )));
            }
            let delimited = reader.delimited(start).map_err(|e| match e {
                ReadError::Decode(e) => malformed(e),
                ReadError::PastEnd { len } => Status::invalid_argument(format!(
                    "{}: field {} has length {len}, past the end of the message",
                    schema.name, field.name
                )),
            })?;
            let value = &buf[delimited.value.clone()];
            match self.field(schema, field, value, depth)? {
                Outcome::Keep => {}
                Outcome::Unmapped => unmapped = true,
                Outcome::Change(change) => plan.push(&delimited, change),
            }
        }
        Ok(Walked {
            plan: plan.finish(),
            unmapped,
        })
    }

    /// Requests may not carry groups (deprecated; nothing in the APIs uses them).
    fn check_unknown(
        &self,
        schema: &Message,
        number: u32,
        wire_type: WireType,
    ) -> Result<(), Status> {
        if self.request && wire_type == WireType::StartGroup {
            return Err(Status::invalid_argument(format!(
                "field {number} of {}: groups are not supported",
                schema.name
            )));
        }
        Ok(())
    }

    /// What happens to one known field's value.
    fn field(
        &self,
        schema: &Message,
        field: &Field,
        value: &[u8],
        depth: usize,
    ) -> Result<Outcome, Status> {
        match field.kind {
            Kind::BucketName | Kind::BucketPrefixed | Kind::BucketId => {
                self.name(schema, field, value)
            }
            Kind::Message(i) => Ok(self.nested(value, i, depth)?.0),
            Kind::BucketList(i) => {
                let (outcome, unmapped) = self.nested(value, i, depth)?;
                if !self.request && unmapped && !self.t.shows_unmapped() {
                    return Ok(Outcome::Change(Change::Drop));
                }
                Ok(outcome)
            }
        }
    }

    /// A nested message; also whether it names a bucket the map does not hold.
    fn nested(
        &self,
        value: &[u8],
        message: usize,
        depth: usize,
    ) -> Result<(Outcome, bool), Status> {
        let Some(schema) = MESSAGES.get(message) else {
            return Err(Status::internal(format!(
                "no message type #{message} in the gRPC bucket-name table"
            )));
        };
        let walked = self.walk(value, schema, depth + 1)?;
        let outcome = walked
            .plan
            .map_or(Outcome::Keep, |plan| Outcome::Change(Change::Nested(plan)));
        Ok((outcome, walked.unmapped))
    }

    /// A field holding a bucket name.
    fn name(&self, schema: &Message, field: &Field, value: &[u8]) -> Result<Outcome, Status> {
        let parsed = std::str::from_utf8(value)
            .ok()
            .and_then(|text| Some((text, bucket_range(text, field.kind)?)));
        let Some((text, range)) = parsed else {
            if !self.request {
                return Ok(Outcome::Keep);
            }
            return Err(Status::invalid_argument(match std::str::from_utf8(value) {
                Ok(text) => format!(
                    "{} of {}: {text:?} is not {}",
                    field.name,
                    schema.name,
                    expected_shape(field.kind)
                ),
                Err(_) => format!("{} of {} is not UTF-8", field.name, schema.name),
            }));
        };
        let bucket = &text[range.clone()];
        let translated = match self.t.bucket(bucket) {
            Ok(translated) => translated,
            Err(e) if self.request => return Err(e.grpc_status()),
            Err(_) => None,
        };
        Ok(match translated {
            None => Outcome::Unmapped,
            Some(name) if name == bucket => Outcome::Keep,
            Some(name) => Outcome::Change(Change::Text(format!(
                "{}{name}{}",
                &text[..range.start],
                &text[range.end..]
            ))),
        })
    }
}

/// What happens to one known field.
enum Outcome {
    Keep,
    /// Kept, but the bucket it names is not in the map (responses).
    Unmapped,
    Change(Change),
}

/// Rewrites the free text of a `google.rpc.Status` (the binary
/// `grpc-status-details-bin` trailer: `message` field 2, and inside
/// `details` (Any, field 3) the well-known `google.rpc.ErrorInfo` metadata
/// values, `google.rpc.LocalizedMessage.message`, `google.rpc.BadRequest`
/// violation descriptions, `google.rpc.ResourceInfo.resource_name`) from
/// physical to logical names with `replace_bucket_tokens`/the mapping; all
/// other bytes kept. Lenient: never fails; returns None when unchanged or
/// unparseable.
pub fn rewrite_status_details(details: &[u8], mapping: &Mapping) -> Option<Bytes> {
    let plan = text_plan(details, STATUS, mapping).ok()??;
    Some(render(details, &plan))
}

/// Which fields of a message hold free text, for [`rewrite_status_details`].
type TextSpec = &'static [(u32, Part)];

enum Part {
    /// A string: bucket-name tokens are translated.
    Text,
    /// A nested message.
    Nested(TextSpec),
    /// A `google.protobuf.Any`: its value by its type URL.
    Any,
}

/// `google.rpc.Status`: `message`, `details`.
const STATUS: TextSpec = &[(2, Part::Text), (3, Part::Any)];
/// `google.rpc.ErrorInfo`: the values of `metadata` (map entries: value 2).
const ERROR_INFO: TextSpec = &[(3, Part::Nested(&[(2, Part::Text)]))];
/// `google.rpc.LocalizedMessage`: `message`.
const LOCALIZED_MESSAGE: TextSpec = &[(2, Part::Text)];
/// `google.rpc.BadRequest`: `field_violations[].description`.
const BAD_REQUEST: TextSpec = &[(1, Part::Nested(&[(2, Part::Text)]))];
/// `google.rpc.ResourceInfo`: `resource_name`.
const RESOURCE_INFO: TextSpec = &[(2, Part::Text)];

/// The spec of an `Any`'s value (field 2) for the detail types with text.
fn any_spec(type_url: &[u8]) -> Option<TextSpec> {
    const ANYS: [(&str, TextSpec); 4] = [
        ("google.rpc.ErrorInfo", &[(2, Part::Nested(ERROR_INFO))]),
        (
            "google.rpc.LocalizedMessage",
            &[(2, Part::Nested(LOCALIZED_MESSAGE))],
        ),
        ("google.rpc.BadRequest", &[(2, Part::Nested(BAD_REQUEST))]),
        (
            "google.rpc.ResourceInfo",
            &[(2, Part::Nested(RESOURCE_INFO))],
        ),
    ];
    // `type.googleapis.com/google.rpc.ErrorInfo`: the name after the last '/'.
    let name = type_url.rsplit(|&b| b == b'/').next()?;
    ANYS.iter()
        .find(|(known, _)| known.as_bytes() == name)
        .map(|(_, spec)| *spec)
}

/// The text changes in `buf` by `spec`; `Err` when it cannot be read.
fn text_plan(buf: &[u8], spec: TextSpec, mapping: &Mapping) -> Result<Option<Plan>, ReadError> {
    let mut reader = Reader::new(buf);
    let mut plan = PlanBuilder::new(buf.len());
    while let Some((number, wire_type, start)) = reader.key()? {
        let part = spec
            .iter()
            .find(|(n, _)| *n == number)
            .map(|(_, part)| part);
        let (Some(part), WireType::LengthDelimited) = (part, wire_type) else {
            reader.skip(number, wire_type)?;
            continue;
        };
        let delimited = reader.delimited(start)?;
        let value = &buf[delimited.value.clone()];
        let change = match part {
            Part::Text => translate_text(value, mapping).map(Change::Text),
            Part::Nested(inner) => text_plan(value, inner, mapping)?.map(Change::Nested),
            Part::Any => match any_type_url(value)?.and_then(any_spec) {
                Some(inner) => text_plan(value, inner, mapping)?.map(Change::Nested),
                None => None,
            },
        };
        if let Some(change) = change {
            plan.push(&delimited, change);
        }
    }
    Ok(plan.finish())
}

/// The `type_url` (field 1) of an `Any`.
fn any_type_url(buf: &[u8]) -> Result<Option<&[u8]>, ReadError> {
    let mut reader = Reader::new(buf);
    let mut type_url = None;
    while let Some((number, wire_type, start)) = reader.key()? {
        if number != 1 || wire_type != WireType::LengthDelimited {
            reader.skip(number, wire_type)?;
            continue;
        }
        let delimited = reader.delimited(start)?;
        type_url = Some(&buf[delimited.value]);
    }
    Ok(type_url)
}

/// Free text with physical names replaced by logical ones; `None` if unchanged.
fn translate_text(value: &[u8], mapping: &Mapping) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    match replace_bucket_tokens(text, |name| mapping.logical(name).map(str::to_owned)) {
        std::borrow::Cow::Owned(changed) => Some(changed),
        std::borrow::Cow::Borrowed(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::grpc::status::Code;
    use googleapis_tonic_google_storage_v2::google::rpc;
    use googleapis_tonic_google_storage_v2::google::storage::v2 as gcs;
    use prost::Message as _;

    use super::*;
    use crate::rewrite::LinkBase;
    use crate::rewrite::testing::{mapping, sidecar_base, translator};

    pub(super) fn index(name: &str) -> usize {
        MESSAGES
            .iter()
            .position(|m| m.name == format!("google.storage.v2.{name}"))
            .unwrap_or_else(|| panic!("{name} is not in the table"))
    }

    fn with<R>(
        direction: Direction,
        shows_unmapped: bool,
        f: impl FnOnce(&Translator<'_>) -> R,
    ) -> R {
        let (m, links): (Mapping, LinkBase) = (mapping(), sidecar_base());
        let mut t = translator(&m, &links, direction);
        t.allow_physical = shows_unmapped;
        f(&t)
    }

    fn raw(bytes: &[u8], name: &str, direction: Direction) -> Result<Option<Bytes>, Status> {
        with(direction, false, |t| {
            rewrite_message(&Bytes::copy_from_slice(bytes), index(name), t)
        })
    }

    /// `m` rewritten and decoded again; the original when nothing changed.
    fn rewrite<M: prost::Message + Default>(m: &M, name: &str, direction: Direction) -> M {
        let bytes = m.encode_to_vec();
        match raw(&bytes, name, direction) {
            Ok(Some(out)) => M::decode(out).unwrap(),
            Ok(None) => M::decode(bytes.as_slice()).unwrap(),
            Err(status) => panic!("{name}: {status:?}"),
        }
    }

    fn request<M: prost::Message + Default>(m: &M, name: &str) -> M {
        rewrite(m, name, Direction::ToPhysical)
    }

    fn request_code(bytes: &[u8], name: &str) -> (Code, String) {
        match raw(bytes, name, Direction::ToPhysical) {
            Err(status) => (status.code(), status.message().to_owned()),
            Ok(out) => panic!("{name}: accepted: {out:?}"),
        }
    }

    const PHOTOS: &str = "projects/_/buckets/photos";
    const PHOTOS_PHYSICAL: &str = "projects/_/buckets/photos-k3x9q2mw";

    fn object(bucket: &str, name: &str) -> gcs::Object {
        gcs::Object {
            bucket: bucket.into(),
            name: name.into(),
            size: 42,
            ..Default::default()
        }
    }

    #[test]
    fn simple_requests_name_physical_buckets() {
        let list = gcs::ListObjectsRequest {
            parent: PHOTOS.into(),
            prefix: "projects/_/buckets/photos/".into(),
            page_size: 10,
            ..Default::default()
        };
        let want = gcs::ListObjectsRequest {
            parent: PHOTOS_PHYSICAL.into(),
            ..list.clone()
        };
        assert_eq!(request(&list, "ListObjectsRequest"), want);

        let get = gcs::GetObjectRequest {
            bucket: "projects/my-project/buckets/logs".into(),
            object: "photos".into(),
            generation: 7,
            ..Default::default()
        };
        let got = request(&get, "GetObjectRequest");
        assert_eq!(got.bucket, "projects/my-project/buckets/logs-aaaa1111");
        assert_eq!((got.object.as_str(), got.generation), ("photos", 7));

        let read = gcs::ReadObjectRequest {
            bucket: PHOTOS.into(),
            object: "a.jpg".into(),
            read_offset: 5,
            ..Default::default()
        };
        let want = gcs::ReadObjectRequest {
            bucket: PHOTOS_PHYSICAL.into(),
            ..read.clone()
        };
        assert_eq!(request(&read, "ReadObjectRequest"), want);
    }

    #[test]
    fn writes_rewrite_the_spec_and_leave_the_data_alone() {
        use gcs::write_object_request::{Data, FirstMessage};
        let content = b"projects/_/buckets/photos".repeat(200);
        let first = gcs::WriteObjectRequest {
            first_message: Some(FirstMessage::WriteObjectSpec(gcs::WriteObjectSpec {
                resource: Some(object(PHOTOS, "a.jpg")),
                if_generation_match: Some(0),
                ..Default::default()
            })),
            data: Some(Data::ChecksummedData(gcs::ChecksummedData {
                content: content.clone(),
                crc32c: Some(1234),
            })),
            ..Default::default()
        };
        let mut want = first.clone();
        if let Some(FirstMessage::WriteObjectSpec(spec)) = &mut want.first_message {
            spec.resource = Some(object(PHOTOS_PHYSICAL, "a.jpg"));
        }
        assert_eq!(request(&first, "WriteObjectRequest"), want);

        let bidi = gcs::BidiWriteObjectRequest {
            first_message: Some(gcs::bidi_write_object_request::FirstMessage::UploadId(
                format!("{PHOTOS}/uploads/xyz"),
            )),
            write_offset: 100,
            ..Default::default()
        };
        let got = request(&bidi, "BidiWriteObjectRequest");
        assert_eq!(
            got.first_message,
            Some(gcs::bidi_write_object_request::FirstMessage::UploadId(
                format!("{PHOTOS_PHYSICAL}/uploads/xyz")
            ))
        );
        assert_eq!(got.write_offset, 100);
    }

    #[test]
    fn a_write_naming_a_fenced_entry_in_a_message_is_held_and_a_read_goes_on() {
        use crate::policy::{Access, Kind};
        let m = Mapping::new([
            ("photos".to_owned(), "photos-k3x9q2mw;fenced".to_owned()),
            ("logs".to_owned(), "logs-aaaa1111".to_owned()),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let links = sidecar_base();
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |name: &str| seen.lock().unwrap().push(name.to_owned());
        let mut t = translator(&m, &links, Direction::ToPhysical);
        t.seen = Some(crate::rewrite::Seen(&record));
        let write = gcs::WriteObjectRequest {
            first_message: Some(gcs::write_object_request::FirstMessage::WriteObjectSpec(
                gcs::WriteObjectSpec {
                    resource: Some(object(PHOTOS, "a.jpg")),
                    ..Default::default()
                },
            )),
            ..Default::default()
        };
        let bytes = Bytes::from(write.encode_to_vec());
        let held = rewrite_message(&bytes, index("WriteObjectRequest"), &t)
            .expect_err("a write to a fenced entry went on");
        assert_eq!(held.reason(), Some(Kind::Moving.row().error_info));
        assert_eq!(held.code(), Code::Unavailable);
        // The same message as a read, and a write to an open entry, go on,
        // and tell the physical names they use.
        t.access = Access {
            writes: false,
            stale: None,
        };
        let read = rewrite_message(&bytes, index("WriteObjectRequest"), &t);
        assert!(matches!(read, Ok(Some(_))), "{read:?}");
        t.access = Access::WRITE;
        let logs = gcs::ReadObjectRequest {
            bucket: "projects/_/buckets/logs".to_owned(),
            object: "x".to_owned(),
            ..Default::default()
        };
        let logs = Bytes::from(logs.encode_to_vec());
        assert!(rewrite_message(&logs, index("ReadObjectRequest"), &t).is_ok());
        assert_eq!(
            *seen.lock().unwrap(),
            ["photos-k3x9q2mw".to_owned(), "logs-aaaa1111".to_owned()]
        );
    }

    #[test]
    fn the_message_that_finishes_a_write_is_told_apart() {
        let data = |finish_write| gcs::WriteObjectRequest {
            write_offset: 4,
            data: Some(gcs::write_object_request::Data::ChecksummedData(
                gcs::ChecksummedData {
                    content: b"data".repeat(100),
                    crc32c: None,
                },
            )),
            finish_write,
            ..Default::default()
        };
        let write = index("WriteObjectRequest");
        assert!(finishes_write(&data(true).encode_to_vec(), write));
        assert!(!finishes_write(&data(false).encode_to_vec(), write));
        let bidi = |finish_write, flush| gcs::BidiWriteObjectRequest {
            write_offset: 4,
            flush,
            finish_write,
            ..Default::default()
        };
        let bidi_index = index("BidiWriteObjectRequest");
        assert!(finishes_write(
            &bidi(true, false).encode_to_vec(),
            bidi_index
        ));
        assert!(!finishes_write(
            &bidi(false, true).encode_to_vec(),
            bidi_index
        ));
        // Another message, or one that cannot be read, finishes nothing.
        let read = gcs::ReadObjectRequest::default().encode_to_vec();
        assert!(!finishes_write(&read, index("ReadObjectRequest")));
        let mut cut = data(true).encode_to_vec();
        cut.truncate(cut.len() - 1);
        cut.insert(0, 0x0a);
        assert!(!finishes_write(&cut, write));
    }

    #[test]
    fn compose_and_rewrite_name_every_bucket() {
        let compose = gcs::ComposeObjectRequest {
            destination: Some(object(PHOTOS, "all")),
            source_objects: vec![gcs::compose_object_request::SourceObject {
                name: "part-1".into(),
                generation: 3,
                ..Default::default()
            }],
            ..Default::default()
        };
        let want = gcs::ComposeObjectRequest {
            destination: Some(object(PHOTOS_PHYSICAL, "all")),
            ..compose.clone()
        };
        assert_eq!(request(&compose, "ComposeObjectRequest"), want);

        let rewrite = gcs::RewriteObjectRequest {
            destination_name: "copy".into(),
            destination_bucket: PHOTOS.into(),
            source_bucket: "projects/_/buckets/logs".into(),
            source_object: "x".into(),
            destination: Some(object(PHOTOS, "copy")),
            ..Default::default()
        };
        let want = gcs::RewriteObjectRequest {
            destination_bucket: PHOTOS_PHYSICAL.into(),
            source_bucket: "projects/_/buckets/logs-aaaa1111".into(),
            destination: Some(object(PHOTOS_PHYSICAL, "copy")),
            ..rewrite.clone()
        };
        assert_eq!(request(&rewrite, "RewriteObjectRequest"), want);
    }

    fn bucket(name: &str) -> gcs::Bucket {
        gcs::Bucket {
            name: format!("projects/_/buckets/{name}"),
            bucket_id: name.into(),
            location: "EU".into(),
            ..Default::default()
        }
    }

    #[test]
    fn bucket_lists_show_only_mapped_buckets() {
        let list = gcs::ListBucketsResponse {
            buckets: vec![
                bucket("someone-else"),
                bucket("photos-k3x9q2mw"),
                bucket("logs-aaaa1111"),
            ],
            next_page_token: "t".into(),
            ..Default::default()
        };
        let want = gcs::ListBucketsResponse {
            buckets: vec![bucket("photos"), bucket("logs")],
            ..list.clone()
        };
        assert_eq!(
            rewrite(&list, "ListBucketsResponse", Direction::ToLogical),
            want
        );

        let bytes = Bytes::from(list.encode_to_vec());
        let shown = with(Direction::ToLogical, true, |t| {
            rewrite_message(&bytes, index("ListBucketsResponse"), t)
        });
        let shown = gcs::ListBucketsResponse::decode(shown.unwrap().unwrap()).unwrap();
        let want = gcs::ListBucketsResponse {
            buckets: vec![bucket("someone-else"), bucket("photos"), bucket("logs")],
            ..list
        };
        assert_eq!(shown, want);
    }

    #[test]
    fn responses_name_logical_buckets_and_keep_unknown_ones() {
        let read = gcs::ReadObjectResponse {
            metadata: Some(object(PHOTOS_PHYSICAL, "a.jpg")),
            checksummed_data: Some(gcs::ChecksummedData {
                content: b"projects/_/buckets/photos-k3x9q2mw".to_vec(),
                crc32c: None,
            }),
            ..Default::default()
        };
        let want = gcs::ReadObjectResponse {
            metadata: Some(object(PHOTOS, "a.jpg")),
            ..read.clone()
        };
        assert_eq!(
            rewrite(&read, "ReadObjectResponse", Direction::ToLogical),
            want
        );

        let obj = object(PHOTOS_PHYSICAL, "b");
        assert_eq!(
            rewrite(&obj, "Object", Direction::ToLogical),
            object(PHOTOS, "b")
        );

        // Unknown and unparseable names stay; nothing is copied.
        for bucket in ["projects/_/buckets/someone-else", "photos-k3x9q2mw", ""] {
            let bytes = object(bucket, "b").encode_to_vec();
            assert_eq!(raw(&bytes, "Object", Direction::ToLogical).unwrap(), None);
        }
    }

    #[test]
    fn object_data_is_judged_unchanged_in_its_pieces_and_metadata_is_not() {
        let data = gcs::ReadObjectResponse {
            checksummed_data: Some(gcs::ChecksummedData {
                content: vec![7; 40_000],
                crc32c: Some(1),
            }),
            ..Default::default()
        }
        .encode_to_vec();
        let pieces: Vec<&[u8]> = data.chunks(16_384).collect();
        assert!(unchanged_at_top(&pieces, index("ReadObjectResponse")));
        let first = gcs::ReadObjectResponse {
            metadata: Some(object(PHOTOS_PHYSICAL, "a.jpg")),
            ..Default::default()
        }
        .encode_to_vec();
        let whole = [data.as_slice(), first.as_slice()].concat();
        let pieces: Vec<&[u8]> = whole.chunks(16_384).collect();
        assert!(!unchanged_at_top(&pieces, index("ReadObjectResponse")));
        // Cut short inside the data: not judged here.
        assert!(!unchanged_at_top(
            &[&data[..30_000]],
            index("ReadObjectResponse")
        ));
    }

    #[test]
    fn allowed_physical_names_are_forwarded_without_a_copy() {
        let bytes = Bytes::from(object(PHOTOS_PHYSICAL, "b").encode_to_vec());
        let out = with(Direction::ToPhysical, true, |t| {
            rewrite_message(&bytes, index("Object"), t)
        });
        assert_eq!(out.unwrap(), None);
    }

    /// A field: key then value, of any wire type.
    fn key(number: u32, wire_type: u8) -> Vec<u8> {
        let mut out = Vec::new();
        encode_varint(u64::from(number) << 3 | u64::from(wire_type), &mut out);
        out
    }

    fn delimited(number: u32, value: &[u8]) -> Vec<u8> {
        let mut out = key(number, 2);
        encode_varint(value.len() as u64, &mut out);
        out.extend_from_slice(value);
        out
    }

    /// Fields no version of the protos defines, of every wire type.
    fn unknown_fields() -> Vec<u8> {
        let mut out = key(900, 0);
        encode_varint(300, &mut out);
        out.extend(key(901, 5));
        out.extend([1, 2, 3, 4]);
        out.extend(key(902, 1));
        out.extend([1, 2, 3, 4, 5, 6, 7, 8]);
        out.extend(delimited(903, b"projects/_/buckets/photos"));
        out
    }

    #[test]
    fn unknown_fields_come_out_byte_for_byte_in_place() {
        let extra = unknown_fields();
        let with_extra = |bucket: &str| {
            let obj = object(bucket, "a.jpg").encode_to_vec();
            let spec = [delimited(1, &[obj, extra.clone()].concat()), extra.clone()].concat();
            [extra.clone(), delimited(2, &spec), extra.clone()].concat()
        };
        let out = raw(
            &with_extra(PHOTOS),
            "WriteObjectRequest",
            Direction::ToPhysical,
        );
        assert_eq!(
            out.unwrap().as_deref(),
            Some(&with_extra(PHOTOS_PHYSICAL)[..])
        );
        let back = raw(
            &with_extra(PHOTOS_PHYSICAL),
            "WriteObjectRequest",
            Direction::ToLogical,
        );
        assert_eq!(back.unwrap().as_deref(), Some(&with_extra(PHOTOS)[..]));
    }

    #[test]
    fn groups_are_refused_in_requests_and_copied_in_responses() {
        let group = [key(50, 3), key(1, 0), vec![1], key(50, 4)].concat();
        let msg = [group.clone(), delimited(2, PHOTOS_PHYSICAL.as_bytes())].concat();
        let (code, message) = request_code(&msg, "Object");
        assert_eq!(code, Code::InvalidArgument);
        assert!(message.contains("groups are not supported"), "{message}");
        let out = raw(&msg, "Object", Direction::ToLogical).unwrap();
        let want = [group, delimited(2, PHOTOS.as_bytes())].concat();
        assert_eq!(out.as_deref(), Some(&want[..]));
    }

    #[test]
    fn names_the_map_refuses_are_refused_with_their_code() {
        let msg = delimited(1, b"projects/_/buckets/nope");
        let (code, message) = request_code(&msg, "ListObjectsRequest");
        assert_eq!(code, Code::NotFound);
        assert!(message.contains("'nope' is not known"), "{message}");
        let msg = delimited(1, PHOTOS_PHYSICAL.as_bytes());
        let (code, message) = request_code(&msg, "ListObjectsRequest");
        assert_eq!(code, Code::PermissionDenied);
        assert!(message.contains("physical name"), "{message}");
    }

    #[test]
    fn malformed_bucket_fields_are_invalid_arguments() {
        let name = "ListObjectsRequest";
        let cases: [(Vec<u8>, &str); 5] = [
            (
                delimited(1, b"foo"),
                r#"parent of google.storage.v2.ListObjectsRequest: "foo" is not projects/_/buckets/NAME"#,
            ),
            (
                delimited(1, b""),
                r#"parent of google.storage.v2.ListObjectsRequest: "" is not projects/_/buckets/NAME"#,
            ),
            (
                delimited(1, b"projects/_/buckets/photos/x"),
                "is not projects/_/buckets/NAME",
            ),
            (
                delimited(1, b"projects/_/buckets/\xff"),
                "parent of google.storage.v2.ListObjectsRequest is not UTF-8",
            ),
            (
                [key(1, 0), vec![5]].concat(),
                "field parent of google.storage.v2.ListObjectsRequest has wire type 0",
            ),
        ];
        for (msg, want) in cases {
            let (code, message) = request_code(&msg, name);
            assert_eq!(code, Code::InvalidArgument, "{message}");
            assert!(message.contains(want), "{message} lacks {want}");
        }
        let (code, _) = request_code(&delimited(3, b""), "CreateBucketRequest");
        assert_eq!(code, Code::InvalidArgument, "an empty bucket_id");
        let (code, _) = request_code(
            &delimited(1, b"projects/_/buckets/"),
            "QueryWriteStatusRequest",
        );
        assert_eq!(code, Code::InvalidArgument);
    }

    #[test]
    fn malformed_messages_are_refused_in_requests_and_forwarded_in_responses() {
        let valid = delimited(1, PHOTOS.as_bytes());
        let cases: [(Vec<u8>, &str); 6] = [
            ([valid.clone(), vec![0x80]].concat(), "truncated varint"),
            (
                [valid.clone(), key(7, 0), vec![0xff]].concat(),
                "truncated value",
            ),
            (
                [key(1, 2), vec![10], b"projects".to_vec()].concat(),
                "past the end",
            ),
            (
                [valid.clone(), key(7, 2), vec![10, 1]].concat(),
                "unknown past the end",
            ),
            ([valid.clone(), key(7, 6)].concat(), "wire type 6"),
            ([vec![0x02, 0x00], valid.clone()].concat(), "field number 0"),
        ];
        for (msg, case) in cases {
            let (code, message) = request_code(&msg, "ListObjectsRequest");
            assert_eq!(code, Code::InvalidArgument, "{case}: {message}");
            assert!(
                message.contains("google.storage.v2.ListObjectsRequest"),
                "{case}: {message}"
            );
            let out = raw(&msg, "ListObjectsRequest", Direction::ToLogical);
            assert_eq!(out.unwrap(), None, "{case}");
        }
        let (code, _) = request_code(&[key(7, 7), vec![0]].concat(), "ListObjectsRequest");
        assert_eq!(code, Code::InvalidArgument, "wire type 7");
    }

    #[test]
    fn nesting_is_limited_and_the_index_checked() {
        let (m, links) = (mapping(), sidecar_base());
        let t = translator(&m, &links, Direction::ToPhysical);
        let walker = Walker {
            t: &t,
            request: true,
        };
        let schema = &MESSAGES[index("Object")];
        let err = walker.walk(b"", schema, MAX_DEPTH + 1).err().unwrap();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(walker.walk(b"", schema, MAX_DEPTH).is_ok());
        let err = rewrite_message(&Bytes::new(), MESSAGES.len(), &t).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
    }

    fn push_detail(status: &mut rpc::Status, type_name: &str, value: Vec<u8>) {
        status.details.push(Default::default());
        if let Some(any) = status.details.last_mut() {
            any.type_url = format!("type.googleapis.com/{type_name}");
            any.value = value;
        }
    }

    /// A status whose texts name `bucket`; a debug detail always names the physical one.
    fn status(bucket: &str) -> rpc::Status {
        let mut status = rpc::Status {
            code: 5,
            message: format!("No such object: {bucket}/a.jpg"),
            details: Vec::new(),
        };
        let info = rpc::ErrorInfo {
            reason: "photos-k3x9q2mw".into(),
            domain: "storage.googleapis.com".into(),
            metadata: [("bucket".to_owned(), bucket.to_owned())].into(),
        };
        push_detail(&mut status, "google.rpc.ErrorInfo", info.encode_to_vec());
        let localized = rpc::LocalizedMessage {
            locale: "en".into(),
            message: format!("'{bucket}' is missing."),
        };
        push_detail(
            &mut status,
            "google.rpc.LocalizedMessage",
            localized.encode_to_vec(),
        );
        let bad = rpc::BadRequest {
            field_violations: vec![rpc::bad_request::FieldViolation {
                field: "photos-k3x9q2mw".into(),
                description: format!("bucket {bucket} is bad"),
                ..Default::default()
            }],
        };
        push_detail(&mut status, "google.rpc.BadRequest", bad.encode_to_vec());
        let resource = rpc::ResourceInfo {
            resource_type: "storage.googleapis.com/Bucket".into(),
            resource_name: format!("projects/_/buckets/{bucket}"),
            ..Default::default()
        };
        push_detail(
            &mut status,
            "google.rpc.ResourceInfo",
            resource.encode_to_vec(),
        );
        let debug = rpc::DebugInfo {
            stack_entries: vec![],
            detail: "photos-k3x9q2mw".into(),
        };
        push_detail(&mut status, "google.rpc.DebugInfo", debug.encode_to_vec());
        status
    }

    #[test]
    fn status_details_name_logical_buckets() {
        let m = mapping();
        let physical = status("photos-k3x9q2mw").encode_to_vec();
        let out = rewrite_status_details(&physical, &m).unwrap();
        assert_eq!(rpc::Status::decode(out).unwrap(), status("photos"));
        let unknown = status("someone-else").encode_to_vec();
        assert_eq!(rewrite_status_details(&unknown, &m), None, "unchanged");
        for garbage in [
            &physical[..physical.len() - 1],
            &[0xff, 0xff][..],
            b"\x12\x05ab",
        ] {
            assert_eq!(rewrite_status_details(garbage, &m), None);
        }
        let mut extra = physical.clone();
        extra.extend(unknown_fields());
        let out = rewrite_status_details(&extra, &m).unwrap();
        assert!(out.ends_with(&unknown_fields()));
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;
    use crate::rewrite::testing::{mapping, sidecar_base, translator};

    /// One field of a generated message.
    #[derive(Clone, Debug)]
    enum Piece {
        /// A field of the table (`which` modulo the message's fields); its
        /// name is `names[name % names.len()]`, nested messages are built
        /// from the pieces that follow.
        Known {
            which: usize,
            name: usize,
            tail: bool,
        },
        /// A field number the table does not hold, of wire type 0, 1, 2 or 5.
        Unknown {
            number: u32,
            wire: u8,
            payload: Vec<u8>,
        },
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            (any::<usize>(), any::<usize>(), any::<bool>())
                .prop_map(|(which, name, tail)| Piece::Known { which, name, tail }),
            (
                1000u32..5000,
                prop::sample::select(vec![0u8, 1, 2, 5]),
                prop::collection::vec(any::<u8>(), 0..12)
            )
                .prop_map(|(number, wire, payload)| Piece::Unknown {
                    number,
                    wire,
                    payload
                }),
        ]
    }

    fn unknown(number: u32, wire: u8, payload: &[u8], out: &mut Vec<u8>) {
        encode_varint(u64::from(number) << 3 | u64::from(wire), out);
        let mut fixed = payload.to_vec();
        match wire {
            0 => encode_varint(fixed.iter().fold(0u64, |v, &b| v << 8 | u64::from(b)), out),
            1 | 5 => {
                fixed.resize(if wire == 1 { 8 } else { 4 }, 7);
                out.extend(fixed);
            }
            _ => {
                encode_varint(payload.len() as u64, out);
                out.extend_from_slice(payload);
            }
        }
    }

    /// A message of type `schema` from `pieces`, bucket names from `names`.
    fn build(schema: &Message, pieces: &[Piece], names: &[&str], depth: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            match piece {
                Piece::Unknown {
                    number,
                    wire,
                    payload,
                } => unknown(*number, *wire, payload, &mut out),
                Piece::Known { which, name, tail } => {
                    let field = &schema.fields[which % schema.fields.len()];
                    let name = names[name % names.len()];
                    let value = match field.kind {
                        Kind::BucketId => name.as_bytes().to_vec(),
                        Kind::BucketName => format!("projects/_/buckets/{name}").into_bytes(),
                        Kind::BucketPrefixed if *tail => {
                            format!("projects/p/buckets/{name}/folders/{name}/").into_bytes()
                        }
                        Kind::BucketPrefixed => format!("projects/p/buckets/{name}").into_bytes(),
                        Kind::Message(m) | Kind::BucketList(m) if depth < 3 => {
                            let rest = &pieces[i + 1..pieces.len().min(i + 4)];
                            build(&MESSAGES[m], rest, names, depth + 1)
                        }
                        Kind::Message(_) | Kind::BucketList(_) => Vec::new(),
                    };
                    encode_varint(u64::from(field.number) << 3 | 2, &mut out);
                    encode_varint(value.len() as u64, &mut out);
                    out.extend(value);
                }
            }
        }
        out
    }

    /// The top-level fields the table does not hold, raw.
    fn unknown_fields(buf: &[u8], schema: &Message) -> Vec<Vec<u8>> {
        let mut reader = Reader::new(buf);
        let mut found = Vec::new();
        while let Some((number, wire_type, start)) = reader.key().unwrap() {
            reader.skip(number, wire_type).unwrap();
            if schema.field(number).is_none() {
                found.push(buf[start..reader.offset()].to_vec());
            }
        }
        found
    }

    fn rewritten(msg: &[u8], message: usize, direction: Direction) -> Result<Vec<u8>, Status> {
        let (m, links) = (mapping(), sidecar_base());
        let t = translator(&m, &links, direction);
        let out = rewrite_message(&Bytes::copy_from_slice(msg), message, &t)?;
        Ok(out.map_or_else(|| msg.to_vec(), |b| b.to_vec()))
    }

    proptest! {
        #[test]
        fn never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200), message in 0..MESSAGES.len(), physical: bool) {
            let direction = if physical { Direction::ToPhysical } else { Direction::ToLogical };
            let _ = rewritten(&bytes, message, direction);
        }

        #[test]
        fn there_and_back_is_identity(pieces in prop::collection::vec(piece(), 0..12), message in 0..MESSAGES.len()) {
            let schema = &MESSAGES[message];
            let logical = build(schema, &pieces, &["photos", "logs"], 0);
            let physical = rewritten(&logical, message, Direction::ToPhysical).unwrap();
            prop_assert_eq!(unknown_fields(&physical, schema), unknown_fields(&logical, schema));
            let expect_change = pieces.iter().any(|p| matches!(p, Piece::Known { .. }));
            if expect_change && schema.fields.iter().all(|f| !matches!(f.kind, Kind::Message(_) | Kind::BucketList(_))) {
                prop_assert_ne!(&physical, &logical);
            }
            let back = rewritten(&physical, message, Direction::ToLogical).unwrap();
            prop_assert_eq!(back, logical);
        }

        /// What is judged unchanged in pieces, the whole-message rewrite
        /// leaves unchanged, in both directions: any bytes, any cut.
        #[test]
        fn judged_unchanged_in_pieces_means_unchanged(
            bytes in prop::collection::vec(any::<u8>(), 0..200),
            pieces in prop::collection::vec(piece(), 0..12),
            built: bool,
            cuts in prop::collection::vec(0usize..300, 0..6),
            message in 0..MESSAGES.len(),
        ) {
            let schema = &MESSAGES[message];
            let msg = if built { build(schema, &pieces, &["photos", "photos-k3x9q2mw"], 0) } else { bytes };
            let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (msg.len() + 1)).collect();
            points.extend([0, msg.len()]);
            points.sort_unstable();
            let parts: Vec<&[u8]> = points.windows(2).map(|w| &msg[w[0]..w[1]]).collect();
            if unchanged_at_top(&parts, message) {
                for direction in [Direction::ToPhysical, Direction::ToLogical] {
                    prop_assert_eq!(rewritten(&msg, message, direction), Ok(msg.clone()));
                }
            }
        }

        #[test]
        fn responses_never_fail_and_stay_readable(pieces in prop::collection::vec(piece(), 0..12), message in 0..MESSAGES.len()) {
            let schema = &MESSAGES[message];
            let names = ["photos-k3x9q2mw", "someone-else", "logs-aaaa1111", "photos"];
            let upstream = build(schema, &pieces, &names, 0);
            let out = rewritten(&upstream, message, Direction::ToLogical).unwrap();
            // The output parses (unknown_fields reads it strictly).
            prop_assert_eq!(unknown_fields(&out, schema), unknown_fields(&upstream, schema));
        }
    }
}
