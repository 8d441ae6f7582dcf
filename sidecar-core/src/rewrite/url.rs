//! Absolute URLs (`selfLink`, `mediaLink`, `Location`, `X-Goog-Upload-URL`)
//! and `x-goog-copy-source` values.

use http::{Method, Uri};
use percent_encoding::percent_decode_str;

use super::{Direction, Translator};
use crate::errors::ApiError;
use crate::route::{Api, Route, object_link_slot, route, virtual_host_bucket};

/// Rewrites an absolute URL so that it points at `tr.links` and names the
/// translated buckets. Returns `None` when `url` is not an absolute http(s)
/// URL (it is then left alone). Unknown bucket names are kept.
pub fn rewrite_url(url: &str, tr: &Translator<'_>) -> Option<String> {
    let mut out = String::new();
    push_rewritten_url(&mut out, url, tr).then_some(out)
}

/// [`rewrite_url`], appending the new URL to `out`; `false` (and nothing
/// appended) when `url` is not an absolute http(s) URL.
pub fn push_rewritten_url(out: &mut String, url: &str, tr: &Translator<'_>) -> bool {
    let parsed;
    let (host, path, query) = match split_plain_url(url) {
        Some(parts) => parts,
        None => {
            let Ok(uri) = url.parse::<Uri>() else {
                return false;
            };
            parsed = uri;
            let Some(authority) = parsed.authority() else {
                return false;
            };
            if !matches!(parsed.scheme_str(), Some("http" | "https")) {
                return false;
            }
            (authority.as_str(), parsed.path(), parsed.query())
        }
    };
    let vhost = virtual_host_bucket(host, |label| tr.mapping.knows(label));
    // An object's two links, the most common by far, need no routing.
    let object_link = vhost
        .is_none()
        .then(|| object_link_slot(path, query))
        .flatten();

    let (scheme, authority) = (&tr.links.scheme, &tr.links.authority);
    // Room for the base, the path, longer bucket names, and the query.
    out.reserve(
        scheme.len() + 3 + authority.len() + path.len() + 64 + query.map_or(0, |q| q.len() + 1),
    );
    out.push_str(scheme);
    out.push_str("://");
    out.push_str(authority);
    if let Some(slot) = object_link {
        out.push_str(&path[..slot.start]);
        out.push_str(lenient(tr, &path[slot.clone()]));
        out.push_str(&path[slot.end..]);
    } else {
        // A link names a resource, not a request: read it as the request a
        // client would send to it (a download or a metadata read, or a
        // chunk of a resumable session).
        let routed = [Method::GET, Method::PUT]
            .iter()
            .find_map(|method| route(method, path, query, vhost.as_deref()).ok());
        match &routed {
            Some(routed) => push_translated_path(out, path, routed, tr),
            None => out.push_str(path),
        }
    }
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    true
}

/// The authority, path and query of an `http`/`https` URL made only of
/// characters that [`Uri`] takes as they are (a lowercase scheme, a
/// host of `a-z 0-9 . -` with an optional port, no fragment): the parts it
/// would find, without copying the URL. `None` sends every other URL
/// through [`Uri`]'s parser.
fn split_plain_url(url: &str) -> Option<(&str, &str, Option<&str>)> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    if url.len() >= usize::from(u16::MAX) - 1 {
        return None;
    }
    let end = rest
        .bytes()
        .position(|b| b == b'/' || b == b'?')
        .unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(end);
    let (host, port) = match memchr::memchr(b':', authority.as_bytes()) {
        Some(colon) => (&authority[..colon], &authority[colon + 1..]),
        None => (authority, "0"),
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-'));
    let port_ok = port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok();
    if !host_ok || !port_ok || !path_and_query.bytes().all(|b| PLAIN[usize::from(b)]) {
        return None;
    }
    let (path, query) = match memchr::memchr(b'?', path_and_query.as_bytes()) {
        Some(q) => (&path_and_query[..q], Some(&path_and_query[q + 1..])),
        None => (path_and_query, None),
    };
    Some((authority, if path.is_empty() { "/" } else { path }, query))
}

/// The bytes [`split_plain_url`] lets through in a path and query.
static PLAIN: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        table[i] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'/'
                    | b'?'
                    | b'='
                    | b'&'
                    | b':'
                    | b'+'
                    | b','
                    | b';'
                    | b'!'
                    | b'$'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'@'
            );
        i += 1;
    }
    table
};

/// Appends `path` to `out` with the bucket slots the router found in it
/// translated (names the mapping does not know are kept), moved between
/// path style and virtual-hosted style as `tr.links` asks.
fn push_translated_path(out: &mut String, path: &str, routed: &Route, tr: &Translator<'_>) {
    let start = out.len();
    let mut at = 0;
    for slot in &routed.buckets {
        out.push_str(&path[at..slot.range.start]);
        out.push_str(lenient(tr, &slot.name));
        at = slot.range.end;
    }
    out.push_str(&path[at..]);

    if let Some(bucket) = &routed.virtual_host {
        let bucket = lenient(tr, bucket);
        if tr.links.virtual_host.as_deref() != Some(bucket) {
            // Virtual-hosted style upstream, path style towards the client.
            if &out[start..] == "/" {
                out.truncate(start);
            }
            out.insert_str(start, bucket);
            out.insert(start, '/');
        }
    } else if routed.api == Api::Xml
        && let (Some(slot), Some(vhost)) =
            (routed.buckets.first(), tr.links.virtual_host.as_deref())
        && lenient(tr, &slot.name) == vhost
    {
        // Path style upstream, virtual-hosted style towards the client: the
        // leading `/{bucket}` goes.
        let end = start + slot.range.start + vhost.len();
        out.replace_range(start..end, "");
        if out.len() == start {
            out.push('/');
        }
    }
}

/// The translated name, or `name` itself when the mapping does not know it.
fn lenient<'n>(tr: &Translator<'n>, name: &'n str) -> &'n str {
    tr.bucket_lenient_str(name).unwrap_or(name)
}

/// Rewrites `x-goog-copy-source` / `x-amz-copy-source` (`[/]BUCKET/OBJECT[?…]`,
/// possibly percent-encoded). Only requests carry it, so the name is checked strictly.
pub fn rewrite_copy_source(value: &str, tr: &Translator<'_>) -> Result<String, ApiError> {
    debug_assert_eq!(tr.direction, Direction::ToPhysical);
    let (slash, rest) = match value.strip_prefix('/') {
        Some(rest) => ("/", rest),
        None => ("", value),
    };
    let (raw_bucket, object) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let bucket = percent_decode_str(raw_bucket)
        .decode_utf8()
        .map_err(|_| ApiError::bad_request("the copy source names a bucket that is not UTF-8"))?;
    if !crate::names::is_valid_bucket_name(&bucket) {
        return Err(ApiError::bad_request(format!(
            "the copy source {value:?} does not name a valid bucket"
        )));
    }
    let physical = tr.bucket_str(&bucket)?.unwrap_or(&bucket);
    Ok(format!("{slash}{physical}{object}"))
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{LinkBase, Translator};
    use super::*;

    fn to_logical<'a>(m: &'a crate::mapping::Mapping, links: &'a LinkBase) -> Translator<'a> {
        translator(m, links, Direction::ToLogical)
    }

    #[test]
    fn links_point_back_at_the_sidecar_with_logical_names() {
        let m = mapping();
        let links = sidecar_base();
        let tr = to_logical(&m, &links);
        let cases = [
            (
                "https://www.googleapis.com/storage/v1/b/photos-k3x9q2mw",
                "http://127.0.0.1:9023/storage/v1/b/photos",
            ),
            (
                "https://storage.googleapis.com/download/storage/v1/b/photos-k3x9q2mw/o/photos-k3x9q2mw%2Fa?generation=1&alt=media",
                "http://127.0.0.1:9023/download/storage/v1/b/photos/o/photos-k3x9q2mw%2Fa?generation=1&alt=media",
            ),
            (
                "https://storage.googleapis.com/upload/storage/v1/b/photos-k3x9q2mw/o?uploadType=resumable&name=a&upload_id=XYZ",
                "http://127.0.0.1:9023/upload/storage/v1/b/photos/o?uploadType=resumable&name=a&upload_id=XYZ",
            ),
            (
                "http://0.0.0.0:4443/upload/resumable/abc",
                "http://127.0.0.1:9023/upload/resumable/abc",
            ),
            (
                "https://photos-k3x9q2mw.storage.googleapis.com/a/b",
                "http://127.0.0.1:9023/photos/a/b",
            ),
            (
                "https://storage.googleapis.com/photos-k3x9q2mw/a/b?uploadId=1",
                "http://127.0.0.1:9023/photos/a/b?uploadId=1",
            ),
            (
                "https://storage.googleapis.com/other-bucket/a",
                "http://127.0.0.1:9023/other-bucket/a",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(rewrite_url(input, &tr).as_deref(), Some(want), "{input}");
        }
        assert_eq!(rewrite_url("not a url", &tr), None);
        assert_eq!(rewrite_url("/relative/path", &tr), None);
    }

    #[test]
    fn virtual_hosted_clients_get_virtual_hosted_links() {
        let m = mapping();
        let links = LinkBase {
            scheme: "http".into(),
            authority: "photos.localhost:9023".into(),
            virtual_host: Some("photos".into()),
        };
        let tr = to_logical(&m, &links);
        assert_eq!(
            rewrite_url(
                "https://storage.googleapis.com/photos-k3x9q2mw/a/b?upload_id=1",
                &tr
            )
            .as_deref(),
            Some("http://photos.localhost:9023/a/b?upload_id=1")
        );
        assert_eq!(
            rewrite_url("https://photos-k3x9q2mw.storage.googleapis.com/a", &tr).as_deref(),
            Some("http://photos.localhost:9023/a")
        );
    }

    #[test]
    fn request_links_go_to_the_upstream_with_physical_names() {
        let m = mapping();
        let links = upstream_base();
        let tr = translator(&m, &links, Direction::ToPhysical);
        assert_eq!(
            rewrite_url("http://127.0.0.1:9023/storage/v1/b/photos/o/x", &tr).as_deref(),
            Some("https://storage.googleapis.com/storage/v1/b/photos-k3x9q2mw/o/x")
        );
    }

    /// The rewrite as first written (a `Vec` of names, then `replace_slots`,
    /// then `format!`): the one-buffer rewrite must give the same URLs.
    fn reference(url: &str, tr: &Translator<'_>) -> Option<String> {
        let uri: Uri = url.parse().ok()?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return None;
        }
        let (path, query) = (uri.path(), uri.query());
        let vhost = virtual_host_bucket(uri.authority()?.as_str(), |l| tr.mapping.knows(l));
        let base = format!("{}://{}", tr.links.scheme, tr.links.authority);
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        let routed = [Method::GET, Method::PUT]
            .iter()
            .find_map(|m| route(m, path, uri.query(), vhost.as_deref()).ok());
        let Some(routed) = routed else {
            return Some(format!("{base}{path}{query}"));
        };
        let translated: Vec<String> = (routed.buckets.iter())
            .map(|s| tr.bucket_lenient(&s.name).unwrap_or_else(|| s.name.clone()))
            .collect();
        let names: Vec<&str> = translated.iter().map(String::as_str).collect();
        let mut new_path = crate::route::replace_slots(path, &routed.buckets, &names);
        if let Some(bucket) = &routed.virtual_host {
            let bucket = tr.bucket_lenient(bucket).unwrap_or_else(|| bucket.clone());
            if tr.links.virtual_host.as_deref() != Some(bucket.as_str()) {
                new_path = match new_path.as_str() {
                    "/" => format!("/{bucket}"),
                    _ => format!("/{bucket}{new_path}"),
                };
            }
        } else if routed.api == Api::Xml
            && let (Some(slot), Some(vhost)) =
                (routed.buckets.first(), tr.links.virtual_host.as_deref())
            && translated[0] == vhost
        {
            let end = slot.range.start + translated[0].len();
            new_path = match &new_path[end..] {
                "" => "/".to_owned(),
                rest => rest.to_owned(),
            };
        }
        Some(format!("{base}{new_path}{query}"))
    }

    fn link_url() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let scheme = prop_oneof![Just("https"), Just("http"), Just("ftp")];
        let host = prop_oneof![
            Just("storage.googleapis.com"),
            Just("www.googleapis.com"),
            Just("photos-k3x9q2mw.storage.googleapis.com"),
            Just("Photos-K3X9Q2MW.storage.googleapis.com"),
            Just("photos.localhost:9023"),
            Just("127.0.0.1:4443"),
            Just("[::1]:4443"),
        ];
        let bucket = prop_oneof![
            Just("photos-k3x9q2mw"),
            Just("photos"),
            Just("logs-aaaa1111"),
            Just("other-bucket"),
            Just("Bad"),
        ];
        let shape = prop_oneof![
            Just("/storage/v1/b/{B}"),
            Just("/storage/v1/b/{B}/o/{O}"),
            Just("/storage/v1/b/{B}/o/{O}/copyTo/b/{B}/o/{O}"),
            Just("/download/storage/v1/b/{B}/o/{O}"),
            Just("/upload/storage/v1/b/{B}/o"),
            Just("/upload/resumable/{O}"),
            Just("/{B}"),
            Just("/{B}/"),
            Just("/{B}/{O}"),
            Just("/{O}"),
            Just("/"),
        ];
        let object = "[a-z0-9%/.]{0,12}";
        let query = prop_oneof![
            Just(""),
            Just("?alt=media&generation=1"),
            Just("?uploadType=resumable&upload_id=x"),
            Just("?upload_id=1"),
            Just("?alt=json&alt=media"),
        ];
        (scheme, host, shape, bucket, object, query).prop_map(|(s, h, shape, b, o, q)| {
            let path = shape.replace("{B}", b).replace("{O}", &o);
            format!("{s}://{h}{path}{q}")
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 1024, ..proptest::prelude::ProptestConfig::default()
        })]

        #[test]
        fn one_buffer_rewrite_matches_the_reference(url in link_url(), base in 0..3usize, back in proptest::bool::ANY) {
            let m = mapping();
            let links = match base {
                0 => sidecar_base(),
                1 => upstream_base(),
                _ => LinkBase {
                    scheme: "http".into(),
                    authority: "photos.localhost:9023".into(),
                    virtual_host: Some("photos".into()),
                },
            };
            let direction = if back { Direction::ToPhysical } else { Direction::ToLogical };
            let tr = translator(&m, &links, direction);
            proptest::prop_assert_eq!(rewrite_url(&url, &tr), reference(&url, &tr), "{}", url);
        }
    }

    proptest::proptest! {
        #[test]
        fn plain_urls_split_as_uri_splits_them(url in "(https?|HTTP|ftp)://([a-z0-9.:-]{0,12}|[a-zA-Z0-9.:@\\[\\]-]{0,10})([/?][a-zA-Z0-9/?=&%#:.~ é\"_+,;!$'()*@<>{}|^`\\\\\\[\\]-]{0,16})?") {
            let by_uri = url.parse::<Uri>().ok().and_then(|uri| {
                let (path, query) = (uri.path().to_owned(), uri.query().map(str::to_owned));
                Some((uri.authority()?.as_str().to_owned(), path, query))
            });
            if let Some((authority, path, query)) = split_plain_url(&url) {
                proptest::prop_assert_eq!(
                    by_uri,
                    Some((authority.to_owned(), path.to_owned(), query.map(str::to_owned))),
                    "{}", url
                );
            }
        }
    }

    #[test]
    fn plain_urls_take_the_short_way() {
        assert_eq!(
            split_plain_url(
                "https://storage.googleapis.com/download/storage/v1/b/p/o/a%2Fb?alt=media"
            ),
            Some((
                "storage.googleapis.com",
                "/download/storage/v1/b/p/o/a%2Fb",
                Some("alt=media")
            ))
        );
        assert_eq!(
            split_plain_url("http://127.0.0.1:4443"),
            Some(("127.0.0.1:4443", "/", None))
        );
        assert_eq!(split_plain_url("http://h?q"), Some(("h", "/", Some("q"))));
        for other in [
            "ftp://h/x",
            "http://[::1]/x",
            "http://H/x",
            "http://h/x#f",
            "http://h:99999/",
            "http:///x",
        ] {
            assert_eq!(split_plain_url(other), None, "{other}");
        }
    }

    #[test]
    fn copy_source_is_translated_strictly() {
        let m = mapping();
        let links = upstream_base();
        let tr = translator(&m, &links, Direction::ToPhysical);
        assert_eq!(
            rewrite_copy_source("/photos/a%2Fb?generation=2", &tr)
                .ok()
                .as_deref(),
            Some("/photos-k3x9q2mw/a%2Fb?generation=2")
        );
        assert_eq!(
            rewrite_copy_source("logs/x", &tr).ok().as_deref(),
            Some("logs-aaaa1111/x")
        );
        assert_eq!(
            rewrite_copy_source("/nope/x", &tr).map_err(|e| e.status.as_u16()),
            Err(404)
        );
        assert_eq!(
            rewrite_copy_source("/photos-k3x9q2mw/x", &tr).map_err(|e| e.status.as_u16()),
            Err(403)
        );
        assert_eq!(
            rewrite_copy_source("/%zz/x", &tr).map_err(|e| e.status.as_u16()),
            Err(400)
        );
    }
}
