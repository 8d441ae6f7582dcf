//! Bucket RPCs with GCS semantics: global ids, metageneration
//! preconditions, field-mask updates, non-empty delete protection.

use tonic::Status;

use super::proto;
use super::state::{
    State, duration_of, lenient_project, new_bucket, normalize_iam_config, now, page_size,
    parse_bucket_name, plain_project, touch,
};

/// Update mask paths that replace a whole top-level field; `*` means all.
const WHOLE_FIELDS: &[&str] = &[
    "storage_class",
    "versioning",
    "labels",
    "lifecycle",
    "iam_config",
    "retention_policy",
    "soft_delete_policy",
    "cors",
    "website",
    "logging",
    "billing",
    "autoclass",
    "rpo",
    "encryption",
    "default_event_based_hold",
    "ip_filter",
];

impl State {
    pub(crate) fn create_bucket(
        &mut self,
        request: proto::CreateBucketRequest,
    ) -> Result<proto::Bucket, Status> {
        let template = request.bucket.unwrap_or_default();
        let project = lenient_project(&template.project)
            .or_else(|| lenient_project(&request.parent))
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "no project for the new bucket: parent is {:?} and bucket.project is {:?}, \
                     expected projects/{{project}}",
                    request.parent, template.project
                ))
            })?
            .to_string();
        let id = request.bucket_id;
        validate_bucket_id(&id)?;
        if let Some(owner) = self.bucket_project(&id) {
            let message = if owner == project {
                format!(
                    "Your previous request to create the named bucket succeeded and you already own it: {id}"
                )
            } else {
                format!(
                    "The requested bucket name is not available. The bucket namespace is shared by \
                     all users of the system. Please select a different name and try again: {id}"
                )
            };
            return Err(Status::already_exists(message));
        }
        let mut bucket = new_bucket(&project, &id, template, now());
        // Output only: set by the request's flag, at creation only.
        bucket.object_retention = request
            .enable_object_retention
            .then_some(proto::bucket::ObjectRetention { enabled: true });
        super::settings::check(&bucket)?;
        self.buckets.insert(id, bucket.clone());
        Ok(self.as_seen(bucket))
    }

    /// `bucket` as the caller sees it: without its IP filter unless the
    /// caller has `storage.buckets.getIpFilter` (GCS leaves the field out).
    fn as_seen(&self, mut bucket: proto::Bucket) -> proto::Bucket {
        if self.iam.withheld.contains("storage.buckets.getIpFilter") {
            bucket.ip_filter = None;
        }
        bucket
    }

    pub(crate) fn get_bucket(
        &self,
        request: &proto::GetBucketRequest,
    ) -> Result<proto::Bucket, Status> {
        let (_, bucket) = self.bucket_matching(
            &request.name,
            request.if_metageneration_match,
            request.if_metageneration_not_match,
        )?;
        Ok(self.as_seen(bucket.clone()))
    }

    pub(crate) fn update_bucket(
        &mut self,
        request: proto::UpdateBucketRequest,
    ) -> Result<proto::Bucket, Status> {
        let source = request
            .bucket
            .ok_or_else(|| Status::invalid_argument("UpdateBucket needs a bucket"))?;
        let paths = request
            .update_mask
            .map(|m| m.paths)
            .filter(|paths| !paths.is_empty())
            .ok_or_else(|| {
                Status::invalid_argument("UpdateBucket needs a non-empty update_mask")
            })?;
        let (id, current) = self.bucket_matching(
            &source.name,
            request.if_metageneration_match,
            request.if_metageneration_not_match,
        )?;
        let mut updated = current.clone();
        for path in &paths {
            if path == "*" {
                for field in WHOLE_FIELDS {
                    apply_path(&mut updated, &source, field)?;
                }
            } else {
                apply_path(&mut updated, &source, path)?;
            }
        }
        settle_update(current, &mut updated)?;
        touch(&mut updated);
        let id = id.to_string();
        self.buckets.insert(id, updated.clone());
        Ok(self.as_seen(updated))
    }

    pub(crate) fn delete_bucket(
        &mut self,
        request: &proto::DeleteBucketRequest,
    ) -> Result<(), Status> {
        let (id, _) = self.bucket_matching(
            &request.name,
            request.if_metageneration_match,
            request.if_metageneration_not_match,
        )?;
        if self.objects.get(id).is_some_and(|o| !o.is_empty()) {
            return Err(Status::failed_precondition(format!(
                "The bucket you tried to delete is not empty: {id}"
            )));
        }
        self.buckets.remove(id);
        self.objects.remove(id);
        Ok(())
    }

    /// The bucket `name` (`projects/_/buckets/ID`) names, with its id, when
    /// it exists and its metageneration satisfies both preconditions.
    fn bucket_matching<'n>(
        &self,
        name: &'n str,
        if_match: Option<i64>,
        if_not_match: Option<i64>,
    ) -> Result<(&'n str, &proto::Bucket), Status> {
        let id = parse_bucket_name(name)?;
        let bucket = self.existing_bucket(id)?;
        check_metageneration(bucket, if_match, if_not_match)?;
        Ok((id, bucket))
    }

    pub(crate) fn list_buckets(
        &self,
        request: &proto::ListBucketsRequest,
    ) -> Result<proto::ListBucketsResponse, Status> {
        let project = lenient_project(&request.parent).ok_or_else(|| {
            Status::invalid_argument(format!(
                "invalid parent {:?}: expected projects/{{project}}",
                request.parent
            ))
        })?;
        let size = page_size(request.page_size)?;
        let mut matching = self
            .buckets
            .iter()
            .filter(|(id, bucket)| {
                id.starts_with(&request.prefix)
                    && id.as_str() > request.page_token.as_str()
                    && plain_project(&bucket.project) == project
            })
            .map(|(_, bucket)| self.as_seen(bucket.clone()));
        let buckets: Vec<proto::Bucket> = matching.by_ref().take(size).collect();
        let next_page_token = match (matching.next(), buckets.last()) {
            (Some(_), Some(last)) => last.bucket_id.clone(),
            _ => String::new(),
        };
        Ok(proto::ListBucketsResponse {
            buckets,
            next_page_token,
            unreachable: Vec::new(),
        })
    }
}

/// GCS bucket naming rules (dotted names aside): 3-63 characters of
/// lowercase letters, digits, `-`, `_` and `.`, starting and ending with a
/// letter or digit, not starting with `goog`.
fn validate_bucket_id(id: &str) -> Result<(), Status> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let valid = (3..=63).contains(&id.len())
        && id.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
        && id.starts_with(alnum)
        && id.ends_with(alnum)
        && !id.starts_with("goog");
    if valid {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "Invalid bucket name: {id:?}"
        )))
    }
}

/// FAILED_PRECONDITION unless the bucket's metageneration satisfies both
/// preconditions.
fn check_metageneration(
    bucket: &proto::Bucket,
    if_match: Option<i64>,
    if_not_match: Option<i64>,
) -> Result<(), Status> {
    let actual = bucket.metageneration;
    if let Some(want) = if_match
        && want != actual
    {
        return Err(Status::failed_precondition(format!(
            "metageneration precondition failed for bucket {}: if_metageneration_match={want}, \
             actual {actual}",
            bucket.bucket_id
        )));
    }
    if if_not_match == Some(actual) {
        return Err(Status::failed_precondition(format!(
            "metageneration precondition failed for bucket {}: if_metageneration_not_match={actual}",
            bucket.bucket_id
        )));
    }
    Ok(())
}

/// Copies the field named by mask `path` from `source` into `target`.
fn apply_path(
    target: &mut proto::Bucket,
    source: &proto::Bucket,
    path: &str,
) -> Result<(), Status> {
    match path {
        "storage_class" => {
            target.storage_class = if source.storage_class.is_empty() {
                "STANDARD".to_string()
            } else {
                source.storage_class.to_uppercase()
            };
        }
        "versioning" | "versioning.enabled" => target.versioning = source.versioning,
        "labels" => target.labels = source.labels.clone(),
        "lifecycle" => target.lifecycle = source.lifecycle.clone(),
        "iam_config" => target.iam_config = source.iam_config.clone(),
        "iam_config.uniform_bucket_level_access"
        | "iam_config.uniform_bucket_level_access.enabled"
        | "iam_config.public_access_prevention" => apply_iam_path(target, source, path),
        "retention_policy" | "retention_policy.retention_duration" => {
            target.retention_policy = source.retention_policy;
        }
        "soft_delete_policy" | "soft_delete_policy.retention_duration" => {
            target.soft_delete_policy = source.soft_delete_policy;
        }
        "cors" => target.cors = source.cors.clone(),
        "website" => target.website = source.website.clone(),
        "logging" => target.logging = source.logging.clone(),
        "billing" => target.billing = source.billing,
        "autoclass" => target.autoclass = source.autoclass.clone(),
        "rpo" => target.rpo = source.rpo.to_uppercase(),
        "encryption" => target.encryption = source.encryption.clone(),
        "ip_filter" => target.ip_filter = source.ip_filter.clone(),
        "encryption.default_kms_key" => {
            let key = source
                .encryption
                .as_ref()
                .map(|e| e.default_kms_key.clone());
            target.encryption.get_or_insert_default().default_kms_key = key.unwrap_or_default();
        }
        "hierarchical_namespace" | "custom_placement_config" | "object_retention" => {
            return Err(Status::invalid_argument(format!(
                "{path} is set when a bucket is created and cannot be changed"
            )));
        }
        "default_event_based_hold" => {
            target.default_event_based_hold = source.default_event_based_hold;
        }
        _ => return apply_label_path(target, source, path),
    }
    Ok(())
}

/// The `iam_config` sub-fields of an update mask.
fn apply_iam_path(target: &mut proto::Bucket, source: &proto::Bucket, path: &str) {
    let source = source.iam_config.as_ref();
    let target = target.iam_config.get_or_insert_default();
    if path == "iam_config.public_access_prevention" {
        target.public_access_prevention = source
            .map(|c| c.public_access_prevention.clone())
            .unwrap_or_default();
    } else {
        let enabled = source
            .and_then(|c| c.uniform_bucket_level_access)
            .is_some_and(|u| u.enabled);
        target
            .uniform_bucket_level_access
            .get_or_insert_default()
            .enabled = enabled;
    }
}

/// `labels.<key>` in an update mask (set or removed); anything else is refused.
fn apply_label_path(
    target: &mut proto::Bucket,
    source: &proto::Bucket,
    path: &str,
) -> Result<(), Status> {
    match path.strip_prefix("labels.") {
        Some(key) if !key.is_empty() => {
            match source.labels.get(key) {
                Some(value) => target.labels.insert(key.to_string(), value.clone()),
                None => target.labels.remove(key),
            };
            Ok(())
        }
        _ => Err(Status::invalid_argument(format!(
            "unsupported or immutable field in update_mask: {path:?}"
        ))),
    }
}

/// Server-side consequences of an update: a locked retention policy can
/// neither be removed nor shortened (and stays locked); changed policies get
/// a new effective time; the IAM config gets its defaults and lock window.
fn settle_update(current: &proto::Bucket, updated: &mut proto::Bucket) -> Result<(), Status> {
    let time = now();
    if let Some(locked) = current.retention_policy.filter(|p| p.is_locked) {
        let shortened = updated.retention_policy.is_none_or(|p| {
            duration_of(p.retention_duration) < duration_of(locked.retention_duration)
        });
        if shortened {
            // GCS: "Attempting to remove or decrease period of a locked
            // retention policy will result in a PERMISSION_DENIED error."
            return Err(Status::permission_denied(format!(
                "the retention policy of bucket {} is locked: it cannot be removed or shortened",
                current.bucket_id
            )));
        }
    }
    if let Some(policy) = updated.retention_policy.as_mut() {
        policy.is_locked = current.retention_policy.is_some_and(|p| p.is_locked);
        let unchanged = current
            .retention_policy
            .is_some_and(|p| p.retention_duration == policy.retention_duration);
        policy.effective_time = if unchanged {
            current.retention_policy.and_then(|p| p.effective_time)
        } else {
            Some(time)
        };
    }
    if let Some(policy) = updated.soft_delete_policy.as_mut() {
        let unchanged = current
            .soft_delete_policy
            .is_some_and(|p| p.retention_duration == policy.retention_duration);
        policy.effective_time = if unchanged {
            current.soft_delete_policy.and_then(|p| p.effective_time)
        } else {
            Some(time)
        };
    }
    updated.iam_config = Some(normalize_iam_config(
        updated.iam_config.take(),
        current.iam_config.as_ref(),
        time,
    ));
    super::settings::fill_updated(updated, Some(current), time);
    super::settings::check(updated)
}
