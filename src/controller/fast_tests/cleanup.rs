//! Deletion per `deletionPolicy`, with and without objects in the bucket.

use k8s_openapi::api::core::v1::Secret;
use serde_json::json;

use super::harness::{Harness, NS, identity, ready};
use crate::Error;
use crate::conditions::reason;
use crate::crd::{FINALIZER, Gcs};
use crate::naming::OWNER_LABEL;

/// `Gcs` photos Ready with `spec`, then deleted (its finalizer keeps it).
async fn deleted_photos(spec: serde_json::Value) -> (Harness, String) {
    let h = Harness::new().await;
    h.create("photos", spec);
    let g = h.reconcile_until_ready("photos").await;
    let physical = g.status.and_then(|s| s.bucket_full_name).expect("a bucket");
    assert_eq!(h.map().get("photos"), Some(&physical));
    h.delete("photos").await;
    let g = h.get("photos").expect("the finalizer keeps the resource");
    assert!(g.metadata.deletion_timestamp.is_some());
    (h, physical)
}

#[tokio::test]
async fn reconcile_deletes_an_empty_bucket_then_releases_the_resource() {
    let (h, physical) = deleted_photos(json!({"bucketName": "photos"})).await;
    h.reconcile("photos").await.expect("the cleanup succeeds");
    assert!(h.gcs.bucket(&physical).is_none(), "the bucket is deleted");
    assert_eq!(h.gcs.call_count("DeleteBucket"), 1);
    assert!(h.get("photos").is_none(), "the finalizer was removed");
    assert!(h.map().is_empty(), "unpublished: {:?}", h.map());
    assert!(h.api.get::<Secret>(NS, "photos-gcs-binding").is_none());
    h.event("photos", "Deleted").await;
}

#[tokio::test]
async fn reconcile_blocks_the_deletion_of_a_bucket_with_objects_until_force_destroy() {
    let (h, physical) = deleted_photos(json!({"bucketName": "photos"})).await;
    h.gcs.put_object(&physical, "kept.txt").expect("an object");
    let error = h
        .reconcile("photos")
        .await
        .expect_err("the cleanup is refused");
    assert!(matches!(error, Error::DeletionBlocked(_)), "{error}");
    assert!(h.gcs.bucket(&physical).is_some(), "the bucket is kept");
    assert_eq!(h.gcs.objects(&physical).len(), 1, "with its object");
    assert_eq!(h.gcs.call_count("DeleteBucket"), 0);
    let g = h.get("photos").expect("the resource is kept");
    assert_eq!(g.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    let ready = ready(&g).expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reason::DELETION_BLOCKED)
    );
    assert!(h.map().is_empty(), "unpublished first: {:?}", h.map());
    h.event("photos", reason::DELETION_BLOCKED).await;

    h.api
        .modify::<Gcs>(NS, "photos", |g| g["spec"]["forceDestroy"] = json!(true));
    h.reconcile("photos").await.expect("the cleanup succeeds");
    assert!(h.gcs.bucket(&physical).is_none(), "the bucket is deleted");
    assert!(h.gcs.objects(&physical).is_empty());
    assert!(h.get("photos").is_none(), "the finalizer was removed");
    h.event("photos", "ObjectsDeleted").await;
}

#[tokio::test]
async fn reconcile_with_deletion_policy_orphan_keeps_the_bucket_labelled() {
    let spec = json!({"bucketName": "photos", "deletionPolicy": "Orphan"});
    let (h, physical) = deleted_photos(spec).await;
    h.gcs.put_object(&physical, "kept.txt").expect("an object");
    h.reconcile("photos").await.expect("the cleanup succeeds");
    let bucket = h.gcs.bucket(&physical).expect("the bucket is kept");
    assert_eq!(
        bucket.labels.get(OWNER_LABEL),
        Some(&identity("photos").owner_key())
    );
    assert_eq!(h.gcs.objects(&physical).len(), 1, "with its object");
    assert_eq!(
        h.gcs.call_count("DeleteBucket") + h.gcs.call_count("UpdateBucket"),
        0
    );
    assert!(h.get("photos").is_none(), "the finalizer was removed");
    assert!(h.map().is_empty());
    h.event("photos", "Orphaned").await;
}

#[tokio::test]
async fn reconcile_with_deletion_policy_abandon_keeps_the_bucket_unlabelled() {
    let spec =
        json!({"bucketName": "photos", "deletionPolicy": "Abandon", "labels": {"team": "media"}});
    let (h, physical) = deleted_photos(spec).await;
    h.reconcile("photos").await.expect("the cleanup succeeds");
    let bucket = h.gcs.bucket(&physical).expect("the bucket is kept");
    assert!(
        !bucket.labels.contains_key(OWNER_LABEL),
        "{:?}",
        bucket.labels
    );
    assert_eq!(bucket.labels.get("team").map(String::as_str), Some("media"));
    assert_eq!(h.gcs.call_count("DeleteBucket"), 0);
    assert!(h.get("photos").is_none(), "the finalizer was removed");
    h.event("photos", "Abandoned").await;
}
