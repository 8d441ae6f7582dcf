//! Moves against a fake world whose effects fail, whose copies keep
//! finding changes, and whose operator restarts.

use std::cell::RefCell;
use std::time::Duration;

use proptest::prelude::*;

use super::{Effects, Limits, Move, Next, Phase};
use crate::relocation::copy::Pass;
use crate::relocation::switch::Timing;
use crate::{Error, Result};

const TIMING: Timing = Timing {
    bound: Duration::from_secs(60),
    settle: Duration::from_secs(10),
};
/// The waits the protocol asks for with [`TIMING`], worked out by hand:
/// the bound plus a tenth and a second, plus the settle time for the fence.
const FENCE_WAIT: Duration = Duration::from_secs(60 + 6 + 1 + 10);
const SWITCH_WAIT: Duration = Duration::from_secs(60 + 6 + 1);
const LIMITS: Limits = Limits {
    fence_below: 10,
    fence_below_permille: 1,
    fenced_for: Duration::from_secs(600),
    delete_source: true,
};

/// What the world saw, with the clock's reading.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Created,
    Pass { copied: u64 },
    Published { destination: bool, fenced: bool },
    Revoked,
    Retired,
}

#[derive(Default)]
struct Fake {
    now: RefCell<Duration>,
    seen: RefCell<Vec<(Duration, Seen)>>,
    /// What successive passes copy, then `then` for every later one.
    passes: RefCell<Vec<u64>>,
    then: u64,
    /// Whether each successive effect fails (true), once each; then none.
    failures: RefCell<Vec<bool>>,
}

impl Fake {
    fn new(passes: &[u64], failures: Vec<bool>) -> Fake {
        let fake = Fake::default();
        fake.passes.replace(passes.iter().rev().copied().collect());
        fake.failures.replace(failures.into_iter().rev().collect());
        fake
    }

    fn effect(&self, seen: Seen) -> Result<()> {
        *self.now.borrow_mut() += Duration::from_secs(1);
        if self.failures.borrow_mut().pop().unwrap_or(false) {
            return Err(Error::Publish(format!("injected failure of {seen:?}")));
        }
        self.seen.borrow_mut().push((*self.now.borrow(), seen));
        Ok(())
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.borrow().iter().map(|(_, s)| s.clone()).collect()
    }
}

impl Effects for Fake {
    fn now(&self) -> Duration {
        *self.now.borrow()
    }
    async fn create_destination(&self) -> Result<()> {
        self.effect(Seen::Created)
    }
    async fn copy_pass(&self) -> Result<Pass> {
        let copied = self.passes.borrow().last().copied().unwrap_or(self.then);
        self.effect(Seen::Pass { copied })?;
        self.passes.borrow_mut().pop();
        Ok(Pass {
            objects: 1_000,
            copied,
            ..Pass::default()
        })
    }
    async fn publish(&self, destination: bool, fenced: bool) -> Result<()> {
        self.effect(Seen::Published {
            destination,
            fenced,
        })
    }
    async fn revoke_source(&self) -> Result<()> {
        self.effect(Seen::Revoked)
    }
    async fn retire_source(&self, _delete: bool) -> Result<()> {
        self.effect(Seen::Retired)
    }
}

/// Runs a move to its end or `steps` steps; the operator restarts before
/// the steps in `restarts`. Errors leave the stored move as it was.
async fn run(fake: &Fake, restarts: &[usize], steps: usize) -> Move {
    let mut stored = Move::new();
    for step in 0..steps {
        if restarts.contains(&step) {
            stored = stored.restarted(fake.now(), LIMITS);
        }
        let published = destination_publishes(fake);
        let result = stored.step(fake, TIMING, LIMITS).await;
        if destination_publishes(fake) > published {
            // The stored move said so before the publish.
            assert!(stored.committed && !stored.cancellable(), "{stored:?}");
        }
        match result {
            Ok((next, Next::Done)) => return next,
            Ok((next, Next::At(t))) => {
                stored = next;
                let mut now = fake.now.borrow_mut();
                *now = (*now).max(t);
            }
            Ok((next, Next::Continue)) => stored = next,
            Err(_) => *fake.now.borrow_mut() += Duration::from_secs(5),
        }
    }
    stored
}

fn destination_publishes(fake: &Fake) -> usize {
    let seen = fake.seen();
    seen.iter()
        .filter(|s| {
            matches!(
                s,
                Seen::Published {
                    destination: true,
                    ..
                }
            )
        })
        .count()
}

#[tokio::test]
async fn a_move_goes_through_its_steps_in_order_with_its_waits() {
    let fake = Fake::new(&[900, 40, 3, 1], vec![]);
    let done = run(&fake, &[], 100).await;
    assert_eq!(done.phase, Phase::Done);
    let published = |destination, fenced| Seen::Published {
        destination,
        fenced,
    };
    assert_eq!(
        fake.seen(),
        [
            Seen::Created,
            Seen::Pass { copied: 900 },
            Seen::Pass { copied: 40 },
            Seen::Pass { copied: 3 },
            published(false, true),
            Seen::Pass { copied: 1 },
            Seen::Pass { copied: 0 },
            published(true, true),
            Seen::Revoked,
            published(true, false),
            Seen::Retired,
        ]
    );
    check(&fake.seen.borrow()).expect("the protocol's order and waits");
}

#[tokio::test]
async fn a_source_that_keeps_changing_under_the_fence_gets_it_lifted() {
    let mut fake = Fake::new(&[5], vec![]);
    fake.then = 7;
    let moved = run(&fake, &[], 400).await;
    assert_eq!(moved.phase, Phase::Copying, "{:?}", fake.seen());
    let at = |wanted: Seen| {
        fake.seen
            .borrow()
            .iter()
            .find(|(_, s)| *s == wanted)
            .map(|(t, _)| *t)
    };
    let fenced = at(Seen::Published {
        destination: false,
        fenced: true,
    })
    .expect("fenced");
    let lifted = at(Seen::Published {
        destination: false,
        fenced: false,
    })
    .expect("lifted");
    assert!(
        lifted - fenced >= LIMITS.fenced_for,
        "{fenced:?} {lifted:?}"
    );
    assert_eq!(
        at(Seen::Published {
            destination: true,
            fenced: true
        }),
        None
    );
    check(&fake.seen.borrow()).expect("the protocol's order and waits");
}

/// The protocol's rules on what the world saw: the entries follow the
/// switch's order; the last copy starts a fence wait after the fence and
/// converges before the destination is published; the source's access is
/// revoked a switch wait after that, before the destination opens; the
/// source is retired after.
fn check(seen: &[(Duration, Seen)]) -> std::result::Result<(), String> {
    let mut fenced_at = None;
    let mut destination_at = None;
    let mut converged_since_fence = false;
    let mut revoked = false;
    let mut open = false;
    for (t, s) in seen {
        match s {
            Seen::Published {
                destination: false,
                fenced,
            } => {
                if destination_at.is_some() {
                    return Err(format!("{t:?}: back to the source after the switch"));
                }
                fenced_at = fenced.then_some(*t);
                converged_since_fence = false;
            }
            Seen::Pass { copied } => {
                if let Some(f) = fenced_at
                    && destination_at.is_none()
                {
                    if *t < f + FENCE_WAIT {
                        return Err(format!("{t:?}: the last copy before the fence's wait"));
                    }
                    converged_since_fence = *copied == 0;
                }
            }
            Seen::Published {
                destination: true,
                fenced: true,
            } => {
                if fenced_at.is_none() || !converged_since_fence {
                    return Err(format!(
                        "{t:?}: destination published before a converged copy"
                    ));
                }
                destination_at = Some(*t);
            }
            Seen::Revoked => {
                let since = destination_at.ok_or(format!("{t:?}: revoked before the switch"))?;
                if *t < since + SWITCH_WAIT {
                    return Err(format!("{t:?}: revoked before the switch's wait"));
                }
                revoked = true;
            }
            Seen::Published {
                destination: true,
                fenced: false,
            } => {
                if !revoked {
                    return Err(format!("{t:?}: opened before the source was revoked"));
                }
                open = true;
            }
            Seen::Retired if !open => return Err(format!("{t:?}: retired before opening")),
            Seen::Created | Seen::Retired => {}
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever fails and whenever the operator restarts, what the world
    /// sees keeps the protocol's rules, and a move whose failures stop
    /// ends.
    #[test]
    fn failures_and_restarts_never_break_the_protocol(
        passes in prop::collection::vec(0..50u64, 1..8),
        failures in prop::collection::vec(prop::bool::weighted(0.3), 0..40),
        restarts in prop::collection::vec(0..200usize, 0..6),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let fake = Fake::new(&passes, failures);
        let moved = runtime.block_on(run(&fake, &restarts, 300));
        check(&fake.seen.borrow()).map_err(TestCaseError::fail)?;
        prop_assert_eq!(moved.phase, Phase::Done, "{:?}", fake.seen());
    }
}
