//! `deploy/chart/bucketmap`, the Helm chart, and the kustomize bases in
//! `deploy/crd/` and `deploy/`:
//!
//! - `render`: with default values the chart renders the same install as
//!   the kustomize bases (minus the Namespace, which `helm install
//!   --create-namespace` makes); its values change what it renders, its
//!   schema refuses what it does not know, and the API server accepts every
//!   rendering (server-side dry run, with the monitoring CRDs installed);
//! - `forms`: every value renders the same from a values file, `--set`,
//!   `--set-string` and `--set-json`, or the schema refuses the form and
//!   says why;
//! - `gitops`: the same values render the same bytes every time, and the
//!   Argo CD and Flux examples carry values the chart installs;
//! - `lifecycle`: an upgrade from the previous chart version, uninstall and
//!   reinstall keep the CRD and every `Gcs` (their uids do not change), also
//!   when the values go through a file and `helm get values`, and the
//!   webhooks' failure policies behave as documented while no replica
//!   serves them;
//! - `monitoring`: the alerts and the dashboard use metrics the code
//!   exports, and every alert's runbook exists.
//!
//! helm itself is built from the pinned Go module in `tools/helm/`
//! (`tools/helm/install.sh`; set `HELM_BIN` to use another binary); the
//! monitoring CRDs come from `tools/monitoring-crds/install.sh`.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

mod forms;
mod gitops;
mod lifecycle;
mod monitoring;
mod render;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Deserialize as _;
use serde_json::Value;
// `kubectl --kubeconfig K args…` with `stdin`; the output, whatever the status.
use crate::common::kubectl::kubectl_with_stdin as kubectl;

type TestResult = anyhow::Result<()>;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const NAMESPACE: &str = "bucketmap-system";
const RELEASE: &str = "bucketmap";
const CRD_NAME: &str = "gcs.storage.bucketmap.dev";

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
        "{program} {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The last line a `tools/*/install.sh` printed: the path it provides.
async fn tool(script: &str) -> anyhow::Result<PathBuf> {
    let script = format!("{ROOT}/{script}");
    let stdout = run("bash", &[&script]).await?;
    let path = stdout
        .lines()
        .last()
        .with_context(|| format!("{script} printed nothing"))?;
    Ok(PathBuf::from(path))
}

/// The pinned helm binary (built on first use).
async fn helm() -> anyhow::Result<PathBuf> {
    tool("tools/helm/install.sh").await
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

/// `helm template` of `chart` as `bucketmap` in `bucketmap-system`, for a
/// cluster of the chart's minimum Kubernetes version (`helm template` has no
/// cluster to ask).
async fn helm_template_of(helm: &Path, chart: &str, extra: &[&str]) -> anyhow::Result<String> {
    let mut args = vec![
        "template",
        RELEASE,
        chart,
        "--namespace",
        NAMESPACE,
        "--kube-version",
        "1.29.0",
    ];
    args.extend_from_slice(extra);
    run(path_str(helm)?, &args).await
}

/// `helm template` of this chart.
async fn helm_template(helm: &Path, extra: &[&str]) -> anyhow::Result<String> {
    helm_template_of(helm, &chart_dir(), extra).await
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

/// The object of `kind` named `name` (in the release's namespace unless
/// cluster-scoped), or an error naming what was rendered.
fn get<'a>(objs: &'a BTreeMap<Key, Value>, kind: &str, name: &str) -> anyhow::Result<&'a Value> {
    objs.iter()
        .find(|((k, ns, n), _)| k == kind && n == name && (ns.is_empty() || ns == NAMESPACE))
        .map(|(_, v)| v)
        .with_context(|| {
            format!(
                "no {kind} {name}; rendered: {:?}",
                objs.keys().map(key_str).collect::<Vec<_>>()
            )
        })
}

/// The operator's container in the rendered Deployment.
fn operator_container(objs: &BTreeMap<Key, Value>) -> anyhow::Result<&Value> {
    get(objs, "Deployment", "bucketmap-operator")?
        .pointer("/spec/template/spec/containers/0")
        .context("the Deployment has no container")
}

/// A kubeconfig's path as an argument.
fn kubeconfig_arg(env: &bucketmap_testkit::testenv::TestEnv) -> anyhow::Result<String> {
    Ok(path_str(env.kubeconfig_path())?.to_owned())
}

/// Like [`kubectl`], failing unless it succeeds; its stdout.
async fn kubectl_ok(kubeconfig: &str, args: &[&str], stdin: &str) -> anyhow::Result<String> {
    let out = kubectl(kubeconfig, args, stdin).await?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}
