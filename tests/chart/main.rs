//! `deploy/chart/bucketmap`, the Helm chart: with default values it renders
//! the same install as the kustomize base in `deploy/` (minus the Namespace,
//! which `helm install --create-namespace` makes), its CRD is a byte-for-byte
//! copy of `deploy/crd.yaml`, and the API server accepts what it renders.
//!
//! helm itself is built from the pinned Go module in `tools/helm/`
//! (`tools/helm/install.sh`; set `HELM_BIN` to use another binary).

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use common::Fixture;
use serde::Deserialize as _;
use serde_json::Value;

type TestResult = anyhow::Result<()>;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const NAMESPACE: &str = "bucketmap-system";
const RELEASE: &str = "bucketmap";

/// Labels only the chart sets (the standard Helm ones); the kustomize base
/// has none of them.
const HELM_ONLY_LABELS: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// Annotations only Helm sets.
const HELM_ONLY_ANNOTATIONS: &[&str] = &[
    "meta.helm.sh/release-name",
    "meta.helm.sh/release-namespace",
];

fn chart_dir() -> String {
    format!("{ROOT}/deploy/chart/bucketmap")
}

/// Runs a command, failing with its stderr unless it succeeds; returns stdout.
async fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
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

/// The pinned helm binary (built on first use).
async fn helm() -> anyhow::Result<PathBuf> {
    let script = format!("{ROOT}/tools/helm/install.sh");
    let stdout = run(&script, &[]).await?;
    let path = stdout
        .lines()
        .last()
        .context("tools/helm/install.sh printed nothing")?;
    Ok(PathBuf::from(path))
}

/// `helm template` of the chart as `bucketmap` in `bucketmap-system`.
async fn helm_template(helm: &std::path::Path, extra: &[&str]) -> anyhow::Result<String> {
    let helm = helm.to_str().context("helm path is not UTF-8")?;
    let chart = chart_dir();
    let mut args = vec![
        "template",
        RELEASE,
        &chart,
        "--namespace",
        NAMESPACE,
        "--include-crds",
    ];
    args.extend_from_slice(extra);
    run(helm, &args).await
}

/// (kind, namespace, name): what identifies an object.
type Key = (String, String, String);

fn key_str((kind, ns, name): &Key) -> String {
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

/// The objects of a multi-document YAML stream, by key.
fn objects(yaml: &str, source: &str) -> anyhow::Result<BTreeMap<Key, Value>> {
    let mut out = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value =
            Value::deserialize(doc).with_context(|| format!("{source}: invalid YAML document"))?;
        if value.is_null() {
            continue;
        }
        let field = |path: &str| {
            value
                .pointer(path)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let key = (
            field("/kind"),
            field("/metadata/namespace"),
            field("/metadata/name"),
        );
        anyhow::ensure!(
            !key.0.is_empty() && !key.2.is_empty(),
            "{source}: document without kind or metadata.name:\n{value:#}"
        );
        if let Some(previous) = out.insert(key.clone(), value) {
            anyhow::bail!("{source}: {} twice (first: {previous:#})", key_str(&key));
        }
    }
    Ok(out)
}

/// Removes the given keys from the map at `path` in `obj`, and the map too if
/// that leaves it empty.
fn strip(obj: &mut Value, path: &str, keys: &[&str]) {
    let Some(map) = obj.pointer_mut(path).and_then(Value::as_object_mut) else {
        return;
    };
    for key in keys {
        map.remove(*key);
    }
    if map.is_empty() {
        let (parent, last) = path.rsplit_once('/').expect("absolute pointer");
        if let Some(parent) = obj.pointer_mut(parent).and_then(Value::as_object_mut) {
            parent.remove(last);
        }
    }
}

/// What both renderings should agree on: everything but the Namespace and
/// Helm's own labels and annotations.
fn comparable(mut objects: BTreeMap<Key, Value>) -> BTreeMap<Key, Value> {
    objects.retain(|(kind, _, _), _| kind != "Namespace");
    for obj in objects.values_mut() {
        strip(obj, "/metadata/labels", HELM_ONLY_LABELS);
        strip(obj, "/metadata/annotations", HELM_ONLY_ANNOTATIONS);
    }
    objects
}

/// Every place where `a` and `b` differ, as `path: a != b` lines.
fn diff(path: &str, a: &Value, b: &Value, out: &mut String) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = format!("{path}.{k}");
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => diff(&p, x, y, out),
                    (Some(x), None) => out.push_str(&format!("  {p}: only in kustomize: {x}\n")),
                    (None, Some(y)) => out.push_str(&format!("  {p}: only in helm: {y}\n")),
                    (None, None) => unreachable!(),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), x, y, out);
            }
        }
        _ if a == b => {}
        // deploy/crd.yaml writes `minimum: 0.0`; kustomize re-emits it as `0`,
        // helm copies crds/ verbatim. The same number to the API server.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ => out.push_str(&format!("  {path}: kustomize {a} != helm {b}\n")),
    }
}

/// A readable account of how the two renderings differ; empty when equal.
fn compare(kustomize: &BTreeMap<Key, Value>, helm: &BTreeMap<Key, Value>) -> String {
    let mut report = String::new();
    for key in kustomize.keys().filter(|k| !helm.contains_key(*k)) {
        report.push_str(&format!("only in kustomize: {}\n", key_str(key)));
    }
    for key in helm.keys().filter(|k| !kustomize.contains_key(*k)) {
        report.push_str(&format!("only in helm: {}\n", key_str(key)));
    }
    for (key, k) in kustomize {
        if let Some(h) = helm.get(key) {
            let mut d = String::new();
            diff("", k, h, &mut d);
            if !d.is_empty() {
                report.push_str(&format!("{} differs:\n{d}\n", key_str(key)));
            }
        }
    }
    report
}

#[test]
fn the_chart_crd_is_a_copy_of_the_generated_one() -> TestResult {
    let generated = std::fs::read(format!("{ROOT}/deploy/crd.yaml"))?;
    let copy = std::fs::read(format!("{}/crds/gcs.yaml", chart_dir()))?;
    assert!(
        generated == copy,
        "deploy/chart/bucketmap/crds/gcs.yaml differs from deploy/crd.yaml; \
         refresh it with: cp deploy/crd.yaml deploy/chart/bucketmap/crds/gcs.yaml"
    );
    Ok(())
}

#[tokio::test]
async fn the_chart_renders_the_kustomize_base_and_the_api_server_accepts_it() -> TestResult {
    let f = Fixture::new().await?;
    let helm = helm().await?;

    run(
        helm.to_str().context("helm path")?,
        &["lint", "--strict", "--namespace", NAMESPACE, &chart_dir()],
    )
    .await?;

    let rendered = helm_template(&helm, &[]).await?;
    let kustomized = f.kubectl(&["kustomize", &format!("{ROOT}/deploy")]).await?;
    assert!(
        kustomized.status.success(),
        "{}",
        String::from_utf8_lossy(&kustomized.stderr)
    );
    let kustomized = String::from_utf8(kustomized.stdout)?;

    let from_kustomize = comparable(objects(&kustomized, "kubectl kustomize deploy/")?);
    let from_helm = comparable(objects(&rendered, "helm template")?);
    for kind in [
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "MutatingWebhookConfiguration",
    ] {
        assert!(
            from_kustomize.keys().any(|(k, _, _)| k == kind),
            "the kustomize base lacks a {kind}"
        );
    }
    let report = compare(&from_kustomize, &from_helm);
    assert!(
        report.is_empty(),
        "helm template (default values) and kubectl kustomize deploy/ differ:\n{report}"
    );

    // The API server accepts the chart's objects as they are.
    let ns = f.kubectl(&["create", "namespace", NAMESPACE]).await?;
    assert!(
        ns.status.success(),
        "{}",
        String::from_utf8_lossy(&ns.stderr)
    );
    let applied = f
        .kubectl_with_stdin(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--dry-run=server",
                "-f",
                "-",
            ],
            &rendered,
        )
        .await?;
    assert!(
        applied.status.success(),
        "server-side dry run of the chart failed:\n{}{}",
        String::from_utf8_lossy(&applied.stdout),
        String::from_utf8_lossy(&applied.stderr)
    );
    let stdout = String::from_utf8(applied.stdout)?;
    for (kind, _, name) in from_helm.keys() {
        assert!(
            stdout.contains(&format!("/{name} serverside-applied (server dry run)")),
            "the dry run did not apply {kind} {name}:\n{stdout}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_chart_values_change_what_it_renders() -> TestResult {
    let helm = helm().await?;
    let rendered = helm_template(
        &helm,
        &[
            "--set",
            "webhook.enabled=false",
            "--set",
            "defaultProject=my-project",
            "--set",
            "clusterId=prod-europe-west1",
            "--set",
            "serviceAccount.gcpServiceAccount=",
            "--set",
            "image.tag=1.2.3",
            "--set",
            "replicas=3",
            "--set",
            "workloadIdentity.pool=acme.svc.id.goog",
            "--set-string",
            "workloadIdentity.projectNumber=123456789012",
        ],
    )
    .await?;
    let objs = comparable(objects(&rendered, "helm template")?);
    for (kind, _, name) in objs.keys() {
        assert!(
            kind != "Service" && kind != "MutatingWebhookConfiguration",
            "webhook disabled, yet the chart renders {kind} {name}"
        );
    }
    let get = |kind: &str, name: &str| {
        objs.get(&(kind.to_owned(), NAMESPACE.to_owned(), name.to_owned()))
            .with_context(|| format!("no {kind} {name}"))
    };
    let deploy = get("Deployment", "bucketmap-operator")?;
    assert_eq!(deploy.pointer("/spec/replicas"), Some(&Value::from(3)));
    let container = deploy
        .pointer("/spec/template/spec/containers/0")
        .context("no container")?;
    assert_eq!(container["image"], "bucketmap/bucketmap:1.2.3");
    let args = container["args"].to_string();
    assert!(!args.contains("--webhook-addr"), "{args}");
    assert!(
        container["env"].as_array().context("no env")?.contains(
            &serde_json::json!({"name": "BUCKETMAP_DEFAULT_PROJECT", "value": "my-project"})
        ),
        "{container:#}"
    );
    for (name, value) in [
        ("BUCKETMAP_CLUSTER_ID", "prod-europe-west1"),
        ("BUCKETMAP_WORKLOAD_IDENTITY_POOL", "acme.svc.id.goog"),
        ("BUCKETMAP_WORKLOAD_IDENTITY_PROJECT_NUMBER", "123456789012"),
    ] {
        let env = serde_json::json!({"name": name, "value": value});
        assert!(
            container["env"]
                .as_array()
                .context("no env")?
                .contains(&env),
            "{container:#}"
        );
    }
    let sa = get("ServiceAccount", "bucketmap")?;
    assert!(sa.pointer("/metadata/annotations").is_none(), "{sa:#}");
    Ok(())
}

#[tokio::test]
async fn the_chart_refuses_a_cluster_id_that_is_no_label_value() -> TestResult {
    let helm = helm().await?;
    let refused = helm_template(&helm, &["--set", "clusterId=Prod.EU"]).await;
    let message = format!("{:#}", refused.expect_err("an invalid clusterId renders"));
    assert!(message.contains("starting with a letter"), "{message}");
    Ok(())
}
