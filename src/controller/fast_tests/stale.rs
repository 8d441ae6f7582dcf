//! A status is written only from the view it was computed from: a
//! reconcile that starts from a cache behind the API server (the watch has
//! not delivered the last status write yet), on this replica or another,
//! never drops what that write recorded. One test per condition type, then
//! a model of random interleavings of watch delays, resyncs, spec changes,
//! restarts and reconciles, checked against a reconcile from scratch.

use bucketmap_testkit::mock_gcs::proto;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::harness::{Harness, NS, PROJECT, condition};
use crate::conditions::{
    ACCESS, ADOPTED, IMMUTABLE_SETTINGS_DIFFER, IP_FILTER_HIDDEN, NOTIFICATIONS,
    RETENTION_POLICY_LOCKED,
};
use crate::crd::{Gcs, GcsStatus};

const NAME: &str = "photos";
const LEGACY: &str = "legacy-photos";

/// What a condition says, without when it last changed.
fn said(c: &Condition) -> (String, String, String, Option<i64>) {
    let c = c.clone();
    (c.status, c.reason, c.message, c.observed_generation)
}

/// Condition `type_` of [`NAME`] as stored now; it must be there.
fn stored(h: &Harness, type_: &str) -> Condition {
    let g = h.get(NAME).expect("the resource exists");
    condition(&g, type_).unwrap_or_else(|| panic!("no {type_} condition: {:#?}", g.status))
}

/// Condition `type_` of [`NAME`] is as it stands after a reconcile by this
/// replica and then by another one (a leader change, a restart), each
/// starting from the cache as it was before the status write that
/// recorded the condition.
async fn stays_against_a_stale_cache(h: &Harness, type_: &str) {
    let expected = stored(h, type_);
    let stale = h
        .versions(NAME)
        .into_iter()
        .rev()
        .find(|g| condition(g, type_).map(|c| said(&c)) != Some(said(&expected)))
        .expect("a version before the condition was written");
    h.cache_as(stale.clone());
    h.reconcile_cached(NAME)
        .await
        .expect("the reconcile succeeds");
    assert_eq!(said(&stored(h, type_)), said(&expected), "this replica");
    let other = h.replica().await;
    other.cache_as(stale);
    other
        .reconcile_cached(NAME)
        .await
        .expect("the reconcile succeeds");
    assert_eq!(said(&stored(h, type_)), said(&expected), "another replica");
}

fn service_account(h: &Harness) {
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "app", "namespace": NS},
    }))
    .expect("a ServiceAccount");
    h.api.create(&sa);
}

/// An unowned bucket [`LEGACY`] without hierarchical namespace.
fn legacy_bucket(h: &Harness) {
    let flat = proto::Bucket {
        bucket_id: LEGACY.to_owned(),
        ..Default::default()
    };
    h.gcs.insert_bucket(PROJECT, flat).expect("inserted");
}

#[tokio::test]
async fn reconcile_from_a_stale_cache_keeps_adopted_and_immutable_settings_differ() {
    let h = Harness::new().await;
    legacy_bucket(&h);
    h.create(
        NAME,
        json!({"bucketName": "photos", "adopt": {"bucket": LEGACY},
               "hierarchicalNamespace": {"enabled": true}}),
    );
    h.reconcile_until_ready(NAME).await;
    stays_against_a_stale_cache(&h, ADOPTED).await;
    stays_against_a_stale_cache(&h, IMMUTABLE_SETTINGS_DIFFER).await;
}

#[tokio::test]
async fn reconcile_from_a_stale_cache_keeps_access() {
    let h = Harness::new().await;
    service_account(&h);
    h.create(
        NAME,
        json!({"bucketName": "photos", "access": [{"serviceAccount": "app", "role": "objectUser"}]}),
    );
    h.reconcile_until_ready(NAME).await;
    stays_against_a_stale_cache(&h, ACCESS).await;
}

#[tokio::test]
async fn reconcile_from_a_stale_cache_keeps_notifications() {
    let h = Harness::new().await;
    let topic = "projects/acme-test/topics/uploads";
    h.create(
        NAME,
        json!({"bucketName": "photos", "notifications": [{"topic": topic}]}),
    );
    h.reconcile_until_ready(NAME).await;
    stays_against_a_stale_cache(&h, NOTIFICATIONS).await;
}

#[tokio::test]
async fn reconcile_from_a_stale_cache_keeps_retention_policy_locked() {
    let h = Harness::new().await;
    let locked = |seconds: i64| json!({"retentionPeriodSeconds": seconds, "isLocked": true});
    h.create(
        NAME,
        json!({"bucketName": "photos", "retentionPolicy": locked(3600)}),
    );
    h.reconcile_until_ready(NAME).await;
    h.api
        .modify::<Gcs>(NS, NAME, |g| g["spec"]["retentionPolicy"] = locked(60));
    h.reconcile(NAME).await.expect("the reconcile succeeds");
    stays_against_a_stale_cache(&h, RETENTION_POLICY_LOCKED).await;
}

#[tokio::test]
async fn reconcile_from_a_stale_cache_keeps_ip_filter_hidden() {
    let h = Harness::new().await;
    h.gcs.withhold_permission("storage.buckets.getIpFilter");
    let filter = json!({"mode": "Enabled",
        "publicNetworkSource": {"allowedIpCidrRanges": ["203.0.113.0/24"]}});
    h.create(NAME, json!({"bucketName": "photos", "ipFilter": filter}));
    h.reconcile_until_ready(NAME).await;
    stays_against_a_stale_cache(&h, IP_FILTER_HIDDEN).await;
}

#[tokio::test]
async fn reconcile_from_a_stale_cache_writes_no_status_and_creates_nothing_again() {
    let h = Harness::new().await;
    h.create(NAME, json!({"bucketName": "photos"}));
    h.reconcile_until_ready(NAME).await;
    let versions = h.versions(NAME);
    let before_create = versions
        .iter()
        .rev()
        .find(|g| g.status.as_ref().is_none_or(|s| s.create_time.is_none()))
        .expect("a version without the bucket")
        .clone();
    let now = h.get(NAME).expect("the resource exists");
    let other = h.replica().await;
    other.cache_as(before_create);
    other
        .reconcile_cached(NAME)
        .await
        .expect("the reconcile succeeds");
    assert_eq!(h.gcs.call_count("CreateBucket"), 1, "created once");
    let after = h.get(NAME).expect("the resource exists");
    assert_eq!(after.status, now.status, "the status is as it was");
    assert_eq!(
        after.metadata.resource_version, now.metadata.resource_version,
        "a reconcile of an exact status writes nothing"
    );
}

/// One step of the model.
#[derive(Clone, Debug)]
enum Step {
    /// Replica `replica` reconciles with the resource `lag` writes behind
    /// the API server in its cache (a watch that has not delivered them).
    Reconcile { replica: usize, lag: usize },
    /// Replica `replica`'s watch catches up; a resync reconciles.
    Resync { replica: usize },
    /// The user changes the spec to variant `variant` of [`spec`].
    Edit { variant: usize },
    /// Replica `replica` restarts: empty caches, no memory of its writes.
    Restart { replica: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..2usize, 0..4usize).prop_map(|(replica, lag)| Step::Reconcile { replica, lag }),
        2 => (0..2usize).prop_map(|replica| Step::Resync { replica }),
        2 => (0..3usize).prop_map(|variant| Step::Edit { variant }),
        1 => (0..2usize).prop_map(|replica| Step::Restart { replica }),
    ]
}

/// The spec variants the model edits between: every one adopts
/// [`LEGACY`] with a setting GCS fixes at creation that differs; access
/// that the namespace may not grant comes and goes.
fn spec(variant: usize) -> Value {
    let access = match variant {
        0 => json!([{"serviceAccount": "app", "role": "objectUser"}]),
        1 => json!([]),
        _ => json!([{"serviceAccount": "app", "role": "objectViewer"}]),
    };
    json!({"bucketName": "photos", "adopt": {"bucket": LEGACY},
           "hierarchicalNamespace": {"enabled": true}, "access": access})
}

/// What a reconcile from scratch must agree on: the recorded bucket, the
/// grants, and each condition's status, reason and message, for the
/// resource's current generation.
fn essence(g: &Gcs) -> (GcsStatus, Vec<(String, String, String, String)>) {
    let mut status = g.status.clone().unwrap_or_default();
    assert_eq!(
        status.observed_generation, g.metadata.generation,
        "the status describes the current spec: {status:#?}"
    );
    let mut conditions: Vec<_> = status
        .conditions
        .drain(..)
        .map(|c| (c.type_, c.status, c.reason, c.message))
        .collect();
    conditions.sort();
    status.observed_generation = None;
    status.create_time = None;
    (status, conditions)
}

/// Reconciles with every cache current until the resource is Ready.
async fn settle(h: &Harness) -> Gcs {
    h.reconcile_until_ready(NAME).await
}

async fn world() -> Harness {
    let h = Harness::new().await;
    legacy_bucket(&h);
    service_account(&h);
    h
}

/// Runs `steps` on one world (two replicas), and the final spec on another
/// from scratch; both end with the same status.
async fn model(steps: Vec<Step>) {
    let chaos = world().await;
    chaos.create(NAME, spec(0));
    let mut replicas = [chaos.replica().await, chaos.replica().await];
    let mut last = 0;
    for step in steps {
        match step {
            Step::Reconcile { replica, lag } => {
                let r = &replicas[replica];
                r.sync();
                let versions = r.versions(NAME);
                let seen = versions.len().saturating_sub(1 + lag);
                r.cache_as(versions[seen].clone());
                // Errors are retried by the controller; the model checks
                // what was written.
                let _ = r.reconcile_cached(NAME).await;
            }
            Step::Resync { replica } => {
                let _ = replicas[replica].reconcile(NAME).await;
            }
            Step::Edit { variant } => {
                chaos
                    .api
                    .modify::<Gcs>(NS, NAME, |g| g["spec"] = spec(variant));
                last = variant;
            }
            Step::Restart { replica } => replicas[replica] = chaos.replica().await,
        }
    }
    let fresh = chaos.replica().await;
    let got = settle(&fresh).await;
    let again = chaos.replica().await;
    again.reconcile(NAME).await.expect("the reconcile succeeds");
    let exact = chaos.get(NAME).expect("the resource exists");
    assert_eq!(
        exact.metadata.resource_version, got.metadata.resource_version,
        "a reconcile of the settled status wrote again: {:#?}",
        exact.status
    );
    let scratch = world().await;
    scratch.create(NAME, spec(last));
    let want = settle(&scratch).await;
    assert_eq!(essence(&got), essence(&want));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn reconcile_model_status_after_any_interleaving_is_a_fresh_reconciles(
        steps in proptest::collection::vec(step(), 1..14)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(model(steps));
    }
}
