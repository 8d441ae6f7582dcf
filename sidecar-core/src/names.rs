//! Bucket-name syntax shared by the mapping loader, the router and the rewriters.

/// Characters that may appear in a GCS bucket name.
pub fn is_bucket_char(b: u8) -> bool {
    CLASS[usize::from(b)] != OTHER
}

/// A byte's class in a bucket name, looked up once per byte.
const OTHER: u8 = 0;
const NAME: u8 = 1;
const DOT: u8 = 2;

static CLASS: [u8; 256] = {
    let mut table = [OTHER; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        if b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' {
            table[i] = NAME;
        } else if b == b'.' {
            table[i] = DOT;
        }
        i += 1;
    }
    table
};

/// Whether `name` is a syntactically valid GCS bucket name: 3–63 characters
/// (up to 222 when dotted, each dot-separated component at most 63) of
/// `a-z 0-9 - _ .`, starting and ending with a letter or digit, not an IPv4
/// address. The reserved-word rules (`goog`, `google`) are the operator's
/// concern: the sidecar only needs names that are safe to put in a path.
pub fn is_valid_bucket_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if bytes.len() < 3 || bytes.len() > 222 || !alnum(first) || !alnum(last) {
        return false;
    }
    // One pass: the characters, and the length of each dot-separated
    // component (`start`: where the current one begins).
    let (mut dotted, mut start) = (false, 0);
    for (i, &b) in bytes.iter().enumerate() {
        match CLASS[usize::from(b)] {
            NAME => {}
            DOT if (1..=63).contains(&(i - start)) => {
                dotted = true;
                start = i + 1;
            }
            _ => return false,
        }
    }
    // The last component is at most 63 too; only a dotted name may exceed
    // 63 characters in all or be an IPv4 address.
    bytes.len() - start <= 63 && (!dotted || name.parse::<std::net::Ipv4Addr>().is_err())
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

    /// The rules as documented, one at a time: what the one-pass check must agree with.
    fn by_the_rules(name: &str) -> bool {
        let bytes = name.as_bytes();
        let dotted = name.contains('.');
        let max = if dotted { 222 } else { 63 };
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        (3..=max).contains(&bytes.len())
            && bytes.iter().all(|&b| is_bucket_char(b))
            && alnum(bytes[0])
            && alnum(bytes[bytes.len() - 1])
            && !name.split('.').any(|p| p.is_empty() || p.len() > 63)
            && (!dotted || name.parse::<std::net::Ipv4Addr>().is_err())
    }

    #[test]
    fn length_limits_hold_at_their_edges() {
        let component = |n| "a".repeat(n);
        let dotted = |parts: usize, n| vec![component(n); parts].join(".");
        assert!(is_valid_bucket_name(&component(63)));
        assert!(!is_valid_bucket_name(&component(64)));
        assert!(is_valid_bucket_name(&dotted(2, 63)));
        assert!(!is_valid_bucket_name(&dotted(2, 64)));
        // 55 * 4 + 3 dots = 223 > 222; 55 + 3 * 54 + 3 dots = 220.
        assert!(!is_valid_bucket_name(&dotted(4, 55)));
        assert!(is_valid_bucket_name(&format!(
            "{}.{}",
            component(55),
            dotted(3, 54)
        )));
        assert!(is_valid_bucket_name("1.2.3.4.5"));
        assert!(!is_valid_bucket_name("1.2.3.4"));
    }

    proptest::proptest! {
        #[test]
        fn one_pass_check_agrees_with_the_rules(name in "[a-z0-9._A-]{0,8}|[a-z.]{60,70}|[0-9.]{7,15}") {
            proptest::prop_assert_eq!(is_valid_bucket_name(&name), by_the_rules(&name), "{:?}", name);
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
