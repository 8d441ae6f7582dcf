//! The cloud side: bucket operations through the official
//! `google-cloud-storage` crate (`StorageControl`, gRPC `google.storage.v2`).
//!
//! Calls return facts (`Option<Bucket>` for a missing bucket) or a
//! [`GcsError`] classified by what the reconciler must do about it; the
//! reconciler decides. Every call is counted by method and result code.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use google_cloud_gax::error::rpc::Code;
use google_cloud_gax::paginator::Paginator;
use google_cloud_iam_v1::model::{GetPolicyOptions, Policy};
use google_cloud_storage::client::StorageControl;
use google_cloud_storage::model::{Bucket, Object};

use crate::metrics::Metrics;

mod notifications;
mod objects;
pub use notifications::NotificationResource;
pub use objects::{ObjectPage, RewriteCall};

/// How the operator authenticates to GCS.
#[derive(Debug, Clone)]
pub struct GcsConfig {
    /// Override of the default endpoint (`https://storage.googleapis.com`).
    pub endpoint: Option<String>,
    /// Send no credentials (for emulators and the in-repo mock).
    pub anonymous: bool,
}

/// What kind of failure a GCS call hit, i.e. what the reconciler does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcsErrorKind {
    /// The bucket or object does not exist.
    NotFound,
    /// The name is taken (by us after a lost response, or by somebody else).
    AlreadyExists,
    /// The credentials may not do this in this project or bucket.
    PermissionDenied,
    /// Quota or rate limit: back off.
    ResourceExhausted,
    /// Transient: GCS or the network is unavailable, or the call timed out.
    Unavailable,
    /// A precondition failed (metageneration changed, bucket not empty).
    FailedPrecondition,
    /// GCS refused the request as invalid.
    InvalidArgument,
    /// Anything else.
    Other,
}

/// A failed GCS call, with enough context to act on and to show a person.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot {operation} bucket {bucket}: {kind:?}: {message}")]
pub struct GcsError {
    /// What kind of failure, which decides the reaction and the status reason.
    pub kind: GcsErrorKind,
    /// The `google.storage.v2` method (`CreateBucket`, `GetBucket`, ...).
    pub operation: &'static str,
    /// The physical bucket the call was about.
    pub bucket: String,
    /// GCS's own message.
    pub message: String,
}

impl GcsError {
    fn from_gax(operation: &'static str, bucket: &str, err: &google_cloud_storage::Error) -> Self {
        let (kind, message) = match err.status() {
            Some(status) => (classify(status.code), status.message.clone()),
            None if err.is_timeout() || err.is_io() || err.is_connect() || err.is_transport() => {
                (GcsErrorKind::Unavailable, err.to_string())
            }
            None => (GcsErrorKind::Other, err.to_string()),
        };
        GcsError {
            kind,
            operation,
            bucket: bucket.to_owned(),
            message,
        }
    }

    /// Label used in metrics for this error.
    pub fn code_label(&self) -> &'static str {
        match self.kind {
            GcsErrorKind::NotFound => "NOT_FOUND",
            GcsErrorKind::AlreadyExists => "ALREADY_EXISTS",
            GcsErrorKind::PermissionDenied => "PERMISSION_DENIED",
            GcsErrorKind::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GcsErrorKind::Unavailable => "UNAVAILABLE",
            GcsErrorKind::FailedPrecondition => "FAILED_PRECONDITION",
            GcsErrorKind::InvalidArgument => "INVALID_ARGUMENT",
            GcsErrorKind::Other => "OTHER",
        }
    }
}

fn classify(code: Code) -> GcsErrorKind {
    match code {
        Code::NotFound => GcsErrorKind::NotFound,
        Code::AlreadyExists => GcsErrorKind::AlreadyExists,
        Code::PermissionDenied | Code::Unauthenticated => GcsErrorKind::PermissionDenied,
        Code::ResourceExhausted => GcsErrorKind::ResourceExhausted,
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Internal => {
            GcsErrorKind::Unavailable
        }
        Code::FailedPrecondition => GcsErrorKind::FailedPrecondition,
        Code::InvalidArgument | Code::OutOfRange => GcsErrorKind::InvalidArgument,
        _ => GcsErrorKind::Other,
    }
}

/// The gRPC resource name of a bucket.
pub fn bucket_resource(bucket: &str) -> String {
    format!("projects/_/buckets/{bucket}")
}

/// Bucket operations used by the operator.
#[derive(Clone, Debug)]
pub struct GcsClient {
    control: StorageControl,
    json: notifications::JsonApi,
    metrics: Arc<Metrics>,
}

type GcsResult<T> = std::result::Result<T, GcsError>;

impl GcsClient {
    /// Connects with Application Default Credentials, or anonymously.
    pub async fn connect(config: &GcsConfig, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let mut builder = StorageControl::builder()
            // The controller owns retries (requeue with backoff), so a slow or
            // failing call never pins a worker in a client-side retry loop.
            .with_retry_policy(google_cloud_gax::retry_policy::NeverRetry);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        let credentials = if config.anonymous {
            google_cloud_auth::credentials::anonymous::Builder::new().build()
        } else {
            google_cloud_auth::credentials::Builder::default()
                .build()
                .map_err(|e| anyhow::anyhow!("cannot load Application Default Credentials: {e}"))?
        };
        builder = builder.with_credentials(credentials.clone());
        let control = builder.build().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot build the GCS client (endpoint {}): {e}",
                config.endpoint.as_deref().unwrap_or("default")
            )
        })?;
        let json = notifications::JsonApi::new(config.endpoint.as_deref(), credentials)?;
        Ok(GcsClient {
            control,
            json,
            metrics,
        })
    }

    fn record<T>(
        &self,
        method: &'static str,
        bucket: &str,
        started: Instant,
        result: std::result::Result<T, google_cloud_storage::Error>,
    ) -> GcsResult<T> {
        let result = result.map_err(|e| GcsError::from_gax(method, bucket, &e));
        self.observe(method, started, result)
    }

    /// Counts a finished call of either API by method and result code.
    fn observe<T>(
        &self,
        method: &'static str,
        started: Instant,
        result: GcsResult<T>,
    ) -> GcsResult<T> {
        let code = match &result {
            Ok(_) => "OK",
            Err(e) => e.code_label(),
        };
        self.metrics
            .observe_gcs_call(method, code, started.elapsed());
        result
    }

    /// The bucket, or `None` when it does not exist.
    pub async fn get_bucket(&self, bucket: &str) -> GcsResult<Option<Bucket>> {
        let started = Instant::now();
        let result = self
            .control
            .get_bucket()
            .set_name(bucket_resource(bucket))
            .send()
            .await;
        match self.record("GetBucket", bucket, started, result) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind == GcsErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether bucket `bucket` lives in project `project` (a project id or
    /// number). GCS reports a bucket's project as a number, which a project
    /// id cannot be compared with; listing the project's buckets by the
    /// name as a prefix answers for either.
    pub async fn bucket_in_project(&self, project: &str, bucket: &str) -> GcsResult<bool> {
        let started = Instant::now();
        let result = self
            .control
            .list_buckets()
            .set_parent(format!("projects/{project}"))
            .set_prefix(bucket)
            .set_page_size(10)
            .send()
            .await;
        let page = self.record("ListBuckets", bucket, started, result)?;
        Ok(page
            .buckets
            .iter()
            .any(|b| b.bucket_id == bucket || b.name == bucket_resource(bucket)))
    }

    /// Creates `bucket` in `project`; `object_retention` enables Object
    /// Retention Lock, which only a create can do.
    pub async fn create_bucket(
        &self,
        project: &str,
        bucket: &str,
        desired: Bucket,
        object_retention: bool,
    ) -> GcsResult<Bucket> {
        let started = Instant::now();
        let result = self
            .control
            .create_bucket()
            .set_parent(format!("projects/{project}"))
            .set_bucket_id(bucket)
            .set_bucket(desired)
            .set_enable_object_retention(object_retention)
            .send()
            .await;
        self.record("CreateBucket", bucket, started, result)
    }

    /// Updates the fields in `mask` if the bucket is still at `metageneration`.
    pub async fn update_bucket(
        &self,
        bucket: &str,
        patch: Bucket,
        mask: &[&str],
        metageneration: i64,
    ) -> GcsResult<Bucket> {
        let started = Instant::now();
        let result = self
            .control
            .update_bucket()
            .set_bucket(patch.set_name(bucket_resource(bucket)))
            .set_update_mask(google_cloud_wkt::FieldMask::default().set_paths(mask.iter().copied()))
            .set_if_metageneration_match(metageneration)
            .send()
            .await;
        self.record("UpdateBucket", bucket, started, result)
    }

    /// Locks the bucket's retention policy, if the bucket is still at
    /// `metageneration`. Irreversible.
    pub async fn lock_retention_policy(
        &self,
        bucket: &str,
        metageneration: i64,
    ) -> GcsResult<Bucket> {
        let started = Instant::now();
        let result = self
            .control
            .lock_bucket_retention_policy()
            .set_bucket(bucket_resource(bucket))
            .set_if_metageneration_match(metageneration)
            .send()
            .await;
        self.record("LockBucketRetentionPolicy", bucket, started, result)
    }

    /// Deletes an (empty) bucket.
    pub async fn delete_bucket(&self, bucket: &str) -> GcsResult<()> {
        let started = Instant::now();
        let result = self
            .control
            .delete_bucket()
            .set_name(bucket_resource(bucket))
            .send()
            .await;
        self.record("DeleteBucket", bucket, started, result)
    }

    /// Up to `limit` objects, every version when `versions` is set.
    pub async fn list_objects(
        &self,
        bucket: &str,
        versions: bool,
        limit: usize,
    ) -> GcsResult<Vec<Object>> {
        let mut pages = self
            .control
            .list_objects()
            .set_parent(bucket_resource(bucket))
            .set_versions(versions)
            .set_page_size(i32::try_from(limit.min(1000)).unwrap_or(1000))
            .by_page();
        let mut out = Vec::new();
        while out.len() < limit {
            let started = Instant::now();
            let Some(page) = pages.next().await else {
                break;
            };
            let page = self.record("ListObjects", bucket, started, page)?;
            out.extend(page.objects);
        }
        out.truncate(limit);
        Ok(out)
    }

    /// Deletes one object generation; a missing one is fine.
    pub async fn delete_object(
        &self,
        bucket: &str,
        object: &str,
        generation: i64,
    ) -> GcsResult<()> {
        let started = Instant::now();
        let result = self
            .control
            .delete_object()
            .set_bucket(bucket_resource(bucket))
            .set_object(object)
            .set_generation(generation)
            .send()
            .await;
        match self.record("DeleteObject", bucket, started, result) {
            Err(e) if e.kind != GcsErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// What emptying a bucket did: objects under retention are left in place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Emptied {
    /// Object versions deleted.
    pub deleted: usize,
    /// Object versions left because their retention has not expired.
    pub retained: usize,
    /// When the last of them may go (seconds since the epoch).
    pub retained_until: Option<i64>,
    /// Object versions left because they are on hold (temporary or
    /// event-based): they go when someone releases the hold.
    pub held: usize,
}

/// Whether `object` is on hold: GCS refuses to delete it until the hold
/// is released, whatever its age.
pub fn on_hold(object: &Object) -> bool {
    object.temporary_hold || object.event_based_hold == Some(true)
}

/// When `object` may be deleted (seconds since the epoch), if that is
/// after `now`: its bucket's retention policy (`retention_expire_time`) or
/// its own retention, whichever ends later. `None`: deletable now.
pub fn retained_until(object: &Object, now: i64) -> Option<i64> {
    let own = object
        .retention
        .as_ref()
        .and_then(|r| r.retain_until_time.as_ref());
    [object.retention_expire_time.as_ref(), own]
        .into_iter()
        .flatten()
        .map(|t| t.seconds())
        .filter(|&t| t > now)
        .max()
}

impl GcsClient {
    /// Deletes every object version of `bucket` whose retention has
    /// expired (all of them when none has any) and that is on no hold, a
    /// page at a time with a few deletions in flight, and counts those it
    /// must leave: they would be refused (PERMISSION_DENIED) until their
    /// retention expires or their hold is released.
    pub async fn delete_unretained_objects(&self, bucket: &str) -> GcsResult<Emptied> {
        use futures::{StreamExt, TryStreamExt};
        let now = unix_now();
        let mut pages = self
            .control
            .list_objects()
            .set_parent(bucket_resource(bucket))
            .set_versions(true)
            .set_page_size(1000)
            .by_page();
        let mut emptied = Emptied::default();
        loop {
            let started = Instant::now();
            let Some(page) = pages.next().await else {
                return Ok(emptied);
            };
            let page = self.record("ListObjects", bucket, started, page)?;
            let (held, rest): (Vec<Object>, Vec<Object>) =
                page.objects.into_iter().partition(on_hold);
            emptied.held += held.len();
            let (kept, gone): (Vec<Object>, Vec<Object>) = rest
                .into_iter()
                .partition(|o| retained_until(o, now).is_some());
            let until = kept.iter().filter_map(|o| retained_until(o, now)).max();
            emptied.retained += kept.len();
            emptied.retained_until = emptied.retained_until.max(until);
            emptied.deleted += gone.len();
            futures::stream::iter(gone)
                .map(|o| async move { self.delete_object(bucket, &o.name, o.generation).await })
                .buffer_unordered(16)
                .try_collect::<Vec<()>>()
                .await?;
        }
    }
}

/// Seconds since the epoch.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The outcome of a conditional IAM policy write.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyWrite {
    /// The policy was written; GCS's copy, with its new etag.
    Written(Policy),
    /// The policy changed since it was read (etag mismatch): read it again.
    Stale,
}

impl GcsClient {
    /// The bucket's IAM policy at version 3 (with conditional bindings), or
    /// `None` when the bucket does not exist.
    pub async fn get_iam_policy(&self, bucket: &str) -> GcsResult<Option<Policy>> {
        let started = Instant::now();
        let options =
            GetPolicyOptions::new().set_requested_policy_version(crate::iam::POLICY_VERSION);
        let result = self
            .control
            .get_iam_policy()
            .set_resource(bucket_resource(bucket))
            .set_options(options)
            .send()
            .await;
        match self.record("GetIamPolicy", bucket, started, result) {
            Ok(p) => Ok(Some(p)),
            Err(e) if e.kind == GcsErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `policy` if the bucket's policy still has `policy`'s etag.
    pub async fn set_iam_policy(&self, bucket: &str, policy: Policy) -> GcsResult<PolicyWrite> {
        let started = Instant::now();
        let result = self
            .control
            .set_iam_policy()
            .set_resource(bucket_resource(bucket))
            .set_policy(policy)
            .send()
            .await;
        // IAM answers ABORTED to a stale etag, GCS's JSON API 412: both mean
        // somebody else wrote first.
        let stale = matches!(
            result
                .as_ref()
                .err()
                .and_then(|e| e.status())
                .map(|s| s.code),
            Some(Code::Aborted | Code::FailedPrecondition)
        );
        match self.record("SetIamPolicy", bucket, started, result) {
            Ok(p) => Ok(PolicyWrite::Written(p)),
            Err(_) if stale => Ok(PolicyWrite::Stale),
            Err(e) => Err(e),
        }
    }

    /// Whether the operator holds `permission` on the bucket (IAM's
    /// TestIamPermissions, which needs no permission itself).
    pub async fn has_permission(&self, bucket: &str, permission: &str) -> GcsResult<bool> {
        let started = Instant::now();
        let result = self
            .control
            .test_iam_permissions()
            .set_resource(bucket_resource(bucket))
            .set_permissions([permission])
            .send()
            .await;
        let granted = self.record("TestIamPermissions", bucket, started, result)?;
        Ok(granted.permissions.iter().any(|p| p == permission))
    }
}

/// Paces bucket creation and deletion per project: GCS allows about one
/// such operation every two seconds per project and answers 429 beyond it.
///
/// Operations of one project run one at a time, each starting at least
/// `interval` after the previous one *finished*: the previous request has
/// reached GCS by then, so no scheduling delay on this side can squeeze two
/// of them closer together than the limit.
#[derive(Debug, Default)]
pub struct Pacer {
    interval: Option<Duration>,
    projects:
        std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<tokio::time::Instant>>>>>,
}

impl Pacer {
    /// One operation per `interval` per project; `None` or zero disables pacing.
    pub fn new(interval: Option<Duration>) -> Self {
        Pacer {
            interval: interval.filter(|i| !i.is_zero()),
            projects: Default::default(),
        }
    }

    /// Whether an operation of `project` could start now without waiting
    /// (a hint: another task may take the turn first).
    pub fn is_free(&self, project: &str) -> bool {
        let Some(interval) = self.interval else {
            return true;
        };
        let slot = {
            let projects = self.projects.lock().unwrap_or_else(|p| p.into_inner());
            projects.get(project).cloned()
        };
        let Some(slot) = slot else {
            return true;
        };
        slot.try_lock()
            .is_ok_and(|last| last.is_none_or(|finished| finished.elapsed() >= interval))
    }

    /// Runs `operation` (a bucket create or delete in `project`) in its turn.
    pub async fn run<T>(&self, project: &str, operation: impl Future<Output = T>) -> T {
        let Some(interval) = self.interval else {
            return operation.await;
        };
        let slot = {
            // A poisoned map only holds timestamps: keep using it.
            let mut projects = self.projects.lock().unwrap_or_else(|p| p.into_inner());
            projects.entry(project.to_owned()).or_default().clone()
        };
        // FIFO: waiters of one project go in the order they arrived.
        let mut last = slot.lock().await;
        if let Some(finished) = *last {
            tokio::time::sleep_until(finished + interval).await;
        }
        let out = operation.await;
        *last = Some(tokio::time::Instant::now());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_project_is_busy_while_an_operation_runs_and_for_the_interval_after() {
        let pacer = Pacer::new(Some(Duration::from_secs(2)));
        assert!(pacer.is_free("p"), "an unseen project is free");
        let (started, wait_started) = tokio::sync::oneshot::channel::<()>();
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let op = pacer.run("p", async move {
            let _ = started.send(());
            let _ = finished.await;
        });
        let probe = async {
            let _ = wait_started.await;
            assert!(!pacer.is_free("p"), "busy while an operation runs");
            assert!(pacer.is_free("q"), "other projects are not affected");
            let _ = finish.send(());
        };
        tokio::join!(op, probe);
        assert!(!pacer.is_free("p"), "busy for the interval after");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(pacer.is_free("p"), "free once the interval passed");
        assert!(Pacer::new(None).is_free("p"), "no pacing: always free");
    }
}
