//! Bucket-name syntax shared by the mapping loader, the router and the rewriters.

/// Characters that may appear in a GCS bucket name.
pub fn is_bucket_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
}

/// Whether `name` is a syntactically valid GCS bucket name: 3–63 characters
/// (up to 222 when dotted, each dot-separated component at most 63) of
/// `a-z 0-9 - _ .`, starting and ending with a letter or digit, not an IPv4
/// address. The reserved-word rules (`goog`, `google`) are the operator's
/// concern: the sidecar only needs names that are safe to put in a path.
pub fn is_valid_bucket_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let dotted = name.contains('.');
    let max = if dotted { 222 } else { 63 };
    if bytes.len() < 3 || bytes.len() > max {
        return false;
    }
    if !bytes.iter().all(|&b| is_bucket_char(b)) {
        return false;
    }
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    if name
        .split('.')
        .any(|part| part.is_empty() || part.len() > 63)
    {
        return false;
    }
    // Only a dotted name can be an IPv4 address.
    !dotted || name.parse::<std::net::Ipv4Addr>().is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_gcs_names() {
        for ok in [
            "photos",
            "photos-k3x9q2mw",
            "a_b",
            "abc",
            "my.bucket.example",
            "123",
        ] {
            assert!(is_valid_bucket_name(ok), "{ok}");
        }
    }

    #[test]
    fn rejects_bad_names() {
        let long = "a".repeat(64);
        for bad in [
            "", "ab", "Photos", "-abc", "abc-", "a b", "a/b", "..", "a..b", "10.0.0.1", &long,
            "é-abc", "abc%2f",
        ] {
            assert!(!is_valid_bucket_name(bad), "{bad}");
        }
    }
}
