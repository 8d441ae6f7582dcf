//! The operator on a real API server against the in-memory GCS: each test
//! asserts on both the Kubernetes object and the mock's state.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::time::Duration;

use bucketmap::crd::Gcs;
use bucketmap::naming::{self, Identity, MANAGED_BY_LABEL, OWNER_LABEL};
use bucketmap_testkit::mock_gcs::{Fault, proto};
use common::{Fixture, PROJECT, physical};
use kube::ResourceExt;

type TestResult = anyhow::Result<()>;

fn name_for(g: &Gcs, attempt: u32) -> String {
    let ns = g.namespace().unwrap_or_default();
    let name = g.name_any();
    naming::physical_name(
        &g.spec.bucket_name,
        Identity {
            cluster: &common::test_config(&ns).cluster_id,
            namespace: &ns,
            name: &name,
        },
        attempt,
    )
}

fn buckets_named(f: &Fixture, logical: &str) -> Vec<proto::Bucket> {
    f.gcs
        .buckets()
        .into_iter()
        .filter(|b| b.bucket_id.starts_with(&format!("{logical}-")))
        .collect()
}

#[tokio::test]
async fn create_becomes_ready_with_full_status_and_a_labelled_bucket() -> TestResult {
    let f = Fixture::started().await?;
    let g = f
        .create("photos", serde_json::json!({"bucketName": "photos", "location": "eu", "labels": {"team": "media"}}))
        .await?;
    let g = f.wait_ready(&g.name_any()).await?;
    let st = g.status.clone().unwrap_or_default();
    let physical = st.bucket_full_name.clone().unwrap_or_default();
    assert_eq!(physical, name_for(&g, 0));
    assert!(
        physical.starts_with("photos-") && physical.len() == "photos-".len() + naming::SUFFIX_LEN
    );
    assert_eq!(st.bucket_name.as_deref(), Some("photos"));
    assert_eq!(st.project_id.as_deref(), Some(PROJECT));
    assert_eq!(st.url, Some(format!("gs://{physical}")));
    assert_eq!(st.observed_generation, g.metadata.generation);
    assert!(st.create_time.is_some());
    let ready = g.ready_condition().cloned().expect("Ready condition");
    assert_eq!(ready.reason, "BucketReady");
    assert!(
        ready.message.contains(&physical) && ready.message.contains(PROJECT),
        "{}",
        ready.message
    );
    assert!(
        g.finalizers()
            .iter()
            .any(|f| f == bucketmap::crd::FINALIZER)
    );

    let bucket = f.gcs.bucket(&physical).expect("bucket exists in GCS");
    assert_eq!(f.gcs.bucket_project(&physical).as_deref(), Some(PROJECT));
    assert_eq!(bucket.location, "EU");
    assert_eq!(
        bucket.labels.get(MANAGED_BY_LABEL).map(String::as_str),
        Some("bucketmap")
    );
    let owner = Identity {
        cluster: &f.config.cluster_id,
        namespace: &f.ns,
        name: "photos",
    };
    assert_eq!(bucket.labels.get(OWNER_LABEL), Some(&owner.owner_key()));
    assert_eq!(bucket.labels.get("team").map(String::as_str), Some("media"));
    let iam = bucket.iam_config.clone().unwrap_or_default();
    assert!(iam.uniform_bucket_level_access.is_some_and(|u| u.enabled));
    assert_eq!(iam.public_access_prevention, "enforced");
    assert_eq!(buckets_named(&f, "photos").len(), 1);
    f.wait_event("photos", "Created").await?;
    Ok(())
}

#[tokio::test]
async fn kubectl_apply_wait_and_get_show_the_bucket() -> TestResult {
    let f = Fixture::started().await?;
    let out = f.kubectl_apply(
        "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata: {name: videos}\nspec: {bucketName: videos}\n",
    ).await?;
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = f
        .kubectl(&[
            "wait",
            "-n",
            &f.ns,
            "--for=condition=Ready",
            "gcs/videos",
            "--timeout=60s",
        ])
        .await?;
    assert!(
        out.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = f.kubectl(&["get", "gcsb", "-n", &f.ns]).await?;
    let table = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "LOGICAL", "PHYSICAL", "READY", "REASON", "AGE"],
        "{table}"
    );
    let g = f.get("videos").await?;
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..5],
        [
            "videos",
            "videos",
            physical(&g).as_str(),
            "True",
            "BucketReady"
        ],
        "{table}"
    );
    assert!(f.gcs.bucket(&physical(&g)).is_some());
    Ok(())
}

#[tokio::test]
async fn admission_refuses_bad_names_and_immutable_changes_with_clear_messages() -> TestResult {
    let f = Fixture::new().await?;
    let cases = [
        ("Photos", "may contain only lowercase letters"),
        ("ab", "at least 3 characters"),
        ("-photos", "must start and end with a letter or digit"),
        ("pho.tos", "may contain only lowercase letters"),
        ("goog-photos", "must not start with 'goog'"),
        ("my-g00gle-photos", "must not contain 'google'"),
        (
            "a-very-long-logical-bucket-name-that-leaves-no-room-for-x",
            "at most 54 characters",
        ),
    ];
    for (bad, message) in cases {
        let out = f.kubectl_apply(&format!(
            "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata: {{name: bad}}\nspec: {{bucketName: {bad:?}}}\n"
        )).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} was accepted");
        assert!(
            stderr.contains(message),
            "{bad}: expected {message:?} in {stderr}"
        );
    }
    let bad_label = f.kubectl_apply(
        "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata: {name: bad}\nspec: {bucketName: photos, labels: {bucketmap-owner: x}}\n",
    ).await?;
    assert!(
        String::from_utf8_lossy(&bad_label.stderr).contains("reserved"),
        "{bad_label:?}"
    );

    let ok = f.kubectl_apply(
        "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata: {name: photos}\nspec: {bucketName: photos, projectID: acme-staging, location: EU}\n",
    ).await?;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let changes = [
        (
            "bucketName: other, projectID: acme-staging, location: EU",
            "bucketName is immutable",
        ),
        (
            "bucketName: photos, projectID: acme-prod, location: EU",
            "spec.projectID is immutable",
        ),
        (
            "bucketName: photos, location: EU",
            "spec.projectID is immutable",
        ),
        (
            "bucketName: photos, projectID: acme-staging, location: US",
            "location is immutable",
        ),
    ];
    for (spec, message) in changes {
        let out = f.kubectl_apply(&format!(
            "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata: {{name: photos}}\nspec: {{{spec}}}\n"
        )).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "change {spec} was accepted");
        assert!(
            stderr.contains(message),
            "{spec}: expected {message:?} in {stderr}"
        );
    }
    // Case-only location changes are the same location.
    let same = f.kubectl_apply(
        "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata: {name: photos}\nspec: {bucketName: photos, projectID: acme-staging, location: eu}\n",
    ).await?;
    assert!(
        same.status.success(),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    Ok(())
}

#[tokio::test]
async fn a_foreign_bucket_on_the_name_leads_to_the_next_name_and_is_never_touched() -> TestResult {
    let mut f = Fixture::new().await?;
    let g = f
        .create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let taken = name_for(&g, 0);
    let foreign = proto::Bucket {
        bucket_id: taken.clone(),
        labels: [("owner".to_owned(), "someone-else".to_owned())].into(),
        ..Default::default()
    };
    f.gcs.insert_bucket("other-project", foreign)?;
    f.start_operator().await?;

    let g = f.wait_ready("photos").await?;
    assert_eq!(physical(&g), name_for(&g, 1));
    assert_eq!(g.status.as_ref().and_then(|s| s.name_attempt), Some(1));
    let still_foreign = f.gcs.bucket(&taken).expect("foreign bucket kept");
    assert_eq!(
        still_foreign.labels.get("owner").map(String::as_str),
        Some("someone-else")
    );
    assert!(!still_foreign.labels.contains_key(OWNER_LABEL));
    assert_eq!(
        f.gcs.bucket_project(&taken).as_deref(),
        Some("other-project")
    );
    f.wait_event("photos", "NameConflict").await?;
    Ok(())
}

#[tokio::test]
async fn every_name_taken_ends_in_name_conflict() -> TestResult {
    let mut f = Fixture::new().await?;
    let g = f
        .create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    for attempt in 0..f.config.max_name_attempts {
        let foreign = proto::Bucket {
            bucket_id: name_for(&g, attempt),
            ..Default::default()
        };
        f.gcs.insert_bucket("other-project", foreign)?;
    }
    f.start_operator().await?;
    let g = f.wait_reason("photos", "NameConflict").await?;
    assert!(!g.is_ready());
    assert_eq!(
        f.gcs.buckets().len(),
        f.config.max_name_attempts as usize,
        "no bucket of ours was created"
    );
    Ok(())
}

#[tokio::test]
async fn a_lost_create_response_yields_exactly_one_bucket() -> TestResult {
    let f = Fixture::new().await?;
    f.gcs.add_fault(
        Fault::new("CreateBucket", tonic::Code::Unavailable)
            .times(1)
            .after_write(),
    );
    let mut f = f;
    f.start_operator().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_ready("photos").await?;
    assert_eq!(buckets_named(&f, "photos").len(), 1);
    assert_eq!(
        physical(&g),
        name_for(&g, 0),
        "the lost response must not advance the name"
    );
    assert_eq!(
        f.gcs.call_count("CreateBucket"),
        2,
        "one lost create, one retry answered AlreadyExists"
    );
    Ok(())
}

#[tokio::test]
async fn an_operator_restarted_mid_create_keeps_the_name_and_one_bucket() -> TestResult {
    let mut f = Fixture::new().await?;
    // The first create takes effect but the operator dies before it hears back.
    f.gcs
        .add_fault(Fault::new("CreateBucket", tonic::Code::Unavailable).after_write());
    f.start_operator().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f
        .wait_for("photos", Duration::from_secs(30), "create attempted", |g| {
            !physical(g).is_empty() && f.gcs.call_count("CreateBucket") > 0
        })
        .await?;
    let first_name = physical(&g);
    f.kill_operator().await;
    f.gcs.clear_faults();
    assert_eq!(buckets_named(&f, "photos").len(), 1);

    f.start_operator().await?;
    let g = f.wait_ready("photos").await?;
    assert_eq!(physical(&g), first_name);
    assert_eq!(buckets_named(&f, "photos").len(), 1);
    Ok(())
}

#[tokio::test]
async fn an_operator_restarted_before_create_uses_the_recorded_name() -> TestResult {
    let mut f = Fixture::new().await?;
    f.gcs
        .add_fault(Fault::new("CreateBucket", tonic::Code::Unavailable));
    f.start_operator().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_reason("photos", "GcsError").await?;
    let recorded = physical(&g);
    assert!(
        !recorded.is_empty(),
        "name is recorded before the create call"
    );
    assert!(f.gcs.buckets().is_empty());
    f.kill_operator().await;
    f.gcs.clear_faults();
    f.start_operator().await?;
    let g = f.wait_ready("photos").await?;
    assert_eq!(physical(&g), recorded);
    assert_eq!(f.gcs.buckets().len(), 1);
    Ok(())
}

#[tokio::test]
async fn drift_is_corrected_and_nothing_is_written_when_in_sync() -> TestResult {
    let f = Fixture::started().await?;
    f.create(
        "photos",
        serde_json::json!({"bucketName": "photos", "labels": {"team": "media"}}),
    )
    .await?;
    let g = f.wait_ready("photos").await?;
    let bucket = physical(&g);

    // In sync: several resyncs, reads only.
    f.gcs.reset_calls();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        f.gcs.call_count("GetBucket") >= 1,
        "resync reads the bucket"
    );
    assert_eq!(
        f.gcs.call_count("UpdateBucket"),
        0,
        "no write when nothing differs"
    );
    assert_eq!(f.gcs.call_count("CreateBucket"), 0);

    // Out-of-band changes are put back.
    f.gcs.modify_bucket(&bucket, |b| {
        b.storage_class = "COLDLINE".into();
        b.labels.remove("team");
        b.versioning = Some(proto::bucket::Versioning { enabled: true });
    })?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let b = f.gcs.bucket(&bucket).expect("bucket exists");
        if b.storage_class == "STANDARD"
            && b.labels.contains_key("team")
            && !b.versioning.is_some_and(|v| v.enabled)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "drift not corrected: {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(f.gcs.call_count("UpdateBucket") >= 1);
    f.wait_event("photos", "Updated").await?;

    // A spec change is applied.
    f.merge_spec(
        "photos",
        serde_json::json!({"versioning": true, "storageClass": "NEARLINE"}),
    )
    .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let b = f.gcs.bucket(&bucket).expect("bucket exists");
        if b.storage_class == "NEARLINE" && b.versioning.is_some_and(|v| v.enabled) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "spec change not applied: {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_bucket_deleted_out_of_band_is_recreated_with_the_same_name() -> TestResult {
    let f = Fixture::started().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_ready("photos").await?;
    let bucket = physical(&g);
    f.gcs.remove_bucket(&bucket);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while f.gcs.bucket(&bucket).is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "bucket not recreated"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(physical(&f.get("photos").await?), bucket);
    f.wait_event("photos", "BucketRecreated").await?;
    Ok(())
}

#[tokio::test]
async fn deleting_removes_an_empty_bucket() -> TestResult {
    let f = Fixture::started().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let bucket = physical(&f.wait_ready("photos").await?);
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    assert!(f.gcs.bucket(&bucket).is_none());
    Ok(())
}

#[tokio::test]
async fn deleting_a_non_empty_bucket_is_blocked_until_it_is_emptied() -> TestResult {
    let f = Fixture::started().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let bucket = physical(&f.wait_ready("photos").await?);
    f.gcs.put_object(&bucket, "keep/me.jpg")?;
    f.delete("photos").await?;
    let g = f.wait_reason("photos", "DeletionBlocked").await?;
    let message = g
        .ready_condition()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&bucket) && message.contains("forceDestroy"),
        "{message}"
    );
    assert!(
        f.gcs.bucket(&bucket).is_some(),
        "a non-empty bucket is kept"
    );
    assert_eq!(f.gcs.objects(&bucket).len(), 1, "no object is deleted");
    f.wait_event("photos", "DeletionBlocked").await?;
    // No hot loop: the retries back off.
    let lists_before = f.gcs.call_count("ListObjects");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        f.gcs.call_count("ListObjects") - lists_before <= 2,
        "deletion retried too often"
    );

    f.gcs.clear_objects(&bucket);
    f.wait_gone("photos", Duration::from_secs(90)).await?;
    assert!(f.gcs.bucket(&bucket).is_none());
    Ok(())
}

#[tokio::test]
async fn force_destroy_deletes_every_object_version_then_the_bucket() -> TestResult {
    let f = Fixture::started().await?;
    f.create(
        "photos",
        serde_json::json!({"bucketName": "photos", "versioning": true, "forceDestroy": true}),
    )
    .await?;
    let bucket = physical(&f.wait_ready("photos").await?);
    for i in 0..5 {
        f.gcs.put_object(&bucket, &format!("dir/{i}.jpg"))?;
        f.gcs.put_object(&bucket, &format!("dir/{i}.jpg"))?;
    }
    assert_eq!(
        f.gcs.objects(&bucket).len(),
        10,
        "versioned: two generations each"
    );
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    assert!(f.gcs.bucket(&bucket).is_none());
    f.wait_event("photos", "ObjectsDeleted").await?;
    Ok(())
}

#[tokio::test]
async fn orphan_keeps_the_bucket() -> TestResult {
    let f = Fixture::started().await?;
    f.create(
        "photos",
        serde_json::json!({"bucketName": "photos", "deletionPolicy": "Orphan"}),
    )
    .await?;
    let bucket = physical(&f.wait_ready("photos").await?);
    f.gcs.put_object(&bucket, "a.jpg")?;
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    assert!(f.gcs.bucket(&bucket).is_some());
    assert_eq!(f.gcs.objects(&bucket).len(), 1);
    assert_eq!(f.gcs.call_count("DeleteBucket"), 0);
    Ok(())
}

#[tokio::test]
async fn a_bucket_that_is_not_ours_is_never_deleted() -> TestResult {
    let f = Fixture::started().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let bucket = physical(&f.wait_ready("photos").await?);
    // Somebody replaced the bucket with their own under the same name.
    f.gcs.remove_bucket(&bucket);
    f.gcs.insert_bucket(
        "other-project",
        proto::Bucket {
            bucket_id: bucket.clone(),
            ..Default::default()
        },
    )?;
    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    assert!(
        f.gcs.bucket(&bucket).is_some(),
        "a foreign bucket is never deleted"
    );
    assert_eq!(f.gcs.call_count("DeleteBucket"), 0);
    Ok(())
}

#[tokio::test]
async fn permission_denied_names_project_and_bucket_in_the_condition() -> TestResult {
    let f = Fixture::new().await?;
    f.gcs
        .add_fault(Fault::new("CreateBucket", tonic::Code::PermissionDenied).project(PROJECT));
    let mut f = f;
    f.start_operator().await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_reason("photos", "PermissionDenied").await?;
    let message = g
        .ready_condition()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains(PROJECT), "{message}");
    assert!(message.contains(&physical(&g)), "{message}");
    assert!(f.gcs.buckets().is_empty());
    Ok(())
}

#[tokio::test]
async fn the_namespace_project_annotation_decides_and_pins_the_project() -> TestResult {
    let f = Fixture::started().await?;
    f.annotate_namespace(bucketmap::controller::PROJECT_ANNOTATION, "team-a-project")
        .await?;
    f.create("inherits", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_ready("inherits").await?;
    assert_eq!(
        g.status.as_ref().and_then(|s| s.project_id.as_deref()),
        Some("team-a-project")
    );
    assert_eq!(
        f.gcs.bucket_project(&physical(&g)).as_deref(),
        Some("team-a-project")
    );

    f.create(
        "escapes",
        serde_json::json!({"bucketName": "videos", "projectID": "team-b-project"}),
    )
    .await?;
    let g = f.wait_reason("escapes", "ProjectNotAllowed").await?;
    let message = g
        .ready_condition()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("team-b-project") && message.contains("team-a-project"),
        "{message}"
    );
    assert!(
        buckets_named(&f, "videos").is_empty(),
        "no bucket in a project the namespace may not use"
    );

    f.create(
        "same",
        serde_json::json!({"bucketName": "docs", "projectID": "team-a-project"}),
    )
    .await?;
    f.wait_ready("same").await?;
    Ok(())
}

#[tokio::test]
async fn a_hundred_creates_converge_under_the_per_project_quota() -> TestResult {
    let mut f = Fixture::new().await?;
    let interval = Duration::from_millis(100);
    f.gcs.set_bucket_rate_limit(Some(interval));
    f.config.bucket_ops_interval = Some(interval);
    f.config.resync = Duration::from_secs(600);
    f.start_operator().await?;
    let names: Vec<String> = (0..100).map(|i| format!("b{i:03}")).collect();
    for name in &names {
        f.create(name, serde_json::json!({"bucketName": name}))
            .await?;
    }
    // Paced, the creates take `interval` each; the deadline only ends a run
    // that does not converge, so it is generous by more than an order of
    // magnitude over the whole paced burst.
    let converge = interval * 100 * 30;
    for name in &names {
        f.wait_for(name, converge, "Ready", Gcs::is_ready).await?;
    }
    assert_eq!(f.gcs.buckets().len(), 100);
    assert_eq!(
        f.gcs.quota_errors(),
        0,
        "pacing keeps every create under the quota"
    );
    Ok(())
}

#[tokio::test]
async fn without_pacing_the_same_burst_hits_the_quota() -> TestResult {
    // The control for the test above: proves the mock's quota bites.
    let mut f = Fixture::new().await?;
    f.gcs
        .set_bucket_rate_limit(Some(Duration::from_millis(100)));
    f.config.bucket_ops_interval = None;
    f.start_operator().await?;
    for i in 0..20 {
        f.create(
            &format!("b{i:02}"),
            serde_json::json!({"bucketName": format!("b{i:02}")}),
        )
        .await?;
    }
    for i in 0..20 {
        f.wait_for(
            &format!("b{i:02}"),
            Duration::from_secs(120),
            "Ready",
            Gcs::is_ready,
        )
        .await?;
    }
    assert!(f.gcs.quota_errors() > 0);
    Ok(())
}
