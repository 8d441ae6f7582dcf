//! Keeps the mapping current: file-change notifications on the mapping
//! directory (the kubelet swaps its `..data` symlink), plus a periodic poll
//! in case notifications are lost or the directory appears late.

use std::sync::Arc;
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use crate::mapping::{MappingStore, ReloadOutcome};
use crate::metrics::{Metrics, ResultLabels};

/// Reloads the mapping once, logging and counting what happened.
/// `last_error` suppresses repeating the same warning on every poll.
pub fn reload_and_report(store: &MappingStore, metrics: &Metrics, last_error: &mut Option<String>) {
    report(store, metrics, store.reload(), last_error, "volume");
}

/// Logs and counts what a load of the map from `source` (`volume`, or the
/// API server's `list` or `watch`) did.
pub fn report(
    store: &MappingStore,
    metrics: &Metrics,
    outcome: ReloadOutcome,
    last_error: &mut Option<String>,
    source: &'static str,
) {
    match outcome {
        ReloadOutcome::Unchanged => {
            if last_error.take().is_some() {
                tracing::info!(
                    "mapping sources are valid again; the mapping in force is unchanged"
                );
            }
        }
        ReloadOutcome::Updated { entries } => {
            *last_error = None;
            if entries == 0 {
                // The namespace has no Ready Gcs yet (the kubelet mounts an
                // optional ConfigMap that does not exist as an empty directory).
                tracing::info!(
                    "the mapping is empty: every bucket name gets a 404 until the namespace has a Ready Gcs"
                );
            }
            metrics
                .mapping_reloads
                .get_or_create(&ResultLabels { result: "success" })
                .inc();
            metrics.mapping_entries.set(entries as i64);
            let mapping = store.current();
            let names: Vec<String> = mapping
                .as_deref()
                .map(|m| {
                    m.values()
                        .into_iter()
                        .map(|(l, v)| format!("{l}={v}"))
                        .collect()
                })
                .unwrap_or_default();
            tracing::info!(entries, source, mapping = %names.join(","), "mapping loaded");
        }
        ReloadOutcome::Failed(err) => {
            metrics
                .mapping_reloads
                .get_or_create(&ResultLabels { result: "failure" })
                .inc();
            let message = err.to_string();
            let what = if store.current().is_some() {
                "the mapping update is invalid: keeping the last good mapping"
            } else {
                "not ready (requests get 503): the mapping cannot be loaded"
            };
            if last_error.as_deref() != Some(message.as_str()) {
                tracing::warn!(error = %message, "{what}");
            } else {
                tracing::debug!(error = %message, "mapping still invalid");
            }
            *last_error = Some(message);
        }
    }
}

/// Watches and polls until `shutdown` turns true.
/// `last_error` is the failure already reported, if any.
pub async fn run(
    store: Arc<MappingStore>,
    metrics: Arc<Metrics>,
    poll: Duration,
    mut last_error: Option<String>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let mut watcher: Option<RecommendedWatcher> = None;
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if watcher.is_none()
            && let Some(dir) = store.dir()
        {
            watcher = start_watcher(dir, tx.clone());
        }
        tokio::select! {
            _ = ticker.tick() => {}
            Some(()) = rx.recv() => {
                // Let a burst of events (one kubelet swap is several) settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while rx.try_recv().is_ok() {}
            }
            _ = shutdown.changed() => break,
        }
        reload_and_report(&store, &metrics, &mut last_error);
    }
}

fn start_watcher(dir: &std::path::Path, tx: mpsc::Sender<()>) -> Option<RecommendedWatcher> {
    let handler = move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            // A full channel already holds a pending reload.
            let _ = tx.try_send(());
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(watcher) => watcher,
        Err(err) => {
            tracing::debug!(error = %err, "cannot create a file watcher; polling only");
            return None;
        }
    };
    match watcher.watch(dir, RecursiveMode::NonRecursive) {
        Ok(()) => {
            tracing::debug!(dir = %dir.display(), "watching the mapping directory");
            Some(watcher)
        }
        Err(err) => {
            tracing::debug!(dir = %dir.display(), error = %err, "cannot watch the mapping directory yet; polling");
            None
        }
    }
}
