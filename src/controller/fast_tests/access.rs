//! `spec.access`: grants in the bucket's IAM policy, the `Access`
//! condition, and their revocation when the resource goes.

use bucketmap_testkit::mock_gcs::{Fault, has_member};
use k8s_openapi::api::core::v1::ServiceAccount;
use serde_json::json;
use tonic::Code;

use super::harness::{Harness, NS, condition};
use crate::conditions::{ACCESS, reason};
use crate::iam::GSA_ANNOTATION;

const USER: &str = "roles/storage.objectUser";
const GSA: &str = "app@acme-test.iam.gserviceaccount.com";

fn spec() -> serde_json::Value {
    json!({"bucketName": "photos", "access": [{"serviceAccount": "app", "role": "objectUser"}]})
}

fn service_account(h: &Harness) {
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "app", "namespace": NS, "annotations": {GSA_ANNOTATION: GSA}},
    }))
    .expect("a ServiceAccount");
    h.api.create(&sa);
}

/// The `Access` condition of `photos`: (status, reason).
fn access(h: &Harness) -> Option<(String, String)> {
    let g = h.get("photos")?;
    condition(&g, ACCESS).map(|c| (c.status, c.reason))
}

#[tokio::test]
async fn reconcile_grants_spec_access_and_reports_access_granted() {
    let h = Harness::new().await;
    service_account(&h);
    h.create("photos", spec());
    let g = h.reconcile_until_ready("photos").await;
    let physical = g
        .status
        .as_ref()
        .and_then(|s| s.bucket_full_name.clone())
        .expect("a bucket");
    let policy = h.gcs.iam_policy(&physical).unwrap_or_default();
    let member = format!("serviceAccount:{GSA}");
    assert!(has_member(&policy, USER, &member), "{policy:#?}");
    assert_eq!(
        access(&h),
        Some(("True".into(), reason::ACCESS_GRANTED.into()))
    );
    let recorded = g.status.map(|s| s.access).unwrap_or_default();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].member, member);
}

#[tokio::test]
async fn reconcile_of_access_for_a_missing_service_account_reports_access_pending() {
    let h = Harness::new().await;
    h.create("photos", spec());
    h.reconcile_until_ready("photos").await;
    assert_eq!(
        access(&h),
        Some(("False".into(), reason::ACCESS_PENDING.into()))
    );
    service_account(&h);
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(
        access(&h),
        Some(("True".into(), reason::ACCESS_GRANTED.into()))
    );
}

#[tokio::test]
async fn reconcile_of_access_for_an_identity_less_service_account_reports_access_not_allowed() {
    let h = Harness::new().await;
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "app", "namespace": NS},
    }))
    .expect("a ServiceAccount");
    h.api.create(&sa);
    h.create("photos", spec());
    let g = h.reconcile_until_ready("photos").await;
    assert_eq!(
        access(&h),
        Some(("False".into(), reason::ACCESS_NOT_ALLOWED.into()))
    );
    let physical = g.status.and_then(|s| s.bucket_full_name).expect("a bucket");
    let policy = h.gcs.iam_policy(&physical).unwrap_or_default();
    assert!(
        !policy.bindings.iter().any(|b| b.role == USER),
        "{policy:#?}"
    );
}

#[tokio::test]
async fn reconcile_revokes_the_grants_of_an_orphaned_bucket() {
    let h = Harness::new().await;
    service_account(&h);
    let mut orphan = spec();
    orphan["deletionPolicy"] = json!("Orphan");
    h.create("photos", orphan);
    let g = h.reconcile_until_ready("photos").await;
    let physical = g.status.and_then(|s| s.bucket_full_name).expect("a bucket");
    h.delete("photos").await;
    h.reconcile("photos").await.expect("the cleanup succeeds");
    assert!(h.get("photos").is_none());
    let policy = h.gcs.iam_policy(&physical).expect("the bucket is kept");
    assert!(
        !has_member(&policy, USER, &format!("serviceAccount:{GSA}")),
        "{policy:#?}"
    );
}

#[tokio::test]
async fn reconcile_reports_a_refused_policy_write_in_the_access_condition() {
    let h = Harness::new().await;
    service_account(&h);
    h.gcs
        .add_fault(Fault::new("SetIamPolicy", Code::PermissionDenied));
    h.create("photos", spec());
    h.reconcile("photos").await.expect("the finalizer is added");
    let outcome = h.reconcile("photos").await;
    assert!(matches!(outcome, Err(crate::Error::Gcs(_))), "{outcome:?}");
    let expected = ("False".to_owned(), reason::PERMISSION_DENIED.to_owned());
    assert_eq!(access(&h), Some(expected));
    let g = h.get("photos").expect("the resource exists");
    let recorded = g.status.map(|s| s.access).unwrap_or_default();
    assert_eq!(recorded.len(), 1, "the intent is recorded before the write");
}

/// A grant the namespace may not make: a user outside the namespace.
fn foreign_member() -> serde_json::Value {
    json!({"member": "user:eve@example.com", "role": "objectViewer"})
}

#[tokio::test]
async fn reconcile_reports_a_member_it_may_not_grant_while_gcs_is_unreachable() {
    let h = Harness::new().await;
    h.gcs.add_fault(Fault::any_method(Code::Unavailable));
    h.create(
        "photos",
        json!({"bucketName": "photos", "access": [foreign_member()]}),
    );
    h.reconcile("photos").await.expect("the finalizer is added");
    let outcome = h.reconcile("photos").await;
    assert!(matches!(outcome, Err(crate::Error::Gcs(_))), "{outcome:?}");
    let expected = ("False".to_owned(), reason::ACCESS_NOT_ALLOWED.to_owned());
    assert_eq!(access(&h), Some(expected), "{:#?}", h.get("photos"));
    h.event("photos", reason::ACCESS_NOT_ALLOWED).await;
}

#[tokio::test]
async fn reconcile_reports_a_member_it_may_not_grant_when_the_policy_cannot_be_read() {
    let h = Harness::new().await;
    service_account(&h);
    h.create("photos", spec());
    h.reconcile_until_ready("photos").await;
    h.gcs
        .add_fault(Fault::new("GetIamPolicy", Code::PermissionDenied));
    h.api.modify::<crate::crd::Gcs>(NS, "photos", |g| {
        g["spec"]["access"] =
            json!([{"serviceAccount": "app", "role": "objectUser"}, foreign_member()]);
    });
    let outcome = h.reconcile("photos").await;
    assert!(matches!(outcome, Err(crate::Error::Gcs(_))), "{outcome:?}");
    let g = h.get("photos").expect("the resource exists");
    let c = condition(&g, ACCESS).expect("the Access condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::ACCESS_NOT_ALLOWED)
    );
    assert!(
        c.message.contains("user:eve@example.com") && c.message.contains("could not be written"),
        "{}",
        c.message
    );
}
