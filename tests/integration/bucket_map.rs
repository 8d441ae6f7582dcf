//! The bucket map at scale and at its edges, on a real API server: one
//! writer per namespace (bursts coalesce), keys of other writers never
//! taken, the size ceiling, and the take-over of an earlier version's
//! per-resource field managers.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bucketmap::FIELD_MANAGER;
use bucketmap::bucket_map::{DEFAULT_MAX_MAP_BYTES, entry_cost};
use common::{Fixture, physical, uid};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};

type TestResult = anyhow::Result<()>;

async fn apply_map(
    f: &Fixture,
    manager: &str,
    data: &BTreeMap<String, String>,
) -> Result<ConfigMap, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(f.client.clone(), &f.ns);
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "bucketmap"},
        "data": data,
    });
    api.patch(
        "bucketmap",
        &PatchParams::apply(manager),
        &Patch::Apply(&cm),
    )
    .await
}

#[tokio::test]
async fn a_burst_of_resources_is_published_in_far_fewer_writes_than_resources() -> TestResult {
    let f = Fixture::started().await?;
    let n = 60;
    let names: Vec<String> = (0..n).map(|i| format!("burst-{i:02}")).collect();
    futures::future::try_join_all(
        names
            .iter()
            .map(|name| f.create(name, serde_json::json!({"bucketName": name}))),
    )
    .await?;
    let mut expected = BTreeMap::new();
    for name in &names {
        let g = f.wait_ready(name).await?;
        expected.insert(name.clone(), physical(&g));
    }
    // Ready means the map has the entry: no waiting needed.
    assert_eq!(f.bucket_map().await?, expected);
    let writes = f.metrics.map_writes("written");
    assert!(
        writes * 2 <= n as u64,
        "{writes} map writes for {n} resources: bursts are not coalesced"
    );
    assert_eq!(f.metrics.map_writes("error"), 0);
    Ok(())
}

#[tokio::test]
async fn a_key_another_writer_owns_is_never_taken() -> TestResult {
    let f = Fixture::started().await?;
    let theirs = BTreeMap::from([("photos".to_owned(), "their-photos-1".to_owned())]);
    apply_map(&f, "platform-team", &theirs).await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let refused = f.wait_reason("photos", "MappingConflict").await?;
    let message = refused
        .ready_condition()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains("platform-team"), "{message}");
    // The map is not stuck: another resource is published next to the foreign key.
    f.create("logs", serde_json::json!({"bucketName": "logs"}))
        .await?;
    let logs = f.wait_ready("logs").await?;
    let m = f.bucket_map().await?;
    assert_eq!(m.get("photos").map(String::as_str), Some("their-photos-1"));
    assert_eq!(m.get("logs"), Some(&physical(&logs)));
    Ok(())
}

#[tokio::test]
async fn a_full_map_refuses_the_youngest_and_admits_them_when_room_frees() -> TestResult {
    let mut f = Fixture::new().await?;
    // Room for exactly three entries of these names ("bkt-N" → "bkt-N-xxxxxxxx").
    f.config.map_max_bytes = 3 * entry_cost("bkt-1", "bkt-1-abcdefgh");
    f.start_operator().await?;
    for i in 1..=5 {
        let name = format!("bkt-{i}");
        f.create(&name, serde_json::json!({"bucketName": name}))
            .await?;
    }
    for i in 1..=3 {
        f.wait_ready(&format!("bkt-{i}")).await?;
    }
    for i in 4..=5 {
        let g = f.wait_reason(&format!("bkt-{i}"), "MapFull").await?;
        assert!(!g.is_ready());
    }
    assert_eq!(f.bucket_map().await?.len(), 3);

    // An entry leaves: the oldest refused resource is woken and fits.
    f.delete("bkt-1").await?;
    f.wait_gone("bkt-1", Duration::from_secs(30)).await?;
    let bkt4 = f.wait_ready("bkt-4").await?;
    let m = f.bucket_map().await?;
    assert_eq!(m.get("bkt-4"), Some(&physical(&bkt4)));
    assert!(!m.contains_key("bkt-1") && !m.contains_key("bkt-5"));
    assert_eq!(
        f.get("bkt-5")
            .await?
            .ready_condition()
            .map(|c| c.reason.clone()),
        Some("MapFull".to_owned())
    );
    Ok(())
}

/// The largest maps the default budget admits, with the longest and the
/// shortest names bucketmap allows, written as the operator writes them.
#[tokio::test]
async fn the_api_server_accepts_the_largest_maps_the_budget_admits() -> TestResult {
    let f = Fixture::new().await?;
    for (logical_len, physical_len) in [(54, 63), (3, 12)] {
        let cost = entry_cost(&"a".repeat(logical_len), &"b".repeat(physical_len));
        let count = DEFAULT_MAX_MAP_BYTES / cost;
        let data: BTreeMap<String, String> = (0..count)
            .map(|i| {
                let key = format!("{i:0>width$}", width = logical_len);
                let value = format!("{i:0>width$}", width = physical_len);
                (key, value)
            })
            .collect();
        assert_eq!(data.len(), count, "distinct keys");
        let written = apply_map(&f, FIELD_MANAGER, &data).await;
        assert!(
            written.is_ok(),
            "{count} entries of {logical_len}+{physical_len} characters refused: {written:?}"
        );
    }
    Ok(())
}

/// The limit the budget stays under: the API server refuses a ConfigMap
/// whose values add up to more than 1 MiB (keys are not counted there; the
/// budget counts them anyway, for etcd's limit on the whole object).
#[tokio::test]
async fn the_api_server_refuses_a_map_whose_values_exceed_one_mib() -> TestResult {
    let f = Fixture::new().await?;
    let fill = |values: usize| {
        BTreeMap::from([
            ("a".to_owned(), "v".repeat(values / 2)),
            ("b".to_owned(), "v".repeat(values - values / 2)),
        ])
    };
    apply_map(&f, "edge-test", &fill(1024 * 1024)).await?;
    let over = apply_map(&f, "edge-test", &fill(1024 * 1024 + 1)).await;
    let code = match &over {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(e) => anyhow::bail!("unexpected error: {e}"),
    };
    assert_eq!(code, Some(422), "1 MiB + 1 byte of values must be refused");
    Ok(())
}

/// Earlier versions gave every resource its own field manager; the writer
/// takes those over, so deleting a resource still removes its key.
#[tokio::test]
async fn entries_of_an_earlier_version_are_taken_over_and_removed() -> TestResult {
    let f = Fixture::started().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_ready("photos").await?;
    let entry = BTreeMap::from([("photos".to_owned(), physical(&g))]);
    apply_map(&f, &format!("bucketmap-map-{}", uid(&g)), &entry).await?;
    // Another resource makes the writer write the map again.
    f.create("logs", serde_json::json!({"bucketName": "logs"}))
        .await?;
    f.wait_ready("logs").await?;
    let api: Api<ConfigMap> = Api::namespaced(f.client.clone(), &f.ns);
    let managers: Vec<String> = api
        .get("bucketmap")
        .await?
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        !managers.iter().any(|m| m.starts_with("bucketmap-map-")),
        "per-resource managers remain: {managers:?}"
    );
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    assert!(!f.bucket_map().await?.contains_key("photos"));
    Ok(())
}

#[tokio::test]
async fn an_entry_the_writer_does_not_know_is_removed_with_its_resource() -> TestResult {
    // A replica that takes over knows an entry only from a resource whose
    // status records its bucket; one whose status write was lost (or whose
    // map write's answer was) left an entry it must still remove.
    let mut f = Fixture::started().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    f.wait_ready("photos").await?;
    assert!(f.bucket_map().await?.contains_key("photos"));
    f.kill_operator().await;
    f.api()
        .patch_status(
            "photos",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"bucketFullName": null}})),
        )
        .await?;
    f.delete("photos").await?;
    f.start_operator().await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    let m = f.bucket_map().await?;
    assert!(
        !m.contains_key("photos"),
        "the entry outlived its resource: {m:?}"
    );
    Ok(())
}

#[tokio::test]
async fn with_one_map_writer_for_all_namespaces_every_namespace_gets_its_entries() -> TestResult {
    use bucketmap::crd::Gcs;
    use kube::api::PostParams;
    let mut f = Fixture::new().await?;
    f.config.namespace = None;
    f.config.map_writers = 1;
    f.start_operator().await?;
    let mut namespaces = Vec::new();
    for _ in 0..6 {
        namespaces.push(bucketmap_testkit::testenv::create_namespace(&f.client, "writers").await?);
    }
    let per_namespace = 5;
    let creates = namespaces.iter().flat_map(|ns| {
        let api: Api<Gcs> = Api::namespaced(f.client.clone(), ns);
        (0..per_namespace).map(move |i| {
            let api = api.clone();
            async move {
                let obj: Gcs = serde_json::from_value(serde_json::json!({
                    "apiVersion": "storage.bucketmap.dev/v1alpha1",
                    "kind": "Gcs",
                    "metadata": {"name": format!("g{i}")},
                    "spec": {"bucketName": format!("logical-{i}")},
                }))?;
                api.create(&PostParams::default(), &obj).await?;
                anyhow::Ok(())
            }
        })
    });
    futures::future::try_join_all(creates).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for ns in &namespaces {
        let api: Api<Gcs> = Api::namespaced(f.client.clone(), ns);
        let expected = loop {
            let all = api.list(&Default::default()).await?.items;
            if all.len() == per_namespace && all.iter().all(Gcs::is_ready) {
                break all
                    .iter()
                    .map(|g| (g.spec.bucket_name.clone(), physical(g)))
                    .collect::<BTreeMap<_, _>>();
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{ns}: not all Ready"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let maps: Api<ConfigMap> = Api::namespaced(f.client.clone(), ns);
        let data = maps.get("bucketmap").await?.data.unwrap_or_default();
        assert_eq!(data, expected, "{ns}: Ready means the map has the entry");
    }
    let writes = f.metrics.map_writes("written");
    assert!(
        writes <= (namespaces.len() * per_namespace / 2) as u64,
        "{writes} map writes for {} resources",
        namespaces.len() * per_namespace
    );
    Ok(())
}
