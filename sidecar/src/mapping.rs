//! The logical → physical bucket map: validation, loading from a mounted
//! ConfigMap directory and static entries, and lock-free swapping on reload.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

use arc_swap::ArcSwapOption;
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

/// Reads a mounted-ConfigMap directory: each file is a logical name holding
/// its physical name. Hidden entries (the kubelet's `..data` and timestamped
/// directories) and directories are skipped; symlinks are followed.
pub fn read_mapping_dir(dir: &Path) -> Result<Vec<(String, String)>, MappingError> {
    let read_dir = std::fs::read_dir(dir).map_err(|source| MappingError::ReadDir {
        path: dir.to_owned(),
        source,
    })?;
    let mut entries = Vec::new();
    for entry in read_dir {
        let entry = entry.map_err(|source| MappingError::ReadDir {
            path: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Err(MappingError::NonUtf8(path));
        };
        if name.starts_with('.') {
            continue;
        }
        let metadata = std::fs::metadata(&path).map_err(|source| MappingError::ReadEntry {
            path: path.clone(),
            source,
        })?;
        if metadata.is_dir() {
            continue;
        }
        let content = std::fs::read_to_string(&path).map_err(|source| MappingError::ReadEntry {
            path: path.clone(),
            source,
        })?;
        entries.push((name, content.trim().to_owned()));
    }
    Ok(entries)
}

/// What a reload did.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The sources hold the mapping already in force.
    Unchanged,
    /// A new mapping is in force.
    Updated {
        /// Entries in the new mapping.
        entries: usize,
    },
    /// The sources are invalid or unreadable; the previous mapping stays.
    Failed(MappingError),
}

/// Where the mapping comes from, and the one currently in force.
///
/// Readers take a snapshot with [`MappingStore::current`]; a reload swaps the
/// snapshot atomically, so requests in flight finish with the mapping they
/// started with.
#[derive(Debug)]
pub struct MappingStore {
    dir: Option<PathBuf>,
    static_entries: Vec<(String, String)>,
    current: ArcSwapOption<Mapping>,
    /// Why the last reload failed; cleared by a successful one.
    last_failure: ArcSwapOption<String>,
    reload_lock: Mutex<()>,
}

impl MappingStore {
    /// A store reading `dir` (a mounted ConfigMap directory) and the static
    /// (logical, physical) entries; nothing is in force until the first
    /// [`MappingStore::reload`].
    pub fn new(dir: Option<PathBuf>, static_entries: Vec<(String, String)>) -> Self {
        Self {
            dir,
            static_entries,
            current: ArcSwapOption::empty(),
            last_failure: ArcSwapOption::empty(),
            reload_lock: Mutex::new(()),
        }
    }

    /// The mapping in force, if one has been loaded.
    pub fn current(&self) -> Option<Arc<Mapping>> {
        self.current.load_full()
    }

    /// Whether the mapping sources have been read successfully at least
    /// once. An empty mapping counts: a namespace without Ready buckets has
    /// an empty (optional) ConfigMap volume, and its apps are better served
    /// by a GCS-style 404 naming the bucket than by a pod that never starts.
    pub fn is_ready(&self) -> bool {
        self.current.load().is_some()
    }

    /// Why the store is not ready, or `None` when it is.
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.is_ready() {
            return None;
        }
        Some(match self.last_failure.load_full() {
            Some(failure) => format!("the mapping sources cannot be used: {failure}"),
            None => "the mapping sources have not been read yet".to_owned(),
        })
    }

    /// The directory being watched, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Re-reads the sources and swaps the mapping in if it is valid and different.
    pub fn reload(&self) -> ReloadOutcome {
        let _serialised = self
            .reload_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let outcome = self.load();
        let failure = match &outcome {
            ReloadOutcome::Failed(err) => Some(Arc::new(err.to_string())),
            ReloadOutcome::Unchanged | ReloadOutcome::Updated { .. } => None,
        };
        self.last_failure.store(failure);
        outcome
    }

    /// One read of the sources; the caller holds `reload_lock`.
    fn load(&self) -> ReloadOutcome {
        let mut entries = match &self.dir {
            Some(dir) => match read_mapping_dir(dir) {
                Ok(entries) => entries,
                Err(err) => return ReloadOutcome::Failed(err),
            },
            None => Vec::new(),
        };
        entries.extend(self.static_entries.iter().cloned());
        let mapping = match Mapping::new(entries) {
            Ok(mapping) => mapping,
            Err(err) => return ReloadOutcome::Failed(err),
        };
        if self.current.load().as_deref() == Some(&mapping) {
            return ReloadOutcome::Unchanged;
        }
        let entries = mapping.len();
        self.current.store(Some(Arc::new(mapping)));
        ReloadOutcome::Updated { entries }
    }

    /// Installs a mapping directly (tests).
    pub fn set(&self, mapping: Mapping) {
        self.current.store(Some(Arc::new(mapping)));
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

    #[cfg(unix)]
    #[test]
    fn reads_a_kubelet_style_directory_and_keeps_the_last_good_map() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().expect("tempdir");
        let data1 = dir.path().join("..2024_01_01");
        std::fs::create_dir(&data1).expect("mkdir");
        std::fs::write(data1.join("photos"), "photos-k3x9q2mw\n").expect("write");
        symlink("..2024_01_01", dir.path().join("..data")).expect("symlink");
        symlink("..data/photos", dir.path().join("photos")).expect("symlink");

        let store = MappingStore::new(
            Some(dir.path().to_owned()),
            pairs(&[("static", "static-1234")]),
        );
        assert!(!store.is_ready());
        assert!(matches!(
            store.reload(),
            ReloadOutcome::Updated { entries: 2 }
        ));
        assert!(store.is_ready());
        assert!(matches!(store.reload(), ReloadOutcome::Unchanged));
        let before = store.current().expect("loaded");

        // A bad update: a second key with the same physical name.
        std::fs::write(dir.path().join("dupe"), "photos-k3x9q2mw").expect("write");
        assert!(matches!(
            store.reload(),
            ReloadOutcome::Failed(MappingError::DuplicatePhysical { .. })
        ));
        assert_eq!(store.current().as_deref(), Some(&*before));

        std::fs::write(dir.path().join("dupe"), "dupe-99999999").expect("write");
        assert!(matches!(
            store.reload(),
            ReloadOutcome::Updated { entries: 3 }
        ));
        assert_eq!(
            store
                .current()
                .and_then(|m| m.physical("dupe").map(str::to_owned))
                .as_deref(),
            Some("dupe-99999999")
        );
        // The snapshot taken before is untouched.
        assert_eq!(before.physical("dupe"), None);
    }

    #[test]
    fn a_missing_directory_is_a_failed_load() {
        let store = MappingStore::new(Some(PathBuf::from("/nonexistent/bucketmap")), Vec::new());
        assert_eq!(
            store.not_ready_reason().as_deref(),
            Some("the mapping sources have not been read yet")
        );
        assert!(matches!(
            store.reload(),
            ReloadOutcome::Failed(MappingError::ReadDir { .. })
        ));
        assert!(store.current().is_none());
        assert!(!store.is_ready());
        let reason = store.not_ready_reason().expect("not ready");
        assert!(reason.contains("/nonexistent/bucketmap"), "{reason}");
    }

    #[test]
    fn an_empty_directory_is_read_and_ready_with_an_empty_mapping() {
        // What the kubelet mounts for an optional ConfigMap that does not exist.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MappingStore::new(Some(dir.path().to_owned()), Vec::new());
        assert!(!store.is_ready());
        assert!(matches!(
            store.reload(),
            ReloadOutcome::Updated { entries: 0 }
        ));
        assert!(store.is_ready());
        assert_eq!(store.not_ready_reason(), None);
        assert!(store.current().is_some_and(|m| m.is_empty()));
    }
}
