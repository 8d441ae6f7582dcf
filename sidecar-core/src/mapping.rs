//! The logical → physical bucket map and its validation. A value is the
//! entry's physical name, or the physical name and `;fenced` while a move
//! holds the entry's writes ([`crate::relocation`]); every check (valid
//! names, a bijection, no name both logical and physical) is of the
//! physical part, and any other suffix makes the whole map invalid.
//! Loading it from a mounted ConfigMap directory and swapping it on reload
//! is the shell's (`bucketmap-sidecar`'s `mapping`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use foldhash::HashMap;

use crate::names::is_valid_bucket_name;
pub use crate::relocation::Entry;

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
    /// A value is a physical name followed by something other than
    /// [`FENCED_SUFFIX`].
    #[error(
        "the value {value:?} for logical {logical:?} is not a physical bucket name, alone or followed by \";fenced\""
    )]
    InvalidValue {
        /// The entry's logical name.
        logical: String,
        /// The value.
        value: String,
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

/// The suffix of a map value whose entry a move has fenced: `<physical>;fenced`
/// (`;` is never part of a bucket name).
pub const FENCED_SUFFIX: &str = ";fenced";

/// An immutable, validated bijection between logical and physical bucket
/// names, each entry open or fenced by a move ([`crate::relocation`]).
/// Looked up several times per request, so hashed with foldhash rather than
/// SipHash: its keys come from the cluster's ConfigMap, not from requests.
/// Physical names are shared (`Arc<str>`): a write in flight keeps the name
/// it was sent to without a copy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    to_physical: HashMap<String, Target>,
    to_logical: HashMap<Arc<str>, String>,
    /// How many entries are fenced: with none, no request needs a fence lookup.
    fenced: usize,
}

/// Where a logical name points.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    physical: Arc<str>,
    fenced: bool,
}

/// A map value: the physical name, and whether the entry is fenced.
fn parse_value(logical: &str, value: &str) -> Result<(Arc<str>, bool), MappingError> {
    let (physical, fenced) = match value.strip_suffix(FENCED_SUFFIX) {
        Some(physical) => (physical, true),
        None => (value, false),
    };
    if physical.contains(';') {
        return Err(MappingError::InvalidValue {
            logical: logical.to_owned(),
            value: value.to_owned(),
        });
    }
    if !is_valid_bucket_name(physical) {
        return Err(MappingError::InvalidPhysical {
            logical: logical.to_owned(),
            physical: physical.to_owned(),
        });
    }
    Ok((Arc::from(physical), fenced))
}

impl Mapping {
    /// Builds a mapping from (logical name, value) entries, a value being a
    /// physical name, or a physical name and [`FENCED_SUFFIX`]; later entries
    /// for the same logical name replace earlier ones.
    pub fn new(entries: impl IntoIterator<Item = (String, String)>) -> Result<Self, MappingError> {
        let mut by_logical = BTreeMap::new();
        for (logical, value) in entries {
            by_logical.insert(logical, value);
        }
        let mut to_physical: HashMap<String, Target> = HashMap::default();
        let mut to_logical: HashMap<Arc<str>, String> = HashMap::default();
        for (logical, value) in by_logical {
            if !is_valid_bucket_name(&logical) {
                return Err(MappingError::InvalidLogical(logical));
            }
            let (physical, fenced) = parse_value(&logical, &value)?;
            if let Some(first) = to_logical.insert(physical.clone(), logical.clone()) {
                return Err(MappingError::DuplicatePhysical {
                    physical: physical.to_string(),
                    first,
                    second: logical,
                });
            }
            to_physical.insert(logical, Target { physical, fenced });
        }
        for (physical, logical) in &to_logical {
            if **physical != **logical && to_physical.contains_key(&**physical) {
                return Err(MappingError::Ambiguous {
                    name: physical.to_string(),
                    logical: logical.clone(),
                });
            }
        }
        let fenced = to_physical.values().filter(|t| t.fenced).count();
        Ok(Self {
            to_physical,
            to_logical,
            fenced,
        })
    }

    /// The physical name of a logical bucket.
    pub fn physical(&self, logical: &str) -> Option<&str> {
        self.to_physical.get(logical).map(|t| &*t.physical)
    }

    /// The logical name of a physical bucket.
    pub fn logical(&self, physical: &str) -> Option<&str> {
        self.to_logical.get(physical).map(String::as_str)
    }

    /// The physical name of the entry `name` names (by its logical or its
    /// physical name), shared with the mapping.
    pub fn shared_physical(&self, name: &str) -> Option<Arc<str>> {
        match self.to_physical.get(name) {
            Some(target) => Some(target.physical.clone()),
            None => self
                .to_logical
                .get_key_value(name)
                .map(|(physical, _)| physical.clone()),
        }
    }

    /// Whether the entry `name` names (by its logical or its physical name)
    /// is fenced by a move; a name the map does not know is not.
    pub fn entry(&self, name: &str) -> Entry {
        if self.fenced == 0 {
            return Entry::Open;
        }
        let target = match self.to_physical.get(name) {
            Some(target) => Some(target),
            None => self
                .to_logical
                .get(name)
                .and_then(|logical| self.to_physical.get(logical)),
        };
        match target {
            Some(Target { fenced: true, .. }) => Entry::Fenced,
            _ => Entry::Open,
        }
    }

    /// Whether any entry is fenced.
    pub fn any_fenced(&self) -> bool {
        self.fenced > 0
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

    /// Entries sorted by logical name: logical name, physical name, and
    /// whether the entry is fenced.
    pub fn entries(&self) -> Vec<(&str, &str, Entry)> {
        let mut entries: Vec<_> = self
            .to_physical
            .iter()
            .map(|(l, t)| (l.as_str(), &*t.physical, fence_of(t.fenced)))
            .collect();
        entries.sort_unstable_by_key(|(l, _, _)| *l);
        entries
    }
}

impl Mapping {
    /// Entries as a map states them, sorted by logical name: the logical
    /// name and the value (the physical name, with [`FENCED_SUFFIX`] when
    /// fenced).
    pub fn values(&self) -> Vec<(&str, String)> {
        self.entries()
            .into_iter()
            .map(|(logical, physical, entry)| {
                let suffix = if entry == Entry::Fenced {
                    FENCED_SUFFIX
                } else {
                    ""
                };
                (logical, format!("{physical}{suffix}"))
            })
            .collect()
    }
}

fn fence_of(fenced: bool) -> Entry {
    if fenced { Entry::Fenced } else { Entry::Open }
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

    #[test]
    fn a_fenced_value_is_its_physical_name_and_the_fence() {
        let m = Mapping::new(pairs(&[
            ("photos", "photos-k3x9q2mw;fenced"),
            ("logs", "logs-aaaa1111"),
        ]))
        .expect("valid");
        assert_eq!(m.physical("photos"), Some("photos-k3x9q2mw"));
        assert_eq!(m.logical("photos-k3x9q2mw"), Some("photos"));
        // By either of its names; another entry and unknown names are open.
        assert_eq!(m.entry("photos"), Entry::Fenced);
        assert_eq!(m.entry("photos-k3x9q2mw"), Entry::Fenced);
        assert_eq!(m.entry("logs"), Entry::Open);
        assert_eq!(m.entry("logs-aaaa1111"), Entry::Open);
        assert_eq!(m.entry("nope"), Entry::Open);
        assert!(m.any_fenced());
        assert_eq!(
            m.entries(),
            [
                ("logs", "logs-aaaa1111", Entry::Open),
                ("photos", "photos-k3x9q2mw", Entry::Fenced)
            ]
        );
        assert_eq!(
            m.values(),
            [
                ("logs", "logs-aaaa1111".to_owned()),
                ("photos", "photos-k3x9q2mw;fenced".to_owned())
            ]
        );
        assert_eq!(
            m.shared_physical("photos").as_deref(),
            Some("photos-k3x9q2mw")
        );
        assert_eq!(
            m.shared_physical("photos-k3x9q2mw").as_deref(),
            Some("photos-k3x9q2mw")
        );
        assert_eq!(m.shared_physical("nope"), None);
        // The fence is part of the map: the same names unfenced differ.
        let open = Mapping::new(pairs(&[
            ("photos", "photos-k3x9q2mw"),
            ("logs", "logs-aaaa1111"),
        ]))
        .expect("valid");
        assert_ne!(m, open);
        assert!(!open.any_fenced());
        assert_eq!(open.entry("photos"), Entry::Open);
    }

    #[test]
    fn any_other_suffix_refuses_the_whole_map() {
        for value in [
            "photos-k3x9q2mw;frozen",
            "photos-k3x9q2mw;fenced;fenced",
            "photos-k3x9q2mw;",
            "photos-k3x9q2mw; fenced",
            "photos-k3x9q2mw;FENCED",
            ";fenced",
        ] {
            let got = Mapping::new(pairs(&[("photos", value), ("logs", "logs-aaaa1111")]));
            assert!(
                matches!(
                    got,
                    Err(MappingError::InvalidValue { .. } | MappingError::InvalidPhysical { .. })
                ),
                "{value:?}: {got:?}"
            );
        }
        // The checks apply to the physical part of a fenced value.
        assert!(matches!(
            Mapping::new(pairs(&[("a-1", "same;fenced"), ("b-1", "same")])),
            Err(MappingError::DuplicatePhysical { .. })
        ));
        assert!(matches!(
            Mapping::new(pairs(&[("aaa", "bbb;fenced"), ("bbb", "ccc")])),
            Err(MappingError::Ambiguous { .. })
        ));
        assert!(matches!(
            Mapping::new(pairs(&[("photos", "Photos;fenced")])),
            Err(MappingError::InvalidPhysical { .. })
        ));
    }
}
