//! The checks can fail: a healthy world passes, and each broken promise
//! planted in it is reported.

use super::*;

fn planned(name: &str, orphan: bool, non_empty: bool, force_destroy: bool) -> Planned {
    Planned {
        namespace: "ns".into(),
        name: name.into(),
        logical: name.into(),
        project: "p".into(),
        orphan,
        abandon: false,
        non_empty,
        force_destroy,
    }
}

/// plain, orphan, blocked (non-empty, no forceDestroy), forced, abandoned.
fn plan() -> Vec<Planned> {
    vec![
        planned("plain", false, false, false),
        planned("kept", true, false, false),
        planned("blocked", false, true, false),
        planned("forced", false, true, true),
        Planned {
            abandon: true,
            ..planned("given", false, false, false)
        },
    ]
}

fn uid(name: &str) -> String {
    format!("uid-{name}")
}

/// The owner a bucket's labels name (`observe::owner_of`).
fn key(name: &str) -> String {
    format!("ns/{name}")
}

fn uids() -> BTreeMap<String, Recorded> {
    let recorded = |p: &Planned| Recorded {
        uid: uid(&p.name),
        physical: Some(format!("{}-x", p.logical)),
    };
    plan().iter().map(|p| (p.key(), recorded(p))).collect()
}

/// A bucket with the ownership labels of `owner` (`namespace/name`), as
/// the operator writes them; none for another owner.
fn bucket(owner: Option<String>, objects: usize) -> SeenBucket {
    let labels = owner
        .as_deref()
        .and_then(|o| o.split_once('/'))
        .map(|(namespace, name)| {
            bucketmap::naming::Identity {
                cluster: "c",
                namespace,
                name,
            }
            .labels()
        })
        .unwrap_or_default();
    SeenBucket {
        project: "p".into(),
        owner,
        labels,
        objects,
        metageneration: 1,
    }
}

/// The labels `given-x` is left with once its resource is deleted with
/// Abandon: none of bucketmap's.
fn abandon(w: &mut World) {
    if let Some(b) = w.buckets.get_mut("given-x") {
        *b = bucket(None, b.objects);
    }
}

fn foreign() -> BTreeMap<String, SeenBucket> {
    [("foreign-1".to_string(), bucket(None, 1))].into()
}

/// Everything Ready, published, one bucket each, plus the foreign bucket.
fn ready_world() -> World {
    let mut w = World::default();
    for p in plan() {
        let physical = format!("{}-x", p.logical);
        w.resources.insert(
            p.key(),
            SeenResource {
                uid: uid(&p.name),
                ready: true,
                reason: "BucketReady".into(),
                physical: Some(physical.clone()),
                finalizers: vec!["f".into()],
                deleting: false,
            },
        );
        let objects = usize::from(p.non_empty);
        w.buckets
            .insert(physical.clone(), bucket(Some(key(&p.name)), objects));
        w.maps
            .entry("ns".into())
            .or_default()
            .insert(p.logical.clone(), physical.clone());
        let secret = format!("ns/{}", bucketmap::publish::binding_secret_name(&p.name));
        let data = [
            ("bucket", physical.as_str()),
            ("logical-bucket", &p.logical),
            ("project", "p"),
        ];
        w.bindings.insert(
            secret,
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        w.ready_transitions.insert(uid(&p.name), 1);
        w.create_attempts.insert(physical);
    }
    w.buckets.extend(foreign());
    w
}

/// Deletes done: only "blocked" remains (DeletionBlocked, unpublished);
/// the buckets of "kept" and "blocked" stay.
fn blocked_world() -> World {
    let mut w = ready_world();
    w.maps.clear();
    w.bindings.clear();
    w.resources.retain(|k, _| k == "ns/blocked");
    if let Some(r) = w.resources.get_mut("ns/blocked") {
        r.ready = false;
        r.reason = "DeletionBlocked".into();
        r.deleting = true;
    }
    w.buckets
        .retain(|id, _| ["kept-x", "blocked-x", "given-x", "foreign-1"].contains(&id.as_str()));
    abandon(&mut w);
    w
}

/// The end: nothing left but the Orphan and Abandon buckets and the
/// foreign one.
fn end_world() -> World {
    let mut w = blocked_world();
    w.resources.clear();
    w.buckets.remove("blocked-x");
    w
}

fn foreign_ids() -> BTreeSet<String> {
    foreign().into_keys().collect()
}

fn expect_one(violations: &[Violation], needle: &str) {
    assert!(
        violations.iter().any(|v| v.contains(needle)),
        "no violation containing {needle:?} in {violations:#?}"
    );
}

#[test]
fn a_healthy_run_passes_every_check() {
    assert_eq!(
        all_ready(&plan(), &ready_world(), &foreign_ids()),
        Vec::<String>::new()
    );
    assert_eq!(
        after_deletes(&plan(), &uids(), &blocked_world()),
        Vec::<String>::new()
    );
    let (violations, tally) = at_end(&plan(), &uids(), &end_world(), &foreign());
    assert_eq!(violations, Vec::<String>::new());
    assert_eq!(tally, Tally::default());
}

#[test]
fn a_duplicate_bucket_is_reported_at_ready_and_at_the_end() {
    let mut w = ready_world();
    w.buckets
        .insert("plain-y".into(), bucket(Some(key("plain")), 0));
    w.create_attempts.insert("plain-y".into());
    let v = all_ready(&plan(), &w, &foreign_ids());
    expect_one(&v, "ns/plain: duplicate buckets");
    expect_one(&v, "ns/plain: 2 bucket names tried");
    let mut end = end_world();
    end.buckets
        .insert("kept-y".into(), bucket(Some(key("kept")), 0));
    let (v, tally) = at_end(&plan(), &uids(), &end, &foreign());
    expect_one(&v, "ns/kept: duplicate buckets");
    assert_eq!(tally.duplicates, 1);
}

#[test]
fn a_leaked_bucket_is_reported() {
    let mut w = ready_world();
    w.buckets
        .insert("stray".into(), bucket(Some("nobody".into()), 0));
    expect_one(
        &all_ready(&plan(), &w, &foreign_ids()),
        "leaked bucket stray",
    );
    let mut end = end_world();
    end.buckets
        .insert("plain-x".into(), bucket(Some(key("plain")), 0));
    let (v, tally) = at_end(&plan(), &uids(), &end, &foreign());
    expect_one(
        &v,
        "ns/plain: bucket plain-x still exists after the delete (leak)",
    );
    assert_eq!(tally.leaks, 1);
}

#[test]
fn a_stuck_finalizer_is_reported() {
    let mut w = blocked_world();
    let stuck = SeenResource {
        uid: uid("plain"),
        finalizers: vec!["storage.bucketmap.dev/finalizer".into()],
        deleting: true,
        reason: "GcsError".into(),
        ..SeenResource::default()
    };
    w.resources.insert("ns/plain".into(), stuck.clone());
    expect_one(
        &after_deletes(&plan(), &uids(), &w),
        "ns/plain: still present",
    );
    let mut end = end_world();
    end.resources.insert("ns/blocked".into(), stuck);
    let (v, _) = at_end(&plan(), &uids(), &end, &foreign());
    expect_one(&v, "ns/blocked: still present with finalizers");
}

#[test]
fn a_touched_foreign_bucket_is_reported() {
    let mut end = end_world();
    if let Some(b) = end.buckets.get_mut("foreign-1") {
        b.objects = 0;
    }
    let (v, _) = at_end(&plan(), &uids(), &end, &foreign());
    expect_one(&v, "foreign bucket foreign-1 was changed");
    end.buckets.remove("foreign-1");
    let (v, _) = at_end(&plan(), &uids(), &end, &foreign());
    expect_one(&v, "foreign bucket foreign-1 was deleted");
}

#[test]
fn a_missing_or_wrong_map_entry_or_binding_is_reported() {
    let mut w = ready_world();
    w.maps.get_mut("ns").map(|m| m.remove("plain"));
    w.bindings.remove("ns/kept-gcs-binding");
    let v = all_ready(&plan(), &w, &foreign_ids());
    expect_one(&v, "ns/plain: bucket map entry plain is None");
    expect_one(&v, "ns/kept: binding Secret ns/kept-gcs-binding is None");
    let mut blocked = blocked_world();
    blocked
        .maps
        .entry("ns".into())
        .or_default()
        .insert("blocked".into(), "blocked-x".into());
    let v = after_deletes(&plan(), &uids(), &blocked);
    expect_one(
        &v,
        "bucket map of ns: entry blocked -> blocked-x has no live resource",
    );
}

#[test]
fn deleting_what_must_stay_is_reported() {
    let mut w = blocked_world();
    w.buckets.remove("kept-x");
    if let Some(b) = w.buckets.get_mut("blocked-x") {
        b.objects = 0;
    }
    let v = after_deletes(&plan(), &uids(), &w);
    expect_one(&v, "ns/kept: its bucket was deleted");
    expect_one(
        &v,
        "ns/blocked: the objects of bucket blocked-x were deleted",
    );
    w.resources.clear();
    expect_one(
        &after_deletes(&plan(), &uids(), &w),
        "ns/blocked: deleted although",
    );
}

#[test]
fn ready_twice_or_never_is_reported() {
    let mut end = end_world();
    end.ready_transitions.insert(uid("plain"), 2);
    end.ready_transitions.remove(&uid("kept"));
    let (v, _) = at_end(&plan(), &uids(), &end, &foreign());
    expect_one(&v, "ns/plain: became Ready 2 times");
    expect_one(&v, "ns/kept: became Ready 0 times");
}

#[test]
fn a_bucket_left_without_an_expected_owner_is_reported_at_the_end() {
    let healthy = end_world();
    assert_eq!(
        unexpected_owners(&plan(), &uids(), &healthy, &foreign()),
        Vec::<String>::new()
    );
    assert_eq!(
        left(&plan(), &uids(), &healthy, &foreign()),
        Left {
            total: 3,
            foreign: 1,
            orphaned: 1,
            abandoned: 1
        }
    );
    let census = |w: &World| {
        let (v, tally) = at_end(&plan(), &uids(), w, &foreign());
        assert!(tally.leaks > 0, "{v:#?}");
        v
    };
    // No labels, and not one the run put there or abandoned.
    let mut end = end_world();
    end.buckets.insert("stray".into(), bucket(None, 0));
    expect_one(&census(&end), "bucket stray has no owner the run expects");
    // The labels of an Orphan resource, but one of them missing.
    let mut end = end_world();
    if let Some(b) = end.buckets.get_mut("kept-x") {
        b.labels.remove(bucketmap::naming::MANAGED_BY_LABEL);
    }
    expect_one(&census(&end), "bucket kept-x has no owner the run expects");
    // Complete labels of a resource deleted with Delete.
    let mut end = end_world();
    end.buckets
        .insert("plain-x".into(), bucket(Some(key("plain")), 0));
    expect_one(
        &census(&end),
        "bucket plain-x has no owner the run expects: owned by ns/plain",
    );
    // Abandon that left bucketmap's labels, or deleted the bucket.
    let mut end = end_world();
    end.buckets
        .insert("given-x".into(), bucket(Some(key("given")), 0));
    let v = census(&end);
    expect_one(&v, "bucket given-x has no owner the run expects");
    expect_one(&v, "ns/given: Abandon kept bucketmap's labels");
    let mut end = end_world();
    end.buckets.remove("given-x");
    let (v, _) = at_end(&plan(), &uids(), &end, &foreign());
    expect_one(&v, "ns/given: its bucket \"given-x\" was deleted");
}
