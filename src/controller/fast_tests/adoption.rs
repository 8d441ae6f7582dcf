//! `spec.adopt`: an existing bucket taken under management, or refused.

use bucketmap_testkit::mock_gcs::proto;
use serde_json::json;

use super::harness::{Harness, PROJECT, condition, identity, ready};
use crate::conditions::{ADOPTED, reason};
use crate::naming::OWNER_LABEL;

const LEGACY: &str = "legacy-photos";

fn adopt_spec() -> serde_json::Value {
    json!({"bucketName": "photos", "adopt": {"bucket": LEGACY}, "labels": {"team": "media"}})
}

/// A bucket [`LEGACY`] in `project` with `labels`.
fn existing(h: &Harness, project: &str, labels: &[(&str, &str)]) -> proto::Bucket {
    let bucket = proto::Bucket {
        bucket_id: LEGACY.to_owned(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    h.gcs.insert_bucket(project, bucket).expect("inserted")
}

/// Reconciles `photos` twice; its `Ready` (status, reason).
async fn settle(h: &Harness) -> (String, String) {
    h.reconcile("photos").await.expect("the finalizer is added");
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let g = h.get("photos").expect("the resource exists");
    let ready = ready(&g).expect("a Ready condition");
    (ready.status, ready.reason)
}

#[tokio::test]
async fn reconcile_adopts_an_unowned_bucket_of_its_project_and_labels_it() {
    let h = Harness::new().await;
    existing(&h, PROJECT, &[("cost-center", "42")]);
    h.create("photos", adopt_spec());
    let g = h.reconcile_until_ready("photos").await;
    let status = g.status.clone().expect("a status");
    assert_eq!(status.bucket_full_name.as_deref(), Some(LEGACY));
    let adopted = condition(&g, ADOPTED).expect("an Adopted condition");
    assert_eq!(
        (adopted.status.as_str(), adopted.reason.as_str()),
        ("True", reason::ADOPTED)
    );
    let bucket = h.gcs.bucket(LEGACY).expect("the bucket is kept");
    assert_eq!(
        bucket.labels.get(OWNER_LABEL),
        Some(&identity("photos").owner_key())
    );
    assert_eq!(bucket.labels.get("team").map(String::as_str), Some("media"));
    assert_eq!(
        h.gcs.call_count("CreateBucket"),
        0,
        "adoption never creates"
    );
    assert_eq!(h.map().get("photos").map(String::as_str), Some(LEGACY));
    h.event("photos", reason::ADOPTED).await;
}

#[tokio::test]
async fn reconcile_refuses_to_adopt_a_foreign_bucket() {
    let h = Harness::new().await;
    let foreign = existing(
        &h,
        PROJECT,
        &[(OWNER_LABEL, "0123456789abcdef0123456789abcdef")],
    );
    h.create("photos", adopt_spec());
    assert_eq!(
        settle(&h).await,
        ("False".into(), reason::ADOPTION_REFUSED.into())
    );
    assert_eq!(h.gcs.bucket(LEGACY), Some(foreign), "left untouched");
    assert!(h.map().is_empty());
    h.event("photos", reason::ADOPTION_REFUSED).await;
}

#[tokio::test]
async fn reconcile_refuses_to_adopt_a_bucket_of_another_project() {
    let h = Harness::new().await;
    existing(&h, "other-project", &[]);
    h.create("photos", adopt_spec());
    assert_eq!(
        settle(&h).await,
        ("False".into(), reason::ADOPTION_REFUSED.into())
    );
    assert_eq!(h.gcs.call_count("UpdateBucket"), 0, "left untouched");
}

#[tokio::test]
async fn reconcile_of_adoption_of_a_missing_bucket_reports_bucket_not_found() {
    let h = Harness::new().await;
    h.create("photos", adopt_spec());
    assert_eq!(
        settle(&h).await,
        ("False".into(), reason::BUCKET_NOT_FOUND.into())
    );
    assert!(h.gcs.buckets().is_empty(), "adoption never creates");
}
