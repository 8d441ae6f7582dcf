//! The mock's in-memory world: buckets, objects, and the bookkeeping that
//! wraps every RPC (call log, faults, quota). The RPC semantics themselves
//! live in `buckets.rs` and `objects.rs`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost_types::Timestamp;
use tonic::{Code, Status};

use super::content::Content;
use super::context::CallContext;
use super::faults::{Call, Controls};
use super::objects_grpc::Upload;
use super::proto;

/// Resource name prefix of every bucket: GCS bucket ids are global, so the
/// project segment is always the `_` wildcard.
pub(crate) const BUCKET_NAME_PREFIX: &str = "projects/_/buckets/";

/// Who and what one RPC is about, for the call log and fault matching.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) method: &'static str,
    /// Plain project id (`acme-staging`), when the request names one or the
    /// bucket it targets exists.
    pub(crate) project: Option<String>,
    /// Plain bucket id (`photos-k3x9q2mw`).
    pub(crate) bucket: Option<String>,
}

/// All mock state; one instance sits behind the `MockHandle` mutex.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Buckets by id.
    pub(crate) buckets: BTreeMap<String, proto::Bucket>,
    /// Every generation (live and noncurrent) of every object, by bucket id.
    pub(crate) objects: BTreeMap<String, Vec<proto::Object>>,
    /// Last object generation handed out (generations are microsecond
    /// timestamps, strictly increasing, like in GCS).
    last_generation: i64,
    /// The data of every object generation, by generation (generations are
    /// unique across buckets).
    pub(crate) contents: HashMap<i64, Content>,
    /// Writes in progress (resumable uploads and write streams), by upload id.
    pub(crate) uploads: HashMap<String, Upload>,
    /// Last upload id number handed out.
    pub(crate) last_upload: u64,
    /// Rewrites that answered with a rewrite token (`rewrite.rs`).
    pub(crate) rewrites: super::rewrite::Rewrites,
    pub(crate) controls: Controls,
    /// Buckets' IAM policies (`iam.rs`).
    pub(crate) iam: super::iam::Policies,
    /// Buckets' notification configurations (`notifications.rs`).
    pub(crate) notifications: super::notifications::Notifications,
}

impl State {
    /// Runs one RPC: applies injected faults and the bucket quota around
    /// `op`, then logs the call with its final code.
    pub(crate) fn execute<T>(
        &mut self,
        mut target: Target,
        op: impl FnOnce(&mut State) -> Result<T, Status>,
    ) -> Result<T, Status> {
        if target.project.is_none() {
            target.project = target
                .bucket
                .as_deref()
                .and_then(|id| self.bucket_project(id));
        }
        let result = self.run_guarded(&target, op);
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        self.log_call(target, code, false);
        result
    }

    /// Logs a call of the current [`CallContext`] about `target` that ended
    /// with `code`.
    pub(crate) fn log_call(&mut self, mut target: Target, code: Code, cancelled: bool) {
        if target.project.is_none() {
            target.project = target
                .bucket
                .as_deref()
                .and_then(|id| self.bucket_project(id));
        }
        let context = CallContext::current();
        self.controls.log(Call {
            method: target.method.to_string(),
            project: target.project,
            bucket: target.bucket,
            code,
            id: context.id,
            metadata: context.metadata,
            cancelled,
        });
    }

    /// Applies the faults and quota matching `target` around `op` (no
    /// logging: streaming calls log when their stream ends).
    pub(crate) fn run_guarded<T>(
        &mut self,
        target: &Target,
        op: impl FnOnce(&mut State) -> Result<T, Status>,
    ) -> Result<T, Status> {
        if let Some(status) = self.controls.take_fault(target, false) {
            return Err(status);
        }
        self.controls.check_bucket_quota(target)?;
        let result = op(self);
        match self.controls.take_fault(target, true) {
            Some(status) => Err(status),
            None => result,
        }
    }

    /// The plain project id owning bucket `id`.
    pub(crate) fn bucket_project(&self, id: &str) -> Option<String> {
        self.buckets.get(id).map(|b| plain_project(&b.project))
    }

    /// The bucket `id`, or NOT_FOUND naming it.
    pub(crate) fn existing_bucket(&self, id: &str) -> Result<&proto::Bucket, Status> {
        self.buckets.get(id).ok_or_else(|| bucket_not_found(id))
    }

    /// Stores `bucket` (normalized like a created one) under `project`,
    /// replacing any bucket with the same id.
    pub(crate) fn insert_bucket(
        &mut self,
        project: &str,
        bucket: proto::Bucket,
    ) -> anyhow::Result<proto::Bucket> {
        let id = if bucket.bucket_id.is_empty() {
            bucket
                .name
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string()
        } else {
            bucket.bucket_id.clone()
        };
        anyhow::ensure!(
            !id.is_empty(),
            "cannot insert a bucket in project {project}: neither bucket_id nor name is set"
        );
        let metageneration = bucket.metageneration.max(1);
        let mut stored = new_bucket(project, &id, bucket, now());
        stored.metageneration = metageneration;
        stored.etag = etag(metageneration);
        self.buckets.insert(id, stored.clone());
        Ok(stored)
    }

    /// Applies `change` to bucket `id` as an out-of-band edit: bumps the
    /// metageneration, update time and etag.
    pub(crate) fn modify_bucket(
        &mut self,
        id: &str,
        change: impl FnOnce(&mut proto::Bucket),
    ) -> anyhow::Result<proto::Bucket> {
        let bucket = self
            .buckets
            .get_mut(id)
            .ok_or_else(|| anyhow::anyhow!("cannot modify bucket {id}: it does not exist"))?;
        change(bucket);
        touch(bucket);
        Ok(bucket.clone())
    }

    /// Creates a new live generation of object `name` in bucket `id`, with
    /// no data. With versioning enabled the previous live generation becomes
    /// noncurrent, otherwise it is replaced.
    pub(crate) fn put_object(&mut self, id: &str, name: &str) -> anyhow::Result<proto::Object> {
        self.put_object_data(id, name, Content::default())
    }

    /// Like [`put_object`](Self::put_object), with `content` as its data.
    pub(crate) fn put_object_data(
        &mut self,
        id: &str,
        name: &str,
        content: Content,
    ) -> anyhow::Result<proto::Object> {
        let template = proto::Object {
            name: name.to_string(),
            checksums: Some(content.checksums()),
            ..Default::default()
        };
        self.store_object(id, template, content).map_err(|status| {
            anyhow::anyhow!(
                "cannot put object {name} in bucket {id}: {}",
                status.message()
            )
        })
    }

    /// Stores `content` as the new live generation of object
    /// `template.name` in bucket `id`. The template carries the caller's
    /// metadata and the content's checksums; the server fills identity,
    /// size, times and defaults. With versioning enabled the previous live
    /// generation becomes noncurrent, otherwise it is replaced.
    pub(crate) fn store_object(
        &mut self,
        id: &str,
        template: proto::Object,
        content: Content,
    ) -> Result<proto::Object, Status> {
        self.check_replaceable(id, &template.name)?;
        let bucket = self.existing_bucket(id)?;
        let versioned = bucket.versioning.is_some_and(|v| v.enabled);
        let storage_class = bucket.storage_class.clone();
        let generation = self.next_generation();
        let time = now();
        let mut object = template;
        object.bucket = bucket_name(id);
        object.etag = etag(generation);
        object.generation = generation;
        object.metageneration = 1;
        object.size = i64::try_from(content.len()).unwrap_or(i64::MAX);
        if object.storage_class.is_empty() {
            object.storage_class = storage_class;
        }
        if object.content_type.is_empty() {
            object.content_type = "application/octet-stream".to_string();
        }
        object.create_time = Some(time);
        object.update_time = Some(time);
        object.finalize_time = Some(time);
        object.update_storage_class_time = Some(time);
        object.delete_time = None;
        let objects = self.objects.entry(id.to_string()).or_default();
        if versioned {
            for live in objects
                .iter_mut()
                .filter(|o| o.name == object.name && o.delete_time.is_none())
            {
                live.delete_time = Some(time);
            }
        } else {
            let replaced = objects
                .iter()
                .filter(|o| o.name == object.name && o.delete_time.is_none())
                .map(|o| o.generation);
            for generation in replaced.collect::<Vec<_>>() {
                self.contents.remove(&generation);
            }
            let objects = self.objects.entry(id.to_string()).or_default();
            objects.retain(|o| o.name != object.name || o.delete_time.is_some());
        }
        let objects = self.objects.entry(id.to_string()).or_default();
        objects.push(object.clone());
        objects.sort_by(|a, b| (&a.name, a.generation).cmp(&(&b.name, b.generation)));
        self.contents.insert(generation, content);
        Ok(object)
    }

    /// PERMISSION_DENIED when a new generation of object `name` in bucket
    /// `id` may not replace the live one: without versioning, replacing
    /// deletes it, which is refused while it is held or retained.
    pub(crate) fn check_replaceable(&self, id: &str, name: &str) -> Result<(), Status> {
        let bucket = self.existing_bucket(id)?;
        if bucket.versioning.is_some_and(|v| v.enabled) {
            return Ok(());
        }
        let mut live = self.objects.get(id).into_iter().flatten();
        match live.find(|o| o.name == name && o.delete_time.is_none()) {
            Some(live) => super::retention::check_deletable(bucket, live),
            None => Ok(()),
        }
    }

    /// Removes every object generation of bucket `id` and its data.
    pub(crate) fn drop_objects(&mut self, id: &str) {
        for object in self.objects.remove(id).unwrap_or_default() {
            self.contents.remove(&object.generation);
        }
    }

    /// Every generation of every object in bucket `id`, by name then generation.
    pub(crate) fn objects_in(&self, id: &str) -> Vec<proto::Object> {
        self.objects.get(id).cloned().unwrap_or_default()
    }

    fn next_generation(&mut self) -> i64 {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        self.last_generation = micros.max(self.last_generation + 1);
        self.last_generation
    }
}

/// Builds a bucket as CreateBucket stores it: `template` carries the
/// caller's settings, the server fills identity, times and defaults.
pub(crate) fn new_bucket(
    project: &str,
    id: &str,
    template: proto::Bucket,
    time: Timestamp,
) -> proto::Bucket {
    let mut bucket = template;
    bucket.name = bucket_name(id);
    bucket.bucket_id = id.to_string();
    bucket.project = format!("projects/{project}");
    bucket.metageneration = 1;
    bucket.etag = etag(1);
    bucket.create_time = Some(time);
    bucket.update_time = Some(time);
    bucket.location = if bucket.location.is_empty() {
        "US".to_string()
    } else {
        bucket.location.to_uppercase()
    };
    bucket.location_type = location_type(&bucket.location).to_string();
    bucket.storage_class = if bucket.storage_class.is_empty() {
        "STANDARD".to_string()
    } else {
        bucket.storage_class.to_uppercase()
    };
    if bucket
        .custom_placement_config
        .as_ref()
        .is_some_and(|p| !p.data_locations.is_empty())
    {
        bucket.location_type = "dual-region".to_string();
    }
    bucket.rpo = bucket.rpo.to_uppercase();
    if bucket.rpo.is_empty() && bucket.location_type != "region" {
        bucket.rpo = "DEFAULT".to_string();
    }
    bucket.iam_config = Some(normalize_iam_config(bucket.iam_config.take(), None, time));
    if let Some(policy) = bucket.retention_policy.as_mut() {
        policy.effective_time = Some(time);
        policy.is_locked = false;
    }
    // Like GCS, a bucket created without a soft delete policy gets the
    // default 7-day one.
    let soft_delete = bucket
        .soft_delete_policy
        .get_or_insert(proto::bucket::SoftDeletePolicy {
            retention_duration: Some(prost_types::Duration {
                seconds: 7 * 24 * 3600,
                nanos: 0,
            }),
            effective_time: None,
        });
    soft_delete.effective_time = Some(time);
    super::settings::fill_created(&mut bucket, time);
    bucket
}

/// Fills the server-side parts of an IAM config: public access prevention
/// defaults to `inherited`; enabling uniform bucket-level access starts its
/// 90-day lock window (kept from `previous` when it was already enabled).
pub(crate) fn normalize_iam_config(
    config: Option<proto::bucket::IamConfig>,
    previous: Option<&proto::bucket::IamConfig>,
    time: Timestamp,
) -> proto::bucket::IamConfig {
    let mut config = config.unwrap_or_default();
    if config.public_access_prevention.is_empty() {
        config.public_access_prevention = "inherited".to_string();
    }
    let ubla = config.uniform_bucket_level_access.get_or_insert_default();
    if ubla.enabled {
        let previous_lock = previous
            .and_then(|p| p.uniform_bucket_level_access)
            .filter(|p| p.enabled)
            .and_then(|p| p.lock_time);
        ubla.lock_time = previous_lock.or(Some(Timestamp {
            seconds: time.seconds + 90 * 24 * 3600,
            nanos: time.nanos,
        }));
    } else {
        ubla.lock_time = None;
    }
    config
}

/// Marks `bucket` as changed: metageneration + 1, new update time and etag.
pub(crate) fn touch(bucket: &mut proto::Bucket) {
    bucket.metageneration += 1;
    bucket.update_time = Some(now());
    bucket.etag = etag(bucket.metageneration);
}

/// `projects/_/buckets/{id}`.
pub(crate) fn bucket_name(id: &str) -> String {
    format!("{BUCKET_NAME_PREFIX}{id}")
}

/// The plain project id of `projects/{project}` (or the input unchanged).
pub(crate) fn plain_project(resource: &str) -> String {
    resource
        .strip_prefix("projects/")
        .unwrap_or(resource)
        .to_string()
}

/// The bucket id in `projects/{project}/buckets/{id}`.
pub(crate) fn parse_bucket_name(name: &str) -> Result<&str, Status> {
    lenient_bucket_id(name).ok_or_else(|| {
        Status::invalid_argument(format!(
            "invalid bucket name {name:?}: expected projects/{{project}}/buckets/{{bucket}}"
        ))
    })
}

/// Like [`parse_bucket_name`], for logging: `None` when malformed.
pub(crate) fn lenient_bucket_id(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("projects/")?;
    let (_project, id) = rest.split_once("/buckets/")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The project id in `projects/{project}`; `None` for the `_` wildcard,
/// an empty or a malformed value.
pub(crate) fn lenient_project(resource: &str) -> Option<&str> {
    let project = resource.strip_prefix("projects/")?;
    (!project.is_empty() && project != "_" && !project.contains('/')).then_some(project)
}

/// NOT_FOUND for a missing bucket, naming it.
pub(crate) fn bucket_not_found(id: &str) -> Status {
    Status::not_found(format!("The specified bucket does not exist: {id}"))
}

/// The current time as a protobuf timestamp.
pub(crate) fn now() -> Timestamp {
    Timestamp::from(SystemTime::now())
}

/// An opaque etag derived from a (meta)generation.
pub(crate) fn etag(generation: i64) -> String {
    format!("CA{generation:x}=")
}

/// `multi-region`, `dual-region` or `region`, from a location code.
fn location_type(location: &str) -> &'static str {
    match location {
        "US" | "EU" | "ASIA" => "multi-region",
        "NAM4" | "EUR4" | "EUR5" | "EUR7" | "EUR8" | "ASIA1" => "dual-region",
        _ => "region",
    }
}

/// Validates a page size: 0 means the default, larger values are capped.
pub(crate) fn page_size(requested: i32) -> Result<usize, Status> {
    const MAX_PAGE: usize = 1000;
    match usize::try_from(requested) {
        Ok(0) => Ok(MAX_PAGE),
        Ok(size) => Ok(size.min(MAX_PAGE)),
        Err(_) => Err(Status::invalid_argument(format!(
            "page_size must not be negative, got {requested}"
        ))),
    }
}

/// Compares protobuf durations.
pub(crate) fn duration_of(d: Option<prost_types::Duration>) -> Duration {
    d.and_then(|d| {
        Some(Duration::new(
            u64::try_from(d.seconds).ok()?,
            u32::try_from(d.nanos).ok()?,
        ))
    })
    .unwrap_or_default()
}
