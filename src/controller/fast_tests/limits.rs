//! What the namespace, the tenancy policy and the map's budget allow.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use serde_json::json;

use super::harness::{self, Harness, NS, ready};
use crate::conditions::reason;
use crate::controller::{OperatorConfig, PROJECT_ANNOTATION};

/// Reconciles `name` twice; its `Ready` (status, reason).
async fn settle(h: &Harness, name: &str) -> (String, String) {
    h.reconcile(name).await.expect("the finalizer is added");
    h.reconcile(name).await.expect("the reconcile succeeds");
    let g = h.get(name).expect("the resource exists");
    let ready = ready(&g).expect("a Ready condition");
    (ready.status, ready.reason)
}

fn not_ready(reason: &str) -> (String, String) {
    ("False".to_owned(), reason.to_owned())
}

#[tokio::test]
async fn reconcile_reports_project_changed_when_the_namespace_moves_to_another_project() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    let g = h.reconcile_until_ready("photos").await;
    let physical = g.status.and_then(|s| s.bucket_full_name).expect("a bucket");
    h.api.modify::<Namespace>("", NS, |ns| {
        ns["metadata"]["annotations"] = json!({PROJECT_ANNOTATION: "another-project"});
    });
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let g = h.get("photos").expect("the resource exists");
    let ready = ready(&g).expect("a Ready condition");
    assert_eq!(
        (ready.status, ready.reason),
        not_ready(reason::PROJECT_CHANGED)
    );
    assert!(h.gcs.bucket(&physical).is_some(), "the bucket stays");
    assert_eq!(h.gcs.buckets().len(), 1, "none created elsewhere");
}

#[tokio::test]
async fn reconcile_keeps_the_annotated_project_while_the_namespace_cache_lags() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    h.sync();
    // Annotated after the cache listed it: the cache still has no project.
    h.api.modify::<Namespace>("", NS, |ns| {
        ns["metadata"]["annotations"] = json!({PROJECT_ANNOTATION: "team-project"});
    });
    for _ in 0..4 {
        h.sync_but_namespaces();
        h.reconcile_cached("photos")
            .await
            .expect("the reconcile succeeds");
    }
    let g = h.get("photos").expect("the resource exists");
    let ready = ready(&g).expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", reason::BUCKET_READY),
        "{}",
        ready.message
    );
    let status = g.status.expect("a status");
    assert_eq!(status.project_id.as_deref(), Some("team-project"));
    let physical = status.bucket_full_name.expect("a bucket");
    assert_eq!(
        h.gcs.bucket_project(&physical).as_deref(),
        Some("team-project")
    );
}

#[tokio::test]
async fn reconcile_of_a_project_the_policy_does_not_allow_reports_not_allowed_by_policy() {
    let h = Harness::new().await;
    h.create(
        "photos",
        json!({"bucketName": "photos", "projectID": "not-the-default"}),
    );
    assert_eq!(
        settle(&h, "photos").await,
        not_ready(reason::NOT_ALLOWED_BY_POLICY)
    );
    assert!(h.gcs.calls().is_empty());
}

/// The operator with a policy that allows [`NS`] `max` buckets.
async fn limited(max: u32) -> Harness {
    let policy: crate::tenancy::Policy = serde_json::from_value(json!({"rules": [
        {"namespaces": [NS], "projects": [harness::PROJECT], "maxBucketsPerNamespace": max},
    ]}))
    .expect("a policy");
    let config = OperatorConfig {
        tenancy: std::sync::Arc::new(policy),
        ..harness::config()
    };
    Harness::with_config(config).await
}

#[tokio::test]
async fn reconcile_counts_the_namespace_resources_against_the_policy_limit() {
    let h = limited(1).await;
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile_until_ready("photos").await;
    h.create("videos", json!({"bucketName": "videos"}));
    assert_eq!(
        settle(&h, "videos").await,
        not_ready(reason::NOT_ALLOWED_BY_POLICY)
    );
    assert_eq!(h.gcs.buckets().len(), 1, "no second bucket");
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let photos = h.get("photos").expect("the resource exists");
    assert_eq!(
        ready(&photos).map(|c| c.status),
        Some("True".into()),
        "the first keeps its bucket"
    );
}

#[tokio::test]
async fn reconcile_of_an_entry_the_map_has_no_room_for_reports_map_full() {
    let h = Harness::with_config(OperatorConfig {
        map_max_bytes: 10,
        ..harness::config()
    })
    .await;
    h.create("photos", json!({"bucketName": "photos"}));
    assert_eq!(settle(&h, "photos").await, not_ready(reason::MAP_FULL));
    assert_eq!(h.gcs.buckets().len(), 1, "the bucket exists, unpublished");
    assert!(h.map().is_empty());
}

#[tokio::test]
async fn reconcile_counts_again_when_another_replica_took_the_last_place_meanwhile() {
    let h = limited(2).await;
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile_until_ready("photos").await;
    let videos = h.create("videos", json!({"bucketName": "videos"}));
    let music = h.create("music", json!({"bucketName": "music"}));
    let places = crate::controller::places_name(NS);
    let operator_ns = h.ctx.config.operator_namespace.clone();
    // Between this replica's count and its write, another takes the
    // last place (a leader that stalled after counting, say).
    let counts = std::cell::RefCell::new(Vec::new());
    let decide = |buckets: usize| {
        if counts.borrow().is_empty() {
            let uid = videos.metadata.uid.clone().expect("a uid");
            h.api.modify::<ConfigMap>(&operator_ns, &places, |cm| {
                cm["data"][uid] = json!("videos")
            });
        }
        counts.borrow_mut().push(buckets);
        if buckets > 2 { Err(buckets) } else { Ok(()) }
    };
    let decision = crate::controller::places::take_place(&h.ctx, &music, decide).await;
    assert_eq!(
        decision.expect("no API error"),
        Err(3),
        "counted again, refused"
    );
    assert_eq!(*counts.borrow(), [2, 3], "the first write was refused");
    let cm: ConfigMap = h.api.get(&operator_ns, &places).expect("the places");
    let held: Vec<String> = cm.data.unwrap_or_default().into_values().collect();
    assert_eq!(held.len(), 2, "photos and videos only: {held:?}");
    assert!(!held.contains(&"music".to_owned()), "{held:?}");
}
