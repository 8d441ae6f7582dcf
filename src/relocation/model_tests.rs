//! The switch protocol on random interleavings (docs/ARCHITECTURE.md,
//! "Moving a bucket: the switch"). The operator's real [`Switch`] moves a
//! logical name from the source bucket to the destination while sidecars
//! follow the map as issue 58 built them — consistent lists answered late or
//! never, watch events late or lost, cut off from the API server for a while
//! or for good — and apply the sidecar's real rule
//! ([`bucketmap_sidecar_core::relocation`]) to the application's writes,
//! deletes and reads, among them uploads that take longer than the bound.
//! The operator restarts at random; IAM takes its time to propagate.
//!
//! The invariant: the application sees one bucket. Every read answers the
//! last write or delete that committed, in either bucket; nothing commits
//! in the source after the last copy of its object nor in the destination
//! before it; at the end the destination holds the last committed value of
//! every object (nothing lost, nothing deleted comes back). The one
//! exemption is issue 58's: a stale sidecar still serves reads of an open
//! entry, so one cut off since before the move began reads the source until
//! its access is revoked and IAM has propagated.
//!
//! Each of the protocol's safeguards is then taken away in turn, and the same
//! search must find a violation: the checker can fail.

use std::collections::BTreeMap;
use std::time::Duration;

use bucketmap_sidecar_core::relocation::{self as rule, Entry, Route};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::switch::{Action, Switch, Timing};

/// Simulated milliseconds.
type Ms = u64;
const TICK: Ms = 100;
const BOUND: Ms = 10_000;
const SETTLE: Ms = 2_000;
const HOLD_LIMIT: Ms = 30_000;
const MOVE_AT: Ms = 5_000;
const LAST_OP: Ms = 80_000;
const HORIZON: Ms = 200_000;
const KEYS: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bucket {
    Source,
    Destination,
}

/// A safeguard taken away, to show the checker finds what it prevents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    None,
    /// The operator copies the rest as soon as the fence is published.
    NoFenceWait,
    /// The operator opens the destination as soon as it is published.
    NoSwitchWait,
    /// Sidecars let writes in flight finish whatever the map says.
    NoCutOff,
    /// A stale sidecar serves reads of a fenced entry.
    StaleReadsOfFenced,
}

/// How one sidecar hears from the API server.
#[derive(Clone, Debug)]
struct SidecarPlan {
    /// When it hears nothing: `[from, to)`.
    cut: Option<(Ms, Ms)>,
    /// How often it lists.
    period: Ms,
    /// How late each list is answered (cycled); `None`: never.
    list_delays: Vec<Option<Ms>>,
    /// How late the watch delivers each published version after the first;
    /// `None`: lost.
    watch_delays: Vec<Option<Ms>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write,
    Delete,
    Read,
}

/// One request of the application.
#[derive(Clone, Debug)]
struct OpPlan {
    at: Ms,
    sidecar: usize,
    key: u8,
    kind: Kind,
    /// How long its body takes to send.
    body: Ms,
    /// How long GCS takes to commit it once the body is whole.
    commit: Ms,
}

#[derive(Clone, Debug)]
struct Plan {
    sidecars: Vec<SidecarPlan>,
    ops: Vec<OpPlan>,
    /// Copies of one object while the application still uses the source.
    precopies: Vec<(Ms, u8)>,
    restarts: Vec<Ms>,
    iam_delay: Ms,
}

fn sidecar_plan() -> impl Strategy<Value = SidecarPlan> {
    let cut = prop::option::weighted(0.5, (0..60_000u64, 1_000..300_000u64));
    (
        cut,
        500..=BOUND / 4,
        prop::collection::vec(prop::option::weighted(0.9, 0..1_500u64), 1..4),
        prop::collection::vec(prop::option::weighted(0.8, 0..5_000u64), 3),
    )
        .prop_map(|(cut, period, list_delays, watch_delays)| SidecarPlan {
            cut: cut.map(|(from, len)| (from, from + len)),
            period,
            list_delays,
            watch_delays,
        })
}

fn op_plan(sidecars: usize) -> impl Strategy<Value = OpPlan> {
    let kind = prop_oneof![3 => Just(Kind::Write), 1 => Just(Kind::Delete), 4 => Just(Kind::Read)];
    let body = prop_oneof![3 => 0..2_000u64, 1 => 10_000..40_000u64];
    (0..LAST_OP, 0..sidecars, 0..KEYS, kind, body, 0..=SETTLE).prop_map(
        |(at, sidecar, key, kind, body, commit)| OpPlan {
            at,
            sidecar,
            key,
            kind,
            body: if kind == Kind::Write { body } else { 0 },
            commit,
        },
    )
}

fn plan() -> impl Strategy<Value = Plan> {
    prop::collection::vec(sidecar_plan(), 1..4).prop_flat_map(|sidecars| {
        let n = sidecars.len();
        (
            Just(sidecars),
            prop::collection::vec(op_plan(n), 10..60),
            prop::collection::vec((0..MOVE_AT, 0..KEYS), 0..4),
            prop::collection::vec(0..60_000u64, 0..3),
            0..20_000u64,
        )
            .prop_map(|(sidecars, ops, precopies, restarts, iam_delay)| Plan {
                sidecars,
                ops,
                precopies,
                restarts,
                iam_delay,
            })
    })
}

/// A version of the logical name's entry, as published.
#[derive(Clone, Copy, Debug)]
struct Version {
    at: Ms,
    bucket: Bucket,
    entry: Entry,
}

/// A sidecar as it runs.
#[derive(Debug)]
struct Sidecar {
    plan: SidecarPlan,
    version: usize,
    confirmed: Ms,
    /// A list in flight: sent, answered at (never if `None`).
    listing: Option<(Ms, Option<Ms>)>,
    next_list: Ms,
    lists: usize,
}

impl Sidecar {
    fn new(plan: SidecarPlan) -> Sidecar {
        Sidecar {
            plan,
            version: 0,
            confirmed: 0,
            listing: None,
            next_list: 0,
            lists: 0,
        }
    }

    fn connected(&self, t: Ms) -> bool {
        self.plan.cut.is_none_or(|(from, to)| t < from || t >= to)
    }

    fn stale(&self, t: Ms) -> bool {
        t - self.confirmed > BOUND
    }

    /// Lists and watch deliveries up to `t`.
    fn hear(&mut self, t: Ms, published: &[Version]) {
        if let Some((sent, answer)) = self.listing {
            match answer {
                Some(at) if at <= t => {
                    if self.connected(at) {
                        self.version = self.version.max(latest(published, at));
                        self.confirmed = sent;
                    }
                    self.listing = None;
                }
                None if t >= sent + BOUND / 4 => self.listing = None,
                _ => {}
            }
        }
        if self.listing.is_none() && t >= self.next_list && self.connected(t) {
            let delay = self.plan.list_delays[self.lists % self.plan.list_delays.len()];
            self.lists += 1;
            self.listing = Some((t, delay.map(|d| t + d)));
            self.next_list = t + self.plan.period;
        }
        for (i, v) in published.iter().enumerate().skip(1) {
            let delay = self.plan.watch_delays.get(i - 1).copied().flatten();
            if delay.is_some_and(|d| v.at + d <= t) && self.connected(t) {
                self.version = self.version.max(i);
            }
        }
    }
}

/// The newest version published at or before `t`.
fn latest(published: &[Version], t: Ms) -> usize {
    published.iter().rposition(|v| v.at <= t).unwrap_or(0)
}

/// A request as it runs.
#[derive(Clone, Copy, Debug)]
enum OpState {
    NotYet,
    Held {
        since: Ms,
    },
    InFlight {
        bucket: Bucket,
        body_done: Ms,
        commit_at: Ms,
    },
    Over,
}

/// The operator as it runs.
#[derive(Debug)]
struct Operator {
    state: Switch,
    /// The objects the last copy has still to copy, once it runs.
    copying: Option<Vec<u8>>,
    revoked_at: Option<Ms>,
}

struct World {
    flaw: Flaw,
    plan: Plan,
    timing: Timing,
    published: Vec<Version>,
    sidecars: Vec<Sidecar>,
    ops: Vec<OpState>,
    operator: Operator,
    source: BTreeMap<u8, u64>,
    destination: BTreeMap<u8, u64>,
    /// The last committed value of each object (0: deleted).
    truth: BTreeMap<u8, u64>,
    /// When the last copy copied each object.
    copied_at: BTreeMap<u8, Ms>,
}

fn ms(d: Ms) -> Duration {
    Duration::from_millis(d)
}

impl World {
    fn new(plan: Plan, flaw: Flaw) -> World {
        let source: BTreeMap<u8, u64> = (0..KEYS).map(|k| (k, 1_000 + u64::from(k))).collect();
        World {
            flaw,
            timing: Timing {
                bound: ms(BOUND),
                settle: ms(SETTLE),
            },
            published: vec![Version {
                at: 0,
                bucket: Bucket::Source,
                entry: Entry::Open,
            }],
            sidecars: plan.sidecars.iter().cloned().map(Sidecar::new).collect(),
            ops: vec![OpState::NotYet; plan.ops.len()],
            operator: Operator {
                state: Switch::Copying,
                copying: None,
                revoked_at: None,
            },
            truth: source.clone(),
            source,
            destination: BTreeMap::new(),
            copied_at: BTreeMap::new(),
            plan,
        }
    }

    fn run(&mut self) -> Result<(), String> {
        let mut t = 0;
        while t <= HORIZON {
            self.operate(t);
            for s in &mut self.sidecars {
                s.hear(t, &self.published);
            }
            for i in 0..self.ops.len() {
                self.step_op(i, t)?;
            }
            t += TICK;
        }
        self.check_end()
    }

    fn check_end(&self) -> Result<(), String> {
        if self.operator.state != Switch::Open {
            return Err(format!("the switch never ended: {:?}", self.operator.state));
        }
        for k in 0..KEYS {
            let (want, have) = (
                self.truth[&k],
                self.destination.get(&k).copied().unwrap_or(0),
            );
            if want != have {
                return Err(format!(
                    "object {k}: the destination holds {have}, last committed {want}"
                ));
            }
        }
        Ok(())
    }
}

impl World {
    fn operate(&mut self, t: Ms) {
        if self.plan.restarts.iter().any(|&r| r / TICK == t / TICK) {
            self.operator.state = self.operator.state.restarted(ms(t));
            self.operator.copying = None;
        }
        if t < MOVE_AT {
            for &(at, k) in &self.plan.precopies {
                if at / TICK == t / TICK {
                    copy(&self.source, &mut self.destination, k);
                }
            }
            return;
        }
        loop {
            let action = self.next_action(t);
            match action {
                Action::Done | Action::WaitUntil(_) => return,
                Action::CopyRest => {
                    if !self.copy_one(t) {
                        return;
                    }
                }
                Action::Fence => self.publish(t, Bucket::Source, Entry::Fenced),
                Action::PublishDestination => self.publish(t, Bucket::Destination, Entry::Fenced),
                Action::RevokeSource => self.operator.revoked_at = Some(t),
                Action::Open => self.publish(t, Bucket::Destination, Entry::Open),
            }
            self.operator.state = self.operator.state.after(action, ms(t));
        }
    }

    fn next_action(&self, t: Ms) -> Action {
        let state = self.operator.state;
        match (self.flaw, state, state.next(ms(t), self.timing)) {
            (Flaw::NoFenceWait, Switch::Fenced { .. }, Action::WaitUntil(_)) => Action::CopyRest,
            (Flaw::NoSwitchWait, Switch::Switched { .. }, Action::WaitUntil(_)) => {
                Action::RevokeSource
            }
            (_, _, action) => action,
        }
    }

    /// One object of the last copy per tick; true once all are copied.
    fn copy_one(&mut self, t: Ms) -> bool {
        let left = self
            .operator
            .copying
            .get_or_insert_with(|| (0..KEYS).rev().collect());
        match left.pop() {
            Some(k) => {
                copy(&self.source, &mut self.destination, k);
                self.copied_at.insert(k, t);
                false
            }
            None => {
                self.operator.copying = None;
                true
            }
        }
    }

    fn publish(&mut self, t: Ms, bucket: Bucket, entry: Entry) {
        self.published.push(Version {
            at: t,
            bucket,
            entry,
        });
    }

    /// Whether the workloads can still reach `bucket` at `t`.
    fn reachable(&self, bucket: Bucket, t: Ms) -> bool {
        bucket == Bucket::Destination
            || self
                .operator
                .revoked_at
                .is_none_or(|r| t < r + self.plan.iam_delay)
    }
}

fn copy(from: &BTreeMap<u8, u64>, to: &mut BTreeMap<u8, u64>, k: u8) {
    match from.get(&k) {
        Some(&v) => to.insert(k, v),
        None => to.remove(&k),
    };
}

impl World {
    fn step_op(&mut self, i: usize, t: Ms) -> Result<(), String> {
        let op = self.plan.ops[i].clone();
        let sidecar = &self.sidecars[op.sidecar];
        let version = self.published[sidecar.version];
        let stale = sidecar.stale(t);
        match self.ops[i] {
            OpState::NotYet if op.at <= t => self.route(i, t, t, version, stale),
            OpState::Held { since } => self.route(i, t, since, version, stale),
            OpState::InFlight {
                bucket,
                body_done,
                commit_at,
            } => {
                let cut = rule::cut_off(name(bucket), name(version.bucket), version.entry, stale);
                if t < body_done && cut && self.flaw != Flaw::NoCutOff {
                    self.ops[i] = OpState::Over;
                } else if t >= commit_at {
                    self.ops[i] = OpState::Over;
                    self.commit(i, t, bucket)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn route(
        &mut self,
        i: usize,
        t: Ms,
        since: Ms,
        version: Version,
        stale: bool,
    ) -> Result<(), String> {
        let op = &self.plan.ops[i];
        let writes = op.kind != Kind::Read;
        let mut route = rule::route(version.entry, writes, stale);
        if self.flaw == Flaw::StaleReadsOfFenced && !writes && version.entry == Entry::Fenced {
            route = Route::Forward;
        }
        self.ops[i] = match route {
            Route::Refuse | Route::Forward if !writes || route == Route::Refuse => OpState::Over,
            Route::Hold if t >= since + HOLD_LIMIT => OpState::Over,
            Route::Hold => OpState::Held { since },
            _ => OpState::InFlight {
                bucket: version.bucket,
                body_done: t + op.body,
                commit_at: t + op.body + op.commit,
            },
        };
        if route == Route::Forward && !writes {
            return self.read(i, t, version, stale);
        }
        Ok(())
    }

    fn read(&self, i: usize, t: Ms, version: Version, stale: bool) -> Result<(), String> {
        let op = &self.plan.ops[i];
        if !self.reachable(version.bucket, t) {
            return Ok(());
        }
        let held = match version.bucket {
            Bucket::Source => &self.source,
            Bucket::Destination => &self.destination,
        };
        let (have, want) = (held.get(&op.key).copied().unwrap_or(0), self.truth[&op.key]);
        let exempt = stale && version.entry == Entry::Open;
        if have != want && !exempt {
            return Err(format!(
                "t={t}: a read of object {} through sidecar {} ({version:?}, stale {stale}) \
                 answered {have}, last committed {want}",
                op.key, op.sidecar
            ));
        }
        Ok(())
    }

    fn commit(&mut self, i: usize, t: Ms, bucket: Bucket) -> Result<(), String> {
        let op = &self.plan.ops[i];
        if !self.reachable(bucket, t) {
            return Ok(());
        }
        let copied = self.copied_at.get(&op.key).is_some_and(|&c| c < t);
        if bucket == Bucket::Source && copied {
            return Err(format!(
                "t={t}: op {i} committed object {} in the source after its last copy",
                op.key
            ));
        }
        if bucket == Bucket::Destination && !copied {
            return Err(format!(
                "t={t}: op {i} committed object {} in the destination before its last copy",
                op.key
            ));
        }
        let value = if op.kind == Kind::Delete {
            0
        } else {
            i as u64 + 1
        };
        let held = match bucket {
            Bucket::Source => &mut self.source,
            Bucket::Destination => &mut self.destination,
        };
        if value == 0 {
            held.remove(&op.key);
        } else {
            held.insert(op.key, value);
        }
        self.truth.insert(op.key, value);
        Ok(())
    }
}

fn name(bucket: Bucket) -> &'static str {
    match bucket {
        Bucket::Source => "source",
        Bucket::Destination => "destination",
    }
}

/// Searches `cases` random plans with `flaw`; the first violation, if any,
/// shrunk only when `shrink`.
fn search(flaw: Flaw, cases: u32, shrink: bool) -> Result<(), String> {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: if shrink { 4_096 } else { 0 },
        ..Config::default()
    });
    runner
        .run(&plan(), |plan| {
            World::new(plan, flaw).run().map_err(TestCaseError::fail)
        })
        .map_err(|e| e.to_string())
}

#[test]
fn the_switch_keeps_one_bucket_in_view_on_random_interleavings() {
    if let Err(e) = search(Flaw::None, 1_000, true) {
        panic!("{e}");
    }
}

#[test]
fn without_each_safeguard_the_search_finds_what_it_prevents() {
    let late = "in the source after its last copy";
    let stale = "stale false) answered";
    for (flaw, what) in [
        (Flaw::NoFenceWait, late),
        (Flaw::NoSwitchWait, stale),
        (Flaw::NoCutOff, late),
        (
            Flaw::StaleReadsOfFenced,
            "entry: Fenced }, stale true) answered",
        ),
    ] {
        let found = search(flaw, 2_000, false).expect_err("no violation found");
        let first = found.lines().next().unwrap_or_default();
        assert!(
            first.contains(what),
            "{flaw:?} found another violation: {first}"
        );
    }
}
