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

use bytes::{Bytes, BytesMut};
use prost::DecodeError;
use prost::encoding::{
    DecodeContext, WireType, decode_key, decode_varint, encode_varint, encoded_len_varint,
    skip_field,
};
use tonic::Status;

use super::resource::{bucket_range, expected_shape};
use super::schema::MESSAGES;
use super::table::{Field, Kind, Message};
use crate::errors::ApiError;
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
            Err(e) if self.request => return Err(api_status(e)),
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

/// The gRPC status for a name the mapping refuses, with its message.
fn api_status(e: ApiError) -> Status {
    match e.status.as_u16() {
        404 => Status::not_found(e.message),
        403 => Status::permission_denied(e.message),
        _ => Status::invalid_argument(e.message),
    }
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
