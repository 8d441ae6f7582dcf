//! What tests control around the RPCs: the call log, injected faults,
//! artificial latency and the per-project bucket create/delete quota.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use tonic::{Code, Status};

use super::state::Target;

/// One RPC the mock answered, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// gRPC method name, e.g. `"CreateBucket"`.
    pub method: String,
    /// Plain project id: the one the request names, else the owner of the
    /// bucket it targets (if that bucket existed when the call arrived).
    pub project: Option<String>,
    /// Plain bucket id the request targets, if any.
    pub bucket: Option<String>,
    /// The final status code; [`Code::Ok`] for success, [`Code::Cancelled`]
    /// for a streaming call the client abandoned.
    pub code: Code,
    /// Arrival number of the call, unique within the process (0 for calls
    /// that did not arrive over the network).
    pub id: u64,
    /// The ASCII request metadata by lowercase name, e.g.
    /// `x-goog-request-params`, `authorization`, `grpc-timeout`,
    /// `user-agent` (HTTP/2 and gRPC framing headers left out; repeated
    /// headers joined with `, `).
    pub metadata: BTreeMap<String, String>,
    /// Whether the client cancelled the call (reset the stream, or dropped
    /// it before the answer) before the mock answered it completely.
    pub cancelled: bool,
}

impl Call {
    /// The metadata value `name` (lowercase) the call carried.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.metadata.get(name).map(String::as_str)
    }
}

/// An error the mock returns instead of (or after) doing the real work.
///
/// A fault matches a call when every filter that is set (`method`,
/// `project`, `bucket`) equals the call's. Faults are checked in the order
/// they were added; the first match wins and uses up one of its `times`.
///
/// ```
/// use bucketmap_testkit::mock_gcs::Fault;
/// use tonic::Code;
/// // The next CreateBucket in acme-prod creates the bucket, but the client
/// // sees UNAVAILABLE (a lost response).
/// let fault = Fault::new("CreateBucket", Code::Unavailable)
///     .project("acme-prod")
///     .times(1)
///     .after_write();
/// assert!(fault.after_write);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// gRPC method name (`"CreateBucket"`); `None` matches every method.
    pub method: Option<String>,
    /// Plain project id; `None` matches every project.
    pub project: Option<String>,
    /// Plain bucket id; `None` matches every bucket.
    pub bucket: Option<String>,
    /// The code to answer with.
    pub code: Code,
    /// The message to answer with.
    pub message: String,
    /// How many calls the fault applies to; `None` means forever.
    pub times: Option<usize>,
    /// Perform the call's real work first, then answer `code`: the client
    /// sees a failure although the change happened (a lost response).
    pub after_write: bool,
}

impl Fault {
    /// A fault answering `code` to every call of `method` (e.g.
    /// `"GetBucket"`), forever, before doing any work.
    pub fn new(method: impl Into<String>, code: Code) -> Self {
        Self {
            method: Some(method.into()),
            ..Self::any_method(code)
        }
    }

    /// A fault answering `code` to calls of every method.
    pub fn any_method(code: Code) -> Self {
        Self {
            method: None,
            project: None,
            bucket: None,
            code,
            message: format!("mock GCS injected fault: {}", code.description()),
            times: None,
            after_write: false,
        }
    }

    /// Restricts the fault to calls about plain project id `project`.
    pub fn project(mut self, project: impl Into<String>) -> Self {
        self.project = Some(project.into());
        self
    }

    /// Restricts the fault to calls about plain bucket id `bucket`.
    pub fn bucket(mut self, bucket: impl Into<String>) -> Self {
        self.bucket = Some(bucket.into());
        self
    }

    /// Applies the fault to the next `times` matching calls only.
    pub fn times(mut self, times: usize) -> Self {
        self.times = Some(times);
        self
    }

    /// Performs the call's work before answering the fault's code.
    pub fn after_write(mut self) -> Self {
        self.after_write = true;
        self
    }

    /// Sets the message the client sees.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    fn matches(&self, target: &Target, after_write: bool) -> bool {
        fn filter(want: Option<&String>, got: Option<&String>) -> bool {
            want.is_none_or(|w| got == Some(w))
        }
        self.after_write == after_write
            && self.times != Some(0)
            && self.method.as_deref().is_none_or(|m| m == target.method)
            && filter(self.project.as_ref(), target.project.as_ref())
            && filter(self.bucket.as_ref(), target.bucket.as_ref())
    }
}

/// Test-controlled behaviour shared by all RPCs.
#[derive(Debug, Default)]
pub(crate) struct Controls {
    pub(crate) calls: Vec<Call>,
    pub(crate) faults: Vec<Fault>,
    /// Latency per method name; the `None` entry applies to all others.
    pub(crate) latency: HashMap<Option<String>, Duration>,
    /// Minimum interval between bucket creates/deletes in one project.
    pub(crate) bucket_rate_limit: Option<Duration>,
    /// When each project last created or deleted a bucket.
    last_bucket_mutation: HashMap<String, Instant>,
    pub(crate) quota_errors: usize,
    /// Calls the client cancelled before they were logged, by arrival number.
    cancelled_unlogged: HashSet<u64>,
    /// Seeded random faults and latency, when on.
    pub(crate) random: Option<RandomState>,
}

impl Controls {
    /// Appends `call` to the log, marked cancelled if its client already
    /// gave up on it.
    pub(crate) fn log(&mut self, mut call: Call) {
        if call.id != 0 && self.cancelled_unlogged.remove(&call.id) {
            call.cancelled = true;
        }
        self.calls.push(call);
    }

    /// Records that the client of call `id` gave up on it: marks its log
    /// entry, or the entry it will get.
    pub(crate) fn mark_cancelled(&mut self, id: u64) {
        if id == 0 {
            return;
        }
        match self.calls.iter_mut().rev().find(|c| c.id == id) {
            Some(call) => call.cancelled = true,
            None => {
                self.cancelled_unlogged.insert(id);
            }
        }
    }

    /// The first fault matching `target` in the given phase, used up once;
    /// else, in random mode, maybe a random one.
    pub(crate) fn take_fault(&mut self, target: &Target, after_write: bool) -> Option<Status> {
        let Some(fault) = self
            .faults
            .iter_mut()
            .find(|f| f.matches(target, after_write))
        else {
            return self
                .random
                .as_mut()
                .and_then(|r| r.roll(target.method, after_write));
        };
        if let Some(times) = fault.times.as_mut() {
            *times -= 1;
        }
        let status = Status::new(fault.code, fault.message.clone());
        self.faults.retain(|f| f.times != Some(0));
        Some(status)
    }

    /// RESOURCE_EXHAUSTED when `target` creates or deletes a bucket in a
    /// project sooner than the rate limit allows; otherwise records it.
    pub(crate) fn check_bucket_quota(&mut self, target: &Target) -> Result<(), Status> {
        let (Some(interval), Some(project)) = (self.bucket_rate_limit, target.project.as_ref())
        else {
            return Ok(());
        };
        if !matches!(target.method, "CreateBucket" | "DeleteBucket") {
            return Ok(());
        }
        let now = Instant::now();
        if let Some(last) = self.last_bucket_mutation.get(project)
            && now.duration_since(*last) < interval
        {
            self.quota_errors += 1;
            return Err(Status::resource_exhausted(format!(
                "rateLimitExceeded: the project {project} exceeded the rate limit for creating \
                 and deleting buckets (one per {interval:?})"
            )));
        }
        self.last_bucket_mutation.insert(project.clone(), now);
        Ok(())
    }

    /// How long `method` should take: its configured latency, plus a random
    /// one in random mode.
    pub(crate) fn latency_for(&mut self, method: &str) -> Duration {
        let configured = self
            .latency
            .get(&Some(method.to_string()))
            .or_else(|| self.latency.get(&None))
            .copied()
            .unwrap_or_default();
        let random = self.random.as_mut().map(RandomState::latency);
        configured + random.unwrap_or_default()
    }
}

/// Seeded random faults: each call draws its fate from a generator seeded
/// once, so a run with the same seed and the same call order injects the
/// same faults (concurrent clients make the order vary; the counts stay
/// comparable).
///
/// Before its work a call fails with `UNAVAILABLE`, `RESOURCE_EXHAUSTED` or
/// `DEADLINE_EXCEEDED` with the given probabilities (checked in that order);
/// a call that changes state (any method but `Get*`, `List*`, `Read*`,
/// `BidiRead*`, `QueryWriteStatus`) that did its work loses its answer
/// (`UNAVAILABLE` after the change) with probability `lost_response`. Every
/// call waits a latency drawn uniformly from `latency`. Explicit
/// [`Fault`]s are matched first.
///
/// ```
/// use std::time::Duration;
/// use bucketmap_testkit::mock_gcs::RandomFaults;
/// let chaos = RandomFaults::new(42)
///     .unavailable(0.05)
///     .lost_response(0.02)
///     .latency(Duration::ZERO..=Duration::from_millis(50));
/// assert_eq!(chaos.seed, 42);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RandomFaults {
    /// Seed of the generator.
    pub seed: u64,
    /// Probability (0..=1) of `UNAVAILABLE` before the work.
    pub unavailable: f64,
    /// Probability of `RESOURCE_EXHAUSTED` before the work.
    pub resource_exhausted: f64,
    /// Probability of `DEADLINE_EXCEEDED` before the work.
    pub deadline_exceeded: f64,
    /// Probability that a state-changing call does its work and then
    /// answers `UNAVAILABLE` (a lost response).
    pub lost_response: f64,
    /// Range of the latency added to every call.
    pub latency: std::ops::RangeInclusive<Duration>,
}

impl RandomFaults {
    /// No faults and no latency yet, with generator seed `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            unavailable: 0.0,
            resource_exhausted: 0.0,
            deadline_exceeded: 0.0,
            lost_response: 0.0,
            latency: Duration::ZERO..=Duration::ZERO,
        }
    }

    /// Sets the probability of `UNAVAILABLE` before the work.
    pub fn unavailable(mut self, p: f64) -> Self {
        self.unavailable = p;
        self
    }

    /// Sets the probability of `RESOURCE_EXHAUSTED` before the work.
    pub fn resource_exhausted(mut self, p: f64) -> Self {
        self.resource_exhausted = p;
        self
    }

    /// Sets the probability of `DEADLINE_EXCEEDED` before the work.
    pub fn deadline_exceeded(mut self, p: f64) -> Self {
        self.deadline_exceeded = p;
        self
    }

    /// Sets the probability of a lost response after a change.
    pub fn lost_response(mut self, p: f64) -> Self {
        self.lost_response = p;
        self
    }

    /// Sets the range of the latency added to every call.
    pub fn latency(mut self, range: std::ops::RangeInclusive<Duration>) -> Self {
        self.latency = range;
        self
    }
}

/// How many faults random mode injected, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// `UNAVAILABLE` before the work.
    pub unavailable: u64,
    /// `RESOURCE_EXHAUSTED` before the work.
    pub resource_exhausted: u64,
    /// `DEADLINE_EXCEEDED` before the work.
    pub deadline_exceeded: u64,
    /// Changes made whose answer was replaced by `UNAVAILABLE`.
    pub lost_responses: u64,
    /// Calls given a non-zero random latency.
    pub delayed: u64,
}

impl FaultCounts {
    /// Every injected error (latency not counted).
    pub fn errors(&self) -> u64 {
        self.unavailable + self.resource_exhausted + self.deadline_exceeded + self.lost_responses
    }
}

/// Random mode running: its settings, generator and counts.
#[derive(Debug)]
pub(crate) struct RandomState {
    settings: RandomFaults,
    rng: fastrand::Rng,
    pub(crate) counts: FaultCounts,
}

impl RandomState {
    pub(crate) fn new(settings: RandomFaults) -> Self {
        Self {
            rng: fastrand::Rng::with_seed(settings.seed),
            settings,
            counts: FaultCounts::default(),
        }
    }

    /// The random fault of one call of `method` in the given phase, counted.
    fn roll(&mut self, method: &str, after_write: bool) -> Option<Status> {
        let s = &self.settings;
        let (code, counter) = if after_write {
            if !changes_state(method) || !chance(&mut self.rng, s.lost_response) {
                return None;
            }
            (Code::Unavailable, &mut self.counts.lost_responses)
        } else {
            let kinds = [
                (s.unavailable, Code::Unavailable),
                (s.resource_exhausted, Code::ResourceExhausted),
                (s.deadline_exceeded, Code::DeadlineExceeded),
            ];
            let code = kinds
                .into_iter()
                .find_map(|(p, code)| chance(&mut self.rng, p).then_some(code))?;
            let counter = match code {
                Code::Unavailable => &mut self.counts.unavailable,
                Code::ResourceExhausted => &mut self.counts.resource_exhausted,
                _ => &mut self.counts.deadline_exceeded,
            };
            (code, counter)
        };
        *counter += 1;
        let phase = if after_write { " after the change" } else { "" };
        Some(Status::new(
            code,
            format!("mock GCS random fault{phase}: {}", code.description()),
        ))
    }

    /// A latency drawn from the configured range, counted when non-zero.
    fn latency(&mut self) -> Duration {
        let (low, high) = (*self.settings.latency.start(), *self.settings.latency.end());
        if high <= low {
            return low;
        }
        let latency = low + (high - low).mul_f64(self.rng.f64());
        if !latency.is_zero() {
            self.counts.delayed += 1;
        }
        latency
    }
}

/// True with probability `p`.
fn chance(rng: &mut fastrand::Rng, p: f64) -> bool {
    p > 0.0 && rng.f64() < p
}

/// Whether a call of `method` may change state (and so lose its answer).
fn changes_state(method: &str) -> bool {
    !["Get", "List", "Read", "BidiRead", "QueryWriteStatus"]
        .iter()
        .any(|prefix| method.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: &'static str) -> Target {
        Target {
            method,
            project: Some("p".into()),
            bucket: Some("b".into()),
        }
    }

    fn draw(settings: RandomFaults, calls: usize) -> (Vec<Option<Code>>, FaultCounts) {
        let mut controls = Controls {
            random: Some(RandomState::new(settings)),
            ..Controls::default()
        };
        let mut codes = Vec::new();
        for _ in 0..calls {
            let before = controls.take_fault(&target("CreateBucket"), false);
            let after = before
                .is_none()
                .then(|| controls.take_fault(&target("CreateBucket"), true))
                .flatten();
            codes.push(before.or(after).map(|s| s.code()));
        }
        let counts = controls.random.map(|r| r.counts).unwrap_or_default();
        (codes, counts)
    }

    fn chaos(seed: u64) -> RandomFaults {
        RandomFaults::new(seed)
            .unavailable(0.1)
            .resource_exhausted(0.1)
            .deadline_exceeded(0.1)
            .lost_response(0.1)
    }

    #[test]
    fn random_faults_repeat_with_the_seed_and_are_counted_per_kind() {
        let (first, counts) = draw(chaos(7), 10_000);
        let (again, _) = draw(chaos(7), 10_000);
        let (other, _) = draw(chaos(8), 10_000);
        assert_eq!(first, again, "the same seed injects the same faults");
        assert_ne!(first, other, "another seed injects others");
        let seen = |code| first.iter().filter(|c| **c == Some(code)).count() as u64;
        assert_eq!(
            counts.unavailable + counts.lost_responses,
            seen(Code::Unavailable)
        );
        assert_eq!(counts.resource_exhausted, seen(Code::ResourceExhausted));
        assert_eq!(counts.deadline_exceeded, seen(Code::DeadlineExceeded));
        // 10 % of the calls, then 10 % of the rest, ...: about 1000, 900, 810, 729.
        for (kind, n, expected) in [
            ("unavailable", counts.unavailable, 1000),
            ("resource exhausted", counts.resource_exhausted, 900),
            ("deadline exceeded", counts.deadline_exceeded, 810),
            ("lost responses", counts.lost_responses, 729),
        ] {
            assert!(
                n.abs_diff(expected) < 150,
                "{kind}: {n}, expected about {expected}"
            );
        }
        assert_eq!(
            counts.errors(),
            first.iter().filter(|c| c.is_some()).count() as u64
        );
    }

    #[test]
    fn reads_never_lose_their_answer_and_explicit_faults_come_first() {
        let mut controls = Controls {
            random: Some(RandomState::new(RandomFaults::new(1).lost_response(1.0))),
            ..Controls::default()
        };
        assert!(controls.take_fault(&target("GetBucket"), true).is_none());
        assert!(controls.take_fault(&target("ListObjects"), true).is_none());
        let lost = controls.take_fault(&target("DeleteBucket"), true);
        assert_eq!(lost.map(|s| s.code()), Some(Code::Unavailable));
        controls.faults.push(
            Fault::new("DeleteBucket", Code::NotFound)
                .after_write()
                .times(1),
        );
        let explicit = controls.take_fault(&target("DeleteBucket"), true);
        assert_eq!(explicit.map(|s| s.code()), Some(Code::NotFound));
        let counts = controls.random.map(|r| r.counts).unwrap_or_default();
        assert_eq!(
            counts.lost_responses, 1,
            "the explicit fault is not counted"
        );
    }

    #[test]
    fn random_latency_stays_in_its_range_and_adds_to_the_configured_one() {
        let range = Duration::from_millis(10)..=Duration::from_millis(20);
        let mut controls = Controls {
            random: Some(RandomState::new(RandomFaults::new(3).latency(range))),
            ..Controls::default()
        };
        controls.latency.insert(None, Duration::from_millis(100));
        for _ in 0..1_000 {
            let latency = controls.latency_for("GetBucket");
            assert!(
                (Duration::from_millis(110)..=Duration::from_millis(120)).contains(&latency),
                "{latency:?}"
            );
        }
        let counts = controls.random.map(|r| r.counts).unwrap_or_default();
        assert_eq!(counts.delayed, 1_000);
        let mut none = Controls::default();
        assert_eq!(none.latency_for("GetBucket"), Duration::ZERO);
    }
}
