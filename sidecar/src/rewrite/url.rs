//! Absolute URLs (`selfLink`, `mediaLink`, `Location`, `X-Goog-Upload-URL`)
//! and `x-goog-copy-source` values.

use http::{Method, Uri};
use percent_encoding::percent_decode_str;

use super::{Direction, Translator, request_bucket};
use crate::errors::ApiError;
use crate::route::{Api, replace_slots, route, virtual_host_bucket};

/// Rewrites an absolute URL so that it points at `tr.links` and names the
/// translated buckets. Returns `None` when `url` is not an absolute http(s)
/// URL (it is then left alone). Unknown bucket names are kept.
pub fn rewrite_url(url: &str, tr: &Translator<'_>) -> Option<String> {
    let uri: Uri = url.parse().ok()?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return None;
    }
    let host = uri.authority()?.as_str();
    let path = uri.path();
    let query = uri.query();
    let vhost = virtual_host_bucket(host, |label| tr.mapping.knows(label));
    let with_base = |path: &str| {
        let (scheme, authority) = (&tr.links.scheme, &tr.links.authority);
        let mut url = String::with_capacity(
            scheme.len() + 3 + authority.len() + path.len() + query.map_or(0, |q| q.len() + 1),
        );
        url.push_str(scheme);
        url.push_str("://");
        url.push_str(authority);
        url.push_str(path);
        if let Some(query) = query {
            url.push('?');
            url.push_str(query);
        }
        url
    };

    // A link names a resource, not a request: read it as the request a
    // client would send to it (a download or a metadata read, or a chunk
    // of a resumable session).
    let routed = [Method::GET, Method::PUT]
        .iter()
        .find_map(|method| route(method, path, query, vhost.as_deref()).ok());
    let Some(routed) = routed else {
        return Some(with_base(path));
    };
    let translated: Vec<String> = routed
        .buckets
        .iter()
        .map(|slot| {
            tr.bucket_lenient(&slot.name)
                .unwrap_or_else(|| slot.name.clone())
        })
        .collect();
    let names: Vec<&str> = translated.iter().map(String::as_str).collect();
    let mut new_path = replace_slots(path, &routed.buckets, &names);

    if let Some(bucket) = &routed.virtual_host {
        let bucket = tr.bucket_lenient(bucket).unwrap_or_else(|| bucket.clone());
        if tr.links.virtual_host.as_deref() != Some(bucket.as_str()) {
            new_path = if new_path == "/" {
                format!("/{bucket}")
            } else {
                format!("/{bucket}{new_path}")
            };
        }
    } else if routed.api == Api::Xml
        && let (Some(slot), Some(vhost)) =
            (routed.buckets.first(), tr.links.virtual_host.as_deref())
        && translated.first().map(String::as_str) == Some(vhost)
    {
        // Path style upstream, virtual-hosted style towards the client.
        let end = slot.range.start + translated[0].len();
        new_path = match &new_path[end..] {
            "" => "/".to_owned(),
            rest => rest.to_owned(),
        };
    }
    Some(with_base(&new_path))
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
    let physical = request_bucket(tr.mapping, tr.allow_physical, &bucket)?;
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
