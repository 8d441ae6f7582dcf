//! A bucket found again: after a lost create response, by a re-created
//! resource; and settings GCS fixes at creation that differ.

use bucketmap_testkit::mock_gcs::{Fault, proto};
use serde_json::json;
use tonic::Code;

use super::harness::{Harness, PROJECT, condition, ready};
use crate::Error;
use crate::conditions::reason;

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
