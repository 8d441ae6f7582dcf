//! `bucketmap dev`: the embedded default. A real local control plane
//! (kube-apiserver + etcd), the CRD, an in-memory GCS (or an emulator), the
//! operator, and the manifests of `examples/` — ready for `kubectl`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::{CustomResourceExt, ResourceExt};
use serde::Deserialize as _;

use crate::controller::{self, FIELD_MANAGER, OperatorConfig};
use crate::crd::Gcs;
use crate::gcs::{GcsClient, GcsConfig};
use crate::metrics::Metrics;
use crate::mock_gcs::MockGcs;
use crate::testenv::TestEnv;

/// Options of `bucketmap dev`.
#[derive(Debug, Clone)]
pub struct DevOptions {
    pub gcs_endpoint: Option<String>,
    pub gcs_anonymous: bool,
    pub kubeconfig_out: Option<PathBuf>,
    pub examples: PathBuf,
    pub default_project: String,
    pub exit_when_ready: bool,
    /// Skip the sidecar and example app (the data plane).
    pub no_sidecar: bool,
}

/// Installs (server-side applies) the `Gcs` CRD and waits until it is served.
pub async fn install_crd(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Gcs::crd();
    let name = crd.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .with_context(|| format!("cannot apply CRD {name}"))?;
    let established = kube::runtime::wait::conditions::is_crd_established();
    tokio::time::timeout(
        Duration::from_secs(30),
        kube::runtime::wait::await_condition(api, &name, established),
    )
    .await
    .with_context(|| format!("CRD {name} not established within 30 s"))?
    .with_context(|| format!("cannot watch CRD {name}"))?;
    Ok(())
}

/// Server-side applies every document of every `*.yaml`/`*.yml` file in
/// `dir` (sorted by file name; namespaces first). Returns the applied objects.
pub async fn apply_manifests(
    client: &kube::Client,
    dir: &Path,
) -> anyhow::Result<Vec<DynamicObject>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read manifests directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc)
                .with_context(|| format!("invalid YAML in {}", file.display()))?;
            if value.is_null() {
                continue;
            }
            let obj: DynamicObject = serde_yaml::from_value(value)
                .with_context(|| format!("not a Kubernetes object in {}", file.display()))?;
            docs.push(obj);
        }
    }
    docs.sort_by_key(|o| o.types.as_ref().is_none_or(|t| t.kind != "Namespace"));
    let mut applied = Vec::new();
    for obj in docs {
        let types = obj
            .types
            .clone()
            .context("manifest without apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(&types).context("bad apiVersion")?;
        let (resource, caps) = pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("unknown kind {}", types.kind))?;
        let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
            let ns = obj.namespace().unwrap_or_else(|| "default".into());
            Api::namespaced_with(client.clone(), &ns, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let name = obj.name_any();
        let result = api
            .patch(
                &name,
                &PatchParams::apply("bucketmap-dev").force(),
                &Patch::Apply(&obj),
            )
            .await
            .with_context(|| format!("cannot apply {} {name}", types.kind))?;
        applied.push(result);
    }
    Ok(applied)
}

/// Waits until every `Gcs` in `objects` is Ready, returning them.
pub async fn wait_all_ready(
    client: &kube::Client,
    objects: &[(String, String)],
    timeout: Duration,
) -> anyhow::Result<Vec<Gcs>> {
    let mut out = Vec::new();
    for (ns, name) in objects {
        let api: Api<Gcs> = Api::namespaced(client.clone(), ns);
        let ready = |g: Option<&Gcs>| g.is_some_and(Gcs::is_ready);
        let gcs = tokio::time::timeout(
            timeout,
            kube::runtime::wait::await_condition(api, name, ready),
        )
        .await
        .with_context(|| format!("Gcs {ns}/{name} not Ready within {timeout:?}"))?
        .with_context(|| format!("cannot watch Gcs {ns}/{name}"))?
        .with_context(|| format!("Gcs {ns}/{name} was deleted"))?;
        out.push(gcs);
    }
    Ok(out)
}

/// Runs `bucketmap dev`.
pub async fn run(opts: DevOptions) -> anyhow::Result<()> {
    eprintln!("starting a local control plane (kube-apiserver + etcd)...");
    let env = TestEnv::start()
        .await
        .context("cannot start the local control plane")?;
    if let Some(path) = &opts.kubeconfig_out {
        env.write_kubeconfig(path)?;
    }
    let kubeconfig = opts
        .kubeconfig_out
        .clone()
        .unwrap_or_else(|| env.kubeconfig_path().to_owned());
    let client = env.client().await?;
    install_crd(&client).await?;

    let (endpoint, anonymous, mock) = match &opts.gcs_endpoint {
        Some(e) => (e.clone(), opts.gcs_anonymous, None),
        None => {
            let mock = MockGcs::start()
                .await
                .context("cannot start the mock GCS")?;
            (mock.endpoint(), true, Some(mock))
        }
    };
    let metrics = Arc::new(Metrics::default());
    let gcs = GcsClient::connect(
        &GcsConfig {
            endpoint: Some(endpoint.clone()),
            anonymous,
        },
        metrics.clone(),
    )
    .await?;
    let config = OperatorConfig {
        default_project: Some(opts.default_project.clone()),
        ..OperatorConfig::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(controller::run(
        client.clone(),
        gcs,
        metrics,
        config,
        || {},
        async {
            let _ = stop_rx.await;
        },
    ));

    let applied = apply_manifests(&client, &opts.examples).await?;
    let gcs_objects: Vec<(String, String)> = applied
        .iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "Gcs"))
        .map(|o| {
            (
                o.namespace().unwrap_or_else(|| "default".into()),
                o.name_any(),
            )
        })
        .collect();
    let ready = wait_all_ready(&client, &gcs_objects, Duration::from_secs(120)).await?;

    println!("bucketmap dev is running");
    println!("  kubeconfig: {}", kubeconfig.display());
    println!(
        "  GCS:        {endpoint}{}",
        if mock.is_some() {
            " (in-memory mock)"
        } else {
            ""
        }
    );
    println!("  buckets:");
    for g in &ready {
        let st = g.status.clone().unwrap_or_default();
        println!(
            "    {}/{}: {} -> {} (project {})",
            g.namespace().unwrap_or_default(),
            g.name_any(),
            g.spec.bucket_name,
            st.bucket_full_name.unwrap_or_default(),
            st.project_id.unwrap_or_default()
        );
    }
    println!(
        "  try: kubectl --kubeconfig {} get gcs -A",
        kubeconfig.display()
    );

    // The data plane: the sidecar with one namespace's map, and an app.
    let demo_target = ready
        .iter()
        .find(|g| g.namespace().as_deref() == Some("staging") && g.spec.bucket_name == "photos")
        .or(ready.first())
        .map(|g| {
            let physical = g
                .status
                .clone()
                .unwrap_or_default()
                .bucket_full_name
                .unwrap_or_default();
            (
                g.namespace().unwrap_or_default(),
                g.spec.bucket_name.clone(),
                physical,
            )
        });
    let demo = match (opts.no_sidecar, demo_target) {
        (false, Some((ns, logical, physical))) => {
            eprintln!(
                "starting bucketmap-sidecar for namespace {ns} in front of fake-gcs-server..."
            );
            let demo = crate::demo::start(&client, &ns, "bucketmap").await?;
            let said = demo.run_example_app(&logical, &physical).await?;
            println!(
                "  sidecar:    {} (namespace {ns}; point STORAGE_EMULATOR_HOST here)",
                demo.sidecar_url
            );
            println!("  example app (examples/app/photo_app.py): {said}");
            println!(
                "    -> found as {physical}/hello.txt in the data plane (fake-gcs-server on {})",
                demo.data_plane
            );
            Some(demo)
        }
        _ => None,
    };

    if !opts.exit_when_ready {
        println!("press ctrl-c to stop");
        tokio::signal::ctrl_c()
            .await
            .context("cannot wait for ctrl-c")?;
    }
    drop(demo);
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), operator).await;
    if let Some(mock) = mock {
        mock.shutdown().await;
    }
    drop(env);
    Ok(())
}
