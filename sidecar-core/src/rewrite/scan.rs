//! Splits a JSON object into its members (or an array into its elements),
//! each value as the exact text it came in, after checking that the whole
//! text is JSON by the grammar serde_json reads (RFC 8259: no comments, no
//! trailing commas, no control characters in strings, `\u` escapes of four
//! hex digits; keys decoded as serde_json decodes them, so a key with a
//! lone surrogate escape is refused).
//!
//! serde_json has no cheaper way to do this than deserializing a map of
//! `RawValue`s, which runs every member through serde's visitor machinery,
//! on every metadata response the sidecar rewrites. This scanner reads the
//! same text in one pass, strings eight bytes at a time, without allocating
//! for unescaped keys, and runs fewer instructions per response (the bench's
//! instructions phase counts them). serde_json stays the oracle: the property tests below check that both accept and refuse the
//! same texts and split them into the same members.

use std::borrow::Cow;

use smallvec::SmallVec;

/// The members of the JSON object `text` (leading and trailing whitespace
/// allowed, nothing else), each made by `member` of its key, decoded, its
/// value's exact text, and where that text starts in `text`. `None` when
/// `text` is not exactly one well-formed JSON object.
pub(super) fn object_members<'a, T>(
    text: &'a str,
    mut member: impl FnMut(Cow<'a, str>, &'a str, usize) -> T,
) -> Option<Vec<T>> {
    let mut scan = Scanner::new(text);
    scan.expect(b'{')?;
    // 32 members: as many as GCS's resources have (an object about 20, a
    // bucket about 30), in one allocation glibc serves from its per-thread
    // cache (up to 1,032 bytes) when a member is 32 bytes.
    let mut members = Vec::with_capacity(32);
    if !scan.close(b'}') {
        loop {
            let key = scan.member_key()?;
            let value = scan.value()?;
            members.push(member(key, value, scan.at - value.len()));
            if !scan.next_or_close(b'}')? {
                break;
            }
        }
    }
    scan.end()?;
    Some(members)
}

/// The elements of the JSON array `text`, each as its exact text; `None`
/// when `text` is not exactly one well-formed JSON array.
pub(super) fn array_elements(text: &str) -> Option<Vec<&str>> {
    let mut scan = Scanner::new(text);
    scan.expect(b'[')?;
    let mut elements = Vec::new();
    if !scan.close(b']') {
        loop {
            elements.push(scan.value()?);
            if !scan.next_or_close(b']')? {
                break;
            }
        }
    }
    scan.end()?;
    Some(elements)
}

/// JSON's whitespace: space, tab, line feed and carriage return, nothing
/// else (RFC 8259, section 2).
pub(super) fn is_json_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn new(text: &'a str) -> Self {
        Scanner { text, at: 0 }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while self.peek().is_some_and(is_json_whitespace) {
            self.at += 1;
        }
    }

    /// Whitespace, then `byte`.
    fn expect(&mut self, byte: u8) -> Option<()> {
        self.whitespace();
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    /// Whitespace, then `bracket` if it comes (an empty container).
    fn close(&mut self, bracket: u8) -> bool {
        self.expect(bracket).is_some()
    }

    /// After a member or element: `true` on a comma (another follows),
    /// `false` on the closing `bracket`, `None` on anything else.
    fn next_or_close(&mut self, bracket: u8) -> Option<bool> {
        self.whitespace();
        let byte = self.peek()?;
        self.at += 1;
        match byte {
            b',' => Some(true),
            b if b == bracket => Some(false),
            _ => None,
        }
    }

    /// Only whitespace left.
    fn end(&mut self) -> Option<()> {
        self.whitespace();
        (self.at == self.text.len()).then_some(())
    }

    /// A member's key and its colon, the key decoded.
    fn member_key(&mut self) -> Option<Cow<'a, str>> {
        self.whitespace();
        let start = self.at;
        let escaped = self.string()?;
        let raw = &self.text[start..self.at];
        self.expect(b':')?;
        if !escaped {
            return Some(Cow::Borrowed(&raw[1..raw.len() - 1]));
        }
        // Rare: let serde_json decode the escapes (and refuse lone surrogates).
        serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
    }

    /// A key in a nested object and its colon: checked, not decoded.
    fn nested_key(&mut self) -> Option<()> {
        self.whitespace();
        self.string()?;
        self.expect(b':')
    }

    /// One value, after optional whitespace: its exact text.
    #[inline(always)]
    fn value(&mut self) -> Option<&'a str> {
        self.whitespace();
        let start = self.at;
        match self.peek()? {
            b'{' | b'[' => self.container()?,
            first => self.scalar(first)?,
        }
        Some(&self.text[start..self.at])
    }

    /// A string, number or literal starting with `first`.
    #[inline(always)]
    fn scalar(&mut self, first: u8) -> Option<()> {
        match first {
            b'"' => self.string().map(drop),
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => None,
        }
    }

    /// An object or array from its opening bracket, nested to any depth
    /// without recursion.
    fn container(&mut self) -> Option<()> {
        // The closing brackets of the containers open, innermost last.
        let mut open: SmallVec<[u8; 16]> = SmallVec::new();
        loop {
            self.whitespace();
            match self.peek()? {
                bracket @ (b'{' | b'[') => {
                    self.at += 1;
                    let closing = if bracket == b'{' { b'}' } else { b']' };
                    if !self.close(closing) {
                        open.push(closing);
                        if bracket == b'{' {
                            self.nested_key()?;
                        }
                        continue;
                    }
                }
                first => self.scalar(first)?,
            }
            // A value ended: close what it ends, or go on after a comma.
            loop {
                let Some(&closing) = open.last() else {
                    return Some(());
                };
                if self.next_or_close(closing)? {
                    if closing == b'}' {
                        self.nested_key()?;
                    }
                    break;
                }
                open.pop();
            }
        }
    }

    /// A string from its opening quote; `true` when it has escapes.
    #[inline(always)]
    fn string(&mut self) -> Option<bool> {
        let bytes = self.bytes();
        if bytes.get(self.at) != Some(&b'"') {
            return None;
        }
        self.at += 1;
        let mut escaped = false;
        loop {
            self.at += plain_run(&bytes[self.at..]);
            let stop = *bytes.get(self.at)?;
            self.at += 1;
            match stop {
                b'"' => return Some(escaped),
                b'\\' => {
                    escaped = true;
                    self.escape()?;
                }
                // A control character.
                _ => return None,
            }
        }
    }

    /// The rest of an escape after its backslash.
    fn escape(&mut self) -> Option<()> {
        let bytes = self.bytes();
        match *bytes.get(self.at)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 1,
            b'u' => {
                let hex = bytes.get(self.at + 1..self.at + 5)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                self.at += 5;
            }
            _ => return None,
        }
        Some(())
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    /// One digit or more.
    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.bytes()[self.at..]
            .starts_with(word)
            .then(|| self.at += word.len())
    }
}

/// How many bytes at the start of `bytes` are plain string characters:
/// not the closing quote, not an escape, not a control character (below
/// U+0020, which a string may not hold unescaped): the bytes JSON writes as
/// they are. Eight bytes at a time, as serde_json skips strings (the "has a
/// zero byte" test of each word against `"`, `\\` and the control range).
pub(super) fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let mut at = 0;
    for chunk in bytes.chunks_exact(8) {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let control = word.wrapping_sub(ONES * 0x20) & !word;
        let quote = word ^ (ONES * u64::from(b'"'));
        let quote = quote.wrapping_sub(ONES) & !quote;
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let backslash = backslash.wrapping_sub(ONES) & !backslash;
        let found = (control | quote | backslash) & HIGH;
        if found != 0 {
            // The lowest flagged byte is the first stop: bytes before it
            // borrow nothing, so its flag is exact.
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + bytes[at..]
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
        .unwrap_or(bytes.len() - at)
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use proptest::prelude::*;
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
    use serde_json::value::RawValue;

    use super::*;

    /// The oracle: serde_json's own split into `RawValue`s.
    struct Members<'a>(Vec<(String, &'a RawValue)>);

    impl<'de> Deserialize<'de> for Members<'de> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct MembersVisitor;
            impl<'de> Visitor<'de> for MembersVisitor {
                type Value = Members<'de>;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                    let mut members = Vec::new();
                    while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                        members.push(entry);
                    }
                    Ok(Members(members))
                }
            }
            deserializer.deserialize_map(MembersVisitor)
        }
    }

    fn oracle_members(text: &str) -> Option<Vec<(String, &str)>> {
        if !text.trim_start().starts_with('{') {
            return None;
        }
        let Members(members) = serde_json::from_str(text).ok()?;
        Some(members.into_iter().map(|(k, v)| (k, v.get())).collect())
    }

    fn oracle_elements(text: &str) -> Option<Vec<&str>> {
        if !text.trim_start().starts_with('[') {
            return None;
        }
        let elements: Vec<&RawValue> = serde_json::from_str(text).ok()?;
        Some(elements.into_iter().map(RawValue::get).collect())
    }

    /// Each value as found at the offset the scanner gives for it, or a
    /// marker when that is not where the value is.
    fn ours(text: &str) -> Option<Vec<(String, &str)>> {
        object_members(text, |k, v, at| {
            let found = text.get(at..at + v.len()).filter(|found| *found == v);
            (k.into_owned(), found.unwrap_or("<not at its offset>"))
        })
    }

    fn check(text: &str) -> Result<(), TestCaseError> {
        prop_assert_eq!(ours(text), oracle_members(text), "object {:?}", text);
        prop_assert_eq!(
            array_elements(text),
            oracle_elements(text),
            "array {:?}",
            text
        );
        Ok(())
    }

    /// JSON values of every kind, nested, with keys and strings that need
    /// escapes.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            "\\PC{0,6}|[\"\\\\\\x00-\\x1f/é]{0,4}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                prop::collection::vec(("\\PC{0,4}|[\"\\\\a]{0,2}", inner), 0..6)
                    .prop_map(|members| serde_json::Value::Object(members.into_iter().collect())),
            ]
        })
    }

    /// Whitespace, JSON's and some that is not.
    fn spaced(text: &str, gaps: &[u8]) -> String {
        let mut out = String::with_capacity(text.len() * 2);
        for (i, ch) in text.chars().enumerate() {
            out.push(ch);
            if matches!(ch, '{' | '[' | ',' | ':' | '}' | ']')
                && let Some(gap) = gaps.get(i % gaps.len().max(1))
            {
                out.push(match gap % 6 {
                    0 => ' ',
                    1 => '\n',
                    2 => '\t',
                    3 => '\r',
                    4 => '\u{a0}',
                    _ => '\u{b}',
                });
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        #[test]
        fn well_formed_documents_split_as_serde_json_splits_them(
            value in json_value(),
            gaps in prop::collection::vec(any::<u8>(), 0..8),
        ) {
            let text = serde_json::to_string(&value).unwrap_or_default();
            check(&text)?;
            check(&spaced(&text, &gaps))?;
            let pretty = serde_json::to_string_pretty(&value).unwrap_or_default();
            check(&pretty)?;
        }

        #[test]
        fn damaged_documents_are_refused_as_serde_json_refuses_them(
            value in json_value(),
            at in any::<prop::sample::Index>(),
            edit in 0u8..3,
            byte in prop::sample::select(b"{}[]\",:\\ 0-.eE+tfnu\x01a/".to_vec()),
        ) {
            let mut text = serde_json::to_string(&serde_json::json!({"k": value, "z": [1]}))
                .unwrap_or_default()
                .into_bytes();
            let i = at.index(text.len() + 1);
            match edit {
                0 => text.insert(i.min(text.len()), byte),
                1 if i < text.len() => { text.remove(i); }
                _ if i < text.len() => text[i] = byte,
                _ => text.push(byte),
            }
            if let Ok(text) = String::from_utf8(text) {
                check(&text)?;
            }
        }

        #[test]
        fn short_texts_of_json_tokens_agree_with_serde_json(
            text in "[{}\\[\\]\",: 0-9.eE+\\-tfnrulas\\\\/\\x01]{0,16}",
        ) {
            check(&text)?;
            check(&format!("{{\"k\":{text}}}"))?;
            check(&format!("[{text}]"))?;
        }
    }

    #[test]
    fn edges_of_the_grammar_are_read_as_serde_json_reads_them() {
        let cases = [
            r#"{}"#,
            r#" { } "#,
            r#"{"a":1,}"#,
            r#"{"a":01}"#,
            r#"{"a":-0.5e+3}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":-}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"\ud800":1}"#,
            r#"{"\ud83d\ude00":1}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12G4"}"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":tru}"#,
            r#"{"a":truex}"#,
            r#"{"a":[1,[2,{"b":[]}]],"c":{}}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":{"b" 1}}"#,
            r#"{"a":1} x"#,
            r#"{"a":1}{}"#,
            r#"[]"#,
            r#"[1 2]"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a":1,"a":2}"#,
            "",
            "null",
        ];
        for text in cases {
            check(text).unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(object_members(r#"{"a":{"b":[1,2]},"c":"d"}"#, |k, v, _| (k, v)).is_some());
        assert!(object_members(r#"{"a":{"b":[1,2}},"c":"d"}"#, |k, v, _| (k, v)).is_none());
    }

    proptest! {
        #[test]
        fn plain_runs_end_at_the_first_quote_escape_or_control_character(
            bytes in prop::collection::vec(prop_oneof![
                4 => 0x20u8..=0xff,
                1 => prop::sample::select(vec![b'"', b'\\', 0x00, 0x1f, 0x20, 0x21, 0x5b, 0x5d, 0x7f, 0x80]),
            ], 0..40),
        ) {
            let expected = bytes
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
                .unwrap_or(bytes.len());
            prop_assert_eq!(plain_run(&bytes), expected);
        }
    }

    #[test]
    fn deep_nesting_is_read_without_recursion() {
        let depth = 100_000;
        let text = format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        let members =
            object_members(&text, |k, v, _| (k, v)).unwrap_or_else(|| panic!("well-formed"));
        assert_eq!(members[0].1.len(), 2 * depth);
        let broken = format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth - 1));
        assert!(object_members(&broken, |k, v, _| (k, v)).is_none());
    }
}
