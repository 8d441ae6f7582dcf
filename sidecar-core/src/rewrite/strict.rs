//! Strict checks of JSON request bodies, before they are rewritten.
//!
//! The rewriter only changes the fields it knows; a body that other JSON
//! parsers (GCS's among them) could read differently from the sidecar would
//! let a bucket name past it. So a request body must be valid UTF-8, exactly
//! one JSON object with nothing after it, without duplicate keys or keys that
//! differ only in case (at any depth), without an `error` member, and with a
//! `kind` (when present) equal to the one of the method's request schema.

use std::collections::hash_map::Entry;
use std::fmt;

use foldhash::HashMap;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::scan::is_json_whitespace;
use crate::errors::ApiError;

/// Whether a JSON body is empty, all whitespace, or the literal `null`:
/// no document, so no bucket name. Google's Go API clients send `null` for
/// an optional request body they were given no object for (rclone's
/// `objects.rewrite` and `objects.copy`), and GCS takes it as no body.
/// Whitespace is JSON's (space, tab, line feed, carriage return): a body
/// padded with anything else, a form feed say, is not JSON, and goes to
/// the rewriter to be refused.
pub fn is_no_document(body: &[u8]) -> bool {
    let start = body
        .iter()
        .position(|&b| !is_json_whitespace(b))
        .unwrap_or(body.len());
    let end = body
        .iter()
        .rposition(|&b| !is_json_whitespace(b))
        .map_or(start, |i| i + 1);
    matches!(&body[start..end], b"" | b"null")
}

/// Checks a JSON request body. An empty (or all-whitespace) body, or
/// `null`, passes: it names no bucket ([`is_no_document`]). `kind` is the
/// `kind` of the request schema, if it has one.
pub fn check_request_json(body: &[u8], kind: Option<&str>) -> Result<(), ApiError> {
    if is_no_document(body) {
        return Ok(());
    }
    let refuse = |why: String| {
        ApiError::bad_request(format!(
            "bucketmap-sidecar refuses this JSON request body: {why}"
        ))
    };
    let text =
        std::str::from_utf8(body).map_err(|e| refuse(format!("it is not valid UTF-8 ({e})")))?;
    if !text.trim_start().starts_with('{') {
        return Err(refuse("it must be one JSON object".to_owned()));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let top = de
        .deserialize_map(TopVisitor)
        .map_err(|e| refuse(e.to_string()))?;
    de.end()
        .map_err(|e| refuse(format!("there is data after the object ({e})")))?;
    if top.error {
        return Err(refuse(
            "a request body has no `error` member (that is a response document)".to_owned(),
        ));
    }
    match (top.kind.as_deref(), kind) {
        (Some(sent), Some(want)) if sent != want => Err(refuse(format!(
            "its kind {sent:?} is not the {want:?} this operation takes"
        ))),
        (Some(sent), None) => Err(refuse(format!(
            "its kind {sent:?} does not belong to this operation, whose body has no kind"
        ))),
        _ => Ok(()),
    }
}

/// What the top-level object says about itself.
struct Top {
    kind: Option<String>,
    error: bool,
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut top = Top {
            kind: None,
            error: false,
        };
        let mut keys = Keys::default();
        while let Some(key) = map.next_key::<String>()? {
            keys.insert::<A::Error>(&key)?;
            match key.as_str() {
                "kind" => top.kind = Some(map.next_value::<KindValue>()?.0),
                "error" => {
                    top.error = true;
                    map.next_value::<Strict>()?;
                }
                _ => {
                    map.next_value::<Strict>()?;
                }
            }
        }
        Ok(top)
    }
}

/// The keys of one object so far (lower-cased, with their spelling), to
/// refuse duplicates and case twins in linear time.
#[derive(Default)]
struct Keys(HashMap<String, String>);

impl Keys {
    fn insert<E: de::Error>(&mut self, key: &str) -> Result<(), E> {
        match self.0.entry(key.to_ascii_lowercase()) {
            Entry::Occupied(twin) if twin.get() == key => Err(E::custom(format!(
                "the key {key:?} appears twice in one object"
            ))),
            Entry::Occupied(twin) => Err(E::custom(format!(
                "the keys {:?} and {key:?} differ only in case",
                twin.get()
            ))),
            Entry::Vacant(slot) => {
                slot.insert(key.to_owned());
                Ok(())
            }
        }
    }
}

/// `kind`: a string.
struct KindValue(String);

impl<'de> Deserialize<'de> for KindValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)
            .map(KindValue)
            .map_err(|_| de::Error::custom("`kind` must be a string"))
    }
}

/// Any JSON value, checked for duplicate and case-twin keys at every depth.
struct Strict;

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor)
    }
}

impl<'de> DeserializeSeed<'de> for StrictVisitor {
    type Value = Strict;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Strict, D::Error> {
        deserializer.deserialize_any(self)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Strict, E> {
        Ok(Strict)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Strict, E> {
        Ok(Strict)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Strict, E> {
        Ok(Strict)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Strict, E> {
        Ok(Strict)
    }

    fn visit_str<E>(self, _: &str) -> Result<Strict, E> {
        Ok(Strict)
    }

    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        while seq.next_element_seed(StrictVisitor)?.is_some() {}
        Ok(Strict)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut keys = Keys::default();
        while let Some(key) = map.next_key::<String>()? {
            keys.insert::<A::Error>(&key)?;
            map.next_value_seed(StrictVisitor)?;
        }
        Ok(Strict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJECT: Option<&str> = Some("storage#object");

    #[test]
    fn well_formed_bodies_pass() {
        for body in [
            "",
            "  \n",
            // Google's Go API clients (rclone) send `null` for no object.
            "null",
            " null\n",
            r#"{"bucket":"photos","metadata":{"a":"1","A2":"x"}}"#,
            r#"{"kind":"storage#object","acl":[{"bucket":"photos"},{"bucket":"logs"}]}"#,
            r#"  {"name":"x"}  "#,
        ] {
            assert_eq!(
                check_request_json(body.as_bytes(), OBJECT),
                Ok(()),
                "{body}"
            );
        }
    }

    proptest::proptest! {
        /// No document is what serde_json reads as `null`, or nothing but
        /// JSON whitespace: a form feed or vertical tab is neither.
        #[test]
        fn no_document_is_what_serde_json_reads_as_null_or_nothing(
            body in "[ \t\n\r\x0b\x0c]{0,3}(null|nul|x|)[ \t\n\r\x0b\x0c]{0,3}"
        ) {
            let blank = body.bytes().all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
            let null = serde_json::from_str::<serde_json::Value>(&body)
                .is_ok_and(|v| v.is_null());
            proptest::prop_assert_eq!(is_no_document(body.as_bytes()), blank || null, "{:?}", body);
        }
    }

    #[test]
    fn bodies_padded_with_other_whitespace_are_refused() {
        for body in [&b"\x0cnull"[..], b"null\x0c", b"\x0c", b"\x0b null"] {
            let status = check_request_json(body, OBJECT).map_err(|e| e.status.as_u16());
            assert_eq!(status, Err(400), "{:?}", String::from_utf8_lossy(body));
        }
        assert_eq!(check_request_json(b"\t\r\nnull\r\n", OBJECT), Ok(()));
    }

    #[test]
    fn bodies_the_rewriter_could_misread_are_refused() {
        let cases: [(&[u8], &str); 13] = [
            (b"null null", "one JSON object"),
            (b"nullx", "one JSON object"),
            (
                br#"{"error":{"message":"x"},"bucket":"other"}"#,
                "`error` member",
            ),
            (br#"{"kind":"storage#bucket","name":"other"}"#, "is not the"),
            (br#"{"bucket":"photos"} {"bucket":"other"}"#, "data after"),
            (br#"{"bucket":"photos"}x"#, "data after"),
            (br#"[{"bucket":"other"}]"#, "one JSON object"),
            (br#"{"name":"x","NAME":"y"}"#, "differ only in case"),
            (br#"{"bucket":"photos","bucket":"other"}"#, "appears twice"),
            (
                br#"{"acl":[{"bucket":"a","Bucket":"b"}]}"#,
                "differ only in case",
            ),
            (b"{\"bucket\":\"ph\xffotos\"}", "UTF-8"),
            (br#"{"kind":7}"#, "must be a string"),
            (br#"{"bucket":"photos""#, "EOF"),
        ];
        for (body, why) in cases {
            let err = check_request_json(body, OBJECT).map_err(|e| e.message);
            assert!(
                err.as_ref().is_err_and(|m| m.contains(why)),
                "{}: {err:?}",
                String::from_utf8_lossy(body)
            );
        }
        let err = check_request_json(br#"{"kind":"storage#object"}"#, None);
        assert!(err.is_err(), "a kind on a schema without one");
    }
}
