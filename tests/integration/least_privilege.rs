//! The operator under exactly the RBAC the chart renders: the chart's
//! ServiceAccount, ClusterRoles, Roles and bindings applied to a real API
//! server (which enforces RBAC), a token of that ServiceAccount from the
//! TokenRequest API, and the operator's client built from the token alone,
//! not from the admin kubeconfig.
//!
//! The helm binary comes from `tools/helm/install.sh` (pinned, built on
//! first use; `HELM_BIN` points at another one).

// Scenarios read top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::path::PathBuf;

use anyhow::Context as _;
use common::Fixture;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};
use serde::de::DeserializeOwned;

type TestResult = anyhow::Result<()>;

const OPERATOR_NAMESPACE: &str = "bucketmap-system";
/// This checkout (the chart and the tools of the tree under test).
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

async fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .with_context(|| format!("cannot run {program}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The pinned helm binary (the last line `tools/helm/install.sh` prints).
async fn helm() -> anyhow::Result<PathBuf> {
    let script = format!("{ROOT}/tools/helm/install.sh");
    let out = run("bash", &[&script]).await?;
    Ok(PathBuf::from(
        out.lines().last().context("install.sh printed nothing")?,
    ))
}

/// The documents of the chart's RBAC template, rendered with `values`.
async fn rendered_rbac(values: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let helm = helm().await?;
    let chart = format!("{ROOT}/deploy/chart/bucketmap");
    let mut args = vec![
        "template",
        "bucketmap",
        &chart,
        "--namespace",
        OPERATOR_NAMESPACE,
        "--show-only",
        "templates/rbac.yaml",
        // `helm template` has no cluster to ask; the chart's minimum.
        "--kube-version",
        "1.29.0",
    ];
    for value in values {
        args.extend(["--set", value]);
    }
    let yaml = run(helm.to_str().context("path")?, &args).await?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&yaml) {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// Creates the object `doc` describes through `api`.
async fn create<K>(api: Api<K>, doc: &serde_json::Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(doc.clone())?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

/// Applies the chart's RBAC (rendered with `values`) as the admin; returns
/// the kinds applied, sorted.
async fn apply_rbac(f: &Fixture, values: &[&str]) -> anyhow::Result<Vec<String>> {
    let namespaces: Api<Namespace> = Api::all(f.client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": OPERATOR_NAMESPACE}}))?;
    namespaces.create(&PostParams::default(), &ns).await?;
    let mut kinds = Vec::new();
    for doc in rendered_rbac(values).await? {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let ns = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or(OPERATOR_NAMESPACE);
        let (client, doc) = (f.client.clone(), &doc);
        match kind.as_str() {
            "ServiceAccount" => create(Api::<ServiceAccount>::namespaced(client, ns), doc).await?,
            "Role" => create(Api::<Role>::namespaced(client, ns), doc).await?,
            "RoleBinding" => create(Api::<RoleBinding>::namespaced(client, ns), doc).await?,
            "ClusterRole" => create(Api::<ClusterRole>::all(client), doc).await?,
            "ClusterRoleBinding" => create(Api::<ClusterRoleBinding>::all(client), doc).await?,
            other => anyhow::bail!("unexpected kind {other} in templates/rbac.yaml"),
        }
        kinds.push(kind);
    }
    kinds.sort();
    Ok(kinds)
}

/// A client that authenticates as the chart's ServiceAccount only.
async fn operator_client(f: &Fixture) -> anyhow::Result<kube::Client> {
    let accounts: Api<ServiceAccount> = Api::namespaced(f.client.clone(), OPERATOR_NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request("bucketmap", &PostParams::default(), &request)
        .await?
        .status
        .context("no token in the TokenRequest's status")?
        .token;
    let mut config = f.env.kube_config()?;
    config.auth_info = serde_json::from_value(serde_json::json!({ "token": token }))?;
    Ok(kube::Client::try_from(config)?)
}

/// A Secret of `ns` that the operator has no business with.
async fn unrelated_secret(f: &Fixture, ns: &str) -> anyhow::Result<()> {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "database-password", "namespace": ns},
        "stringData": {"password": "hunter2"},
    }))?;
    Api::<Secret>::namespaced(f.client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// The operator in-process as `client`, and the `Gcs` photos it made Ready.
async fn photos_ready_as(
    f: &Fixture,
    client: &kube::Client,
) -> anyhow::Result<(tokio::task::JoinHandle<()>, bucketmap::crd::Gcs)> {
    let operator = f
        .spawn_operator(client.clone(), std::future::pending())
        .await?;
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    let g = f.wait_ready("photos").await?;
    Ok((operator, g))
}

/// No reconcile of the operator failed (its metrics say so).
fn assert_no_failed_reconcile(f: &Fixture) -> anyhow::Result<()> {
    assert_eq!(
        f.metrics.reconcile_failure_count(),
        0,
        "{}",
        f.metrics.encode()?
    );
    Ok(())
}

/// The status code of reading the unrelated Secret as the operator (200: read).
async fn read_unrelated(client: &kube::Client, ns: &str) -> u16 {
    match Api::<Secret>::namespaced(client.clone(), ns)
        .get("database-password")
        .await
    {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(_) => 0,
    }
}

#[tokio::test]
async fn without_service_binding_the_operator_works_and_reads_no_other_secret() -> TestResult {
    let mut f = Fixture::new().await?;
    let kinds = apply_rbac(&f, &["serviceBinding.enabled=false"]).await?;
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ],
        "the chart's RBAC changed: update this test"
    );
    unrelated_secret(&f, &f.ns).await?;
    let client = operator_client(&f).await?;
    f.config.service_binding = false;
    let (_operator, g) = photos_ready_as(&f, &client).await?;
    let physical = common::physical(&g);
    assert!(f.gcs.bucket(&physical).is_some(), "no bucket {physical}");
    assert_eq!(f.bucket_map().await?.get("photos"), Some(&physical));
    assert!(
        g.status.as_ref().is_some_and(|s| s.binding.is_none()),
        "{g:?}"
    );
    assert_no_failed_reconcile(&f)?;
    // The check bites: the same client is refused the Secret (403).
    assert_eq!(
        read_unrelated(&client, &f.ns).await,
        403,
        "{:#?}",
        rendered_rbac(&["serviceBinding.enabled=false"]).await?
    );
    let all = Api::<Secret>::all(client.clone())
        .list(&Default::default())
        .await;
    assert!(matches!(all, Err(kube::Error::Api(s)) if s.code == 403));
    // In its own namespace it may create the webhook's Secret and read it by name.
    let own: Api<Secret> = Api::namespaced(client, OPERATOR_NAMESPACE);
    assert!(
        matches!(own.get("bucketmap-webhook-tls").await, Err(kube::Error::Api(s)) if s.code == 404)
    );
    assert!(matches!(own.get("another").await, Err(kube::Error::Api(s)) if s.code == 403));
    Ok(())
}

/// The control, and the price of Service Binding: with it on (the default)
/// the operator publishes the binding Secret, and RBAC, which cannot scope
/// a rule by label, lets it read the unrelated Secret too.
#[tokio::test]
async fn with_service_binding_the_operator_publishes_and_can_read_secrets() -> TestResult {
    let f = Fixture::new().await?;
    apply_rbac(&f, &[]).await?;
    unrelated_secret(&f, &f.ns).await?;
    let client = operator_client(&f).await?;
    let (_operator, g) = photos_ready_as(&f, &client).await?;
    let binding = g.status.as_ref().and_then(|s| s.binding.clone());
    let binding = binding.context("no binding in the status")?;
    Api::<Secret>::namespaced(f.client.clone(), &f.ns)
        .get(&binding.name)
        .await
        .context("the binding Secret was not published")?;
    assert_no_failed_reconcile(&f)?;
    assert_eq!(read_unrelated(&client, &f.ns).await, 200);
    Ok(())
}

/// A namespaced install (`watchNamespaces`): Roles in the watched
/// namespaces instead of cluster-wide rules. The operator watches two
/// namespaces (so the watches of each are merged), makes both resources
/// Ready, and can neither list resources cluster-wide nor read a Secret of
/// a namespace it does not watch.
#[tokio::test]
async fn a_namespaced_install_works_in_its_namespaces_only() -> TestResult {
    let mut f = Fixture::new().await?;
    let other = bucketmap_testkit::testenv::create_namespace(&f.client, "team-b").await?;
    let outside = bucketmap_testkit::testenv::create_namespace(&f.client, "outside").await?;
    let watched = format!("watchNamespaces={{{},{other}}}", f.ns);
    let kinds = apply_rbac(&f, &[watched.as_str()]).await?;
    assert_eq!(
        kinds.iter().filter(|k| *k == "Role").count(),
        3,
        "{kinds:?}"
    );
    let client = operator_client(&f).await?;
    f.config.namespace = None;
    f.config.watch_namespaces = vec![f.ns.clone(), other.clone()];
    // A limit: each resource takes a place, kept in the operator's
    // namespace under the Role's names.
    f.config.operator_namespace = OPERATOR_NAMESPACE.to_owned();
    f.config.tenancy = std::sync::Arc::new(serde_json::from_value(serde_json::json!({"rules": [
        {"namespaces": [f.ns, other], "projects": [common::PROJECT], "maxBucketsPerNamespace": 5},
    ]}))?);
    let _operator = f
        .spawn_operator(client.clone(), std::future::pending())
        .await?;

    let gcs = |ns: &str| Api::<bucketmap::crd::Gcs>::namespaced(f.client.clone(), ns);
    let spec = |name: &str, ns: &str| -> anyhow::Result<bucketmap::crd::Gcs> {
        Ok(serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1",
            "kind": "Gcs",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"bucketName": name},
        }))?)
    };
    f.create("photos", serde_json::json!({"bucketName": "photos"}))
        .await?;
    for ns in [&other, &outside] {
        gcs(ns)
            .create(&PostParams::default(), &spec("videos", ns)?)
            .await?;
    }
    f.wait_ready("photos").await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while !gcs(&other).get("videos").await?.is_ready() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "videos in {other} never became Ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_no_failed_reconcile(&f)?;
    // The resource outside was never touched: no finalizer, no status.
    let untouched = gcs(&outside).get("videos").await?;
    assert!(untouched.metadata.finalizers.is_none(), "{untouched:?}");
    assert!(untouched.status.is_none(), "{untouched:?}");
    // The checks bite: cluster-wide lists and other namespaces are refused.
    let all = Api::<bucketmap::crd::Gcs>::all(client.clone())
        .list(&Default::default())
        .await;
    assert!(
        matches!(all, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{all:?}"
    );
    unrelated_secret(&f, &outside).await?;
    assert_eq!(read_unrelated(&client, &outside).await, 403);
    let configmaps: Api<ConfigMap> = Api::namespaced(f.client.clone(), OPERATOR_NAMESPACE);
    for ns in [&f.ns, &other] {
        let places = configmaps
            .get(&bucketmap::controller::places_name(ns))
            .await?;
        assert_eq!(places.data.map(|d| d.len()), Some(1), "{ns}");
    }
    Ok(())
}
