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

pub mod frame;
pub mod headers;
pub mod layer;
pub mod resource;
#[rustfmt::skip]
#[allow(missing_docs, reason = "generated")]
pub mod schema;
pub mod service;
pub mod status;
pub mod stream;
pub mod table;
pub mod wire;

use std::sync::{Arc, LazyLock};

use crate::mapping::Mapping;
use crate::rewrite::{Direction, LinkBase, Translator};

/// gRPC messages carry no links: the translator's link base is never used.
static NO_LINKS: LazyLock<LinkBase> = LazyLock::new(|| LinkBase {
    scheme: Arc::from(""),
    authority: Arc::from(""),
    virtual_host: None,
});

/// The map in force for one call and the request policy.
#[derive(Debug)]
pub struct Names {
    /// The map of logical to physical names.
    pub mapping: Arc<Mapping>,
    /// Accept the physical names of mapped buckets in requests.
    pub allow_physical: bool,
}

impl Names {
    /// A translator of names in `direction`.
    pub fn translator(&self, direction: Direction) -> Translator<'_> {
        Translator {
            mapping: &self.mapping,
            direction,
            allow_physical: self.allow_physical,
            links: &NO_LINKS,
        }
    }
}
