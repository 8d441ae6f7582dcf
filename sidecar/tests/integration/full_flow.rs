//! The whole product on one machine: the operator (real API server, the
//! in-memory GCS as the control plane) turns `Gcs` resources in two
//! namespaces into buckets and publishes each namespace's bucket map; each
//! namespace's sidecar reads its map from files laid out as the kubelet
//! mounts the ConfigMap; a real client library using the logical name writes
//! through it; the object lands in that namespace's physical bucket
//! (fake-gcs-server as the data plane), and neither app can reach the other
//! namespace's bucket.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bucketmap::controller::{self, OperatorConfig};
use bucketmap::crd::Gcs;
use bucketmap::gcs::{GcsClient, GcsConfig};
use bucketmap::metrics::Metrics;
use bucketmap_testkit::mock_gcs::MockGcs;
use bucketmap_testkit::testenv::{self, TestEnv};
use common::http::Request;
use common::mapping_dir::MappingDir;
use common::procs::{FakeGcs, Sidecar, clients, run_with_timeout};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::CustomResourceExt as _;
use kube::api::{Api, PostParams};

/// Waits until the namespace's bucket map has an entry for `logical`.
async fn published(client: &kube::Client, ns: &str, logical: &str) -> Result<String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let data: BTreeMap<String, String> = api
            .get_opt("bucketmap")
            .await?
            .and_then(|c| c.data)
            .unwrap_or_default();
        if let Some(physical) = data.get(logical) {
            return Ok(physical.clone());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{logical} never published in {ns}: {data:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Uploads `name` to the logical bucket `photos` through the sidecar with
/// the Python client, and returns the names it then lists there.
fn python_upload_and_list(
    python: &Path,
    sidecar: &Sidecar,
    name: &str,
    content: &str,
) -> Result<Vec<String>> {
    let script = format!(
        "from google.cloud import storage\n\
         c = storage.Client(project='flow')\n\
         c.bucket('photos').blob({name:?}).upload_from_string({content:?})\n\
         print('\\n'.join(b.name for b in c.list_blobs('photos')))\n"
    );
    let out = run_with_timeout(
        std::process::Command::new(python)
            .args(["-c", &script])
            .env("STORAGE_EMULATOR_HOST", sidecar.url()),
        Duration::from_secs(60),
    )?;
    anyhow::ensure!(
        out.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?
        .lines()
        .map(str::to_owned)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_namespaces_with_the_same_logical_name_reach_their_own_buckets_only() -> Result<()> {
    let python = clients()?
        .get("python")
        .cloned()
        .context("python client not installed")?;
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    bucketmap_testkit::testenv::install_crd(&client, &bucketmap::crd::Gcs::crd()).await?;
    let mock = MockGcs::start().await?;
    let metrics = Arc::new(Metrics::default());
    let gcs = GcsClient::connect(
        &GcsConfig {
            endpoint: Some(mock.endpoint()),
            anonymous: true,
        },
        metrics.clone(),
    )
    .await?;
    let config = OperatorConfig {
        default_project: Some("flow-project".into()),
        bucket_ops_interval: None,
        ..OperatorConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(controller::run(
        client.clone(),
        gcs,
        metrics,
        config,
        || {},
        async {
            let _ = stopped.await;
        },
    ));

    let mut physical = Vec::new();
    for team in ["team-a", "team-b"] {
        let ns = testenv::create_namespace(&client, team).await?;
        let gcs: Gcs = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1", "kind": "Gcs",
            "metadata": {"name": "photos"}, "spec": {"bucketName": "photos"},
        }))?;
        Api::<Gcs>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &gcs)
            .await?;
        physical.push(published(&client, &ns, "photos").await?);
    }
    let (bucket_a, bucket_b) = (physical[0].clone(), physical[1].clone());
    assert_ne!(bucket_a, bucket_b, "one logical name, two physical buckets");
    for b in &physical {
        assert!(
            mock.handle().bucket(b).is_some(),
            "the operator created {b}"
        );
    }

    // The data plane holds the buckets the operator created.
    let dir = tempfile::tempdir()?;
    let fake = FakeGcs::start(dir.path(), &[&bucket_a, &bucket_b])?;
    // The kubelet mounts each namespace's ConfigMap into its pods.
    let _map_a = MappingDir::new(dir.path().join("map-a"), &[("photos", &bucket_a)])?;
    let _map_b = MappingDir::new(dir.path().join("map-b"), &[("photos", &bucket_b)])?;
    let sidecar = |map: &str| {
        let dir_arg = dir.path().join(map).to_string_lossy().into_owned();
        Sidecar::start(
            dir.path(),
            &fake.url(),
            &["--mapping-dir".to_owned(), dir_arg],
        )
    };
    let (sidecar_a, sidecar_b) = (sidecar("map-a")?, sidecar("map-b")?);

    let seen_a = python_upload_and_list(&python, &sidecar_a, "from-a.txt", "written by team a")?;
    let seen_b = python_upload_and_list(&python, &sidecar_b, "from-b.txt", "written by team b")?;
    assert_eq!(seen_a, ["from-a.txt"], "team a sees only its own bucket");
    assert_eq!(seen_b, ["from-b.txt"], "team b sees only its own bucket");
    assert_eq!(fake.content(&bucket_a, "from-a.txt")?, b"written by team a");
    assert_eq!(fake.content(&bucket_b, "from-b.txt")?, b"written by team b");
    assert_eq!(fake.objects(&bucket_a)?.len(), 1);
    assert_eq!(fake.objects(&bucket_b)?.len(), 1);

    // Neither app can name the other's bucket.
    let escape = Request::get(format!("/storage/v1/b/{bucket_b}/o")).send(sidecar_a.addr)?;
    assert!(
        matches!(escape.status, 403 | 404),
        "team a reached {bucket_b}: {}",
        escape.summary()
    );
    let escape = Request::get(format!("/storage/v1/b/{bucket_a}/o/from-a.txt?alt=media"))
        .send(sidecar_b.addr)?;
    assert!(
        matches!(escape.status, 403 | 404),
        "team b reached {bucket_a}: {}",
        escape.summary()
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), operator).await;
    Ok(())
}

/// The operator's notification calls (the GCS JSON API) against
/// fake-gcs-server, which models that resource: what the operator writes
/// reads back as the same configuration, so a resync plans nothing; a
/// configuration already deleted is no error; a missing bucket is
/// `NotFound`.
#[tokio::test]
async fn notification_configurations_round_trip_through_fake_gcs_server() -> Result<()> {
    use bucketmap::crd::{Notification, NotificationEvent, PayloadFormat};
    use bucketmap::gcs::GcsErrorKind;
    use bucketmap::notifications::{plan, to_resource};

    let dir = tempfile::tempdir()?;
    let fake = FakeGcs::start(dir.path(), &["photos-k3x9q2mw"])?;
    let config = GcsConfig {
        endpoint: Some(fake.url()),
        anonymous: true,
    };
    let gcs = GcsClient::connect(&config, Arc::new(Metrics::default())).await?;
    let bucket = "photos-k3x9q2mw";
    assert!(gcs.list_notifications(bucket).await?.is_empty());
    let declared = Notification {
        topic: "projects/acme-test/topics/uploads".into(),
        payload_format: PayloadFormat::None,
        event_types: vec![
            NotificationEvent::ObjectFinalize,
            NotificationEvent::ObjectDelete,
        ],
        object_name_prefix: Some("in/".into()),
        custom_attributes: [("team".to_owned(), "a".to_owned())].into(),
    };
    let created = gcs
        .insert_notification(bucket, &to_resource(&declared))
        .await?;
    let id = created.id.clone().context("fake-gcs-server gives an id")?;
    let listed = gcs.list_notifications(bucket).await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        listed[0].topic,
        "//pubsub.googleapis.com/projects/acme-test/topics/uploads"
    );
    let in_place = plan(std::slice::from_ref(&declared), &[], &listed);
    assert!(
        in_place.create.is_empty() && in_place.delete.is_empty(),
        "{in_place:?}"
    );
    gcs.delete_notification(bucket, &id).await?;
    assert!(gcs.list_notifications(bucket).await?.is_empty());
    gcs.delete_notification(bucket, &id).await?;
    let missing = gcs.list_notifications("no-such-bucket-k3x9").await;
    assert!(
        matches!(&missing, Err(e) if e.kind == GcsErrorKind::NotFound),
        "{missing:?}"
    );
    Ok(())
}
