//! The staleness rule on random interleavings (docs/ARCHITECTURE.md, "How
//! fresh a sidecar's map is"): the operator changes where `photos` points,
//! again and again; the sidecar follows as [`crate::live`] does — one
//! consistent list at a time, confirming the map as of the instant the
//! list was *sent*, then a watch whose events may arrive late or be lost —
//! while the application writes at random moments. Lists are answered
//! after random delays or never, with the state at any instant between
//! their sending and their answer (both are valid for a linearizable read).
//!
//! The invariant, checked at every write the real [`MappingStore`] and the
//! real [`policy::decide`] let through: it goes to the bucket of the latest
//! change, or the change that replaced its bucket is no older than the
//! bound. Time is simulated: the store's `staleness_at` and `confirm` take
//! instants.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::mapping::MappingStore;
use crate::policy::{self, Decision};

/// The bound, in simulated milliseconds.
const BOUND_MS: u64 = 4_000;

#[derive(Clone, Debug)]
enum Step {
    /// The operator points `photos` at a new bucket; acknowledged at once.
    Change,
    /// The sidecar, if not listing already, sends a consistent list; its
    /// answer comes `delay` ms later, or never (`lost`: the follower gives
    /// up after its timeout and may list again), holding the state as of
    /// the sending (`late` false) or as of the answer (`late` true).
    List { delay: u64, lost: bool, late: bool },
    /// The watch delivers its next change, or loses it (the watch is then
    /// broken until the next list).
    Deliver { lost: bool },
    /// The application writes.
    Write,
    /// Time passes.
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => Just(Step::Change),
        2 => (0..6_000u64, prop::bool::weighted(0.2), any::<bool>())
            .prop_map(|(delay, lost, late)| Step::List { delay, lost, late }),
        2 => prop::bool::weighted(0.2).prop_map(|lost| Step::Deliver { lost }),
        4 => Just(Step::Write),
        3 => (0..3_000u64).prop_map(Step::Wait),
    ]
}

/// What the follower is doing.
#[derive(Debug)]
enum Follower {
    /// Nothing in flight (the start, a lost list, a broken watch).
    Idle,
    /// A list sent at `sent`, answered at `at` (never when `lost`).
    Listing {
        sent: u64,
        at: u64,
        lost: bool,
        late: bool,
    },
    /// Watching: the changes up to `seen` are applied.
    Watching { seen: usize },
}

/// The world: every change with its acknowledgement time, the clock, the
/// follower and the real store.
struct World {
    /// Physical name and acknowledgement instant (ms) of each version.
    versions: Vec<(String, u64)>,
    now: u64,
    base: Instant,
    follower: Follower,
    store: MappingStore,
    accepted: u32,
    refused: u32,
}

impl World {
    fn new() -> Self {
        let base = Instant::now();
        Self {
            versions: vec![("photos-v0000000".to_owned(), 0)],
            now: 0,
            base,
            follower: Follower::Idle,
            store: MappingStore::new(None, Vec::new()).following(Duration::from_millis(BOUND_MS)),
            accepted: 0,
            refused: 0,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    /// The latest version acknowledged at or before `ms`.
    fn version_at(&self, ms: u64) -> usize {
        self.versions
            .iter()
            .rposition(|(_, acked)| *acked <= ms)
            .unwrap_or(0)
    }

    fn apply(&self, version: usize) {
        let physical = self.versions[version].0.clone();
        let _ = self.store.apply_live(vec![("photos".to_owned(), physical)]);
    }

    /// Moves the clock to `to`, answering the list if it comes by then.
    fn advance(&mut self, to: u64) {
        if let Follower::Listing {
            sent,
            at,
            lost,
            late,
        } = self.follower
            && at <= to
        {
            if lost {
                self.follower = Follower::Idle;
            } else {
                let version = self.version_at(if late { at } else { sent });
                self.apply(version);
                self.store.confirm(self.at(sent));
                self.follower = Follower::Watching { seen: version };
            }
        }
        self.now = to;
    }

    fn run(&mut self, step: &Step) -> Result<(), TestCaseError> {
        match *step {
            Step::Change => {
                let n = self.versions.len();
                self.versions.push((format!("photos-v{n:07}"), self.now));
            }
            Step::List { delay, lost, late } => {
                if !matches!(self.follower, Follower::Listing { .. }) {
                    let sent = self.now;
                    self.follower = Follower::Listing {
                        sent,
                        at: sent + delay,
                        lost,
                        late,
                    };
                }
            }
            Step::Deliver { lost } => self.deliver(lost),
            Step::Write => self.write()?,
            Step::Wait(ms) => self.advance(self.now + ms),
        }
        Ok(())
    }

    fn deliver(&mut self, lost: bool) {
        if let Follower::Watching { seen } = self.follower
            && seen + 1 < self.versions.len()
        {
            if lost {
                self.follower = Follower::Idle;
            } else {
                self.apply(seen + 1);
                self.follower = Follower::Watching { seen: seen + 1 };
            }
        }
    }

    /// A write, decided by the real policy on the real store's state.
    fn write(&mut self) -> Result<(), TestCaseError> {
        let mapping = self.store.current();
        let cx = policy::Context {
            mapping: mapping.as_deref(),
            allow_physical: false,
            adc: false,
            stale: self.store.staleness_at(self.at(self.now)),
        };
        let request = policy::Request {
            operation: Ok("objects.insert"),
            framing: None,
            buckets: ["photos"].into_iter().collect(),
            credentials: true,
            writes: true,
        };
        let Decision::Forward { physical, .. } = policy::decide(&request, &cx) else {
            self.refused += 1;
            return Ok(());
        };
        self.accepted += 1;
        let used = self
            .versions
            .iter()
            .position(|(name, _)| name == physical[0])
            .ok_or_else(|| TestCaseError::fail("a bucket no version names"))?;
        if let Some((_, replaced_at)) = self.versions.get(used + 1) {
            prop_assert!(
                self.now <= replaced_at + BOUND_MS,
                "at {} ms a write went to version {used}, replaced at {replaced_at} ms",
                self.now
            );
        }
        Ok(())
    }
}

#[test]
fn no_write_uses_an_entry_replaced_longer_than_the_bound_ago() {
    let config = Config {
        test_name: Some("no_write_uses_an_entry_replaced_longer_than_the_bound_ago"),
        source_file: Some(file!()),
        ..Config::with_cases(1024)
    };
    let totals = std::sync::Mutex::new((0u32, 0u32));
    let run = TestRunner::new(config).run(&prop::collection::vec(step(), 1..120), |steps| {
        let mut world = World::new();
        for step in &steps {
            world.run(step)?;
        }
        if let Ok(mut totals) = totals.lock() {
            totals.0 += world.accepted;
            totals.1 += world.refused;
        }
        Ok(())
    });
    if let Err(e) = run {
        panic!("{e}");
    }
    // Not vacuous: writes went through and were refused, many times.
    let (accepted, refused) = totals.into_inner().unwrap_or_default();
    assert!(
        accepted > 1_000 && refused > 1_000,
        "{accepted} accepted, {refused} refused"
    );
}
