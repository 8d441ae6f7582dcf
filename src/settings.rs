//! The mutable bucket settings the operator keeps as declared, in one
//! normalized shape for both sides: built from the spec (desired) and from a
//! GCS bucket (observed). Comparing the two gives the drift, as the field
//! paths of an `UpdateBucket` mask.

use std::collections::BTreeMap;

use google_cloud_storage::model::Bucket;
use google_cloud_storage::model::bucket::{self, lifecycle, lifecycle::rule};

use crate::crd::{
    GcsSpec, LifecycleAction, LifecycleActionType, LifecycleCondition, LifecycleRule, Logging,
    StorageClass, Website,
};
use crate::gcs::bucket_resource;
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
    /// The retention policy is (to be) locked. Locking is not an update:
    /// see [`Settings::needs_lock`].
    pub retention_locked: bool,
    /// `None` on the desired side: leave GCS's default alone.
    pub soft_delete_seconds: Option<i64>,
    /// Default Cloud KMS key; `None`: Google-managed encryption.
    pub kms_key: Option<String>,
    /// CORS rules, in the resource's order.
    pub cors: Vec<CorsRule>,
    /// Website settings; `None`: none.
    pub website: Option<Website>,
    /// Requester pays.
    pub requester_pays: bool,
    /// Logging, the prefix `None` when it is GCS's default (the bucket's name).
    pub logging: Option<Logging>,
    /// Event-based hold on new objects.
    pub default_event_based_hold: bool,
    /// Autoclass: `None` off, else on with this terminal storage class.
    pub autoclass: Option<String>,
    /// `DEFAULT` or `ASYNC_TURBO`; `None` on the desired side: not named by
    /// the spec (unmanaged), on the observed side: a single region.
    pub rpo: Option<String>,
    /// Hierarchical namespace (fixed at creation).
    pub hierarchical_namespace: bool,
    /// The regions of a configurable dual-region, upper case (fixed at creation).
    pub data_locations: Vec<String>,
    /// Object Retention Lock enabled (fixed at creation).
    pub object_retention: bool,
    /// IP filter; `None`: none (or disabled with no rules).
    pub ip_filter: Option<IpFilterRules>,
    /// On the desired side, the fields the spec does not name: their
    /// values here are GCS's defaults for a new bucket, and an existing
    /// bucket's are left alone (never drift). Empty on the observed side.
    pub unmanaged: Vec<Field>,
}

/// One CORS rule, as GCS keeps it (a missing max age is 0).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CorsRule {
    /// Allowed origins.
    pub origin: Vec<String>,
    /// Allowed methods.
    pub method: Vec<String>,
    /// Response headers the browser may expose.
    pub response_header: Vec<String>,
    /// Preflight cache time in seconds.
    pub max_age_seconds: i32,
}

/// An IP filter, its ranges sorted and in lower case: GCS applies them as
/// a set, so order is no drift.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpFilterRules {
    /// `Enabled` or `Disabled`.
    pub mode: String,
    /// Public ranges allowed.
    pub public_ranges: Vec<String>,
    /// VPC networks allowed, by name, with their ranges.
    pub vpc_networks: Vec<(String, Vec<String>)>,
    /// VPC networks of other organizations allowed.
    pub allow_cross_org_vpcs: bool,
    /// Service agents allowed whatever the rules.
    pub allow_all_service_agent_access: bool,
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
    /// `encryption.default_kms_key`.
    Encryption,
    /// `cors`.
    Cors,
    /// `website`.
    Website,
    /// `billing`.
    Billing,
    /// `logging`.
    Logging,
    /// `default_event_based_hold`.
    DefaultEventBasedHold,
    /// `autoclass`.
    Autoclass,
    /// `rpo`.
    Rpo,
    /// `ip_filter`.
    IpFilter,
    /// `hierarchical_namespace`: set at creation only.
    HierarchicalNamespace,
    /// `custom_placement_config`: set at creation only.
    CustomPlacementConfig,
    /// `object_retention`: set at creation only.
    ObjectRetention,
}

/// The fields an `UpdateBucket` can change, in the order drift is reported.
const MUTABLE: [Field; 17] = [
    Field::StorageClass,
    Field::Versioning,
    Field::Labels,
    Field::Lifecycle,
    Field::UniformBucketLevelAccess,
    Field::PublicAccessPrevention,
    Field::RetentionPolicy,
    Field::SoftDeletePolicy,
    Field::Encryption,
    Field::Cors,
    Field::Website,
    Field::Billing,
    Field::Logging,
    Field::DefaultEventBasedHold,
    Field::Autoclass,
    Field::Rpo,
    Field::IpFilter,
];

/// The fields GCS sets at creation and never changes.
const IMMUTABLE: [Field; 3] = [
    Field::HierarchicalNamespace,
    Field::CustomPlacementConfig,
    Field::ObjectRetention,
];

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
            Field::Encryption => "encryption.default_kms_key",
            Field::Cors => "cors",
            Field::Website => "website",
            Field::Billing => "billing",
            Field::Logging => "logging",
            Field::DefaultEventBasedHold => "default_event_based_hold",
            Field::Autoclass => "autoclass",
            Field::Rpo => "rpo",
            Field::IpFilter => "ip_filter",
            Field::HierarchicalNamespace => "hierarchical_namespace",
            Field::CustomPlacementConfig => "custom_placement_config",
            Field::ObjectRetention => "object_retention",
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
            retention_locked: spec
                .retention_policy
                .as_ref()
                .is_some_and(|r| r.is_locked == Some(true)),
            soft_delete_seconds: spec
                .soft_delete_policy
                .as_ref()
                .map(|s| s.retention_duration_seconds),
            kms_key: spec
                .encryption
                .as_ref()
                .and_then(|e| e.default_kms_key_name.clone()),
            cors: spec.cors.iter().flatten().map(cors_from_spec).collect(),
            website: spec
                .website
                .as_deref()
                .filter(|w| website_is_set(w))
                .cloned(),
            requester_pays: spec.billing.as_ref().is_some_and(|b| b.requester_pays),
            logging: spec
                .logging
                .as_deref()
                .filter(|l| l.log_bucket.is_some())
                .cloned(),
            default_event_based_hold: spec.default_event_based_hold.unwrap_or(false),
            autoclass: spec.autoclass.as_ref().filter(|a| a.enabled).map(|a| {
                a.terminal_storage_class
                    .map_or(DEFAULT_TERMINAL_CLASS, |c| c.as_gcs())
                    .to_owned()
            }),
            rpo: spec.rpo.map(|r| r.as_gcs().to_owned()),
            hierarchical_namespace: spec
                .hierarchical_namespace
                .as_ref()
                .is_some_and(|h| h.enabled),
            data_locations: upper_case(
                spec.custom_placement_config
                    .iter()
                    .flat_map(|c| &c.data_locations),
            ),
            object_retention: spec.object_retention.is_some(),
            ip_filter: spec.ip_filter.as_deref().and_then(ip_filter_from_spec),
            unmanaged: unmanaged(spec),
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
            retention_locked: b.retention_policy.as_ref().is_some_and(|r| r.is_locked),
            soft_delete_seconds: b.soft_delete_policy.as_ref().map(|s| {
                s.retention_duration
                    .as_ref()
                    .map(|d| d.seconds())
                    .unwrap_or(0)
            }),
            kms_key: kms_key_from_gcs(b),
            cors: b.cors.iter().map(cors_from_gcs).collect(),
            website: b.website.as_ref().and_then(website_from_gcs),
            requester_pays: b.billing.as_ref().is_some_and(|b| b.requester_pays),
            logging: b
                .logging
                .as_ref()
                .and_then(|l| logging_from_gcs(l, &b.bucket_id)),
            default_event_based_hold: b.default_event_based_hold,
            autoclass: autoclass_from_gcs(b),
            rpo: Some(b.rpo.to_ascii_uppercase()).filter(|r| !r.is_empty()),
            hierarchical_namespace: b.hierarchical_namespace.as_ref().is_some_and(|h| h.enabled),
            data_locations: upper_case(
                b.custom_placement_config
                    .iter()
                    .flat_map(|c| &c.data_locations),
            ),
            object_retention: b.object_retention.as_ref().is_some_and(|r| r.enabled),
            ip_filter: b.ip_filter.as_ref().and_then(ip_filter_from_gcs),
            unmanaged: Vec::new(),
        }
    }

    /// Fields an update can correct whose observed value differs from
    /// `self` (the desired side).
    pub fn drift(&self, observed: &Settings) -> Vec<Field> {
        MUTABLE
            .into_iter()
            .filter(|f| self.differs(observed, *f))
            .collect()
    }

    /// Fields GCS fixes at creation whose observed value differs from
    /// `self`: reported, never corrected (that would take a new bucket).
    pub fn immutable_drift(&self, observed: &Settings) -> Vec<Field> {
        IMMUTABLE
            .into_iter()
            .filter(|f| self.differs(observed, *f))
            .collect()
    }

    fn differs(&self, o: &Settings, field: Field) -> bool {
        if self.unmanaged.contains(&field) {
            return false;
        }
        match field {
            Field::StorageClass => self.storage_class != o.storage_class,
            Field::Versioning => self.versioning != o.versioning,
            Field::Labels => self.labels != o.labels,
            Field::Lifecycle => self.lifecycle != o.lifecycle,
            Field::UniformBucketLevelAccess => {
                self.uniform_bucket_level_access != o.uniform_bucket_level_access
            }
            Field::PublicAccessPrevention => {
                self.public_access_prevention != o.public_access_prevention
            }
            Field::RetentionPolicy => self.retention_differs(o),
            Field::SoftDeletePolicy => {
                self.soft_delete_seconds.is_some()
                    && self.soft_delete_seconds != o.soft_delete_seconds
            }
            Field::Encryption => self.kms_key != o.kms_key,
            Field::Cors => self.cors != o.cors,
            Field::Website => self.website != o.website,
            Field::Billing => self.requester_pays != o.requester_pays,
            Field::Logging => self.logging != o.logging,
            Field::DefaultEventBasedHold => {
                self.default_event_based_hold != o.default_event_based_hold
            }
            Field::Autoclass => self.autoclass != o.autoclass,
            Field::Rpo => self.rpo != o.rpo,
            Field::IpFilter => self.ip_filter != o.ip_filter,
            Field::HierarchicalNamespace => self.hierarchical_namespace != o.hierarchical_namespace,
            Field::CustomPlacementConfig => self.data_locations != o.data_locations,
            Field::ObjectRetention => self.object_retention != o.object_retention,
        }
    }

    /// Whether an update can bring `o`'s retention period to `self`'s: any
    /// change of an unlocked policy; of a locked one only a longer period
    /// (GCS never shortens or removes it, see [`Settings::locked_retention_conflict`]).
    fn retention_differs(&self, o: &Settings) -> bool {
        if !o.retention_locked {
            return self.retention_seconds != o.retention_seconds;
        }
        match (self.retention_seconds, o.retention_seconds) {
            (Some(wanted), Some(locked)) => wanted > locked,
            _ => false,
        }
    }

    /// Whether the retention policy must be locked now: the spec says
    /// `isLocked: true` and the bucket's policy (once updated) is unlocked.
    pub fn needs_lock(&self, observed: &Settings) -> bool {
        self.retention_locked && self.retention_seconds.is_some() && !observed.retention_locked
    }

    /// How the spec asks for less than the bucket's locked retention
    /// policy (shorter, none, or unlocked), in words; `None` when it does
    /// not. GCS refuses all of these: the bucket is kept as it is.
    pub fn locked_retention_conflict(&self, observed: &Settings) -> Option<String> {
        let locked = observed
            .retention_seconds
            .filter(|_| observed.retention_locked)?;
        let asked = match self.retention_seconds {
            None => "no retention policy".to_owned(),
            Some(s) if s < locked => format!("a retention period of {s}s"),
            Some(_) if !self.retention_locked => "an unlocked policy".to_owned(),
            Some(_) => return None,
        };
        Some(format!(
            "the bucket's retention policy is locked at {locked}s and the spec asks for {asked}"
        ))
    }

    /// What changing `field` from `observed` to `self` does, in words
    /// (`versioning: on → off`), for events and conditions.
    pub fn describe(&self, observed: &Settings, field: Field) -> String {
        if field == Field::Labels {
            return format!("labels: {}", label_changes(&observed.labels, &self.labels));
        }
        let (name, from) = observed.shown(field);
        let (_, to) = self.shown(field);
        format!("{name}: {from} → {to}")
    }

    /// The resource's name of `field` and its value here, in words.
    fn shown(&self, field: Field) -> (&'static str, String) {
        let on_off = |b: bool| if b { "on" } else { "off" }.to_owned();
        let seconds = |s: Option<i64>| s.map_or_else(|| "none".to_owned(), |s| format!("{s}s"));
        let rules = |n: usize| format!("{n} rules");
        match field {
            Field::StorageClass => ("storageClass", self.storage_class.clone()),
            Field::Versioning => ("versioning", on_off(self.versioning)),
            Field::Labels => ("labels", format!("{} labels", self.labels.len())),
            Field::Lifecycle => ("lifecycleRules", rules(self.lifecycle.len())),
            Field::UniformBucketLevelAccess => (
                "uniformBucketLevelAccess",
                on_off(self.uniform_bucket_level_access),
            ),
            Field::PublicAccessPrevention => (
                "publicAccessPrevention",
                self.public_access_prevention.clone(),
            ),
            Field::RetentionPolicy => ("retentionPolicy", seconds(self.retention_seconds)),
            Field::SoftDeletePolicy => ("softDeletePolicy", seconds(self.soft_delete_seconds)),
            Field::Cors => ("cors", rules(self.cors.len())),
            Field::Billing => ("billing.requesterPays", on_off(self.requester_pays)),
            Field::DefaultEventBasedHold => (
                "defaultEventBasedHold",
                on_off(self.default_event_based_hold),
            ),
            Field::HierarchicalNamespace => {
                ("hierarchicalNamespace", on_off(self.hierarchical_namespace))
            }
            Field::ObjectRetention => ("objectRetention", on_off(self.object_retention)),
            _ => self.shown_text(field),
        }
    }

    /// [`Settings::shown`] for the fields shown as text or `none`.
    fn shown_text(&self, field: Field) -> (&'static str, String) {
        let (name, value) = match field {
            Field::Encryption => ("encryption.defaultKmsKeyName", self.kms_key.clone()),
            Field::Website => ("website", self.website.as_ref().map(website_in_words)),
            Field::Logging => (
                "logging",
                self.logging.as_ref().map(|l| {
                    let bucket = l.log_bucket.as_deref().unwrap_or_default();
                    match &l.log_object_prefix {
                        Some(prefix) => format!("gs://{bucket}/{prefix}"),
                        None => format!("gs://{bucket}"),
                    }
                }),
            ),
            Field::Autoclass => (
                "autoclass",
                self.autoclass
                    .as_ref()
                    .map(|t| format!("on, terminal class {t}")),
            ),
            Field::Rpo => ("rpo", self.rpo.clone()),
            Field::IpFilter => ("ipFilter", self.ip_filter.as_ref().map(ip_filter_in_words)),
            Field::CustomPlacementConfig => (
                "customPlacementConfig.dataLocations",
                Some(self.data_locations.join(", ")).filter(|l| !l.is_empty()),
            ),
            _ => ("", None),
        };
        (name, value.unwrap_or_else(|| "none".to_owned()))
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
        self.with_placement(self.with_features(b))
    }

    /// Encryption, CORS, website, billing, logging, holds and autoclass.
    /// What is unset is left out: in an update, a field of the mask that
    /// the patch lacks is cleared.
    fn with_features(&self, mut b: Bucket) -> Bucket {
        if let Some(key) = &self.kms_key {
            b = b.set_encryption(bucket::Encryption::new().set_default_kms_key(key.clone()));
        }
        if let Some(l) = &self.logging
            && let Some(log_bucket) = &l.log_bucket
        {
            b = b.set_logging(
                bucket::Logging::new()
                    .set_log_bucket(bucket_resource(log_bucket))
                    .set_log_object_prefix(l.log_object_prefix.clone().unwrap_or_default()),
            );
        }
        if let Some(f) = &self.ip_filter {
            b = b.set_ip_filter(ip_filter_to_gcs(f));
        }
        if let Some(w) = &self.website {
            b = b.set_website(
                bucket::Website::new()
                    .set_main_page_suffix(w.main_page_suffix.clone().unwrap_or_default())
                    .set_not_found_page(w.not_found_page.clone().unwrap_or_default()),
            );
        }
        b.set_cors(self.cors.iter().map(cors_to_gcs))
            .set_billing(bucket::Billing::new().set_requester_pays(self.requester_pays))
            .set_default_event_based_hold(self.default_event_based_hold)
            .set_autoclass(
                bucket::Autoclass::new()
                    .set_enabled(self.autoclass.is_some())
                    .set_or_clear_terminal_storage_class(self.autoclass.clone()),
            )
    }

    /// Hierarchical namespace, placement and rpo (only when set: GCS
    /// refuses an rpo on a single-region bucket).
    fn with_placement(&self, mut b: Bucket) -> Bucket {
        if self.hierarchical_namespace {
            b = b
                .set_hierarchical_namespace(bucket::HierarchicalNamespace::new().set_enabled(true));
        }
        if !self.data_locations.is_empty() {
            b = b.set_custom_placement_config(
                bucket::CustomPlacementConfig::new()
                    .set_data_locations(self.data_locations.clone()),
            );
        }
        if let Some(rpo) = &self.rpo {
            b = b.set_rpo(rpo.clone());
        }
        b
    }
}

/// The terminal storage class GCS gives autoclass when none is named.
const DEFAULT_TERMINAL_CLASS: &str = "NEARLINE";

fn upper_case<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
    names.map(|n| n.to_ascii_uppercase()).collect()
}

/// The default key; `None` for Google-managed encryption.
fn kms_key_from_gcs(b: &Bucket) -> Option<String> {
    let key = b.encryption.as_ref().map(|e| e.default_kms_key.clone());
    key.filter(|k| !k.is_empty())
}

/// Autoclass's terminal class, `None` when autoclass is off.
fn autoclass_from_gcs(b: &Bucket) -> Option<String> {
    let autoclass = b.autoclass.as_ref().filter(|a| a.enabled)?;
    let terminal = autoclass.terminal_storage_class.as_deref();
    Some(
        terminal
            .unwrap_or(DEFAULT_TERMINAL_CLASS)
            .to_ascii_uppercase(),
    )
}

fn cors_from_spec(c: &crate::crd::Cors) -> CorsRule {
    CorsRule {
        origin: c.origin.clone(),
        method: c.method.clone(),
        response_header: c.response_header.clone(),
        max_age_seconds: c.max_age_seconds.unwrap_or(0),
    }
}

fn cors_from_gcs(c: &bucket::Cors) -> CorsRule {
    CorsRule {
        origin: c.origin.clone(),
        method: c.method.clone(),
        response_header: c.response_header.clone(),
        max_age_seconds: c.max_age_seconds,
    }
}

fn cors_to_gcs(c: &CorsRule) -> bucket::Cors {
    bucket::Cors::new()
        .set_origin(c.origin.clone())
        .set_method(c.method.clone())
        .set_response_header(c.response_header.clone())
        .set_max_age_seconds(c.max_age_seconds)
}

/// A website config; `None` when it sets nothing.
fn website_from_gcs(w: &bucket::Website) -> Option<Website> {
    let set = |s: &String| Some(s.clone()).filter(|s| !s.is_empty());
    let website = Website {
        main_page_suffix: set(&w.main_page_suffix),
        not_found_page: set(&w.not_found_page),
    };
    website_is_set(&website).then_some(website)
}

fn website_is_set(w: &Website) -> bool {
    w.main_page_suffix.is_some() || w.not_found_page.is_some()
}

/// The fields added in 0.2.0 that `spec` leaves out (see [`Settings::unmanaged`]).
fn unmanaged(spec: &GcsSpec) -> Vec<Field> {
    [
        (spec.encryption.is_none(), Field::Encryption),
        (spec.cors.is_none(), Field::Cors),
        (spec.website.is_none(), Field::Website),
        (spec.billing.is_none(), Field::Billing),
        (spec.logging.is_none(), Field::Logging),
        (
            spec.default_event_based_hold.is_none(),
            Field::DefaultEventBasedHold,
        ),
        (spec.autoclass.is_none(), Field::Autoclass),
        (spec.rpo.is_none(), Field::Rpo),
        (spec.ip_filter.is_none(), Field::IpFilter),
        (
            spec.hierarchical_namespace.is_none(),
            Field::HierarchicalNamespace,
        ),
        (
            spec.custom_placement_config.is_none(),
            Field::CustomPlacementConfig,
        ),
        (spec.object_retention.is_none(), Field::ObjectRetention),
    ]
    .into_iter()
    .filter_map(|(absent, field)| absent.then_some(field))
    .collect()
}

/// Ranges as a set: sorted, lower case, without duplicates.
fn range_set<'a>(ranges: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut set: Vec<String> = ranges.into_iter().map(|r| r.to_ascii_lowercase()).collect();
    set.sort_unstable();
    set.dedup();
    set
}

/// `None` for a filter that does nothing (disabled, no rules, no flags):
/// the same as no filter, so that neither side drifts from the other.
fn ip_filter_rules(mut f: IpFilterRules) -> Option<IpFilterRules> {
    f.vpc_networks.sort();
    let idle = f.mode != "Enabled"
        && f == IpFilterRules {
            mode: f.mode.clone(),
            ..IpFilterRules::default()
        };
    (!idle).then_some(f)
}

fn ip_filter_from_spec(f: &crate::crd::IpFilter) -> Option<IpFilterRules> {
    ip_filter_rules(IpFilterRules {
        mode: f.mode.as_gcs().to_owned(),
        public_ranges: range_set(
            f.public_network_source
                .iter()
                .flat_map(|p| &p.allowed_ip_cidr_ranges),
        ),
        vpc_networks: (f.vpc_network_sources.iter().flatten())
            .map(|v| (v.network.clone(), range_set(&v.allowed_ip_cidr_ranges)))
            .collect(),
        allow_cross_org_vpcs: f.allow_cross_org_vpcs.unwrap_or(false),
        allow_all_service_agent_access: f.allow_all_service_agent_access.unwrap_or(false),
    })
}

fn ip_filter_from_gcs(f: &bucket::IpFilter) -> Option<IpFilterRules> {
    ip_filter_rules(IpFilterRules {
        mode: f.mode.clone().unwrap_or_default(),
        public_ranges: range_set(
            f.public_network_source
                .iter()
                .flat_map(|p| &p.allowed_ip_cidr_ranges),
        ),
        vpc_networks: (f.vpc_network_sources.iter())
            .map(|v| {
                let network = v.network.clone().unwrap_or_default();
                (network, range_set(&v.allowed_ip_cidr_ranges))
            })
            .collect(),
        allow_cross_org_vpcs: f.allow_cross_org_vpcs,
        allow_all_service_agent_access: f.allow_all_service_agent_access.unwrap_or(false),
    })
}

fn ip_filter_to_gcs(f: &IpFilterRules) -> bucket::IpFilter {
    use bucket::ip_filter::{PublicNetworkSource, VpcNetworkSource};
    let mut filter = bucket::IpFilter::new()
        .set_mode(f.mode.clone())
        .set_vpc_network_sources(f.vpc_networks.iter().map(|(network, ranges)| {
            VpcNetworkSource::new()
                .set_network(network.clone())
                .set_allowed_ip_cidr_ranges(ranges.clone())
        }))
        .set_allow_cross_org_vpcs(f.allow_cross_org_vpcs)
        .set_allow_all_service_agent_access(f.allow_all_service_agent_access);
    if !f.public_ranges.is_empty() {
        filter = filter.set_public_network_source(
            PublicNetworkSource::new().set_allowed_ip_cidr_ranges(f.public_ranges.clone()),
        );
    }
    filter
}

fn ip_filter_in_words(f: &IpFilterRules) -> String {
    format!(
        "{}, {} public ranges, {} VPC networks",
        f.mode,
        f.public_ranges.len(),
        f.vpc_networks.len()
    )
}

fn website_in_words(w: &Website) -> String {
    let show = |s: &Option<String>| s.clone().unwrap_or_else(|| "none".to_owned());
    format!(
        "mainPageSuffix {}, notFoundPage {}",
        show(&w.main_page_suffix),
        show(&w.not_found_page)
    )
}

/// A logging config by the log bucket's plain name (GCS names it
/// `projects/_/buckets/NAME`); the prefix `None` when it is GCS's default,
/// the logged bucket's name. `None` when it logs nowhere.
fn logging_from_gcs(l: &bucket::Logging, bucket_id: &str) -> Option<Logging> {
    let log_bucket = l
        .log_bucket
        .rsplit_once("/buckets/")
        .map_or(l.log_bucket.as_str(), |(_, name)| name);
    if log_bucket.is_empty() {
        return None;
    }
    let prefix = &l.log_object_prefix;
    Some(Logging {
        log_bucket: Some(log_bucket.to_owned()),
        log_object_prefix: Some(prefix.clone()).filter(|p| !p.is_empty() && p != bucket_id),
    })
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
        .set_matches_suffix(c.matches_suffix.clone())
        .set_or_clear_days_since_custom_time(c.days_since_custom_time);
    if let Some(date) = c.created_before.as_deref().and_then(date_from_string) {
        condition = condition.set_created_before(date);
    }
    if let Some(date) = c.custom_time_before.as_deref().and_then(date_from_string) {
        condition = condition.set_custom_time_before(date);
    }
    if let Some(date) = c
        .noncurrent_time_before
        .as_deref()
        .and_then(date_from_string)
    {
        condition = condition.set_noncurrent_time_before(date);
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
            custom_time_before: c.custom_time_before.as_ref().map(date_to_string),
            days_since_custom_time: c.days_since_custom_time,
            is_live: c.is_live,
            num_newer_versions: c.num_newer_versions,
            days_since_noncurrent_time: c.days_since_noncurrent_time,
            noncurrent_time_before: c.noncurrent_time_before.as_ref().map(date_to_string),
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
            "softDeletePolicy": {"retentionDurationSeconds": 0},
            "encryption": {"defaultKmsKeyName": "projects/p/locations/us/keyRings/r/cryptoKeys/k"},
            "cors": [{"origin": ["https://example.com"], "method": ["GET", "PUT"],
                      "responseHeader": ["Content-Type"]}],
            "website": {"mainPageSuffix": "index.html"},
            "billing": {"requesterPays": true},
            "logging": {"logBucket": "logs-k3x9q2mw", "logObjectPrefix": "photos/"},
            "defaultEventBasedHold": true,
            "autoclass": {"enabled": true},
            "hierarchicalNamespace": {"enabled": true},
            "customPlacementConfig": {"dataLocations": ["us-east1", "US-WEST1"]},
            "rpo": "ASYNC_TURBO",
            "ipFilter": {"mode": "Enabled",
                         "publicNetworkSource": {"allowedIpCidrRanges": ["203.0.113.0/24"]},
                         "vpcNetworkSources": [{"network": "projects/p/global/networks/n",
                                                "allowedIpCidrRanges": ["10.8.0.0/14"]}]}
        }));
        let owner = crate::naming::Identity {
            cluster: "c",
            namespace: "ns",
            name: "photos",
        };
        let desired = Settings::desired(&spec, &owner.labels());
        let observed = Settings::observed(&desired.to_bucket());
        assert_eq!(desired.drift(&observed), Vec::<Field>::new());
        assert_eq!(desired.immutable_drift(&observed), Vec::<Field>::new());
        assert_eq!(observed.labels.get(OWNER_LABEL), Some(&owner.owner_key()));
        assert_eq!(observed.autoclass.as_deref(), Some("NEARLINE"));
        assert_eq!(observed.data_locations, ["US-EAST1", "US-WEST1"]);
        assert_eq!(observed.cors.len(), 1);
        assert!(observed.requester_pays && observed.default_event_based_hold);
        assert!(observed.hierarchical_namespace && observed.kms_key.is_some());
        let filter = observed.ip_filter.expect("the IP filter is sent");
        assert_eq!(filter.public_ranges, ["203.0.113.0/24"]);
        assert_eq!(filter.vpc_networks.len(), 1);
    }

    #[test]
    fn an_ip_filter_is_a_set_of_ranges_and_a_disabled_empty_one_is_none() {
        let from_spec = |json| Settings::desired(&spec(json), &BTreeMap::new()).ip_filter;
        let a = from_spec(serde_json::json!({"bucketName": "photos", "ipFilter": {
            "mode": "Enabled", "publicNetworkSource": {"allowedIpCidrRanges": ["2001:DB8::/32", "198.51.100.0/24"]},
            "vpcNetworkSources": [
                {"network": "projects/p/global/networks/b", "allowedIpCidrRanges": ["10.0.0.0/8"]},
                {"network": "projects/p/global/networks/a", "allowedIpCidrRanges": ["10.8.0.0/14", "10.4.0.0/14"]}]}}));
        let b = from_spec(serde_json::json!({"bucketName": "photos", "ipFilter": {
            "mode": "Enabled", "publicNetworkSource": {"allowedIpCidrRanges": ["198.51.100.0/24", "2001:db8::/32"]},
            "vpcNetworkSources": [
                {"network": "projects/p/global/networks/a", "allowedIpCidrRanges": ["10.4.0.0/14", "10.8.0.0/14"]},
                {"network": "projects/p/global/networks/b", "allowedIpCidrRanges": ["10.0.0.0/8"]}]}}));
        assert!(a.is_some());
        assert_eq!(a, b, "order and case are no drift");
        let off = from_spec(
            serde_json::json!({"bucketName": "photos", "ipFilter": {"mode": "Disabled"}}),
        );
        assert_eq!(off, None);
        let gcs = Bucket::new().set_ip_filter(bucket::IpFilter::new().set_mode("Disabled"));
        assert_eq!(Settings::observed(&gcs).ip_filter, None);
        // Disabled with its rules kept is not none.
        let kept = from_spec(serde_json::json!({"bucketName": "photos", "ipFilter": {
            "mode": "Disabled", "publicNetworkSource": {"allowedIpCidrRanges": ["198.51.100.0/24"]}}}));
        assert_eq!(kept.map(|f| f.mode), Some("Disabled".to_owned()));
    }

    #[test]
    fn every_lifecycle_condition_round_trips_and_each_one_drifts() {
        let spec = spec(serde_json::json!({
            "bucketName": "photos",
            "lifecycleRules": [{"action": {"type": "Delete"}, "condition": {
                "ageDays": 1, "createdBefore": "2024-01-31", "customTimeBefore": "2024-02-29",
                "daysSinceCustomTime": 7, "isLive": false, "numNewerVersions": 2,
                "daysSinceNoncurrentTime": 30, "noncurrentTimeBefore": "2023-12-01",
                "matchesStorageClass": ["STANDARD"], "matchesPrefix": ["logs/", "tmp/"],
                "matchesSuffix": [".gz", ".zip"]}}]
        }));
        let desired = Settings::desired(&spec, &BTreeMap::new());
        let sent = desired.to_bucket();
        let condition = sent.lifecycle.as_ref().map(|l| l.rule[0].condition.clone());
        let condition = condition.flatten().expect("a condition is sent");
        let date = |d: &Option<google_cloud_type::model::Date>| d.as_ref().map(date_to_string);
        assert_eq!(
            date(&condition.custom_time_before).as_deref(),
            Some("2024-02-29")
        );
        assert_eq!(
            date(&condition.noncurrent_time_before).as_deref(),
            Some("2023-12-01")
        );
        assert_eq!(condition.days_since_custom_time, Some(7));
        assert_eq!(condition.matches_prefix, ["logs/", "tmp/"]);
        assert_eq!(condition.matches_suffix, [".gz", ".zip"]);
        let observed = Settings::observed(&sent);
        assert_eq!(observed.lifecycle, spec.lifecycle_rules);
        assert_eq!(desired.drift(&observed), Vec::<Field>::new());
        type Change = fn(&mut LifecycleCondition);
        let changes: [Change; 5] = [
            |c| c.custom_time_before = Some("2024-03-01".into()),
            |c| c.days_since_custom_time = None,
            |c| c.noncurrent_time_before = None,
            |c| c.matches_prefix.reverse(),
            |c| {
                c.matches_suffix.pop();
            },
        ];
        for (i, change) in changes.into_iter().enumerate() {
            let mut drifted = observed.clone();
            change(&mut drifted.lifecycle[0].condition);
            assert_eq!(desired.drift(&drifted), [Field::Lifecycle], "change {i}");
        }
    }

    #[test]
    fn every_new_setting_drifts_on_its_own_field() {
        let desired = Settings::desired(
            &spec(serde_json::json!({"bucketName": "photos", "location": "US",
                    "encryption": {}, "cors": [], "website": {"notFoundPage": "404.html"},
                    "billing": {"requesterPays": false}, "logging": {},
                    "defaultEventBasedHold": false, "autoclass": {"enabled": false},
                    "rpo": "DEFAULT", "ipFilter": {"mode": "Disabled"}})),
            &BTreeMap::new(),
        );
        type Change = fn(&mut Settings);
        let changes: [(Field, Change); 9] = [
            (Field::Encryption, |o| {
                o.kms_key = Some("projects/p/locations/l/keyRings/r/cryptoKeys/k".into())
            }),
            (Field::Cors, |o| o.cors.push(CorsRule::default())),
            (Field::Website, |o| o.website = None),
            (Field::Billing, |o| o.requester_pays = true),
            (Field::Logging, |o| {
                o.logging = Some(Logging {
                    log_bucket: Some("logs".into()),
                    log_object_prefix: None,
                });
            }),
            (Field::DefaultEventBasedHold, |o| {
                o.default_event_based_hold = true
            }),
            (Field::Autoclass, |o| o.autoclass = Some("ARCHIVE".into())),
            (Field::Rpo, |o| o.rpo = Some("ASYNC_TURBO".into())),
            (Field::IpFilter, |o| {
                o.ip_filter = Some(IpFilterRules {
                    mode: "Enabled".into(),
                    public_ranges: vec!["0.0.0.0/0".into()],
                    ..IpFilterRules::default()
                });
            }),
        ];
        for (field, change) in changes {
            let mut observed = desired.clone();
            change(&mut observed);
            assert_eq!(desired.drift(&observed), [field], "{field:?}");
            assert!(desired.immutable_drift(&observed).is_empty(), "{field:?}");
        }
    }

    #[test]
    fn settings_the_spec_leaves_out_are_left_as_the_bucket_has_them() {
        let desired = Settings::desired(
            &spec(serde_json::json!({"bucketName": "photos", "location": "US"})),
            &BTreeMap::new(),
        );
        let mut observed = desired.clone();
        observed.unmanaged.clear();
        observed.kms_key = Some("projects/p/locations/us/keyRings/r/cryptoKeys/k".into());
        observed.cors.push(CorsRule::default());
        observed.website = website_from_gcs(&bucket::Website::new().set_main_page_suffix("i"));
        observed.requester_pays = true;
        observed.logging = Some(Logging {
            log_bucket: Some("logs".into()),
            log_object_prefix: None,
        });
        observed.default_event_based_hold = true;
        observed.autoclass = Some("ARCHIVE".into());
        observed.rpo = Some("ASYNC_TURBO".into());
        observed.ip_filter = Some(IpFilterRules {
            mode: "Enabled".into(),
            public_ranges: vec!["198.51.100.0/24".into()],
            ..IpFilterRules::default()
        });
        observed.hierarchical_namespace = true;
        observed.data_locations = vec!["US-EAST1".into(), "US-WEST1".into()];
        assert_eq!(desired.drift(&observed), Vec::<Field>::new());
        assert_eq!(desired.immutable_drift(&observed), Vec::<Field>::new());
        // A new bucket gets GCS's defaults for them.
        let created = desired.to_bucket();
        assert_eq!(created.rpo, "");
        assert!(created.encryption.is_none() && created.cors.is_empty());
        assert!(created.logging.is_none() && created.website.is_none());
        assert!(created.ip_filter.is_none());
    }

    #[test]
    fn gcs_default_log_prefix_and_resource_name_are_what_the_spec_means() {
        let gcs = Bucket::new().set_bucket_id("photos-k3x9q2mw").set_logging(
            bucket::Logging::new()
                .set_log_bucket("projects/_/buckets/logs-k3x9q2mw")
                .set_log_object_prefix("photos-k3x9q2mw"),
        );
        let expected = Logging {
            log_bucket: Some("logs-k3x9q2mw".into()),
            log_object_prefix: None,
        };
        assert_eq!(Settings::observed(&gcs).logging, Some(expected));
        let nowhere = gcs.set_logging(bucket::Logging::new());
        assert_eq!(Settings::observed(&nowhere).logging, None);
    }

    #[test]
    fn fixed_settings_are_reported_apart_and_described() {
        let desired = Settings::desired(
            &spec(serde_json::json!({"bucketName": "photos", "location": "US",
                "hierarchicalNamespace": {"enabled": true},
                "customPlacementConfig": {"dataLocations": ["US-EAST1", "US-WEST1"]}})),
            &BTreeMap::new(),
        );
        let mut observed = desired.clone();
        observed.hierarchical_namespace = false;
        observed.data_locations.clear();
        assert!(
            desired.drift(&observed).is_empty(),
            "never in an update mask"
        );
        let described: Vec<String> = desired
            .immutable_drift(&observed)
            .into_iter()
            .map(|f| desired.describe(&observed, f))
            .collect();
        assert_eq!(
            described,
            [
                "hierarchicalNamespace: off → on",
                "customPlacementConfig.dataLocations: none → US-EAST1, US-WEST1",
            ]
        );
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
