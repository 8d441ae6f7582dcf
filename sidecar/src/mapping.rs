//! The bucket map in force: loading it from a mounted ConfigMap directory
//! and static entries, and lock-free swapping on reload. The map itself
//! and its validation are the core's ([`bucketmap_sidecar_core::mapping`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

use arc_swap::ArcSwapOption;

pub use bucketmap_sidecar_core::mapping::{Mapping, MappingError};

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
