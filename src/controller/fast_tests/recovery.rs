//! A bucket found again: after a lost create response, by a re-created
//! resource, under the labels of an earlier version; the name of a later
//! candidate recorded before its create; settings GCS fixes at creation
//! that differ. A bucket not created again by a reconcile that reads a
//! cache behind its own status write.

use bucketmap_testkit::mock_gcs::{Fault, proto};
use serde_json::json;
use tonic::Code;

use super::harness::{Harness, NS, PROJECT, condition, identity, ready};
use crate::Error;
use crate::conditions::{READY, reason};
use crate::crd::{Gcs, GcsStatus};
use crate::naming::{OWNER_LABEL, legacy_owner_id};

#[tokio::test]
async fn reconcile_finds_its_bucket_again_after_a_lost_create_response() {
    let h = Harness::new().await;
    let lost = Fault {
        times: Some(1),
        after_write: true,
        ..Fault::new("CreateBucket", Code::Unavailable)
    };
    h.gcs.add_fault(lost);
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile("photos").await.expect("the finalizer is added");
    let outcome = h.reconcile("photos").await;
    assert!(matches!(outcome, Err(Error::Gcs(_))), "{outcome:?}");
    let g = h.get("photos").expect("the resource exists");
    assert_eq!(
        ready(&g).map(|c| c.reason),
        Some(reason::GCS_ERROR.to_owned())
    );
    let g = h.reconcile_until_ready("photos").await;
    let physical = h.candidate("photos", "photos", 0);
    assert_eq!(g.status.and_then(|s| s.bucket_full_name), Some(physical));
    assert_eq!(h.gcs.buckets().len(), 1, "one bucket, found again");
    h.event("photos", "FoundExisting").await;
}

#[tokio::test]
async fn reconcile_of_a_recreated_resource_finds_its_orphaned_bucket_with_its_data() {
    let h = Harness::new().await;
    let spec = json!({"bucketName": "photos", "deletionPolicy": "Orphan"});
    h.create("photos", spec.clone());
    let g = h.reconcile_until_ready("photos").await;
    let physical = g.status.and_then(|s| s.bucket_full_name).expect("a bucket");
    h.gcs.put_object(&physical, "kept.txt").expect("an object");
    h.delete("photos").await;
    h.reconcile("photos").await.expect("the cleanup succeeds");
    assert!(h.get("photos").is_none());
    // A rebuilt cluster: the same namespace and name, no status.
    h.create("photos", spec);
    let g = h.reconcile_until_ready("photos").await;
    assert_eq!(
        g.status.and_then(|s| s.bucket_full_name),
        Some(physical.clone())
    );
    assert_eq!(h.gcs.objects(&physical).len(), 1, "with its data");
    assert_eq!(h.gcs.buckets().len(), 1);
    assert_eq!(h.map().get("photos"), Some(&physical));
}

#[tokio::test]
async fn reconcile_reports_settings_fixed_at_creation_that_differ_and_stays_ready() {
    let h = Harness::new().await;
    let flat = proto::Bucket {
        bucket_id: "legacy-photos".to_owned(),
        ..Default::default()
    };
    h.gcs.insert_bucket(PROJECT, flat).expect("inserted");
    h.create(
        "photos",
        json!({"bucketName": "photos", "adopt": {"bucket": "legacy-photos"},
               "hierarchicalNamespace": {"enabled": true}}),
    );
    let g = h.reconcile_until_ready("photos").await;
    let differs = condition(&g, "ImmutableSettingsDiffer").expect("the condition");
    assert_eq!(differs.status, "True");
    assert!(
        differs.message.contains("hierarchicalNamespace"),
        "{}",
        differs.message
    );
    let bucket = h.gcs.bucket("legacy-photos").expect("the bucket is kept");
    assert!(
        !bucket.hierarchical_namespace.is_some_and(|n| n.enabled),
        "never changed"
    );
    h.event("photos", "ImmutableSettingsDiffer").await;
}

#[tokio::test]
async fn reconcile_records_a_later_candidate_as_creating_before_it_creates_it() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    let taken = proto::Bucket {
        bucket_id: h.candidate("photos", "photos", 0),
        ..Default::default()
    };
    h.gcs
        .insert_bucket("other-project", taken)
        .expect("inserted");
    let next = h.candidate("photos", "photos", 1);
    // The create of the next candidate fails: what was written before it
    // is what a crash at that moment would leave.
    let down = Fault {
        bucket: Some(next.clone()),
        ..Fault::new("CreateBucket", Code::Unavailable)
    };
    h.gcs.add_fault(down);
    h.reconcile("photos").await.expect("the finalizer is added");
    assert!(h.reconcile("photos").await.is_err());
    let versions = h.api.versions::<Gcs>(NS, "photos");
    let statuses: Vec<_> = versions.iter().filter_map(|g| g.status.clone()).collect();
    let first = statuses.first().expect("a status was written");
    assert_eq!(first.bucket_full_name.as_deref(), Some(next.as_str()));
    assert_eq!(first.name_attempt, Some(1));
    let ready_reason = |s: &GcsStatus| {
        let ready = s.conditions.iter().find(|c| c.type_ == READY);
        ready.map(|c| c.reason.clone()).unwrap_or_default()
    };
    assert_eq!(ready_reason(first), reason::CREATING);
    let last = statuses.last().expect("a status was written");
    assert_eq!(ready_reason(last), reason::GCS_ERROR, "the failure, after");
}

#[tokio::test]
async fn reconcile_relabels_a_bucket_an_earlier_version_labelled_with_the_uid() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    let g = h.reconcile_until_ready("photos").await;
    let physical = g
        .status
        .clone()
        .and_then(|s| s.bucket_full_name)
        .expect("a bucket");
    let uid = g.metadata.uid.clone().expect("a uid");
    let legacy = legacy_owner_id(&uid);
    h.gcs
        .modify_bucket(&physical, |b| {
            b.labels.clear();
            b.labels
                .insert(crate::naming::OWNER_LABEL.to_owned(), legacy.clone());
        })
        .expect("the bucket exists");
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let bucket = h.gcs.bucket(&physical).expect("the bucket is kept");
    let owner = identity("photos").owner_key();
    assert_eq!(bucket.labels.get(OWNER_LABEL), Some(&owner));
    let g = h.get("photos").expect("the resource exists");
    assert_eq!(ready(&g).map(|c| c.status), Some("True".to_owned()));
    h.event("photos", "OwnershipMigrated").await;
}

#[tokio::test]
async fn reconcile_of_a_cache_behind_its_own_status_write_does_not_create_again() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile("photos").await.expect("the finalizer is added");
    h.reconcile("photos").await.expect("the bucket is created");
    let recorded = h.get("photos").and_then(|g| g.status).expect("a status");
    assert!(recorded.create_time.is_some(), "{recorded:?}");
    // The watch has not delivered that status write yet: the cache still
    // holds the resource without it.
    h.reconcile_cached("photos")
        .await
        .expect("the reconcile succeeds");
    assert_eq!(h.gcs.call_count("CreateBucket"), 1, "created once");
    let status = h.get("photos").and_then(|g| g.status).expect("a status");
    assert_eq!(status.create_time, recorded.create_time);
    assert_eq!(status.bucket_full_name, recorded.bucket_full_name);
    // Once the cache shows the write, the resource is reconciled as before.
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(h.gcs.call_count("CreateBucket"), 1);
}

#[tokio::test]
async fn reconcile_on_request_checks_the_bucket_and_records_the_request_handled() {
    let h = Harness::new().await;
    h.create(
        "photos",
        json!({"bucketName": "photos", "labels": {"team": "media"}}),
    );
    let g = h.reconcile_until_ready("photos").await;
    let physical = g.status.and_then(|s| s.bucket_full_name).expect("a bucket");
    h.gcs
        .modify_bucket(&physical, |b| {
            b.labels.remove("team");
        })
        .expect("the bucket exists");
    let requested = "2026-12-07T10:00:00Z";
    h.api.modify::<Gcs>(NS, "photos", |g| {
        g["metadata"]["annotations"] = json!({crate::crd::RECONCILE_REQUEST_ANNOTATION: requested});
    });
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let bucket = h.gcs.bucket(&physical).expect("the bucket exists");
    assert_eq!(
        bucket.labels.get("team").map(String::as_str),
        Some("media"),
        "drift corrected"
    );
    let status = h.get("photos").and_then(|g| g.status).expect("a status");
    assert_eq!(status.last_handled_reconcile_at.as_deref(), Some(requested));
}
