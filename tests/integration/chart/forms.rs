//! Values render the same whatever their source. A values file (and with
//! it Argo CD, Flux and `helm get values`) and `--set-json` hand the
//! templates every number as a float64, `--set` as an int64,
//! `--set-string` as a string: for every value of the schema, `helm
//! template` with a values file and with each command-line form prints
//! the same bytes, or the schema refuses the form and says so (the
//! README's table of value forms).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::{
    CRD_NAME, Key, TestResult, chart_dir, get, helm, helm_template, objects, operator_container,
    path_str,
};

type Objs = BTreeMap<Key, Value>;

/// The first line of helm's refusal of values the schema does not admit.
pub(super) const SCHEMA_REFUSAL: &str =
    "values don't meet the specifications of the schema(s) in the following chart(s)";

/// A command-line form of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Set,
    SetString,
    SetJson,
}

const FORMS: [Form; 3] = [Form::Set, Form::SetString, Form::SetJson];

impl Form {
    fn flag(self) -> &'static str {
        match self {
            Self::Set => "--set",
            Self::SetString => "--set-string",
            Self::SetJson => "--set-json",
        }
    }
}

/// Values given together, in a values file and on the command line.
struct Case {
    /// The values file, as a platform team writes it (numbers unquoted).
    file: &'static str,
    /// The same values as (path, the text `--set` and `--set-string`
    /// take, the JSON `--set-json` takes).
    cli: &'static [(&'static str, &'static str, &'static str)],
    /// The forms the schema refuses, with the line helm prints for each
    /// value refused (after `- at `).
    refused: &'static [(Form, &'static str)],
    /// What the rendering holds: the values as written.
    check: fn(&Objs) -> TestResult,
}

/// Values the templates never print.
const UNPRINTED: &[&str] = &["global"];

/// An environment variable of the operator's container.
fn env(objs: &Objs, name: &str) -> anyhow::Result<Value> {
    operator_container(objs)?["env"]
        .as_array()
        .context("no env")?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].clone())
        .with_context(|| format!("no env {name}"))
}

/// The operator's pod spec.
fn pod_spec(objs: &Objs) -> anyhow::Result<&Value> {
    get(objs, "Deployment", "bucketmap-operator")?
        .pointer("/spec/template/spec")
        .context("the Deployment has no pod spec")
}

/// The operator's arguments.
fn args(objs: &Objs) -> anyhow::Result<Vec<Value>> {
    Ok(operator_container(objs)?["args"]
        .as_array()
        .context("no args")?
        .clone())
}

fn has(objs: &Objs, kind: &str, name: &str) -> bool {
    get(objs, kind, name).is_ok()
}

const CASES: &[Case] = &[
    Case {
        file: "workloadIdentity:\n  pool: acme.svc.id.goog\n  projectNumber: 123456789012\n",
        cli: &[
            (
                "workloadIdentity.pool",
                "acme.svc.id.goog",
                r#""acme.svc.id.goog""#,
            ),
            (
                "workloadIdentity.projectNumber",
                "123456789012",
                "123456789012",
            ),
        ],
        refused: &[],
        check: |objs| {
            assert_eq!(
                env(objs, "BUCKETMAP_WORKLOAD_IDENTITY_POOL")?,
                "acme.svc.id.goog"
            );
            assert_eq!(
                env(objs, "BUCKETMAP_WORKLOAD_IDENTITY_PROJECT_NUMBER")?,
                "123456789012"
            );
            Ok(())
        },
    },
    Case {
        file: "image:\n  repository: registry.example/platform/bucketmap\n  tag: 20240501\n  \
               digest: sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n  \
               pullPolicy: IfNotPresent\n",
        cli: &[
            (
                "image.repository",
                "registry.example/platform/bucketmap",
                r#""registry.example/platform/bucketmap""#,
            ),
            ("image.tag", "20240501", "20240501"),
            (
                "image.digest",
                "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                r#""sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa""#,
            ),
            ("image.pullPolicy", "IfNotPresent", r#""IfNotPresent""#),
        ],
        refused: &[],
        check: |objs| {
            let container = operator_container(objs)?;
            assert_eq!(
                container["image"],
                "registry.example/platform/bucketmap:20240501@sha256:\
                 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            );
            assert_eq!(container["imagePullPolicy"], "IfNotPresent");
            Ok(())
        },
    },
    Case {
        file: "sidecar:\n  image:\n    repository: registry.example/platform/bucketmap\n    \
               tag: 20240501\n    \
               digest: sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n  \
               extraArgs:\n    - --no-auth\n",
        cli: &[
            (
                "sidecar.image.repository",
                "registry.example/platform/bucketmap",
                r#""registry.example/platform/bucketmap""#,
            ),
            ("sidecar.image.tag", "20240501", "20240501"),
            (
                "sidecar.image.digest",
                "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
                r#""sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb""#,
            ),
            ("sidecar.extraArgs", "{--no-auth}", r#"["--no-auth"]"#),
        ],
        refused: &[],
        check: |objs| {
            assert_eq!(
                env(objs, "BUCKETMAP_SIDECAR_IMAGE")?,
                "registry.example/platform/bucketmap:20240501@sha256:\
                 bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
            );
            assert!(args(objs)?.contains(&json!("--sidecar-arg=--no-auth")));
            Ok(())
        },
    },
    Case {
        file: "extraArgs:\n  - --resync=5m\n  - --concurrency=64\n\
               imagePullSecrets:\n  - name: registry\n",
        cli: &[
            (
                "extraArgs",
                "{--resync=5m,--concurrency=64}",
                r#"["--resync=5m","--concurrency=64"]"#,
            ),
            ("imagePullSecrets[0].name", "registry", r#""registry""#),
        ],
        refused: &[],
        check: |objs| {
            let args = args(objs)?;
            assert_eq!(
                args[args.len() - 2..],
                [json!("--resync=5m"), json!("--concurrency=64")]
            );
            assert_eq!(
                pod_spec(objs)?["imagePullSecrets"],
                json!([{"name": "registry"}])
            );
            Ok(())
        },
    },
    Case {
        file: "replicas: 3\n",
        cli: &[("replicas", "3", "3")],
        refused: &[(Form::SetString, "'/replicas': got string, want integer")],
        check: |objs| {
            assert_eq!(
                get(objs, "Deployment", "bucketmap-operator")?["spec"]["replicas"],
                3
            );
            assert!(has(objs, "PodDisruptionBudget", "bucketmap-operator"));
            Ok(())
        },
    },
    Case {
        file: "clusterId: prod-europe-west1\ndefaultProject: acme-prod\n\
               serviceAccount:\n  gcpServiceAccount: bucketmap@acme.iam.gserviceaccount.com\n\
               priorityClassName: platform-critical\nmapName: team-buckets\n",
        cli: &[
            ("clusterId", "prod-europe-west1", r#""prod-europe-west1""#),
            ("defaultProject", "acme-prod", r#""acme-prod""#),
            (
                "serviceAccount.gcpServiceAccount",
                "bucketmap@acme.iam.gserviceaccount.com",
                r#""bucketmap@acme.iam.gserviceaccount.com""#,
            ),
            (
                "priorityClassName",
                "platform-critical",
                r#""platform-critical""#,
            ),
            ("mapName", "team-buckets", r#""team-buckets""#),
        ],
        refused: &[],
        check: |objs| {
            assert_eq!(env(objs, "BUCKETMAP_CLUSTER_ID")?, "prod-europe-west1");
            assert_eq!(env(objs, "BUCKETMAP_DEFAULT_PROJECT")?, "acme-prod");
            let gsa = "bucketmap@acme.iam.gserviceaccount.com";
            assert_eq!(env(objs, "BUCKETMAP_GCP_SERVICE_ACCOUNT")?, gsa);
            let sa = get(objs, "ServiceAccount", "bucketmap")?;
            assert_eq!(
                sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"],
                gsa
            );
            assert_eq!(pod_spec(objs)?["priorityClassName"], "platform-critical");
            assert_eq!(env(objs, "BUCKETMAP_MAP_NAME")?, "team-buckets");
            let reader = get(objs, "ClusterRole", "bucketmap-map-reader")?;
            assert_eq!(reader["rules"][0]["resourceNames"], json!(["team-buckets"]));
            Ok(())
        },
    },
    // Every boolean turned from its default, together.
    Case {
        file: "crds:\n  keep: false\nwebhook:\n  enabled: false\nserviceBinding:\n  enabled: false\n\
               serviceMonitor:\n  enabled: true\n  sidecars: false\n\
               podMonitoring:\n  enabled: true\n  sidecars: false\n\
               prometheusRule:\n  enabled: true\nclusterRules:\n  enabled: true\n\
               grafanaDashboard:\n  enabled: true\n",
        cli: &[
            ("crds.keep", "false", "false"),
            ("webhook.enabled", "false", "false"),
            ("serviceBinding.enabled", "false", "false"),
            ("serviceMonitor.enabled", "true", "true"),
            ("serviceMonitor.sidecars", "false", "false"),
            ("podMonitoring.enabled", "true", "true"),
            ("podMonitoring.sidecars", "false", "false"),
            ("prometheusRule.enabled", "true", "true"),
            ("clusterRules.enabled", "true", "true"),
            ("grafanaDashboard.enabled", "true", "true"),
        ],
        refused: &[
            (Form::SetString, "'/crds/keep': got string, want boolean"),
            (
                Form::SetString,
                "'/webhook/enabled': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/serviceBinding/enabled': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/serviceMonitor/enabled': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/serviceMonitor/sidecars': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/podMonitoring/enabled': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/podMonitoring/sidecars': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/prometheusRule/enabled': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/clusterRules/enabled': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/grafanaDashboard/enabled': got string, want boolean",
            ),
        ],
        check: |objs| {
            let crd = get(objs, "CustomResourceDefinition", CRD_NAME)?;
            assert!(
                crd.pointer("/metadata/annotations/helm.sh~1resource-policy")
                    .is_none()
            );
            assert!(!has(objs, "MutatingWebhookConfiguration", "bucketmap"));
            assert_eq!(env(objs, "BUCKETMAP_SERVICE_BINDING")?, "false");
            for (kind, name) in [
                ("ServiceMonitor", "bucketmap"),
                ("PodMonitoring", "bucketmap"),
                ("PrometheusRule", "bucketmap"),
                ("ClusterRules", "bucketmap"),
                ("ConfigMap", "bucketmap-dashboard"),
            ] {
                assert!(has(objs, kind, name), "no {kind} {name}");
            }
            for kind in ["PodMonitor", "ClusterPodMonitoring"] {
                assert!(!has(objs, kind, "bucketmap-sidecars"), "a {kind}");
            }
            Ok(())
        },
    },
    Case {
        file: "crds:\n  enabled: false\n",
        cli: &[("crds.enabled", "false", "false")],
        refused: &[(Form::SetString, "'/crds/enabled': got string, want boolean")],
        check: |objs| {
            assert!(!has(objs, "CustomResourceDefinition", CRD_NAME));
            Ok(())
        },
    },
    Case {
        file: "webhook:\n  port: 8443\n",
        cli: &[("webhook.port", "8443", "8443")],
        refused: &[(Form::SetString, "'/webhook/port': got string, want integer")],
        check: |objs| {
            assert!(args(objs)?.contains(&json!("--webhook-addr=0.0.0.0:8443")));
            assert!(
                operator_container(objs)?["ports"]
                    .as_array()
                    .context("no ports")?
                    .contains(&json!({"name": "webhook", "containerPort": 8443}))
            );
            Ok(())
        },
    },
    Case {
        file: "resources:\n  requests:\n    cpu: 0.5\n    memory: 1073741824\n  \
               limits:\n    cpu: 2\n    memory: 512Mi\n  claims:\n    - name: scratch\n",
        cli: &[
            ("resources.requests.cpu", "0.5", "0.5"),
            ("resources.requests.memory", "1073741824", "1073741824"),
            ("resources.limits.cpu", "2", "2"),
            ("resources.limits.memory", "512Mi", r#""512Mi""#),
            ("resources.claims[0].name", "scratch", r#""scratch""#),
        ],
        refused: &[],
        check: |objs| {
            assert_eq!(
                operator_container(objs)?["resources"],
                json!({
                    "requests": {"cpu": "0.5", "memory": "1073741824"},
                    "limits": {"cpu": "2", "memory": "512Mi"},
                    "claims": [{"name": "scratch"}],
                })
            );
            Ok(())
        },
    },
    // Digits as a string (--set-string) are the same count.
    Case {
        file: "podDisruptionBudget:\n  minAvailable: 1\n",
        cli: &[("podDisruptionBudget.minAvailable", "1", "1")],
        refused: &[],
        check: |objs| {
            assert_eq!(
                get(objs, "PodDisruptionBudget", "bucketmap-operator")?["spec"]["minAvailable"],
                1
            );
            Ok(())
        },
    },
    Case {
        file: "podDisruptionBudget:\n  minAvailable: 50%\n",
        cli: &[("podDisruptionBudget.minAvailable", "50%", r#""50%""#)],
        refused: &[],
        check: |objs| {
            assert_eq!(
                get(objs, "PodDisruptionBudget", "bucketmap-operator")?["spec"]["minAvailable"],
                "50%"
            );
            Ok(())
        },
    },
    // Maps of strings: digits are a string only when quoted.
    Case {
        file: "nodeSelector:\n  kubernetes.io/os: linux\n\
               podAnnotations:\n  example.com/revision: \"42\"\n\
               podLabels:\n  example.com/team: platform\n",
        cli: &[
            (r"nodeSelector.kubernetes\.io/os", "linux", r#""linux""#),
            (r"podAnnotations.example\.com/revision", "42", r#""42""#),
            (r"podLabels.example\.com/team", "platform", r#""platform""#),
        ],
        refused: &[(
            Form::Set,
            "'/podAnnotations/example.com~1revision': got number, want string",
        )],
        check: |objs| {
            let spec = pod_spec(objs)?;
            assert_eq!(spec["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
            let pod = &get(objs, "Deployment", "bucketmap-operator")?["spec"]["template"];
            assert_eq!(pod["metadata"]["annotations"]["example.com/revision"], "42");
            assert_eq!(pod["metadata"]["labels"]["example.com/team"], "platform");
            Ok(())
        },
    },
    Case {
        file: "tolerations:\n  - key: dedicated\n    operator: Equal\n    value: platform\n    \
               effect: NoExecute\n    tolerationSeconds: 3600\n",
        cli: &[
            ("tolerations[0].key", "dedicated", r#""dedicated""#),
            ("tolerations[0].operator", "Equal", r#""Equal""#),
            ("tolerations[0].value", "platform", r#""platform""#),
            ("tolerations[0].effect", "NoExecute", r#""NoExecute""#),
            ("tolerations[0].tolerationSeconds", "3600", "3600"),
        ],
        refused: &[(
            Form::SetString,
            "'/tolerations/0/tolerationSeconds': got string, want integer",
        )],
        check: |objs| {
            assert_eq!(
                pod_spec(objs)?["tolerations"],
                json!([{"key": "dedicated", "operator": "Equal", "value": "platform",
                        "effect": "NoExecute", "tolerationSeconds": 3600}])
            );
            Ok(())
        },
    },
    Case {
        file: "topologySpreadConstraints:\n  - maxSkew: 1\n    minDomains: 2\n    \
               topologyKey: topology.kubernetes.io/zone\n    whenUnsatisfiable: DoNotSchedule\n    \
               labelSelector:\n      matchLabels:\n        app.kubernetes.io/name: bucketmap\n    \
               matchLabelKeys:\n      - pod-template-hash\n    nodeAffinityPolicy: Honor\n    \
               nodeTaintsPolicy: Ignore\n",
        cli: &[
            ("topologySpreadConstraints[0].maxSkew", "1", "1"),
            ("topologySpreadConstraints[0].minDomains", "2", "2"),
            (
                "topologySpreadConstraints[0].topologyKey",
                "topology.kubernetes.io/zone",
                r#""topology.kubernetes.io/zone""#,
            ),
            (
                "topologySpreadConstraints[0].whenUnsatisfiable",
                "DoNotSchedule",
                r#""DoNotSchedule""#,
            ),
            (
                r"topologySpreadConstraints[0].labelSelector.matchLabels.app\.kubernetes\.io/name",
                "bucketmap",
                r#""bucketmap""#,
            ),
            (
                "topologySpreadConstraints[0].matchLabelKeys",
                "{pod-template-hash}",
                r#"["pod-template-hash"]"#,
            ),
            (
                "topologySpreadConstraints[0].nodeAffinityPolicy",
                "Honor",
                r#""Honor""#,
            ),
            (
                "topologySpreadConstraints[0].nodeTaintsPolicy",
                "Ignore",
                r#""Ignore""#,
            ),
        ],
        refused: &[
            (
                Form::SetString,
                "'/topologySpreadConstraints/0/maxSkew': got string, want integer",
            ),
            (
                Form::SetString,
                "'/topologySpreadConstraints/0/minDomains': got string, want integer",
            ),
        ],
        check: |objs| {
            assert_eq!(
                pod_spec(objs)?["topologySpreadConstraints"],
                json!([{"maxSkew": 1, "minDomains": 2,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "bucketmap"}},
                        "matchLabelKeys": ["pod-template-hash"],
                        "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore"}])
            );
            Ok(())
        },
    },
    Case {
        file: "affinity:\n  nodeAffinity:\n    preferredDuringSchedulingIgnoredDuringExecution:\n      \
               - weight: 50\n        preference:\n          matchExpressions:\n            \
               - {key: pool, operator: In, values: [system]}\n  \
               podAffinity:\n    preferredDuringSchedulingIgnoredDuringExecution:\n      \
               - weight: 10\n        podAffinityTerm:\n          topologyKey: kubernetes.io/hostname\n          \
               labelSelector:\n            matchLabels: {app: metrics-agent}\n  \
               podAntiAffinity:\n    preferredDuringSchedulingIgnoredDuringExecution:\n      \
               - weight: 100\n        podAffinityTerm:\n          topologyKey: kubernetes.io/hostname\n          \
               labelSelector:\n            matchLabels: {app: bucketmap}\n",
        cli: &[
            (
                "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
                "50",
                "50",
            ),
            (
                "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].key",
                "pool",
                r#""pool""#,
            ),
            (
                "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].operator",
                "In",
                r#""In""#,
            ),
            (
                "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].values",
                "{system}",
                r#"["system"]"#,
            ),
            (
                "affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
                "10",
                "10",
            ),
            (
                "affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey",
                "kubernetes.io/hostname",
                r#""kubernetes.io/hostname""#,
            ),
            (
                "affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.labelSelector.matchLabels.app",
                "metrics-agent",
                r#""metrics-agent""#,
            ),
            (
                "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
                "100",
                "100",
            ),
            (
                "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey",
                "kubernetes.io/hostname",
                r#""kubernetes.io/hostname""#,
            ),
            (
                "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.labelSelector.matchLabels.app",
                "bucketmap",
                r#""bucketmap""#,
            ),
        ],
        refused: &[
            (
                Form::SetString,
                "'/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/weight': got string, want integer",
            ),
            (
                Form::SetString,
                "'/affinity/podAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/weight': got string, want integer",
            ),
            (
                Form::SetString,
                "'/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/weight': got string, want integer",
            ),
        ],
        check: |objs| {
            let affinity = &pod_spec(objs)?["affinity"];
            let weight = |kind: &str| {
                affinity[kind]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"]
                    .clone()
            };
            assert_eq!(
                [
                    weight("nodeAffinity"),
                    weight("podAffinity"),
                    weight("podAntiAffinity")
                ],
                [json!(50), json!(10), json!(100)],
                "{affinity:#}"
            );
            Ok(())
        },
    },
    Case {
        file: "serviceMonitor:\n  enabled: true\n  interval: 1m\n  \
               labels:\n    release: kube-prometheus-stack\n\
               podMonitoring:\n  enabled: true\n  interval: 45s\n\
               prometheusRule:\n  enabled: true\n  labels:\n    release: kube-prometheus-stack\n  \
               runbookBaseUrl: https://runbooks.example/bucketmap\n",
        cli: &[
            ("serviceMonitor.interval", "1m", r#""1m""#),
            (
                "serviceMonitor.labels.release",
                "kube-prometheus-stack",
                r#""kube-prometheus-stack""#,
            ),
            ("podMonitoring.interval", "45s", r#""45s""#),
            (
                "prometheusRule.labels.release",
                "kube-prometheus-stack",
                r#""kube-prometheus-stack""#,
            ),
            (
                "prometheusRule.runbookBaseUrl",
                "https://runbooks.example/bucketmap",
                r#""https://runbooks.example/bucketmap""#,
            ),
            // Given as --set in every form: a boolean refuses --set-string.
            ("serviceMonitor.enabled", "true", "true"),
            ("podMonitoring.enabled", "true", "true"),
            ("prometheusRule.enabled", "true", "true"),
        ],
        refused: &[
            (
                Form::SetString,
                "'/serviceMonitor/enabled': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/podMonitoring/enabled': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/prometheusRule/enabled': got string, want boolean",
            ),
        ],
        check: |objs| {
            let monitor = get(objs, "ServiceMonitor", "bucketmap")?;
            assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "1m");
            assert_eq!(
                monitor["metadata"]["labels"]["release"],
                "kube-prometheus-stack"
            );
            let sidecars = get(objs, "PodMonitor", "bucketmap-sidecars")?;
            assert_eq!(sidecars["spec"]["podMetricsEndpoints"][0]["interval"], "1m");
            let gke = get(objs, "PodMonitoring", "bucketmap")?;
            assert_eq!(gke["spec"]["endpoints"][0]["interval"], "45s");
            let rule = get(objs, "PrometheusRule", "bucketmap")?;
            assert_eq!(
                rule["metadata"]["labels"]["release"],
                "kube-prometheus-stack"
            );
            let url = &rule["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"];
            assert!(
                url.as_str()
                    .is_some_and(|u| u.starts_with("https://runbooks.example/bucketmap#")),
                "{url}"
            );
            Ok(())
        },
    },
    // Only the intervals, so that --set-string reaches them.
    Case {
        file: "serviceMonitor:\n  interval: 1m\npodMonitoring:\n  interval: 45s\n",
        cli: &[
            ("serviceMonitor.interval", "1m", r#""1m""#),
            ("podMonitoring.interval", "45s", r#""45s""#),
        ],
        refused: &[],
        check: |objs| {
            // Off by default: nothing prints them.
            assert!(!has(objs, "ServiceMonitor", "bucketmap"));
            Ok(())
        },
    },
    Case {
        file: "grafanaDashboard:\n  enabled: true\n  labels:\n    grafana_dashboard: \"1\"\n  \
               annotations:\n    grafana_folder: Storage\n",
        cli: &[
            ("grafanaDashboard.labels.grafana_dashboard", "1", r#""1""#),
            (
                "grafanaDashboard.annotations.grafana_folder",
                "Storage",
                r#""Storage""#,
            ),
            ("grafanaDashboard.enabled", "true", "true"),
        ],
        refused: &[
            (
                Form::Set,
                "'/grafanaDashboard/labels/grafana_dashboard': got number, want string",
            ),
            (
                Form::SetString,
                "'/grafanaDashboard/enabled': got string, want boolean",
            ),
        ],
        check: |objs| {
            let map = get(objs, "ConfigMap", "bucketmap-dashboard")?;
            assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
            assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "Storage");
            Ok(())
        },
    },
    Case {
        file: "watchNamespaces:\n  - team-a\n  - team-b\n",
        cli: &[(
            "watchNamespaces",
            "{team-a,team-b}",
            r#"["team-a","team-b"]"#,
        )],
        refused: &[],
        check: check_watched,
    },
    // The comma-separated form.
    Case {
        file: "watchNamespaces: team-a,team-b\n",
        cli: &[("watchNamespaces", r"team-a\,team-b", r#""team-a,team-b""#)],
        refused: &[],
        check: check_watched,
    },
    Case {
        file: "tenancy:\n  rules:\n    - name: team-a\n      namespaces: [team-a-*]\n      \
               namespaceSelector:\n        matchLabels:\n          tenant: team-a\n      \
               projects: [a-prod]\n      storageClasses: [STANDARD]\n      locations: [EU]\n      \
               allowForceDestroy: false\n      maxBucketsPerNamespace: 1000000\n",
        cli: &[
            ("tenancy.rules[0].name", "team-a", r#""team-a""#),
            (
                "tenancy.rules[0].namespaces",
                "{team-a-*}",
                r#"["team-a-*"]"#,
            ),
            (
                "tenancy.rules[0].namespaceSelector.matchLabels.tenant",
                "team-a",
                r#""team-a""#,
            ),
            ("tenancy.rules[0].projects", "{a-prod}", r#"["a-prod"]"#),
            (
                "tenancy.rules[0].storageClasses",
                "{STANDARD}",
                r#"["STANDARD"]"#,
            ),
            ("tenancy.rules[0].locations", "{EU}", r#"["EU"]"#),
            ("tenancy.rules[0].allowForceDestroy", "false", "false"),
            (
                "tenancy.rules[0].maxBucketsPerNamespace",
                "1000000",
                "1000000",
            ),
        ],
        refused: &[
            (
                Form::SetString,
                "'/tenancy/rules/0/allowForceDestroy': got string, want boolean",
            ),
            (
                Form::SetString,
                "'/tenancy/rules/0/maxBucketsPerNamespace': got string, want integer",
            ),
        ],
        check: |objs| {
            let text = get(objs, "ConfigMap", "bucketmap-tenancy")?["data"]["policy.yaml"]
                .as_str()
                .context("no policy.yaml")?
                .to_owned();
            assert!(text.contains("maxBucketsPerNamespace: 1000000\n"), "{text}");
            let policy: Value = serde_yaml::from_str(&text)?;
            assert_eq!(
                policy,
                json!({"rules": [{"name": "team-a", "namespaces": ["team-a-*"],
                    "namespaceSelector": {"matchLabels": {"tenant": "team-a"}},
                    "projects": ["a-prod"], "storageClasses": ["STANDARD"],
                    "locations": ["EU"], "allowForceDestroy": false,
                    "maxBucketsPerNamespace": 1_000_000}]})
            );
            Ok(())
        },
    },
];

/// What both forms of `watchNamespaces` render: the operator's list and a
/// Role in each namespace.
fn check_watched(objs: &Objs) -> TestResult {
    assert_eq!(env(objs, "BUCKETMAP_WATCH_NAMESPACES")?, "team-a,team-b");
    for ns in ["team-a", "team-b"] {
        assert!(
            objs.keys().any(|(k, n, _)| k == "Role" && n == ns),
            "no Role in {ns}"
        );
        // The chart binds the map's readers; the operator does not.
        let bound =
            |(k, n, name): &Key| k == "RoleBinding" && n == ns && name == "bucketmap-map-reader";
        assert!(objs.keys().any(bound), "no map reader RoleBinding in {ns}");
    }
    assert!(env(objs, "BUCKETMAP_MAP_READER_ROLE").is_err());
    assert!(!has(objs, "ClusterRole", "bucketmap-map-reader"));
    Ok(())
}

/// The lines of `a` missing from `b` and the other way round: where two
/// renderings differ.
fn line_diff(a: &str, b: &str) -> String {
    let only = |x: &str, y: &str| -> Vec<String> {
        x.lines()
            .filter(|l| !y.lines().any(|m| m == *l))
            .map(str::to_owned)
            .collect()
    };
    format!(
        "only in the values file's:\n{}\nonly in the other:\n{}",
        only(a, b).join("\n"),
        only(b, a).join("\n")
    )
}

/// `helm template` with `args`, as strings.
async fn template(helm: &Path, args: &[String]) -> anyhow::Result<String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm_template(helm, &args).await
}

/// One case: the values file's rendering holds the values as written, and
/// each command-line form renders the same bytes or is refused as stated.
async fn check_case(helm: &Path, dir: &Path, index: usize, case: &Case) -> TestResult {
    let file = dir.join(format!("case-{index}.yaml"));
    std::fs::write(&file, case.file)?;
    let from_file = template(helm, &["-f".to_owned(), path_str(&file)?.to_owned()]).await?;
    (case.check)(&objects(&from_file, "values file")?)
        .with_context(|| format!("from the values file:\n{}", case.file))?;
    for form in FORMS {
        let args: Vec<String> = case
            .cli
            .iter()
            .flat_map(|(path, text, json)| {
                let value = if form == Form::SetJson { json } else { text };
                [form.flag().to_owned(), format!("{path}={value}")]
            })
            .collect();
        let rendered = template(helm, &args).await;
        let refusals: Vec<&str> = case
            .refused
            .iter()
            .filter(|(f, _)| *f == form)
            .map(|(_, line)| *line)
            .collect();
        if refusals.is_empty() {
            let rendered = rendered.with_context(|| format!("{args:?} is refused"))?;
            assert!(
                rendered == from_file,
                "{args:?} renders otherwise than the values file\n{}:\n{}",
                case.file,
                line_diff(&from_file, &rendered)
            );
        } else {
            let message = format!(
                "{:#}",
                rendered
                    .err()
                    .with_context(|| format!("{args:?} renders; the schema should refuse it"))?
            );
            assert!(message.contains(SCHEMA_REFUSAL), "{args:?}: {message}");
            for line in refusals {
                assert!(
                    message.contains(&format!("- at {line}\n")),
                    "{args:?}: helm does not say {line:?}:\n{message}"
                );
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn every_value_renders_the_same_from_a_file_and_each_command_line_form() -> TestResult {
    let helm = helm().await?;
    let dir = tempfile::tempdir()?;
    for (index, case) in CASES.iter().enumerate() {
        check_case(&helm, dir.path(), index, case)
            .await
            .with_context(|| format!("case {index}, values:\n{}", case.file))?;
    }
    Ok(())
}

/// The values of the schema, as dotted paths (`[]` for a list's items):
/// where a value has properties of its own, those; otherwise the value.
fn schema_values(schema: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in properties {
            let sub_path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            schema_values(sub, &sub_path, out);
        }
    } else if let Some(items) = schema
        .get("items")
        .filter(|i| i.get("properties").is_some())
    {
        schema_values(items, &format!("{path}[]"), out);
    } else {
        out.push(path.to_owned());
    }
}

/// A command-line path with its list indexes as `[]`.
fn without_indexes(path: &str) -> String {
    let mut out = String::new();
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push_str("[]");
            }
            ']' => in_index = false,
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn every_value_of_the_schema_has_a_case() -> TestResult {
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(format!(
        "{}/values.schema.json",
        chart_dir()
    ))?)?;
    let mut values = Vec::new();
    schema_values(&schema, "", &mut values);
    assert!(values.len() > 40, "too few values found: {values:?}");
    let given: Vec<String> = CASES
        .iter()
        .flat_map(|c| c.cli.iter().map(|(path, _, _)| without_indexes(path)))
        .collect();
    let missing: Vec<&String> = values
        .iter()
        .filter(|v| !UNPRINTED.contains(&v.as_str()))
        .filter(|v| {
            !given.iter().any(|g| {
                g == *v || g.starts_with(&format!("{v}.")) || g.starts_with(&format!("{v}["))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "values no case gives each way (add a case to CASES): {missing:?}"
    );
    Ok(())
}

#[tokio::test]
async fn numbers_yaml_reads_otherwise_than_written_render_exactly_or_are_refused() -> TestResult {
    let helm = helm().await?;
    let dir = tempfile::tempdir()?;
    let file = |name: &str, text: &str| -> anyhow::Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path_str(&path)?.to_owned())
    };
    // The crash of issue 62: a project number in exponent form, as a
    // float64 prints by default, is the number it denotes.
    let exponent = file(
        "exponent.yaml",
        "workloadIdentity:\n  pool: acme.svc.id.goog\n  projectNumber: 1.23456789e+08\n",
    )?;
    let objs = objects(&helm_template(&helm, &["-f", &exponent]).await?, "exponent")?;
    assert_eq!(
        env(&objs, "BUCKETMAP_WORKLOAD_IDENTITY_PROJECT_NUMBER")?,
        "123456789"
    );
    // On the command line the same text is a string, and no project number.
    for flag in ["--set", "--set-string"] {
        let refused = helm_template(
            &helm,
            &[flag, "workloadIdentity.projectNumber=1.23456789e+08"],
        )
        .await;
        let message = format!("{:#}", refused.err().context("an exponent renders")?);
        assert!(
            message.contains(SCHEMA_REFUSAL)
                && message.contains(
                    "- at '/workloadIdentity/projectNumber': '1.23456789e+08' does not match pattern"
                ),
            "{message}"
        );
    }
    // YAML reads 1.20 as the number 1.2: refused, where the quoted tag,
    // like --set's string, renders as written.
    let decimal = file("decimal.yaml", "image:\n  tag: 1.20\n")?;
    let message = format!(
        "{:#}",
        helm_template(&helm, &["-f", &decimal])
            .await
            .err()
            .context("a decimal tag renders")?
    );
    assert!(
        message.contains(SCHEMA_REFUSAL)
            && message.contains("- at '/image/tag': got number, want integer or string"),
        "{message}"
    );
    let quoted = file("quoted.yaml", "image:\n  tag: \"1.20\"\n")?;
    let from_file = helm_template(&helm, &["-f", &quoted]).await?;
    assert_eq!(
        operator_container(&objects(&from_file, "quoted tag")?)?["image"],
        "bucketmap/bucketmap:1.20"
    );
    assert_eq!(
        helm_template(&helm, &["--set", "image.tag=1.20"]).await?,
        from_file
    );
    // A count with a fraction is refused, not rounded.
    let fraction = file("fraction.yaml", "replicas: 2.5\n")?;
    let message = format!(
        "{:#}",
        helm_template(&helm, &["-f", &fraction])
            .await
            .err()
            .context("a fractional replica count renders")?
    );
    assert!(
        message.contains("- at '/replicas': got number, want integer"),
        "{message}"
    );
    Ok(())
}
