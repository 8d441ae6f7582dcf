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
use bucketmap::controller::MAP_READER_BINDING;
use common::Fixture;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde::de::DeserializeOwned;

type TestResult = anyhow::Result<()>;

const OPERATOR_NAMESPACE: &str = "bucketmap-system";
/// The ClusterRole the chart renders for the bucket map's readers, which
/// it names to the operator (BUCKETMAP_MAP_READER_ROLE) in a cluster-wide
/// install.
const MAP_READER_ROLE: &str = "bucketmap-map-reader";
/// The bucket map's name (the chart's `mapName`).
const MAP: &str = "bucketmap";
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
    token_client(f, OPERATOR_NAMESPACE, "bucketmap").await
}

/// A client that authenticates as ServiceAccount `name` of `ns` only, as
/// a pod of that ServiceAccount does with its projected token.
async fn token_client(f: &Fixture, ns: &str, name: &str) -> anyhow::Result<kube::Client> {
    let token =
        bucketmap_testkit::testenv::service_account_token(&f.client, ns, name, 3600).await?;
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
    f.config.map_reader_role = Some(MAP_READER_ROLE.to_owned());
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
    let mut f = Fixture::new().await?;
    apply_rbac(&f, &[]).await?;
    unrelated_secret(&f, &f.ns).await?;
    let client = operator_client(&f).await?;
    f.config.map_reader_role = Some(MAP_READER_ROLE.to_owned());
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
    // The operator's in each watched namespace and its own, and the map
    // readers' in each watched namespace.
    assert_eq!(
        kinds.iter().filter(|k| *k == "Role").count(),
        5,
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

/// The status code of an answer (200: allowed).
fn code<T>(answer: Result<T, kube::Error>) -> u16 {
    match answer {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(_) => 0,
    }
}

/// What `client` may do with ConfigMap `name` of `ns`, as the sidecar
/// does it: get it, list it and watch it by name. Status codes; a watch
/// counts as allowed (200) once it delivered the ConfigMap.
async fn map_reads(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<[u16; 3]> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let by_name = format!("metadata.name={name}");
    let get = code(api.get(name).await);
    let list = code(api.list(&ListParams::default().fields(&by_name)).await);
    let params = WatchParams::default().fields(&by_name).timeout(30);
    let watch = match api.watch(&params, "0").await {
        Err(e) => code::<()>(Err(e)),
        Ok(events) => {
            let mut events = std::pin::pin!(events);
            // A deadline, not a pace: the first event comes at once.
            let first = tokio::time::timeout(std::time::Duration::from_secs(60), events.next());
            match first.await {
                Ok(Some(Ok(WatchEvent::Added(cm))))
                    if cm.metadata.name.as_deref() == Some(name) =>
                {
                    200
                }
                other => anyhow::bail!("watch of {ns}/{name}: {other:?}"),
            }
        }
    };
    Ok([get, list, watch])
}

/// A ConfigMap of `ns` beside the map, which no pod may read through
/// the map's role.
async fn other_configmap(f: &Fixture, ns: &str) -> anyhow::Result<()> {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app-settings", "namespace": ns},
        "data": {"mode": "fast"},
    }))?;
    Api::<ConfigMap>::namespaced(f.client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await?;
    Ok(())
}

/// ServiceAccount `name` of `ns`, created by the admin, as a client.
async fn app_client(f: &Fixture, ns: &str, name: &str) -> anyhow::Result<kube::Client> {
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": ns}}))?;
    Api::<ServiceAccount>::namespaced(f.client.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await?;
    token_client(f, ns, name).await
}

/// A Gcs `name` of `ns`, Ready.
async fn ready_in(f: &Fixture, ns: &str, name: &str) -> TestResult {
    let gcs: Api<bucketmap::crd::Gcs> = Api::namespaced(f.client.clone(), ns);
    let obj = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.bucketmap.dev/v1alpha1", "kind": "Gcs",
        "metadata": {"name": name, "namespace": ns}, "spec": {"bucketName": name},
    }))?;
    gcs.create(&PostParams::default(), &obj).await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while !gcs.get(name).await?.is_ready() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{name} in {ns} never became Ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The map reader binding of `ns`, as the admin reads it.
async fn map_reader_binding(f: &Fixture, ns: &str) -> anyhow::Result<Option<RoleBinding>> {
    let api: Api<RoleBinding> = Api::namespaced(f.client.clone(), ns);
    Ok(api.get_opt(MAP_READER_BINDING).await?)
}

/// Waits until the map reader binding of `ns` exists and `check` holds
/// for it.
async fn wait_binding(
    f: &Fixture,
    ns: &str,
    what: &str,
    check: impl Fn(&RoleBinding) -> bool,
) -> anyhow::Result<RoleBinding> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let found = map_reader_binding(f, ns).await?;
        if let Some(rb) = found.as_ref().filter(|rb| check(rb)) {
            return Ok(rb.clone());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the map reader binding of {ns} was not {what}: {found:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The group names a binding grants to.
fn groups(rb: &RoleBinding) -> Vec<String> {
    let subjects = rb.subjects.iter().flatten();
    subjects.map(|s| s.name.clone()).collect()
}

/// A cluster-wide install: the operator, under the chart's RBAC, binds
/// the map reader ClusterRole in each namespace with a Gcs, and a
/// ServiceAccount of the namespace, with its own token, may get, list and
/// watch that namespace's map by name, and nothing else: no other
/// ConfigMap or Secret of its namespace, no unfiltered list, no other
/// namespace's map. The binding comes back when deleted, and goes with
/// the namespace's last Gcs.
#[tokio::test]
async fn a_namespaces_service_accounts_read_its_map_and_nothing_else() -> TestResult {
    let mut f = Fixture::new().await?;
    let other = bucketmap_testkit::testenv::create_namespace(&f.client, "team-b").await?;
    apply_rbac(&f, &[]).await?;
    let operator = operator_client(&f).await?;
    f.config.namespace = None;
    f.config.map_reader_role = Some(MAP_READER_ROLE.to_owned());
    let _operator = f
        .spawn_operator(operator.clone(), std::future::pending())
        .await?;
    let ns = f.ns.clone();
    ready_in(&f, &ns, "photos").await?;
    ready_in(&f, &other, "videos").await?;
    other_configmap(&f, &ns).await?;
    unrelated_secret(&f, &ns).await?;

    let app = app_client(&f, &ns, "photo-app").await?;
    assert_eq!(map_reads(&app, &ns, MAP).await?, [200; 3]);
    assert_eq!(map_reads(&app, &ns, "app-settings").await?, [403; 3]);
    assert_eq!(map_reads(&app, &other, MAP).await?, [403; 3]);
    let all_of_ns = Api::<ConfigMap>::namespaced(app.clone(), &ns);
    assert_eq!(code(all_of_ns.list(&ListParams::default()).await), 403);
    let everywhere = Api::<ConfigMap>::all(app.clone());
    assert_eq!(code(everywhere.list(&ListParams::default()).await), 403);
    assert_eq!(read_unrelated(&app, &ns).await, 403);
    // The other namespace's own ServiceAccounts read theirs.
    let other_app = app_client(&f, &other, "video-app").await?;
    assert_eq!(map_reads(&other_app, &other, MAP).await?, [200; 3]);

    let rb = map_reader_binding(&f, &ns).await?.context("no binding")?;
    let managed_by = rb
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app.kubernetes.io/managed-by"));
    assert_eq!(managed_by.map(String::as_str), Some("bucketmap"), "{rb:?}");
    // Deleted by somebody: the operator binds it again.
    Api::<RoleBinding>::namespaced(f.client.clone(), &ns)
        .delete(MAP_READER_BINDING, &DeleteParams::default())
        .await?;
    let again = wait_binding(&f, &ns, "made again", |b| b.metadata.uid != rb.metadata.uid).await?;
    assert_eq!(groups(&again), [format!("system:serviceaccounts:{ns}")]);
    assert_eq!(map_reads(&app, &ns, MAP).await?, [200; 3]);
    // Widened to every ServiceAccount by somebody: taken back.
    let widen = serde_json::json!({"subjects": [{"apiGroup": "rbac.authorization.k8s.io",
        "kind": "Group", "name": "system:serviceaccounts"}]});
    Api::<RoleBinding>::namespaced(f.client.clone(), &ns)
        .patch(
            MAP_READER_BINDING,
            &PatchParams::default(),
            &Patch::Merge(&widen),
        )
        .await?;
    let own_only = [format!("system:serviceaccounts:{ns}")];
    wait_binding(&f, &ns, "taken back", |b| groups(b) == own_only).await?;

    // The namespace's last Gcs goes, and its binding with it.
    f.delete("photos").await?;
    f.wait_gone("photos", std::time::Duration::from_secs(60))
        .await?;
    assert!(map_reader_binding(&f, &ns).await?.is_none());
    assert!(
        Api::<ConfigMap>::namespaced(f.client.clone(), &ns)
            .get_opt(MAP)
            .await?
            .is_some(),
        "the map outlives its last entry"
    );
    assert_eq!(
        map_reads(&app, &ns, MAP).await?,
        [403; 3],
        "the check bites"
    );
    assert!(
        map_reader_binding(&f, &other).await?.is_some(),
        "videos is left"
    );
    // The operator may grant that role, and none whose rules it lacks.
    let to_admin = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": MAP_READER_BINDING, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": format!("system:serviceaccounts:{ns}")}],
    });
    let as_operator = Api::<RoleBinding>::namespaced(operator, &ns);
    let apply = PatchParams::apply("least-privilege-test");
    let escalated = as_operator
        .patch(MAP_READER_BINDING, &apply, &Patch::Apply(&to_admin))
        .await;
    let refused = matches!(&escalated, Err(kube::Error::Api(s)) if s.code == 403);
    assert!(refused, "{escalated:?}");
    assert_no_failed_reconcile(&f)?;
    Ok(())
}

/// A namespaced install: the chart binds the map reader Role in each
/// watched namespace itself; the operator, which is not told to bind
/// (no BUCKETMAP_MAP_READER_ROLE) and may not, leaves RoleBindings alone.
#[tokio::test]
async fn in_a_namespaced_install_the_chart_binds_the_map_readers() -> TestResult {
    let mut f = Fixture::new().await?;
    let watched = format!("watchNamespaces={{{}}}", f.ns);
    apply_rbac(&f, &[watched.as_str()]).await?;
    let operator = operator_client(&f).await?;
    f.config.map_reader_role = None;
    let _operator = f
        .spawn_operator(operator.clone(), std::future::pending())
        .await?;
    let ns = f.ns.clone();
    let chart_rb = map_reader_binding(&f, &ns)
        .await?
        .context("the chart's binding")?;
    ready_in(&f, &ns, "photos").await?;
    other_configmap(&f, &ns).await?;
    unrelated_secret(&f, &ns).await?;

    let app = app_client(&f, &ns, "photo-app").await?;
    assert_eq!(map_reads(&app, &ns, MAP).await?, [200; 3]);
    assert_eq!(map_reads(&app, &ns, "app-settings").await?, [403; 3]);
    let all_of_ns = Api::<ConfigMap>::namespaced(app.clone(), &ns);
    assert_eq!(code(all_of_ns.list(&ListParams::default()).await), 403);
    assert_eq!(read_unrelated(&app, &ns).await, 403);
    // The operator may not touch RoleBindings here.
    let as_operator = Api::<RoleBinding>::namespaced(operator, &ns);
    assert_eq!(code(as_operator.get(MAP_READER_BINDING).await), 403);

    f.delete("photos").await?;
    f.wait_gone("photos", std::time::Duration::from_secs(60))
        .await?;
    let kept = map_reader_binding(&f, &ns)
        .await?
        .context("the chart's binding is kept")?;
    assert_eq!(
        kept.metadata.resource_version,
        chart_rb.metadata.resource_version
    );
    assert_eq!(map_reads(&app, &ns, MAP).await?, [200; 3]);
    assert_no_failed_reconcile(&f)?;
    Ok(())
}
