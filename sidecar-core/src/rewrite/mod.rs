//! Name translation for bodies, headers and links, in both directions.
//!
//! Requests go logical → physical ([`Direction::ToPhysical`]), strictly: a
//! name the mapping does not know is refused, so a logical name can never
//! reach GCS, where it could be somebody else's bucket. Responses go
//! physical → logical ([`Direction::ToLogical`]), leniently: names the
//! mapping does not know are left alone (or dropped from bucket lists).

pub mod json;
mod scan;
pub mod strict;
pub mod text;
pub mod url;
pub mod xml;

#[cfg(test)]
mod proptests;

use std::sync::Arc;

use crate::errors::ApiError;
use crate::mapping::Mapping;
use crate::policy::Access;

/// Which way names are translated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Request: logical → physical.
    ToPhysical,
    /// Response: physical → logical.
    ToLogical,
}

/// Where rewritten absolute URLs point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkBase {
    /// `http` or `https` (shared: a base is made for every request, and
    /// most requests' bases share both parts with the proxy's own).
    pub scheme: Arc<str>,
    /// `host[:port]`.
    pub authority: Arc<str>,
    /// The (translated) bucket the base's host names, virtual-hosted style.
    pub virtual_host: Option<String>,
}

/// Told each physical name a request's translation uses (the shell keeps
/// those of a write, to cut it off if a move fences its bucket).
#[derive(Clone, Copy)]
pub struct Seen<'a>(pub &'a (dyn Fn(&str) + Send + Sync + 'a));

impl std::fmt::Debug for Seen<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seen")
    }
}

/// Translates bucket names found in one message.
#[derive(Clone, Copy, Debug)]
pub struct Translator<'a> {
    /// The map of logical to physical names the message is translated with.
    pub mapping: &'a Mapping,
    /// Request (to physical) or response (to logical).
    pub direction: Direction,
    /// In requests, accept the physical names of mapped buckets too.
    pub allow_physical: bool,
    /// Where rewritten absolute URLs point.
    pub links: &'a LinkBase,
    /// In requests, what a move's fence needs to know of the request
    /// ([`crate::policy::bucket_in_body`]).
    pub access: Access,
    /// In requests, told each physical name used.
    pub seen: Option<Seen<'a>>,
}

impl<'a> Translator<'a> {
    /// Translates a name from a field that must name a bucket the app may use.
    /// `Ok(None)` means "leave as is".
    pub fn bucket(&self, name: &str) -> Result<Option<String>, ApiError> {
        Ok(self.bucket_str(name)?.map(str::to_owned))
    }

    /// [`Translator::bucket`], borrowed from the mapping or from `name`.
    pub fn bucket_str<'n>(&self, name: &'n str) -> Result<Option<&'n str>, ApiError>
    where
        'a: 'n,
    {
        match self.direction {
            Direction::ToPhysical => {
                let physical = crate::policy::bucket_in_body(
                    self.mapping,
                    self.allow_physical,
                    self.access,
                    name,
                )?;
                if let Some(Seen(seen)) = self.seen {
                    seen(physical);
                }
                Ok(Some(physical))
            }
            Direction::ToLogical => Ok(self.mapping.logical(name)),
        }
    }

    /// Translates a name from a field that is informational (ids, links):
    /// unknown names are left as they are in both directions.
    pub fn bucket_lenient(&self, name: &str) -> Option<String> {
        self.bucket_lenient_str(name).map(str::to_owned)
    }

    /// [`Translator::bucket_lenient`], borrowed from the mapping.
    pub fn bucket_lenient_str(&self, name: &str) -> Option<&'a str> {
        match self.direction {
            Direction::ToPhysical => self.mapping.physical(name),
            Direction::ToLogical => self.mapping.logical(name),
        }
    }

    /// Whether a bucket the mapping does not know stays visible in responses.
    pub fn shows_unmapped(&self) -> bool {
        self.allow_physical
    }
}

/// The physical name a request may use for `name`: the mapped physical name
/// of a logical bucket, or `name` itself if it is a physical name and those
/// are allowed. Anything else is refused.
pub fn request_bucket(
    mapping: &Mapping,
    allow_physical: bool,
    name: &str,
) -> Result<String, ApiError> {
    request_bucket_str(mapping, allow_physical, name).map(str::to_owned)
}

/// [`request_bucket`], borrowed from the mapping (or from `name`): the
/// policy's one rule for a request's bucket names ([`crate::policy::bucket`]).
pub fn request_bucket_str<'m>(
    mapping: &'m Mapping,
    allow_physical: bool,
    name: &'m str,
) -> Result<&'m str, ApiError> {
    crate::policy::bucket(mapping, allow_physical, name)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub fn mapping() -> Mapping {
        Mapping::new([
            ("photos".to_owned(), "photos-k3x9q2mw".to_owned()),
            ("logs".to_owned(), "logs-aaaa1111".to_owned()),
        ])
        .unwrap_or_default()
    }

    pub fn sidecar_base() -> LinkBase {
        LinkBase {
            scheme: "http".into(),
            authority: "127.0.0.1:9023".into(),
            virtual_host: None,
        }
    }

    /// A strict translator (physical names refused) in `direction`.
    pub fn translator<'a>(
        mapping: &'a Mapping,
        links: &'a LinkBase,
        direction: Direction,
    ) -> Translator<'a> {
        Translator {
            mapping,
            direction,
            allow_physical: false,
            links,
            access: Access::WRITE,
            seen: None,
        }
    }

    pub fn upstream_base() -> LinkBase {
        LinkBase {
            scheme: "https".into(),
            authority: "storage.googleapis.com".into(),
            virtual_host: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn request_names_are_strict() {
        let m = mapping();
        assert_eq!(
            request_bucket(&m, false, "photos").ok().as_deref(),
            Some("photos-k3x9q2mw")
        );
        assert_eq!(
            request_bucket(&m, false, "nope").map_err(|e| e.status.as_u16()),
            Err(404)
        );
        assert_eq!(
            request_bucket(&m, false, "photos-k3x9q2mw").map_err(|e| e.status.as_u16()),
            Err(403)
        );
        assert_eq!(
            request_bucket(&m, true, "photos-k3x9q2mw").ok().as_deref(),
            Some("photos-k3x9q2mw")
        );
    }
}
