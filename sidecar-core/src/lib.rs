//! bucketmap-sidecar-core: the sidecar's rules, without I/O. What a request
//! is, whether it may be forwarded, and how its bucket names are translated
//! both ways; the `bucketmap-sidecar` crate is the I/O shell around it
//! (listeners, the tower stack, bodies as streams, the upstream client,
//! credentials, the map's file watch).
//!
//! - [`route`]: the raw, still percent-encoded path (and `Host`, for the XML
//!   API's virtual-hosted style) classified once — which API, where the
//!   bucket segments are, how the bodies are handled; the JSON API's table
//!   comes from Google's discovery document ([`discovery`], built into a
//!   static table by `build.rs`). Deny by default: what it does not
//!   positively understand is a [`route::RouteError`]; [`resource`]: the
//!   JSON resource a body holds.
//! - [`rewrite`]: structured fields only — JSON resources by kind
//!   ([`rewrite::json`]), XML elements ([`rewrite::xml`]), absolute links
//!   and copy sources ([`rewrite::url`]), whole-token replacement in error
//!   messages ([`rewrite::text`]); requests strictly
//!   ([`rewrite::strict`]), responses leniently; [`answer`]: answers the
//!   rewriter cannot read.
//! - [`multipart`] and [`batch`]: `multipart/*` bodies split, and batches
//!   translated part by part and merged back.
//! - [`grpc`]: the method table derived from Google's protos
//!   ([`grpc::schema`]), the message framer ([`grpc::frame`]) and the
//!   protobuf wire walker ([`grpc::wire`]: unknown fields kept byte for
//!   byte), the routing header ([`grpc::headers`]) and gRPC statuses
//!   ([`grpc::status`]).
//! - [`policy`]: the one request policy of both protocols: the
//!   protocol-neutral request model, the decision (forward or refuse) and
//!   the one refusal type with its table of GCS reasons, HTTP statuses and
//!   gRPC codes.
//! - [`relocation`]: what happens to requests to an entry a move is
//!   switching to another bucket (held, refused, cut off).
//! - [`mapping`]: the validated logical ↔ physical bijection; [`names`]:
//!   bucket-name syntax; [`errors`]: the GCS-style errors the sidecar
//!   answers itself; [`signing`]: signed requests, which a rewrite would
//!   break; [`hop_by_hop`]: the headers that never cross the proxy.
//!
//! Dependencies: the `http` crate's types are the vocabulary; no hyper,
//! tokio, tower or h2 (`.ci/fast` checks the tree), so everything here runs
//! in a property test or a fuzz target (`fuzz/`) without a runtime.

pub mod answer;
pub mod batch;
pub mod discovery;
pub mod errors;
pub mod grpc;
pub mod hop_by_hop;
pub mod mapping;
pub mod multipart;
pub mod names;
pub mod policy;
pub mod relocation;
pub mod resource;
pub mod rewrite;
pub mod route;
pub mod signing;
