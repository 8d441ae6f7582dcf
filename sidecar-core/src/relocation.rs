//! What a sidecar does with a request to an entry that a move is switching
//! to another bucket (docs/ARCHITECTURE.md, "Moving a bucket: the switch").
//!
//! A move publishes the entry in three more forms after the usual one: the
//! old bucket *fenced* (reads go on, writes wait), the new bucket fenced
//! (reads moved, writes still wait), then the new bucket open. The operator
//! waits the staleness bound between them, so every write lands in exactly
//! one bucket at a time and no read sees the old bucket once the new one
//! has taken a write. This module is the sidecar's half of that protocol as
//! a pure rule: which requests go, wait or are refused, and which writes in
//! flight must be cut off. The operator's half is `bucketmap::relocation`;
//! a model test there runs both on random interleavings.

/// Whether an entry of the map is open or fenced by a move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// Reads and writes go to the entry's bucket.
    Open,
    /// A move is switching the entry: reads go to its bucket, writes wait
    /// for the entry to open again.
    Fenced,
}

/// What happens to one request to one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// Forward it to the entry's bucket.
    Forward,
    /// Keep it until the map changes, then decide again; answer with a
    /// retryable error if that takes longer than the hold limit.
    Hold,
    /// Answer with a retryable error (503 `backendNotReady`, gRPC
    /// `UNAVAILABLE`) at once.
    Refuse,
}

/// The rule. `stale` is whether the map is older than the bound
/// ([`crate::policy::Staleness`]).
///
/// - An open entry: everything is forwarded, but writes are refused while
///   the map is stale (the rule of issue-58's bound, unchanged).
/// - A fenced entry: reads are forwarded and writes held while the map is
///   fresh. A stale sidecar refuses reads as well: it knows a move is under
///   way and its entry may name a bucket that has since fallen behind.
pub fn route(entry: Entry, writes: bool, stale: bool) -> Route {
    match (entry, writes, stale) {
        (Entry::Open, true, true) | (Entry::Fenced, _, true) => Route::Refuse,
        (Entry::Open, _, false) | (Entry::Open, false, true) => Route::Forward,
        (Entry::Fenced, true, false) => Route::Hold,
        (Entry::Fenced, false, false) => Route::Forward,
    }
}

/// Whether a write in flight to `bucket` must be cut off now: its body is
/// not complete and the rule would no longer forward a new write of it to
/// that bucket (the entry was fenced or moved, or the map went stale). A
/// write whose body is complete is left to finish; GCS commits nothing
/// without the whole body, so cutting the rest off bounds when the old
/// bucket can still change.
pub fn cut_off(sent_to: &str, bucket: &str, entry: Entry, stale: bool) -> bool {
    sent_to != bucket || route(entry, true, stale) != Route::Forward
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_table() {
        use Entry::{Fenced, Open};
        use Route::{Forward, Hold, Refuse};
        let table = [
            // entry, writes, stale => route
            (Open, false, false, Forward),
            (Open, true, false, Forward),
            (Open, false, true, Forward),
            (Open, true, true, Refuse),
            (Fenced, false, false, Forward),
            (Fenced, true, false, Hold),
            (Fenced, false, true, Refuse),
            (Fenced, true, true, Refuse),
        ];
        for (entry, writes, stale, want) in table {
            assert_eq!(
                route(entry, writes, stale),
                want,
                "{entry:?} {writes} {stale}"
            );
        }
    }

    #[test]
    fn writes_in_flight_are_cut_off_when_fenced_moved_or_stale() {
        assert!(!cut_off("a", "a", Entry::Open, false));
        assert!(cut_off("a", "a", Entry::Fenced, false));
        assert!(cut_off("a", "b", Entry::Open, false));
        assert!(cut_off("a", "a", Entry::Open, true));
    }
}
