//! `spec.notifications`: configurations made, kept and deleted by content,
//! the `Notifications` condition, a refused topic, and a rebuilt cluster.

use bucketmap_testkit::mock_gcs::Fault;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use tonic::Code;

use super::harness::{Harness, NS, condition, ready};
use crate::conditions::{NOTIFICATIONS, reason};
use crate::crd::Gcs;

const UPLOADS: &str = "projects/acme-test/topics/uploads";
const AUDIT: &str = "projects/acme-test/topics/audit";

fn spec(notifications: Value) -> Value {
    json!({"bucketName": "photos", "deletionPolicy": "Orphan", "notifications": notifications})
}

fn uploads() -> Value {
    json!({"topic": UPLOADS, "eventTypes": ["OBJECT_FINALIZE"], "objectNamePrefix": "in/",
           "customAttributes": {"team": "a"}})
}

fn topics_of(configs: &[Value]) -> Vec<String> {
    let mut topics: Vec<String> = configs
        .iter()
        .map(|c| c["topic"].as_str().unwrap_or_default().to_owned())
        .collect();
    topics.sort();
    topics
}

fn full(topic: &str) -> String {
    format!("//pubsub.googleapis.com/{topic}")
}

/// The `Notifications` condition of `photos`: (status, reason).
fn notified(h: &Harness) -> Option<(String, String)> {
    let g = h.get("photos")?;
    condition(&g, NOTIFICATIONS).map(|c| (c.status, c.reason))
}

/// When `action` reconciles again, in seconds (`Action` shows it only
/// in its `Debug` form).
fn requeue_seconds(action: &Action) -> f64 {
    let shown = format!("{action:?}");
    let inner = shown
        .split("Some(")
        .nth(1)
        .and_then(|r| r.split("s)").next());
    inner
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no requeue: {shown}"))
}

async fn ready_bucket(h: &Harness, spec: Value) -> String {
    h.create("photos", spec);
    let g = h.reconcile_until_ready("photos").await;
    g.status.and_then(|s| s.bucket_full_name).expect("a bucket")
}

fn set_notifications(h: &Harness, notifications: Value) {
    h.api
        .modify::<Gcs>(NS, "photos", |g| g["spec"]["notifications"] = notifications);
}

#[tokio::test]
async fn reconcile_creates_declared_notifications_once_and_only_reads_them_after() {
    let h = Harness::new().await;
    h.gcs.add_topic(UPLOADS);
    let physical = ready_bucket(&h, spec(json!([uploads()]))).await;
    let configs = h.gcs.notifications(&physical);
    assert_eq!(configs.len(), 1, "{configs:?}");
    assert_eq!(configs[0]["topic"], full(UPLOADS).as_str());
    assert_eq!(configs[0]["event_types"], json!(["OBJECT_FINALIZE"]));
    assert_eq!(configs[0]["object_name_prefix"], "in/");
    assert_eq!(configs[0]["custom_attributes"], json!({"team": "a"}));
    assert_eq!(configs[0]["payload_format"], "JSON_API_V1");
    assert_eq!(
        notified(&h),
        Some(("True".into(), reason::NOTIFICATIONS_READY.into()))
    );
    let recorded = h.get("photos").and_then(|g| g.status).expect("a status");
    assert_eq!(recorded.notifications.len(), 1);
    assert_eq!(
        recorded.notifications[0].id,
        configs[0]["id"].as_str().map(str::to_owned)
    );
    h.event("photos", "NotificationCreated").await;
    h.gcs.reset_calls();
    h.reconcile("photos").await.expect("the resync succeeds");
    assert_eq!(h.gcs.call_count("ListNotificationConfigs"), 1);
    assert_eq!(h.gcs.call_count("CreateNotificationConfig"), 0);
    assert_eq!(h.gcs.call_count("DeleteNotificationConfig"), 0);
}

#[tokio::test]
async fn reconcile_without_notifications_never_calls_the_json_api() {
    let h = Harness::new().await;
    ready_bucket(&h, json!({"bucketName": "photos"})).await;
    h.reconcile("photos").await.expect("the resync succeeds");
    assert_eq!(h.gcs.call_count("ListNotificationConfigs"), 0);
    assert_eq!(notified(&h), None);
}

#[tokio::test]
async fn reconcile_of_a_refused_topic_keeps_the_bucket_ready_and_retries_soon() {
    let h = Harness::new().await;
    h.gcs.add_topic(AUDIT);
    let both = json!([uploads(), {"topic": AUDIT}]);
    let physical = ready_bucket(&h, spec(both)).await;
    assert_eq!(topics_of(&h.gcs.notifications(&physical)), [full(AUDIT)]);
    assert_eq!(
        notified(&h),
        Some(("False".into(), reason::TOPIC_UNAVAILABLE.into()))
    );
    let g = h.get("photos").expect("the resource");
    assert_eq!(ready(&g).map(|c| c.status), Some("True".into()));
    assert!(h.map().contains_key("photos"), "the app can use the bucket");
    let event = h.event("photos", reason::TOPIC_UNAVAILABLE).await;
    assert!(
        event.note.as_deref().is_some_and(|n| n.contains(UPLOADS)),
        "{event:?}"
    );
    let action = h.reconcile("photos").await.expect("the reconcile succeeds");
    let after = requeue_seconds(&action);
    assert!(
        after < h.ctx.config.resync.as_secs_f64() / 2.0,
        "{action:?}"
    );
    h.gcs.add_topic(UPLOADS);
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let topics = topics_of(&h.gcs.notifications(&physical));
    assert_eq!(topics, [full(AUDIT), full(UPLOADS)]);
    assert_eq!(
        notified(&h),
        Some(("True".into(), reason::NOTIFICATIONS_READY.into()))
    );
}

#[tokio::test]
async fn reconcile_deletes_only_the_notifications_it_made_that_left_the_spec() {
    let h = Harness::new().await;
    h.gcs.add_topic(UPLOADS);
    h.gcs.add_topic(AUDIT);
    let physical = ready_bucket(&h, spec(json!([uploads()]))).await;
    let theirs = json!({"topic": full(AUDIT), "payload_format": "NONE"});
    h.gcs
        .insert_notification(&physical, theirs)
        .expect("another tool's configuration");
    set_notifications(&h, json!([]));
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert_eq!(topics_of(&h.gcs.notifications(&physical)), [full(AUDIT)]);
    assert_eq!(notified(&h), None);
    let g = h.get("photos").and_then(|g| g.status).expect("a status");
    assert!(g.notifications.is_empty(), "{:?}", g.notifications);
    h.event("photos", "NotificationDeleted").await;
}

#[tokio::test]
async fn reconcile_of_a_changed_notification_creates_the_new_one_before_deleting_the_old() {
    let h = Harness::new().await;
    h.gcs.add_topic(UPLOADS);
    let physical = ready_bucket(&h, spec(json!([uploads()]))).await;
    let mut changed = uploads();
    changed["objectNamePrefix"] = json!("incoming/");
    set_notifications(&h, json!([changed]));
    h.gcs.reset_calls();
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let configs = h.gcs.notifications(&physical);
    assert_eq!(configs.len(), 1, "{configs:?}");
    assert_eq!(configs[0]["object_name_prefix"], "incoming/");
    let order: Vec<String> = h.gcs.calls().into_iter().map(|c| c.method).collect();
    let created = order.iter().position(|m| m == "CreateNotificationConfig");
    let deleted = order.iter().position(|m| m == "DeleteNotificationConfig");
    assert!(created.is_some() && created < deleted, "{order:?}");
}

#[tokio::test]
async fn reconcile_of_a_recreated_resource_finds_its_notifications_instead_of_duplicating_them() {
    let h = Harness::new().await;
    h.gcs.add_topic(UPLOADS);
    let physical = ready_bucket(&h, spec(json!([uploads()]))).await;
    h.delete("photos").await;
    h.reconcile("photos").await.expect("the cleanup succeeds");
    assert!(h.get("photos").is_none());
    assert_eq!(
        h.gcs.notifications(&physical).len(),
        1,
        "kept with the orphaned bucket"
    );
    // A rebuilt cluster: the same namespace and name, no status.
    h.create("photos", spec(json!([uploads()])));
    h.reconcile_until_ready("photos").await;
    assert_eq!(h.gcs.notifications(&physical).len(), 1, "not duplicated");
    let g = h.get("photos").and_then(|g| g.status).expect("a status");
    assert!(g.notifications[0].id.is_some(), "{:?}", g.notifications);
    // Found, not made again: removing it from the spec deletes it.
    set_notifications(&h, json!([]));
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert!(h.gcs.notifications(&physical).is_empty());
}

#[tokio::test]
async fn reconcile_records_a_notification_before_making_it() {
    let h = Harness::new().await;
    h.gcs.add_topic(UPLOADS);
    let lost = Fault {
        times: Some(1),
        after_write: true,
        ..Fault::new("CreateNotificationConfig", Code::Unavailable)
    };
    h.gcs.add_fault(lost);
    h.create("photos", spec(json!([uploads()])));
    h.reconcile("photos").await.expect("the finalizer is added");
    let outcome = h.reconcile("photos").await;
    assert!(outcome.is_err(), "the lost answer fails the reconcile");
    let g = h.get("photos").and_then(|g| g.status).expect("a status");
    assert_eq!(g.notifications.len(), 1, "recorded before the call");
    let physical = g.bucket_full_name.expect("a bucket");
    h.reconcile_until_ready("photos").await;
    assert_eq!(h.gcs.notifications(&physical).len(), 1, "made once");
    set_notifications(&h, json!([]));
    h.reconcile("photos").await.expect("the reconcile succeeds");
    assert!(
        h.gcs.notifications(&physical).is_empty(),
        "and known as ours"
    );
}

#[tokio::test]
async fn reconcile_refuses_a_notification_with_a_reserved_attribute_and_makes_the_others() {
    let h = Harness::new().await;
    h.gcs.add_topic(UPLOADS);
    h.gcs.add_topic(AUDIT);
    let reserved = json!({"topic": AUDIT, "customAttributes": {"goog-source": "x"}});
    let physical = ready_bucket(&h, spec(json!([uploads(), reserved]))).await;
    assert_eq!(topics_of(&h.gcs.notifications(&physical)), [full(UPLOADS)]);
    assert_eq!(
        notified(&h),
        Some(("False".into(), reason::INVALID_SPEC.into()))
    );
    let event = h.event("photos", reason::INVALID_SPEC).await;
    assert!(
        event
            .note
            .as_deref()
            .is_some_and(|n| n.contains("goog-source")),
        "{event:?}"
    );
}
