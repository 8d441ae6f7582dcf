//! The bucket map in force: loading it from a mounted ConfigMap directory
//! and static entries, and lock-free swapping on reload. The map itself
//! and its validation are the core's ([`bucketmap_sidecar_core::mapping`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tokio::sync::watch;

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
/// snapshot atomically, so requests in flight go on with the mapping they
/// started with — but for writes whose body is still arriving when the new
/// map fences or moves their bucket, which are cut off ([`crate::flights`]). [`MappingStore::changes`] tells each swap: a request held
/// by a move's fence waits for one, and the cut-off of writes in flight
/// looks again at every one.
#[derive(Debug)]
pub struct MappingStore {
    dir: Option<PathBuf>,
    static_entries: Vec<(String, String)>,
    current: ArcSwapOption<Mapping>,
    /// Why the last reload failed; cleared by a successful one.
    last_failure: ArcSwapOption<String>,
    reload_lock: Mutex<()>,
    /// Set when the map is followed through the API server (`--map-configmap`).
    live: Option<Live>,
    /// How many maps have been put in force: bumped after each swap.
    swaps: watch::Sender<u64>,
}

/// The state of the map followed through the API server ([`crate::live`]).
#[derive(Debug)]
struct Live {
    /// `--max-map-age`: past it without a confirmation, writes are refused.
    bound: Duration,
    /// The process's start: the age reported of a map never confirmed
    /// counts from it (and such a map is always past its bound).
    started: Instant,
    /// When the request that last confirmed the map was sent.
    confirmed: Mutex<Option<Instant>>,
    /// The API server has delivered a map: the volume is no longer read
    /// (it can only be as new, or older).
    in_charge: AtomicBool,
    /// Readiness no longer waits for a confirmation (the API server cannot
    /// be followed at all).
    gave_up: AtomicBool,
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
            live: None,
            swaps: watch::Sender::new(0),
        }
    }

    /// Tells each map put in force from now on (the swap happens before the
    /// news: a receiver told of a change finds the new map in force).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.swaps.subscribe()
    }

    /// The store of a sidecar that follows its map through the API server,
    /// refusing writes once the map goes unconfirmed for longer than `bound`.
    #[must_use]
    pub fn following(mut self, bound: Duration) -> Self {
        self.live = Some(Live {
            bound,
            started: Instant::now(),
            confirmed: Mutex::new(None),
            in_charge: AtomicBool::new(false),
            gave_up: AtomicBool::new(false),
        });
        self
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

    /// Puts a map from the API server in force (with the static entries),
    /// unless it fails to validate; from then on the volume is not read.
    pub fn apply_live(&self, entries: Vec<(String, String)>) -> ReloadOutcome {
        let _serialised = self
            .reload_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(live) = &self.live {
            live.in_charge.store(true, Ordering::Release);
        }
        let outcome = self.swap_in(entries);
        self.record(&outcome);
        outcome
    }

    /// The API server confirmed the map with a request sent at `sent`.
    pub fn confirm(&self, sent: Instant) {
        if let Some(live) = &self.live {
            let mut confirmed = lock(&live.confirmed);
            if confirmed.is_none_or(|at| at < sent) {
                *confirmed = Some(sent);
            }
        }
    }

    /// The API server cannot be followed at all: readiness no longer waits.
    pub fn give_up_waiting(&self) {
        if let Some(live) = &self.live {
            live.gave_up.store(true, Ordering::Release);
        }
    }

    /// Since the map was last confirmed by the API server (since start when
    /// never); `None` when the map is not followed through it.
    pub fn map_age(&self) -> Option<Duration> {
        self.live
            .as_ref()
            .map(|live| live.confirmed().unwrap_or(live.started).elapsed())
    }

    /// When the map passes its bound unless confirmed before (now, for a
    /// map never confirmed).
    pub fn stale_at(&self) -> Option<Instant> {
        let live = self.live.as_ref()?;
        Some(
            live.confirmed()
                .map_or_else(Instant::now, |at| at + live.bound),
        )
    }

    /// The map's age, once past its bound: writes are then refused.
    pub fn staleness(&self) -> Option<crate::policy::Staleness> {
        self.staleness_at(Instant::now())
    }

    /// [`MappingStore::staleness`] as of `now`.
    pub fn staleness_at(&self, now: Instant) -> Option<crate::policy::Staleness> {
        let live = self.live.as_ref()?;
        let confirmed = live.confirmed();
        let age = now.saturating_duration_since(confirmed.unwrap_or(live.started));
        // A map never confirmed may be older than any bound: the volume
        // gives no time, and a pod may start long after a change.
        (confirmed.is_none() || age > live.bound).then_some(crate::policy::Staleness {
            age,
            bound: live.bound,
            confirmed_once: confirmed.is_some(),
        })
    }

    /// Why the store is not ready, or `None` when it is.
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.is_ready() {
            return self
                .live
                .as_ref()
                .filter(|live| live.waits_at(Instant::now()))
                .map(|_| "waiting for the API server to confirm the map".to_owned());
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
        self.record(&outcome);
        outcome
    }

    /// Keeps why the last load failed, for readiness.
    fn record(&self, outcome: &ReloadOutcome) {
        let failure = match outcome {
            ReloadOutcome::Failed(err) => Some(Arc::new(err.to_string())),
            ReloadOutcome::Unchanged | ReloadOutcome::Updated { .. } => None,
        };
        self.last_failure.store(failure);
    }

    /// One read of the sources; the caller holds `reload_lock`.
    fn load(&self) -> ReloadOutcome {
        if self
            .live
            .as_ref()
            .is_some_and(|live| live.in_charge.load(Ordering::Acquire))
        {
            return ReloadOutcome::Unchanged;
        }
        let entries = match &self.dir {
            Some(dir) => match read_mapping_dir(dir) {
                Ok(entries) => entries,
                Err(err) => return ReloadOutcome::Failed(err),
            },
            None => Vec::new(),
        };
        self.swap_in(entries)
    }

    /// Swaps in the map of `entries` and the static entries if it is valid
    /// and different; the caller holds `reload_lock`.
    fn swap_in(&self, mut entries: Vec<(String, String)>) -> ReloadOutcome {
        entries.extend(self.static_entries.iter().cloned());
        let mapping = match Mapping::new(entries) {
            Ok(mapping) => mapping,
            Err(err) => return ReloadOutcome::Failed(err),
        };
        if self.current.load().as_deref() == Some(&mapping) {
            return ReloadOutcome::Unchanged;
        }
        let entries = mapping.len();
        self.put(mapping);
        ReloadOutcome::Updated { entries }
    }

    /// Puts `mapping` in force and tells [`MappingStore::changes`].
    fn put(&self, mapping: Mapping) {
        self.current.store(Some(Arc::new(mapping)));
        self.swaps.send_modify(|swaps| *swaps += 1);
    }

    /// Installs a mapping directly (tests).
    pub fn set(&self, mapping: Mapping) {
        self.put(mapping);
    }
}

/// How long readiness waits for the API server's first confirmation of the
/// map: in a new namespace the sidecar may start before bucketmap's grant
/// of its map, and an app started on an unconfirmed map cannot write.
/// Past it, the sidecar is ready on the volume's map (reads served).
pub const READY_GRACE: Duration = Duration::from_secs(10);

impl Live {
    /// Whether readiness still waits for a first confirmation at `now`.
    fn waits_at(&self, now: Instant) -> bool {
        self.confirmed().is_none()
            && !self.gave_up.load(Ordering::Acquire)
            && now.saturating_duration_since(self.started) < READY_GRACE
    }

    /// When the request that last confirmed the map was sent, if one did.
    fn confirmed(&self) -> Option<Instant> {
        *lock(&self.confirmed)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    fn a_followed_map_ages_from_its_last_confirmation_and_outranks_the_volume() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("photos"), "photos-v1v1v1v1").expect("write");
        let bound = Duration::from_secs(60);
        let store = MappingStore::new(Some(dir.path().to_owned()), Vec::new()).following(bound);
        let start = Instant::now();
        assert!(matches!(store.reload(), ReloadOutcome::Updated { .. }));
        // Loaded, but readiness waits for a confirmation, for a while.
        assert!(store.is_ready());
        assert!(
            store
                .not_ready_reason()
                .is_some_and(|r| r.contains("confirm"))
        );
        let live = store.live.as_ref().expect("followed");
        assert!(live.waits_at(start));
        assert!(!live.waits_at(start + READY_GRACE));
        // Never confirmed: stale from the start (the volume gives no time).
        let never = store.staleness_at(start).expect("stale");
        assert!(!never.confirmed_once);
        // A confirmation sent at t keeps writes open until t + bound.
        let sent = start + Duration::from_secs(100);
        store.confirm(sent);
        store.confirm(start); // an older one changes nothing
        assert_eq!(store.staleness_at(sent + bound), None);
        assert_eq!(store.not_ready_reason(), None);
        let stale = store
            .staleness_at(sent + bound + Duration::from_secs(1))
            .expect("stale");
        assert!(stale.confirmed_once);
        assert_eq!(stale.age, bound + Duration::from_secs(1));
        // The API server's map wins, and the volume is not read again.
        let live = pairs(&[("photos", "photos-v2v2v2v2")]);
        assert!(matches!(
            store.apply_live(live),
            ReloadOutcome::Updated { .. }
        ));
        std::fs::write(dir.path().join("photos"), "photos-v3v3v3v3").expect("write");
        assert!(matches!(store.reload(), ReloadOutcome::Unchanged));
        let physical = |store: &MappingStore| {
            store
                .current()
                .and_then(|m| m.physical("photos").map(str::to_owned))
        };
        assert_eq!(physical(&store).as_deref(), Some("photos-v2v2v2v2"));
        // An invalid map from the API server is not applied.
        let bad = pairs(&[("photos", "photos-v2v2v2v2"), ("dupe", "photos-v2v2v2v2")]);
        assert!(matches!(store.apply_live(bad), ReloadOutcome::Failed(_)));
        assert_eq!(physical(&store).as_deref(), Some("photos-v2v2v2v2"));
        // A deleted ConfigMap is an empty map.
        assert!(matches!(
            store.apply_live(Vec::new()),
            ReloadOutcome::Updated { entries: 0 }
        ));
    }

    #[test]
    fn a_map_not_followed_is_never_stale() {
        let store = MappingStore::new(None, pairs(&[("photos", "photos-k3x9q2mw")]));
        store.confirm(Instant::now());
        assert_eq!(store.map_age(), None);
        assert_eq!(
            store.staleness_at(Instant::now() + Duration::from_secs(86_400)),
            None
        );
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
