//! The `Gcs` custom resource: one logical bucket per namespace.
//!
//! The types here are the single source of the CRD: `bucketmap crd` prints it
//! and `deploy/crd.yaml` is checked against that output in CI. Admission-time
//! validation lives in the schema (OpenAPI + CEL `x-kubernetes-validations`),
//! so a bad name or an attempt to move a bucket is refused by the API server
//! with a message a person understands, before the operator ever sees it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::naming::{MAX_LOGICAL_NAME_LEN, SUFFIX_LEN};

/// API group of the `Gcs` resource.
pub const GROUP: &str = "storage.bucketmap.dev";
/// Finalizer that protects the bucket while the resource exists.
pub const FINALIZER: &str = "storage.bucketmap.dev/finalizer";

/// Annotation that asks for a reconcile now rather than at the next
/// resync: any new value (a timestamp, say) makes the operator check the
/// bucket at once, and `status.lastHandledReconcileAt` takes the value
/// once it did (as Flux's `reconcile.fluxcd.io/requestedAt`).
pub const RECONCILE_REQUEST_ANNOTATION: &str = "bucketmap.dev/reconcile-requested-at";

/// A Google Cloud Storage bucket, declared by its logical name.
///
/// The operator creates a globally unique physical bucket
/// (`<bucketName>-<suffix>`) in the resolved project, keeps its settings as
/// declared, and deletes it safely when the resource is deleted.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "storage.bucketmap.dev",
    version = "v1alpha1",
    kind = "Gcs",
    plural = "gcs",
    singular = "gcs",
    shortname = "gcsb",
    category = "bucketmap",
    label("servicebinding.io/provisioned-service", "true"),
    namespaced,
    status = "GcsStatus",
    derive = "PartialEq",
    doc = "A Google Cloud Storage bucket known by a logical name in its namespace",
    printcolumn(name = "Logical", type_ = "string", json_path = ".spec.bucketName"),
    printcolumn(name = "Physical", type_ = "string", json_path = ".status.bucketFullName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Location", type_ = "string", json_path = ".spec.location", priority = "1"),
    printcolumn(name = "Class", type_ = "string", json_path = ".spec.storageClass", priority = "1"),
    printcolumn(name = "Autoclass", type_ = "boolean", json_path = ".spec.autoclass.enabled", priority = "1"),
    printcolumn(name = "RPO", type_ = "string", json_path = ".spec.rpo", priority = "1"),
    printcolumn(
        name = "Notifications",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Notifications\")].status",
        priority = "1"
    ),
    validation = Rule::new("!has(oldSelf.spec.projectID) || (has(self.spec.projectID) && self.spec.projectID == oldSelf.spec.projectID)")
        .message("spec.projectID is immutable once set: GCS cannot move a bucket to another project; create a new Gcs resource instead")
        .field_path(".spec.projectID"),
    validation = Rule::new("has(self.spec.adopt) == has(oldSelf.spec.adopt) && (!has(self.spec.adopt) || self.spec.adopt.bucket == oldSelf.spec.adopt.bucket)")
        .message("spec.adopt is immutable: it is set when the Gcs is created and never changed, added or removed; to adopt another bucket, create a new Gcs resource (deletionPolicy Orphan or Abandon keeps the current bucket)")
        .field_path(".spec.adopt"),
    validation = Rule::new("(has(self.spec.hierarchicalNamespace) && self.spec.hierarchicalNamespace.enabled) == (has(oldSelf.spec.hierarchicalNamespace) && oldSelf.spec.hierarchicalNamespace.enabled)")
        .message("spec.hierarchicalNamespace is set when the bucket is created and never changed: GCS cannot enable or disable it on an existing bucket; create a new Gcs resource instead")
        .field_path(".spec.hierarchicalNamespace"),
    // Two regions each (min and max items), compared without `map`, whose
    // cost Kubernetes 1.29's estimator cannot bound.
    validation = Rule::new("has(self.spec.customPlacementConfig) == has(oldSelf.spec.customPlacementConfig) && (!has(self.spec.customPlacementConfig) || (self.spec.customPlacementConfig.dataLocations[0].lowerAscii() == oldSelf.spec.customPlacementConfig.dataLocations[0].lowerAscii() && self.spec.customPlacementConfig.dataLocations[1].lowerAscii() == oldSelf.spec.customPlacementConfig.dataLocations[1].lowerAscii()))")
        .message("spec.customPlacementConfig is immutable: GCS cannot move a bucket's data to other regions; create a new Gcs resource instead")
        .field_path(".spec.customPlacementConfig"),
    validation = Rule::new("!has(oldSelf.spec.retentionPolicy) || !has(oldSelf.spec.retentionPolicy.isLocked) || !oldSelf.spec.retentionPolicy.isLocked || (has(self.spec.retentionPolicy) && has(self.spec.retentionPolicy.isLocked) && self.spec.retentionPolicy.isLocked)")
        .message("spec.retentionPolicy.isLocked cannot be unset or set to false, nor the retentionPolicy removed, once it is true: a locked retention policy is permanent in GCS and is never unlocked; objects can be deleted as their retention expires")
        .field_path(".spec.retentionPolicy.isLocked"),
    validation = Rule::new("!has(oldSelf.spec.retentionPolicy) || !has(oldSelf.spec.retentionPolicy.isLocked) || !oldSelf.spec.retentionPolicy.isLocked || !has(self.spec.retentionPolicy) || self.spec.retentionPolicy.retentionPeriodSeconds >= oldSelf.spec.retentionPolicy.retentionPeriodSeconds")
        .message("spec.retentionPolicy.retentionPeriodSeconds cannot be shortened while the policy is locked (isLocked: true): GCS never shortens a locked retention policy; it may only grow")
        .field_path(".spec.retentionPolicy.retentionPeriodSeconds"),
    validation = Rule::new("has(self.spec.objectRetention) == has(oldSelf.spec.objectRetention)")
        .message("spec.objectRetention is set when the bucket is created and never changed: GCS enables object retention only at creation and never disables it; create a new Gcs resource instead")
        .field_path(".spec.objectRetention")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.hierarchicalNamespace) || !self.hierarchicalNamespace.enabled || !has(self.uniformBucketLevelAccess) || self.uniformBucketLevelAccess").message("hierarchicalNamespace needs uniformBucketLevelAccess: GCS refuses a hierarchical namespace on a bucket with object ACLs"),
    validation = Rule::new("!has(self.autoclass) || !self.autoclass.enabled || !has(self.lifecycleRules) || self.lifecycleRules.all(r, r.action.type != 'SetStorageClass')").message("autoclass moves objects between storage classes itself: a lifecycle rule with a SetStorageClass action is not allowed while autoclass is enabled (Delete and AbortIncompleteMultipartUpload are)"),
    validation = Rule::new("!has(self.autoclass) || !self.autoclass.enabled || !has(self.storageClass) || self.storageClass == 'STANDARD'").message("autoclass needs storageClass STANDARD (the default): an autoclass bucket's default class is STANDARD"),
    validation = Rule::new("!has(self.customPlacementConfig) || (has(self.location) && self.location.upperAscii() in ['US', 'EU', 'ASIA'])").message("customPlacementConfig needs location to be the multi-region (US, EU or ASIA) that contains both dataLocations"),
    validation = Rule::new("!has(self.rpo) || self.rpo != 'ASYNC_TURBO' || has(self.customPlacementConfig) || (has(self.location) && self.location.upperAscii() in ['NAM4', 'EUR4', 'EUR5', 'EUR7', 'EUR8', 'ASIA1'])").message("rpo ASYNC_TURBO (turbo replication) needs a dual-region bucket: a customPlacementConfig or a predefined dual-region location (NAM4, EUR4, EUR5, EUR7, EUR8, ASIA1)"),
    validation = Rule::new("!has(self.encryption) || !has(self.encryption.defaultKmsKeyName) || has(self.customPlacementConfig) || !has(self.location) || !(self.location.contains('-') || self.location.upperAscii() in ['US', 'EU', 'ASIA']) || self.encryption.defaultKmsKeyName.matches('^projects/[^/]+/locations/' + (self.location.upperAscii() == 'US' ? 'us' : self.location.upperAscii() == 'EU' ? 'europe' : self.location.upperAscii() == 'ASIA' ? 'asia' : self.location.lowerAscii()) + '/')").message("encryption.defaultKmsKeyName must be a key in the bucket's location: its key ring in the bucket's region (a bucket in europe-west1 needs locations/europe-west1), or in us, europe or asia for the US, EU and ASIA multi-regions"),
    validation = Rule::new("!has(self.access) || !self.access.exists(a, has(a.condition)) || !has(self.uniformBucketLevelAccess) || self.uniformBucketLevelAccess").message("an access grant with a condition needs uniformBucketLevelAccess: IAM conditions apply only to buckets without object ACLs"),
    validation = Rule::new("!has(self.versioning) || !self.versioning || !has(self.retentionPolicy)").message("versioning and retentionPolicy cannot both be set: GCS refuses object versioning on a bucket with a retention policy (soft delete keeps deleted and replaced objects restorable)"),
    validation = Rule::new("!has(self.rpo) || has(self.customPlacementConfig) || (has(self.location) && !self.location.contains('-'))").message("rpo applies to dual- and multi-region buckets only; a bucket in a single region (a location such as europe-west1) has no cross-region replication"),
)]
pub struct GcsSpec {
    /// Logical bucket name, the same in every environment. The physical
    /// bucket is named `<bucketName>-<8-character suffix>`.
    #[schemars(length(max = 63))]
    #[x_kube(
        validation = Rule::new("size(self) >= 3").message("bucketName must be at least 3 characters long"),
        validation = Rule::new("size(self) <= 54").message("bucketName must be at most 54 characters long: the operator appends '-' and an 8-character suffix and GCS allows 63"),
        validation = Rule::new("self.matches('^[a-z0-9][a-z0-9_-]*[a-z0-9]$')").message("bucketName may contain only lowercase letters, digits, '-' and '_', and must start and end with a letter or digit (dots are not supported: they need domain verification)"),
        validation = Rule::new("!self.startsWith('goog')").message("bucketName must not start with 'goog': GCS reserves that prefix"),
        validation = Rule::new("!self.matches('g[o0][o0]+g[l1]e')").message("bucketName must not contain 'google' or a close misspelling of it: GCS refuses such names"),
        validation = Rule::new("self == oldSelf").message("bucketName is immutable: GCS cannot rename a bucket; create a new Gcs resource instead"),
    )]
    pub bucket_name: String,

    /// Google Cloud project that owns the bucket. Defaults to the namespace
    /// annotation `bucketmap.dev/project-id`, then to the operator's
    /// `--default-project`. When the namespace carries the annotation, a
    /// different value here is refused.
    #[serde(rename = "projectID", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    #[x_kube(validation = Rule::new("self.matches('^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$')").message("projectID must be a Google Cloud project id: 6 to 30 lowercase letters, digits or hyphens, starting with a letter"))]
    pub project_id: Option<String>,

    /// Bucket location (region, dual-region or multi-region), e.g. `US`,
    /// `EU`, `europe-west1`. Immutable.
    #[serde(default = "default_location")]
    #[schemars(length(min = 2, max = 64))]
    #[x_kube(
        validation = Rule::new("self.matches('^[A-Za-z0-9-]+$')").message("location must be a GCS location such as US, EU or europe-west1"),
        validation = Rule::new("self.lowerAscii() == oldSelf.lowerAscii()").message("location is immutable: GCS cannot move a bucket; create a new Gcs resource instead"),
    )]
    pub location: String,

    /// Default storage class of new objects.
    #[serde(default)]
    pub storage_class: StorageClass,

    /// Keep noncurrent object versions when objects are overwritten or deleted.
    #[serde(default)]
    pub versioning: bool,

    /// User labels on the bucket. Keys starting with `bucketmap` and the key
    /// `managed-by` are reserved for the operator's ownership labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 60, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    #[x_kube(
        validation = Rule::new("self.all(k, k.matches('^[a-z][a-z0-9_-]{0,62}$'))").message("label keys must be 1 to 63 lowercase letters, digits, '-' or '_', starting with a letter"),
        validation = Rule::new("self.all(k, self[k].matches('^[a-z0-9_-]{0,63}$'))").message("label values must be at most 63 lowercase letters, digits, '-' or '_'"),
        validation = Rule::new("self.all(k, k != 'managed-by' && !k.startsWith('bucketmap'))").message("label keys 'managed-by' and 'bucketmap*' are reserved for the operator's ownership labels"),
    )]
    pub labels: BTreeMap<String, String>,

    /// Object lifecycle rules, applied by GCS.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub lifecycle_rules: Vec<LifecycleRule>,

    /// Uniform bucket-level access (IAM only, no object ACLs).
    #[serde(default = "default_true")]
    pub uniform_bucket_level_access: bool,

    /// Public access prevention.
    #[serde(default)]
    pub public_access_prevention: PublicAccessPrevention,

    /// Minimum time each object is retained (bucket lock): younger objects
    /// cannot be deleted or replaced. Locked only when `isLocked: true`
    /// says so, and never unlocked or shortened once locked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<RetentionPolicy>,

    /// How long deleted objects stay restorable; 0 disables soft delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_delete_policy: Option<SoftDeletePolicy>,

    // The settings below are kept as declared only when the spec names
    // them: an absent one leaves the bucket's value alone, so that an
    // upgrade, an adoption or a restore never removes a key, a CORS rule or
    // a log sink set outside bucketmap. An empty value removes it.
    // The larger of them are boxed: most resources leave them out, and
    // every resource is cached, so an absent one costs a pointer, not its size.
    /// Customer-managed encryption (CMEK): the Cloud KMS key that encrypts
    /// new objects by default. `encryption: {}`: Google-managed keys.
    /// Absent: the bucket's encryption is left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Box<Encryption>>,

    /// Cross-origin resource sharing rules: which origins may make browser
    /// requests to the bucket, with which methods and response headers.
    /// `cors: []`: none. Absent: the bucket's rules are left as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20))]
    pub cors: Option<Vec<Cors>>,

    /// Static website behaviour: the index page appended to directory-like
    /// paths and the page served for missing objects. `website: {}`: none.
    /// Absent: left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub website: Option<Box<Website>>,

    /// Who pays for requests and data egress. Absent: left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing: Option<Billing>,

    /// Usage and storage logs of this bucket, written as objects to another
    /// bucket. `logging: {}`: no logs. Absent: left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<Box<Logging>>,

    /// Place an event-based hold on every new object: it cannot be deleted
    /// or replaced until the hold is released. Absent: left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_event_based_hold: Option<bool>,

    /// Autoclass: GCS moves each object to the storage class that fits its
    /// access pattern. Needs storageClass STANDARD and no SetStorageClass
    /// lifecycle action. Absent: left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoclass: Option<Autoclass>,

    /// Hierarchical namespace (real folders, atomic folder renames). Set at
    /// creation only; needs uniformBucketLevelAccess.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hierarchical_namespace: Option<HierarchicalNamespace>,

    /// A configurable dual-region: the two regions of the multi-region
    /// `location` that hold the data. Set at creation only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_placement_config: Option<Box<CustomPlacementConfig>>,

    /// Object Retention Lock: objects may carry a retention of their own
    /// (a retain-until time) that prevents their deletion. Set at creation
    /// only (GCS enables it when the bucket is created and never disables
    /// it). Absent: not enabled on a new bucket; an existing bucket's is
    /// left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_retention: Option<ObjectRetention>,

    /// Recovery point objective of cross-region replication: DEFAULT, or
    /// ASYNC_TURBO (turbo replication, dual-region buckets only). Absent:
    /// GCS's default on a new bucket; an existing bucket's is left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpo: Option<Rpo>,

    /// Bucket IP filtering: with mode Enabled, GCS refuses requests for
    /// the bucket and its objects unless they come from the public ranges
    /// or VPC networks listed (a GKE cluster's pods: its VPC network). The
    /// operator needs storage.buckets.exemptFromIpFilter to keep managing
    /// the bucket, and `forceDestroy` works only from an allowed address.
    /// `{mode: Disabled}` turns it off. Absent: left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_filter: Option<Box<IpFilter>>,

    /// What happens to the bucket when this resource is deleted (see
    /// [`DeletionPolicy`]; the schema shows the type's description).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,

    /// On deletion, delete every object version first. Without it a
    /// non-empty bucket is kept and the deletion waits.
    #[serde(default)]
    pub force_destroy: bool,

    /// Take an existing bucket under management instead of creating one.
    /// Set at creation only. The bucket must be in the resource's project and
    /// be unowned (or already owned by this cluster identity, namespace and
    /// name); its settings are then made as declared, every change reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<Box<Adopt>>,

    /// Who may use the bucket: IAM roles on the bucket for ServiceAccounts of
    /// this namespace (through GKE Workload Identity) or for IAM principals
    /// the namespace allows. The operator grants exactly these, revokes what
    /// it granted when a grant is removed, and never touches other bindings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub access: Vec<AccessGrant>,

    /// Pub/Sub notifications of object changes: GCS publishes a message to
    /// each topic for the events listed. The topics must exist and the
    /// project's Cloud Storage service agent must be allowed to publish to
    /// them (`roles/pubsub.publisher`); the operator reports a topic it
    /// cannot use in the `Notifications` condition and creates none.
    /// Removing an entry deletes the configuration the operator made;
    /// configurations made outside bucketmap are left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    #[x_kube(validation = Rule::new("self.all(a, self.exists_one(b, b == a))").message("notifications must not list the same configuration twice: GCS would publish every event twice"))]
    pub notifications: Vec<Notification>,
}

/// A Pub/Sub topic name, with or without the `//pubsub.googleapis.com/` prefix.
const TOPIC: &str = r"^(//pubsub[.]googleapis[.]com/)?projects/([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]/topics/[A-Za-z][-A-Za-z0-9._~+%]{2,254}$";

/// One Pub/Sub notification configuration of the bucket (the GCS JSON API's
/// `notifications` resource).
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// The topic GCS publishes to: `projects/PROJECT/topics/TOPIC` (or with
    /// the `//pubsub.googleapis.com/` prefix GCS shows).
    #[schemars(length(max = 340))]
    #[x_kube(
        validation = Rule::new(format!("self.matches('{TOPIC}')")).message("notifications[].topic must be a Pub/Sub topic of the form projects/PROJECT/topics/TOPIC (the topic name starts with a letter and has 3 to 255 letters, digits or - . _ ~ + %)"),
        validation = Rule::new("!self.contains('/topics/goog')").message("notifications[].topic: Pub/Sub reserves topic names that start with 'goog'"),
    )]
    pub topic: String,
    /// What the message carries: `JSON_API_V1` (the object's metadata, the
    /// default) or `NONE` (attributes only).
    #[serde(default)]
    pub payload_format: PayloadFormat,
    /// The events to publish; absent or empty: all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    #[x_kube(validation = Rule::new("self.all(a, self.exists_one(b, b == a))").message("notifications[].eventTypes must not list an event twice"))]
    pub event_types: Vec<NotificationEvent>,
    /// Only objects whose names start with this prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub object_name_prefix: Option<String>,
    /// Attributes added to every message of this configuration.
    /// At most 10; values have at most 1024 characters (a Pub/Sub limit).
    /// Keys must not start with `goog` (Pub/Sub reserves them): the
    /// operator refuses such a configuration (a rule at admission would
    /// exceed the API server's cost budget, map keys having no length
    /// limit there).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 10), extend("additionalProperties" = {"type": "string", "maxLength": 1024}))]
    pub custom_attributes: BTreeMap<String, String>,
}

/// The content of a notification's messages.
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
// Variant doc comments would turn the schema's `enum` into a `oneOf`.
#[allow(missing_docs, clippy::upper_case_acronyms)]
pub enum PayloadFormat {
    #[default]
    #[serde(rename = "JSON_API_V1")]
    JsonApiV1,
    #[serde(rename = "NONE")]
    None,
}

impl PayloadFormat {
    /// The name GCS uses.
    pub fn as_gcs(self) -> &'static str {
        match self {
            PayloadFormat::JsonApiV1 => "JSON_API_V1",
            PayloadFormat::None => "NONE",
        }
    }
}

/// An object event GCS can publish.
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
// Variant doc comments would turn the schema's `enum` into a `oneOf`.
#[allow(missing_docs)]
pub enum NotificationEvent {
    ObjectFinalize,
    ObjectMetadataUpdate,
    ObjectDelete,
    ObjectArchive,
}

impl NotificationEvent {
    /// The name GCS uses.
    pub fn as_gcs(self) -> &'static str {
        match self {
            NotificationEvent::ObjectFinalize => "OBJECT_FINALIZE",
            NotificationEvent::ObjectMetadataUpdate => "OBJECT_METADATA_UPDATE",
            NotificationEvent::ObjectDelete => "OBJECT_DELETE",
            NotificationEvent::ObjectArchive => "OBJECT_ARCHIVE",
        }
    }
}

/// An existing bucket to adopt.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Adopt {
    /// The physical name of the bucket (`gcloud storage buckets list`).
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$')").message("adopt.bucket must be the name of an existing GCS bucket: 3 to 63 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit (dotted names are not supported)"))]
    pub bucket: String,
}

impl GcsSpec {
    /// What happens to the bucket when the resource is deleted: as declared,
    /// else `Orphan` for an adopted bucket and `Delete` for a created one.
    pub fn effective_deletion_policy(&self) -> DeletionPolicy {
        self.deletion_policy.unwrap_or(if self.adopt.is_some() {
            DeletionPolicy::Orphan
        } else {
            DeletionPolicy::Delete
        })
    }
}

/// One grant: a role on the bucket for a ServiceAccount of the resource's
/// namespace or for an IAM principal.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.serviceAccount) != has(self.member)").message("an access grant names exactly one of serviceAccount (a ServiceAccount of this namespace) or member (an IAM principal)"),
    validation = Rule::new("!has(self.condition) || !self.role.startsWith('roles/storage.legacy')").message("an IAM condition cannot be used with the legacy roles (roles/storage.legacy*): IAM refuses it"),
)]
pub struct AccessGrant {
    /// Name of a Kubernetes ServiceAccount in this resource's namespace. Its
    /// IAM identity is the Google service account of its annotation
    /// `iam.gke.io/gcp-service-account`, else its Workload Identity
    /// Federation principal. Granted once the ServiceAccount exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("serviceAccount must be the name of a ServiceAccount in this namespace (no namespace, ':' or '/'): a grant can only name ServiceAccounts of the resource's own namespace"))]
    pub service_account: Option<String>,

    /// An IAM principal outside the cluster (`user:`, `group:`,
    /// `serviceAccount:`, `domain:`, `principal://`, `principalSet://`).
    /// Refused unless the namespace's annotation `bucketmap.dev/allowed-members`
    /// allows it; `allUsers` and `allAuthenticatedUsers` are always refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(
        validation = Rule::new("self != 'allUsers' && self != 'allAuthenticatedUsers'").message("allUsers and allAuthenticatedUsers are never granted: a bucket managed by bucketmap is never public"),
        validation = Rule::new("self.matches('^(user|group|serviceAccount|domain):[^ ,:]+$') || self.matches('^principal(Set)?://iam[.]googleapis[.]com/[^ ,]+$')").message("member must be an IAM principal: user:EMAIL, group:EMAIL, serviceAccount:EMAIL, domain:DOMAIN, principal://iam.googleapis.com/... or principalSet://iam.googleapis.com/..."),
    )]
    pub member: Option<String>,

    /// The role: objectViewer (read), objectCreator (create), objectUser
    /// (read, write, delete) or objectAdmin (everything on objects,
    /// including their IAM), granted as `roles/storage.<role>`. Or a full
    /// role name that the namespace's annotation `bucketmap.dev/allowed-roles`
    /// lists: a predefined Cloud Storage role (`roles/storage.NAME`) or a
    /// custom role (`projects/P/roles/R`, `organizations/O/roles/R`).
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("self in ['objectViewer', 'objectCreator', 'objectUser', 'objectAdmin'] || self.matches('^roles/storage[.][A-Za-z.]+$') || self.matches('^(projects/[^/]+|organizations/[0-9]+)/roles/[A-Za-z0-9_.]+$')").message("role must be objectViewer, objectCreator, objectUser or objectAdmin (granted as roles/storage.<role>), a Cloud Storage role (roles/storage.NAME) or a custom role (projects/PROJECT/roles/NAME, organizations/ORG/roles/NAME)"))]
    pub role: String,

    /// An IAM condition: the grant holds only while its expression is true
    /// (a prefix of object names, a time window). Needs
    /// uniformBucketLevelAccess; not with the legacy roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<IamCondition>,
}

/// An IAM condition on a grant (`google.type.Expr`).
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "camelCase")]
pub struct IamCondition {
    /// A short title, shown by IAM.
    #[schemars(length(min = 1, max = 100))]
    pub title: String,
    /// What the condition is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub description: Option<String>,
    /// The CEL expression, e.g.
    /// `resource.name.startsWith('projects/_/buckets/BUCKET/objects/reports/')`
    /// or `request.time < timestamp('2030-01-01T00:00:00Z')`.
    #[schemars(length(min = 1, max = 12800))]
    pub expression: String,
}

fn default_location() -> String {
    "US".to_owned()
}

fn default_true() -> bool {
    true
}

/// Default storage class of a bucket: STANDARD, NEARLINE, COLDLINE or
/// ARCHIVE (GCS's classes, by falling access frequency and storage price).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
// Variant doc comments would turn the schema's `enum` into a `oneOf`.
#[allow(missing_docs)]
pub enum StorageClass {
    #[default]
    Standard,
    Nearline,
    Coldline,
    Archive,
}

impl StorageClass {
    /// The name GCS uses.
    pub fn as_gcs(self) -> &'static str {
        match self {
            StorageClass::Standard => "STANDARD",
            StorageClass::Nearline => "NEARLINE",
            StorageClass::Coldline => "COLDLINE",
            StorageClass::Archive => "ARCHIVE",
        }
    }
}

/// Public access prevention setting.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PublicAccessPrevention {
    /// Data can never be made public.
    #[default]
    Enforced,
    /// Inherit the organization policy.
    Inherited,
}

impl PublicAccessPrevention {
    /// The name GCS uses.
    pub fn as_gcs(self) -> &'static str {
        match self {
            PublicAccessPrevention::Enforced => "enforced",
            PublicAccessPrevention::Inherited => "inherited",
        }
    }
}

/// What happens to the bucket when this resource is deleted: `Delete`
/// (the default for a bucket bucketmap created), `Orphan` (keep it with its
/// ownership labels, so that a Gcs of the same cluster identity, namespace
/// and name finds it again; the default for an adopted bucket) or `Abandon`
/// (keep it and remove bucketmap's labels: nobody's any more, free to be
/// adopted elsewhere).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeletionPolicy {
    /// Delete the bucket (only if it carries this cluster's ownership, and
    /// only if it is empty unless `forceDestroy` is set).
    #[default]
    Delete,
    /// Leave the bucket in place, still labelled as this cluster's: a
    /// re-created resource finds it again.
    Orphan,
    /// Leave the bucket in place and remove bucketmap's labels from it.
    Abandon,
}

/// Minimum retention of objects.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    /// Retention period in seconds (1 second to 100 years). While the
    /// policy is locked it may grow, never shrink.
    #[schemars(range(min = 1, max = 3_155_760_000i64))]
    pub retention_period_seconds: i64,
    /// Lock the policy: IRREVERSIBLE. Once locked, GCS never removes or
    /// shortens it, and the bucket cannot be deleted until every object in
    /// it is older than the retention period (`forceDestroy` included).
    /// The operator locks only when this is true, and reports the lock as
    /// an event; true cannot be changed back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_locked: Option<bool>,
}

/// Object Retention Lock of a bucket.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRetention {
    /// `Enabled`: objects may carry a retention of their own.
    pub mode: ObjectRetentionMode,
}

/// Object retention mode: `Enabled` is the one GCS knows.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
// Variant doc comments would turn the schema's `enum` into a `oneOf`.
#[allow(missing_docs)]
pub enum ObjectRetentionMode {
    Enabled,
}

/// Soft delete policy.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SoftDeletePolicy {
    /// Seconds a deleted object stays restorable: 0 disables soft delete,
    /// otherwise 7 to 90 days (604800 to 7776000).
    #[x_kube(validation = Rule::new("self == 0 || (self >= 604800 && self <= 7776000)").message("softDeletePolicy.retentionDurationSeconds must be 0 (disabled) or between 604800 (7 days) and 7776000 (90 days)"))]
    pub retention_duration_seconds: i64,
}

/// Customer-managed encryption of a bucket.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Encryption {
    /// The Cloud KMS key,
    /// `projects/PROJECT/locations/LOCATION/keyRings/RING/cryptoKeys/KEY`.
    /// It must be in the bucket's location, and the project's Cloud Storage
    /// service agent needs `roles/cloudkms.cryptoKeyEncrypterDecrypter` on it.
    /// Absent: Google-managed keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new("self.matches('^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$')").message("encryption.defaultKmsKeyName must be a Cloud KMS key name of the form projects/PROJECT/locations/LOCATION/keyRings/RING/cryptoKeys/KEY (a key, not a key version)"))]
    pub default_kms_key_name: Option<String>,
}

/// One CORS rule.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Cors {
    /// Origins allowed to make cross-origin requests (`https://example.com`);
    /// `*` means any origin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20), extend("items" = {"type": "string", "maxLength": 256}))]
    pub origin: Vec<String>,
    /// HTTP methods allowed (`GET`, `PUT`, ...); `*` means any method.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10), extend("items" = {"type": "string", "maxLength": 16}))]
    #[x_kube(validation = Rule::new("self.all(m, m == '*' || m.matches('^[A-Z]+$'))").message("CORS methods are HTTP methods in upper case (GET, HEAD, PUT, POST, DELETE, OPTIONS, PATCH) or *"))]
    pub method: Vec<String>,
    /// Response headers the browser may expose to the page.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20), extend("items" = {"type": "string", "maxLength": 128}))]
    #[x_kube(validation = Rule::new("self.all(h, h.matches('^[A-Za-z0-9!#$%&*+.^_`|~-]+$'))").message("CORS response headers must be HTTP header names"))]
    pub response_header: Vec<String>,
    /// How long a browser may cache the preflight response, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_age_seconds: Option<i32>,
}

/// Static website settings.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Website {
    /// Object name suffix served for a directory-like path (`index.html`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub main_page_suffix: Option<String>,
    /// Object served, with status 404, when the requested one does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub not_found_page: Option<String>,
}

/// Billing settings.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Billing {
    /// Requester pays: callers are billed for their requests and egress and
    /// must name a billing project.
    pub requester_pays: bool,
}

/// Access and storage logging.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.logBucket) || !has(self.logObjectPrefix)").message("logging.logObjectPrefix needs logging.logBucket"))]
pub struct Logging {
    /// The physical name of the bucket that receives the logs. Absent: no logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]$')").message("logging.logBucket must be the name of a GCS bucket: 3 to 63 lowercase letters, digits, '-', '_' or '.', starting and ending with a letter or digit"))]
    pub log_bucket: Option<String>,
    /// Prefix of the log objects' names; GCS uses the bucket's name when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 900))]
    pub log_object_prefix: Option<String>,
}

/// Autoclass settings.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.enabled || !has(self.terminalStorageClass)").message("autoclass.terminalStorageClass applies only when autoclass is enabled"))]
pub struct Autoclass {
    /// Turn autoclass on or off.
    pub enabled: bool,
    /// The coldest class objects move to: NEARLINE (GCS's default) or ARCHIVE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_storage_class: Option<TerminalStorageClass>,
}

/// The coldest class autoclass moves objects to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
// Variant doc comments would turn the schema's `enum` into a `oneOf`.
#[allow(missing_docs)]
pub enum TerminalStorageClass {
    Nearline,
    Archive,
}

impl TerminalStorageClass {
    /// The name GCS uses.
    pub fn as_gcs(self) -> &'static str {
        match self {
            TerminalStorageClass::Nearline => "NEARLINE",
            TerminalStorageClass::Archive => "ARCHIVE",
        }
    }
}

/// An IPv4 or IPv6 range in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`).
const CIDR: &str = r"^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])[.]){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])/([0-9]|[12][0-9]|3[0-2])$|^[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*/([0-9]|[1-9][0-9]|1[01][0-9]|12[0-8])$";

/// Bucket IP filtering.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.mode != 'Enabled' || has(self.publicNetworkSource) || (has(self.vpcNetworkSources) && size(self.vpcNetworkSources) > 0)").message("ipFilter.mode Enabled needs a publicNetworkSource or vpcNetworkSources: with neither, GCS refuses every request for the bucket and its objects, the applications' included"),
)]
pub struct IpFilter {
    /// Enabled: the rules apply. Disabled: they are kept but not applied.
    pub mode: IpFilterMode,
    /// Public addresses allowed (requests from the internet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_network_source: Option<PublicNetworkSource>,
    /// VPC networks allowed, each with the ranges of its addresses allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 25))]
    pub vpc_network_sources: Option<Vec<VpcNetworkSource>>,
    /// Allow VPC networks of another organization than the bucket's (GCS
    /// then does not check that they exist). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_cross_org_vpcs: Option<bool>,
    /// Let Google Cloud services' service agents reach the bucket whatever
    /// the rules (e.g. for transfers or BigQuery). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_all_service_agent_access: Option<bool>,
}

/// Whether the IP filter applies.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
// Variant doc comments would turn the schema's `enum` into a `oneOf`.
#[allow(missing_docs)]
pub enum IpFilterMode {
    Enabled,
    Disabled,
}

impl IpFilterMode {
    /// The name GCS uses.
    pub fn as_gcs(self) -> &'static str {
        match self {
            IpFilterMode::Enabled => "Enabled",
            IpFilterMode::Disabled => "Disabled",
        }
    }
}

/// Public addresses an IP filter allows.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PublicNetworkSource {
    /// Ranges in CIDR notation (`203.0.113.0/24`, `2001:db8::/32`).
    #[schemars(length(max = 200), extend("items" = {"type": "string", "maxLength": 64}))]
    #[x_kube(validation = Rule::new(format!("self.all(r, r.matches('{CIDR}'))")).message("ipFilter ranges must be IPv4 or IPv6 ranges in CIDR notation, such as 203.0.113.0/24 or 2001:db8::/32"))]
    pub allowed_ip_cidr_ranges: Vec<String>,
}

/// A VPC network an IP filter allows.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VpcNetworkSource {
    /// The network, `projects/PROJECT/global/networks/NETWORK`.
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("self.matches('^projects/[^/]+/global/networks/[^/]+$')").message("ipFilter.vpcNetworkSources[].network must be a VPC network name of the form projects/PROJECT/global/networks/NETWORK"))]
    pub network: String,
    /// Ranges of the network's addresses allowed, in CIDR notation (the
    /// subnets or the pod ranges of a GKE cluster).
    #[schemars(length(min = 1, max = 200), extend("items" = {"type": "string", "maxLength": 64}))]
    #[x_kube(validation = Rule::new(format!("self.all(r, r.matches('{CIDR}'))")).message("ipFilter ranges must be IPv4 or IPv6 ranges in CIDR notation, such as 10.0.0.0/8 or 2001:db8::/32"))]
    pub allowed_ip_cidr_ranges: Vec<String>,
}

/// Hierarchical namespace settings.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HierarchicalNamespace {
    /// Create the bucket with a hierarchical namespace.
    pub enabled: bool,
}

/// A configurable dual-region.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CustomPlacementConfig {
    /// The two regions that hold the data (`US-EAST1`, `US-WEST1`), both in
    /// the multi-region `location`.
    #[schemars(length(min = 2, max = 2), extend("items" = {"type": "string", "maxLength": 32}))]
    #[x_kube(validation = Rule::new("self.all(l, l.matches('^[A-Za-z]+-[A-Za-z]+[0-9]+$'))").message("customPlacementConfig.dataLocations must be two GCS regions such as US-EAST1 and US-WEST1"))]
    pub data_locations: Vec<String>,
}

/// Recovery point objective of cross-region replication.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
// Variant doc comments would turn the schema's `enum` into a `oneOf`.
#[allow(missing_docs)]
pub enum Rpo {
    Default,
    AsyncTurbo,
}

impl Rpo {
    /// The name GCS uses.
    pub fn as_gcs(self) -> &'static str {
        match self {
            Rpo::Default => "DEFAULT",
            Rpo::AsyncTurbo => "ASYNC_TURBO",
        }
    }
}

/// One object lifecycle rule.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.action.type != 'AbortIncompleteMultipartUpload' || !(has(self.condition.createdBefore) || has(self.condition.customTimeBefore) || has(self.condition.daysSinceCustomTime) || has(self.condition.isLive) || has(self.condition.numNewerVersions) || has(self.condition.daysSinceNoncurrentTime) || has(self.condition.noncurrentTimeBefore) || has(self.condition.matchesStorageClass))").message("an AbortIncompleteMultipartUpload rule takes only the conditions ageDays, matchesPrefix and matchesSuffix: GCS refuses the others for this action"))]
pub struct LifecycleRule {
    /// What happens to the objects the condition selects.
    pub action: LifecycleAction,
    /// Which objects the action applies to; every field given must match.
    pub condition: LifecycleCondition,
}

/// What a lifecycle rule does.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(self.type == 'SetStorageClass') == has(self.storageClass)").message("lifecycle action storageClass is required for SetStorageClass and not allowed otherwise"))]
pub struct LifecycleAction {
    /// The action: Delete, SetStorageClass or AbortIncompleteMultipartUpload.
    #[serde(rename = "type")]
    pub kind: LifecycleActionType,
    /// The class objects move to; required for SetStorageClass only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<StorageClass>,
}

/// Lifecycle action kinds supported by GCS: delete the object, change its
/// storage class, or abort an incomplete multipart (XML API) upload.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
// Variant doc comments would turn the schema's `enum` into a `oneOf`.
#[allow(missing_docs)]
pub enum LifecycleActionType {
    Delete,
    SetStorageClass,
    AbortIncompleteMultipartUpload,
}

impl LifecycleActionType {
    /// The name GCS uses.
    pub fn as_gcs(self) -> &'static str {
        match self {
            LifecycleActionType::Delete => "Delete",
            LifecycleActionType::SetStorageClass => "SetStorageClass",
            LifecycleActionType::AbortIncompleteMultipartUpload => "AbortIncompleteMultipartUpload",
        }
    }
}

/// When a lifecycle rule applies. Every field given must hold (they combine
/// with AND); within `matchesPrefix`, `matchesSuffix` and
/// `matchesStorageClass` one entry is enough (OR): `matchesPrefix: [logs/]`
/// with `matchesSuffix: [.gz, .zip]` selects `logs/a.gz` and `logs/b.zip`,
/// not `logs/c.txt` nor `tmp/d.gz`.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.ageDays) || has(self.createdBefore) || has(self.customTimeBefore) || has(self.daysSinceCustomTime) || has(self.isLive) || has(self.numNewerVersions) || has(self.daysSinceNoncurrentTime) || has(self.noncurrentTimeBefore) || has(self.matchesStorageClass) || has(self.matchesPrefix) || has(self.matchesSuffix)").message("a lifecycle condition needs at least one field"))]
pub struct LifecycleCondition {
    /// Age of the object in days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub age_days: Option<i32>,
    /// Objects created before this date (YYYY-MM-DD, midnight UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$"))]
    pub created_before: Option<String>,
    /// Objects whose custom time (the `customTime` an application sets on
    /// an object) is before this date (YYYY-MM-DD, midnight UTC). Objects
    /// without a custom time never match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$"))]
    pub custom_time_before: Option<String>,
    /// Days since the object's custom time. Objects without a custom time
    /// never match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub days_since_custom_time: Option<i32>,
    /// true: live objects only; false: noncurrent versions only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_live: Option<bool>,
    /// Versions that have at least this many newer versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub num_newer_versions: Option<i32>,
    /// Days since the object became noncurrent (versioned buckets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub days_since_noncurrent_time: Option<i32>,
    /// Versions that became noncurrent before this date (YYYY-MM-DD,
    /// midnight UTC; versioned buckets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$"))]
    pub noncurrent_time_before: Option<String>,
    /// Objects in one of these storage classes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches_storage_class: Vec<StorageClass>,
    /// Objects whose name starts with one of these prefixes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), extend("items" = {"type": "string", "minLength": 1, "maxLength": 1024}))]
    pub matches_prefix: Vec<String>,
    /// Objects whose name ends with one of these suffixes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), extend("items" = {"type": "string", "minLength": 1, "maxLength": 1024}))]
    pub matches_suffix: Vec<String>,
}

/// Observed state of a `Gcs` resource.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GcsStatus {
    /// Physical (globally unique) bucket name. Written before the bucket is
    /// created, so a crash or a lost response never creates a second bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_full_name: Option<String>,
    /// Logical bucket name (copy of `spec.bucketName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_name: Option<String>,
    /// Project that owns the bucket.
    #[serde(rename = "projectID", default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// `gs://` URL of the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Naming attempt the physical name was derived from; it grows only when
    /// a name turns out to belong to somebody else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_attempt: Option<u32>,
    /// When the operator saw the bucket created. Set once; a later missing
    /// bucket means it was deleted out of band.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_time: Option<Time>,
    /// The Service Binding Secret of this bucket (Provisioned Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingReference>,
    /// The IAM grants the operator made on the bucket (and revokes when they
    /// leave `spec.access` or the resource is deleted). Recorded before the
    /// policy is written, so a restart never forgets one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access: Vec<GrantedAccess>,
    /// The notification configurations the operator made, recorded before
    /// they are made; it deletes them when they leave `spec.notifications`.
    /// They stay with a bucket that is orphaned or abandoned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifications: Vec<RecordedNotification>,
    /// Latest observations; `Ready` is the one to wait for, `Access` says
    /// whether every grant of `spec.access` is in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The value of the annotation `bucketmap.dev/reconcile-requested-at`
    /// that the latest reconcile handled: when it equals the annotation,
    /// the bucket was checked after the request (`Ready` says how it went).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,
}

/// A grant the operator made: an IAM member and a role on the bucket.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GrantedAccess {
    /// The IAM member (`serviceAccount:...`, `principal://...`, ...).
    pub member: String,
    /// The IAM role (`roles/storage.objectViewer`, ...).
    pub role: String,
    /// The ServiceAccount of this namespace the member stands for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// The IAM condition of the grant, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<IamCondition>,
}

/// A notification configuration the operator made on the bucket: the
/// fields of [`Notification`] without its admission rules (the status is
/// written by the operator only), and the id GCS gave it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RecordedNotification {
    /// The configuration's id in GCS (absent until GCS assigned it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The topic, as declared.
    pub topic: String,
    /// The content of its messages.
    #[serde(default)]
    pub payload_format: PayloadFormat,
    /// Its events (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_types: Vec<NotificationEvent>,
    /// Its object name prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_name_prefix: Option<String>,
    /// Its message attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom_attributes: BTreeMap<String, String>,
}

impl RecordedNotification {
    /// `config`, with `id` once GCS gave it one.
    pub fn new(config: &Notification, id: Option<String>) -> Self {
        RecordedNotification {
            id,
            topic: config.topic.clone(),
            payload_format: config.payload_format,
            event_types: config.event_types.clone(),
            object_name_prefix: config.object_name_prefix.clone(),
            custom_attributes: config.custom_attributes.clone(),
        }
    }

    /// The configuration recorded.
    pub fn config(&self) -> Notification {
        Notification {
            topic: self.topic.clone(),
            payload_format: self.payload_format,
            event_types: self.event_types.clone(),
            object_name_prefix: self.object_name_prefix.clone(),
            custom_attributes: self.custom_attributes.clone(),
        }
    }
}

/// Reference to a Service Binding Secret in the same namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct BindingReference {
    /// Name of the Secret.
    pub name: String,
}

impl Gcs {
    /// The `Ready` condition, if any.
    pub fn ready_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
    }

    /// Whether the `Ready` condition is `True`.
    pub fn is_ready(&self) -> bool {
        self.ready_condition().is_some_and(|c| c.status == "True")
    }
}

/// Length of the physical suffix including its separator.
pub const SUFFIX_WITH_SEPARATOR: usize = SUFFIX_LEN + 1;
const _: () = assert!(MAX_LOGICAL_NAME_LEN + SUFFIX_WITH_SEPARATOR == 63);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn defaults_fill_a_minimal_spec() {
        let spec: GcsSpec = serde_json::from_value(serde_json::json!({"bucketName": "photos"}))
            .expect("minimal spec parses");
        assert_eq!(spec.location, "US");
        assert_eq!(spec.storage_class, StorageClass::Standard);
        assert!(spec.uniform_bucket_level_access);
        assert_eq!(
            spec.public_access_prevention,
            PublicAccessPrevention::Enforced
        );
        assert_eq!(spec.deletion_policy, None);
        assert_eq!(spec.effective_deletion_policy(), DeletionPolicy::Delete);
        assert!(!spec.force_destroy);
        assert!(!spec.versioning);
    }

    #[test]
    fn an_adopted_bucket_is_kept_unless_the_spec_says_otherwise() {
        let adopted: GcsSpec = serde_json::from_value(
            serde_json::json!({"bucketName": "photos", "adopt": {"bucket": "legacy-photos"}}),
        )
        .expect("adopting spec parses");
        assert_eq!(adopted.effective_deletion_policy(), DeletionPolicy::Orphan);
        let deleting = GcsSpec {
            deletion_policy: Some(DeletionPolicy::Delete),
            ..adopted
        };
        assert_eq!(deleting.effective_deletion_policy(), DeletionPolicy::Delete);
    }

    #[test]
    fn crd_has_the_fixed_names_and_status_subresource() {
        let crd = serde_json::to_value(Gcs::crd()).expect("crd serializes");
        assert_eq!(crd["spec"]["group"], GROUP);
        assert_eq!(crd["spec"]["names"]["plural"], "gcs");
        assert_eq!(crd["spec"]["names"]["kind"], "Gcs");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        assert!(version["subresources"]["status"].is_object());
        let conditions = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
            ["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(conditions["x-kubernetes-list-map-keys"][0], "type");
    }
}
