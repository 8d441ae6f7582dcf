//! Buffered `multipart/*` parsing shared by the batch endpoint: boundaries,
//! splitting into parts, part headers. Accepts CRLF and bare LF line ends
//! (the Python client's batch bodies use LF).

use memchr::memmem;

/// The `boundary` parameter of a `multipart/*` content type, parsed by the
/// `mime` crate (RFC 2045 parameters, quoted strings included), so that a
/// `boundary=` inside another parameter's quoted value is not taken for it:
/// the sidecar must split on the boundary the upstream splits on. A content
/// type with two `boundary` parameters has none.
pub fn boundary(content_type: &str) -> Option<String> {
    let mime: mime::Mime = content_type.trim().parse().ok()?;
    if mime.type_() != mime::MULTIPART {
        return None;
    }
    let mut boundaries = mime
        .params()
        .filter(|(name, _)| *name == mime::BOUNDARY)
        .map(|(_, value)| value.as_str());
    let value = boundaries.next()?;
    if boundaries.next().is_some() {
        return None;
    }
    (!value.is_empty() && value.len() <= 200).then(|| value.to_owned())
}

/// Splits a buffered multipart body into its parts' raw bytes (headers and
/// content, without the line break that precedes the next delimiter).
/// Returns `None` if the body has no part (no opening delimiter, or the
/// close delimiter first), or if a part lacks
/// the empty line that ends its headers: RFC 2046 parsers disagree on such a
/// part (Go's mime/multipart refuses it, Python's email merges or drops it),
/// so the sidecar refuses it rather than guess.
pub fn split<'b>(body: &'b [u8], boundary: &str) -> Option<Vec<&'b [u8]>> {
    let delimiter = format!("--{boundary}");
    let delimiter = delimiter.as_bytes();
    let finder = memmem::Finder::new(delimiter);
    // Delimiters at the start of a line.
    let mut starts = Vec::new();
    let mut from = 0;
    while let Some(found) = finder.find(&body[from..]) {
        let at = from + found;
        let rest = &body[at + delimiter.len()..];
        if (at == 0 || body[at - 1] == b'\n') && delimiter_line(rest, true) == Some(true) {
            starts.push(at);
        }
        from = at + delimiter.len();
    }
    if starts.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    for (i, &at) in starts.iter().enumerate() {
        let after = at + delimiter.len();
        if body[after..].starts_with(b"--") {
            break; // close delimiter
        }
        let Some(line_end) = memchr::memchr(b'\n', &body[after..]) else {
            break;
        };
        let content_start = after + line_end + 1;
        let next = starts
            .get(i + 1)
            .copied()
            .unwrap_or(body.len())
            .max(content_start);
        if !headers_well_formed(&body[content_start..next]) {
            return None;
        }
        parts.push(&body[content_start..strip_line_break(body, content_start, next)]);
    }
    (!parts.is_empty()).then_some(parts)
}

/// Whether `--boundary` at the start of a line, followed by `rest`, is a
/// delimiter line (RFC 2046: an optional `--` for the close delimiter,
/// optional blanks, then the line end, or the end of the body when `eof`).
/// `--B--junk` and `--Bjunk` are content, as Go's mime/multipart and
/// Python's email read them. `None`: `rest` is too short to tell yet (a
/// streaming caller waits for more bytes; never when `eof`).
pub fn delimiter_line(rest: &[u8], eof: bool) -> Option<bool> {
    let rest = match rest.strip_prefix(b"--") {
        Some(after) => after,
        None if rest == b"-" && !eof => return None,
        None => rest,
    };
    let padding = rest
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t'))
        .count();
    match &rest[padding..] {
        [] | [b'\r'] if !eof => None,
        [] => Some(true),
        [b'\n', ..] | [b'\r', b'\n', ..] => Some(true),
        _ => Some(false),
    }
}

/// Whether a part (up to the next delimiter, line break included) starts
/// with well-formed header lines (`NAME: value`, NAME an RFC 9110 token; no
/// folded lines) ended by an empty line. Go's mime/multipart refuses other
/// header blocks and Python's email reads them differently, so the sidecar
/// refuses them too.
pub fn headers_well_formed(part: &[u8]) -> bool {
    let mut at = 0;
    while let Some(i) = memchr::memchr(b'\n', &part[at..]) {
        let line = &part[at..at + i];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return true;
        }
        let Some(colon) = memchr::memchr(b':', line) else {
            return false;
        };
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| is_token_byte(b)) {
            return false;
        }
        at += i + 1;
    }
    false
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn strip_line_break(body: &[u8], start: usize, mut end: usize) -> usize {
    if end > start && body[end - 1] == b'\n' {
        end -= 1;
        if end > start && body[end - 1] == b'\r' {
            end -= 1;
        }
    }
    end
}

/// A part's MIME headers (name, value) and its content.
pub fn part_headers(part: &[u8]) -> (Vec<(String, String)>, &[u8]) {
    let mut headers = Vec::new();
    let mut at = 0;
    while at < part.len() {
        let line_end = memchr::memchr(b'\n', &part[at..]).map_or(part.len(), |i| at + i);
        let line = &part[at..line_end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        at = (line_end + 1).min(part.len());
        if line.is_empty() {
            return (headers, &part[at..]);
        }
        let text = String::from_utf8_lossy(line);
        if let Some((name, value)) = text.split_once(':') {
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    (headers, &part[part.len()..])
}

/// The first header called `name` (case-insensitive).
pub fn find_header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_boundaries() {
        assert_eq!(
            boundary("multipart/mixed; boundary=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(
            boundary("multipart/related; charset=x; boundary=\"a b\"").as_deref(),
            Some("a b")
        );
        assert_eq!(boundary("application/json; boundary=abc"), None);
        // RFC 2046 parsers (Go's mime, Python's email) read "abc" here.
        assert_eq!(
            boundary(r#"multipart/mixed; foo="x; boundary=xyz"; boundary=abc"#).as_deref(),
            Some("abc")
        );
        assert_eq!(
            boundary(r#"multipart/mixed; boundary="x;y""#).as_deref(),
            Some("x;y")
        );
        assert_eq!(boundary("multipart/mixed; boundary=a; boundary=b"), None);
        assert_eq!(boundary(r#"multipart/mixed; boundary="abc"#), None);
        assert_eq!(boundary("multipart/mixed"), None);
    }

    #[test]
    fn splits_crlf_and_lf_bodies() {
        let crlf = b"preamble\r\n--b\r\nA: 1\r\n\r\none\r\n--b\r\n\r\ntwo\r\n--b--\r\n";
        let parts = split(crlf, "b").unwrap_or_default();
        assert_eq!(parts, vec![&b"A: 1\r\n\r\none"[..], &b"\r\ntwo"[..]]);
        let (headers, content) = part_headers(parts[0]);
        assert_eq!(headers, vec![("A".to_owned(), "1".to_owned())]);
        assert_eq!(content, b"one");

        let lf = b"--b\nA: 1\n\none\n--b--";
        let parts = split(lf, "b").unwrap_or_default();
        assert_eq!(parts, vec![&b"A: 1\n\none"[..]]);
        assert_eq!(part_headers(parts[0]).1, b"one");
    }

    #[test]
    fn content_mentioning_the_boundary_mid_line_is_kept() {
        let body = b"--b\r\n\r\nx --b y\r\n--b--";
        assert_eq!(
            split(body, "b").unwrap_or_default(),
            vec![&b"\r\nx --b y"[..]]
        );
        assert_eq!(split(b"no delimiter", "b"), None);
    }

    /// A part without the empty line that ends its headers, or with a header
    /// line other parsers read differently, is refused.
    #[test]
    fn a_part_without_its_header_end_is_refused() {
        assert_eq!(split(b"--b\r\n--b--\r\n", "b"), None);
        assert_eq!(split(b"--b\r\nA: 1\r\n--b--\r\n", "b"), None);
        assert_eq!(split(b"--b\r\n\r\n--b\n--b\n\nx\n--b--", "b"), None);
        assert!(split(b"--b\r\nA: 1\r\n\r\n--b--\r\n", "b").is_some());
        // Malformed or folded header lines.
        for head in [":\r\n", "A B: 1\r\n", " folded\r\n", "no colon\r\n"] {
            let body = format!("--b\r\nA: 1\r\n{head}\r\nx\r\n--b--\r\n");
            assert_eq!(split(body.as_bytes(), "b"), None, "{head:?}");
        }
    }

    /// `--B--junk` and `--Bjunk` are content lines, not delimiters: the
    /// parts after them are the upstream's parts too.
    #[test]
    fn a_delimiter_followed_by_other_text_is_content() {
        let body = b"--b\r\n\r\none\r\n--b--junk\r\n--bjunk\r\n--b\r\n\r\ntwo\r\n--b-- \r\n";
        assert_eq!(
            split(body, "b").unwrap_or_default(),
            vec![&b"\r\none\r\n--b--junk\r\n--bjunk"[..], &b"\r\ntwo"[..]]
        );
    }
}
