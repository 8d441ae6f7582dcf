//! Free text (error messages): physical names replaced where they stand as a
//! whole bucket-name token, never inside a longer token.

use std::borrow::Cow;

use crate::names::is_bucket_char;

/// Replaces every maximal run of bucket-name characters (ignoring trailing
/// dots, which end sentences) for which `translate` returns a name.
pub fn replace_bucket_tokens<'t>(
    text: &'t str,
    translate: impl Fn(&str) -> Option<String>,
) -> Cow<'t, str> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !is_bucket_char(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_bucket_char(bytes[i]) {
            i += 1;
        }
        let mut end = i;
        while end > start && bytes[end - 1] == b'.' {
            end -= 1;
        }
        if let Some(name) = translate(&text[start..end]) {
            let buf = out.get_or_insert_with(|| String::with_capacity(text.len() + 16));
            buf.push_str(&text[copied..start]);
            buf.push_str(&name);
            copied = end;
        }
    }
    match out {
        Some(mut buf) => {
            buf.push_str(&text[copied..]);
            Cow::Owned(buf)
        }
        None => Cow::Borrowed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_logical(name: &str) -> Option<String> {
        (name == "photos-k3x9q2mw").then(|| "photos".to_owned())
    }

    #[test]
    fn replaces_whole_tokens_only() {
        let cases = [
            (
                "No such object: photos-k3x9q2mw/a.jpg",
                "No such object: photos/a.jpg",
            ),
            ("bucket photos-k3x9q2mw.", "bucket photos."),
            (
                "'photos-k3x9q2mw' and gs://photos-k3x9q2mw/x",
                "'photos' and gs://photos/x",
            ),
            (
                "photos-k3x9q2mw-old is another",
                "photos-k3x9q2mw-old is another",
            ),
            ("photos-k3x9q2mw.txt", "photos-k3x9q2mw.txt"),
            ("nothing here", "nothing here"),
            ("ünïcode photos-k3x9q2mw ✓", "ünïcode photos ✓"),
        ];
        for (input, want) in cases {
            assert_eq!(replace_bucket_tokens(input, to_logical), want);
        }
    }
}
