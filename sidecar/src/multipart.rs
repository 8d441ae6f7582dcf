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
/// Returns `None` if the body has no opening delimiter.
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
        let padding = rest
            .iter()
            .take_while(|b| matches!(b, b' ' | b'\t'))
            .count();
        let ends_line =
            rest.starts_with(b"--") || matches!(rest.get(padding), None | Some(b'\r' | b'\n'));
        if (at == 0 || body[at - 1] == b'\n') && ends_line {
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
        parts.push(&body[content_start..strip_line_break(body, content_start, next)]);
    }
    Some(parts)
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
}
