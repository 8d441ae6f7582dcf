//! The map reader binding: made with a namespace's first `Gcs`, before
//! its map, removed with its last; never another's.

use axum::http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::harness::{Harness, NS, config};
use crate::controller::MAP_READER_BINDING;

const ROLE: &str = "bucketmap-map-reader";

/// The operator as the cluster-wide chart runs it: binding `ROLE`.
async fn harness() -> Harness {
    let config = crate::controller::OperatorConfig {
        map_reader_role: Some(ROLE.to_owned()),
        ..config()
    };
    Harness::with_config(config).await
}

fn binding(h: &Harness) -> Option<RoleBinding> {
    h.api.get(NS, MAP_READER_BINDING)
}

/// The writes to the map reader binding, by method.
fn binding_writes(h: &Harness) -> Vec<Method> {
    h.api
        .writes::<RoleBinding>()
        .into_iter()
        .map(|l| l.method)
        .collect()
}

/// `Gcs` `name` deleted (its finalizer keeps it) and its cleanup run.
async fn delete_and_clean_up(h: &Harness, name: &str) {
    h.delete(name).await;
    h.reconcile(name).await.expect("the cleanup succeeds");
    assert!(h.get(name).is_none(), "{name}'s finalizer was removed");
}

#[tokio::test]
async fn reconcile_binds_the_map_readers_with_the_first_gcs_before_the_map_is_written() {
    let h = harness().await;
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile_until_ready("photos").await;
    let rb = binding(&h).expect("the binding");
    assert_eq!(
        rb.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("bucketmap")
    );
    assert_eq!(
        (rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()),
        ("ClusterRole", ROLE)
    );
    let subjects = rb.subjects.clone().unwrap_or_default();
    let subjects: Vec<(&str, &str)> = subjects
        .iter()
        .map(|s| (s.kind.as_str(), s.name.as_str()))
        .collect();
    assert_eq!(subjects, [("Group", "system:serviceaccounts:team-a")]);
    let log = h.api.log();
    let first = |collection: String, name: Option<&str>| {
        log.iter().position(|l| {
            l.is_write()
                && l.collection == collection
                && (name.is_none() || l.name.as_deref() == name)
        })
    };
    let bound = first(RoleBinding::url_path(&(), None), None).expect("a binding write");
    let mapped = first(ConfigMap::url_path(&(), None), Some("bucketmap")).expect("a map write");
    assert!(bound < mapped, "the map was written first: {log:#?}");

    // Further resources and reconciles find it in the cache: no write.
    h.create("videos", json!({"bucketName": "videos"}));
    h.reconcile_until_ready("videos").await;
    h.reconcile("photos").await.expect("the resync succeeds");
    assert_eq!(binding_writes(&h), [Method::PATCH], "{:#?}", h.api.log());
}

#[tokio::test]
async fn reconcile_unbinds_the_map_readers_with_the_last_gcs_only() {
    let h = harness().await;
    for name in ["photos", "videos"] {
        h.create(name, json!({"bucketName": name}));
        h.reconcile_until_ready(name).await;
    }
    delete_and_clean_up(&h, "photos").await;
    assert!(binding(&h).is_some(), "videos is left");
    assert_eq!(binding_writes(&h), [Method::PATCH]);
    delete_and_clean_up(&h, "videos").await;
    assert!(binding(&h).is_none(), "the last Gcs is gone");
    assert_eq!(binding_writes(&h), [Method::PATCH, Method::DELETE]);
    assert!(h.map().is_empty(), "{:?}", h.map());
}

#[tokio::test]
async fn reconcile_counts_a_resource_being_deleted_as_gone() {
    let h = harness().await;
    for name in ["photos", "videos"] {
        h.create(name, json!({"bucketName": name}));
        h.reconcile_until_ready(name).await;
    }
    // videos waits for its bucket to be emptied: it keeps its finalizer.
    let physical = h.candidate("videos", "videos", 0);
    h.gcs.put_object(&physical, "kept.txt").expect("an object");
    h.delete("videos").await;
    h.reconcile("videos")
        .await
        .expect_err("the deletion is blocked");
    assert!(binding(&h).is_some(), "photos is left");
    delete_and_clean_up(&h, "photos").await;
    assert!(
        binding(&h).is_none(),
        "only a resource being deleted is left"
    );
}

#[tokio::test]
async fn reconcile_binds_again_after_the_binding_was_deleted_edited_or_its_role_changed() {
    let h = harness().await;
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile_until_ready("photos").await;
    let api: Api<RoleBinding> = Api::namespaced(h.ctx.client.clone(), NS);
    api.delete(MAP_READER_BINDING, &DeleteParams::default())
        .await
        .expect("deleted");
    // The binding's deletion brings the namespace's resources back.
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let first = binding(&h).expect("bound again");

    // Its subjects widened by somebody: taken back.
    h.api.modify::<RoleBinding>(NS, MAP_READER_BINDING, |rb| {
        rb["subjects"][0]["name"] = json!("system:serviceaccounts");
    });
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let repaired = binding(&h).expect("bound");
    let subjects = repaired.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].name, "system:serviceaccounts:team-a");

    // A binding of another role (an earlier setting): its roleRef cannot
    // change, so it is replaced.
    h.api.modify::<RoleBinding>(NS, MAP_READER_BINDING, |rb| {
        rb["roleRef"]["name"] = json!("bucketmap-old-reader");
    });
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let replaced = binding(&h).expect("bound again");
    assert_eq!(replaced.role_ref.name, ROLE);
    assert_ne!(replaced.metadata.uid, first.metadata.uid, "a new object");
}

#[tokio::test]
async fn reconcile_leaves_a_binding_of_that_name_it_did_not_make_alone() {
    let h = harness().await;
    let theirs: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": MAP_READER_BINDING, "namespace": NS,
                     "labels": {"app.kubernetes.io/managed-by": "Helm"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:serviceaccounts:team-a"}],
    }))
    .expect("a RoleBinding");
    let theirs = h.api.create(&theirs);
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile_until_ready("photos").await;
    delete_and_clean_up(&h, "photos").await;
    assert!(binding_writes(&h).is_empty(), "{:#?}", h.api.log());
    let kept = binding(&h).expect("kept");
    assert_eq!(
        kept.metadata.resource_version,
        theirs.metadata.resource_version
    );
}

#[tokio::test]
async fn reconcile_without_a_map_reader_role_manages_no_binding() {
    let h = Harness::new().await;
    assert_eq!(h.ctx.config.map_reader_role, None, "the default");
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile_until_ready("photos").await;
    delete_and_clean_up(&h, "photos").await;
    let reads = h.api.log().into_iter();
    let touched: Vec<_> = reads
        .filter(|l| l.collection == RoleBinding::url_path(&(), None))
        .collect();
    assert!(touched.is_empty(), "{touched:#?}");
}
