//! `spec.access` on a real API server against the mock GCS with IAM: the
//! grants land in the bucket's policy, nothing foreign is touched, edits
//! survive concurrent writers and restarts, and refusals are visible.

// Scenarios read top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::time::Duration;

use bucketmap::crd::Gcs;
use bucketmap::iam::{
    ALLOWED_MEMBERS_ANNOTATION, ALLOWED_ROLES_ANNOTATION, GSA_ANNOTATION, WorkloadIdentity,
};
use bucketmap_testkit::mock_gcs::{Fault, has_member, iam_proto};
use common::{Fixture, physical};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

type TestResult = anyhow::Result<()>;

const VIEWER: &str = "roles/storage.objectViewer";
const USER: &str = "roles/storage.objectUser";
const POOL: &str = "acme-test.svc.id.goog";
const PROJECT_NUMBER: &str = "123456789012";
const GSA: &str = "app@acme-test.iam.gserviceaccount.com";

/// A fixture whose operator knows the Workload Identity pool, running.
async fn started() -> anyhow::Result<Fixture> {
    let mut f = Fixture::new().await?;
    f.config.workload_identity = Some(WorkloadIdentity {
        pool: POOL.into(),
        project_number: PROJECT_NUMBER.into(),
    });
    f.start_operator().await?;
    Ok(f)
}

fn principal(ns: &str, sa: &str) -> String {
    format!(
        "principal://iam.googleapis.com/projects/{PROJECT_NUMBER}/locations/global/workloadIdentityPools/{POOL}/subject/ns/{ns}/sa/{sa}"
    )
}

async fn service_account(f: &Fixture, name: &str, gsa: Option<&str>) -> anyhow::Result<()> {
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some(name.into());
    if let Some(gsa) = gsa {
        sa.metadata.annotations = Some([(GSA_ANNOTATION.to_owned(), gsa.to_owned())].into());
    }
    let api: Api<ServiceAccount> = Api::namespaced(f.client.clone(), &f.ns);
    api.create(&PostParams::default(), &sa).await?;
    Ok(())
}

fn access_condition(g: &Gcs) -> Option<Condition> {
    g.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Access")
        .cloned()
}

async fn wait_access(f: &Fixture, name: &str, reason: &str) -> anyhow::Result<Gcs> {
    f.wait_for(name, Duration::from_secs(60), reason, |g| {
        access_condition(g).is_some_and(|c| c.reason == reason)
    })
    .await
}

/// Waits until `check` holds for bucket `bucket`'s policy.
async fn wait_policy(
    f: &Fixture,
    bucket: &str,
    what: &str,
    check: impl Fn(&iam_proto::Policy) -> bool,
) -> anyhow::Result<iam_proto::Policy> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let policy = f.gcs.iam_policy(bucket).unwrap_or_default();
        if check(&policy) {
            return Ok(policy);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "policy of {bucket}: {what} not reached; last seen: {policy:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn binding(role: &str, members: &[&str]) -> iam_proto::Binding {
    iam_proto::Binding {
        role: role.into(),
        members: members.iter().map(|m| (*m).to_owned()).collect(),
        condition: None,
    }
}

fn conditional(role: &str, member: &str) -> iam_proto::Binding {
    iam_proto::Binding {
        condition: Some(iam_proto::Expr {
            title: "until 2030".into(),
            expression: "request.time < timestamp('2030-01-01T00:00:00Z')".into(),
            ..Default::default()
        }),
        ..binding(role, &[member])
    }
}

fn recorded(g: &Gcs) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = g
        .status
        .iter()
        .flat_map(|s| &s.access)
        .map(|a| (a.member.clone(), a.role.clone()))
        .collect();
    out.sort();
    out
}

/// A ready resource without access, and its bucket.
async fn ready_bucket(f: &Fixture, name: &str, spec: serde_json::Value) -> anyhow::Result<String> {
    f.create(name, spec).await?;
    let g = f.wait_ready(name).await?;
    Ok(physical(&g))
}

#[tokio::test]
async fn grants_land_next_to_foreign_and_conditional_bindings_which_survive_every_edit()
-> TestResult {
    let f = started().await?;
    service_account(&f, "app", None).await?;
    service_account(&f, "gsa-app", Some(GSA)).await?;
    let bucket = ready_bucket(&f, "photos", json!({"bucketName": "photos"})).await?;
    let wi = principal(&f.ns, "app");
    let foreign = binding(VIEWER, &["user:foreign@acme.com"]);
    let cond = conditional(USER, &wi);
    f.gcs.modify_iam_policy(&bucket, |p| {
        p.version = 3;
        p.bindings = vec![foreign.clone(), cond.clone()];
    })?;

    f.merge_spec(
        "photos",
        json!({"access": [
            {"serviceAccount": "app", "role": "objectUser"},
            {"serviceAccount": "gsa-app", "role": "objectViewer"},
        ]}),
    )
    .await?;
    let g = wait_access(&f, "photos", "AccessGranted").await?;
    let gsa = format!("serviceAccount:{GSA}");
    let policy = f.gcs.iam_policy(&bucket).unwrap_or_default();
    assert!(has_member(&policy, USER, &wi), "{policy:#?}");
    assert!(has_member(&policy, VIEWER, &gsa), "{policy:#?}");
    assert!(has_member(&policy, VIEWER, "user:foreign@acme.com"));
    assert!(
        policy.bindings.contains(&cond),
        "conditional binding lost: {policy:#?}"
    );
    assert_eq!(policy.version, 3);
    let mut expected = vec![
        (wi.clone(), USER.to_owned()),
        (gsa.clone(), VIEWER.to_owned()),
    ];
    expected.sort();
    assert_eq!(recorded(&g), expected);
    f.wait_event("photos", "AccessGranted").await?;

    // A grant leaves the spec: exactly it is revoked.
    f.merge_spec(
        "photos",
        json!({"access": [{"serviceAccount": "gsa-app", "role": "objectViewer"}]}),
    )
    .await?;
    let policy = wait_policy(&f, &bucket, "objectUser revoked", |p| {
        !has_member(p, USER, &wi)
    })
    .await?;
    assert!(has_member(&policy, VIEWER, &gsa));
    assert!(has_member(&policy, VIEWER, "user:foreign@acme.com"));
    assert!(
        policy.bindings.contains(&cond),
        "conditional binding lost: {policy:#?}"
    );
    let g = f
        .wait_for(
            "photos",
            Duration::from_secs(30),
            "one grant recorded",
            |g| recorded(g).len() == 1,
        )
        .await?;
    assert_eq!(recorded(&g), [(gsa, VIEWER.to_owned())]);
    f.wait_event("photos", "AccessRevoked").await?;
    Ok(())
}

#[tokio::test]
async fn a_concurrent_writer_between_read_and_write_keeps_its_change_and_ours() -> TestResult {
    let f = started().await?;
    service_account(&f, "app", Some(GSA)).await?;
    let bucket = ready_bucket(&f, "photos", json!({"bucketName": "photos"})).await?;
    f.gcs.interleave_iam_write(&bucket, |p| {
        p.bindings
            .push(binding(VIEWER, &["group:auditors@acme.com"]));
    });
    f.gcs.reset_calls();
    f.merge_spec(
        "photos",
        json!({"access": [{"serviceAccount": "app", "role": "objectViewer"}]}),
    )
    .await?;
    wait_access(&f, "photos", "AccessGranted").await?;
    let policy = f.gcs.iam_policy(&bucket).unwrap_or_default();
    assert!(
        has_member(&policy, VIEWER, &format!("serviceAccount:{GSA}")),
        "{policy:#?}"
    );
    assert!(
        has_member(&policy, VIEWER, "group:auditors@acme.com"),
        "{policy:#?}"
    );
    assert_eq!(f.gcs.pending_iam_writes(), 0, "the concurrent writer acted");
    let aborted = f
        .gcs
        .calls()
        .into_iter()
        .filter(|c| c.method == "SetIamPolicy" && c.code == tonic::Code::Aborted)
        .count();
    assert_eq!(aborted, 1, "{:?}", f.gcs.calls());
    Ok(())
}

#[tokio::test]
async fn a_grant_removed_out_of_band_is_restored_with_a_warning() -> TestResult {
    let f = started().await?;
    service_account(&f, "app", None).await?;
    f.create(
        "photos",
        json!({"bucketName": "photos", "access": [{"serviceAccount": "app", "role": "objectViewer"}]}),
    )
    .await?;
    let g = wait_access(&f, "photos", "AccessGranted").await?;
    let bucket = physical(&g);
    let wi = principal(&f.ns, "app");
    assert!(has_member(
        &f.gcs.iam_policy(&bucket).unwrap_or_default(),
        VIEWER,
        &wi
    ));
    f.gcs.modify_iam_policy(&bucket, |p| p.bindings.clear())?;
    wait_policy(&f, &bucket, "grant restored", |p| {
        has_member(p, VIEWER, &wi)
    })
    .await?;
    f.wait_event("photos", "AccessRestored").await?;
    Ok(())
}

#[tokio::test]
async fn deletion_and_orphan_revoke_the_grants_and_keep_foreign_ones() -> TestResult {
    let f = started().await?;
    service_account(&f, "app", Some(GSA)).await?;
    let member = format!("serviceAccount:{GSA}");
    let access = json!([{"serviceAccount": "app", "role": "objectUser"}]);
    f.create(
        "kept",
        json!({"bucketName": "kept", "deletionPolicy": "Orphan", "access": access}),
    )
    .await?;
    f.create("gone", json!({"bucketName": "gone", "access": access}))
        .await?;
    let kept = physical(&wait_access(&f, "kept", "AccessGranted").await?);
    let gone = physical(&wait_access(&f, "gone", "AccessGranted").await?);
    f.gcs.modify_iam_policy(&kept, |p| {
        p.bindings.push(binding(USER, &["user:ops@acme.com"]))
    })?;
    assert!(has_member(
        &f.gcs.iam_policy(&gone).unwrap_or_default(),
        USER,
        &member
    ));

    f.delete("kept").await?;
    f.delete("gone").await?;
    f.wait_gone("kept", Duration::from_secs(30)).await?;
    f.wait_gone("gone", Duration::from_secs(30)).await?;
    let policy = f.gcs.iam_policy(&kept).expect("the orphaned bucket stays");
    assert!(!has_member(&policy, USER, &member), "{policy:#?}");
    assert!(
        has_member(&policy, USER, "user:ops@acme.com"),
        "{policy:#?}"
    );
    assert!(f.gcs.bucket(&gone).is_none());
    // The grant went before the bucket did.
    let calls = f.gcs.calls();
    let about_gone: Vec<&str> = calls
        .iter()
        .filter(|c| c.bucket.as_deref() == Some(gone.as_str()))
        .map(|c| c.method.as_str())
        .filter(|m| matches!(*m, "SetIamPolicy" | "DeleteBucket"))
        .collect();
    assert_eq!(about_gone.last(), Some(&"DeleteBucket"), "{about_gone:?}");
    assert!(
        about_gone.len() >= 3,
        "grant, revoke, delete: {about_gone:?}"
    );
    Ok(())
}

#[tokio::test]
async fn public_foreign_and_unlisted_members_are_refused() -> TestResult {
    let f = started().await?;
    f.annotate_namespace(
        ALLOWED_MEMBERS_ANNOTATION,
        &format!("domain:acme.com,{}", principal("other-team", "app")),
    )
    .await?;
    // At admission: public principals, other namespaces' ServiceAccounts,
    // roles outside the four, both or neither of serviceAccount and member.
    for (access, message) in [
        (
            json!({"member": "allUsers", "role": "objectViewer"}),
            "never public",
        ),
        (
            json!({"member": "allAuthenticatedUsers", "role": "objectViewer"}),
            "never public",
        ),
        (
            json!({"serviceAccount": "other-team/app", "role": "objectViewer"}),
            "own namespace",
        ),
        (
            json!({"serviceAccount": "app", "role": "admin"}),
            "objectViewer, objectCreator",
        ),
        (
            json!({"serviceAccount": "app", "role": "roles/owner"}),
            "a Cloud Storage role (roles/storage.NAME) or a custom role",
        ),
        (
            json!({"serviceAccount": "app", "role": "roles/storage.legacyBucketReader",
                   "condition": {"title": "t", "expression": "true"}}),
            "cannot be used with the legacy roles",
        ),
        (
            json!({"serviceAccount": "app", "role": "objectViewer",
                   "condition": {"title": "t", "expression": ""}}),
            "should be at least 1 chars long",
        ),
        (
            json!({"serviceAccount": "app", "member": "user:a@acme.com", "role": "objectViewer"}),
            "exactly one",
        ),
        (json!({"role": "objectViewer"}), "exactly one"),
        (
            json!({"member": "ana@acme.com", "role": "objectViewer"}),
            "IAM principal",
        ),
    ] {
        let spec = json!({"bucketName": "refused", "access": [access]});
        let err = f.create("refused", spec).await.err();
        let err = err.map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err.contains(message), "{access}: {err}");
    }
    // By the operator: members the namespace does not list, and identities
    // of another namespace even when listed.
    let foreign = principal("other-team", "app");
    f.create(
        "photos",
        json!({"bucketName": "photos", "access": [
            {"member": "user:ana@acme.com", "role": "objectViewer"},
            {"member": "user:eve@evil.com", "role": "objectViewer"},
            {"member": foreign, "role": "objectViewer"},
        ]}),
    )
    .await?;
    let g = wait_access(&f, "photos", "AccessNotAllowed").await?;
    let condition = access_condition(&g).expect("Access condition");
    assert_eq!(condition.status, "False");
    assert!(
        condition.message.contains("user:eve@evil.com"),
        "{}",
        condition.message
    );
    assert!(
        condition.message.contains("namespace other-team"),
        "{}",
        condition.message
    );
    assert!(g.is_ready(), "the bucket itself is ready");
    f.wait_event("photos", "AccessNotAllowed").await?;
    let policy = f.gcs.iam_policy(&physical(&g)).unwrap_or_default();
    assert!(
        has_member(&policy, VIEWER, "user:ana@acme.com"),
        "{policy:#?}"
    );
    let members: Vec<&String> = policy.bindings.iter().flat_map(|b| &b.members).collect();
    assert_eq!(members, ["user:ana@acme.com"], "only the allowed member");

    // Without the namespace's permission the allowed one goes too.
    f.annotate_namespace(ALLOWED_MEMBERS_ANNOTATION, "").await?;
    wait_policy(&f, &physical(&g), "ana revoked", |p| p.bindings.is_empty()).await?;
    Ok(())
}

#[tokio::test]
async fn conditional_grants_and_allowed_roles_get_bindings_of_their_own() -> TestResult {
    let f = started().await?;
    service_account(&f, "app", Some(GSA)).await?;
    let member = format!("serviceAccount:{GSA}");
    let custom = "projects/acme-test/roles/reportReader";
    let reports = json!({"title": "reports", "description": "only reports/",
        "expression": "resource.name.startsWith('projects/_/buckets/b/objects/reports/')"});
    // A condition needs uniform bucket-level access, at admission.
    let no_ubla = json!({"bucketName": "acl", "uniformBucketLevelAccess": false, "access": [
        {"serviceAccount": "app", "role": "objectViewer", "condition": reports}]});
    let err = f.create("acl", no_ubla).await.err();
    let err = err.map(|e| format!("{e:#}")).unwrap_or_default();
    assert!(err.contains("needs uniformBucketLevelAccess"), "{err}");

    let spec = json!({"bucketName": "photos", "access": [
        {"serviceAccount": "app", "role": "objectViewer", "condition": reports},
        {"serviceAccount": "app", "role": "objectViewer"},
        {"serviceAccount": "app", "role": custom},
    ]});
    let id = ready_bucket(&f, "photos", spec).await?;
    // The custom role waits for the namespace's permission.
    let g = wait_access(&f, "photos", "AccessNotAllowed").await?;
    let message = access_condition(&g).map(|c| c.message).unwrap_or_default();
    assert!(
        message.contains(ALLOWED_ROLES_ANNOTATION) && message.contains(custom),
        "{message}"
    );
    f.annotate_namespace(ALLOWED_ROLES_ANNOTATION, custom)
        .await?;
    wait_access(&f, "photos", "AccessGranted").await?;
    let policy = wait_policy(&f, &id, "three bindings", |p| p.bindings.len() == 3).await?;
    let shape: Vec<(&str, Option<&str>, &[String])> = (policy.bindings.iter())
        .map(|b| {
            (
                b.role.as_str(),
                b.condition.as_ref().map(|c| c.title.as_str()),
                b.members.as_slice(),
            )
        })
        .collect();
    let one = std::slice::from_ref(&member);
    assert!(shape.contains(&(VIEWER, None, one)), "{shape:?}");
    assert!(shape.contains(&(VIEWER, Some("reports"), one)), "{shape:?}");
    assert!(shape.contains(&(custom, None, one)), "{shape:?}");
    assert_eq!(policy.version, 3);
    let g = f.get("photos").await?;
    let conditions: Vec<Option<String>> = (g.status.iter().flat_map(|s| &s.access))
        .map(|a| a.condition.as_ref().map(|c| c.title.clone()))
        .collect();
    assert_eq!(conditions.len(), 3, "every grant recorded: {conditions:?}");
    assert!(
        conditions.contains(&Some("reports".into())),
        "{conditions:?}"
    );

    // The conditional grant removed: only its binding goes.
    f.merge_spec(
        "photos",
        json!({"access": [
            {"serviceAccount": "app", "role": "objectViewer"},
            {"serviceAccount": "app", "role": custom},
        ]}),
    )
    .await?;
    let policy = wait_policy(&f, &id, "the conditional binding revoked", |p| {
        p.bindings.iter().all(|b| b.condition.is_none())
    })
    .await?;
    assert_eq!(policy.bindings.len(), 2, "{policy:#?}");
    assert!(has_member(&policy, VIEWER, &member) && has_member(&policy, custom, &member));
    Ok(())
}

#[tokio::test]
async fn a_service_account_is_granted_when_it_appears_and_follows_its_annotation() -> TestResult {
    let f = started().await?;
    f.create(
        "photos",
        json!({"bucketName": "photos", "access": [{"serviceAccount": "late", "role": "objectViewer"}]}),
    )
    .await?;
    let g = wait_access(&f, "photos", "AccessPending").await?;
    let bucket = physical(&g);
    assert!(
        f.gcs
            .iam_policy(&bucket)
            .unwrap_or_default()
            .bindings
            .is_empty()
    );
    service_account(&f, "late", None).await?;
    let wi = principal(&f.ns, "late");
    wait_policy(&f, &bucket, "late granted", |p| has_member(p, VIEWER, &wi)).await?;

    // The annotation now names a Google service account: it replaces the principal.
    let api: Api<ServiceAccount> = Api::namespaced(f.client.clone(), &f.ns);
    let patch = json!({"metadata": {"annotations": {GSA_ANNOTATION: GSA}}});
    api.patch(
        "late",
        &Default::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    let gsa = format!("serviceAccount:{GSA}");
    wait_policy(&f, &bucket, "the GSA replaces the principal", |p| {
        has_member(p, VIEWER, &gsa) && !has_member(p, VIEWER, &wi)
    })
    .await?;

    // The ServiceAccount goes: so does its grant.
    api.delete("late", &DeleteParams::default()).await?;
    wait_policy(&f, &bucket, "grant revoked", |p| p.bindings.is_empty()).await?;
    wait_access(&f, "photos", "AccessPending").await?;
    Ok(())
}

#[tokio::test]
async fn twenty_resources_granting_to_one_service_account_converge() -> TestResult {
    let f = started().await?;
    service_account(&f, "app", Some(GSA)).await?;
    let names: Vec<String> = (0..20).map(|i| format!("b{i:02}")).collect();
    for name in &names {
        let spec = json!({"bucketName": name, "access": [{"serviceAccount": "app", "role": "objectUser"}]});
        f.create(name, spec).await?;
    }
    let member = format!("serviceAccount:{GSA}");
    for name in &names {
        let g = wait_access(&f, name, "AccessGranted").await?;
        let policy = f.gcs.iam_policy(&physical(&g)).unwrap_or_default();
        assert!(has_member(&policy, USER, &member), "{name}: {policy:#?}");
        assert_eq!(recorded(&g), [(member.clone(), USER.to_owned())], "{name}");
    }
    Ok(())
}

#[tokio::test]
async fn a_restart_after_a_lost_write_response_forgets_no_grant() -> TestResult {
    let mut f = started().await?;
    service_account(&f, "app", Some(GSA)).await?;
    let bucket = ready_bucket(&f, "photos", json!({"bucketName": "photos"})).await?;
    // The write happens, its response is lost; the operator dies before it
    // could read again.
    f.gcs.add_fault(
        Fault::new("SetIamPolicy", tonic::Code::Unavailable)
            .bucket(&bucket)
            .after_write(),
    );
    f.merge_spec(
        "photos",
        json!({"access": [{"serviceAccount": "app", "role": "objectViewer"}]}),
    )
    .await?;
    let member = format!("serviceAccount:{GSA}");
    wait_policy(&f, &bucket, "written", |p| has_member(p, VIEWER, &member)).await?;
    f.kill_operator().await;
    let g = f.get("photos").await?;
    assert_eq!(
        recorded(&g),
        [(member.clone(), VIEWER.to_owned())],
        "recorded before the write"
    );

    f.gcs.clear_faults();
    f.merge_spec("photos", json!({"access": null})).await?;
    f.start_operator().await?;
    wait_policy(&f, &bucket, "revoked after the restart", |p| {
        !has_member(p, VIEWER, &member)
    })
    .await?;
    f.wait_for(
        "photos",
        Duration::from_secs(30),
        "no grant recorded",
        |g| recorded(g).is_empty(),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_steady_state_reads_the_policy_once_per_resync_and_only_with_access() -> TestResult {
    let f = started().await?;
    service_account(&f, "app", Some(GSA)).await?;
    let access = json!([{"serviceAccount": "app", "role": "objectViewer"}]);
    f.create("with", json!({"bucketName": "with", "access": access}))
        .await?;
    let plain = ready_bucket(&f, "plain", json!({"bucketName": "plain"})).await?;
    let with = physical(&wait_access(&f, "with", "AccessGranted").await?);
    f.gcs.reset_calls();
    // The fixture's resync is 2 s: a few resyncs of each resource.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let calls = f.gcs.calls();
    let count = |bucket: &str, method: &str| {
        calls
            .iter()
            .filter(|c| c.bucket.as_deref() == Some(bucket) && c.method == method)
            .count()
    };
    let others: Vec<&str> = calls
        .iter()
        .map(|c| c.method.as_str())
        .filter(|m| !matches!(*m, "GetBucket" | "GetIamPolicy"))
        .collect();
    assert!(others.is_empty(), "only reads in steady state: {others:?}");
    assert!(count(&plain, "GetBucket") >= 2, "{calls:?}");
    assert_eq!(
        count(&plain, "GetIamPolicy"),
        0,
        "no access, no policy read"
    );
    let (reads, policy_reads) = (count(&with, "GetBucket"), count(&with, "GetIamPolicy"));
    assert!(reads >= 2, "{calls:?}");
    // One policy read per resync (a resync may straddle the window's edge).
    assert!(
        reads.abs_diff(policy_reads) <= 1,
        "{reads} GetBucket vs {policy_reads} GetIamPolicy"
    );
    Ok(())
}

#[tokio::test]
async fn a_policy_the_operator_may_not_edit_is_permission_denied_and_retried() -> TestResult {
    let f = started().await?;
    service_account(&f, "app", Some(GSA)).await?;
    let bucket = ready_bucket(&f, "photos", json!({"bucketName": "photos"})).await?;
    f.gcs.add_fault(
        Fault::new("SetIamPolicy", tonic::Code::PermissionDenied)
            .bucket(&bucket)
            .message("caller lacks storage.buckets.setIamPolicy"),
    );
    f.merge_spec(
        "photos",
        json!({"access": [{"serviceAccount": "app", "role": "objectViewer"}]}),
    )
    .await?;
    let g = wait_access(&f, "photos", "PermissionDenied").await?;
    let condition = access_condition(&g).expect("Access condition");
    assert!(
        condition.message.contains("storage.buckets.setIamPolicy"),
        "{}",
        condition.message
    );
    assert_eq!(
        g.ready_condition().map(|c| c.reason.as_str()),
        Some("PermissionDenied")
    );
    f.gcs.clear_faults();
    wait_access(&f, "photos", "AccessGranted").await?;
    f.wait_ready("photos").await?;
    let policy = f.gcs.iam_policy(&bucket).unwrap_or_default();
    assert!(has_member(
        &policy,
        VIEWER,
        &format!("serviceAccount:{GSA}")
    ));
    Ok(())
}
