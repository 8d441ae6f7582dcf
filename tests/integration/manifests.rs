//! `deploy/crd/` and `deploy/` as a user installs them: the kustomize bases
//! are accepted by the API server, and their least-privilege RBAC is enough
//! for the operator to do its whole job (it runs here as the base's
//! ServiceAccount).

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::time::Duration;

use anyhow::Context as _;
use common::{Fixture, physical};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::Api;

type TestResult = anyhow::Result<()>;

const SERVICE_ACCOUNT: &str = "system:serviceaccount:bucketmap-system:bucketmap";

/// A copy of the admin kubeconfig that impersonates the operator's ServiceAccount.
fn impersonating_kubeconfig(
    f: &Fixture,
    dir: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let text = std::fs::read_to_string(f.env.kubeconfig_path())?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let users = config
        .get_mut("users")
        .and_then(|u| u.as_sequence_mut())
        .context("kubeconfig without users")?;
    for user in users {
        if let Some(u) = user.get_mut("user").and_then(|u| u.as_mapping_mut()) {
            u.insert("as".into(), SERVICE_ACCOUNT.into());
        }
    }
    let path = dir.join("operator.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

#[tokio::test]
async fn the_kustomize_base_installs_and_its_rbac_suffices_for_the_operator() -> TestResult {
    let f = Fixture::new().await?;
    // Both bases, as the README installs them: the CRD and the namespace
    // (deploy/crd/), then the operator (deploy/).
    let mut manifest = String::new();
    for base in ["/deploy/crd", "/deploy"] {
        let base = format!("{}{base}", env!("CARGO_MANIFEST_DIR"));
        let rendered = f.kubectl(&["kustomize", &base]).await?;
        assert!(
            rendered.status.success(),
            "{}",
            String::from_utf8_lossy(&rendered.stderr)
        );
        manifest.push_str(&String::from_utf8(rendered.stdout)?);
        manifest.push_str("---\n");
    }
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "Deployment",
        "PodDisruptionBudget",
    ] {
        assert!(
            manifest.contains(&format!("kind: {kind}\n")),
            "kustomize output lacks a {kind}"
        );
    }
    let applied = f
        .kubectl_with_stdin(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            &manifest,
        )
        .await?;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );

    // The operator, as the ServiceAccount, watching every namespace, with
    // leader election in its own namespace.
    let dir = tempfile::tempdir()?;
    let kubeconfig = impersonating_kubeconfig(&f, dir.path())?;
    let can_i = f
        .kubectl(&[
            "auth",
            "can-i",
            "delete",
            "gcs.storage.bucketmap.dev",
            "--as",
            SERVICE_ACCOUNT,
        ])
        .await?;
    assert!(!can_i.status.success(), "nothing beyond the declared rules");
    let mut operator = f
        .operator_command()
        .args(["--leader-elect", "--default-project", "rbac-project"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        // As deploy/operator.yaml names it.
        .args(["--map-reader-role", "bucketmap-map-reader"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("POD_NAMESPACE")
        .env_remove("BUCKETMAP_CLUSTER_ID")
        .spawn()?;

    // spec.access: the ServiceAccount's annotation is readable with the RBAC.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(f.client.clone(), &f.ns);
    let gsa = "photo-app@rbac-project.iam.gserviceaccount.com";
    accounts
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {
                "name": "photo-app",
                "annotations": {bucketmap::iam::GSA_ANNOTATION: gsa},
            }}))?,
        )
        .await?;
    let access = serde_json::json!([{"serviceAccount": "photo-app", "role": "objectUser"}]);
    f.create(
        "photos",
        serde_json::json!({"bucketName": "photos", "access": access}),
    )
    .await?;
    let g = f.wait_ready("photos").await?;
    assert!(f.gcs.bucket(&physical(&g)).is_some());
    // No cluster id given: the operator stored the one it derived, which
    // its RBAC allows.
    let stored: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(f.client.clone(), "bucketmap-system");
    assert!(
        stored
            .get_opt(bucketmap::cluster_id::CONFIGMAP)
            .await?
            .is_some(),
        "the derived cluster identity is stored"
    );
    let granted = f
        .wait_for("photos", Duration::from_secs(30), "access granted", |g| {
            // status.access records intent before the policy write; the
            // Access condition turns True only once the grant is in place.
            g.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Access" && c.status == "True")
            })
        })
        .await?;
    let policy = f.gcs.iam_policy(&physical(&granted)).unwrap_or_default();
    let member = format!("serviceAccount:{gsa}");
    assert!(
        bucketmap_testkit::mock_gcs::has_member(&policy, "roles/storage.objectUser", &member),
        "{policy:?}"
    );
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), &f.ns);
    let map = cms.get("bucketmap").await?.data.unwrap_or_default();
    assert_eq!(map.get("photos"), Some(&physical(&g)));
    let secrets: Api<Secret> = Api::namespaced(f.client.clone(), &f.ns);
    assert!(secrets.get_opt("photos-gcs-binding").await?.is_some());
    // The namespace's ServiceAccounts may read its map: the RBAC lets the
    // operator bind the role.
    let bindings: Api<RoleBinding> = Api::namespaced(f.client.clone(), &f.ns);
    let binding = bucketmap::controller::MAP_READER_BINDING;
    assert!(bindings.get_opt(binding).await?.is_some());
    f.wait_event("photos", "Created").await?;

    f.delete("photos").await?;
    f.wait_gone("photos", Duration::from_secs(30)).await?;
    assert!(f.gcs.bucket(&physical(&g)).is_none());
    assert!(secrets.get_opt("photos-gcs-binding").await?.is_none());
    assert!(
        bindings.get_opt(binding).await?.is_none(),
        "the last Gcs went"
    );
    assert!(operator.try_wait()?.is_none(), "operator still running");
    operator.kill().await?;
    Ok(())
}
