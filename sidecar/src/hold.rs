//! Requests held while a move switches their bucket (docs/ARCHITECTURE.md,
//! "Moving a bucket: the switch"): the policy holds a write naming an
//! entry the map fences ([`crate::policy::Decision::Hold`]); the front end
//! keeps the request, its body not read further, and waits here until the
//! map changes — or goes stale — then decides again with the map then in
//! force, which may open the entry on another bucket. Past `--hold-limit`
//! the request is answered with the retryable refusal of
//! [`crate::policy::Refusal::moving`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::mapping::{Mapping, MappingStore};
use crate::metrics::Metrics;

/// What holding needs: the map, the limit, the count of holds.
#[derive(Clone, Debug)]
pub struct Holds {
    store: Arc<MappingStore>,
    limit: Duration,
    metrics: Arc<Metrics>,
}

/// One request's hold, from its first [`Decision::Hold`](crate::policy::Decision::Hold).
#[derive(Clone, Copy, Debug)]
pub struct Hold {
    until: Instant,
}

/// How a hold ended, as `held_requests_total` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Decided again, and forwarded.
    Forwarded,
    /// The hold limit passed: answered with the retryable refusal.
    TimedOut,
    /// Decided again, and refused (the map went stale, the name left it).
    Refused,
}

impl Ended {
    fn label(self) -> &'static str {
        match self {
            Ended::Forwarded => "forwarded",
            Ended::TimedOut => "timed_out",
            Ended::Refused => "refused",
        }
    }
}

impl Holds {
    /// Holds of at most `limit` on `store`'s map.
    pub fn new(store: Arc<MappingStore>, limit: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            limit,
            metrics,
        }
    }

    /// A hold starting now.
    pub fn start(&self) -> Hold {
        Hold {
            until: Instant::now() + self.limit,
        }
    }

    /// The hold limit.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Waits until the map in force is another than `decided_with` (the
    /// one the request was held with) or has passed its bound; whether to
    /// decide again — `false` once the hold's limit has passed.
    pub async fn wait(&self, hold: &Hold, decided_with: Option<&Arc<Mapping>>) -> bool {
        // Told of every swap from here on; one made before is seen below.
        let mut changes = self.store.changes();
        loop {
            let current = self.store.current();
            let changed = match (&current, decided_with) {
                (Some(now), Some(then)) => !Arc::ptr_eq(now, then),
                (now, then) => now.is_some() != then.is_some(),
            };
            if changed || self.store.staleness().is_some() {
                return true;
            }
            let stale_at = self.store.stale_at().map(Instant::from);
            // Just past the bound: at the bound itself the map is fresh.
            let wake = stale_at.map_or(hold.until, |at| {
                (at + Duration::from_millis(1)).min(hold.until)
            });
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(wake).await;
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
            if Instant::now() >= hold.until {
                return false;
            }
        }
    }

    /// Counts a hold that ended.
    pub fn ended(&self, how: Ended) {
        self.metrics.count_hold(how.label());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(value: &str) -> Mapping {
        Mapping::new([("photos".to_owned(), value.to_owned())]).unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_ends_with_a_new_map_or_at_its_limit() {
        let store = Arc::new(MappingStore::new(None, Vec::new()));
        store.set(map("photos-v1v1v1v1;fenced"));
        let holds = Holds::new(
            store.clone(),
            Duration::from_secs(30),
            Arc::new(Metrics::new()),
        );
        // Nothing changes: the limit passes (the clock is the test's own).
        let decided_with = store.current();
        let hold = holds.start();
        let started = Instant::now();
        assert!(!holds.wait(&hold, decided_with.as_ref()).await);
        assert!(started.elapsed() >= Duration::from_secs(30));
        // A map put in force while held ends the wait early.
        let hold = holds.start();
        let decided_with = store.current();
        let swapper = tokio::spawn({
            let store = store.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                store.set(map("photos-v2v2v2v2"));
            }
        });
        let started = Instant::now();
        assert!(holds.wait(&hold, decided_with.as_ref()).await);
        assert!(started.elapsed() < Duration::from_secs(30));
        swapper.await.unwrap_or_else(|e| panic!("{e}"));
        // Already swapped before the wait began: no wait at all.
        store.set(map("photos-v3v3v3v3"));
        let started = Instant::now();
        assert!(holds.wait(&hold, decided_with.as_ref()).await);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
