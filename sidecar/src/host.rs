//! The host a request names: its `Host` (or authority), and the bucket it
//! names when the request is virtual-hosted (XML API). The refusal layer
//! routes by it; the admin layer answers only the sidecar's own host.

use std::net::SocketAddr;

use http::{Request, header};

use crate::mapping::Mapping;
use crate::route::virtual_host_bucket;

/// The request's host (`Host`, the URI's authority, or else the configured
/// listen address) and the bucket it names when the request is
/// virtual-hosted (XML API: `photos.localhost:9023`).
pub fn virtual_host<B>(
    req: &Request<B>,
    mapping: Option<&Mapping>,
    listen: SocketAddr,
) -> (String, Option<String>) {
    let host = request_host(req).unwrap_or_else(|| listen.to_string());
    let bucket = mapping.and_then(|m| virtual_host_bucket(&host, |label| m.knows(label)));
    (host, bucket)
}

fn request_host<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .filter(|h| !h.is_empty())
}
