//! `cargo dev --existing-cluster`: the operator runs against the current
//! kubeconfig's cluster (here a real local control plane standing in for a
//! kind cluster) instead of starting one, and refuses a cluster whose `Gcs`
//! resources it would take over.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::CustomResourceExt as _;
use kube::api::{Api, ListParams, PostParams};

use bucketmap::crd::Gcs;
use bucketmap_testkit::testenv::{self, TestEnv};

type TestResult = anyhow::Result<()>;

/// Runs `bucketmap-dev --existing-cluster --exit-when-ready --no-sidecar`
/// against `env`; returns (success, stdout, stderr).
async fn dev_against(env: &TestEnv) -> anyhow::Result<(bool, String, String)> {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_bucketmap-dev"))
        .args(["--existing-cluster", "--exit-when-ready", "--no-sidecar"])
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .context("cargo dev --existing-cluster did not finish within 5 minutes")??;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn existing_cluster_gets_the_crd_and_ready_examples_but_no_workloads() -> TestResult {
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    let (ok, stdout, stderr) = dev_against(&env).await?;
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("using the current kubeconfig's cluster"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("starting a local control plane"),
        "{stderr}"
    );

    let photos: Api<Gcs> = Api::namespaced(client.clone(), "staging");
    let g = photos
        .get("photos")
        .await
        .context("staging/photos was not applied")?;
    assert!(g.is_ready(), "{:?}", g.status);
    let physical = g
        .status
        .and_then(|s| s.bucket_full_name)
        .context("no physical name")?;
    assert!(physical.starts_with("photos-"), "{physical}");
    assert!(
        stdout.contains(&format!("staging/photos: photos -> {physical}")),
        "{stdout}"
    );
    // The example ServiceAccount has access, shown from status.access.
    assert!(
        stdout.contains("access: roles/storage.objectUser serviceAccount:photo-app@acme-staging.iam.gserviceaccount.com (ServiceAccount photo-app)"),
        "{stdout}"
    );

    // The example Deployment's image is not built here: it is not applied.
    let deployments: Api<Deployment> = Api::all(client.clone());
    let listed = deployments.list(&ListParams::default()).await?;
    assert!(
        listed.items.is_empty(),
        "{:?}",
        listed
            .items
            .iter()
            .map(|d| &d.metadata.name)
            .collect::<Vec<_>>()
    );
    Ok(())
}

#[tokio::test]
async fn existing_cluster_with_foreign_gcs_resources_is_refused_and_left_alone() -> TestResult {
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    testenv::install_crd(&client, &Gcs::crd()).await?;
    let ns = testenv::create_namespace(&client, "theirs").await?;
    let theirs: Api<Gcs> = Api::namespaced(client.clone(), &ns);
    let gcs: Gcs = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.bucketmap.dev/v1alpha1",
        "kind": "Gcs",
        "metadata": {"name": "photos"},
        "spec": {"bucketName": "photos"},
    }))?;
    theirs.create(&PostParams::default(), &gcs).await?;

    let (ok, stdout, stderr) = dev_against(&env).await?;
    assert!(!ok, "must refuse; stdout:\n{stdout}");
    assert!(
        stderr.contains(&ns) && stderr.contains("dedicated cluster"),
        "{stderr}"
    );

    let after = theirs.get("photos").await?;
    assert!(
        after.status.is_none(),
        "their resource was touched: {:?}",
        after.status
    );
    assert!(
        after.metadata.finalizers.is_none(),
        "{:?}",
        after.metadata.finalizers
    );
    // Nothing of the examples was applied either.
    let namespaces: Api<Namespace> = Api::all(client);
    assert!(namespaces.get_opt("staging").await?.is_none());
    Ok(())
}
