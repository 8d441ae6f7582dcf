//! `cargo dev`: the embedded default. A real local control plane
//! (kube-apiserver + etcd) or, with `--existing-cluster`, the current
//! kubeconfig's cluster; the CRD; an in-memory GCS (or an emulator); the
//! operator; and the manifests of `examples/` — ready for `kubectl`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::{CustomResourceExt, ResourceExt};
use serde::Deserialize as _;

use bucketmap::conditions::ACCESS;
use bucketmap::controller::{self, OperatorConfig};
use bucketmap::crd::Gcs;
use bucketmap::gcs::{GcsClient, GcsConfig};
use bucketmap::metrics::Metrics;
use bucketmap_testkit::mock_gcs::MockGcs;
use bucketmap_testkit::testenv::{self, GoGc, TestEnv};

/// Options of `cargo dev` (`bucketmap-dev up`).
#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// GCS endpoint for the operator (default: an in-memory mock GCS).
    #[arg(long, env = "BUCKETMAP_GCS_ENDPOINT")]
    gcs_endpoint: Option<String>,
    /// Send no credentials to --gcs-endpoint (emulators).
    #[arg(long)]
    gcs_anonymous: bool,
    /// Use the current kubeconfig's cluster (kind, minikube, ...) instead of
    /// starting a local control plane: install the CRD there, run the
    /// operator against it and apply the examples' namespaces and Gcs
    /// resources (workloads are skipped: their image is not built here).
    #[arg(long)]
    existing_cluster: bool,
    /// Also write the local control plane's kubeconfig here.
    #[arg(long, conflicts_with = "existing_cluster")]
    kubeconfig_out: Option<PathBuf>,
    /// Directory of manifests to apply (default: the repository's examples/).
    #[arg(long)]
    examples: Option<PathBuf>,
    /// Project for resources that name none.
    #[arg(long, default_value = "bucketmap-dev")]
    default_project: String,
    /// Exit once the examples are Ready instead of running until interrupted.
    #[arg(long)]
    exit_when_ready: bool,
    /// Only the control plane: no sidecar, emulator or example app.
    #[arg(long)]
    no_sidecar: bool,
    /// The product on a single-node cluster on this machine (needs root,
    /// containerd and Go): the image, `helm install`, the examples' pods.
    #[arg(long, conflicts_with_all = ["existing_cluster", "gcs_endpoint", "no_sidecar", "examples"])]
    node: bool,
    /// The operator's own flags: tenancy policy, resync, pacing, budgets.
    #[command(flatten)]
    tuning: bucketmap::cli::TuningArgs,
}

/// Server-side applies every document of every `*.yaml`/`*.yml` file in
/// `dir` (sorted by file name; namespaces first). Returns the applied objects.
pub async fn apply_manifests(
    client: &kube::Client,
    dir: &Path,
    only: impl Fn(&str) -> bool,
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
            if obj.types.as_ref().is_none_or(|t| only(&t.kind)) {
                docs.push(obj);
            }
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

/// Whether `g` is Ready and, when it declares `spec.access`, has every grant
/// in place (its ServiceAccounts may be applied after it).
fn settled(g: &Gcs) -> bool {
    let granted = || {
        g.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == ACCESS && c.status == "True")
        })
    };
    g.is_ready() && (g.spec.access.is_empty() || granted())
}

/// Waits until every `Gcs` in `objects` is Ready (with its access granted,
/// if it declares any), returning them.
pub async fn wait_all_ready(
    client: &kube::Client,
    objects: &[(String, String)],
    timeout: Duration,
) -> anyhow::Result<Vec<Gcs>> {
    let mut out = Vec::new();
    for (ns, name) in objects {
        let api: Api<Gcs> = Api::namespaced(client.clone(), ns);
        let ready = |g: Option<&Gcs>| g.is_some_and(settled);
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

/// The cluster `cargo dev` runs against.
struct Cluster {
    client: kube::Client,
    /// The local control plane; `None` with `--existing-cluster`.
    local: Option<TestEnv>,
    /// How to point kubectl at it.
    kubectl: String,
}

/// Starts a local control plane, or connects to the current kubeconfig's
/// cluster; installs the CRD either way.
async fn start_cluster(args: &DevArgs) -> anyhow::Result<Cluster> {
    let cluster = if args.existing_cluster {
        let client = kube::Client::try_default()
            .await
            .context("--existing-cluster: cannot reach the cluster of the current kubeconfig")?;
        eprintln!("using the current kubeconfig's cluster (--existing-cluster)");
        Cluster {
            client,
            local: None,
            kubectl: "kubectl".into(),
        }
    } else {
        eprintln!("starting a local control plane (kube-apiserver + etcd)...");
        // A developer's cluster for as long as they like: Go's collector.
        let env = TestEnv::start_with(GoGc::GoDefault)
            .await
            .context("cannot start the local control plane")?;
        if let Some(path) = &args.kubeconfig_out {
            env.write_kubeconfig(path)?;
        }
        let kubeconfig = args
            .kubeconfig_out
            .clone()
            .unwrap_or_else(|| env.kubeconfig_path().to_owned());
        let client = env.client().await?;
        let kubectl = format!("kubectl --kubeconfig {}", kubeconfig.display());
        Cluster {
            client,
            local: Some(env),
            kubectl,
        }
    };
    testenv::install_crd(&cluster.client, &Gcs::crd()).await?;
    Ok(cluster)
}

/// Refuses an existing cluster that has `Gcs` resources outside the
/// examples' namespaces: the operator started here would reconcile them
/// against the mock GCS and overwrite their status.
async fn refuse_foreign_resources(
    client: &kube::Client,
    namespaces: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let all: Api<Gcs> = Api::all(client.clone());
    let existing = all
        .list_metadata(&Default::default())
        .await
        .context("cannot list the cluster's Gcs resources")?;
    let foreign: BTreeSet<String> = existing
        .items
        .iter()
        .filter_map(|g| g.metadata.namespace.clone())
        .filter(|ns| !namespaces.contains(ns))
        .collect();
    anyhow::ensure!(
        foreign.is_empty(),
        "--existing-cluster: the cluster already has Gcs resources in {foreign:?}; the \
         operator `cargo dev` runs would reconcile them against the mock GCS. Use a \
         dedicated cluster (for example `kind create cluster`)"
    );
    Ok(())
}

/// The operator's GCS: the in-memory mock unless `--gcs-endpoint` is given.
async fn start_gcs(
    args: &DevArgs,
    examples: &Path,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(GcsClient, String, Option<MockGcs>)> {
    let (endpoint, anonymous, mock) = match &args.gcs_endpoint {
        Some(e) => (e.clone(), args.gcs_anonymous, None),
        None => {
            let mock = MockGcs::start()
                .await
                .context("cannot start the mock GCS")?;
            for topic in example_topics(examples)? {
                mock.handle().add_topic(&topic);
            }
            (mock.endpoint(), true, Some(mock))
        }
    };
    let config = GcsConfig {
        endpoint: Some(endpoint.clone()),
        anonymous,
    };
    let gcs = GcsClient::connect(&config, metrics).await?;
    let shown = match mock {
        Some(_) => format!("{endpoint} (in-memory mock)"),
        None => endpoint,
    };
    Ok((gcs, shown, mock))
}

/// The kinds of `examples/` applied: everything on the local control plane
/// (nothing runs workloads there); on an existing cluster only namespaces,
/// the ServiceAccounts the buckets grant access to and `Gcs` resources,
/// since the example workloads' image is not built here.
fn applied_kinds(args: &DevArgs) -> impl Fn(&str) -> bool + use<> {
    let existing = args.existing_cluster;
    move |kind: &str| !existing || matches!(kind, "Namespace" | "ServiceAccount" | "Gcs")
}

/// The (namespace, name) of every `Gcs` among `applied`.
fn gcs_objects(applied: &[DynamicObject]) -> Vec<(String, String)> {
    applied
        .iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "Gcs"))
        .map(|o| {
            (
                o.namespace().unwrap_or_else(|| "default".into()),
                o.name_any(),
            )
        })
        .collect()
}

/// The `Gcs` resources in `dir`, read without applying.
fn example_resources(dir: &Path) -> anyhow::Result<Vec<serde_yaml::Value>> {
    let mut resources = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if !path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc)
                .with_context(|| format!("invalid YAML in {}", path.display()))?;
            if value.get("kind").and_then(|k| k.as_str()) == Some("Gcs") {
                resources.push(value);
            }
        }
    }
    Ok(resources)
}

/// The namespaces of the `Gcs` resources in `dir`.
fn example_namespaces(dir: &Path) -> anyhow::Result<BTreeSet<String>> {
    let namespace = |g: &serde_yaml::Value| {
        let ns = g.get("metadata").and_then(|m| m.get("namespace"));
        ns.and_then(|n| n.as_str()).unwrap_or("default").to_owned()
    };
    Ok(example_resources(dir)?.iter().map(namespace).collect())
}

/// The Pub/Sub topics the `Gcs` resources in `dir` publish to: the mock
/// GCS has them, as the project of a real install would.
fn example_topics(dir: &Path) -> anyhow::Result<BTreeSet<String>> {
    let mut topics = BTreeSet::new();
    for g in example_resources(dir)? {
        let listed = g.get("spec").and_then(|s| s.get("notifications"));
        for n in listed.and_then(|n| n.as_sequence()).into_iter().flatten() {
            if let Some(topic) = n.get("topic").and_then(|t| t.as_str()) {
                topics.insert(
                    topic
                        .trim_start_matches("//pubsub.googleapis.com/")
                        .to_owned(),
                );
            }
        }
    }
    Ok(topics)
}

fn print_summary(cluster: &Cluster, gcs: &str, ready: &[Gcs]) {
    println!("bucketmap dev is running");
    println!("  cluster:    {}", cluster.kubectl);
    println!("  GCS:        {gcs}");
    println!("  buckets:");
    for g in ready {
        let st = g.status.clone().unwrap_or_default();
        println!(
            "    {}/{}: {} -> {} (project {})",
            g.namespace().unwrap_or_default(),
            g.name_any(),
            g.spec.bucket_name,
            st.bucket_full_name.unwrap_or_default(),
            st.project_id.unwrap_or_default()
        );
        for a in &st.access {
            let who = a
                .service_account
                .as_deref()
                .map_or_else(String::new, |sa| format!(" (ServiceAccount {sa})"));
            println!("      access: {} {}{who}", a.role, a.member);
        }
    }
    println!("  try: {} get gcs -A", cluster.kubectl);
}

/// The data plane: the sidecar with one namespace's map, and an example app
/// writing through it (staging/photos when present).
async fn start_demo(
    client: &kube::Client,
    ready: &[Gcs],
    grpc_upstream: Option<&str>,
    tools: tokio::task::JoinHandle<anyhow::Result<crate::demo::Tools>>,
) -> anyhow::Result<Option<crate::demo::Demo>> {
    let tools = tools.await.context("the demo's install task")??;
    let target = ready
        .iter()
        .find(|g| g.namespace().as_deref() == Some("staging") && g.spec.bucket_name == "photos")
        .or(ready.first());
    let Some(g) = target else { return Ok(None) };
    let ns = g.namespace().unwrap_or_default();
    let logical = g.spec.bucket_name.clone();
    let physical = g
        .status
        .clone()
        .unwrap_or_default()
        .bucket_full_name
        .unwrap_or_default();
    eprintln!("starting bucketmap-sidecar for namespace {ns} in front of fake-gcs-server...");
    let demo = crate::demo::start(client, &ns, "bucketmap", grpc_upstream, tools).await?;
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
    if grpc_upstream.is_some() {
        let name = demo.grpc_get_bucket(&logical).await?;
        println!(
            "  gRPC GetBucket through the sidecar (google.storage.v2, h2c on the same port): {name}"
        );
    }
    Ok(Some(demo))
}

/// The embedded operator's settings. Its cluster identity comes from the
/// environment (`BUCKETMAP_CLUSTER_ID`), as a deployed operator's would.
fn operator_config(args: &DevArgs) -> anyhow::Result<OperatorConfig> {
    let cluster_id = match std::env::var("BUCKETMAP_CLUSTER_ID") {
        Ok(id) => bucketmap::naming::validate_cluster_id(&id).map_err(anyhow::Error::msg)?,
        Err(_) => "dev".to_owned(),
    };
    println!("  cluster identity: {cluster_id} (BUCKETMAP_CLUSTER_ID)");
    let mut config = OperatorConfig {
        cluster_id,
        default_project: Some(args.default_project.clone()),
        ..OperatorConfig::default()
    };
    args.tuning.apply(&mut config);
    Ok(config)
}

/// The operator's own namespace, where it keeps the places of namespaces
/// whose buckets the tenancy policy limits: created when missing.
async fn ensure_operator_namespace(
    client: &kube::Client,
    config: &OperatorConfig,
) -> anyhow::Result<()> {
    if !config.tenancy.limits_count() {
        return Ok(());
    }
    let name = &config.operator_namespace;
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if api.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    api.create(&kube::api::PostParams::default(), &ns)
        .await
        .with_context(|| format!("cannot create the operator's namespace {name}"))?;
    Ok(())
}

/// The embedded operator, running until the sender is used or dropped.
fn spawn_operator(
    client: kube::Client,
    gcs: GcsClient,
    metrics: Arc<Metrics>,
    config: OperatorConfig,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async {
        let _ = stop_rx.await;
    };
    let operator = tokio::spawn(controller::run(
        client,
        gcs,
        metrics,
        config,
        || {},
        stopped,
    ));
    (stop_tx, operator)
}

/// Runs `cargo dev`.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.node {
        return crate::node::run(args.exit_when_ready, args.kubeconfig_out.as_deref()).await;
    }
    let examples = args
        .examples
        .clone()
        .unwrap_or_else(|| bucketmap_testkit::repo_path("examples"));
    // The demo's programs install (on a first run: build) while the control
    // plane starts and the examples converge, rather than after.
    let demo_tools = (!args.no_sidecar).then(|| tokio::spawn(crate::demo::install_tools()));
    let cluster = start_cluster(&args).await?;
    if cluster.local.is_none() {
        refuse_foreign_resources(&cluster.client, &example_namespaces(&examples)?).await?;
    }
    let metrics = Arc::new(Metrics::default());
    let (gcs, gcs_shown, mock) = start_gcs(&args, &examples, metrics.clone()).await?;
    let config = operator_config(&args)?;
    ensure_operator_namespace(&cluster.client, &config).await?;
    let (stop_tx, operator) = spawn_operator(cluster.client.clone(), gcs, metrics, config);
    let applied = apply_manifests(&cluster.client, &examples, applied_kinds(&args)).await?;
    let gcs_objects = gcs_objects(&applied);
    let ready = wait_all_ready(&cluster.client, &gcs_objects, Duration::from_secs(120)).await?;
    print_summary(&cluster, &gcs_shown, &ready);
    let demo = match demo_tools {
        None => None,
        Some(tools) => {
            let grpc_upstream = mock.as_ref().map(MockGcs::endpoint);
            start_demo(&cluster.client, &ready, grpc_upstream.as_deref(), tools).await?
        }
    };
    if !args.exit_when_ready {
        println!("press ctrl-c to stop");
        bucketmap::termination_signal().await;
    }
    if let Some(demo) = demo {
        demo.stop().await?;
    }
    if cluster.local.is_none() {
        println!(
            "the examples stay in the cluster; their finalizers need the operator: \
             delete them with `{} delete gcs --all -A` while `cargo dev --existing-cluster` runs",
            cluster.kubectl
        );
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), operator).await;
    if let Some(mock) = mock {
        mock.shutdown().await;
    }
    drop(cluster);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Command {
        #[command(flatten)]
        args: DevArgs,
    }

    fn config(flags: &[&str]) -> OperatorConfig {
        let argv = std::iter::once("cargo-dev").chain(flags.iter().copied());
        let command = Command::try_parse_from(argv).expect("the flags parse");
        operator_config(&command.args).expect("a config")
    }

    #[test]
    fn the_embedded_operator_takes_the_operators_policy_resync_and_pacing() {
        let dir = tempfile::tempdir().expect("a directory");
        let policy = dir.path().join("policy.yaml");
        std::fs::write(
            &policy,
            "rules:\n- namespaces: [staging]\n  projects: [team-a]\n  maxBucketsPerNamespace: 2\n",
        )
        .expect("written");
        let given = config(&[
            "--tenancy-policy",
            policy.to_str().expect("UTF-8"),
            "--resync",
            "30s",
            "--bucket-ops-interval",
            "0s",
            "--concurrency",
            "4",
            "--map-debounce",
            "5ms",
        ]);
        assert!(given.tenancy.limits_count(), "{:?}", given.tenancy);
        assert_eq!(given.tenancy.rules[0].projects, ["team-a"]);
        assert_eq!(given.resync, std::time::Duration::from_secs(30));
        assert_eq!(given.bucket_ops_interval, Some(std::time::Duration::ZERO));
        assert_eq!(given.concurrency, 4);
        assert_eq!(given.map_debounce, std::time::Duration::from_millis(5));
        // Without them, the operator's own defaults.
        let defaults = config(&[]);
        let operator = OperatorConfig::default();
        assert_eq!(defaults.resync, operator.resync);
        assert_eq!(defaults.bucket_ops_interval, operator.bucket_ops_interval);
        assert_eq!(defaults.concurrency, operator.concurrency);
        assert!(!defaults.tenancy.limits_count());
    }
}
