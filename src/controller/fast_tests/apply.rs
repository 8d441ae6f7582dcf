//! Create, drift, steady state and naming.

use bucketmap_testkit::mock_gcs::proto;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::json;

use super::harness::{Harness, NS, PROJECT, identity, ready};
use crate::conditions::reason;
use crate::crd::FINALIZER;

fn photos_spec() -> serde_json::Value {
    json!({"bucketName": "photos", "location": "eu", "storageClass": "NEARLINE",
           "versioning": true, "labels": {"team": "media"}})
}

#[tokio::test]
async fn reconcile_adds_the_finalizer_before_any_gcs_call() {
    let h = Harness::new().await;
    h.create("photos", photos_spec());
    let action = h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(action, kube::runtime::controller::Action::await_change());
    let g = h.get("photos").expect("the resource exists");
    assert_eq!(g.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    assert!(h.gcs.calls().is_empty(), "{:?}", h.gcs.calls());
    assert!(g.status.is_none(), "nothing else was written");
}

#[tokio::test]
async fn reconcile_creates_the_bucket_as_declared_and_reports_ready() {
    let h = Harness::new().await;
    h.create("photos", photos_spec());
    let g = h.reconcile_until_ready("photos").await;
    let physical = h.candidate("photos", "photos", 0);
    let status = g.status.clone().expect("a status");
    assert_eq!(status.bucket_full_name.as_deref(), Some(physical.as_str()));
    assert_eq!(status.project_id.as_deref(), Some(PROJECT));
    assert_eq!(status.observed_generation, g.metadata.generation);
    let ready = ready(&g).expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", reason::BUCKET_READY)
    );
    let bucket = h.gcs.bucket(&physical).expect("the bucket exists");
    assert_eq!(h.gcs.bucket_project(&physical).as_deref(), Some(PROJECT));
    assert_eq!(
        (bucket.location.as_str(), bucket.storage_class.as_str()),
        ("EU", "NEARLINE")
    );
    assert!(bucket.versioning.is_some_and(|v| v.enabled));
    assert_eq!(bucket.labels.get("team").map(String::as_str), Some("media"));
    for (key, value) in identity("photos").labels() {
        assert_eq!(bucket.labels.get(&key), Some(&value), "label {key}");
    }
    assert_eq!(h.gcs.call_count("CreateBucket"), 1);
    assert_eq!(h.map(), [("photos".to_owned(), physical.clone())].into());
    let binding: Secret = h
        .api
        .get(NS, "photos-gcs-binding")
        .expect("the binding Secret");
    assert!(binding.data.is_some_and(|d| !d.is_empty()));
    let created = h.event("photos", "Created").await;
    assert!(created.note.is_some_and(|n| n.contains(&physical)));
}

/// A resource made Ready, the mock's call log and the API log forgotten.
async fn ready_photos() -> (Harness, String) {
    let h = Harness::new().await;
    h.create("photos", photos_spec());
    h.reconcile_until_ready("photos").await;
    h.gcs.reset_calls();
    (
        h,
        format!("photos-{}", crate::naming::suffix(identity("photos"), 0)),
    )
}

#[tokio::test]
async fn reconcile_corrects_drift_with_one_update() {
    let (h, physical) = ready_photos().await;
    assert_eq!(physical, h.candidate("photos", "photos", 0));
    h.gcs
        .modify_bucket(&physical, |b| {
            b.versioning = Some(proto::bucket::Versioning { enabled: false });
            b.labels.remove("team");
        })
        .expect("the bucket exists");
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(h.gcs.call_count("UpdateBucket"), 1, "{:?}", h.gcs.calls());
    assert_eq!(h.gcs.call_count("CreateBucket"), 0);
    let bucket = h.gcs.bucket(&physical).expect("the bucket exists");
    assert!(bucket.versioning.is_some_and(|v| v.enabled));
    assert_eq!(bucket.labels.get("team").map(String::as_str), Some("media"));
    let updated = h.event("photos", "Updated").await;
    assert!(updated.note.is_some_and(|n| n.contains(&physical)));
    let g = h.get("photos").expect("the resource exists");
    assert_eq!(ready(&g).map(|c| c.status), Some("True".to_owned()));
}

#[tokio::test]
async fn reconcile_of_a_bucket_in_sync_writes_nothing() {
    let (h, physical) = ready_photos().await;
    let before = h.api.log().len();
    let action = h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(
        action,
        kube::runtime::controller::Action::await_change(),
        "no requeue: the drift check brings it back (controller::resync)"
    );
    let calls = h.gcs.calls();
    assert!(!calls.is_empty(), "the bucket was checked");
    let writes: Vec<_> = calls
        .iter()
        .filter(|c| !c.method.starts_with("Get") && !c.method.starts_with("List"))
        .collect();
    assert!(writes.is_empty(), "GCS writes: {writes:?}");
    let api_writes: Vec<_> = h.api.log()[before..]
        .iter()
        .filter(|l| l.is_write())
        .cloned()
        .collect();
    assert!(api_writes.is_empty(), "API writes: {api_writes:?}");
    assert_eq!(h.map().get("photos"), Some(&physical));
    let map_writes = h.api.writes::<ConfigMap>();
    assert_eq!(
        map_writes.len(),
        1,
        "only the first publish wrote: {map_writes:?}"
    );
}

#[tokio::test]
async fn reconcile_takes_the_next_candidate_when_a_foreign_bucket_holds_the_name() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    let taken = h.candidate("photos", "photos", 0);
    let foreign = proto::Bucket {
        bucket_id: taken.clone(),
        labels: [("owner".to_owned(), "someone-else".to_owned())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let stored = h
        .gcs
        .insert_bucket("other-project", foreign)
        .expect("inserted");
    let g = h.reconcile_until_ready("photos").await;
    let next = h.candidate("photos", "photos", 1);
    let status = g.status.clone().expect("a status");
    assert_eq!(status.bucket_full_name.as_deref(), Some(next.as_str()));
    assert_eq!(status.name_attempt, Some(1));
    assert!(h.gcs.bucket(&next).is_some());
    assert_eq!(
        h.gcs.bucket(&taken),
        Some(stored),
        "the foreign bucket is untouched"
    );
    assert_eq!(h.map().get("photos"), Some(&next));
    let conflict = h.event("photos", reason::NAME_CONFLICT).await;
    assert_eq!(conflict.type_.as_deref(), Some("Warning"));
    assert!(
        conflict
            .note
            .is_some_and(|n| n.contains(&taken) && n.contains(&next))
    );
}
