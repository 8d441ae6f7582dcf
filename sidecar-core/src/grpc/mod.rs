//! The gRPC API (`google.storage.v2`, `google.storage.control.v2`) without
//! its transport: each known method ([`schema`], derived from Google's
//! protos, read through [`table`]) has its bucket names rewritten at the
//! protobuf wire level ([`wire`], [`resource`]) message by message, as the
//! framer ([`frame`]) cuts them out of a stream; its routing header is
//! translated ([`headers`]) and its statuses are the sidecar's own
//! ([`status`]). Deny by default: unknown routing keys, names the map
//! cannot translate and malformed messages are a [`status::Status`] before
//! anything is sent upstream. The shell (`bucketmap-sidecar`'s `grpc`)
//! serves and forwards the calls.

pub mod frame;
pub mod headers;
pub mod resource;
#[rustfmt::skip]
#[allow(missing_docs, reason = "generated")]
pub mod schema;
pub mod status;
pub mod table;
pub mod wire;

#[cfg(test)]
mod read_rpcs_tests;

use std::sync::{Arc, LazyLock};

use crate::mapping::Mapping;
use crate::policy::Access;
use crate::rewrite::{Direction, LinkBase, Seen, Translator};

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
    /// What a move's fence needs to know of the call.
    pub access: Access,
}

impl Names {
    /// A translator of names in `direction`.
    pub fn translator(&self, direction: Direction) -> Translator<'_> {
        Translator {
            mapping: &self.mapping,
            direction,
            allow_physical: self.allow_physical,
            links: &NO_LINKS,
            access: self.access,
            seen: None,
        }
    }

    /// A translator of request names that tells `seen` each physical name.
    pub fn seeing<'s>(&'s self, seen: &'s (dyn Fn(&str) + Send + Sync + 's)) -> Translator<'s> {
        Translator {
            seen: Some(Seen(seen)),
            ..self.translator(Direction::ToPhysical)
        }
    }
}
