//! Buckets outlive clusters (docs/RECOVERY.md), on a real API server against
//! the in-memory GCS: a Gcs re-created without its status, or restored with
//! it, or applied to a new cluster of the same identity, finds its bucket and
//! its data again; clusters of different identities never touch each other's
//! buckets; an existing bucket is adopted on request, and only when it is
//! nobody else's; an abandoned bucket is kept without bucketmap's labels.

// Scenarios read top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bucketmap::crd::Gcs;
use bucketmap::naming::{
    self, CLUSTER_LABEL, Identity, MANAGED_BY_LABEL, NAME_LABEL, NAMESPACE_LABEL, OWNER_LABEL,
};
use bucketmap_testkit::mock_gcs::proto;
use common::{Fixture, PROJECT, physical};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

type TestResult = anyhow::Result<()>;

fn photos() -> serde_json::Value {
    serde_json::json!({"bucketName": "photos", "labels": {"team": "media"}})
}

/// The ownership labels of Gcs `name` in the fixture's namespace under
/// cluster identity `cluster`.
fn owner_labels(f: &Fixture, cluster: &str, name: &str) -> BTreeMap<String, String> {
    Identity {
        cluster,
        namespace: &f.ns,
        name,
    }
    .labels()
}

fn labels_of(bucket: &proto::Bucket) -> BTreeMap<String, String> {
    bucket
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Buckets in the mock, by id.
fn bucket_ids(f: &Fixture) -> Vec<String> {
    f.gcs.buckets().into_iter().map(|b| b.bucket_id).collect()
}

/// Deletes the Gcs as a lost cluster does: no finalizer runs, the bucket
/// and the status are simply gone from Kubernetes.
async fn vanish(f: &Fixture, name: &str) -> TestResult {
    let api = f.api();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    api.delete(name, &DeleteParams::default()).await?;
    f.wait_gone(name, Duration::from_secs(10)).await?;
    // The garbage collector (not part of this control plane) takes the
    // binding Secret the Gcs owned with it.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(f.client.clone(), &f.ns);
    secrets
        .delete(&format!("{name}-gcs-binding"), &DeleteParams::default())
        .await?;
    Ok(())
}

fn condition_message(g: &Gcs, type_: &str) -> String {
    g.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_gcs_recreated_without_its_status_finds_its_bucket_and_data() -> TestResult {
    let mut f = Fixture::new().await?;
    f.config.cluster_id = "prod-eu".into();
    f.start_operator().await?;
    let first = f
        .wait_ready(&f.create("photos", photos()).await?.name_any())
        .await?;
    let bucket = physical(&first);
    let expected = naming::physical_name(
        "photos",
        Identity {
            cluster: "prod-eu",
            namespace: &f.ns,
            name: "photos",
        },
        0,
    );
    assert_eq!(bucket, expected, "the name depends on no uid");
    let labels = labels_of(&f.gcs.bucket(&bucket).expect("bucket"));
    for (key, value) in owner_labels(&f, "prod-eu", "photos") {
        assert_eq!(labels.get(&key), Some(&value), "{key} in {labels:?}");
    }
    assert_eq!(labels[CLUSTER_LABEL], "prod-eu");
    f.gcs.put_object(&bucket, "holiday.jpg")?;

    // The cluster goes away; the same manifest is applied again.
    f.kill_operator().await;
    vanish(&f, "photos").await?;
    let before = bucket_ids(&f);
    f.start_operator().await?;
    let again = f.create("photos", photos()).await?;
    assert_ne!(again.uid(), first.uid(), "a new object");
    assert!(again.status.is_none(), "no status came back");
    let again = f.wait_ready("photos").await?;
    assert_eq!(physical(&again), bucket, "the same bucket");
    assert_eq!(bucket_ids(&f), before, "no new bucket");
    assert_eq!(f.gcs.objects(&bucket).len(), 1, "the data is there");
    assert_eq!(f.bucket_map().await?.get("photos"), Some(&bucket));
    f.wait_event("photos", "FoundExisting").await?;
    f.assert_every_bucket_owned(&[])?;
    Ok(())
}

#[tokio::test]
async fn a_new_cluster_of_the_same_identity_finds_the_bucket_with_or_without_status() -> TestResult
{
    let mut old = Fixture::new().await?;
    old.config.cluster_id = "prod-eu".into();
    old.start_operator().await?;
    old.create("photos", photos()).await?;
    old.create("videos", serde_json::json!({"bucketName": "videos"}))
        .await?;
    let photos_then = old.wait_ready("photos").await?;
    let videos_then = old.wait_ready("videos").await?;
    let (photos_bucket, videos_bucket) = (physical(&photos_then), physical(&videos_then));
    old.gcs.put_object(&photos_bucket, "a.jpg")?;
    old.gcs.put_object(&videos_bucket, "b.mp4")?;
    // The old cluster is gone for good (no cleanup ran).
    old.kill_operator().await;

    let mut new = old.another_cluster().await?;
    assert_eq!(new.config.cluster_id, "prod-eu");
    // GitOps re-apply: spec only. Velero restore: spec and status.
    new.create("photos", photos()).await?;
    new.create("videos", serde_json::json!({"bucketName": "videos"}))
        .await?;
    let status = serde_json::to_value(videos_then.status.clone().expect("status"))?;
    new.api()
        .patch_status(
            "videos",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": status})),
        )
        .await?;
    let before = bucket_ids(&new);
    new.gcs.reset_calls();
    new.start_operator().await?;
    let photos_now = new.wait_ready("photos").await?;
    let videos_now = new.wait_ready("videos").await?;
    assert_eq!(physical(&photos_now), photos_bucket);
    assert_eq!(physical(&videos_now), videos_bucket);
    assert_eq!(bucket_ids(&new), before, "no new bucket");
    assert_eq!(new.gcs.objects(&photos_bucket).len(), 1);
    assert_eq!(new.gcs.objects(&videos_bucket).len(), 1);
    let creates_of = |bucket: &str| {
        new.gcs
            .calls()
            .iter()
            .filter(|c| c.method == "CreateBucket" && c.bucket.as_deref() == Some(bucket))
            .count()
    };
    assert_eq!(
        creates_of(&videos_bucket),
        0,
        "a restored status names the bucket: no create is even tried"
    );
    let map = new.bucket_map().await?;
    assert_eq!(map.get("photos"), Some(&photos_bucket));
    assert_eq!(map.get("videos"), Some(&videos_bucket));
    new.assert_every_bucket_owned(&[])?;
    Ok(())
}

#[tokio::test]
async fn clusters_of_different_identities_never_touch_each_others_buckets() -> TestResult {
    let mut blue = Fixture::new().await?;
    blue.config.cluster_id = "blue".into();
    let mut green = blue.another_cluster().await?;
    green.config.cluster_id = "green".into();
    // A bucket of blue's holds green's first candidate name (a collision):
    // green must move on to its next name and leave it alone.
    let green_first = naming::physical_name(
        "photos",
        Identity {
            cluster: "green",
            namespace: &green.ns,
            name: "photos",
        },
        0,
    );
    let blues_other = green.gcs.insert_bucket(
        PROJECT,
        proto::Bucket {
            bucket_id: green_first.clone(),
            labels: owner_labels(&blue, "blue", "other").into_iter().collect(),
            ..Default::default()
        },
    )?;
    blue.start_operator().await?;
    green.start_operator().await?;
    blue.create("photos", photos()).await?;
    green.create("photos", photos()).await?;
    let blue_bucket = physical(&blue.wait_ready("photos").await?);
    let green_bucket = physical(&green.wait_ready("photos").await?);
    assert_ne!(blue_bucket, green_bucket, "two buckets");
    assert_ne!(green_bucket, green_first, "the taken name was skipped");
    let blue_labels = labels_of(&blue.gcs.bucket(&blue_bucket).expect("blue's bucket"));
    let green_labels = labels_of(&green.gcs.bucket(&green_bucket).expect("green's bucket"));
    assert_eq!(blue_labels[CLUSTER_LABEL], "blue");
    assert_eq!(green_labels[CLUSTER_LABEL], "green");
    assert_ne!(blue_labels[OWNER_LABEL], green_labels[OWNER_LABEL]);
    blue.gcs.put_object(&blue_bucket, "blue.jpg")?;

    // Green's resource goes (deletionPolicy Delete): only its bucket goes.
    let blue_meta = blue
        .gcs
        .bucket(&blue_bucket)
        .expect("blue's")
        .metageneration;
    green.delete("photos").await?;
    green.wait_gone("photos", Duration::from_secs(30)).await?;
    assert!(green.gcs.bucket(&green_bucket).is_none(), "green's deleted");
    let still = blue.gcs.bucket(&blue_bucket).expect("blue's bucket stays");
    assert_eq!(still.metageneration, blue_meta, "blue's bucket untouched");
    assert_eq!(blue.gcs.objects(&blue_bucket).len(), 1);
    let other = green
        .gcs
        .bucket(&green_first)
        .expect("the colliding bucket stays");
    assert_eq!(other.metageneration, blues_other.metageneration);
    assert_eq!(labels_of(&other), labels_of(&blues_other));
    green.assert_every_bucket_owned(&[])?;
    Ok(())
}

#[tokio::test]
async fn a_bucket_labelled_with_a_uid_and_named_in_status_is_migrated() -> TestResult {
    let f = Fixture::new().await?;
    let g = f.create("photos", photos()).await?;
    let uid = g.uid().expect("uid");
    let legacy = "photos-l3g4cy00";
    f.gcs.insert_bucket(
        PROJECT,
        proto::Bucket {
            bucket_id: legacy.to_owned(),
            labels: [
                (MANAGED_BY_LABEL.to_owned(), "bucketmap".to_owned()),
                (OWNER_LABEL.to_owned(), naming::legacy_owner_id(&uid)),
                ("team".to_owned(), "media".to_owned()),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        },
    )?;
    f.gcs.put_object(legacy, "old.jpg")?;
    f.api()
        .patch_status(
            "photos",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {
                "bucketFullName": legacy, "bucketName": "photos", "projectID": PROJECT,
                "nameAttempt": 0, "createTime": "2026-01-01T00:00:00Z",
            }})),
        )
        .await?;
    let mut f = f;
    f.start_operator().await?;
    let g = f.wait_ready("photos").await?;
    assert_eq!(physical(&g), legacy, "it keeps working under its name");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let labels = labels_of(&f.gcs.bucket(legacy).expect("bucket"));
        if labels.get(OWNER_LABEL) != Some(&naming::legacy_owner_id(&uid)) {
            let mut expected = owner_labels(&f, &f.config.cluster_id, "photos");
            expected.insert("team".into(), "media".into());
            assert_eq!(labels, expected);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "labels not migrated: {labels:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    f.wait_event("photos", "OwnershipMigrated").await?;
    assert_eq!(f.gcs.objects(legacy).len(), 1);
    f.assert_every_bucket_owned(&[])?;
    Ok(())
}

#[tokio::test]
async fn an_unowned_bucket_is_adopted_and_every_changed_setting_reported() -> TestResult {
    let f = Fixture::started().await?;
    let existing = "terraform-photos-1";
    f.gcs.insert_bucket(
        PROJECT,
        proto::Bucket {
            bucket_id: existing.to_owned(),
            storage_class: "NEARLINE".into(),
            versioning: Some(proto::bucket::Versioning { enabled: true }),
            labels: [("temp".to_owned(), "x".to_owned())].into_iter().collect(),
            ..Default::default()
        },
    )?;
    f.gcs.put_object(existing, "kept.jpg")?;
    let before = bucket_ids(&f);
    f.create(
        "photos",
        serde_json::json!({"bucketName": "photos", "labels": {"team": "media"},
            "adopt": {"bucket": existing}}),
    )
    .await?;
    let g = f.wait_ready("photos").await?;
    assert_eq!(physical(&g), existing);
    assert_eq!(bucket_ids(&f), before, "adoption creates no bucket");
    let b = f.gcs.bucket(existing).expect("bucket");
    assert_eq!(b.storage_class, "STANDARD");
    assert!(!b.versioning.is_some_and(|v| v.enabled));
    let mut expected = owner_labels(&f, &f.config.cluster_id, "photos");
    expected.insert("team".into(), "media".into());
    assert_eq!(labels_of(&b), expected, "temp removed, ours added");
    let adopted = condition_message(&g, "Adopted");
    for change in [
        "storageClass: NEARLINE → STANDARD",
        "versioning: on → off",
        "+team=media",
        "-temp",
        existing,
    ] {
        assert!(adopted.contains(change), "{change} in {adopted}");
    }
    f.wait_event("photos", "Adopted").await?;
    assert_eq!(
        f.bucket_map().await?.get("photos"),
        Some(&existing.to_owned())
    );

    // The adopted bucket stays adopted: spec.adopt cannot change.
    let changed = f
        .merge_spec(
            "photos",
            serde_json::json!({"adopt": {"bucket": "another-one"}}),
        )
        .await;
    let message = format!("{:#}", changed.expect_err("spec.adopt changed"));
    assert!(message.contains("spec.adopt is immutable"), "{message}");

    // An adopted bucket is kept by default (Orphan), with its labels.
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    let kept = f.gcs.bucket(existing).expect("an adopted bucket is kept");
    assert_eq!(labels_of(&kept), expected);
    assert_eq!(f.gcs.objects(existing).len(), 1);
    assert_eq!(f.gcs.call_count("DeleteBucket"), 0);
    f.assert_every_bucket_owned(&[])?;
    Ok(())
}

#[tokio::test]
async fn adopting_another_owners_bucket_or_another_projects_is_refused() -> TestResult {
    let f = Fixture::started().await?;
    let foreign = "their-photos-1";
    let theirs = f.gcs.insert_bucket(
        PROJECT,
        proto::Bucket {
            bucket_id: foreign.to_owned(),
            labels: owner_labels(&f, "prod-us", "photos").into_iter().collect(),
            storage_class: "COLDLINE".into(),
            ..Default::default()
        },
    )?;
    f.create(
        "photos",
        serde_json::json!({"bucketName": "photos", "adopt": {"bucket": foreign}}),
    )
    .await?;
    let g = f.wait_reason("photos", "AdoptionRefused").await?;
    let message = g.ready_condition().expect("Ready").message.clone();
    assert!(
        message.contains(foreign) && message.contains("prod-us"),
        "the refusal names the owner: {message}"
    );
    f.wait_event("photos", "AdoptionRefused").await?;

    let elsewhere = "other-project-photos";
    f.gcs.insert_bucket(
        "other-project",
        proto::Bucket {
            bucket_id: elsewhere.to_owned(),
            ..Default::default()
        },
    )?;
    f.create(
        "videos",
        serde_json::json!({"bucketName": "videos", "adopt": {"bucket": elsewhere}}),
    )
    .await?;
    let g = f.wait_reason("videos", "AdoptionRefused").await?;
    let message = g.ready_condition().expect("Ready").message.clone();
    assert!(message.contains("not in project test-project"), "{message}");

    // Resyncs change nothing, and deleting the resources leaves both alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    f.delete("photos").await?;
    f.delete("videos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    f.wait_gone("videos", Duration::from_secs(30)).await?;
    let after = f.gcs.bucket(foreign).expect("theirs stays");
    assert_eq!(after.metageneration, theirs.metageneration);
    assert_eq!(labels_of(&after), labels_of(&theirs));
    assert!(f.gcs.bucket(elsewhere).is_some());
    assert!(labels_of(&f.gcs.bucket(elsewhere).expect("kept")).is_empty());
    assert_eq!(f.gcs.call_count("UpdateBucket"), 0);
    assert_eq!(f.gcs.call_count("DeleteBucket"), 0);
    // Theirs keeps its owner; the other project's stays nobody's.
    f.assert_every_bucket_owned(&[elsewhere])?;
    Ok(())
}

#[tokio::test]
async fn abandon_keeps_the_bucket_without_our_labels_for_another_to_adopt() -> TestResult {
    let f = Fixture::started().await?;
    f.create(
        "photos",
        serde_json::json!({"bucketName": "photos", "labels": {"team": "media"},
            "deletionPolicy": "Abandon"}),
    )
    .await?;
    let bucket = physical(&f.wait_ready("photos").await?);
    f.gcs.put_object(&bucket, "keep.jpg")?;
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    let kept = f.gcs.bucket(&bucket).expect("an abandoned bucket is kept");
    assert_eq!(
        labels_of(&kept),
        [("team".to_owned(), "media".to_owned())]
            .into_iter()
            .collect(),
        "only the user's labels remain"
    );
    for key in [OWNER_LABEL, CLUSTER_LABEL, NAMESPACE_LABEL, NAME_LABEL] {
        assert!(!kept.labels.contains_key(key), "{key}");
    }
    assert_eq!(f.gcs.objects(&bucket).len(), 1);
    f.wait_event("photos", "Abandoned").await?;

    // Nobody's now: another Gcs may adopt it.
    f.create(
        "album",
        serde_json::json!({"bucketName": "album", "adopt": {"bucket": bucket}}),
    )
    .await?;
    let g = f.wait_ready("album").await?;
    assert_eq!(physical(&g), bucket);
    let relabelled = labels_of(&f.gcs.bucket(&bucket).expect("bucket"));
    assert_eq!(relabelled[NAME_LABEL], "album");
    f.assert_every_bucket_owned(&[])?;
    Ok(())
}

#[tokio::test]
async fn without_a_given_identity_replicas_share_one_stored_in_the_cluster() -> TestResult {
    let f = Fixture::new().await?;
    let (a, b) = tokio::join!(
        bucketmap::cluster_id::resolve(&f.client, None, &f.ns),
        bucketmap::cluster_id::resolve(&f.client, None, &f.ns),
    );
    let ((a, _), (b, _)) = (a?, b?);
    assert_eq!(a, b, "two replicas starting together agree");
    assert_eq!(naming::validate_cluster_id(&a), Ok(a.clone()));
    let (later, source) = bucketmap::cluster_id::resolve(&f.client, None, &f.ns).await?;
    assert_eq!(later, a);
    assert_eq!(source, bucketmap::cluster_id::Source::Stored);
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(f.client.clone(), &f.ns);
    let cm = cms.get(bucketmap::cluster_id::CONFIGMAP).await?;
    assert_eq!(
        cm.data.unwrap_or_default().get(bucketmap::cluster_id::KEY),
        Some(&a)
    );
    let (given, source) = bucketmap::cluster_id::resolve(&f.client, Some("prod-eu"), &f.ns).await?;
    assert_eq!(
        (given.as_str(), source),
        ("prod-eu", bucketmap::cluster_id::Source::Given)
    );

    // A cluster id that is no label value stops the operator at start-up.
    let out = f
        .operator_command()
        .args(["--cluster-id", "Prod.EU"])
        .stderr(std::process::Stdio::piped())
        .output()
        .await?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Prod.EU") && stderr.contains("starting with a letter"),
        "{stderr}"
    );
    Ok(())
}
