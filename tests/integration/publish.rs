//! The bucket map ConfigMap and the Service Binding Secret, on a real API
//! server with the in-memory GCS.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bucketmap::crd::Gcs;
use bucketmap::publish::{BINDING_SECRET_TYPE, binding_secret_name};
use common::{Fixture, PROJECT, physical, uid};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

type TestResult = anyhow::Result<()>;

async fn wait_map(
    f: &Fixture,
    what: &str,
    check: impl Fn(&BTreeMap<String, String>) -> bool,
) -> anyhow::Result<BTreeMap<String, String>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let m = f.bucket_map().await?;
        if check(&m) {
            return Ok(m);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "bucket map: {what} not reached; map is {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn secret(f: &Fixture, name: &str) -> anyhow::Result<Option<Secret>> {
    let api: Api<Secret> = Api::namespaced(f.client.clone(), &f.ns);
    Ok(api.get_opt(&binding_secret_name(name)).await?)
}

fn text(s: &Secret, key: &str) -> String {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn ready_buckets_are_published_and_unpublished_leaving_other_keys_alone() -> TestResult {
    let f = Fixture::started().await?;
    // A key the operator did not write.
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), &f.ns);
    let foreign = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "bucketmap"},
        "data": {"legacy": "legacy-bucket-123"},
    });
    cms.patch(
        "bucketmap",
        &PatchParams::apply("platform-team"),
        &Patch::Apply(&foreign),
    )
    .await?;

    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_ready("photos").await?;
    let bucket = physical(&g);
    let m = f.bucket_map().await?;
    assert_eq!(m.get("photos"), Some(&bucket), "entry present once Ready");
    assert_eq!(
        m.get("legacy").map(String::as_str),
        Some("legacy-bucket-123")
    );

    let s = secret(&f, "photos").await?.expect("binding secret exists");
    assert_eq!(
        g.status
            .as_ref()
            .and_then(|st| st.binding.as_ref())
            .map(|b| b.name.clone()),
        Some(s.name_any())
    );
    assert_eq!(s.type_.as_deref(), Some(BINDING_SECRET_TYPE));
    assert_eq!(text(&s, "type"), "gcs");
    assert_eq!(text(&s, "provider"), "google");
    assert_eq!(text(&s, "bucket"), bucket);
    assert_eq!(text(&s, "logical-bucket"), "photos");
    assert_eq!(text(&s, "project"), PROJECT);
    assert_eq!(text(&s, "uri"), format!("gs://{bucket}"));
    assert_eq!(
        s.data.as_ref().map(|d| d.len()),
        Some(6),
        "no credentials or extras in the binding"
    );
    let owner = s
        .owner_references()
        .first()
        .cloned()
        .expect("owned by the Gcs");
    assert_eq!(owner.uid, uid(&g));
    assert_eq!(owner.controller, Some(true));

    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    let m = f.bucket_map().await?;
    assert!(
        !m.contains_key("photos"),
        "entry removed with the resource: {m:?}"
    );
    assert_eq!(
        m.get("legacy").map(String::as_str),
        Some("legacy-bucket-123"),
        "a key we did not write stays"
    );
    assert!(secret(&f, "photos").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn only_ready_buckets_are_listed() -> TestResult {
    let f = Fixture::new().await?;
    f.gcs.add_fault(bucketmap_testkit::mock_gcs::Fault::new(
        "CreateBucket",
        tonic::Code::PermissionDenied,
    ));
    let mut f = f;
    f.start_operator().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    f.wait_reason("photos", "PermissionDenied").await?;
    assert!(!f.bucket_map().await?.contains_key("photos"));
    assert!(secret(&f, "photos").await?.is_none());
    f.gcs.clear_faults();
    let g = f.wait_ready("photos").await?;
    wait_map(&f, "photos listed", |m| {
        m.get("photos") == Some(&physical(&g))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn fifty_concurrent_resources_give_exactly_fifty_entries() -> TestResult {
    let f = Fixture::started().await?;
    let names: Vec<String> = (0..50).map(|i| format!("bucket-{i:02}")).collect();
    futures::future::try_join_all(
        names
            .iter()
            .map(|n| f.create(n, serde_json::json!({"bucketName": n}))),
    )
    .await?;
    let mut expected = BTreeMap::new();
    for n in &names {
        let g = f.wait_ready(n).await?;
        expected.insert(n.clone(), physical(&g));
    }
    let m = wait_map(&f, "50 entries", |m| m.len() >= 50).await?;
    assert_eq!(m, expected);
    Ok(())
}

#[tokio::test]
async fn a_second_resource_with_the_same_logical_name_is_refused_in_the_map() -> TestResult {
    let f = Fixture::started().await?;
    f.create("first", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let first = f.wait_ready("first").await?;
    f.create("second", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let second = f.wait_reason("second", "MappingConflict").await?;
    assert!(!second.is_ready());
    assert_eq!(
        f.bucket_map().await?.get("photos"),
        Some(&physical(&first)),
        "the first mapping stands"
    );
    // Removing the second leaves the first's entry in place.
    f.delete("second").await?;
    f.wait_gone("second", Duration::from_secs(30)).await?;
    assert_eq!(f.bucket_map().await?.get("photos"), Some(&physical(&first)));
    Ok(())
}

#[tokio::test]
async fn an_orphaned_bucket_leaves_the_map() -> TestResult {
    let f = Fixture::started().await?;
    f.create(
        "photos",
        serde_json::json!({"bucketName": "photos", "deletionPolicy": "Orphan"}),
    )
    .await?;
    let g: Gcs = f.wait_ready("photos").await?;
    wait_map(&f, "photos listed", |m| m.contains_key("photos")).await?;
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    assert!(!f.bucket_map().await?.contains_key("photos"));
    assert!(
        f.gcs.bucket(&physical(&g)).is_some(),
        "the bucket itself is kept"
    );
    Ok(())
}

/// A Secret of the binding's name of Gcs `gcs`, made by somebody else.
async fn foreign_binding_secret(f: &Fixture, gcs: &str) -> anyhow::Result<(Api<Secret>, String)> {
    let secrets: Api<Secret> = Api::namespaced(f.client.clone(), &f.ns);
    let name = binding_secret_name(gcs);
    let foreign = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"bucket": "their-bucket"},
    });
    secrets
        .patch(
            &name,
            &PatchParams::apply("platform-team"),
            &Patch::Apply(&foreign),
        )
        .await?;
    Ok((secrets, name))
}

#[tokio::test]
async fn a_binding_secret_of_somebody_else_is_never_touched_and_ours_is_restored() -> TestResult {
    let f = Fixture::started().await?;
    let (secrets, name) = foreign_binding_secret(&f, "photos").await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    f.wait_reason("photos", "BindingNotOwned").await?;
    let s = secret(&f, "photos")
        .await?
        .expect("their Secret is still there");
    assert_eq!(text(&s, "bucket"), "their-bucket", "not overwritten");
    assert!(s.owner_references().is_empty(), "not adopted");

    // Once they remove it, the binding is written and the resource is Ready.
    secrets.delete(&name, &Default::default()).await?;
    let g = f.wait_ready("photos").await?;
    let bucket = physical(&g);
    let s = secret(&f, "photos").await?.expect("binding secret exists");
    assert_eq!(text(&s, "bucket"), bucket);

    // Our Secret edited out of band: restored at the next resync (2 s here).
    let edit = serde_json::json!({"data": {"bucket": "b3RoZXI="}});
    secrets
        .patch(&name, &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = secret(&f, "photos").await?.expect("binding secret exists");
        if text(&s, "bucket") == bucket {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "binding Secret not restored: bucket is {:?}",
            text(&s, "bucket")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test]
async fn deleting_a_resource_leaves_a_foreign_secret_of_the_binding_name() -> TestResult {
    let f = Fixture::started().await?;
    foreign_binding_secret(&f, "photos").await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    f.wait_reason("photos", "BindingNotOwned").await?;
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    let s = secret(&f, "photos").await?.expect("their Secret survives");
    assert_eq!(text(&s, "bucket"), "their-bucket");
    Ok(())
}
