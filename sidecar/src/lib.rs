//! bucketmap-sidecar: a per-pod HTTP proxy that lets unmodified Google Cloud
//! Storage clients use logical bucket names.
//!
//! This crate is the I/O shell: listeners, the tower stack, bodies as
//! streams, the upstream client, credentials and the map's file watch. The
//! rules — routing, the discovery-derived table, the rewriters, batches,
//! the gRPC wire walker — are `bucketmap-sidecar-core`'s, without I/O, and
//! re-exported here under their module names.
//!
//! A request flows through a tower stack ([`server::proxy_stack`], layers in
//! [`layers`]), outermost first:
//! 1. [`layers::record`]: log lines, the `requests` metric, the in-flight
//!    gauge, body bytes to the client.
//! 2. [`layers::admin`]: `/_bucketmap/{healthz,readyz,metrics}`, answered by
//!    the same [`layers::admin::Admin`] that serves the `--admin-addr`
//!    listener.
//! 3. [`grpc::layer`]: gRPC calls (`application/grpc`, over h2c on the same
//!    port) leave for [`grpc`]: known methods only, bucket names rewritten
//!    at the protobuf wire level message by message as the streams pass.
//! 4. [`layers::refuse`]: what cannot be rewritten is refused here (a
//!    bad `X-HTTP-Method-Override`, signed URLs and HMAC signatures, names
//!    the map cannot translate). [`route`] classifies the raw, still
//!    percent-encoded path (and `Host`, for the XML API's virtual-hosted
//!    style) — which API, where the bucket segments are, how the bodies are
//!    handled — once; object names are never decoded or re-encoded, only the
//!    bucket segments' byte ranges are replaced. The bucket names are
//!    looked up in [`mapping`]'s map in force (an `ArcSwap` snapshot, so a
//!    reload never disturbs a request in flight), kept current by [`watch`]
//!    and [`live`]. A write naming an entry a move has fenced
//!    (`<physical>;fenced`, [`relocation`]) is held here, its body unread,
//!    until the map changes, then decided again ([`hold`], `--hold-limit`).
//! 5. [`layers::credentials`]: Application Default Credentials ([`auth`])
//!    for requests without their own `Authorization`.
//! 6. The core, [`proxy::Core`]: [`rewrite`] translates structured fields
//!    only — JSON resources by kind ([`rewrite::json`]), XML elements
//!    ([`rewrite::xml`]), absolute links and copy sources ([`rewrite::url`]),
//!    whole-token replacement in error messages ([`rewrite::text`]).
//!    Requests are translated strictly (an unknown name is refused, so a
//!    logical name never reaches GCS, where it could be somebody else's
//!    bucket); responses leniently. Object data streams both ways; metadata
//!    bodies are read whole under `--max-metadata-bytes`;
//!    `multipart/related` uploads have their metadata part rewritten while
//!    the data streams ([`upload`]); batches are split, translated part by
//!    part and merged back ([`batch`]). The upstream call goes through
//!    [`layers::timeout`] (`--upstream-timeout`, to the response head).
//!
//! [`server`]: hyper 1 (HTTP/1.1 and h2c), a tower concurrency limit in front
//! of the stack, graceful drain on SIGTERM.
//!
//! A move's switch ([`relocation`], docs/ARCHITECTURE.md): writes are held
//! while their entry is fenced — by a name in the path, `Host` or routing
//! header before anything is read; by a name in a metadata body, a batch
//! part or the first gRPC message with what was read — and cut off while
//! in flight when the map fences or moves their bucket or goes stale
//! ([`flights`]: the body fails before it is complete, so GCS commits
//! nothing).
//!
//! Deny by default: the JSON API's operations come from Google's discovery
//! document ([`discovery`]); bodies are checked strictly
//! ([`rewrite::strict`]) and gzip ones decoded ([`encoding`]) before they
//! are rewritten.
//!
//! Crates chosen over hand-written code: `mime` (media-type parameters, so
//! multipart boundaries are read as RFC 2046 parsers read them), `flate2`
//! (gzip), `quick-xml` (XML events with
//! entities handled), `httparse` (the nested HTTP messages of batches —
//! hyper's own parser), `memchr` (boundary search), `percent-encoding`,
//! `arc-swap`, `notify`, `prometheus-client`, `google-cloud-auth` (ADC with
//! token caching and refresh), `hyper-rustls` with bundled webpki roots.
//! `prost` (protobuf varints and keys), `tonic` without its transport (gRPC
//! status codes and their trailers).
//! Hand-written: the gRPC message framer and the protobuf wire walker
//! ([`grpc::frame`], [`grpc::wire`]: decoding into the generated types and
//! encoding again would lose or reorder fields the types do not know, and
//! copy object data); the multipart splitting (a few dozen lines; `multer` is
//! streaming `multipart/form-data`-oriented and wants `Content-Disposition`),
//! and the incremental first-part scan of uploads, which must hand the rest of
//! the body on as a stream.

pub mod auth;
pub mod body;
pub mod config;
pub mod encoding;
pub mod flights;
pub mod grpc;
pub mod hold;
pub mod host;
pub mod layers;
pub mod live;
pub mod mapping;
pub mod metrics;
pub mod proxy;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod upload;
pub mod upstream;
pub mod watch;

#[cfg(test)]
mod live_model_tests;
#[cfg(test)]
mod policy_tests;

/// The rules without I/O, from `bucketmap-sidecar-core`, under the names
/// the shell and its tests use.
pub use bucketmap_sidecar_core::{
    answer, batch, discovery, errors, hop_by_hop, multipart, names, policy, relocation, rewrite,
    route, signing,
};
