//! A move from start to end: create the destination, copy until it lags
//! little, switch ([`Switch`]), retire the source. The reconciler calls
//! [`Move::step`] and stores the [`Move`] it returns between calls (in the
//! resource's status, with a precondition), so every step is decided from
//! the move as stored. What a step does to the world goes through
//! [`Effects`], so tests run a move against fakes that fail and restart.
//!
//! Fail safe: until the destination is published, an error leaves the
//! application on the source, and a fence that cannot be switched within
//! [`Limits::fenced_for`] is lifted (the source's entry opens again and the
//! copy goes on), so writes are never held for long by a move that cannot
//! end. A cancel before the switch deletes the partial destination. The
//! move is stored as committed before the destination's entry is published
//! ([`Move::committed`]): from then on it only goes forward, so an operator
//! that dies between the two never sends the application back to a source
//! that has fallen behind. Nothing in the source is deleted before the
//! switch is over.

use std::time::Duration;

use super::copy::Pass;
use super::switch::{Action, Switch, Timing};
use crate::Result;

/// Where a move stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The destination bucket is being created with the new settings.
    Creating,
    /// Passes copy while the application uses the source.
    Copying,
    /// The switch, step by step; `fenced_at` is when the fence went up.
    Switching {
        /// The switch's own state.
        switch: Switch,
        /// When the source's entry was fenced (operator's clock).
        fenced_at: Duration,
    },
    /// The application uses the destination; the source is being retired.
    Retiring,
    /// Over: the source is deleted or kept as asked.
    Done,
}

/// The move as stored between steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// Where it stands.
    pub phase: Phase,
    /// Passes run so far.
    pub passes: u32,
    /// No fence before this instant: a lifted fence leaves the application
    /// writing for at least as long as it held its writes.
    pub fence_after: Option<Duration>,
    /// The destination's entry may have been published: from here on the
    /// move only goes forward (no lift, no cancel). Stored before the
    /// publish, so an operator that dies between the two never takes the
    /// application back to a source that has fallen behind.
    pub committed: bool,
}

/// What a step tells the reconciler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Store the move and call again at once.
    Continue,
    /// Store the move and call again at this instant (operator's clock).
    At(Duration),
    /// The move is over.
    Done,
}

/// When the copy is close enough to fence, and how long a fence may stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Fence once a pass copied at most this many objects (and this share
    /// of the source, in thousandths).
    pub fence_below: u64,
    /// The share of the source's objects, in thousandths, also accepted.
    pub fence_below_permille: u64,
    /// Lift a fence that has not reached the switch after this long.
    pub fenced_for: Duration,
    /// Whether the source is deleted at the end (else kept, labelled).
    pub delete_source: bool,
}

/// What a move does to the world.
#[allow(async_fn_in_trait)]
pub trait Effects {
    /// The operator's clock.
    fn now(&self) -> Duration;
    /// Creates the destination with the new settings, grants and
    /// notifications; done when it already exists as ours.
    async fn create_destination(&self) -> Result<()>;
    /// One copy pass from the source to the destination.
    async fn copy_pass(&self) -> Result<Pass>;
    /// Publishes the logical name's entry: the destination's or the
    /// source's, fenced or open. Returns once the API server acknowledged it.
    async fn publish(&self, destination: bool, fenced: bool) -> Result<()>;
    /// Revokes the workloads' access to the source.
    async fn revoke_source(&self) -> Result<()>;
    /// Deletes the source (every object is in the destination) or keeps it
    /// labelled with where its data went.
    async fn retire_source(&self, delete: bool) -> Result<()>;
}

impl Move {
    /// A move that starts now.
    pub fn new() -> Move {
        Move {
            phase: Phase::Creating,
            passes: 0,
            fence_after: None,
            committed: false,
        }
    }

    /// One step. On an error the move is left as it was stored, except
    /// that a fence held for longer than its limit is lifted first.
    pub async fn step(
        self,
        fx: &impl Effects,
        timing: Timing,
        limits: Limits,
    ) -> Result<(Move, Next)> {
        match self.phase {
            Phase::Creating => {
                fx.create_destination().await?;
                Ok((self.with(Phase::Copying), Next::Continue))
            }
            Phase::Copying => self.copy(fx, limits).await,
            Phase::Switching { switch, fenced_at } => {
                self.switch(fx, timing, limits, switch, fenced_at).await
            }
            Phase::Retiring => {
                fx.retire_source(limits.delete_source).await?;
                Ok((self.with(Phase::Done), Next::Done))
            }
            Phase::Done => Ok((self, Next::Done)),
        }
    }

    fn with(self, phase: Phase) -> Move {
        Move { phase, ..self }
    }

    /// A pass; the fence goes up once one copied little enough.
    async fn copy(self, fx: &impl Effects, limits: Limits) -> Result<(Move, Next)> {
        let pass = fx.copy_pass().await?;
        let passes = self.passes + 1;
        let close = pass.copied <= limits.fence_below
            || pass.copied * 1000 <= pass.objects * limits.fence_below_permille;
        let cooling = self.fence_after.is_some_and(|t| fx.now() < t);
        if !close || cooling {
            return Ok((Move { passes, ..self }, Next::Continue));
        }
        fx.publish(false, true).await?;
        let now = fx.now();
        let phase = Phase::Switching {
            switch: Switch::Copying.after(Action::Fence, now),
            fenced_at: now,
        };
        let moved = Move {
            phase,
            passes,
            fence_after: None,
            ..self
        };
        Ok((moved, Next::Continue))
    }

    /// One action of the switch.
    async fn switch(
        self,
        fx: &impl Effects,
        timing: Timing,
        limits: Limits,
        switch: Switch,
        fenced_at: Duration,
    ) -> Result<(Move, Next)> {
        let action = switch.next(fx.now(), timing);
        if action == Action::PublishDestination && !self.committed {
            // Stored first: see `committed`.
            let committed = Move {
                committed: true,
                ..self
            };
            return Ok((committed, Next::Continue));
        }
        let liftable = !self.committed && before_destination(switch);
        let done = match self.act(fx, action).await {
            Ok(done) => done,
            Err(e) if liftable && fx.now() >= fenced_at + limits.fenced_for => {
                tracing::warn!(error = %e, "lifting the fence of a move that could not switch");
                return self.lift(fx, limits).await;
            }
            Err(e) => return Err(e),
        };
        if done {
            let phase = match switch.after(action, fx.now()) {
                Switch::Open => Phase::Retiring,
                switch => Phase::Switching { switch, fenced_at },
            };
            return Ok((self.with(phase), Next::Continue));
        }
        if liftable && fx.now() >= fenced_at + limits.fenced_for {
            tracing::warn!("lifting the fence of a move whose source kept changing");
            return self.lift(fx, limits).await;
        }
        match action {
            Action::WaitUntil(t) => Ok((self, Next::At(t))),
            _ => Ok((self, Next::Continue)),
        }
    }

    /// Opens the source's entry again and goes back to copying.
    async fn lift(self, fx: &impl Effects, limits: Limits) -> Result<(Move, Next)> {
        fx.publish(false, false).await?;
        let lifted = Move {
            phase: Phase::Copying,
            fence_after: Some(fx.now() + limits.fenced_for),
            ..self
        };
        Ok((lifted, Next::Continue))
    }

    /// Does `action`; true when it is done, false when there is nothing
    /// to do yet (a wait) or the last copy must run again.
    async fn act(self, fx: &impl Effects, action: Action) -> Result<bool> {
        match action {
            Action::Fence => fx.publish(false, true).await.map(|()| true),
            Action::WaitUntil(_) | Action::Done => Ok(false),
            Action::CopyRest => {
                let copied = fx.copy_pass().await?;
                let check = fx.copy_pass().await?;
                if check.converged() {
                    return Ok(true);
                }
                tracing::warn!(
                    ?copied,
                    ?check,
                    "the source changed under the fence; copying again"
                );
                Ok(false)
            }
            Action::PublishDestination => fx.publish(true, true).await.map(|()| true),
            Action::RevokeSource => fx.revoke_source().await.map(|()| true),
            Action::Open => fx.publish(true, false).await.map(|()| true),
        }
    }

    /// The move after the operator restarted: a wait in progress starts
    /// again ([`Switch::restarted`]), and so do the fence's limit and a
    /// lifted fence's pause, measured on a clock that is gone.
    pub fn restarted(self, now: Duration, limits: Limits) -> Move {
        let fence_after = self.fence_after.map(|_| now + limits.fenced_for);
        let this = Move {
            fence_after,
            ..self
        };
        match this.phase {
            Phase::Switching { switch, .. } => this.with(Phase::Switching {
                switch: switch.restarted(now),
                fenced_at: now,
            }),
            _ => this,
        }
    }
}

impl Default for Move {
    fn default() -> Self {
        Move::new()
    }
}

/// Whether the application still uses the source: the destination's entry
/// is not published yet, so the fence may be lifted.
fn before_destination(switch: Switch) -> bool {
    matches!(
        switch,
        Switch::Copying | Switch::Fenced { .. } | Switch::Copied
    )
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;

impl Move {
    /// Whether a cancel may still take the application back to the source
    /// and delete the partial destination.
    pub fn cancellable(&self) -> bool {
        !self.committed && !matches!(self.phase, Phase::Retiring | Phase::Done)
    }
}
