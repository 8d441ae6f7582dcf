//! The status each refusal or failure sets, and what it leaves alone.

use bucketmap_testkit::mock_gcs::{Fault, proto};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use serde_json::json;
use tonic::Code;

use super::harness::{self, Harness, NS, PROJECT, ready};
use crate::Error;
use crate::conditions::reason;
use crate::controller::PROJECT_ANNOTATION;

/// Reconciles `name` twice (the finalizer, then the phases) and returns
/// the second outcome and the stored resource's `Ready` (status, reason).
async fn settle(h: &Harness, name: &str) -> (crate::Result<()>, (String, String)) {
    h.reconcile(name).await.expect("the finalizer is added");
    let outcome = h.reconcile(name).await.map(drop);
    let g = h.get(name).expect("the resource exists");
    let ready = ready(&g).expect("a Ready condition");
    (outcome, (ready.status, ready.reason))
}

fn not_ready(reason: &str) -> (String, String) {
    ("False".to_owned(), reason.to_owned())
}

#[tokio::test]
async fn reconcile_without_any_project_reports_project_missing() {
    let h = Harness::with_config(crate::controller::OperatorConfig {
        default_project: None,
        ..harness::config()
    })
    .await;
    h.create("photos", json!({"bucketName": "photos"}));
    let (outcome, ready) = settle(&h, "photos").await;
    assert!(outcome.is_ok());
    assert_eq!(ready, not_ready(reason::PROJECT_MISSING));
    assert!(h.gcs.buckets().is_empty());
}

#[tokio::test]
async fn reconcile_of_a_project_the_namespace_does_not_pin_reports_project_not_allowed() {
    let h = Harness::new().await;
    h.api.modify::<Namespace>("", NS, |ns| {
        ns["metadata"]["annotations"] = json!({PROJECT_ANNOTATION: PROJECT});
    });
    h.create(
        "photos",
        json!({"bucketName": "photos", "projectID": "elsewhere"}),
    );
    let (outcome, ready) = settle(&h, "photos").await;
    assert!(outcome.is_ok());
    assert_eq!(ready, not_ready(reason::PROJECT_NOT_ALLOWED));
    assert!(h.gcs.buckets().is_empty());
}

#[tokio::test]
async fn reconcile_of_an_invalid_logical_name_reports_invalid_spec() {
    let h = Harness::new().await;
    // Admission refuses it; the operator checks again.
    h.create("photos", json!({"bucketName": "Not_A_Name"}));
    let (outcome, ready) = settle(&h, "photos").await;
    assert!(outcome.is_ok());
    assert_eq!(ready, not_ready(reason::INVALID_SPEC));
    assert!(h.gcs.calls().is_empty());
}

#[tokio::test]
async fn reconcile_reports_name_conflict_when_every_candidate_is_taken() {
    let h = Harness::with_config(crate::controller::OperatorConfig {
        max_name_attempts: 2,
        ..harness::config()
    })
    .await;
    h.create("photos", json!({"bucketName": "photos"}));
    for attempt in 0..2 {
        let foreign = proto::Bucket {
            bucket_id: h.candidate("photos", "photos", attempt),
            ..Default::default()
        };
        h.gcs
            .insert_bucket("other-project", foreign)
            .expect("inserted");
    }
    let (outcome, ready) = settle(&h, "photos").await;
    assert!(outcome.is_ok());
    assert_eq!(ready, not_ready(reason::NAME_CONFLICT));
    assert_eq!(h.gcs.buckets().len(), 2, "no bucket of ours was created");
    assert!(h.map().is_empty());
}

#[tokio::test]
async fn reconcile_reports_a_gcs_refusal_by_its_reason() {
    for (code, expected) in [
        (Code::PermissionDenied, reason::PERMISSION_DENIED),
        (Code::ResourceExhausted, reason::QUOTA_EXCEEDED),
        (Code::Internal, reason::GCS_ERROR),
    ] {
        let h = Harness::new().await;
        h.gcs.add_fault(Fault::new("CreateBucket", code));
        h.create("photos", json!({"bucketName": "photos"}));
        let (outcome, ready) = settle(&h, "photos").await;
        assert!(
            matches!(outcome, Err(Error::Gcs(_))),
            "{code:?}: {outcome:?}"
        );
        assert_eq!(ready, not_ready(expected), "{code:?}");
        let event = h.event("photos", "ReconcileError").await;
        assert_eq!(event.type_.as_deref(), Some("Warning"));
    }
}

#[tokio::test]
async fn reconcile_keeps_ready_through_a_transient_gcs_failure() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile_until_ready("photos").await;
    h.gcs.add_fault(Fault::new("GetBucket", Code::Unavailable));
    let outcome = h.reconcile("photos").await;
    assert!(matches!(outcome, Err(Error::Gcs(_))), "{outcome:?}");
    let g = h.get("photos").expect("the resource exists");
    assert_eq!(ready(&g).map(|c| c.status), Some("True".to_owned()));
    h.event("photos", "ReconcileError").await;
}

#[tokio::test]
async fn reconcile_reports_not_owned_when_the_bucket_changed_hands() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    let g = h.reconcile_until_ready("photos").await;
    let physical = g.status.and_then(|s| s.bucket_full_name).expect("a bucket");
    h.gcs
        .modify_bucket(&physical, |b| {
            b.labels = [("owner".to_owned(), "someone".to_owned())]
                .into_iter()
                .collect()
        })
        .expect("the bucket exists");
    h.gcs.reset_calls();
    let outcome = h.reconcile("photos").await;
    assert!(outcome.is_ok(), "{outcome:?}");
    let g = h.get("photos").expect("the resource exists");
    let ready = ready(&g).expect("a Ready condition");
    assert_eq!((ready.status, ready.reason), not_ready(reason::NOT_OWNED));
    assert_eq!(h.gcs.call_count("UpdateBucket"), 0, "left untouched");
}

#[tokio::test]
async fn reconcile_recreates_a_bucket_deleted_out_of_band() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    let g = h.reconcile_until_ready("photos").await;
    let physical = g.status.and_then(|s| s.bucket_full_name).expect("a bucket");
    h.gcs.remove_bucket(&physical).expect("removed");
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert!(
        h.gcs.bucket(&physical).is_some(),
        "recreated under the same name"
    );
    h.event("photos", "BucketRecreated").await;
}

#[tokio::test]
async fn reconcile_of_a_younger_resource_naming_a_taken_logical_name_reports_mapping_conflict() {
    let h = Harness::new().await;
    // Created in the same second: the name breaks the tie, "a-" is older.
    h.create("a-photos", json!({"bucketName": "photos"}));
    h.create("b-photos", json!({"bucketName": "photos"}));
    let (outcome, ready) = settle(&h, "b-photos").await;
    assert!(outcome.is_ok());
    assert_eq!(ready, not_ready(reason::MAPPING_CONFLICT));
    let g = h.reconcile_until_ready("a-photos").await;
    let physical = g.status.and_then(|s| s.bucket_full_name);
    assert_eq!(h.map().get("photos"), physical.as_ref());
}

#[tokio::test]
async fn reconcile_refuses_to_overwrite_a_foreign_binding_secret() {
    let h = Harness::new().await;
    let theirs: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "photos-gcs-binding", "namespace": NS}, "data": {"k": "dg=="},
    }))
    .expect("a Secret");
    h.api.create(&theirs);
    h.create("photos", json!({"bucketName": "photos"}));
    let (outcome, ready) = settle(&h, "photos").await;
    assert!(
        matches!(outcome, Err(Error::BindingNotOwned(_))),
        "{outcome:?}"
    );
    assert_eq!(ready, not_ready(reason::BINDING_NOT_OWNED));
    let kept: Secret = h.api.get(NS, "photos-gcs-binding").expect("kept");
    assert_eq!(kept.data, theirs.data, "left untouched");
}
