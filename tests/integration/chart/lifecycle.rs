//! The chart's life on a real API server: installed at its previous
//! version, `Gcs` resources in place, upgraded as docs/UPGRADING.md says,
//! uninstalled and installed again, with the CRD and every `Gcs` kept
//! throughout (same uids); and what the webhooks do while no operator
//! replica serves them (the API server here runs no pods), as the README
//! says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::Value;

use super::{
    CRD_NAME, NAMESPACE, RELEASE, ROOT, TestResult, chart_dir, helm, kubeconfig_arg, kubectl,
    kubectl_ok, path_str, run,
};

/// The chart version this one upgrades from (`helm upgrade` from it is
/// tested), and the commit that holds it as its users installed it: the
/// last one before the 0.2.0 work moved its CRD out of `crds/` (the commit
/// after it carried those moves while Chart.yaml still said 0.1.0, so
/// "the last commit at 0.1.0" would name a chart that never was). Raise both
/// with each chart release.
const PREVIOUS_VERSION: &str = "0.1.0";
const PREVIOUS_COMMIT: &str = "a399e8bb0d747cf3c945991f72fc41a69f9209e0";
const CHART_YAML: &str = "deploy/chart/bucketmap/Chart.yaml";
/// The namespace of the applications' `Gcs` resources and pods.
const APPS: &str = "apps";
/// The `Gcs` resources that must survive everything, by name.
const KEPT: [&str; 3] = ["photos", "logs", "backups"];

/// `git -C ROOT args…`; its stdout.
async fn git(args: &[&str]) -> anyhow::Result<String> {
    let mut full = vec!["-C", ROOT];
    full.extend_from_slice(args);
    run("git", &full).await
}

/// The `version` of a Chart.yaml's text.
fn chart_version(text: &str) -> anyhow::Result<String> {
    let chart: serde_yaml::Value = serde_yaml::from_str(text)?;
    chart["version"]
        .as_str()
        .map(str::to_owned)
        .context("Chart.yaml without version")
}

/// The chart at `PREVIOUS_COMMIT`, extracted into `dir` by `git archive`.
async fn previous_chart(dir: &Path) -> anyhow::Result<PathBuf> {
    let object = format!("{PREVIOUS_COMMIT}^{{commit}}");
    git(&["cat-file", "-e", &object]).await.with_context(|| {
        format!(
            "the upgrade test installs chart {PREVIOUS_VERSION} from git history, and \
             {ROOT} lacks its commit {PREVIOUS_COMMIT}: fetch the whole history \
             (git fetch --unshallow)"
        )
    })?;
    let tar = dir.join("previous.tar");
    git(&[
        "archive",
        "--format=tar",
        "-o",
        path_str(&tar)?,
        PREVIOUS_COMMIT,
        "deploy/chart/bucketmap",
    ])
    .await?;
    run("tar", &["-xf", path_str(&tar)?, "-C", path_str(dir)?]).await?;
    let chart = dir.join("deploy/chart/bucketmap");
    let version = chart_version(&std::fs::read_to_string(chart.join("Chart.yaml"))?)?;
    anyhow::ensure!(
        version == PREVIOUS_VERSION,
        "{PREVIOUS_COMMIT}: chart {version}, not {PREVIOUS_VERSION}"
    );
    anyhow::ensure!(
        chart.join("crds/gcs.yaml").is_file(),
        "{PREVIOUS_COMMIT}: chart {PREVIOUS_VERSION} without its crds/gcs.yaml"
    );
    Ok(chart)
}

/// A `Gcs` as the operator leaves it: with its finalizer, so that nothing
/// but the operator could complete its deletion.
fn gcs(name: &str) -> String {
    format!(
        "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata:\n  name: {name}\n  \
         namespace: {APPS}\n  finalizers: [{}]\nspec:\n  bucketName: {name}\n",
        bucketmap::crd::FINALIZER
    )
}

/// The namespace `APPS` and the `KEPT` resources in it.
async fn create_kept(kubeconfig: &str) -> TestResult {
    kubectl_ok(kubeconfig, &["create", "namespace", APPS], "").await?;
    let manifests: Vec<String> = KEPT.iter().map(|n| gcs(n)).collect();
    kubectl_ok(kubeconfig, &["apply", "-f", "-"], &manifests.join("---\n")).await?;
    Ok(())
}

/// Waits until the API server serves the CRD.
async fn wait_established(kubeconfig: &str) -> TestResult {
    kubectl_ok(
        kubeconfig,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=120s",
            &format!("crd/{CRD_NAME}"),
        ],
        "",
    )
    .await?;
    Ok(())
}

/// `kubectl get -o json` of one object.
async fn get_json(kubeconfig: &str, args: &[&str]) -> anyhow::Result<Value> {
    let mut full = vec!["get", "-o", "json"];
    full.extend_from_slice(args);
    Ok(serde_json::from_str(
        &kubectl_ok(kubeconfig, &full, "").await?,
    )?)
}

/// The CRD and the kept `Gcs` resources: uid by name (the CRD as `crd`).
/// Fails if any of them is gone or being deleted.
async fn uids(kubeconfig: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let crd = get_json(kubeconfig, &["crd", CRD_NAME]).await?;
    let mut objs = vec![("crd".to_owned(), crd)];
    for name in KEPT {
        objs.push((
            name.to_owned(),
            get_json(kubeconfig, &["gcs", "-n", APPS, name]).await?,
        ));
    }
    for (name, obj) in objs {
        anyhow::ensure!(
            obj.pointer("/metadata/deletionTimestamp").is_none(),
            "{name} is being deleted: {:#}",
            obj["metadata"]
        );
        let uid = obj["metadata"]["uid"]
            .as_str()
            .with_context(|| format!("{name} without uid"))?;
        out.insert(name, uid.to_owned());
    }
    Ok(out)
}

/// The `kubectl label`/`kubectl annotate` commands docs/UPGRADING.md gives
/// for the upgrade from 0.1.0, as argument lists.
fn adoption_commands() -> anyhow::Result<Vec<Vec<String>>> {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/UPGRADING.md"))?;
    let commands: Vec<Vec<String>> = doc
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl label crd ") || l.starts_with("kubectl annotate crd "))
        .map(|l| l.split_whitespace().skip(1).map(str::to_owned).collect())
        .collect();
    anyhow::ensure!(
        commands.len() == 2,
        "docs/UPGRADING.md should give one `kubectl label crd` and one \
         `kubectl annotate crd` line, found {commands:?}"
    );
    Ok(commands)
}

/// `helm ARGS --kubeconfig K`; its stdout, or the error with its output.
async fn helm_cmd(helm: &Path, kubeconfig: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut full = args.to_vec();
    full.extend_from_slice(&["--kubeconfig", kubeconfig]);
    run(path_str(helm)?, &full).await
}

#[tokio::test]
async fn upgrade_uninstall_and_reinstall_keep_the_crd_and_every_gcs() -> TestResult {
    let current = chart_version(&std::fs::read_to_string(format!("{ROOT}/{CHART_YAML}"))?)?;
    assert_ne!(
        current, PREVIOUS_VERSION,
        "raise PREVIOUS_VERSION with the chart's version"
    );
    let dir = tempfile::tempdir()?;
    let previous = previous_chart(dir.path()).await?;
    let previous = path_str(&previous)?.to_owned();
    let chart = chart_dir();
    let helm = helm().await?;
    let env = bucketmap_testkit::testenv::TestEnv::start().await?;
    let k = kubeconfig_arg(&env)?;
    let no_gsa = "serviceAccount.gcpServiceAccount=";

    // The previous version, as its users installed it: the CRD from crds/.
    install_previous(&helm, &k, &previous, &[no_gsa]).await?;
    let crd = get_json(&k, &["crd", CRD_NAME]).await?;
    assert!(
        crd.pointer("/metadata/annotations/meta.helm.sh~1release-name")
            .is_none(),
        "the previous chart's CRD already belongs to the release: {:#}",
        crd["metadata"]
    );
    create_kept(&k).await?;
    let before = uids(&k).await?;

    // Without the documented step, the upgrade stops and changes nothing.
    let upgrade = ["upgrade", RELEASE, &chart, "-n", NAMESPACE, "--set", no_gsa];
    let refused = helm_cmd(&helm, &k, &upgrade).await;
    let message = format!("{:#}", refused.expect_err("upgrade without adoption"));
    assert!(
        message.contains("invalid ownership metadata") && message.contains(CRD_NAME),
        "{message}"
    );
    assert_eq!(uids(&k).await?, before);

    for command in adoption_commands()? {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        kubectl_ok(&k, &args, "").await?;
    }
    helm_cmd(&helm, &k, &upgrade).await?;
    assert_eq!(uids(&k).await?, before, "the upgrade replaced an object");
    let crd = get_json(&k, &["crd", CRD_NAME]).await?;
    assert_eq!(
        crd["metadata"]["labels"]["helm.sh/chart"],
        format!("bucketmap-{current}"),
        "the upgrade did not apply the chart's CRD: {:#}",
        crd["metadata"]
    );
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );

    // `helm upgrade` carries a changed CRD to the cluster, and back.
    let changed = dir.path().join("changed");
    run("cp", &["-r", &chart, path_str(&changed)?]).await?;
    let crd_file = changed.join("files/crd.yaml");
    let text = std::fs::read_to_string(&crd_file)?;
    anyhow::ensure!(
        text.contains("    - gcsb\n"),
        "no short name gcsb in the CRD"
    );
    std::fs::write(
        &crd_file,
        text.replacen("    - gcsb\n", "    - gcsb\n    - gcsbucket\n", 1),
    )?;
    let changed = path_str(&changed)?;
    let short_names = |crd: &Value| crd["spec"]["names"]["shortNames"].clone();
    helm_cmd(
        &helm,
        &k,
        &[
            "upgrade", RELEASE, changed, "-n", NAMESPACE, "--set", no_gsa,
        ],
    )
    .await?;
    let crd = get_json(&k, &["crd", CRD_NAME]).await?;
    assert_eq!(short_names(&crd), serde_json::json!(["gcsb", "gcsbucket"]));
    helm_cmd(&helm, &k, &upgrade).await?;
    let crd = get_json(&k, &["crd", CRD_NAME]).await?;
    assert_eq!(short_names(&crd), serde_json::json!(["gcsb"]));
    assert_eq!(uids(&k).await?, before);

    webhooks_without_a_replica(&k).await?;

    // Uninstall: the CRD and every Gcs stay, the rest goes.
    let uninstalled = helm_cmd(&helm, &k, &["uninstall", RELEASE, "-n", NAMESPACE]).await?;
    assert!(
        uninstalled.contains(CRD_NAME),
        "helm does not say it kept the CRD:\n{uninstalled}"
    );
    assert_eq!(uids(&k).await?, before, "the uninstall deleted an object");
    let gone = kubectl(
        &k,
        &["get", "deployment", "-n", NAMESPACE, "bucketmap-operator"],
        "",
    )
    .await?;
    assert!(!gone.status.success(), "the operator is still there");

    // Reinstall: the kept CRD is adopted, nothing is recreated.
    let installed = helm_cmd(&helm, &k, &["install", RELEASE, &chart, "-n", NAMESPACE]).await?;
    assert_eq!(uids(&k).await?, before, "the reinstall replaced an object");
    for expected in [
        "rollout status deployment/bucketmap-operator",
        "kept by `helm uninstall`",
        "WARNING: serviceAccount.gcpServiceAccount is still the placeholder",
    ] {
        assert!(
            installed.contains(expected),
            "the notes lack {expected:?}:\n{installed}"
        );
    }
    Ok(())
}

/// What the README says happens while no operator replica is up (here none
/// ever runs: the webhook Service has no endpoints): a labelled pod is
/// refused, any other pod and a new Gcs are admitted, a Gcs being deleted
/// waits for the operator; and the API server counts the failed calls in
/// the metrics the webhook alerts use.
async fn webhooks_without_a_replica(k: &str) -> TestResult {
    kubectl_ok(k, &["create", "serviceaccount", "default", "-n", APPS], "").await?;
    let pod = |name: &str, labels: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {APPS}\n  \
             labels: {labels}\nspec:\n  containers: [{{name: app, image: example/app:1}}]\n"
        )
    };
    let labelled = kubectl(
        k,
        &["create", "-f", "-"],
        &pod("labelled", r#"{bucketmap.dev/inject: "true"}"#),
    )
    .await?;
    let stderr = String::from_utf8_lossy(&labelled.stderr);
    assert!(
        !labelled.status.success() && stderr.contains("inject.bucketmap.dev"),
        "a labelled pod was not refused by the injection webhook: {stderr}"
    );
    kubectl_ok(k, &["create", "-f", "-"], &pod("plain", "{app: plain}")).await?;
    kubectl_ok(k, &["create", "-f", "-"], &gcs("created-while-down")).await?;
    kubectl_ok(
        k,
        &[
            "delete",
            "gcs",
            "-n",
            APPS,
            "created-while-down",
            "--wait=false",
        ],
        "",
    )
    .await?;
    let waiting = get_json(k, &["gcs", "-n", APPS, "created-while-down"]).await?;
    assert!(
        waiting.pointer("/metadata/deletionTimestamp").is_some(),
        "{waiting:#}"
    );

    let metrics = kubectl_ok(k, &["get", "--raw", "/metrics"], "").await?;
    let series = |metric: &str, labels: &[&str]| {
        metrics.lines().any(|l| {
            l.starts_with(&format!("{metric}{{")) && labels.iter().all(|label| l.contains(label))
        })
    };
    assert!(
        series(
            "apiserver_admission_webhook_rejection_count",
            &[
                r#"name="inject.bucketmap.dev""#,
                r#"error_type="calling_webhook_error""#
            ]
        ),
        "the API server counted no failed call of the injection webhook"
    );
    assert!(
        series(
            "apiserver_admission_webhook_fail_open_count",
            &[r#"name="finalizer.gcs.bucketmap.dev""#]
        ),
        "the API server counted no failed-open call of the finalizer webhook"
    );
    // Every API server metric an alert or a dashboard panel uses is one
    // this API server exports.
    let mut queries = super::monitoring::alert_rules().await?;
    queries.extend(super::monitoring::dashboard_queries()?);
    let mut external = 0;
    for (alert, expr) in &queries {
        for name in super::monitoring::metric_names(expr) {
            if name.starts_with("apiserver_") {
                external += 1;
                assert!(
                    series(&name, &[]),
                    "{alert} uses {name}, which the API server does not export"
                );
            }
        }
    }
    assert!(
        external > 0,
        "no alert uses the API server's webhook metrics"
    );
    Ok(())
}

#[tokio::test]
async fn deleting_the_operator_base_leaves_the_crd_every_gcs_and_the_cluster_identity() -> TestResult
{
    let env = bucketmap_testkit::testenv::TestEnv::start().await?;
    let k = kubeconfig_arg(&env)?;
    let crd_base = format!("{ROOT}/deploy/crd");
    let operator_base = format!("{ROOT}/deploy");
    kubectl_ok(&k, &["apply", "-k", &crd_base], "").await?;
    wait_established(&k).await?;
    kubectl_ok(&k, &["apply", "-k", &operator_base], "").await?;
    create_kept(&k).await?;
    // What the operator derives and keeps when no cluster id is given.
    let identity = bucketmap::cluster_id::CONFIGMAP;
    kubectl_ok(
        &k,
        &[
            "create",
            "configmap",
            identity,
            "-n",
            NAMESPACE,
            "--from-literal=clusterID=derived-k3x9q2mw",
        ],
        "",
    )
    .await?;
    let configmap_uid = |k: String| async move {
        let cm = get_json(&k, &["configmap", "-n", NAMESPACE, identity]).await?;
        anyhow::Ok(
            cm["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    let before = uids(&k).await?;
    let identity_before = configmap_uid(k.clone()).await?;

    let deleted = kubectl_ok(&k, &["delete", "-k", &operator_base, "--wait=true"], "").await?;
    assert!(
        deleted.contains("deployment.apps \"bucketmap-operator\" deleted"),
        "{deleted}"
    );
    assert!(!deleted.contains(CRD_NAME), "{deleted}");
    assert_eq!(uids(&k).await?, before, "deleting deploy/ deleted data");
    assert_eq!(configmap_uid(k.clone()).await?, identity_before);

    // Applying the operator again recreates none of it.
    kubectl_ok(&k, &["apply", "-k", &crd_base], "").await?;
    kubectl_ok(&k, &["apply", "-k", &operator_base], "").await?;
    assert_eq!(uids(&k).await?, before);
    assert_eq!(configmap_uid(k.clone()).await?, identity_before);
    Ok(())
}

/// The control of `upgrade_uninstall_and_reinstall_keep_the_crd_and_every_gcs`:
/// without the resource policy, the same uninstall deletes the CRD and
/// with it every `Gcs`, so the kept uids there are the policy's doing.
#[tokio::test]
async fn without_crds_keep_the_uninstall_deletes_the_crd_and_every_gcs() -> TestResult {
    let helm = helm().await?;
    let env = bucketmap_testkit::testenv::TestEnv::start().await?;
    let k = kubeconfig_arg(&env)?;
    let chart = chart_dir();
    helm_cmd(
        &helm,
        &k,
        &[
            "install",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "--create-namespace",
            "--set",
            "serviceAccount.gcpServiceAccount=",
            "--set",
            "crds.keep=false",
        ],
    )
    .await?;
    wait_established(&k).await?;
    kubectl_ok(&k, &["create", "namespace", APPS], "").await?;
    // Without the operator's finalizer, so that the deletion completes.
    let plain = format!(
        "apiVersion: storage.bucketmap.dev/v1alpha1\nkind: Gcs\nmetadata:\n  name: photos\n  \
         namespace: {APPS}\nspec:\n  bucketName: photos\n"
    );
    kubectl_ok(&k, &["apply", "-f", "-"], &plain).await?;
    helm_cmd(
        &helm,
        &k,
        &[
            "uninstall",
            RELEASE,
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout=2m",
        ],
    )
    .await?;
    let crd = kubectl(&k, &["get", "crd", CRD_NAME], "").await?;
    assert!(
        !crd.status.success() && String::from_utf8_lossy(&crd.stderr).contains("NotFound"),
        "crds.keep=false, yet the CRD is still there"
    );
    Ok(())
}

/// A GCP project number: twelve digits, which a float64 prints in
/// exponent form (issue 62).
const PROJECT_NUMBER: &str = "123456789012";

/// The values a platform team keeps in Git, numbers unquoted.
const VALUES_FILE: &str = "serviceAccount:\n  gcpServiceAccount: \"\"\nworkloadIdentity:\n  \
                           pool: acme.svc.id.goog\n  projectNumber: 123456789012\nreplicas: 3\n";

/// The Workload Identity project number the installed Deployment gives
/// the operator.
async fn deployed_project_number(kubeconfig: &str) -> anyhow::Result<String> {
    let deploy = get_json(
        kubeconfig,
        &["deployment", "-n", NAMESPACE, "bucketmap-operator"],
    )
    .await?;
    deploy
        .pointer("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array)
        .and_then(|env| {
            env.iter()
                .find(|e| e["name"] == "BUCKETMAP_WORKLOAD_IDENTITY_PROJECT_NUMBER")
        })
        .and_then(|e| e["value"].as_str())
        .map(str::to_owned)
        .with_context(|| {
            format!(
                "the Deployment gives no project number: {:#}",
                deploy["spec"]["template"]
            )
        })
}

/// What the operator binary says when started with `project_number` as the
/// chart passes it (its environment) and no cluster: it reads its
/// arguments first, then fails to reach the API server, so its error
/// says whether it accepted them.
async fn operator_start_error(project_number: &str) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bucketmap"))
        .arg("operator")
        .env_clear()
        .env("HOME", dir.path())
        .env("KUBECONFIG", dir.path().join("absent"))
        .env("BUCKETMAP_WORKLOAD_IDENTITY_POOL", "acme.svc.id.goog")
        .env("BUCKETMAP_WORKLOAD_IDENTITY_PROJECT_NUMBER", project_number)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("cannot run the operator binary")?;
    anyhow::ensure!(!out.status.success(), "the operator ran without a cluster");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The project number is installed, and accepted by the operator, as the
/// digits it is.
async fn check_project_number(kubeconfig: &str, step: &str) -> TestResult {
    let number = deployed_project_number(kubeconfig).await?;
    assert_eq!(number, PROJECT_NUMBER, "after {step}");
    let error = operator_start_error(&number).await?;
    assert!(
        error.contains("cannot reach the Kubernetes API") && !error.contains("invalid value"),
        "after {step}, the operator refuses its project number {number}:\n{error}"
    );
    Ok(())
}

/// `helm install` of the previous chart version `previous` with `--set`
/// of each of `sets`.
async fn install_previous(
    helm: &Path,
    kubeconfig: &str,
    previous: &str,
    sets: &[&str],
) -> TestResult {
    let mut args = vec![
        "install",
        RELEASE,
        previous,
        "-n",
        NAMESPACE,
        "--create-namespace",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm_cmd(helm, kubeconfig, &args).await.map(drop)
}

/// `helm upgrade` of the release to `chart` with `extra` arguments.
async fn upgrade(helm: &Path, kubeconfig: &str, chart: &str, extra: &[&str]) -> TestResult {
    let mut args = vec!["upgrade", RELEASE, chart, "-n", NAMESPACE];
    args.extend_from_slice(extra);
    helm_cmd(helm, kubeconfig, &args).await.map(drop)
}

/// `helm get values -o yaml`: the values the release was given.
async fn values(helm: &Path, kubeconfig: &str) -> anyhow::Result<String> {
    let args = ["get", "values", RELEASE, "-n", NAMESPACE, "-o", "yaml"];
    helm_cmd(helm, kubeconfig, &args).await
}

/// `helm get manifest`: the objects the release holds, as rendered.
async fn manifest(helm: &Path, kubeconfig: &str) -> anyhow::Result<String> {
    helm_cmd(
        helm,
        kubeconfig,
        &["get", "manifest", RELEASE, "-n", NAMESPACE],
    )
    .await
}

/// The platform team's round trip (issue 62): chart 0.1.0 installed with
/// `--set`, upgraded keeping those values (`--reset-then-reuse-values`:
/// `--reuse-values` would keep 0.1.0's defaults too), its values saved
/// with `helm get values`, uninstalled, installed again from that file,
/// upgraded with `--reuse-values` and with the team's own values file. Helm stores the
/// values as JSON, so every step after the first hands the chart the
/// project number as a float64; the Deployment keeps its digits, the
/// operator accepts them, and nothing kept is replaced.
#[tokio::test]
async fn values_from_a_file_and_helm_get_values_install_the_same_digits() -> TestResult {
    let dir = tempfile::tempdir()?;
    let previous = previous_chart(dir.path()).await?;
    let previous = path_str(&previous)?.to_owned();
    let chart = chart_dir();
    let helm = helm().await?;
    let env = bucketmap_testkit::testenv::TestEnv::start().await?;
    let k = kubeconfig_arg(&env)?;

    // The control: the operator refuses the number as a float64 prints it.
    let error = operator_start_error("1.23456789012e+11").await?;
    assert!(
        error.contains("invalid value '1.23456789012e+11'")
            && error.contains("--workload-identity-project-number"),
        "{error}"
    );

    let number = format!("workloadIdentity.projectNumber={PROJECT_NUMBER}");
    let sets = [
        "serviceAccount.gcpServiceAccount=",
        "workloadIdentity.pool=acme.svc.id.goog",
        &number,
    ];
    install_previous(&helm, &k, &previous, &sets).await?;
    check_project_number(&k, "installing 0.1.0 with --set").await?;
    create_kept(&k).await?;
    let before = uids(&k).await?;
    for command in adoption_commands()? {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        kubectl_ok(&k, &args, "").await?;
    }
    upgrade(&helm, &k, &chart, &["--reset-then-reuse-values"]).await?;
    check_project_number(&k, "the upgrade from 0.1.0").await?;

    let saved = values(&helm, &k).await?;
    assert!(
        saved.contains(&format!("projectNumber: {PROJECT_NUMBER}\n")),
        "helm get values:\n{saved}"
    );
    let saved_file = dir.path().join("saved-values.yaml");
    std::fs::write(&saved_file, &saved)?;
    let saved_file = path_str(&saved_file)?;
    let objects_before = manifest(&helm, &k).await?;

    helm_cmd(&helm, &k, &["uninstall", RELEASE, "-n", NAMESPACE]).await?;
    assert_eq!(uids(&k).await?, before, "the uninstall deleted an object");
    helm_cmd(
        &helm,
        &k,
        &[
            "install", RELEASE, &chart, "-n", NAMESPACE, "-f", saved_file,
        ],
    )
    .await?;
    assert_eq!(uids(&k).await?, before, "the reinstall replaced an object");
    check_project_number(&k, "reinstalling from helm get values").await?;
    assert_eq!(
        manifest(&helm, &k).await?,
        objects_before,
        "the reinstall from the saved values installed other objects"
    );
    let saved_again = values(&helm, &k).await?;
    assert_eq!(
        saved_again, saved,
        "helm get values changed in the round trip"
    );

    upgrade(&helm, &k, &chart, &["--reuse-values"]).await?;
    check_project_number(&k, "helm upgrade --reuse-values").await?;
    assert_eq!(manifest(&helm, &k).await?, objects_before);

    let team_file = dir.path().join("values.yaml");
    std::fs::write(&team_file, VALUES_FILE)?;
    upgrade(&helm, &k, &chart, &["-f", path_str(&team_file)?]).await?;
    check_project_number(&k, "helm upgrade -f with the team's values file").await?;
    let deploy = get_json(&k, &["deployment", "-n", NAMESPACE, "bucketmap-operator"]).await?;
    assert_eq!(deploy["spec"]["replicas"], 3);
    assert_eq!(uids(&k).await?, before, "the upgrade replaced an object");
    Ok(())
}
