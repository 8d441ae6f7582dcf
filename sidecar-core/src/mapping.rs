//! The logical → physical bucket map and its validation. Loading it from
//! a mounted ConfigMap directory and swapping it on reload is the shell's
//! (`bucketmap-sidecar`'s `mapping`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use foldhash::HashMap;

use crate::names::is_valid_bucket_name;

/// Why a mapping could not be built or loaded. The previous mapping stays in force.
#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    /// A logical name (a key) is not a valid GCS bucket name.
    #[error("logical name {0:?} is not a valid bucket name")]
    InvalidLogical(String),
    /// A physical name (a value) is not a valid GCS bucket name.
    #[error("physical name {physical:?} for logical {logical:?} is not a valid bucket name")]
    InvalidPhysical {
        /// The entry's logical name.
        logical: String,
        /// The invalid physical name.
        physical: String,
    },
    /// Two logical names map to one physical bucket: the map would not be a bijection.
    #[error("physical bucket {physical:?} is mapped from both {first:?} and {second:?}")]
    DuplicatePhysical {
        /// The physical bucket named twice.
        physical: String,
        /// One logical name mapped to it.
        first: String,
        /// The other logical name mapped to it.
        second: String,
    },
    /// A name is both a logical name and another entry's physical name, so
    /// a request naming it could mean either bucket.
    #[error("{name:?} is both a logical name and the physical name of {logical:?}")]
    Ambiguous {
        /// The name used both ways.
        name: String,
        /// The logical name whose physical name it is.
        logical: String,
    },
    /// The mapping directory, or its listing, cannot be read.
    #[error("cannot read mapping directory {path}: {source}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An entry of the mapping directory cannot be read.
    #[error("cannot read mapping entry {path}: {source}")]
    ReadEntry {
        /// The entry's file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An entry's file name is not UTF-8, so it cannot be a bucket name.
    #[error("mapping entry {0} has a name that is not UTF-8")]
    NonUtf8(PathBuf),
}

/// An immutable, validated bijection between logical and physical bucket names.
/// Looked up several times per request, so hashed with foldhash rather than
/// SipHash: its keys come from the cluster's ConfigMap, not from requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    to_physical: HashMap<String, String>,
    to_logical: HashMap<String, String>,
}

impl Mapping {
    /// Builds a mapping; later entries for the same logical name replace earlier ones.
    pub fn new(entries: impl IntoIterator<Item = (String, String)>) -> Result<Self, MappingError> {
        let mut by_logical = BTreeMap::new();
        for (logical, physical) in entries {
            by_logical.insert(logical, physical);
        }
        let mut to_logical: HashMap<String, String> = HashMap::default();
        for (logical, physical) in &by_logical {
            if !is_valid_bucket_name(logical) {
                return Err(MappingError::InvalidLogical(logical.clone()));
            }
            if !is_valid_bucket_name(physical) {
                return Err(MappingError::InvalidPhysical {
                    logical: logical.clone(),
                    physical: physical.clone(),
                });
            }
            if let Some(first) = to_logical.insert(physical.clone(), logical.clone()) {
                return Err(MappingError::DuplicatePhysical {
                    physical: physical.clone(),
                    first,
                    second: logical.clone(),
                });
            }
        }
        for (physical, logical) in &to_logical {
            if physical != logical && by_logical.contains_key(physical) {
                return Err(MappingError::Ambiguous {
                    name: physical.clone(),
                    logical: logical.clone(),
                });
            }
        }
        Ok(Self {
            to_physical: by_logical.into_iter().collect(),
            to_logical,
        })
    }

    /// The physical name of a logical bucket.
    pub fn physical(&self, logical: &str) -> Option<&str> {
        self.to_physical.get(logical).map(String::as_str)
    }

    /// The logical name of a physical bucket.
    pub fn logical(&self, physical: &str) -> Option<&str> {
        self.to_logical.get(physical).map(String::as_str)
    }

    /// Whether `name` is a logical or a physical name of this mapping.
    pub fn knows(&self, name: &str) -> bool {
        self.to_physical.contains_key(name) || self.to_logical.contains_key(name)
    }

    /// Number of entries (logical names).
    pub fn len(&self) -> usize {
        self.to_physical.len()
    }

    /// Whether the mapping has no entry.
    pub fn is_empty(&self) -> bool {
        self.to_physical.is_empty()
    }

    /// Entries sorted by logical name.
    pub fn entries(&self) -> Vec<(&str, &str)> {
        let mut entries: Vec<_> = self
            .to_physical
            .iter()
            .map(|(l, p)| (l.as_str(), p.as_str()))
            .collect();
        entries.sort_unstable();
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(entries: &[(&str, &str)]) -> Vec<(String, String)> {
        entries
            .iter()
            .map(|(l, p)| ((*l).to_owned(), (*p).to_owned()))
            .collect()
    }

    #[test]
    fn builds_a_bijection() {
        let m = Mapping::new(pairs(&[
            ("photos", "photos-k3x9q2mw"),
            ("logs", "logs-aaaa1111"),
        ]))
        .expect("valid");
        assert_eq!(m.physical("photos"), Some("photos-k3x9q2mw"));
        assert_eq!(m.logical("logs-aaaa1111"), Some("logs"));
        assert_eq!(m.physical("photos-k3x9q2mw"), None);
        assert!(m.knows("photos") && m.knows("photos-k3x9q2mw") && !m.knows("other"));
    }

    #[test]
    fn rejects_invalid_and_ambiguous_maps() {
        assert!(matches!(
            Mapping::new(pairs(&[("Photos", "abc")])),
            Err(MappingError::InvalidLogical(_))
        ));
        assert!(matches!(
            Mapping::new(pairs(&[("photos", "")])),
            Err(MappingError::InvalidPhysical { .. })
        ));
        assert!(matches!(
            Mapping::new(pairs(&[("a-1", "same"), ("b-1", "same")])),
            Err(MappingError::DuplicatePhysical { .. })
        ));
        assert!(matches!(
            Mapping::new(pairs(&[("aaa", "bbb"), ("bbb", "ccc")])),
            Err(MappingError::Ambiguous { .. })
        ));
        assert!(
            Mapping::new(pairs(&[("same", "same")])).is_ok(),
            "identity entries are fine"
        );
    }
}
