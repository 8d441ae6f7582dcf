//! Retention: a policy locked only when the spec says so, never shortened
//! or unlocked; a locked bucket's young objects keep it (and its resource)
//! through `forceDestroy`; object retention set at creation.

use serde_json::json;
use tonic::Code;

use super::harness::{Harness, NS, condition, ready};
use crate::Error;
use crate::conditions::{IMMUTABLE_SETTINGS_DIFFER, RETENTION_POLICY_LOCKED, reason};
use crate::crd::{FINALIZER, Gcs};

const LOCK: &str = "LockBucketRetentionPolicy";

fn locked_spec(seconds: i64) -> serde_json::Value {
    json!({"bucketName": "photos", "forceDestroy": true,
           "retentionPolicy": {"retentionPeriodSeconds": seconds, "isLocked": true}})
}

/// `Gcs` photos Ready with `spec`; its bucket's name.
async fn ready_photos(h: &Harness, spec: serde_json::Value) -> String {
    h.create("photos", spec);
    let g = h.reconcile_until_ready("photos").await;
    g.status.and_then(|s| s.bucket_full_name).expect("a bucket")
}

fn policy(h: &Harness, physical: &str) -> (i64, bool) {
    let bucket = h.gcs.bucket(physical).expect("the bucket exists");
    let p = bucket.retention_policy.expect("a retention policy");
    (p.retention_duration.map_or(0, |d| d.seconds), p.is_locked)
}

/// The GCS calls that are neither reads nor listings.
fn gcs_writes(h: &Harness) -> Vec<String> {
    let calls = h.gcs.calls().into_iter().map(|c| c.method);
    calls
        .filter(|m| !m.starts_with("Get") && !m.starts_with("List"))
        .collect()
}

/// Makes every generation of `name` in `physical` older by `seconds`.
fn age(h: &Harness, physical: &str, name: &str, seconds: i64) {
    let aged = h.gcs.modify_objects(physical, name, |o| {
        if let Some(t) = o.create_time.as_mut() {
            t.seconds -= seconds;
        }
    });
    assert_eq!(aged, 1, "{name} exists");
}

#[tokio::test]
async fn reconcile_locks_the_retention_policy_once_when_the_spec_says_so() {
    let h = Harness::new().await;
    let physical = ready_photos(&h, locked_spec(3600)).await;
    assert_eq!(policy(&h, &physical), (3600, true));
    assert_eq!(h.gcs.call_count(LOCK), 1, "{:?}", h.gcs.calls());
    let event = h.event("photos", "RetentionPolicyLocked").await;
    assert!(
        event
            .note
            .is_some_and(|n| n.contains(&physical) && n.contains("irreversible"))
    );

    h.gcs.reset_calls();
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert!(h.gcs.call_count("GetBucket") >= 1, "the bucket was checked");
    assert_eq!(
        gcs_writes(&h),
        Vec::<String>::new(),
        "nothing written in sync"
    );
}

#[tokio::test]
async fn reconcile_never_locks_a_policy_the_spec_leaves_unlocked() {
    let h = Harness::new().await;
    let spec = json!({"bucketName": "photos",
                      "retentionPolicy": {"retentionPeriodSeconds": 3600, "isLocked": false}});
    let physical = ready_photos(&h, spec).await;
    assert_eq!(policy(&h, &physical), (3600, false));
    assert_eq!(h.gcs.call_count(LOCK), 0);

    // Grown and locked in one spec change: updated, then locked at the
    // metageneration the update left.
    h.gcs.reset_calls();
    h.api.modify::<Gcs>(NS, "photos", |g| {
        g["spec"]["retentionPolicy"] = json!({"retentionPeriodSeconds": 7200, "isLocked": true})
    });
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(gcs_writes(&h), ["UpdateBucket", LOCK]);
    assert!(
        h.gcs.calls().iter().all(|c| c.code == Code::Ok),
        "{:?}",
        h.gcs.calls()
    );
    assert_eq!(policy(&h, &physical), (7200, true));
}

#[tokio::test]
async fn reconcile_never_shortens_removes_or_unlocks_a_locked_policy() {
    let h = Harness::new().await;
    let physical = ready_photos(&h, locked_spec(3600)).await;
    // The API server refuses these (CEL); a spec from before the lock, or
    // an adopted locked bucket, asks for them all the same.
    let asks = [
        (
            json!({"retentionPeriodSeconds": 60, "isLocked": true}),
            "a retention period of 60s",
        ),
        (
            json!({"retentionPeriodSeconds": 3600}),
            "an unlocked policy",
        ),
        (serde_json::Value::Null, "no retention policy"),
    ];
    for (asked, words) in asks {
        h.gcs.reset_calls();
        h.api.modify::<Gcs>(NS, "photos", |g| {
            g["spec"]["retentionPolicy"] = asked.clone()
        });
        h.reconcile("photos").await.expect("the reconcile succeeds");
        assert_eq!(
            gcs_writes(&h),
            Vec::<String>::new(),
            "{asked}: nothing attempted"
        );
        assert_eq!(policy(&h, &physical), (3600, true), "{asked}");
        let g = h.get("photos").expect("the resource exists");
        let c = condition(&g, RETENTION_POLICY_LOCKED).expect("the condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", RETENTION_POLICY_LOCKED)
        );
        assert!(
            c.message.contains("locked at 3600s") && c.message.contains(words),
            "{}",
            c.message
        );
        assert_eq!(
            ready(&g).map(|c| c.status),
            Some("True".to_owned()),
            "{asked}"
        );
    }
    h.event("photos", RETENTION_POLICY_LOCKED).await;

    // Longer is what GCS allows: done, and the condition goes.
    h.api.modify::<Gcs>(NS, "photos", |g| {
        g["spec"]["retentionPolicy"] = json!({"retentionPeriodSeconds": 7200, "isLocked": true})
    });
    h.gcs.reset_calls();
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(gcs_writes(&h), ["UpdateBucket"]);
    assert_eq!(policy(&h, &physical), (7200, true));
    let g = h.get("photos").expect("the resource exists");
    assert!(condition(&g, RETENTION_POLICY_LOCKED).is_none());
}

/// `Gcs` photos is kept, with its finalizer, at `Ready=False`,
/// `RetentionLocked`, its message holding every one of `parts`.
fn assert_kept_waiting(h: &Harness, parts: &[&str]) {
    let g = h.get("photos").expect("the resource is kept");
    assert_eq!(g.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    let ready = ready(&g).expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reason::RETENTION_LOCKED)
    );
    for part in parts {
        assert!(ready.message.contains(part), "{part} in {}", ready.message);
    }
}

/// [`assert_kept_waiting`] for one young object under a policy locked at
/// 3600 s.
fn assert_kept_for_retention(h: &Harness, physical: &str) {
    assert_kept_waiting(
        h,
        &[
            physical,
            "locked at 3600s",
            "1 object versions are under retention",
            "until",
        ],
    );
}

/// The codes the mock answered DeleteObject calls with since its last reset.
fn object_deletes(h: &Harness) -> Vec<Code> {
    h.gcs
        .calls()
        .into_iter()
        .filter(|c| c.method == "DeleteObject")
        .map(|c| c.code)
        .collect()
}

#[tokio::test]
async fn reconcile_keeps_a_locked_bucket_until_its_objects_expire_then_deletes_it() {
    let h = Harness::new().await;
    let physical = ready_photos(&h, locked_spec(3600)).await;
    for name in ["young.txt", "old.txt"] {
        h.gcs.put_object(&physical, name).expect("an object");
    }
    age(&h, &physical, "old.txt", 3601);
    h.delete("photos").await;
    h.gcs.reset_calls();

    let error = h.reconcile("photos").await.expect_err("the deletion waits");
    assert!(matches!(error, Error::RetentionLocked(_)), "{error}");
    let names: Vec<String> = h
        .gcs
        .objects(&physical)
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(
        names,
        ["young.txt"],
        "the expired object was deleted, the young one kept"
    );
    assert_eq!(
        object_deletes(&h),
        [Code::Ok],
        "one delete, which succeeded: never an attempt on a retained object"
    );
    assert_eq!(
        h.gcs.call_count("DeleteBucket") + h.gcs.call_count("UpdateBucket"),
        0
    );
    assert_kept_for_retention(&h, &physical);
    h.event("photos", reason::RETENTION_LOCKED).await;

    age(&h, &physical, "young.txt", 3601);
    h.reconcile("photos").await.expect("the cleanup succeeds");
    assert!(h.gcs.bucket(&physical).is_none(), "the bucket is deleted");
    assert!(h.get("photos").is_none(), "the finalizer was removed");
}

#[tokio::test]
async fn reconcile_keeps_an_unlocked_policy_and_waits_for_young_objects() {
    let h = Harness::new().await;
    let spec = json!({"bucketName": "photos", "forceDestroy": true,
                      "retentionPolicy": {"retentionPeriodSeconds": 3600}});
    let physical = ready_photos(&h, spec).await;
    h.gcs.put_object(&physical, "young.txt").expect("an object");
    h.gcs.reset_calls();
    h.delete("photos").await;
    let err = h
        .reconcile("photos")
        .await
        .expect_err("the young object keeps the bucket");
    assert!(err.to_string().contains("not locked"), "{err}");
    assert_eq!(
        h.gcs.call_count("UpdateBucket") + h.gcs.call_count("DeleteObject"),
        0,
        "the policy is not removed, the young object not touched"
    );
    assert_kept_waiting(&h, &[&physical, "keeps objects 3600s; it is not locked"]);
    let bucket = h.gcs.bucket(&physical).expect("the bucket is kept");
    assert!(bucket.retention_policy.is_some(), "the policy is kept");

    age(&h, &physical, "young.txt", 3601);
    h.reconcile("photos").await.expect("the cleanup succeeds");
    assert!(h.gcs.bucket(&physical).is_none(), "the bucket is deleted");
    assert!(h.get("photos").is_none(), "the finalizer was removed");
}

#[tokio::test]
async fn reconcile_creates_object_retention_and_reports_a_bucket_without_it() {
    let h = Harness::new().await;
    let spec = json!({"bucketName": "photos", "objectRetention": {"mode": "Enabled"}});
    let physical = ready_photos(&h, spec).await;
    let bucket = h.gcs.bucket(&physical).expect("the bucket exists");
    assert!(bucket.object_retention.is_some_and(|r| r.enabled));
    h.gcs.reset_calls();
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(
        gcs_writes(&h),
        Vec::<String>::new(),
        "nothing written in sync"
    );

    // A bucket found again without it: reported, never re-created.
    h.gcs
        .modify_bucket(&physical, |b| b.object_retention = None)
        .expect("the bucket exists");
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let g = h.get("photos").expect("the resource exists");
    let c = condition(&g, IMMUTABLE_SETTINGS_DIFFER).expect("the condition");
    assert!(
        c.message.contains("objectRetention: off → on"),
        "{}",
        c.message
    );
    assert_eq!(gcs_writes(&h), Vec::<String>::new());
}

#[tokio::test]
async fn reconcile_leaves_held_objects_and_waits_for_their_release() {
    let h = Harness::new().await;
    let spec = json!({"bucketName": "photos", "forceDestroy": true});
    let physical = ready_photos(&h, spec).await;
    for name in ["temporary.txt", "event.txt", "free.txt"] {
        h.gcs.put_object(&physical, name).expect("an object");
    }
    h.gcs
        .modify_objects(&physical, "temporary.txt", |o| o.temporary_hold = true);
    h.gcs
        .modify_objects(&physical, "event.txt", |o| o.event_based_hold = Some(true));
    h.gcs.reset_calls();
    h.delete("photos").await;
    let err = h
        .reconcile("photos")
        .await
        .expect_err("the held objects keep the bucket");
    assert!(matches!(err, Error::RetentionLocked(_)), "{err}");
    assert!(
        err.to_string()
            .contains("2 object versions have a temporary or event-based hold")
    );
    assert_eq!(
        object_deletes(&h),
        [Code::Ok],
        "one delete, of the free object, which succeeded"
    );
    assert_kept_waiting(
        &h,
        &["2 object versions have a temporary or event-based hold"],
    );

    for name in ["temporary.txt", "event.txt"] {
        h.gcs.modify_objects(&physical, name, |o| {
            o.temporary_hold = false;
            o.event_based_hold = Some(false);
        });
    }
    h.reconcile("photos").await.expect("the cleanup succeeds");
    assert!(h.gcs.bucket(&physical).is_none(), "the bucket is deleted");
    assert!(h.get("photos").is_none(), "the finalizer was removed");
}
