//! The reconciler: `Gcs` resources into buckets.
//!
//! [`run`] builds the watches and drives the controller (module `watches`).
//! [`reconcile`] wraps [`kube::runtime::finalizer()`]: the finalizer is added
//! before any GCS call (usually it is there already: the finalizer webhook,
//! [`crate::webhook::finalizer`], sets it as the resource is created, which
//! saves a write and a second reconcile per resource); `apply` creates and keeps the bucket as declared, in
//! short named phases (module `apply`), and grants `spec.access` on it
//! (module `access`); `cleanup` revokes the grants and deletes the bucket
//! safely (module `cleanup`). Status is computed, compared with what the object already
//! shows, and written (server-side apply on the status subresource) only
//! when it changed (module `status`). [`error_policy`] backs off per object.
//! Events are queued, never awaited ([`crate::events`]).

mod access;
mod apply;
mod changes;
mod cleanup;
#[cfg(test)]
mod fast_tests;
mod finalizer;
mod map_readers;
mod namespaces;
mod notifications;
mod places;
mod resync;
mod scope;
mod status;
mod watches;

pub(crate) use apply::{Refusal, default_project, project_for};

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use tracing::{debug, instrument, warn};

use crate::bucket_map::{self, BucketMaps};
use crate::crd::Gcs;
use crate::gcs::{GcsClient, Pacer};
use crate::iam::WorkloadIdentity;
use crate::metrics::Metrics;
use crate::publish::CachedBinding;
use crate::slots::Slots;
use crate::{Error, Result};

pub use map_readers::MAP_READER_BINDING;
pub use places::{PLACES_PREFIX, places_name};
pub use watches::run;

pub use crate::FIELD_MANAGER;
/// Namespace annotation naming the project of the namespace's buckets.
pub const PROJECT_ANNOTATION: &str = "bucketmap.dev/project-id";

/// Operator settings (from flags).
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// This cluster's identity ([`crate::cluster_id`]): with a resource's
    /// namespace and name, the owner of its bucket.
    pub cluster_id: String,
    /// Project used when neither the spec nor the namespace names one.
    pub default_project: Option<String>,
    /// Period of the drift check: each resource is reconciled once per
    /// period, at an offset within it fixed by its uid (module `resync`).
    pub resync: Duration,
    /// How many candidate names to try before giving up with `NameConflict`.
    pub max_name_attempts: u32,
    /// Watch only this namespace (all namespaces when `None` and
    /// `watch_namespaces` is empty).
    pub namespace: Option<String>,
    /// Watch only these namespaces (with `namespace`, if set).
    pub watch_namespaces: Vec<String>,
    /// Publish a Service Binding Secret per resource (and watch them).
    /// Off, the operator reads and writes no Secret outside its namespace.
    pub service_binding: bool,
    /// Reconciles doing work at once (0: unbounded); see [`crate::slots`].
    pub concurrency: u16,
    /// Minimum interval between bucket creates/deletes in one project.
    pub bucket_ops_interval: Option<Duration>,
    /// Name of the per-namespace ConfigMap holding the bucket map.
    pub map_name: String,
    /// The ClusterRole bound in each namespace with a `Gcs` so that its
    /// ServiceAccounts may read the bucket map (module `map_readers`);
    /// `None`: no RoleBinding is managed.
    pub map_reader_role: Option<String>,
    /// Budget of one namespace's bucket map (see [`crate::bucket_map`]).
    pub map_max_bytes: usize,
    /// Pause between the first claim of a burst and the map write.
    pub map_debounce: Duration,
    /// Bucket map writes in flight at once over all namespaces (0: no limit).
    pub map_writers: usize,
    /// The cluster's Workload Identity Federation pool: ServiceAccounts
    /// without the `iam.gke.io/gcp-service-account` annotation are granted
    /// as its principals. Without it they need the annotation.
    pub workload_identity: Option<WorkloadIdentity>,
    /// Which namespaces may use which projects, classes, locations
    /// ([`crate::tenancy`]).
    pub tenancy: Arc<crate::tenancy::Policy>,
    /// The operator's own namespace: where the places of namespaces whose
    /// buckets the tenancy policy limits are kept (module `places`).
    pub operator_namespace: String,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            // Embedders (tests, cargo dev) that do not resolve one.
            cluster_id: "default".to_owned(),
            default_project: None,
            resync: Duration::from_secs(600),
            max_name_attempts: 5,
            namespace: None,
            watch_namespaces: Vec::new(),
            service_binding: true,
            concurrency: 32,
            bucket_ops_interval: Some(Duration::from_secs(2)),
            map_name: "bucketmap".to_owned(),
            map_reader_role: None,
            map_max_bytes: bucket_map::DEFAULT_MAX_MAP_BYTES,
            map_debounce: bucket_map::DEFAULT_DEBOUNCE,
            map_writers: bucket_map::DEFAULT_WRITERS,
            workload_identity: None,
            tenancy: Arc::default(),
            operator_namespace: "bucketmap-system".to_owned(),
        }
    }
}

impl OperatorConfig {
    /// The namespaces watched, sorted and without duplicates; `None`: all.
    pub fn watched_namespaces(&self) -> Option<Vec<String>> {
        let mut all: Vec<String> = self
            .namespace
            .iter()
            .chain(&self.watch_namespaces)
            .filter(|ns| !ns.is_empty())
            .cloned()
            .collect();
        all.sort();
        all.dedup();
        (!all.is_empty()).then_some(all)
    }
}

/// State shared by all reconciles.
pub struct Context {
    /// The Kubernetes API.
    pub client: kube::Client,
    /// Bucket operations (StorageControl).
    pub gcs: GcsClient,
    /// Kubernetes Events about `Gcs` resources.
    pub events: crate::events::Events,
    /// The operator's Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// The command line's settings.
    pub config: OperatorConfig,
    pacer: Pacer,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Live reads of namespaces, for a project chosen now.
    namespace_reads: Arc<namespaces::NamespaceReads>,
    maps: Arc<BucketMaps>,
    /// What is known of the binding Secrets (see [`CachedBinding`]).
    secrets: Store<CachedBinding>,
    /// The ServiceAccounts' metadata (their Workload Identity annotation).
    service_accounts: Store<PartialObjectMeta<ServiceAccount>>,
    /// The RoleBindings named [`MAP_READER_BINDING`] (empty when the
    /// operator manages none).
    role_bindings: Store<k8s_openapi::api::rbac::v1::RoleBinding>,
    /// The namespace and ServiceAccount caches hold everything: projects
    /// and identities can be resolved.
    namespaces_synced: Arc<AtomicBool>,
    failures: FailureCounts,
    /// This process's status writes the resource cache may not show yet.
    own_writes: Arc<status::OwnWrites>,
    /// Reconciles doing work at once (waiting for a map write does not count).
    slots: Slots,
    /// Per namespace, held while a resource takes one of its places
    /// (module `places`), so that this process never conflicts with itself
    /// there: the API server serializes the replicas.
    count_locks: CountLocks,
}

/// One lock per namespace whose buckets are counted.
#[derive(Default)]
pub(super) struct CountLocks(
    std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
);

impl CountLocks {
    /// Waits for namespace `ns`'s lock.
    pub(super) async fn lock(&self, ns: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.0.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(ns.to_owned()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

/// Entry point of one reconciliation. Its outcome is counted here, before
/// the reconcile counts as ended, so a reader of the metrics that sees it
/// ended sees its failure too.
#[instrument(skip_all, fields(gcs = %obj.name_any(), namespace = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<Gcs>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    let result = reconcile_one(&obj, &ctx).await;
    if let Err(error) = &result {
        if error.is_expected_conflict() {
            ctx.metrics.reconcile_conflict();
        } else {
            ctx.metrics.reconcile_failed(&error.metric_label());
        }
    }
    result
}

/// How many times one reconcile runs: once from the cache, then again
/// from the live object each time a status write finds that the object
/// changed under it. More is requeued with backoff.
const MAX_RUNS: u32 = 3;

async fn reconcile_one(obj: &Arc<Gcs>, ctx: &Arc<Context>) -> Result<Action> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<Gcs> = Api::namespaced(ctx.client.clone(), &ns);
    let mut slot = ctx.slots.acquire().await?;
    let mut current = obj.clone();
    if ctx.own_writes.behind(obj) {
        debug!("the cache has not shown this process's last status write; reading the resource");
        match read_live(&api, obj, ctx).await? {
            Some(live) => current = live,
            None => return Ok(Action::await_change()),
        }
    }
    let mut run = 1;
    loop {
        let result = reconcile_from(&api, current.clone(), ctx, &mut slot).await;
        match result {
            Err(Error::Stale(why)) if run < MAX_RUNS => {
                debug!(%why, run, "the resource changed under the reconcile; again from the live object");
                match read_live(&api, &current, ctx).await? {
                    Some(live) => current = live,
                    None => return Ok(Action::await_change()),
                }
                run += 1;
            }
            other => return other,
        }
    }
}

/// `obj` as the API server holds it now (`None`: gone), telling the
/// expectations ([`status::OwnWrites`]) what the cache missed.
async fn read_live(api: &Api<Gcs>, cached: &Gcs, ctx: &Context) -> Result<Option<Arc<Gcs>>> {
    let name = cached.name_any();
    let live = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read Gcs {name}")))?;
    let live = live.filter(|g| g.uid() == cached.uid());
    if let Some(live) = &live {
        ctx.own_writes.read_live(cached, live);
    }
    Ok(live.map(Arc::new))
}

/// One run of the reconcile from `obj`: the status it computes is written
/// only while the object is still at `obj`'s resourceVersion.
async fn reconcile_from(
    api: &Api<Gcs>,
    obj: Arc<Gcs>,
    ctx: &Arc<Context>,
    slot: &mut crate::slots::Slot,
) -> Result<Action> {
    let mut status = status::StatusWriter::new(&obj, ctx);
    let (writer, context, held) = (&mut status, &**ctx, slot);
    let result = finalizer::finalizer(api, obj.clone(), move |event| async move {
        match event {
            finalizer::Event::Apply(g) => apply::apply(g, context, writer, held).await,
            // Boxed: see `apply` (a reconcile's future is as large as its
            // largest branch for its whole life).
            finalizer::Event::Cleanup(g) => {
                Box::pin(cleanup::cleanup(g, context, writer, held)).await
            }
        }
    })
    .await;
    match &result {
        Ok(_) => ctx.failures.forget(&ObjectRef::from_obj(&*obj)),
        Err(e) => Box::pin(status::report_failure(&obj, ctx, &mut status, e)).await,
    }
    result
}

/// Backoff after a failed reconcile: exponential per object, capped.
/// An expected conflict with another writer is retried quietly: logged at
/// debug level (the metrics counted it in [`reconcile`]).
pub fn error_policy(obj: Arc<Gcs>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.failures.record(ObjectRef::from_obj(&*obj));
    let delay = backoff(error, failures);
    if error.is_expected_conflict() {
        debug!(gcs = %obj.name_any(), error = %error, retry_in = ?delay, "conflict; retrying");
    } else {
        warn!(gcs = %obj.name_any(), error = %error, retry_in = ?delay, "reconcile failed");
    }
    Action::requeue(jitter(delay))
}

/// The delay (before jitter) after `failures` consecutive failures of one
/// object, the latest being `error`: doubles from a base, up to a cap. A
/// bucket that is not empty yet waits longer: a person has to act.
fn backoff(error: &Error, failures: u32) -> Duration {
    let (base, cap) = match error {
        Error::DeletionBlocked(_) => (Duration::from_secs(5), Duration::from_secs(300)),
        // Retention lasts days to years: look again now and then.
        Error::RetentionLocked(_) => (Duration::from_secs(60), Duration::from_secs(3600)),
        _ => (Duration::from_millis(500), Duration::from_secs(120)),
    };
    base.saturating_mul(1u32 << failures.min(16).saturating_sub(1))
        .min(cap)
}

/// Consecutive failed reconciles per object; a success resets the count.
#[derive(Default)]
struct FailureCounts(Mutex<HashMap<ObjectRef<Gcs>, u32>>);

impl FailureCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<Gcs>, u32>> {
        // A poisoned map only holds backoff counters: keep using it.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one more failure of `key`; returns the count.
    fn record(&self, key: ObjectRef<Gcs>) -> u32 {
        let mut map = self.lock();
        let n = map.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// `key` reconciled successfully: its next failure starts over.
    fn forget(&self, key: &ObjectRef<Gcs>) {
        self.lock().remove(key);
    }
}

impl Context {
    /// Queues an event about `obj` (written in the background; see
    /// [`crate::events`]).
    fn event(&self, obj: &Gcs, type_: EventType, reason: &str, action: &str, note: String) {
        self.events
            .publish(type_, reason, action, &note, &obj.object_ref(&()));
    }
}

/// The action after a reconcile that did its work: none; the drift check
/// brings the resource back once per resync period (module `resync`).
fn in_sync() -> Action {
    Action::await_change()
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.9 + fastrand::f64() * 0.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcs_error() -> Error {
        Error::Gcs(crate::gcs::GcsError {
            kind: crate::gcs::GcsErrorKind::Unavailable,
            operation: "create bucket",
            bucket: "photos-k3x9q2mw".into(),
            message: "connection refused".into(),
        })
    }

    fn key(name: &str) -> ObjectRef<Gcs> {
        ObjectRef::new(name).within("team-a")
    }

    #[test]
    fn backoff_doubles_from_half_a_second_up_to_two_minutes() {
        let e = gcs_error();
        let delays: Vec<Duration> = (1..=10).map(|n| backoff(&e, n)).collect();
        let mut expected = Duration::from_millis(500);
        for (n, delay) in delays.iter().enumerate() {
            assert_eq!(
                *delay,
                expected.min(Duration::from_secs(120)),
                "failure {}",
                n + 1
            );
            expected *= 2;
        }
        assert_eq!(backoff(&e, 8), Duration::from_secs(64));
        assert_eq!(backoff(&e, 9), Duration::from_secs(120));
        assert_eq!(backoff(&e, 1_000), Duration::from_secs(120));
        assert_eq!(backoff(&e, u32::MAX), Duration::from_secs(120));
    }

    #[test]
    fn a_blocked_deletion_backs_off_from_five_seconds_up_to_five_minutes() {
        let e = Error::DeletionBlocked("bucket photos-k3x9q2mw is not empty".into());
        assert_eq!(backoff(&e, 1), Duration::from_secs(5));
        assert_eq!(backoff(&e, 2), Duration::from_secs(10));
        assert_eq!(backoff(&e, 6), Duration::from_secs(160));
        assert_eq!(backoff(&e, 7), Duration::from_secs(300));
        assert_eq!(backoff(&e, 40), Duration::from_secs(300));
    }

    #[test]
    fn failures_count_per_object_and_reset_on_success() {
        let counts = FailureCounts::default();
        assert_eq!(counts.record(key("photos")), 1);
        assert_eq!(counts.record(key("photos")), 2);
        assert_eq!(counts.record(key("videos")), 1);
        assert_eq!(counts.record(key("photos")), 3);
        let before = backoff(&gcs_error(), 3);
        counts.forget(&key("photos"));
        // After a success the curve starts again at its base.
        let after = backoff(&gcs_error(), counts.record(key("photos")));
        assert_eq!(after, Duration::from_millis(500));
        assert!(after < before);
        assert_eq!(counts.record(key("videos")), 2, "other objects keep theirs");
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let d = Duration::from_secs(600);
        for _ in 0..1_000 {
            let j = jitter(d);
            assert!(
                j >= Duration::from_secs(540) && j <= Duration::from_secs(660),
                "{j:?}"
            );
        }
    }
}
