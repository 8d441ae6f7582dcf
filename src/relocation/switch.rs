//! The switch from the source bucket to the destination, once the
//! destination holds a copy that lags the source by little.
//!
//! The entry of the logical name goes through four forms in the bucket map:
//!
//! | step | entry | reads | writes |
//! |---|---|---|---|
//! | [`Switch::Copying`] | source, open | source | source |
//! | [`Switch::Fenced`] | source, fenced | source | held |
//! | [`Switch::Switched`] | destination, fenced | destination | held |
//! | [`Switch::Open`] | destination, open | destination | destination |
//!
//! and the operator waits between them for what the staleness bound (issue
//! 58) guarantees to become true:
//!
//! - After publishing the fence, [`Timing::fence_wait`]: every sidecar then
//!   either has the fence or is stale, and either way forwards no new write
//!   to the source and has cut off every write to it whose body was not
//!   complete; the complete ones have committed. The source no longer
//!   changes, so the last copy is exact.
//! - After publishing the destination, [`Timing::switch_wait`]: every
//!   sidecar that still reads is reading the destination (a stale one with a
//!   fenced entry refuses reads), so the destination may take writes without
//!   any read going to a source that fell behind.
//! - Then the workloads' access to the source is revoked before the entry
//!   opens: a sidecar cut off since before the move began (an open entry,
//!   served stale reads by issue 58's rule) gets GCS's refusal instead of
//!   old data, once IAM has propagated.
//!
//! Writes wait from the fence to the opening: two bounds with their margins,
//! the settle time and the last copy.
//!
//! Times are the operator's monotonic clock, as durations since an origin of
//! its own choosing. An operator that restarts has lost its clock: it
//! resumes a wait from the start ([`Switch::restarted`]), which can only make
//! it longer.

use std::time::Duration;

/// What the waits are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The sidecars' staleness bound (`--max-map-age`).
    pub bound: Duration,
    /// How long GCS may take to commit a write whose body it has whole.
    pub settle: Duration,
}

impl Timing {
    /// The bound as the operator waits it: plus a tenth and a second, for
    /// the sidecars' clocks running at another rate than the operator's
    /// (docs/ARCHITECTURE.md, "How fresh a sidecar's map is").
    pub fn margined_bound(&self) -> Duration {
        self.bound + self.bound / 10 + Duration::from_secs(1)
    }

    /// From publishing the fence to the last copy.
    pub fn fence_wait(&self) -> Duration {
        self.margined_bound() + self.settle
    }

    /// From publishing the destination to revoking access to the source.
    pub fn switch_wait(&self) -> Duration {
        self.margined_bound()
    }
}

/// Where the switch stands. `since` is when the entry was published in that
/// form, on the operator's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// The destination is being filled; the application uses the source.
    Copying,
    /// The source's entry is fenced.
    Fenced {
        /// When the fence was published.
        since: Duration,
    },
    /// The source no longer changes and the destination holds all of it.
    Copied,
    /// The destination's entry is published, fenced.
    Switched {
        /// When the destination was published.
        since: Duration,
    },
    /// The workloads may no longer reach the source.
    Revoked,
    /// The destination's entry is open: the switch is over.
    Open,
}

/// What the operator does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Publish the source's entry fenced.
    Fence,
    /// Nothing before this instant.
    WaitUntil(Duration),
    /// Copy what the source has and the destination lacks or holds
    /// differently, delete from the destination what the source no longer
    /// has, and verify every object.
    CopyRest,
    /// Publish the destination's entry, fenced.
    PublishDestination,
    /// Revoke the workloads' access to the source.
    RevokeSource,
    /// Publish the destination's entry open.
    Open,
    /// Nothing left to do.
    Done,
}

impl Switch {
    /// The next action at `now`.
    pub fn next(self, now: Duration, timing: Timing) -> Action {
        let waited = |since: Duration, wait: Duration| {
            if now >= since + wait {
                None
            } else {
                Some(Action::WaitUntil(since + wait))
            }
        };
        match self {
            Switch::Copying => Action::Fence,
            Switch::Fenced { since } => {
                waited(since, timing.fence_wait()).unwrap_or(Action::CopyRest)
            }
            Switch::Copied => Action::PublishDestination,
            Switch::Switched { since } => {
                waited(since, timing.switch_wait()).unwrap_or(Action::RevokeSource)
            }
            Switch::Revoked => Action::Open,
            Switch::Open => Action::Done,
        }
    }

    /// The state once `action`, returned by [`Switch::next`], is done; `now`
    /// is when it was acknowledged (the API server's answer to a publish).
    pub fn after(self, action: Action, now: Duration) -> Switch {
        match (self, action) {
            (Switch::Copying, Action::Fence) => Switch::Fenced { since: now },
            (Switch::Fenced { .. }, Action::CopyRest) => Switch::Copied,
            (Switch::Copied, Action::PublishDestination) => Switch::Switched { since: now },
            (Switch::Switched { .. }, Action::RevokeSource) => Switch::Revoked,
            (Switch::Revoked, Action::Open) => Switch::Open,
            (state, _) => state,
        }
    }

    /// The state after the operator restarted at `now`: a wait in progress
    /// starts again, since the old clock is gone.
    pub fn restarted(self, now: Duration) -> Switch {
        match self {
            Switch::Fenced { .. } => Switch::Fenced { since: now },
            Switch::Switched { .. } => Switch::Switched { since: now },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        bound: Duration::from_secs(60),
        settle: Duration::from_secs(10),
    };

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn the_steps_in_order_with_their_waits() {
        let mut state = Switch::Copying;
        let mut now = s(0);
        let mut seen = Vec::new();
        loop {
            match state.next(now, TIMING) {
                Action::Done => break,
                Action::WaitUntil(t) => {
                    seen.push(Action::WaitUntil(t));
                    now = t;
                }
                action => {
                    seen.push(action);
                    now += s(1);
                    state = state.after(action, now);
                }
            }
        }
        // The bound with its margin is 60 + 6 + 1 = 67 s.
        let want = [
            Action::Fence,
            Action::WaitUntil(s(1 + 67 + 10)),
            Action::CopyRest,
            Action::PublishDestination,
            Action::WaitUntil(s(80 + 67)),
            Action::RevokeSource,
            Action::Open,
        ];
        assert_eq!(seen, want);
        assert_eq!(state, Switch::Open);
    }

    #[test]
    fn a_restart_starts_a_wait_again_and_an_action_out_of_turn_changes_nothing() {
        let fenced = Switch::Fenced { since: s(5) };
        assert_eq!(fenced.restarted(s(50)), Switch::Fenced { since: s(50) });
        assert_eq!(
            fenced.restarted(s(50)).next(s(100), TIMING),
            Action::WaitUntil(s(50 + 77))
        );
        assert_eq!(Switch::Copied.restarted(s(9)), Switch::Copied);
        assert_eq!(fenced.after(Action::Open, s(9)), fenced);
        assert_eq!(
            Switch::Copying.after(Action::CopyRest, s(9)),
            Switch::Copying
        );
    }
}
