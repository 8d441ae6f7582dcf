//! The gRPC API (`google.storage.v2`, `google.storage.control.v2`): calls
//! arrive on the proxy's listener over HTTP/2 (h2c, told apart from HTTP/1
//! by the connection preface) and are told apart from JSON/XML requests by
//! their `application/grpc` content type ([`layer`]). Each known method
//! ([`schema`], derived from Google's protos) is forwarded over one
//! multiplexed HTTP/2 pool to `--grpc-upstream` ([`service`]), its bucket
//! names rewritten at the protobuf wire level ([`wire`]) message by message
//! as the streams pass ([`stream`], [`frame`]), its routing header
//! translated ([`headers`]) and its status messages translated back
//! ([`status`]). Deny by default: unknown methods, unknown routing keys,
//! names the map cannot translate and malformed messages are refused with
//! a gRPC status before anything is sent upstream.
//!
//! The rules without I/O — the method table, the wire walker, the framer,
//! the routing header — are `bucketmap-sidecar-core`'s, re-exported here.

pub mod layer;
pub mod service;
pub mod status;
pub mod stream;

pub use bucketmap_sidecar_core::grpc::{Names, frame, headers, resource, schema, table, wire};
