//! The checks of the chaos run, on plain data: what was planned and what
//! was observed at three moments (all Ready; deletes done but the
//! non-empty buckets without forceDestroy; everything gone). Each broken
//! promise becomes one [`Violation`] with a message naming the resource
//! or bucket; the run fails when there is any.

use std::collections::{BTreeMap, BTreeSet};

/// What one planned `Gcs` resource is, and so what must happen to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub namespace: String,
    pub name: String,
    /// `spec.bucketName` (unique over the run).
    pub logical: String,
    pub project: String,
    /// `deletionPolicy: Orphan`: the bucket stays after the delete.
    pub orphan: bool,
    /// `deletionPolicy: Abandon`: the bucket stays after the delete,
    /// without bucketmap's labels (never with `orphan`).
    pub abandon: bool,
    /// An object is put in the bucket once it is Ready.
    pub non_empty: bool,
    /// `spec.forceDestroy`.
    pub force_destroy: bool,
}

impl Planned {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Deleting it must stop at `DeletionBlocked` (a person has to act).
    pub fn blocked(&self) -> bool {
        self.non_empty && !self.force_destroy && !self.keeps_bucket()
    }

    /// What kind of resource it is, for messages.
    pub fn kind(&self) -> &'static str {
        if self.abandon {
            return "Abandon";
        }
        match (self.orphan, self.non_empty, self.force_destroy) {
            (true, true, _) => "Orphan, non-empty",
            (true, false, _) => "Orphan",
            (false, true, true) => "non-empty, forceDestroy",
            (false, true, false) => "non-empty, no forceDestroy",
            (false, false, _) => "Delete",
        }
    }

    /// Its bucket outlives the resource (by design).
    pub fn keeps_bucket(&self) -> bool {
        self.orphan || self.abandon
    }
}

/// What was recorded of a resource when all were Ready.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    pub uid: String,
    /// Its bucket, as its status named it.
    pub physical: Option<String>,
}

/// A `Gcs` resource as the API server shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeenResource {
    pub uid: String,
    pub ready: bool,
    /// Reason of the `Ready` condition.
    pub reason: String,
    pub physical: Option<String>,
    pub finalizers: Vec<String>,
    pub deleting: bool,
}

/// A bucket in the mock GCS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeenBucket {
    pub project: String,
    /// The Gcs (`namespace/name`) the ownership labels name, when the owner
    /// key (`bucketmap-owner`) matches them (see `observe::owner_of`).
    pub owner: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub metageneration: i64,
    pub objects: usize,
}

/// Everything observable at one moment.
#[derive(Debug, Clone, Default)]
pub struct World {
    /// `Gcs` resources by `namespace/name`.
    pub resources: BTreeMap<String, SeenResource>,
    /// Buckets by id.
    pub buckets: BTreeMap<String, SeenBucket>,
    /// Bucket map entries (logical → physical) by namespace.
    pub maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Binding Secrets' data by `namespace/secret name`.
    pub bindings: BTreeMap<String, BTreeMap<String, String>>,
    /// Transitions into Ready seen by the watch, by uid.
    pub ready_transitions: BTreeMap<String, u32>,
    /// Bucket ids named by CreateBucket calls (any outcome).
    pub create_attempts: BTreeSet<String>,
}

/// One broken promise.
pub type Violation = String;

/// Counts the report prints.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub leaks: usize,
    pub duplicates: usize,
}

/// All Ready: each resource Ready with exactly one bucket (its recorded
/// one, ours, in its project), one name tried, its map entry and binding
/// Secret; nothing else in the maps, no bucket that is neither foreign nor
/// a resource's.
pub fn all_ready(plan: &[Planned], world: &World, foreign: &BTreeSet<String>) -> Vec<Violation> {
    let mut out = Vec::new();
    for p in plan {
        let Some(seen) = world.resources.get(&p.key()) else {
            out.push(format!("{}: missing", p.key()));
            continue;
        };
        if !seen.ready {
            out.push(format!("{}: not Ready ({})", p.key(), seen.reason));
        }
        out.extend(one_bucket(p, seen, world));
        out.extend(published(p, seen, world));
    }
    out.extend(extra_map_entries(plan, world));
    out.extend(leaks(plan, world, foreign).into_iter().map(|(_, v)| v));
    out
}

/// Exactly one bucket owned by the resource, the one its status names,
/// in its project; exactly one name tried.
fn one_bucket(p: &Planned, seen: &SeenResource, world: &World) -> Vec<Violation> {
    let mut out = Vec::new();
    let owner = p.key();
    let owned: Vec<&String> = world
        .buckets
        .iter()
        .filter(|(_, b)| b.owner.as_deref() == Some(owner.as_str()))
        .map(|(id, _)| id)
        .collect();
    match (owned.as_slice(), &seen.physical) {
        ([id], Some(physical)) if *id == physical => {}
        ([], _) => out.push(format!("{}: no bucket", p.key())),
        ([id], physical) => out.push(format!(
            "{}: owns bucket {id} but its status names {physical:?}",
            p.key()
        )),
        (many, _) => out.push(format!("{}: duplicate buckets {many:?}", p.key())),
    }
    if let Some(bucket) = seen.physical.as_ref().and_then(|id| world.buckets.get(id))
        && bucket.project != p.project
    {
        out.push(format!(
            "{}: bucket in project {}, expected {}",
            p.key(),
            bucket.project,
            p.project
        ));
    }
    let prefix = format!("{}-", p.logical);
    let tried = world
        .create_attempts
        .iter()
        .filter(|id| id.starts_with(&prefix))
        .count();
    if tried > 1 {
        out.push(format!(
            "{}: {tried} bucket names tried (a second bucket was created)",
            p.key()
        ));
    }
    out
}

/// The map entry and the binding Secret name the resource's bucket.
fn published(p: &Planned, seen: &SeenResource, world: &World) -> Vec<Violation> {
    let mut out = Vec::new();
    let physical = seen.physical.clone().unwrap_or_default();
    let entry = world.maps.get(&p.namespace).and_then(|m| m.get(&p.logical));
    if entry != Some(&physical) {
        out.push(format!(
            "{}: bucket map entry {} is {entry:?}, expected {physical}",
            p.key(),
            p.logical
        ));
    }
    let secret = format!(
        "{}/{}",
        p.namespace,
        bucketmap::publish::binding_secret_name(&p.name)
    );
    let data = world.bindings.get(&secret);
    let field = |k: &str| data.and_then(|d| d.get(k)).map(String::as_str);
    if field("bucket") != Some(physical.as_str())
        || field("logical-bucket") != Some(p.logical.as_str())
        || field("project") != Some(p.project.as_str())
    {
        out.push(format!(
            "{}: binding Secret {secret} is {data:?}, expected bucket {physical} in project {}",
            p.key(),
            p.project
        ));
    }
    out
}

/// Map entries and binding Secrets no live resource explains.
fn extra_map_entries(plan: &[Planned], world: &World) -> Vec<Violation> {
    let live = |ns: &str, pred: &dyn Fn(&Planned) -> bool| {
        plan.iter().any(|p| {
            p.namespace == ns
                && pred(p)
                && world.resources.get(&p.key()).is_some_and(|r| !r.deleting)
        })
    };
    let mut out = Vec::new();
    for (ns, entries) in &world.maps {
        for (logical, physical) in entries {
            if !live(ns, &|p| &p.logical == logical) {
                let kind = plan
                    .iter()
                    .find(|p| &p.logical == logical)
                    .map_or("not planned", Planned::kind);
                out.push(format!(
                    "bucket map of {ns}: entry {logical} -> {physical} has no live resource ({kind})"
                ));
            }
        }
    }
    for secret in world.bindings.keys() {
        let (ns, name) = secret.split_once('/').unwrap_or_default();
        if !live(ns, &|p| {
            bucketmap::publish::binding_secret_name(&p.name) == name
        }) {
            out.push(format!("binding Secret {secret} has no live resource"));
        }
    }
    out
}

/// Buckets that are neither foreign nor owned by a planned resource that
/// may have one now: `(bucket id, message)`.
fn leaks(plan: &[Planned], world: &World, foreign: &BTreeSet<String>) -> Vec<(String, Violation)> {
    let may_own: BTreeSet<String> = plan
        .iter()
        .filter(|p| world.resources.contains_key(&p.key()))
        .map(Planned::key)
        .collect();
    world
        .buckets
        .iter()
        .filter(|(id, b)| {
            !foreign.contains(*id) && !b.owner.as_ref().is_some_and(|o| may_own.contains(o))
        })
        .map(|(id, b)| {
            let message = format!("leaked bucket {id} (owner label {:?})", b.owner);
            (id.clone(), message)
        })
        .collect()
}

/// After every delete: only the blocked resources remain, each with its
/// finalizer, `DeletionBlocked`, and its bucket with its objects; Orphan
/// buckets stay; every other bucket is gone; no map entry or binding left.
/// `recorded` is what the resources' statuses said when they were Ready.
pub fn after_deletes(
    plan: &[Planned],
    recorded: &BTreeMap<String, Recorded>,
    world: &World,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for p in plan {
        let seen = world.resources.get(&p.key());
        match (p.blocked(), seen) {
            (true, None) => out.push(format!(
                "{}: deleted although its bucket is not empty and forceDestroy is off",
                p.key()
            )),
            (true, Some(r)) if r.reason != "DeletionBlocked" || r.finalizers.is_empty() => {
                out.push(format!(
                    "{}: blocked deletion shows reason {:?}, finalizers {:?}",
                    p.key(),
                    r.reason,
                    r.finalizers
                ));
            }
            (false, Some(r)) => out.push(format!(
                "{}: still present (finalizers {:?}, reason {:?}): stuck",
                p.key(),
                r.finalizers,
                r.reason
            )),
            _ => {}
        }
        out.extend(bucket_fate(p, recorded.get(&p.key()), world, p.blocked()));
    }
    out.extend(extra_map_entries(plan, world));
    out
}

/// The resource's bucket exists (with its objects) when it must stay, and
/// is gone otherwise.
fn bucket_fate(
    p: &Planned,
    recorded: Option<&Recorded>,
    world: &World,
    blocked_now: bool,
) -> Vec<Violation> {
    let Some(recorded) = recorded else {
        return vec![format!("{}: its uid was never recorded", p.key())];
    };
    if p.abandon {
        return abandoned_fate(p, recorded, world);
    }
    let owner = p.key();
    let owned: Vec<(&String, &SeenBucket)> = world
        .buckets
        .iter()
        .filter(|(_, b)| b.owner.as_deref() == Some(owner.as_str()))
        .collect();
    let must_stay = p.keeps_bucket() || blocked_now;
    match owned.as_slice() {
        [] if must_stay => vec![format!("{}: its bucket was deleted", p.key())],
        [(id, b)] if must_stay && p.non_empty && b.objects == 0 => {
            vec![format!(
                "{}: the objects of bucket {id} were deleted",
                p.key()
            )]
        }
        [] | [_] if must_stay => vec![],
        [] => vec![],
        [(id, _)] => vec![format!(
            "{}: bucket {id} still exists after the delete (leak)",
            p.key()
        )],
        many => vec![format!(
            "{}: duplicate buckets {:?}",
            p.key(),
            many.iter().map(|(id, _)| id).collect::<Vec<_>>()
        )],
    }
}

/// An Abandon resource's bucket, once the resource is deleted: the one its
/// status named, kept, without bucketmap's labels; no other bucket of its.
fn abandoned_fate(p: &Planned, recorded: &Recorded, world: &World) -> Vec<Violation> {
    let mut out = Vec::new();
    let physical = recorded.physical.as_deref().unwrap_or_default();
    match world.buckets.get(physical) {
        None => out.push(format!("{}: its bucket {physical:?} was deleted", p.key())),
        Some(b) => {
            let kept: Vec<&String> = ownership_labels(b).collect();
            if !kept.is_empty() {
                out.push(format!(
                    "{}: Abandon kept bucketmap's labels {kept:?} on bucket {physical}",
                    p.key()
                ));
            }
        }
    }
    let owner = p.key();
    for id in world.buckets.iter().filter_map(|(id, b)| {
        (id != physical && b.owner.as_deref() == Some(owner.as_str())).then_some(id)
    }) {
        out.push(format!(
            "{}: bucket {id} still exists after the delete (leak)",
            p.key()
        ));
    }
    out
}

/// The ownership labels (`naming::OWNERSHIP_LABELS`) a bucket carries.
fn ownership_labels(b: &SeenBucket) -> impl Iterator<Item = &String> {
    b.labels
        .keys()
        .filter(|k| bucketmap::naming::OWNERSHIP_LABELS.contains(&k.as_str()))
}

/// Every bucket left has an owner the run expects: a foreign one it put
/// there; one the run deleted with Abandon, without bucketmap's labels;
/// or one carrying all of bucketmap's ownership labels (`managed-by`
/// bucketmap, the owner key of the cluster, namespace and name they
/// name) for a `Gcs` that exists or that the run deleted with Orphan.
/// Any other is reported by its id.
pub fn unexpected_owners(
    plan: &[Planned],
    recorded: &BTreeMap<String, Recorded>,
    world: &World,
    foreign: &BTreeMap<String, SeenBucket>,
) -> Vec<Violation> {
    use bucketmap::naming::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNERSHIP_LABELS};
    let abandoned: BTreeSet<&str> = plan
        .iter()
        .filter(|p| p.abandon)
        .filter_map(|p| recorded.get(&p.key())?.physical.as_deref())
        .collect();
    let orphaned: BTreeSet<String> = plan.iter().filter(|p| p.orphan).map(Planned::key).collect();
    let mut out = Vec::new();
    for (id, b) in &world.buckets {
        if foreign.contains_key(id) {
            continue;
        }
        let labelled = OWNERSHIP_LABELS.iter().all(|k| b.labels.contains_key(*k))
            && b.labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_VALUE);
        let problem = match (&b.owner, labelled) {
            (_, false) if abandoned.contains(id.as_str()) => {
                if ownership_labels(b).next().is_none() {
                    continue;
                }
                "some of bucketmap's labels left after Abandon".to_owned()
            }
            (Some(owner), true)
                if world.resources.contains_key(owner) || orphaned.contains(owner) =>
            {
                continue;
            }
            (Some(owner), true) => {
                format!("owned by {owner}, which neither exists nor was deleted with Orphan")
            }
            _ => "without bucketmap's complete ownership labels".to_owned(),
        };
        out.push(format!(
            "bucket {id} has no owner the run expects: {problem} (labels {:?})",
            b.labels
        ));
    }
    out
}

/// The buckets left, by the owner the run expects for them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    pub total: usize,
    pub foreign: usize,
    pub orphaned: usize,
    pub abandoned: usize,
}

/// Counts the buckets left (what [`unexpected_owners`] looked at).
pub fn left(
    plan: &[Planned],
    recorded: &BTreeMap<String, Recorded>,
    world: &World,
    foreign: &BTreeMap<String, SeenBucket>,
) -> Left {
    let physical = |p: &Planned| recorded.get(&p.key())?.physical.clone();
    let abandoned: BTreeSet<String> = plan
        .iter()
        .filter(|p| p.abandon)
        .filter_map(physical)
        .collect();
    let orphaned: BTreeSet<String> = plan.iter().filter(|p| p.orphan).map(Planned::key).collect();
    let count = |f: &dyn Fn(&String, &SeenBucket) -> bool| {
        world.buckets.iter().filter(|(id, b)| f(id, b)).count()
    };
    Left {
        total: world.buckets.len(),
        foreign: count(&|id, _| foreign.contains_key(id)),
        orphaned: count(&|_, b| b.owner.as_ref().is_some_and(|o| orphaned.contains(o))),
        abandoned: count(&|id, _| abandoned.contains(id)),
    }
}

/// The end: no resource left (no finalizer stuck), only Orphan and Abandon
/// buckets kept, every bucket with an owner the run expects
/// ([`unexpected_owners`]), foreign buckets exactly as they were, every
/// resource Ready exactly once. Returns the violations and the
/// leak/duplicate tally.
pub fn at_end(
    plan: &[Planned],
    recorded: &BTreeMap<String, Recorded>,
    world: &World,
    foreign_before: &BTreeMap<String, SeenBucket>,
) -> (Vec<Violation>, Tally) {
    let mut out = Vec::new();
    let mut tally = Tally::default();
    for p in plan {
        if let Some(r) = world.resources.get(&p.key()) {
            out.push(format!(
                "{}: still present with finalizers {:?} (reason {:?})",
                p.key(),
                r.finalizers,
                r.reason
            ));
        }
        let fate = bucket_fate(p, recorded.get(&p.key()), world, false);
        tally.duplicates += fate.iter().filter(|v| v.contains("duplicate")).count();
        out.extend(fate);
        let transitions = recorded
            .get(&p.key())
            .and_then(|r| world.ready_transitions.get(&r.uid))
            .copied()
            .unwrap_or(0);
        if transitions != 1 {
            out.push(format!(
                "{}: became Ready {transitions} times, expected exactly once",
                p.key()
            ));
        }
    }
    // Every bucket a resource left behind that it should not have is
    // one here (so a leak is counted once, by its bucket).
    let unexpected = unexpected_owners(plan, recorded, world, foreign_before);
    tally.leaks += unexpected.len();
    out.extend(unexpected);
    out.extend(foreign_untouched(foreign_before, world));
    out.extend(extra_map_entries(plan, world));
    (out, tally)
}

/// Every foreign bucket still exists, unchanged (labels, metageneration,
/// object count).
fn foreign_untouched(before: &BTreeMap<String, SeenBucket>, world: &World) -> Vec<Violation> {
    before
        .iter()
        .filter_map(|(id, then)| match world.buckets.get(id) {
            None => Some(format!("foreign bucket {id} was deleted")),
            Some(now) if now != then => Some(format!(
                "foreign bucket {id} was changed: {then:?} -> {now:?}"
            )),
            Some(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
