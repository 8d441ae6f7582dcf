//! Creating and keeping a bucket as declared, in phases:
//! validate → resolve project → ensure bucket → correct drift → publish →
//! mark Ready → grant access (module `access`). A phase either hands its result to the next one or ends the
//! reconcile with the [`Action`] it chose (having said why in the status).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use google_cloud_storage::model::Bucket;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::notifications::{Synced, sync_notifications};
use super::status::StatusWriter;
use super::{Context, PROJECT_ANNOTATION, in_sync};
use crate::Result;
use crate::bucket_map::Verdict;
use crate::conditions::{
    self, IMMUTABLE_SETTINGS_DIFFER, IP_FILTER_HIDDEN, RETENTION_POLICY_LOCKED, reason,
};
use crate::crd::{BindingReference, Gcs, GcsStatus};
use crate::gcs::{GcsError, GcsErrorKind};
use crate::naming::{self, Identity, Ownership};
use crate::publish;
use crate::settings::{Field, Settings};
use crate::slots::Slot;

/// The value of a phase, or the end of the reconcile with the phase's action.
macro_rules! phase {
    ($phase:expr) => {
        match $phase {
            ControlFlow::Continue(value) => value,
            ControlFlow::Break(action) => return Ok(action),
        }
    };
}

/// Creates the bucket if needed, corrects drift, publishes it, reports Ready.
pub(super) async fn apply(
    obj: Arc<Gcs>,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    slot: &mut Slot,
) -> Result<Action> {
    // The phases that call GCS or the API server are boxed: a reconcile's
    // future is as large as its largest phase for its whole life, also while
    // it waits for a work slot or a map write, and hundreds of reconciles
    // are admitted at once (src/slots.rs). Boxed, a phase's state exists only
    // while it runs.
    phase!(Box::pin(validate(&obj, ctx, status)).await?);
    // Before the map's first write: the namespace's ServiceAccounts may
    // read it as soon as it exists (module `map_readers`).
    let ns = obj.namespace().unwrap_or_default();
    Box::pin(super::map_readers::ensure(ctx, &ns, slot)).await?;
    let (project, default_project) =
        phase!(Box::pin(resolve_project(&obj, ctx, status, slot)).await?);
    phase!(
        Box::pin(check_policy(
            &obj,
            ctx,
            status,
            &project,
            default_project.as_deref()
        ))
        .await?
    );
    // Before any GCS call: it must show while GCS fails.
    super::access::report_refusals(&obj, ctx, status);
    let name = obj.name_any();
    let identity = Identity {
        cluster: &ctx.config.cluster_id,
        namespace: &ns,
        name: &name,
    };
    let request = BucketRequest {
        obj: &obj,
        project: &project,
        uid: obj.uid(),
        desired: Settings::desired(&obj.spec, &identity.labels()),
        identity,
    };
    let (bucket, adopted_now) = phase!(Box::pin(ensure_bucket_phase(ctx, status, &request)).await?);
    Box::pin(correct_drift(ctx, status, &request, &bucket, adopted_now)).await?;
    phase!(publish(ctx, status, slot, &request, &bucket.bucket_id).await?);
    mark_ready(status, &bucket.bucket_id, &project);
    Box::pin(super::access::grant_access(
        &obj,
        ctx,
        status,
        &bucket.bucket_id,
    ))
    .await?;
    let notified = Box::pin(sync_notifications(&obj, ctx, status, &bucket.bucket_id)).await?;
    Box::pin(status.flush()).await?;
    Ok(match notified {
        Synced::Done => in_sync(),
        // A topic may be created any moment; look again before the resync.
        Synced::TopicRefused => Action::requeue(super::jitter(TOPIC_RETRY.min(ctx.config.resync))),
    })
}

/// How soon a refused notification topic is tried again.
const TOPIC_RETRY: Duration = Duration::from_secs(60);

/// Phase 1: the spec is valid and the namespace cache can be trusted.
async fn validate(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
) -> Result<ControlFlow<Action>> {
    if let Err(message) = naming::validate_logical_name(&obj.spec.bucket_name) {
        status.not_ready(reason::INVALID_SPEC, message).await?;
        return Ok(ControlFlow::Break(Action::await_change()));
    }
    if !ctx.namespaces_synced.load(Ordering::Acquire) {
        // Without the namespace's annotation the project could be wrong.
        return Ok(ControlFlow::Break(Action::requeue(Duration::from_millis(
            200,
        ))));
    }
    Ok(ControlFlow::Continue(()))
}

/// Phase 2: the project the bucket must live in, and the namespace's
/// default project (its annotation's, else the operator's). A refusal is
/// never made on the cache's word alone: the namespace is read again first,
/// since the cache can lag behind an annotation the bucket was created with.
async fn resolve_project(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    slot: &mut Slot,
) -> Result<ControlFlow<Action, (String, Option<String>)>> {
    let ns = obj.namespace().unwrap_or_default();
    let cached = cached_namespace_project(ctx, &ns, &status.status);
    let mut annotated = match &cached {
        Some(annotation) => annotation.clone(),
        None => read_namespace_project(ctx, &ns, slot).await?,
    };
    let mut resolved = required_project(obj, ctx, &ns, annotated.as_deref(), &status.status);
    if resolved.is_err() && cached.is_some() {
        annotated = read_namespace_project(ctx, &ns, slot).await?;
        resolved = required_project(obj, ctx, &ns, annotated.as_deref(), &status.status);
    }
    let default = default_project(annotated.as_deref(), ctx.config.default_project.as_deref());
    match resolved {
        Ok(project) => Ok(ControlFlow::Continue((project, default))),
        Err(refusal) => {
            status.not_ready(refusal.reason, refusal.message).await?;
            Ok(ControlFlow::Break(in_sync()))
        }
    }
}

/// The project `obj`'s bucket must live in, given its namespace's project
/// annotation: [`project_for`], pinned to the project recorded with the
/// bucket.
fn required_project(
    obj: &Gcs,
    ctx: &Context,
    ns: &str,
    annotated: Option<&str>,
    recorded: &GcsStatus,
) -> std::result::Result<String, Refusal> {
    project_for(
        ns,
        obj.spec.project_id.as_deref(),
        annotated,
        ctx.config.default_project.as_deref(),
    )
    .and_then(|project| still_in_recorded_project(recorded, project))
}

/// Phase 3: the tenancy policy allows the resource. Before the bucket
/// exists, it takes one of the namespace's places (module `places`) when
/// the policy limits them; after, the rest is still checked (a spec
/// changed to a class the policy does not allow is refused), but nothing
/// is ever deleted for it.
async fn check_policy(
    obj: &Gcs,
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    project: &str,
    default_project: Option<&str>,
) -> Result<ControlFlow<Action>> {
    let ns = obj.namespace().unwrap_or_default();
    let labels = ctx
        .namespaces
        .get(&ObjectRef::new(&ns))
        .map(|meta| meta.labels().clone())
        .unwrap_or_default();
    let request = crate::tenancy::Request {
        namespace: &ns,
        namespace_labels: &labels,
        project,
        default_project,
        storage_class: obj.spec.storage_class.as_gcs(),
        location: &obj.spec.location,
        force_destroy: obj.spec.force_destroy,
        buckets: None,
    };
    let policy = &ctx.config.tenancy;
    let mut decision = policy.allows(&request);
    if decision.is_ok() && status.status.bucket_full_name.is_none() && policy.limits_count() {
        let decide = |buckets| {
            let counted = crate::tenancy::Request {
                buckets: Some(buckets),
                ..request.clone()
            };
            policy.allows(&counted)
        };
        decision = super::places::take_place(ctx, obj, decide).await?;
    }
    match decision {
        Ok(()) => Ok(ControlFlow::Continue(())),
        Err(refusal) => {
            status
                .not_ready(reason::NOT_ALLOWED_BY_POLICY, refusal.0)
                .await?;
            Ok(ControlFlow::Break(in_sync()))
        }
    }
}

/// The project annotation of namespace `ns` as the cache holds it, when
/// the cache may answer: for a resource whose bucket name is recorded (its
/// project was recorded with it, before the bucket was created, and is
/// pinned) and whose namespace the cache has seen.
fn cached_namespace_project(
    ctx: &Context,
    ns: &str,
    recorded: &GcsStatus,
) -> Option<Option<String>> {
    recorded.bucket_full_name.as_ref()?;
    let cached = ctx.namespaces.get(&ObjectRef::new(ns))?;
    Some(super::namespaces::project_annotation_of(&cached))
}

/// The project annotation of namespace `ns`, read from the API server: for
/// a resource whose project is chosen now, the cache can lag behind a
/// namespace created or annotated just before the resource, and a bucket
/// created in the wrong project cannot be moved. Reads are shared by the
/// resources that ask at once (module `namespaces`); waiting for one gives
/// the work slot to another reconcile.
async fn read_namespace_project(
    ctx: &Context,
    ns: &str,
    slot: &mut Slot,
) -> Result<Option<String>> {
    slot.released_while(ctx.namespace_reads.project_annotation(ns))
        .await?
}

/// Why a resource cannot go on: the reason and message of `Ready`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// A namespace's default project: its annotation's, else the operator's.
pub(crate) fn default_project(annotated: Option<&str>, default: Option<&str>) -> Option<String> {
    annotated
        .filter(|p| !p.is_empty())
        .or(default)
        .map(str::to_owned)
}

/// Where the bucket of a resource in namespace `ns` must live: the spec's
/// project, which must match the namespace's annotation when it has one;
/// else the annotation; else the operator's default.
pub(crate) fn project_for(
    ns: &str,
    spec: Option<&str>,
    annotated: Option<&str>,
    default: Option<&str>,
) -> std::result::Result<String, Refusal> {
    let annotated = annotated.filter(|p| !p.is_empty());
    match (spec, annotated) {
        (Some(spec), Some(ns_project)) if spec != ns_project => Err(Refusal {
            reason: reason::PROJECT_NOT_ALLOWED,
            message: format!(
                "spec.projectID {spec} is not allowed in namespace {ns}: its annotation {PROJECT_ANNOTATION} pins buckets to project {ns_project}"
            ),
        }),
        (Some(spec), _) => Ok(spec.to_owned()),
        (None, Some(ns_project)) => Ok(ns_project.to_owned()),
        (None, None) => default.map(str::to_owned).ok_or_else(|| Refusal {
            reason: reason::PROJECT_MISSING,
            message: format!(
                "no project: set spec.projectID, annotate namespace {ns} with {PROJECT_ANNOTATION}, or start the operator with --default-project"
            ),
        }),
    }
}

/// `project`, unless the bucket already lives in another one (GCS cannot
/// move a bucket).
fn still_in_recorded_project(
    status: &GcsStatus,
    project: String,
) -> std::result::Result<String, Refusal> {
    match (&status.project_id, &status.bucket_full_name) {
        (Some(existing), Some(_)) if *existing != project => Err(Refusal {
            reason: reason::PROJECT_CHANGED,
            message: format!(
                "the bucket lives in project {existing} but the project now resolves to {project}; GCS cannot move a bucket: restore the project or create a new Gcs resource"
            ),
        }),
        _ => Ok(project),
    }
}

/// What finding or creating the bucket needs to know.
struct BucketRequest<'a> {
    obj: &'a Gcs,
    project: &'a str,
    /// The resource's uid: only recognises buckets labelled by earlier
    /// versions (see [`naming`]).
    uid: Option<String>,
    desired: Settings,
    /// The owner: cluster identity, namespace, name.
    identity: Identity<'a>,
}

impl BucketRequest<'_> {
    fn ownership(&self, bucket: &Bucket) -> Ownership {
        naming::ownership(&bucket.labels, &self.identity, self.uid.as_deref())
    }

    fn owns(&self, bucket: &Bucket) -> bool {
        matches!(self.ownership(bucket), Ownership::Ours | Ownership::Legacy)
    }

    fn candidate(&self, attempt: u32) -> String {
        naming::physical_name(&self.obj.spec.bucket_name, self.identity, attempt)
    }
}

/// Phase 3: the bucket, found, created or adopted (`true`: adopted now).
async fn ensure_bucket_phase(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
) -> Result<ControlFlow<Action, (Bucket, bool)>> {
    let found = match &request.obj.spec.adopt {
        Some(adopt) => Box::pin(adopt_bucket(ctx, status, request, &adopt.bucket)).await?,
        None => ensure_bucket(ctx, status, request)
            .await?
            .map(|bucket| (bucket, false)),
    };
    match found {
        Some(found) => Ok(ControlFlow::Continue(found)),
        None => {
            // The condition says why (taken names, or not ours any more).
            status.flush().await?;
            Ok(ControlFlow::Break(in_sync()))
        }
    }
}

/// Finds or creates the bucket, advancing the naming attempt on conflicts.
/// `None` when the bucket cannot be had (the condition says why).
async fn ensure_bucket(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
) -> Result<Option<Bucket>> {
    if let ControlFlow::Break(found) = recorded_bucket(ctx, status, request).await? {
        return Ok(found);
    }
    let mut attempt = status.status.name_attempt.unwrap_or(0);
    loop {
        let physical = match &status.status.bucket_full_name {
            Some(n) => n.clone(),
            None => request.candidate(attempt),
        };
        announce_candidate(ctx, status, request, &physical, attempt).await?;
        if let Some(bucket) = create_or_adopt(ctx, request, &physical).await? {
            status.created_now();
            return Ok(Some(bucket));
        }
        // The name belongs to somebody else: never touch it, pick the next.
        match next_attempt(&physical, attempt, ctx.config.max_name_attempts) {
            Ok(next) => {
                let name = request.candidate(next);
                let note =
                    format!("Bucket name {physical} belongs to somebody else; trying {name}");
                name_conflict_event(ctx, request.obj, note);
                status.status.bucket_full_name = Some(name);
                attempt = next;
            }
            Err(message) => {
                status.ready(false, reason::NAME_CONFLICT, message.clone());
                name_conflict_event(ctx, request.obj, message);
                return Ok(None);
            }
        }
    }
}

/// The attempt after candidate `attempt` (named `taken`) turned out to be
/// somebody else's, or why there is none: at most `max_attempts` candidates.
fn next_attempt(taken: &str, attempt: u32, max_attempts: u32) -> std::result::Result<u32, String> {
    let next = attempt.saturating_add(1);
    if next >= max_attempts {
        return Err(format!(
            "bucket name {taken} and {} earlier candidates belong to somebody else; gave up after {next} attempts",
            next - 1
        ));
    }
    Ok(next)
}

fn name_conflict_event(ctx: &Context, obj: &Gcs, note: String) {
    let (reason, action) = (reason::NAME_CONFLICT, "CreateBucket");
    ctx.event(obj, EventType::Warning, reason, action, note);
}

/// A bucket created before must still be there and still be ours.
/// `Break` with the answer, or `Continue` to (re)create it.
async fn recorded_bucket(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
) -> Result<ControlFlow<Option<Bucket>>> {
    let (Some(physical), Some(_)) = (
        status.status.bucket_full_name.clone(),
        &status.status.create_time,
    ) else {
        return Ok(ControlFlow::Continue(()));
    };
    let bucket = ctx.gcs.get_bucket(&physical).await?;
    match bucket.as_ref().map(|b| request.ownership(b)) {
        Some(Ownership::Ours) => Ok(ControlFlow::Break(bucket)),
        Some(Ownership::Legacy) => {
            let cluster = request.identity.cluster;
            let note = format!(
                "Bucket {physical} carries this resource's uid as its owner (labelled by an earlier bucketmap); relabelling it with cluster identity {cluster}, namespace and name, so that it is found again when the resource is re-created"
            );
            info!(bucket = %physical, cluster, "migrating ownership labels");
            ctx.event(
                request.obj,
                EventType::Normal,
                "OwnershipMigrated",
                "UpdateBucket",
                note,
            );
            Ok(ControlFlow::Break(bucket))
        }
        Some(other) => {
            status.ready(
                false,
                reason::NOT_OWNED,
                format!(
                    "bucket {physical} exists but is no longer owned by this resource ({}); leaving it untouched",
                    owner_in_words(&other)
                ),
            );
            Ok(ControlFlow::Break(None))
        }
        None => {
            warn!(bucket = %physical, "bucket deleted out of band; recreating");
            ctx.event(
                request.obj,
                EventType::Warning,
                "BucketRecreated",
                "CreateBucket",
                format!("Bucket {physical} was deleted outside of bucketmap; recreating it with the same name"),
            );
            Ok(ControlFlow::Continue(()))
        }
    }
}

/// Records the candidate name in the status, and writes it first when a
/// crash could otherwise lose it.
///
/// A crash or a lost response must only ever lead back to this same name.
/// Attempt 0 is derived from the owner identity, so a restart finds it again without a
/// status write; a later attempt is persisted before the create. A create
/// that has to wait for its turn is reported as `Creating` meanwhile.
/// (Skipping the write for an immediate first attempt saves one API write
/// per resource.)
async fn announce_candidate(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    physical: &str,
    attempt: u32,
) -> Result<()> {
    let project = request.project;
    status.name(physical, project, attempt);
    if attempt > 0 || !ctx.pacer.is_free(project) {
        if status.status.create_time.is_none() {
            status.ready(
                false,
                reason::CREATING,
                format!("Creating bucket {physical} in project {project}"),
            );
        }
        // Conditional: refused if the view this decision came from is old.
        status.flush().await?;
    } else {
        status.confirm_current().await?;
    }
    Ok(())
}

/// Creates bucket `physical`; if the name is taken, adopts it when it is
/// ours (an earlier create whose response was lost). `None`: somebody else's.
async fn create_or_adopt(
    ctx: &Context,
    request: &BucketRequest<'_>,
    physical: &str,
) -> Result<Option<Bucket>> {
    let project = request.project;
    let location = request.obj.spec.location.to_ascii_uppercase();
    let bucket = request.desired.to_bucket().set_location(location);
    let object_retention = request.desired.object_retention;
    let create = ctx
        .gcs
        .create_bucket(project, physical, bucket, object_retention);
    match ctx.pacer.run(project, create).await {
        Ok(b) => {
            info!(bucket = %physical, project, "created bucket");
            let note = format!("Created bucket {physical} in project {project}");
            ctx.event(
                request.obj,
                EventType::Normal,
                "Created",
                "CreateBucket",
                note,
            );
            Ok(Some(b))
        }
        Err(e) if e.kind == GcsErrorKind::AlreadyExists => {
            match ctx.gcs.get_bucket(physical).await {
                Ok(Some(b)) if request.owns(&b) => {
                    found_again_event(ctx, request, physical);
                    Ok(Some(b))
                }
                Ok(Some(_))
                | Err(GcsError {
                    kind: GcsErrorKind::PermissionDenied,
                    ..
                }) => Ok(None),
                Ok(None) => Err(e.into()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// A bucket of this owner exists at the candidate name: a create whose
/// response was lost, or a resource re-created (a rebuilt or restored
/// cluster) finding its bucket again.
fn found_again_event(ctx: &Context, request: &BucketRequest<'_>, physical: &str) {
    let Identity {
        cluster,
        namespace,
        name,
    } = request.identity;
    info!(bucket = %physical, cluster, "found the bucket of this owner");
    let note = format!(
        "Bucket {physical} already exists and is owned by cluster identity {cluster}, Gcs {namespace}/{name}: using it, with its data"
    );
    ctx.event(
        request.obj,
        EventType::Normal,
        "FoundExisting",
        "CreateBucket",
        note,
    );
}

/// Who owns a bucket, in words, for a refusal.
fn owner_in_words(ownership: &Ownership) -> String {
    match ownership {
        Ownership::Foreign(who) => format!("owned by {who}"),
        Ownership::Unowned => "it carries no bucketmap owner label".to_owned(),
        Ownership::Ours | Ownership::Legacy => "owned by this resource".to_owned(),
    }
}

/// Phase 3 with `spec.adopt`: the named bucket, if it may be adopted
/// (`true`: adopted now). It must exist (adoption never creates), be
/// unowned or already this owner's, and live in the resource's project.
async fn adopt_bucket(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    physical: &str,
) -> Result<Option<(Bucket, bool)>> {
    let project = request.project;
    let Some(bucket) = ctx.gcs.get_bucket(physical).await? else {
        let message = format!(
            "bucket {physical} of spec.adopt.bucket does not exist (or the operator may not see it); adoption never creates a bucket"
        );
        status.ready(false, reason::BUCKET_NOT_FOUND, message);
        return Ok(None);
    };
    let known = status.status.create_time.is_some()
        && status.status.bucket_full_name.as_deref() == Some(physical);
    let ownership = request.ownership(&bucket);
    let was = match &ownership {
        Ownership::Ours | Ownership::Legacy if known => return Ok(Some((bucket, false))),
        Ownership::Ours | Ownership::Legacy => "already owned by this resource",
        Ownership::Unowned => "unowned",
        Ownership::Foreign(who) => {
            let message = format!(
                "cannot adopt bucket {physical}: it is owned by {who}. bucketmap adopts only a bucket that carries no owner label or that this cluster identity ({}) already owns for this Gcs; to move it, delete its Gcs there with deletionPolicy: Abandon",
                request.identity.cluster
            );
            refuse_adoption(ctx, status, request, message);
            return Ok(None);
        }
    };
    if !ctx.gcs.bucket_in_project(project, physical).await? {
        let message = format!(
            "cannot adopt bucket {physical}: it is not in project {project}, the project of this resource; bucketmap adopts only buckets of the resource's own project"
        );
        refuse_adoption(ctx, status, request, message);
        return Ok(None);
    }
    // A view from before an earlier adoption would adopt again.
    status.confirm_current().await?;
    info!(bucket = %physical, project, was, "adopting bucket");
    status.name(physical, project, 0);
    status.created_now();
    Ok(Some((bucket, true)))
}

fn refuse_adoption(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    message: String,
) {
    warn!(message, "adoption refused");
    let current = status.current(conditions::READY);
    if current.is_none_or(|c| c.reason != reason::ADOPTION_REFUSED || c.message != message) {
        ctx.event(
            request.obj,
            EventType::Warning,
            reason::ADOPTION_REFUSED,
            "AdoptBucket",
            message.clone(),
        );
    }
    status.ready(false, reason::ADOPTION_REFUSED, message);
}

/// Phase 4: the bucket's settings as declared, every change reported; for
/// a bucket adopted now, the `Adopted` condition says what changed.
async fn correct_drift(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    bucket: &Bucket,
    adopted_now: bool,
) -> Result<()> {
    let observed = Settings::observed(bucket);
    let mut drift = request.desired.drift(&observed);
    if drift.contains(&Field::IpFilter) && bucket.ip_filter.is_none() {
        check_ip_filter_visible(ctx, status, request, &bucket.bucket_id, &mut drift).await?;
    } else {
        status.condition(IP_FILTER_HIDDEN, None);
    }
    let changes: Vec<String> = drift
        .iter()
        .map(|field| request.desired.describe(&observed, *field))
        .collect();
    let physical = &bucket.bucket_id;
    if adopted_now {
        report_adoption(ctx, status, request, bucket, &changes);
    }
    report_immutable_drift(ctx, status, request, &observed, physical);
    report_locked_retention(ctx, status, request, &observed, physical);
    let mut metageneration = bucket.metageneration;
    if !drift.is_empty() {
        let mask: Vec<&str> = drift.iter().map(|f| f.mask_path()).collect();
        let updated = ctx
            .gcs
            .update_bucket(physical, request.desired.to_bucket(), &mask, metageneration)
            .await?;
        metageneration = updated.metageneration;
        info!(bucket = %physical, fields = ?mask, "corrected drift");
        ctx.event(
            request.obj,
            EventType::Normal,
            "Updated",
            "UpdateBucket",
            format!("Bucket {physical} set as declared: {}", changes.join("; ")),
        );
    }
    if request.desired.needs_lock(&observed) {
        lock_retention(ctx, request, physical, metageneration).await?;
    }
    Ok(())
}

/// The spec declares an IP filter and GCS returned the bucket without one:
/// either it has none, or GCS hides it because the operator lacks
/// `storage.buckets.getIpFilter`. Hidden, the filter leaves `drift` and
/// condition [`IP_FILTER_HIDDEN`] says why: writing a filter that cannot
/// be read back would rewrite it at every resync.
async fn check_ip_filter_visible(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    physical: &str,
    drift: &mut Vec<Field>,
) -> Result<()> {
    const GET_IP_FILTER: &str = "storage.buckets.getIpFilter";
    if ctx.gcs.has_permission(physical, GET_IP_FILTER).await? {
        status.condition(IP_FILTER_HIDDEN, None);
        return Ok(());
    }
    drift.retain(|f| *f != Field::IpFilter);
    let message = format!(
        "GCS hides the IP filter of bucket {physical} from the operator, which lacks {GET_IP_FILTER}: the filter is neither compared with the spec nor written; grant the operator's role that permission (deploy/gcp/bucketmap-operator-role.yaml)"
    );
    warn_condition(ctx, status, request, IP_FILTER_HIDDEN, message);
    Ok(())
}

/// Locks the bucket's retention policy (`isLocked: true`), at the
/// metageneration the drift phase left it at: a bucket changed since (by
/// somebody else) is not locked blind; the reconcile is retried.
async fn lock_retention(
    ctx: &Context,
    request: &BucketRequest<'_>,
    physical: &str,
    metageneration: i64,
) -> Result<()> {
    let locked = ctx
        .gcs
        .lock_retention_policy(physical, metageneration)
        .await?;
    let seconds = locked
        .retention_policy
        .as_ref()
        .and_then(|p| p.retention_duration.as_ref())
        .map_or(0, |d| d.seconds());
    info!(bucket = %physical, seconds, "locked the retention policy");
    ctx.event(
        request.obj,
        EventType::Normal,
        "RetentionPolicyLocked",
        "LockBucketRetentionPolicy",
        format!(
            "Locked the retention policy of bucket {physical} at {seconds}s (spec.retentionPolicy.isLocked): irreversible; the policy can only grow, and objects can be deleted only once older than it"
        ),
    );
    Ok(())
}

/// The `RetentionPolicyLocked` condition, and a warning when it appears or
/// changes: the spec asks for less than the bucket's locked retention
/// policy. Nothing is attempted (GCS would refuse); the bucket stays Ready.
fn report_locked_retention(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    observed: &Settings,
    physical: &str,
) {
    let Some(conflict) = request.desired.locked_retention_conflict(observed) else {
        status.condition(RETENTION_POLICY_LOCKED, None);
        return;
    };
    let message = format!(
        "bucket {physical}: {conflict}; GCS never shortens, removes or unlocks a locked retention policy, so bucketmap keeps it as it is: set spec.retentionPolicy to at least the locked period with isLocked: true"
    );
    warn_condition(ctx, status, request, RETENTION_POLICY_LOCKED, message);
}

/// The `ImmutableSettingsDiffer` condition, and a warning when it appears
/// or changes: settings GCS cannot change on an existing bucket. The bucket
/// is never re-created for them; it stays Ready as it is.
fn report_immutable_drift(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    observed: &Settings,
    physical: &str,
) {
    let differences: Vec<String> = request
        .desired
        .immutable_drift(observed)
        .into_iter()
        .map(|field| request.desired.describe(observed, field))
        .collect();
    if differences.is_empty() {
        status.condition(IMMUTABLE_SETTINGS_DIFFER, None);
        return;
    }
    let message = format!(
        "bucket {physical} differs from the spec in settings GCS fixes when a bucket is created ({}); bucketmap never re-creates a bucket to change them: to get a bucket with these settings, create a new Gcs resource",
        differences.join("; ")
    );
    warn_condition(ctx, status, request, IMMUTABLE_SETTINGS_DIFFER, message);
}

/// Sets condition `kind` true (its reason is its type) with `message`,
/// and warns with an event when it appears or its message changes, so
/// that a difference that persists is reported once.
fn warn_condition(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    kind: &'static str,
    message: String,
) {
    let current = status.current(kind);
    if current.is_none_or(|c| c.message != message) {
        let note = message.clone();
        ctx.event(request.obj, EventType::Warning, kind, "UpdateBucket", note);
    }
    status.condition(kind, Some((true, kind, message)));
}

/// The `Adopted` condition and event: the bucket, and every setting the
/// adoption changes (or cannot: the location).
fn report_adoption(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    request: &BucketRequest<'_>,
    bucket: &Bucket,
    changes: &[String],
) {
    let (physical, project) = (&bucket.bucket_id, request.project);
    let mut message = format!("Adopted bucket {physical} in project {project}; ");
    if changes.is_empty() {
        message.push_str("its settings already matched the spec");
    } else {
        message.push_str(&format!("settings changed: {}", changes.join("; ")));
    }
    let declared = request.obj.spec.location.to_ascii_uppercase();
    if !bucket.location.is_empty() && !bucket.location.eq_ignore_ascii_case(&declared) {
        message.push_str(&format!(
            "; location stays {} (spec.location is {declared}: a bucket cannot move)",
            bucket.location
        ));
    }
    status.condition(
        conditions::ADOPTED,
        Some((true, reason::ADOPTED, message.clone())),
    );
    ctx.event(
        request.obj,
        EventType::Normal,
        reason::ADOPTED,
        "AdoptBucket",
        message,
    );
}

/// Phase 5: the map entry and the binding Secret. Published before Ready:
/// Ready means the map has the entry. The wait for the map write gives the
/// work slot to another reconcile.
async fn publish(
    ctx: &Context,
    status: &mut StatusWriter<'_>,
    slot: &mut Slot,
    request: &BucketRequest<'_>,
    physical: &str,
) -> Result<ControlFlow<Action>> {
    let obj = request.obj;
    let verdict = slot
        .released_while(ctx.maps.publish(obj, physical))
        .await??;
    let (why, message) = match verdict {
        Verdict::Published if !ctx.config.service_binding => {
            status.status.binding = None;
            return Ok(ControlFlow::Continue(()));
        }
        Verdict::Published => {
            Box::pin(publish::write_binding(
                &ctx.client,
                &ctx.secrets,
                obj,
                physical,
                request.project,
            ))
            .await?;
            status.status.binding = Some(BindingReference {
                name: publish::binding_secret_name(&obj.name_any()),
            });
            return Ok(ControlFlow::Continue(()));
        }
        Verdict::Conflict(message) => (reason::MAPPING_CONFLICT, message),
        Verdict::TooLarge(message) => (reason::MAP_FULL, message),
    };
    Box::pin(status.not_ready(why, message)).await?;
    Ok(ControlFlow::Break(in_sync()))
}

/// Phase 6: `Ready` (written with the access phase's status).
fn mark_ready(status: &mut StatusWriter<'_>, physical: &str, project: &str) {
    status.ready(
        true,
        reason::BUCKET_READY,
        format!("Bucket {physical} is ready in project {project}"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "team-a";

    fn refusal_reason(r: std::result::Result<String, Refusal>) -> &'static str {
        match r {
            Ok(project) => panic!("resolved to {project}, expected a refusal"),
            Err(refusal) => refusal.reason,
        }
    }

    #[test]
    fn the_spec_project_wins_when_the_namespace_pins_none() {
        let p = project_for(NS, Some("spec-p"), None, Some("default-p"));
        assert_eq!(p, Ok("spec-p".to_owned()));
        let p = project_for(NS, Some("spec-p"), Some(""), Some("default-p"));
        assert_eq!(
            p,
            Ok("spec-p".to_owned()),
            "an empty annotation pins nothing"
        );
    }

    #[test]
    fn the_spec_project_must_match_the_namespace_annotation() {
        let p = project_for(NS, Some("same"), Some("same"), None);
        assert_eq!(p, Ok("same".to_owned()));
        let refused = project_for(NS, Some("spec-p"), Some("ns-p"), Some("default-p"));
        let Err(refusal) = refused else {
            panic!("a spec project other than the namespace's was accepted");
        };
        assert_eq!(refusal.reason, reason::PROJECT_NOT_ALLOWED);
        for part in ["spec-p", "ns-p", NS, PROJECT_ANNOTATION] {
            assert!(
                refusal.message.contains(part),
                "{part} in {}",
                refusal.message
            );
        }
    }

    #[test]
    fn the_namespace_annotation_comes_before_the_default() {
        let p = project_for(NS, None, Some("ns-p"), Some("default-p"));
        assert_eq!(p, Ok("ns-p".to_owned()));
        let p = project_for(NS, None, Some(""), Some("default-p"));
        assert_eq!(
            p,
            Ok("default-p".to_owned()),
            "an empty annotation is no project"
        );
        let p = project_for(NS, None, None, Some("default-p"));
        assert_eq!(p, Ok("default-p".to_owned()));
    }

    #[test]
    fn no_project_anywhere_is_project_missing() {
        let r = project_for(NS, None, None, None);
        assert_eq!(refusal_reason(r), reason::PROJECT_MISSING);
        let r = project_for(NS, None, Some(""), None);
        assert_eq!(refusal_reason(r), reason::PROJECT_MISSING);
    }

    #[test]
    fn a_bucket_never_moves_to_another_project() {
        let fresh = GcsStatus::default();
        assert_eq!(
            still_in_recorded_project(&fresh, "p2".into()),
            Ok("p2".to_owned())
        );
        let named = GcsStatus {
            project_id: Some("p1".into()),
            bucket_full_name: Some("photos-k3x9q2mw".into()),
            ..GcsStatus::default()
        };
        assert_eq!(
            still_in_recorded_project(&named, "p1".into()),
            Ok("p1".to_owned())
        );
        let r = still_in_recorded_project(&named, "p2".into());
        assert_eq!(refusal_reason(r), reason::PROJECT_CHANGED);
        // A project without a bucket name was never used for a bucket.
        let unnamed = GcsStatus {
            project_id: Some("p1".into()),
            ..GcsStatus::default()
        };
        assert_eq!(
            still_in_recorded_project(&unnamed, "p2".into()),
            Ok("p2".to_owned())
        );
    }

    #[test]
    fn naming_tries_max_attempts_candidates_then_reports_the_conflict() {
        let identity = Identity {
            cluster: "test",
            namespace: NS,
            name: "photos",
        };
        let mut attempt = 0;
        let mut tried = vec![naming::physical_name("photos", identity, attempt)];
        let message = loop {
            let taken = &tried[tried.len() - 1];
            match next_attempt(taken, attempt, 5) {
                Ok(next) => {
                    assert_eq!(next, attempt + 1);
                    attempt = next;
                    tried.push(naming::physical_name("photos", identity, attempt));
                }
                Err(message) => break message,
            }
        };
        assert_eq!(tried.len(), 5, "{tried:?}");
        let distinct: std::collections::HashSet<&String> = tried.iter().collect();
        assert_eq!(distinct.len(), 5, "candidates repeat: {tried:?}");
        assert!(tried.iter().all(|n| n.starts_with("photos-")), "{tried:?}");
        assert_eq!(
            message,
            format!(
                "bucket name {} and 4 earlier candidates belong to somebody else; gave up after 5 attempts",
                tried[4]
            )
        );
    }

    #[test]
    fn naming_resumes_from_the_recorded_attempt_and_respects_small_limits() {
        assert_eq!(next_attempt("b-2", 2, 5), Ok(3));
        assert!(next_attempt("b-4", 4, 5).is_err());
        let only_one = next_attempt("b-0", 0, 1);
        assert_eq!(
            only_one,
            Err("bucket name b-0 and 0 earlier candidates belong to somebody else; gave up after 1 attempts".to_owned())
        );
        assert!(next_attempt("b-0", 0, 0).is_err());
        assert!(next_attempt("b", u32::MAX, u32::MAX).is_err());
    }
}
