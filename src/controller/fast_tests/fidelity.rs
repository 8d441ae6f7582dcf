//! The fake API server answers as the API server does where the
//! reconciler relies on it, checked through kube's client; and the
//! reconciler's handling of those answers (a cache lagging behind the
//! finalizer, a map key another manager owns).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::api::FakeApi;
use super::harness::{Harness, NS, ready};
use crate::conditions::reason;
use crate::crd::{FINALIZER, Gcs};

fn status_code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(status) => status.code,
        other => panic!("not an API error: {other}"),
    }
}

fn map(data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "m", "namespace": NS, "finalizers": ["example.com/keep"]}, "data": data,
    }))
    .expect("a ConfigMap")
}

#[tokio::test]
async fn reconcile_fake_api_refuses_stale_versions_failed_tests_and_missing_objects() {
    let api: Api<ConfigMap> = Api::namespaced(FakeApi::new().client(), NS);
    let created = api
        .create(&PostParams::default(), &map(json!({"a": "1"})))
        .await
        .unwrap();
    let refused = api
        .create(&PostParams::default(), &map(json!({})))
        .await
        .unwrap_err();
    assert_eq!(status_code(refused), 409, "already exists");
    let merged = api
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"b": "2"}})),
        )
        .await
        .unwrap();
    assert_ne!(
        merged.metadata.resource_version,
        created.metadata.resource_version
    );
    let stale = api
        .replace("m", &PostParams::default(), &created)
        .await
        .unwrap_err();
    assert_eq!(status_code(stale), 409, "a stale resourceVersion");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/a", "value": "2"}, {"op": "remove", "path": "/data/a"},
    ]))
    .unwrap();
    let failed = api
        .patch("m", &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .unwrap_err();
    assert_eq!(status_code(failed), 422, "a failed test");
    assert_eq!(
        api.get("m").await.unwrap().data,
        merged.data,
        "nothing applied"
    );
    assert_eq!(status_code(api.get("gone").await.unwrap_err()), 404);
    api.delete("m", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("m").await.unwrap();
    assert!(
        deleting.metadata.deletion_timestamp.is_some(),
        "kept by its finalizer"
    );
    let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    api.patch("m", &PatchParams::default(), &release)
        .await
        .unwrap();
    assert_eq!(
        status_code(api.get("m").await.unwrap_err()),
        404,
        "gone with its last finalizer"
    );
}

#[tokio::test]
async fn reconcile_fake_api_takes_an_applied_resource_version_as_a_precondition() {
    let api: Api<ConfigMap> = Api::namespaced(FakeApi::new().client(), NS);
    let version = api
        .create(&PostParams::default(), &map(json!({"a": "1"})))
        .await
        .unwrap()
        .metadata
        .resource_version;
    let apply = Patch::Apply(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "m", "resourceVersion": version}, "data": {"c": "3"},
    }));
    let ssa = PatchParams::apply("test").force();
    let applied = api.patch("m", &ssa, &apply).await.unwrap();
    assert_eq!(
        applied.data.and_then(|d| d.get("c").cloned()).as_deref(),
        Some("3")
    );
    let stale = api.patch("m", &ssa, &apply).await.unwrap_err();
    assert_eq!(
        status_code(stale),
        409,
        "an apply of a stale resourceVersion"
    );
}

#[tokio::test]
async fn reconcile_goes_on_when_the_cache_lags_behind_the_finalizer() {
    let h = Harness::new().await;
    h.create("photos", json!({"bucketName": "photos"}));
    h.sync();
    // Added since the cache was filled (by the finalizer webhook, or an
    // earlier reconcile whose watch event has not arrived).
    h.api.modify::<Gcs>(NS, "photos", |g| {
        g["metadata"]["finalizers"] = json!([FINALIZER])
    });
    h.reconcile_cached("photos")
        .await
        .expect("the reconcile succeeds");
    let g = h.get("photos").expect("the resource exists");
    assert_eq!(
        g.metadata.finalizers,
        Some(vec![FINALIZER.to_owned()]),
        "not added twice"
    );
    assert_eq!(ready(&g).map(|c| c.status), Some("True".to_owned()));
}

#[tokio::test]
async fn reconcile_never_takes_over_a_map_key_another_manager_owns() {
    let h = Harness::new().await;
    let theirs = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bucketmap", "namespace": NS},
        "data": {"photos": "their-bucket"},
    });
    let maps: Api<ConfigMap> = Api::namespaced(h.ctx.client.clone(), NS);
    maps.patch(
        "bucketmap",
        &PatchParams::apply("platform-team"),
        &Patch::Apply(&theirs),
    )
    .await
    .unwrap();
    h.create("photos", json!({"bucketName": "photos"}));
    h.reconcile("photos").await.expect("the finalizer is added");
    h.reconcile("photos").await.expect("the reconcile succeeds");
    let g = h.get("photos").expect("the resource exists");
    let ready = ready(&g).expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reason::MAPPING_CONFLICT)
    );
    assert_eq!(
        h.map().get("photos").map(String::as_str),
        Some("their-bucket")
    );
    let conflicts = h
        .api
        .writes::<ConfigMap>()
        .iter()
        .filter(|w| w.code == 409)
        .count();
    assert!(conflicts >= 1, "{:?}", h.api.writes::<ConfigMap>());
}
