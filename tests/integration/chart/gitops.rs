//! What a GitOps tool needs of the chart: the same values render the same
//! bytes every time (so that a sync shows no drift), and the Argo CD and
//! Flux examples in `examples/gitops/` carry values the chart installs.

use anyhow::Context as _;
use serde::Deserialize as _;
use serde_json::Value;

use super::{
    NAMESPACE, RELEASE, ROOT, TestResult, chart_dir, get, helm, helm_template, objects,
    operator_container, path_str,
};

/// Template functions whose result changes from one rendering to the next
/// (random values, generated keys and certificates, the clock) or depends
/// on the cluster (`lookup`, empty under `helm template`, which Argo CD
/// renders with).
const UNSTABLE_FUNCTIONS: &[&str] = &[
    "randAlphaNum",
    "randAlpha",
    "randNumeric",
    "randAscii",
    "randBytes",
    "randInt",
    "uuidv4",
    "shuffle",
    "derivePassword",
    "genCA",
    "genCAWithKey",
    "genPrivateKey",
    "genSelfSignedCert",
    "genSelfSignedCertWithKey",
    "genSignedCert",
    "genSignedCertWithKey",
    "now",
    "date",
    "dateInZone",
    "unixEpoch",
    "lookup",
];

/// `code` with its string literals ("..." and `...`) left out.
fn without_strings(code: &str) -> String {
    let mut out = String::new();
    let mut quote = None;
    let mut escaped = false;
    for c in code.chars() {
        match quote {
            None if c == '"' || c == '`' => quote = Some(c),
            None => out.push(c),
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
        }
    }
    out
}

/// The identifiers of a template's actions (`{{ ... }}`), comments and
/// string literals left out.
fn action_words(template: &str) -> Vec<String> {
    let mut words = Vec::new();
    for action in template.split("{{").skip(1) {
        let action = action.split("}}").next().unwrap_or_default();
        let code = action.trim_start_matches('-').trim_start();
        if code.starts_with("/*") {
            continue;
        }
        words.extend(
            without_strings(code)
                .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .filter(|w| !w.is_empty())
                .map(str::to_owned),
        );
    }
    words
}

#[test]
fn no_template_calls_a_function_whose_result_changes_between_renderings() -> TestResult {
    let dir = format!("{}/templates", chart_dir());
    let mut read = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        read += 1;
        let words = action_words(&text);
        for function in UNSTABLE_FUNCTIONS {
            assert!(
                !words.iter().any(|w| w == function),
                "{} calls {function}: two renderings of the same values would differ",
                path.display()
            );
        }
    }
    assert!(read >= 5, "read only {read} templates in {dir}");
    // The control: the scan finds such a call.
    assert!(action_words("x: {{ randAlphaNum 8 | quote }}").contains(&"randAlphaNum".to_owned()));
    assert!(!action_words("{{/* lookup */}}").contains(&"lookup".to_owned()));
    assert!(!action_words(r#"{{ fail "not now" }}"#).contains(&"now".to_owned()));
    Ok(())
}

/// Values that print something from every template, maps with several
/// keys included.
const MANY: &str = "\
workloadIdentity: {pool: acme.svc.id.goog, projectNumber: 123456789012}
clusterId: prod-europe-west1
podAnnotations: {b.example.com/x: one, a.example.com/y: two, c: three}
podLabels: {team: platform, cost-center: storage}
nodeSelector: {pool: system, kubernetes.io/os: linux}
resources: {requests: {memory: 128Mi, cpu: 100m}, limits: {memory: 256Mi, cpu: 1}}
tenancy:
  rules:
    - {name: b, namespaces: [b-*], projects: [b-prod], maxBucketsPerNamespace: 20}
    - {name: a, namespaces: [a-*], projects: [a-prod], allowForceDestroy: false}
serviceMonitor: {enabled: true, labels: {release: kps, team: platform}}
podMonitoring: {enabled: true}
prometheusRule: {enabled: true, labels: {release: kps}}
clusterRules: {enabled: true}
grafanaDashboard: {enabled: true}
watchNamespaces: [team-b, team-a]
";

/// `MANY` with the keys of every map in another order.
const MANY_REORDERED: &str = "\
watchNamespaces: [team-b, team-a]
grafanaDashboard: {enabled: true}
clusterRules: {enabled: true}
prometheusRule: {labels: {release: kps}, enabled: true}
podMonitoring: {enabled: true}
serviceMonitor: {labels: {team: platform, release: kps}, enabled: true}
tenancy:
  rules:
    - {maxBucketsPerNamespace: 20, projects: [b-prod], namespaces: [b-*], name: b}
    - {allowForceDestroy: false, projects: [a-prod], namespaces: [a-*], name: a}
resources: {limits: {cpu: 1, memory: 256Mi}, requests: {cpu: 100m, memory: 128Mi}}
nodeSelector: {kubernetes.io/os: linux, pool: system}
podLabels: {cost-center: storage, team: platform}
podAnnotations: {c: three, a.example.com/y: two, b.example.com/x: one}
clusterId: prod-europe-west1
workloadIdentity: {projectNumber: 123456789012, pool: acme.svc.id.goog}
";

#[tokio::test]
async fn the_same_values_render_the_same_bytes() -> TestResult {
    let helm = helm().await?;
    let dir = tempfile::tempdir()?;
    let many = dir.path().join("many.yaml");
    std::fs::write(&many, MANY)?;
    let reordered = dir.path().join("reordered.yaml");
    std::fs::write(&reordered, MANY_REORDERED)?;
    let a: Value = serde_yaml::from_str(MANY)?;
    let b: Value = serde_yaml::from_str(MANY_REORDERED)?;
    assert_eq!(a, b, "the two values files should hold the same values");

    let first = helm_template(&helm, &["-f", path_str(&many)?]).await?;
    let objs = objects(&first, "many")?;
    assert!(objs.len() >= 20, "rendered only {} objects", objs.len());
    for _ in 0..2 {
        let again = helm_template(&helm, &["-f", path_str(&many)?]).await?;
        assert!(again == first, "two renderings of the same values differ");
    }
    let other_order = helm_template(&helm, &["-f", path_str(&reordered)?]).await?;
    assert!(
        other_order == first,
        "the same values in another order render other bytes"
    );
    Ok(())
}

/// A YAML file of `examples/gitops/`, document by document.
fn example_documents(name: &str) -> anyhow::Result<Vec<Value>> {
    let path = format!("{ROOT}/examples/gitops/{name}");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).with_context(|| format!("{path}: invalid YAML")))
        .collect()
}

/// The one document of `kind` in an example.
fn example_of_kind(name: &str, kind: &str) -> anyhow::Result<Value> {
    let mut found: Vec<Value> = example_documents(name)?
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    anyhow::ensure!(found.len() == 1, "{name}: {} {kind}s", found.len());
    Ok(found.remove(0))
}

/// The values the Argo CD example carries, after checking that the Flux
/// example carries the same and that both install this chart as the
/// release `bucketmap` in `bucketmap-system`.
pub(super) fn example_values() -> anyhow::Result<Value> {
    let app = example_of_kind("argocd-application.yaml", "Application")?;
    let source = &app["spec"]["source"];
    anyhow::ensure!(
        source["path"] == "deploy/chart/bucketmap"
            && source["helm"]["releaseName"] == RELEASE
            && app["spec"]["destination"]["namespace"] == NAMESPACE,
        "the Argo CD example installs something else: {app:#}"
    );
    let release = example_of_kind("flux-helmrelease.yaml", "HelmRelease")?;
    let spec = &release["spec"];
    anyhow::ensure!(
        spec["chart"]["spec"]["chart"] == "./deploy/chart/bucketmap"
            && spec["releaseName"] == RELEASE
            && spec["targetNamespace"] == NAMESPACE,
        "the Flux example installs something else: {release:#}"
    );
    let repository = example_of_kind("flux-helmrelease.yaml", "GitRepository")?;
    anyhow::ensure!(
        spec["chart"]["spec"]["sourceRef"]["name"] == repository["metadata"]["name"]
            && repository["spec"]["url"] == source["repoURL"],
        "the Flux example's chart comes from another repository: {repository:#}"
    );
    let values = source["helm"]["valuesObject"].clone();
    anyhow::ensure!(
        values.is_object() && spec["values"] == values,
        "the Argo CD and Flux examples carry other values:\n{values:#}\n{:#}",
        spec["values"]
    );
    Ok(values)
}

/// The examples' values written as the values file a GitOps tool hands helm.
pub(super) fn write_example_values(dir: &std::path::Path) -> anyhow::Result<String> {
    let path = dir.join("gitops-values.yaml");
    std::fs::write(&path, serde_yaml::to_string(&example_values()?)?)?;
    Ok(path_str(&path)?.to_owned())
}

#[tokio::test]
async fn the_gitops_examples_values_render_the_project_number_exactly() -> TestResult {
    let helm = helm().await?;
    let dir = tempfile::tempdir()?;
    let values = write_example_values(dir.path())?;
    let text = std::fs::read_to_string(&values)?;
    assert!(
        text.contains("projectNumber: 123456789012\n"),
        "the examples should carry the project number unquoted:\n{text}"
    );
    let objs = objects(&helm_template(&helm, &["-f", &values]).await?, "gitops")?;
    let env = &operator_container(&objs)?["env"];
    assert!(
        env.as_array()
            .context("no env")?
            .contains(&serde_json::json!(
                {"name": "BUCKETMAP_WORKLOAD_IDENTITY_PROJECT_NUMBER", "value": "123456789012"}
            )),
        "{env:#}"
    );
    let deploy = get(&objs, "Deployment", "bucketmap-operator")?;
    assert_eq!(deploy["spec"]["replicas"], 3);
    Ok(())
}
