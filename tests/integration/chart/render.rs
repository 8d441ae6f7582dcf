//! What the chart renders: the kustomize bases' objects with default
//! values, what each value changes, what the schema refuses, and that the
//! API server accepts every rendering.

use std::collections::BTreeMap;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::{
    CRD_NAME, Key, NAMESPACE, ROOT, TestResult, chart_dir, get, helm, helm_template, key_str,
    kubeconfig_arg, kubectl_ok, objects, operator_container, path_str, run, tool,
};

/// Labels only the chart sets (the standard Helm ones); the kustomize bases
/// have none of them.
const HELM_ONLY_LABELS: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// Annotations only Helm sets: its release's, and the CRD's resource policy
/// with Argo CD's equivalent (kubectl has no such policy: deploy/crd/ is a
/// base of its own instead).
const HELM_ONLY_ANNOTATIONS: &[&str] = &[
    "meta.helm.sh/release-name",
    "meta.helm.sh/release-namespace",
    "helm.sh/resource-policy",
    "argocd.argoproj.io/sync-options",
];

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
        // Rolls the operator on `helm upgrade` when the policy changed;
        // kubectl users restart it (deploy/tenancy.yaml says so).
        strip(
            obj,
            "/spec/template/metadata/annotations",
            &["checksum/tenancy"],
        );
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
                    (Some(x), None) => out.push_str(&format!("  {p}: only in the first: {x}\n")),
                    (None, Some(y)) => out.push_str(&format!("  {p}: only in the second: {y}\n")),
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
        // The generated CRD writes `minimum: 0.0`; kustomize and helm's
        // fromYaml re-emit it as `0`. The same number to the API server.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ => out.push_str(&format!("  {path}: {a} != {b}\n")),
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
                report.push_str(&format!(
                    "{} differs (first kustomize, second helm):\n{d}\n",
                    key_str(key)
                ));
            }
        }
    }
    report
}

/// `kubectl kustomize` of a base under `deploy/` (no cluster needed).
async fn kustomize(base: &str) -> anyhow::Result<String> {
    run("kubectl", &["kustomize", &format!("{ROOT}/{base}")]).await
}

#[test]
fn the_chart_crd_is_a_copy_of_the_generated_one() -> TestResult {
    let generated = std::fs::read(format!("{ROOT}/deploy/crd/crd.yaml"))?;
    let copy = std::fs::read(format!("{}/files/crd.yaml", chart_dir()))?;
    assert!(
        generated == copy,
        "deploy/chart/bucketmap/files/crd.yaml differs from deploy/crd/crd.yaml; \
         regenerate both with: cargo dev crd"
    );
    Ok(())
}

#[tokio::test]
async fn the_crd_template_renders_the_generated_crd_kept_on_uninstall() -> TestResult {
    let helm = helm().await?;
    let file: Value = serde_yaml::from_str(&std::fs::read_to_string(format!(
        "{}/files/crd.yaml",
        chart_dir()
    ))?)?;

    let objs = objects(&helm_template(&helm, &[]).await?, "helm template")?;
    let crd = get(&objs, "CustomResourceDefinition", CRD_NAME)?;
    let mut d = String::new();
    diff("", &file["spec"], &crd["spec"], &mut d);
    assert!(
        d.is_empty(),
        "the rendered CRD's spec is not the file's:\n{d}"
    );
    assert_eq!(
        crd.pointer("/metadata/annotations/helm.sh~1resource-policy"),
        Some(&json!("keep")),
        "{:#}",
        crd["metadata"]
    );
    // Argo CD applies the rendering itself: it keeps the CRD on the
    // Application's deletion and when the CRD leaves the rendering.
    assert_eq!(
        crd.pointer("/metadata/annotations/argocd.argoproj.io~1sync-options"),
        Some(&json!("Delete=false,Prune=false")),
        "{:#}",
        crd["metadata"]
    );
    for (label, value) in file["metadata"]["labels"]
        .as_object()
        .context("the generated CRD has no labels")?
    {
        assert_eq!(
            crd["metadata"]["labels"].get(label),
            Some(value),
            "the generated CRD's label {label} is lost"
        );
    }

    let not_kept = objects(
        &helm_template(&helm, &["--set", "crds.keep=false"]).await?,
        "helm template --set crds.keep=false",
    )?;
    let crd = get(&not_kept, "CustomResourceDefinition", CRD_NAME)?;
    assert!(
        crd.pointer("/metadata/annotations").is_none(),
        "{:#}",
        crd["metadata"]
    );

    let off = objects(
        &helm_template(&helm, &["--set", "crds.enabled=false"]).await?,
        "helm template --set crds.enabled=false",
    )?;
    assert!(
        !off.keys()
            .any(|(kind, _, _)| kind == "CustomResourceDefinition"),
        "crds.enabled=false, yet the chart renders a CRD"
    );
    assert!(
        get(&off, "Deployment", "bucketmap-operator").is_ok(),
        "crds.enabled=false renders no operator"
    );
    Ok(())
}

#[tokio::test]
async fn the_chart_defaults_render_the_kustomize_bases() -> TestResult {
    let helm = helm().await?;
    run(
        path_str(&helm)?,
        &["lint", "--strict", "--namespace", NAMESPACE, &chart_dir()],
    )
    .await?;

    let rendered = helm_template(&helm, &[]).await?;
    let crd_base = kustomize("deploy/crd").await?;
    let operator_base = kustomize("deploy").await?;

    // The CRD and the namespace are in deploy/crd/ only, so that
    // `kubectl delete -k deploy/` leaves them.
    let crd_objs = objects(&crd_base, "kubectl kustomize deploy/crd/")?;
    let operator_objs = objects(&operator_base, "kubectl kustomize deploy/")?;
    let crd_kinds: Vec<&str> = crd_objs.keys().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(crd_kinds, ["CustomResourceDefinition", "Namespace"]);
    for (kind, _, name) in operator_objs.keys() {
        assert!(
            kind != "CustomResourceDefinition" && kind != "Namespace",
            "deploy/ holds {kind} {name}: `kubectl delete -k deploy/` would delete it"
        );
    }

    let from_kustomize = comparable(objects(
        &format!("{crd_base}\n---\n{operator_base}"),
        "kubectl kustomize deploy/crd/ and deploy/",
    )?);
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
            "the kustomize bases lack a {kind}"
        );
    }
    let report = compare(&from_kustomize, &from_helm);
    assert!(
        report.is_empty(),
        "helm template (default values) and kubectl kustomize deploy/crd/ deploy/ differ:\n{report}"
    );
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
            "--set-json",
            r#"tenancy.rules=[{"name":"team-a","namespaces":["team-a-*"],"projects":["a-prod"],"maxBucketsPerNamespace":5}]"#,
            "--set-json",
            r#"affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["system"]}]}]}}}"#,
        ],
    )
    .await?;
    let objs = objects(&rendered, "helm template")?;
    for (kind, _, name) in objs.keys() {
        assert!(
            kind != "Service" && kind != "MutatingWebhookConfiguration",
            "webhook disabled, yet the chart renders {kind} {name}"
        );
    }
    let deploy = get(&objs, "Deployment", "bucketmap-operator")?;
    assert_eq!(deploy.pointer("/spec/replicas"), Some(&Value::from(3)));
    // An affinity given replaces the default one whole.
    assert_eq!(
        deploy.pointer("/spec/template/spec/affinity"),
        Some(
            &json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions":
                [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}})
        ),
    );
    let container = operator_container(&objs)?;
    assert_eq!(container["image"], "bucketmap/bucketmap:1.2.3");
    let args = container["args"].to_string();
    assert!(!args.contains("--webhook-addr"), "{args}");
    let ports = container["ports"].to_string();
    assert!(!ports.contains("webhook"), "{ports}");
    for (name, value) in [
        ("BUCKETMAP_DEFAULT_PROJECT", "my-project"),
        ("BUCKETMAP_CLUSTER_ID", "prod-europe-west1"),
        ("BUCKETMAP_WORKLOAD_IDENTITY_POOL", "acme.svc.id.goog"),
        ("BUCKETMAP_WORKLOAD_IDENTITY_PROJECT_NUMBER", "123456789012"),
    ] {
        let env = json!({"name": name, "value": value});
        assert!(
            container["env"]
                .as_array()
                .context("no env")?
                .contains(&env),
            "{container:#}"
        );
    }
    let policy = get(&objs, "ConfigMap", "bucketmap-tenancy")?["data"]["policy.yaml"]
        .as_str()
        .context("no policy.yaml in the tenancy ConfigMap")?
        .to_owned();
    let policy: bucketmap::tenancy::Policy = serde_yaml::from_str(&policy)?;
    let rule = policy.rules.first().context("no rule rendered")?;
    assert_eq!(
        (
            rule.name.as_deref(),
            &rule.namespaces,
            &rule.projects,
            rule.max_buckets_per_namespace
        ),
        (
            Some("team-a"),
            &vec!["team-a-*".to_owned()],
            &vec!["a-prod".to_owned()],
            Some(5)
        )
    );
    let sa = get(&objs, "ServiceAccount", "bucketmap")?;
    assert!(sa.pointer("/metadata/annotations").is_none(), "{sa:#}");
    get(&objs, "PodDisruptionBudget", "bucketmap-operator")?;

    // A single replica gets no budget, which would block node drains.
    let single = objects(
        &helm_template(&helm, &["--set", "replicas=1"]).await?,
        "helm template --set replicas=1",
    )?;
    assert!(
        get(&single, "PodDisruptionBudget", "bucketmap-operator").is_err(),
        "one replica, yet a PodDisruptionBudget"
    );
    assert_eq!(
        get(&single, "Deployment", "bucketmap-operator")?["spec"]["replicas"],
        1
    );
    Ok(())
}

#[tokio::test]
async fn the_default_affinity_prefers_other_nodes_and_zones_without_requiring_them() -> TestResult {
    let helm = helm().await?;
    let objs = objects(&helm_template(&helm, &[]).await?, "helm template")?;
    let deploy = get(&objs, "Deployment", "bucketmap-operator")?;
    let affinity = deploy
        .pointer("/spec/template/spec/affinity")
        .context("no affinity")?;
    let anti = affinity
        .get("podAntiAffinity")
        .context("no podAntiAffinity")?;
    assert!(
        anti.get("requiredDuringSchedulingIgnoredDuringExecution")
            .is_none()
            && affinity.get("nodeAffinity").is_none(),
        "a required term would leave replicas of a single-node cluster pending: {affinity:#}"
    );
    let preferred = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .context("no preferred terms")?;
    let selector = &deploy["spec"]["selector"]["matchLabels"];
    let keys: Vec<&str> = preferred
        .iter()
        .map(|t| {
            assert_eq!(
                &t["podAffinityTerm"]["labelSelector"]["matchLabels"], selector,
                "a term that does not select the operator's own pods: {t:#}"
            );
            t["podAffinityTerm"]["topologyKey"].as_str().unwrap_or("")
        })
        .collect();
    assert_eq!(
        keys,
        ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    );
    Ok(())
}

#[tokio::test]
async fn the_schema_refuses_unknown_and_mistyped_values() -> TestResult {
    let helm = helm().await?;
    // Each refused value, with the same value spelled right as the control:
    // the refusal comes from the mistake, not from the value being set.
    let cases: &[(&[&str], &[&str], &str)] = &[
        (
            &["--set", "imag.tag=1.2.3"],
            &["--set", "image.tag=1.2.3"],
            "imag",
        ),
        (
            &["--set", "serviceMonitor.enabeld=true"],
            &["--set", "serviceMonitor.enabled=true"],
            "enabeld",
        ),
        (
            &["--set", "webhook.port=443"],
            &["--set", "webhook.port=8443"],
            "webhook",
        ),
        (
            &["--set", "webhook.port=ten"],
            &["--set", "webhook.port=10250"],
            "webhook",
        ),
        (
            &["--set", "sidecar.image.digest=latest"],
            &[
                "--set",
                "sidecar.image.digest=sha256:0000000000000000000000000000000000000000000000000000000000000000",
            ],
            "digest",
        ),
        (
            &["--set", "crds.keep=maybe"],
            &["--set", "crds.keep=false"],
            "keep",
        ),
        (
            &["--set", "image.pullPolicy=Sometimes"],
            &["--set", "image.pullPolicy=IfNotPresent"],
            "pullPolicy",
        ),
        (
            &["--set", "watchNamespaces={Team_A}"],
            &["--set", "watchNamespaces={team-a}"],
            "watchNamespaces",
        ),
        (
            &["--set", "tenancy.rules[0].project=a-prod"],
            &["--set", "tenancy.rules[0].projects={a-prod}"],
            "project",
        ),
        (
            &["--set", "tenancy.rules[0].storageClasses={COLD}"],
            &["--set", "tenancy.rules[0].storageClasses={COLDLINE}"],
            "storageClasses",
        ),
        (
            &["--set", "imagePullSecrets[0].nam=registry"],
            &["--set", "imagePullSecrets[0].name=registry"],
            "nam",
        ),
        (
            &["--set", "podDisruptionBudget.minAvailable=half"],
            &["--set", "podDisruptionBudget.minAvailable=50%"],
            "minAvailable",
        ),
        (
            &["--set", "serviceMonitor.interval=30"],
            &["--set", "serviceMonitor.interval=30s"],
            "interval",
        ),
        (
            &["--set", "resources.requests.cpu=lots"],
            &["--set", "resources.requests.cpu=250m"],
            "cpu",
        ),
        (
            &["--set", "workloadIdentity.projectNumber=0"],
            &["--set", "workloadIdentity.projectNumber=123456789012"],
            "projectNumber",
        ),
    ];
    for (refused, accepted, names) in cases {
        let error = helm_template(&helm, refused)
            .await
            .expect_err(&format!("{refused:?} renders"));
        let message = format!("{error:#}");
        assert!(
            message.contains("schema") && message.contains(names),
            "{refused:?}: the refusal does not name the schema and {names}:\n{message}"
        );
        helm_template(&helm, accepted)
            .await
            .with_context(|| format!("the control {accepted:?} is refused"))?;
    }
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

/// Values that turn on every optional object and scheduling setting.
const EVERYTHING: &str = r#"
image:
  digest: sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
sidecar:
  image:
    repository: registry.example/platform/bucketmap
    tag: "9.9.9"
    digest: sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
imagePullSecrets: [{name: registry}]
priorityClassName: bucketmap-critical
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: platform, effect: NoSchedule}]
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels: {app.kubernetes.io/name: bucketmap, app.kubernetes.io/component: operator}
podAnnotations: {example.com/team: platform}
podLabels: {example.com/cost-center: storage}
webhook: {port: 8443}
clusterId: prod-europe-west1
defaultProject: my-project
serviceMonitor: {enabled: true, labels: {release: kube-prometheus-stack}}
podMonitoring: {enabled: true}
prometheusRule: {enabled: true}
clusterRules: {enabled: true}
grafanaDashboard: {enabled: true}
"#;

/// What the everything-on rendering must hold.
fn check_everything(objs: &BTreeMap<Key, Value>) -> TestResult {
    for (kind, name) in [
        ("Service", "bucketmap-metrics"),
        ("ServiceMonitor", "bucketmap"),
        ("PodMonitor", "bucketmap-sidecars"),
        ("PodMonitoring", "bucketmap"),
        ("ClusterPodMonitoring", "bucketmap-sidecars"),
        ("PrometheusRule", "bucketmap"),
        ("ClusterRules", "bucketmap"),
        ("ConfigMap", "bucketmap-dashboard"),
    ] {
        get(objs, kind, name)?;
    }
    let monitor = get(objs, "ServiceMonitor", "bucketmap")?;
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    // The ServiceMonitor selects the metrics Service, not the webhook's.
    let metrics = get(objs, "Service", "bucketmap-metrics")?;
    for (label, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("no ServiceMonitor selector")?
    {
        assert_eq!(
            metrics["metadata"]["labels"].get(label),
            Some(value),
            "{label}"
        );
    }
    // The sidecar monitors select injected pods by the label the webhook
    // selects them by, on the admin port it gives them.
    for (kind, endpoints) in [
        ("PodMonitor", "podMetricsEndpoints"),
        ("ClusterPodMonitoring", "endpoints"),
    ] {
        let monitor = get(objs, kind, "bucketmap-sidecars")?;
        assert_eq!(
            monitor["spec"]["selector"]["matchLabels"],
            json!({(bucketmap::webhook::inject::INJECT_LABEL): "true"}),
            "{kind}"
        );
        assert_eq!(
            monitor["spec"][endpoints][0]["port"],
            bucketmap::webhook::inject::ADMIN_PORT_NAME,
            "{kind}"
        );
    }
    // GKE's ClusterRules carries the PrometheusRule's alerts, unchanged.
    let groups = &get(objs, "PrometheusRule", "bucketmap")?["spec"]["groups"];
    assert!(
        groups.as_array().is_some_and(|g| !g.is_empty()),
        "{groups:#}"
    );
    assert_eq!(
        &get(objs, "ClusterRules", "bucketmap")?["spec"]["groups"],
        groups
    );
    let webhook_svc = get(objs, "Service", "bucketmap-webhook")?;
    assert_ne!(
        webhook_svc["metadata"]["labels"].get("app.kubernetes.io/component"),
        Some(&json!("metrics"))
    );
    assert_eq!(
        webhook_svc["spec"]["ports"],
        json!([{"name": "webhook", "port": 443, "targetPort": "webhook"}])
    );

    let deploy = get(objs, "Deployment", "bucketmap-operator")?;
    let pod = &deploy["spec"]["template"];
    assert_eq!(
        pod["spec"]["imagePullSecrets"],
        json!([{"name": "registry"}])
    );
    assert_eq!(pod["spec"]["priorityClassName"], "bucketmap-critical");
    assert_eq!(
        pod["spec"]["nodeSelector"],
        json!({"kubernetes.io/os": "linux"})
    );
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "dedicated");
    assert_eq!(
        pod["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"],
        "ScheduleAnyway"
    );
    assert!(pod["spec"]["affinity"]["podAntiAffinity"].is_object());
    assert_eq!(
        pod["metadata"]["annotations"]["example.com/team"],
        "platform"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    assert_eq!(
        pod["metadata"]["labels"]["example.com/cost-center"],
        "storage"
    );
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/component"],
        "operator"
    );

    let container = operator_container(objs)?;
    assert_eq!(
        container["image"],
        "bucketmap/bucketmap:0.1.0@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    );
    let sidecar_image = json!({"name": "BUCKETMAP_SIDECAR_IMAGE", "value":
        "registry.example/platform/bucketmap:9.9.9@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"});
    assert!(
        container["env"]
            .as_array()
            .context("no env")?
            .contains(&sidecar_image),
        "{container:#}"
    );
    let args = container["args"].as_array().context("no args")?;
    assert!(
        args.contains(&json!("--webhook-addr=0.0.0.0:8443")),
        "{args:?}"
    );
    assert!(
        container["ports"]
            .as_array()
            .context("no ports")?
            .contains(&json!({"name": "webhook", "containerPort": 8443})),
        "{container:#}"
    );
    let dashboard = get(objs, "ConfigMap", "bucketmap-dashboard")?;
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped = std::fs::read_to_string(format!("{}/dashboards/bucketmap.json", chart_dir()))?;
    let in_map = dashboard["data"]["bucketmap.json"]
        .as_str()
        .context("no bucketmap.json in the dashboard ConfigMap")?;
    assert_eq!(in_map.trim(), shipped.trim());
    Ok(())
}

/// What the webhook-off rendering must hold.
fn check_webhook_off(objs: &BTreeMap<Key, Value>) -> TestResult {
    for (kind, _, name) in objs.keys() {
        assert!(
            kind != "MutatingWebhookConfiguration" && name != "bucketmap-webhook",
            "webhook.enabled=false, yet {kind} {name}"
        );
    }
    let container = operator_container(objs)?;
    assert!(
        !container["args"].to_string().contains("--webhook-addr"),
        "{container:#}"
    );
    Ok(())
}

/// What the default rendering must hold: the webhook on port 10250 behind
/// the Service's 443, and the CRD.
fn check_defaults(objs: &BTreeMap<Key, Value>) -> TestResult {
    get(objs, "CustomResourceDefinition", CRD_NAME)?;
    let container = operator_container(objs)?;
    let args = container["args"].as_array().context("no args")?;
    assert!(
        args.contains(&json!("--webhook-addr=0.0.0.0:10250")),
        "{args:?}"
    );
    assert!(
        container["ports"]
            .as_array()
            .context("no ports")?
            .contains(&json!({"name": "webhook", "containerPort": 10250})),
        "{container:#}"
    );
    for kind in [
        "ServiceMonitor",
        "PodMonitor",
        "PodMonitoring",
        "ClusterPodMonitoring",
        "PrometheusRule",
        "ClusterRules",
    ] {
        assert!(
            !objs.keys().any(|(k, _, _)| k == kind),
            "{kind} rendered by default"
        );
    }
    Ok(())
}

type Check = fn(&BTreeMap<Key, Value>) -> TestResult;

#[tokio::test]
async fn every_value_combination_renders_objects_the_api_server_accepts() -> TestResult {
    let helm = helm().await?;
    let env = bucketmap_testkit::testenv::TestEnv::start().await?;
    let kubeconfig = kubeconfig_arg(&env)?;

    // The monitoring CRDs, from their pinned sources, so that the API server
    // validates the ServiceMonitor, PodMonitoring and PrometheusRule too.
    let crds = tool("tools/monitoring-crds/install.sh").await?;
    let crds = path_str(&crds)?;
    kubectl_ok(&kubeconfig, &["apply", "--server-side", "-f", crds], "").await?;
    for crd in [
        "servicemonitors.monitoring.coreos.com",
        "podmonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
        "podmonitorings.monitoring.googleapis.com",
        "clusterpodmonitorings.monitoring.googleapis.com",
        "clusterrules.monitoring.googleapis.com",
    ] {
        kubectl_ok(
            &kubeconfig,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=120s",
                &format!("crd/{crd}"),
            ],
            "",
        )
        .await?;
    }
    kubectl_ok(&kubeconfig, &["create", "namespace", NAMESPACE], "").await?;

    let dir = tempfile::tempdir()?;
    let everything = dir.path().join("everything.yaml");
    std::fs::write(&everything, EVERYTHING)?;
    let everything = path_str(&everything)?;
    let gitops = super::gitops::write_example_values(dir.path())?;
    let combinations: [(&str, Vec<&str>, Check); 5] = [
        ("defaults", vec![], check_defaults),
        (
            "everything enabled",
            vec!["-f", everything],
            check_everything,
        ),
        (
            "webhook off",
            vec!["--set", "webhook.enabled=false"],
            check_webhook_off,
        ),
        ("CRDs off", vec!["--set", "crds.enabled=false"], |objs| {
            assert!(
                !objs.keys().any(|(k, _, _)| k == "CustomResourceDefinition"),
                "crds.enabled=false, yet a CRD"
            );
            Ok(())
        }),
        (
            "the GitOps examples' values (examples/gitops/)",
            vec!["-f", &gitops],
            |objs| {
                get(objs, "ServiceMonitor", "bucketmap")?;
                get(objs, "PrometheusRule", "bucketmap")?;
                Ok(())
            },
        ),
    ];
    for (what, values, check) in &combinations {
        let mut lint = vec!["lint", "--strict", "--namespace", NAMESPACE];
        lint.extend_from_slice(values);
        let chart = chart_dir();
        lint.push(&chart);
        run(path_str(&helm)?, &lint)
            .await
            .with_context(|| format!("helm lint, {what}"))?;
        let rendered = helm_template(&helm, values).await?;
        let objs = objects(&rendered, what)?;
        check(&objs).with_context(|| format!("rendering with {what}"))?;

        let applied = kubectl_ok(
            &kubeconfig,
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            &rendered,
        )
        .await
        .with_context(|| format!("server-side dry run, {what}"))?;
        let lines: Vec<&str> = applied
            .lines()
            .filter(|l| l.ends_with(" serverside-applied (server dry run)"))
            .collect();
        assert_eq!(
            lines.len(),
            objs.len(),
            "{what}: the dry run applied other than every object:\n{applied}"
        );
        for (kind, _, name) in objs.keys() {
            let resource = kind.to_ascii_lowercase();
            assert!(
                lines.iter().any(|l| l.starts_with(&resource)
                    && l.contains(&format!("/{name} serverside-applied"))),
                "{what}: the dry run did not apply {kind} {name}:\n{applied}"
            );
        }
    }
    Ok(())
}
