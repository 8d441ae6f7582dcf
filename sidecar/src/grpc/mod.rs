//! The gRPC API (`google.storage.v2`, `google.storage.control.v2`).
#[rustfmt::skip]
#[allow(missing_docs, reason = "generated")]
pub mod schema;
pub mod resource;
pub mod table;
pub mod wire;
