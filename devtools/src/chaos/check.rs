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
        self.non_empty && !self.force_destroy && !self.orphan
    }

    /// What kind of resource it is, for messages.
    pub fn kind(&self) -> &'static str {
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
        self.orphan
    }
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
/// `uids` are the resources' uids recorded when they were Ready.
pub fn after_deletes(
    plan: &[Planned],
    uids: &BTreeMap<String, String>,
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
        out.extend(bucket_fate(p, uids.get(&p.key()), world, p.blocked()));
    }
    out.extend(extra_map_entries(plan, world));
    out
}

/// The resource's bucket exists (with its objects) when it must stay, and
/// is gone otherwise.
fn bucket_fate(
    p: &Planned,
    uid: Option<&String>,
    world: &World,
    blocked_now: bool,
) -> Vec<Violation> {
    if uid.is_none() {
        return vec![format!("{}: its uid was never recorded", p.key())];
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

/// The end: no resource left (no finalizer stuck), only Orphan buckets
/// kept, foreign buckets exactly as they were, every resource Ready
/// exactly once. Returns the violations and the leak/duplicate tally.
pub fn at_end(
    plan: &[Planned],
    uids: &BTreeMap<String, String>,
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
        let fate = bucket_fate(p, uids.get(&p.key()), world, false);
        tally.leaks += fate.iter().filter(|v| v.contains("(leak)")).count();
        tally.duplicates += fate.iter().filter(|v| v.contains("duplicate")).count();
        out.extend(fate);
        let transitions = uids
            .get(&p.key())
            .and_then(|uid| world.ready_transitions.get(uid))
            .copied()
            .unwrap_or(0);
        if transitions != 1 {
            out.push(format!(
                "{}: became Ready {transitions} times, expected exactly once",
                p.key()
            ));
        }
    }
    let ours: BTreeSet<String> = uids.keys().cloned().collect();
    for (id, b) in &world.buckets {
        let known =
            foreign_before.contains_key(id) || b.owner.as_ref().is_some_and(|o| ours.contains(o));
        if !known {
            tally.leaks += 1;
            out.push(format!("leaked bucket {id} (owner label {:?})", b.owner));
        }
    }
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
