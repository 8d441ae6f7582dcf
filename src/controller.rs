//! The reconciler: `Gcs` resources into buckets.
//!
//! `reconcile` wraps [`kube::runtime::finalizer`]: the finalizer is added
//! before any GCS call, [`apply`] creates and keeps the bucket as declared,
//! [`cleanup`] deletes it safely. Status is computed, compared with what the
//! object already shows, and written (server-side apply on the status
//! subresource) only when it changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use crate::bucket_map::{self, BucketMaps, MapSettings, Verdict};
use crate::conditions::{self, READY, reason};
use crate::crd::{DeletionPolicy, FINALIZER, Gcs, GcsStatus};
use crate::gcs::{GcsClient, GcsErrorKind, Pacer};
use crate::metrics::Metrics;
use crate::naming::{self, Identity, OWNER_LABEL};
use crate::publish;
use crate::settings::Settings;
use crate::slots::{Slot, Slots};
use crate::{Error, Result};

/// Field manager of the operator's writes.
pub const FIELD_MANAGER: &str = "bucketmap";
/// Namespace annotation naming the project of the namespace's buckets.
pub const PROJECT_ANNOTATION: &str = "bucketmap.dev/project-id";

/// Operator settings (from flags).
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// Project used when neither the spec nor the namespace names one.
    pub default_project: Option<String>,
    /// Period of the drift check for each resource (jittered ±10 %).
    pub resync: Duration,
    /// How many candidate names to try before giving up with `NameConflict`.
    pub max_name_attempts: u32,
    /// Watch only this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Reconciles doing work at once (0: unbounded); see [`crate::slots`].
    pub concurrency: u16,
    /// Minimum interval between bucket creates/deletes in one project.
    pub bucket_ops_interval: Option<Duration>,
    /// Name of the per-namespace ConfigMap holding the bucket map.
    pub map_name: String,
    /// Budget of one namespace's bucket map (see [`crate::bucket_map`]).
    pub map_max_bytes: usize,
    /// Pause between the first claim of a burst and the map write.
    pub map_debounce: Duration,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            default_project: None,
            resync: Duration::from_secs(600),
            max_name_attempts: 5,
            namespace: None,
            concurrency: 32,
            bucket_ops_interval: Some(Duration::from_secs(2)),
            map_name: "bucketmap".to_owned(),
            map_max_bytes: bucket_map::DEFAULT_MAX_MAP_BYTES,
            map_debounce: bucket_map::DEFAULT_DEBOUNCE,
        }
    }
}

/// State shared by all reconciles.
pub struct Context {
    pub client: kube::Client,
    pub gcs: GcsClient,
    pub events: crate::events::Events,
    pub metrics: Arc<Metrics>,
    pub config: OperatorConfig,
    pacer: Pacer,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    maps: Arc<BucketMaps>,
    secrets: Store<k8s_openapi::api::core::v1::Secret>,
    /// The namespace cache holds every namespace: projects can be resolved.
    namespaces_synced: Arc<std::sync::atomic::AtomicBool>,
    failures: Mutex<HashMap<ObjectRef<Gcs>, u32>>,
    /// Reconciles doing work at once (waiting for a map write does not count).
    slots: Slots,
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    gcs: GcsClient,
    metrics: Arc<Metrics>,
    config: OperatorConfig,
    on_ready: impl FnOnce() + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let gcs_api: Api<Gcs> = match &config.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ns_api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let ns_watch = match &config.namespace {
        Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
        None => watcher::Config::default(),
    };
    let (ns_reader, ns_writer) = reflector::store();
    let ns_stream = watcher(ns_api, ns_watch)
        .default_backoff()
        .modify(|ns: &mut PartialObjectMeta<Namespace>| {
            ns.managed_fields_mut().clear();
        })
        .reflect(ns_writer)
        .applied_objects()
        .predicate_filter(predicates::annotations, Default::default());

    let (reader, writer) = reflector::store();
    let gcs_stream = watcher(gcs_api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|g: &mut Gcs| {
            // Not needed by the reconciler; dropping it keeps the cache small.
            g.managed_fields_mut().clear();
        })
        .reflect(writer)
        .applied_objects()
        // Status writes do not trigger reconciles; spec changes, deletion
        // (which bumps the generation) and finalizer changes do.
        .predicate_filter(
            predicates::generation.combine(predicates::finalizers),
            Default::default(),
        );

    let reporter = Reporter {
        controller: "bucketmap".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let pacer = Pacer::new(config.bucket_ops_interval);
    let concurrency = config.concurrency;
    let (configmaps, secrets, cache_tasks) = watch_published(&client, &config);
    let (wake, woken) = tokio::sync::mpsc::unbounded_channel();
    let maps = BucketMaps::new(
        client.clone(),
        metrics.clone(),
        MapSettings {
            map_name: config.map_name.clone(),
            max_bytes: config.map_max_bytes,
            debounce: config.map_debounce,
        },
        reader.clone(),
        configmaps,
        wake,
    );
    let ctx = Arc::new(Context {
        events: crate::events::Events::new(client.clone(), reporter),
        client,
        gcs,
        metrics,
        config,
        pacer,
        namespaces: ns_reader.clone(),
        maps,
        secrets,
        namespaces_synced: Arc::default(),
        failures: Mutex::new(HashMap::new()),
        slots: Slots::new(concurrency),
    });

    let controller = Controller::for_stream(gcs_stream, reader.clone())
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(Slots::controller_concurrency(concurrency)),
        )
        // Refused map claims that may now succeed (an entry left the map).
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(woken));
    let store = controller.store();
    // A namespace's project annotation changed: look at its resources again.
    let controller = controller.watches_stream(ns_stream, move |ns| {
        let name = ns.name_any();
        store
            .state()
            .into_iter()
            .filter(|g| g.namespace().as_deref() == Some(name.as_str()))
            .map(|g| ObjectRef::from_obj(&*g))
            .collect::<Vec<_>>()
    });

    let synced = ctx.namespaces_synced.clone();
    let readiness = async move {
        // Re-poll with a timeout: a store's readiness future only wakes its
        // latest poller, and the controller waits on the same store.
        loop {
            let wait = async {
                let (a, b) = tokio::join!(reader.wait_until_ready(), ns_reader.wait_until_ready());
                a.is_ok() && b.is_ok()
            };
            match tokio::time::timeout(Duration::from_millis(200), wait).await {
                Ok(true) => break,
                Ok(false) => {
                    warn!("watch caches were dropped before they synced");
                    return;
                }
                Err(_) => {}
            }
        }
        synced.store(true, std::sync::atomic::Ordering::Release);
        info!("caches synced");
        on_ready();
    };
    let readiness = tokio::spawn(readiness);

    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile loop");
            }
        })
        .await;
    // The background watches live exactly as long as the controller.
    readiness.abort();
    for task in cache_tasks {
        task.abort();
    }
}

/// Caches of the bucket maps and binding Secrets, kept by background
/// watches (they trigger nothing: our own writes would only cause reconciles
/// that change nothing). The maps keep their `managedFields` (one entry per
/// writer) so that the writer can see field managers of earlier versions.
#[allow(clippy::type_complexity)]
fn watch_published(
    client: &kube::Client,
    config: &OperatorConfig,
) -> (
    Store<k8s_openapi::api::core::v1::ConfigMap>,
    Store<k8s_openapi::api::core::v1::Secret>,
    [tokio::task::JoinHandle<()>; 2],
) {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let (cm_api, secret_api): (Api<ConfigMap>, Api<Secret>) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let (configmaps, cm_writer) = reflector::store();
    let (secrets, secret_writer) = reflector::store();
    let cm_watch = watcher::Config::default().fields(&format!("metadata.name={}", config.map_name));
    let secret_watch = watcher::Config::default().labels(&format!(
        "{}={}",
        publish::MANAGED_BY.0,
        publish::MANAGED_BY.1
    ));
    let cm_task = tokio::spawn(
        watcher(cm_api, cm_watch)
            .default_backoff()
            .reflect(cm_writer)
            .for_each(|_| async {}),
    );
    let secret_task = tokio::spawn(
        watcher(secret_api, secret_watch)
            .default_backoff()
            .modify(|o: &mut Secret| o.managed_fields_mut().clear())
            .reflect(secret_writer)
            .for_each(|_| async {}),
    );
    (configmaps, secrets, [cm_task, secret_task])
}

/// Entry point of one reconciliation.
#[instrument(skip_all, fields(gcs = %obj.name_any(), namespace = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<Gcs>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<Gcs> = Api::namespaced(ctx.client.clone(), &ns);
    let mut slot = ctx.slots.acquire().await?;
    let mut status = StatusWriter::new(&obj, &ctx);
    let (writer, context, held) = (&mut status, &*ctx, &mut slot);
    let result = finalizer(&api, FINALIZER, obj.clone(), move |event| async move {
        match event {
            Finalizer::Apply(g) => apply(g, context, writer, held).await,
            Finalizer::Cleanup(g) => cleanup(g, context, writer, held).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(Box::new(other)),
    });
    let key = ObjectRef::from_obj(&*obj);
    match &result {
        Ok(_) => {
            ctx.lock_failures().remove(&key);
        }
        Err(e) => report_failure(&obj, &ctx, &mut status, e).await,
    }
    result
}

/// Backoff after a failed reconcile: exponential per object, capped.
pub fn error_policy(obj: Arc<Gcs>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(&error.metric_label());
    let failures = {
        let mut map = ctx.lock_failures();
        let n = map.entry(ObjectRef::from_obj(&*obj)).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let (base, cap) = match error {
        Error::DeletionBlocked(_) => (Duration::from_secs(5), Duration::from_secs(300)),
        _ => (Duration::from_millis(500), Duration::from_secs(120)),
    };
    let delay = base
        .saturating_mul(1u32 << failures.min(16).saturating_sub(1))
        .min(cap);
    warn!(gcs = %obj.name_any(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(jitter(delay))
}

impl Context {
    fn lock_failures(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<Gcs>, u32>> {
        // A poisoned map only holds backoff counters: keep using it.
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn event(&self, obj: &Gcs, type_: EventType, reason: &str, action: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.events.publish(&event, &obj.object_ref(&())).await {
            warn!(error = %e, reason, "cannot publish event");
        }
    }
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.9 + fastrand::f64() * 0.2)
}

/// Where the bucket must live, or why there is no acceptable project.
fn resolve_project(
    obj: &Gcs,
    ctx: &Context,
) -> std::result::Result<String, (&'static str, String)> {
    let ns = obj.namespace().unwrap_or_default();
    let annotated = ctx
        .namespaces
        .get(&ObjectRef::new(&ns))
        .and_then(|n| n.annotations().get(PROJECT_ANNOTATION).cloned())
        .filter(|p| !p.is_empty());
    match (&obj.spec.project_id, annotated) {
        (Some(spec), Some(ns_project)) if *spec != ns_project => Err((
            reason::PROJECT_NOT_ALLOWED,
            format!(
                "spec.projectID {spec} is not allowed in namespace {ns}: its annotation {PROJECT_ANNOTATION} pins buckets to project {ns_project}"
            ),
        )),
        (Some(spec), _) => Ok(spec.clone()),
        (None, Some(ns_project)) => Ok(ns_project),
        (None, None) => ctx.config.default_project.clone().ok_or((
            reason::PROJECT_MISSING,
            format!(
                "no project: set spec.projectID, annotate namespace {ns} with {PROJECT_ANNOTATION}, or start the operator with --default-project"
            ),
        )),
    }
}

/// The status a reconcile is building, written once at the end if changed.
struct StatusWriter<'a> {
    obj: &'a Gcs,
    ctx: &'a Context,
    status: GcsStatus,
    /// What the API server holds (as far as this reconcile knows).
    written: Option<GcsStatus>,
}

impl<'a> StatusWriter<'a> {
    fn new(obj: &'a Gcs, ctx: &'a Context) -> Self {
        StatusWriter {
            obj,
            ctx,
            status: obj.status.clone().unwrap_or_default(),
            written: obj.status.clone(),
        }
    }

    fn ready(&mut self, ready: bool, reason: &str, message: String) {
        let generation = self.obj.metadata.generation;
        conditions::set(
            &mut self.status.conditions,
            READY,
            ready,
            reason,
            message,
            generation,
        );
        self.status.observed_generation = generation;
    }

    fn name(&mut self, physical: &str, project: &str, attempt: u32) {
        self.status.bucket_full_name = Some(physical.to_owned());
        self.status.bucket_name = Some(self.obj.spec.bucket_name.clone());
        self.status.project_id = Some(project.to_owned());
        self.status.url = Some(format!("gs://{physical}"));
        self.status.name_attempt = Some(attempt);
    }

    /// Writes the status if it differs from what the API server holds.
    async fn flush(&mut self) -> Result<()> {
        if self.written.as_ref() == Some(&self.status) {
            return Ok(());
        }
        write_status(self.obj, &self.ctx.client, &self.status).await?;
        self.written = Some(self.status.clone());
        Ok(())
    }
}

async fn write_status(obj: &Gcs, client: &kube::Client, status: &GcsStatus) -> Result<()> {
    let ns = obj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let name = obj.name_any();
    let api: Api<Gcs> = Api::namespaced(client.clone(), &ns);
    let patch = serde_json::json!({
        "apiVersion": Gcs::api_version(&()),
        "kind": Gcs::kind(&()),
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!("write status of Gcs {ns}/{name}")))?;
    Ok(())
}

/// Puts a failed reconcile's cause into the `Ready` condition.
async fn report_failure(obj: &Gcs, ctx: &Context, writer: &mut StatusWriter<'_>, error: &Error) {
    let (reason, message) = match error {
        Error::Gcs(e) => {
            let project = writer.status.project_id.clone().unwrap_or_default();
            let reason = match e.kind {
                GcsErrorKind::PermissionDenied => reason::PERMISSION_DENIED,
                GcsErrorKind::ResourceExhausted => reason::QUOTA_EXCEEDED,
                _ => reason::GCS_ERROR,
            };
            (
                reason,
                format!("{e} (project {project}); retrying with backoff"),
            )
        }
        Error::DeletionBlocked(msg) => (reason::DELETION_BLOCKED, msg.clone()),
        Error::BindingNotOwned(msg) => (reason::BINDING_NOT_OWNED, msg.clone()),
        // Kubernetes errors cannot be reported through Kubernetes reliably.
        _ => return,
    };
    let current = writer.status.conditions.iter().find(|c| c.type_ == READY);
    if current.is_some_and(|c| c.reason == reason && c.message == message) {
        return;
    }
    writer.ready(false, reason, message.clone());
    if let Err(e) = writer.flush().await {
        warn!(error = %e, "cannot record failure in status");
    }
    // GCS errors share one event reason; the others name their own.
    let event_reason = match error {
        Error::Gcs(_) => "ReconcileError",
        _ => reason,
    };
    ctx.event(obj, EventType::Warning, event_reason, "Reconcile", message)
        .await;
}

/// Creates the bucket if needed, corrects drift, reports Ready.
async fn apply(
    obj: Arc<Gcs>,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    slot: &mut Slot,
) -> Result<Action> {
    let requeue = Action::requeue(jitter(ctx.config.resync));

    if let Err(message) = naming::validate_logical_name(&obj.spec.bucket_name) {
        status.ready(false, reason::INVALID_SPEC, message);
        status.flush().await?;
        return Ok(Action::await_change());
    }
    if !ctx
        .namespaces_synced
        .load(std::sync::atomic::Ordering::Acquire)
    {
        // Without the namespace's annotation the project could be wrong.
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let project = match resolve_project(&obj, ctx) {
        Ok(p) => p,
        Err((why, message)) => {
            status.ready(false, why, message);
            status.flush().await?;
            return Ok(requeue);
        }
    };
    if let (Some(existing), Some(_)) = (&status.status.project_id, &status.status.bucket_full_name)
        && *existing != project
    {
        let message = format!(
            "the bucket lives in project {existing} but the project now resolves to {project}; GCS cannot move a bucket: restore the project or create a new Gcs resource"
        );
        status.ready(false, reason::PROJECT_CHANGED, message);
        status.flush().await?;
        return Ok(requeue);
    }

    let uid = obj.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let owner = naming::owner_id(&uid);
    let desired = Settings::desired(&obj.spec, &owner);

    let Some(bucket) = ensure_bucket(&obj, ctx, status, &project, &owner, &desired, &uid).await?
    else {
        // Every candidate name is taken; the condition says so.
        status.flush().await?;
        return Ok(requeue);
    };
    let physical = bucket.bucket_id.clone();

    let drift = desired.drift(&Settings::observed(&bucket));
    if !drift.is_empty() {
        let mask: Vec<&str> = drift.iter().map(|f| f.mask_path()).collect();
        ctx.gcs
            .update_bucket(&physical, desired.to_bucket(), &mask, bucket.metageneration)
            .await?;
        info!(bucket = %physical, fields = ?mask, "corrected drift");
        ctx.event(
            &obj,
            EventType::Normal,
            "Updated",
            "UpdateBucket",
            format!("Bucket {physical}: set {} as declared", mask.join(", ")),
        )
        .await;
    }

    // Publish before reporting Ready: Ready means the map has the entry.
    // The wait for the map write gives the work slot to another reconcile.
    let verdict = slot
        .released_while(ctx.maps.publish(&obj, &physical))
        .await??;
    let refused = match verdict {
        Verdict::Published => None,
        Verdict::Conflict(message) => Some((reason::MAPPING_CONFLICT, message)),
        Verdict::TooLarge(message) => Some((reason::MAP_FULL, message)),
    };
    if let Some((why, message)) = refused {
        status.ready(false, why, message);
        status.flush().await?;
        return Ok(requeue);
    }
    publish::write_binding(&ctx.client, &ctx.secrets, &obj, &physical, &project).await?;
    status.status.binding = Some(crate::crd::BindingReference {
        name: publish::binding_secret_name(&obj.name_any()),
    });
    status.ready(
        true,
        reason::BUCKET_READY,
        format!("Bucket {physical} is ready in project {project}"),
    );
    status.flush().await?;
    Ok(requeue)
}

/// Finds or creates the bucket, advancing the naming attempt on conflicts.
/// `None` when every attempt is taken by somebody else.
async fn ensure_bucket(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    project: &str,
    owner: &str,
    desired: &Settings,
    uid: &str,
) -> Result<Option<google_cloud_storage::model::Bucket>> {
    let ns = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let identity = Identity {
        namespace: &ns,
        name: &name,
        uid,
    };
    let mut attempt = status.status.name_attempt.unwrap_or(0);
    let owned = |b: &google_cloud_storage::model::Bucket| {
        b.labels.get(OWNER_LABEL).map(String::as_str) == Some(owner)
    };

    // A bucket we created before: it must still be there and still be ours.
    if let (Some(physical), Some(_)) = (
        status.status.bucket_full_name.clone(),
        &status.status.create_time,
    ) {
        match ctx.gcs.get_bucket(&physical).await? {
            Some(b) if owned(&b) => return Ok(Some(b)),
            Some(_) => {
                status.ready(
                    false,
                    reason::NOT_OWNED,
                    format!("bucket {physical} exists but is no longer owned by this resource; leaving it untouched"),
                );
                return Ok(None);
            }
            None => {
                warn!(bucket = %physical, "bucket deleted out of band; recreating");
                ctx.event(
                    obj,
                    EventType::Warning,
                    "BucketRecreated",
                    "CreateBucket",
                    format!("Bucket {physical} was deleted outside of bucketmap; recreating it with the same name"),
                )
                .await;
            }
        }
    }

    loop {
        let physical = match &status.status.bucket_full_name {
            Some(n) => n.clone(),
            None => naming::physical_name(&obj.spec.bucket_name, identity, attempt),
        };
        // A crash or a lost response must only ever lead back to this same
        // name. Attempt 0 is derived from the uid, so a restart finds it
        // again without a status write; a later attempt is persisted before
        // the create. A create that has to wait for its turn is reported as
        // `Creating` meanwhile. (Skipping the write for an immediate first
        // attempt saves one API write per resource.)
        status.name(&physical, project, attempt);
        if attempt > 0 || !ctx.pacer.is_free(project) {
            if status.status.create_time.is_none() {
                status.ready(
                    false,
                    reason::CREATING,
                    format!("Creating bucket {physical} in project {project}"),
                );
            }
            status.flush().await?;
        }

        let location = obj.spec.location.to_ascii_uppercase();
        let create = ctx.gcs.create_bucket(
            project,
            &physical,
            desired.to_bucket().set_location(location),
        );
        let created = ctx.pacer.run(project, create).await;
        let bucket = match created {
            Ok(b) => {
                info!(bucket = %physical, project, "created bucket");
                ctx.event(
                    obj,
                    EventType::Normal,
                    "Created",
                    "CreateBucket",
                    format!("Created bucket {physical} in project {project}"),
                )
                .await;
                Some(b)
            }
            Err(e) if e.kind == GcsErrorKind::AlreadyExists => {
                match ctx.gcs.get_bucket(&physical).await {
                    // Ours: an earlier create succeeded but its response was lost.
                    Ok(Some(b)) if owned(&b) => Some(b),
                    Ok(Some(_))
                    | Err(crate::gcs::GcsError {
                        kind: GcsErrorKind::PermissionDenied,
                        ..
                    }) => None,
                    Ok(None) => return Err(e.into()),
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(b) = bucket {
            if status.status.create_time.is_none() {
                status.status.create_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
            }
            return Ok(Some(b));
        }

        // The name belongs to somebody else: never touch it, pick the next.
        attempt += 1;
        if attempt >= ctx.config.max_name_attempts {
            let message = format!(
                "bucket name {physical} and {} earlier candidates belong to somebody else; gave up after {attempt} attempts",
                attempt - 1
            );
            status.ready(false, reason::NAME_CONFLICT, message.clone());
            ctx.event(
                obj,
                EventType::Warning,
                reason::NAME_CONFLICT,
                "CreateBucket",
                message,
            )
            .await;
            return Ok(None);
        }
        let next = naming::physical_name(&obj.spec.bucket_name, identity, attempt);
        ctx.event(
            obj,
            EventType::Warning,
            reason::NAME_CONFLICT,
            "CreateBucket",
            format!("Bucket name {physical} belongs to somebody else; trying {next}"),
        )
        .await;
        status.status.bucket_full_name = Some(next);
    }
}

/// Deletes the bucket per `deletionPolicy`, never one that is not ours.
async fn cleanup(
    obj: Arc<Gcs>,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    slot: &mut Slot,
) -> Result<Action> {
    let st = status.status.clone();
    // The workloads lose the name first, whatever happens to the bucket.
    slot.released_while(ctx.maps.unpublish(&obj)).await??;
    publish::delete_binding(&ctx.client, &obj).await?;
    if obj.spec.deletion_policy == DeletionPolicy::Orphan {
        if let Some(physical) = &st.bucket_full_name {
            ctx.event(
                &obj,
                EventType::Normal,
                "Orphaned",
                "DeleteBucket",
                format!("deletionPolicy is Orphan: bucket {physical} is kept"),
            )
            .await;
        }
        return Ok(Action::await_change());
    }
    let Some(physical) = st.bucket_full_name.clone() else {
        return Ok(Action::await_change());
    };
    let uid = obj.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let owner = naming::owner_id(&uid);
    let Some(bucket) = ctx.gcs.get_bucket(&physical).await? else {
        info!(bucket = %physical, "bucket already gone");
        return Ok(Action::await_change());
    };
    if bucket.labels.get(OWNER_LABEL) != Some(&owner) {
        ctx.event(
            &obj,
            EventType::Warning,
            reason::NOT_OWNED,
            "DeleteBucket",
            format!("Bucket {physical} is not owned by this resource; left untouched"),
        )
        .await;
        return Ok(Action::await_change());
    }

    if obj.spec.force_destroy {
        let deleted = ctx.gcs.delete_all_objects(&physical).await?;
        if deleted > 0 {
            ctx.event(
                &obj,
                EventType::Normal,
                "ObjectsDeleted",
                "DeleteBucket",
                format!("forceDestroy: deleted {deleted} object versions from bucket {physical}"),
            )
            .await;
        }
    } else if !ctx.gcs.list_objects(&physical, true, 1).await?.is_empty() {
        return Err(Error::DeletionBlocked(format!(
            "bucket {physical} is not empty: delete its objects (including noncurrent versions) or set spec.forceDestroy: true; the bucket is kept until then"
        )));
    }

    let project = st.project_id.clone().unwrap_or_default();
    match ctx
        .pacer
        .run(&project, ctx.gcs.delete_bucket(&physical))
        .await
    {
        Ok(()) => {}
        Err(e) if e.kind == GcsErrorKind::NotFound => {}
        Err(e) if e.kind == GcsErrorKind::FailedPrecondition => {
            return Err(Error::DeletionBlocked(format!(
                "bucket {physical} is not empty ({}); delete its objects or set spec.forceDestroy: true",
                e.message
            )));
        }
        Err(e) => return Err(e.into()),
    }
    info!(bucket = %physical, "deleted bucket");
    ctx.event(
        &obj,
        EventType::Normal,
        "Deleted",
        "DeleteBucket",
        format!("Deleted bucket {physical}"),
    )
    .await;
    Ok(Action::await_change())
}
