//! The mutable bucket settings the operator keeps as declared, in one
//! normalized shape for both sides: built from the spec (desired) and from a
//! GCS bucket (observed). Comparing the two gives the drift, as the field
//! paths of an `UpdateBucket` mask.

use std::collections::BTreeMap;

use google_cloud_storage::model::Bucket;
use google_cloud_storage::model::bucket::{self, lifecycle, lifecycle::rule};

use crate::crd::{
    GcsSpec, LifecycleAction, LifecycleActionType, LifecycleCondition, LifecycleRule, StorageClass,
};
#[cfg(test)]
use crate::naming::OWNER_LABEL;

/// Normalized mutable settings of a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Default storage class, as GCS spells it (`STANDARD`, ...).
    pub storage_class: String,
    /// Object versioning on or off.
    pub versioning: bool,
    /// The user's labels plus the ownership labels.
    pub labels: BTreeMap<String, String>,
    /// Lifecycle rules, in the resource's order.
    pub lifecycle: Vec<LifecycleRule>,
    /// Uniform bucket-level access (IAM only, no object ACLs).
    pub uniform_bucket_level_access: bool,
    /// `enforced` or `inherited`.
    pub public_access_prevention: String,
    /// Retention period in seconds; `None`: no retention policy.
    pub retention_seconds: Option<i64>,
    /// `None` on the desired side: leave GCS's default alone.
    pub soft_delete_seconds: Option<i64>,
}

/// One mutable field, named by its `UpdateBucket` mask path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `storage_class`.
    StorageClass,
    /// `versioning`.
    Versioning,
    /// `labels`.
    Labels,
    /// `lifecycle`.
    Lifecycle,
    /// `iam_config.uniform_bucket_level_access`.
    UniformBucketLevelAccess,
    /// `iam_config.public_access_prevention`.
    PublicAccessPrevention,
    /// `retention_policy`.
    RetentionPolicy,
    /// `soft_delete_policy`.
    SoftDeletePolicy,
}

impl Field {
    /// The `google.storage.v2.Bucket` field mask path.
    pub fn mask_path(self) -> &'static str {
        match self {
            Field::StorageClass => "storage_class",
            Field::Versioning => "versioning",
            Field::Labels => "labels",
            Field::Lifecycle => "lifecycle",
            Field::UniformBucketLevelAccess => "iam_config.uniform_bucket_level_access",
            Field::PublicAccessPrevention => "iam_config.public_access_prevention",
            Field::RetentionPolicy => "retention_policy",
            Field::SoftDeletePolicy => "soft_delete_policy",
        }
    }
}

impl Settings {
    /// What the spec asks for, with the ownership labels
    /// ([`crate::naming::Identity::labels`]) added.
    pub fn desired(spec: &GcsSpec, ownership_labels: &BTreeMap<String, String>) -> Self {
        let mut labels = spec.labels.clone();
        labels.extend(ownership_labels.clone());
        Settings {
            storage_class: spec.storage_class.as_gcs().to_owned(),
            versioning: spec.versioning,
            labels,
            lifecycle: spec.lifecycle_rules.clone(),
            uniform_bucket_level_access: spec.uniform_bucket_level_access,
            public_access_prevention: spec.public_access_prevention.as_gcs().to_owned(),
            retention_seconds: spec
                .retention_policy
                .as_ref()
                .map(|r| r.retention_period_seconds),
            soft_delete_seconds: spec
                .soft_delete_policy
                .as_ref()
                .map(|s| s.retention_duration_seconds),
        }
    }

    /// What a bucket has.
    pub fn observed(b: &Bucket) -> Self {
        let iam = b.iam_config.as_ref();
        let pap = iam
            .map(|i| i.public_access_prevention.to_ascii_lowercase())
            .unwrap_or_default();
        Settings {
            storage_class: b.storage_class.to_ascii_uppercase(),
            versioning: b.versioning.as_ref().is_some_and(|v| v.enabled),
            labels: b
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            lifecycle: b
                .lifecycle
                .as_ref()
                .map(|l| l.rule.iter().filter_map(rule_from_gcs).collect())
                .unwrap_or_default(),
            uniform_bucket_level_access: iam
                .and_then(|i| i.uniform_bucket_level_access.as_ref())
                .is_some_and(|u| u.enabled),
            // GCS reports "unspecified" for buckets that inherit.
            public_access_prevention: match pap.as_str() {
                "" | "unspecified" => "inherited".to_owned(),
                _ => pap,
            },
            retention_seconds: b
                .retention_policy
                .as_ref()
                .and_then(|r| r.retention_duration.as_ref())
                .map(|d| d.seconds()),
            soft_delete_seconds: b.soft_delete_policy.as_ref().map(|s| {
                s.retention_duration
                    .as_ref()
                    .map(|d| d.seconds())
                    .unwrap_or(0)
            }),
        }
    }

    /// Fields whose observed value differs from `self` (the desired side).
    pub fn drift(&self, observed: &Settings) -> Vec<Field> {
        let mut fields = Vec::new();
        let mut check = |differs: bool, field| {
            if differs {
                fields.push(field);
            }
        };
        check(
            self.storage_class != observed.storage_class,
            Field::StorageClass,
        );
        check(self.versioning != observed.versioning, Field::Versioning);
        check(self.labels != observed.labels, Field::Labels);
        check(self.lifecycle != observed.lifecycle, Field::Lifecycle);
        check(
            self.uniform_bucket_level_access != observed.uniform_bucket_level_access,
            Field::UniformBucketLevelAccess,
        );
        check(
            self.public_access_prevention != observed.public_access_prevention,
            Field::PublicAccessPrevention,
        );
        check(
            self.retention_seconds != observed.retention_seconds,
            Field::RetentionPolicy,
        );
        check(
            self.soft_delete_seconds.is_some()
                && self.soft_delete_seconds != observed.soft_delete_seconds,
            Field::SoftDeletePolicy,
        );
        fields
    }

    /// What changing `field` from `observed` to `self` does, in words
    /// (`versioning: true → false`), for events and conditions.
    pub fn describe(&self, observed: &Settings, field: Field) -> String {
        let on_off = |b: bool| if b { "on" } else { "off" };
        let seconds = |s: Option<i64>| s.map_or_else(|| "none".to_owned(), |s| format!("{s}s"));
        let (name, from, to) = match field {
            Field::StorageClass => (
                "storageClass",
                observed.storage_class.clone(),
                self.storage_class.clone(),
            ),
            Field::Versioning => (
                "versioning",
                on_off(observed.versioning).to_owned(),
                on_off(self.versioning).to_owned(),
            ),
            Field::Labels => {
                return format!("labels: {}", label_changes(&observed.labels, &self.labels));
            }
            Field::Lifecycle => (
                "lifecycleRules",
                format!("{} rules", observed.lifecycle.len()),
                format!("{} rules", self.lifecycle.len()),
            ),
            Field::UniformBucketLevelAccess => (
                "uniformBucketLevelAccess",
                on_off(observed.uniform_bucket_level_access).to_owned(),
                on_off(self.uniform_bucket_level_access).to_owned(),
            ),
            Field::PublicAccessPrevention => (
                "publicAccessPrevention",
                observed.public_access_prevention.clone(),
                self.public_access_prevention.clone(),
            ),
            Field::RetentionPolicy => (
                "retentionPolicy",
                seconds(observed.retention_seconds),
                seconds(self.retention_seconds),
            ),
            Field::SoftDeletePolicy => (
                "softDeletePolicy",
                seconds(observed.soft_delete_seconds),
                seconds(self.soft_delete_seconds),
            ),
        };
        format!("{name}: {from} → {to}")
    }

    /// A bucket carrying these settings (for create, and as an update patch).
    pub fn to_bucket(&self) -> Bucket {
        let mut b = Bucket::new()
            .set_storage_class(self.storage_class.clone())
            .set_versioning(bucket::Versioning::new().set_enabled(self.versioning))
            .set_labels(self.labels.clone())
            .set_iam_config(
                bucket::IamConfig::new()
                    .set_uniform_bucket_level_access(
                        bucket::iam_config::UniformBucketLevelAccess::new()
                            .set_enabled(self.uniform_bucket_level_access),
                    )
                    .set_public_access_prevention(self.public_access_prevention.clone()),
            );
        if !self.lifecycle.is_empty() {
            b = b.set_lifecycle(
                bucket::Lifecycle::new().set_rule(self.lifecycle.iter().map(rule_to_gcs)),
            );
        }
        if let Some(seconds) = self.retention_seconds {
            b = b.set_retention_policy(
                bucket::RetentionPolicy::new()
                    .set_retention_duration(google_cloud_wkt::Duration::clamp(seconds, 0)),
            );
        }
        if let Some(seconds) = self.soft_delete_seconds {
            b = b.set_soft_delete_policy(
                bucket::SoftDeletePolicy::new()
                    .set_retention_duration(google_cloud_wkt::Duration::clamp(seconds, 0)),
            );
        }
        b
    }
}

/// The labels added, removed and changed from `from` to `to`
/// (`+team=media, -temp, owner=a→b`).
fn label_changes(from: &BTreeMap<String, String>, to: &BTreeMap<String, String>) -> String {
    let mut changes = Vec::new();
    for (k, v) in to {
        match from.get(k) {
            None => changes.push(format!("+{k}={v}")),
            Some(old) if old != v => changes.push(format!("{k}={old}→{v}")),
            Some(_) => {}
        }
    }
    changes.extend(
        from.keys()
            .filter(|k| !to.contains_key(*k))
            .map(|k| format!("-{k}")),
    );
    changes.join(", ")
}

fn storage_class_from_gcs(s: &str) -> Option<StorageClass> {
    match s.to_ascii_uppercase().as_str() {
        "STANDARD" => Some(StorageClass::Standard),
        "NEARLINE" => Some(StorageClass::Nearline),
        "COLDLINE" => Some(StorageClass::Coldline),
        "ARCHIVE" => Some(StorageClass::Archive),
        _ => None,
    }
}

fn date_to_string(d: &google_cloud_type::model::Date) -> String {
    format!("{:04}-{:02}-{:02}", d.year, d.month, d.day)
}

fn date_from_string(s: &str) -> Option<google_cloud_type::model::Date> {
    let mut parts = s.splitn(3, '-').map(|p| p.parse::<i32>().ok());
    let (year, month, day) = (parts.next()??, parts.next()??, parts.next()??);
    Some(
        google_cloud_type::model::Date::new()
            .set_year(year)
            .set_month(month)
            .set_day(day),
    )
}

fn rule_to_gcs(r: &LifecycleRule) -> lifecycle::Rule {
    let action = rule::Action::new()
        .set_type(r.action.kind.as_gcs())
        .set_storage_class(
            r.action
                .storage_class
                .map(|s| s.as_gcs())
                .unwrap_or_default(),
        );
    let c = &r.condition;
    let mut condition = rule::Condition::new()
        .set_or_clear_age_days(c.age_days)
        .set_or_clear_is_live(c.is_live)
        .set_or_clear_num_newer_versions(c.num_newer_versions)
        .set_or_clear_days_since_noncurrent_time(c.days_since_noncurrent_time)
        .set_matches_storage_class(c.matches_storage_class.iter().map(|s| s.as_gcs()))
        .set_matches_prefix(c.matches_prefix.clone())
        .set_matches_suffix(c.matches_suffix.clone());
    if let Some(date) = c.created_before.as_deref().and_then(date_from_string) {
        condition = condition.set_created_before(date);
    }
    lifecycle::Rule::new()
        .set_action(action)
        .set_condition(condition)
}

fn rule_from_gcs(r: &lifecycle::Rule) -> Option<LifecycleRule> {
    let action = r.action.as_ref()?;
    let kind = match action.r#type.as_str() {
        "Delete" => LifecycleActionType::Delete,
        "SetStorageClass" => LifecycleActionType::SetStorageClass,
        "AbortIncompleteMultipartUpload" => LifecycleActionType::AbortIncompleteMultipartUpload,
        _ => return None,
    };
    let c = r.condition.clone().unwrap_or_default();
    Some(LifecycleRule {
        action: LifecycleAction {
            kind,
            storage_class: storage_class_from_gcs(&action.storage_class),
        },
        condition: LifecycleCondition {
            age_days: c.age_days,
            created_before: c.created_before.as_ref().map(date_to_string),
            is_live: c.is_live,
            num_newer_versions: c.num_newer_versions,
            days_since_noncurrent_time: c.days_since_noncurrent_time,
            matches_storage_class: c
                .matches_storage_class
                .iter()
                .filter_map(|s| storage_class_from_gcs(s))
                .collect(),
            matches_prefix: c.matches_prefix.clone(),
            matches_suffix: c.matches_suffix.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> GcsSpec {
        serde_json::from_value(json).expect("spec parses")
    }

    #[test]
    fn a_created_bucket_has_no_drift() {
        let spec = spec(serde_json::json!({
            "bucketName": "photos",
            "storageClass": "NEARLINE",
            "versioning": true,
            "labels": {"team": "media"},
            "lifecycleRules": [
                {"action": {"type": "Delete"}, "condition": {"ageDays": 30, "matchesPrefix": ["tmp/"]}},
                {"action": {"type": "SetStorageClass", "storageClass": "COLDLINE"},
                 "condition": {"createdBefore": "2024-01-31", "matchesStorageClass": ["NEARLINE"]}}
            ],
            "publicAccessPrevention": "inherited",
            "retentionPolicy": {"retentionPeriodSeconds": 3600},
            "softDeletePolicy": {"retentionDurationSeconds": 0}
        }));
        let owner = crate::naming::Identity {
            cluster: "c",
            namespace: "ns",
            name: "photos",
        };
        let desired = Settings::desired(&spec, &owner.labels());
        let observed = Settings::observed(&desired.to_bucket());
        assert_eq!(desired.drift(&observed), Vec::<Field>::new());
        assert_eq!(observed.labels.get(OWNER_LABEL), Some(&owner.owner_key()));
    }

    #[test]
    fn each_changed_field_is_reported_once() {
        let desired = Settings::desired(
            &spec(serde_json::json!({"bucketName": "photos"})),
            &BTreeMap::new(),
        );
        let mut observed = desired.clone();
        observed.storage_class = "COLDLINE".into();
        observed.versioning = true;
        observed.labels.insert("extra".into(), "x".into());
        observed.uniform_bucket_level_access = false;
        observed.retention_seconds = Some(5);
        assert_eq!(
            desired.drift(&observed),
            vec![
                Field::StorageClass,
                Field::Versioning,
                Field::Labels,
                Field::UniformBucketLevelAccess,
                Field::RetentionPolicy
            ]
        );
    }

    #[test]
    fn every_change_is_described_with_its_old_and_new_value() {
        let desired = Settings::desired(
            &spec(serde_json::json!({"bucketName": "photos", "labels": {"team": "media"}})),
            &BTreeMap::new(),
        );
        let mut observed = desired.clone();
        observed.storage_class = "NEARLINE".into();
        observed.versioning = true;
        observed.labels.insert("temp".into(), "x".into());
        observed.labels.insert("team".into(), "video".into());
        observed.retention_seconds = Some(60);
        let described: Vec<String> = desired
            .drift(&observed)
            .into_iter()
            .map(|f| desired.describe(&observed, f))
            .collect();
        assert_eq!(
            described,
            [
                "storageClass: NEARLINE → STANDARD",
                "versioning: on → off",
                "labels: team=video→media, -temp",
                "retentionPolicy: 60s → none",
            ]
        );
    }

    #[test]
    fn unmanaged_soft_delete_is_left_alone() {
        let desired = Settings::desired(
            &spec(serde_json::json!({"bucketName": "photos"})),
            &BTreeMap::new(),
        );
        let mut observed = desired.clone();
        observed.soft_delete_seconds = Some(604800);
        assert!(desired.drift(&observed).is_empty());
    }
}
