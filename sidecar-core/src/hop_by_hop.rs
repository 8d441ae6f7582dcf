//! Hop-by-hop headers (RFC 9110 §7.6.1): never forwarded in either
//! direction, with those the `Connection` header lists; and whether a
//! client's own `Authorization` survives them.

use http::header::{self, HeaderMap, HeaderName};

/// Hop-by-hop headers, never forwarded in either direction.
pub static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Which of `names` `headers` holds, found in one pass over the few
/// headers a message has: removing or looking up an absent name still
/// hashes it and probes the map. A header is compared only with the names
/// of its length; most headers have none.
pub fn present<const N: usize>(headers: &HeaderMap, names: [&HeaderName; N]) -> [bool; N] {
    let lengths = names
        .iter()
        .fold(0u64, |mask, name| mask | length_bit(name.as_str().len()));
    let mut present = [false; N];
    for name in headers.keys() {
        if lengths & length_bit(name.as_str().len()) == 0 {
            continue;
        }
        if let Some(i) = names.iter().position(|wanted| *wanted == name) {
            present[i] = true;
        }
    }
    present
}

/// A bit for a header name's length in a mask of lengths; names of 63
/// bytes and more share the last bit.
fn length_bit(length: usize) -> u64 {
    1 << length.min(63)
}

/// Removes the headers `names` from `headers`, only those it holds.
pub fn remove_present<const N: usize>(headers: &mut HeaderMap, names: [&HeaderName; N]) {
    for (name, here) in names.into_iter().zip(present(headers, names)) {
        if here {
            headers.remove(name);
        }
    }
}

/// Removes the hop-by-hop headers, and those the `Connection` header lists.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // `HOP_BY_HOP[0]` is `Connection`, whose list is hop-by-hop too.
    let present = present(headers, HOP_BY_HOP.each_ref());
    if !present.contains(&true) {
        return;
    }
    let listed: Vec<HeaderName> = match present[0] {
        true => connection_listed(headers).collect(),
        false => Vec::new(),
    };
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, here)| *here) {
        headers.remove(name);
    }
    for name in &listed {
        headers.remove(name);
    }
}

/// The headers the `Connection` header lists: hop-by-hop too.
pub fn connection_listed(headers: &HeaderMap) -> impl Iterator<Item = HeaderName> + '_ {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
}

/// Whether the client's own `Authorization` reaches the upstream: it is
/// sent, and not made hop-by-hop by the `Connection` header.
pub fn forwards_authorization(headers: &HeaderMap) -> bool {
    headers.contains_key(header::AUTHORIZATION)
        && !connection_listed(headers).any(|name| name == header::AUTHORIZATION)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn header_map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn hop_by_hop_headers_are_stripped_with_those_connection_lists() {
        assert_eq!(
            HOP_BY_HOP[0],
            header::CONNECTION,
            "strip_hop_by_hop relies on it"
        );
        let mut headers = header_map(&[
            ("connection", "x-secret, keep-alive"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("x-secret", "1"),
            ("content-type", "application/json"),
        ]);
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type"]);

        let mut headers = header_map(&[("upgrade", "h2c")]);
        strip_hop_by_hop(&mut headers);
        assert!(headers.is_empty(), "{headers:?}");
    }

    proptest::proptest! {
        #[test]
        fn present_finds_what_a_plain_search_finds(
            held in proptest::collection::vec(
                "connection|keep-alive|te|trailer|upgrade|location|x-goog-upload-url|\
                 x-goog-generation|transfer-encodinx|content-type|x-[a-z]{60,70}|[a-z-]{1,20}",
                0..12,
            ),
            wanted_long in "x-[a-z]{61,70}",
        ) {
            let headers: HeaderMap = held
                .iter()
                .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
                .map(|name| (name, HeaderValue::from_static("v")))
                .collect();
            let long = HeaderName::from_bytes(wanted_long.as_bytes())
                .unwrap_or_else(|e| panic!("{wanted_long}: {e}"));
            // The proxy's link headers, as it asks for them with the hop-by-hop ones.
            let links = [
                header::LOCATION,
                header::CONTENT_LOCATION,
                HeaderName::from_static("x-goog-upload-url"),
                HeaderName::from_static("x-goog-upload-control-url"),
            ];
            let mut names: Vec<&HeaderName> = HOP_BY_HOP.iter().chain(&links).collect();
            names.push(&long);
            let names: [&HeaderName; 14] = names
                .try_into()
                .unwrap_or_else(|n: Vec<_>| panic!("{} names", n.len()));
            let found = present(&headers, names);
            for (name, here) in names.iter().zip(found) {
                proptest::prop_assert_eq!(here, headers.contains_key(*name), "{}", name);
            }
        }
    }

    #[test]
    fn messages_without_hop_by_hop_headers_keep_every_header() {
        let pairs = [
            ("content-type", "application/json"),
            ("x-goog-generation", "1"),
            ("x-goog-generation", "2"),
        ];
        let mut headers = header_map(&pairs);
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers, header_map(&pairs));
    }
}
