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

    /// The first fault matching `target` in the given phase, used up once.
    pub(crate) fn take_fault(&mut self, target: &Target, after_write: bool) -> Option<Status> {
        let fault = self
            .faults
            .iter_mut()
            .find(|f| f.matches(target, after_write))?;
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

    /// How long `method` should take.
    pub(crate) fn latency_for(&self, method: &str) -> Duration {
        self.latency
            .get(&Some(method.to_string()))
            .or_else(|| self.latency.get(&None))
            .copied()
            .unwrap_or_default()
    }
}
