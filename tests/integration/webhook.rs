//! The pod injection webhook, called by the real API server: the operator
//! serves it over TLS with a certificate it generated, and keeps the
//! configuration's caBundle current; or with a certificate from files, as a
//! cert-manager Secret mount provides it.

// Scenarios and tables of cases read top to bottom; the one-screen rule
// for functions is for product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use crate::common;

use std::time::Duration;

use anyhow::Context as _;
use bucketmap::webhook::inject::{INJECT_LABEL, MAP_VOLUME, SIDECAR_NAME};
use bucketmap_testkit::free_port;
use common::Fixture;
use common::certs::cert_files;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};

type TestResult = anyhow::Result<()>;

fn pod(name: &str, labelled: bool) -> anyhow::Result<Pod> {
    let labels = if labelled {
        serde_json::json!({INJECT_LABEL: "true"})
    } else {
        serde_json::json!({})
    };
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
    }))?)
}

fn sidecars(p: &Pod) -> usize {
    let spec = p.spec.as_ref();
    spec.map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(&s.containers)
            .filter(|c| c.name == SIDECAR_NAME)
            .count()
    })
    .unwrap_or(0)
}

/// A `default` ServiceAccount (no controller-manager makes one here) and a
/// MutatingWebhookConfiguration calling `https://127.0.0.1:port`, limited to
/// the fixture's namespace. Returns the configuration's name.
async fn prepare(f: &Fixture, port: u16, ca_bundle: Option<&str>) -> anyhow::Result<String> {
    let sas: Api<ServiceAccount> = Api::namespaced(f.client.clone(), &f.ns);
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}))?;
    sas.create(&PostParams::default(), &sa).await?;
    let config_name = format!("bucketmap-{}", f.ns);
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(f.client.clone());
    let mut client_config =
        serde_json::json!({"url": format!("https://127.0.0.1:{port}/mutate-pods")});
    if let Some(ca) = ca_bundle {
        use base64::Engine as _;
        client_config["caBundle"] = base64::engine::general_purpose::STANDARD.encode(ca).into();
    }
    let config: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": config_name},
        "webhooks": [{
            "name": "inject.bucketmap.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": client_config,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "objectSelector": {"matchLabels": {INJECT_LABEL: "true"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f.ns}},
        }],
    }))?;
    webhooks.create(&PostParams::default(), &config).await?;
    Ok(config_name)
}

/// Creates a labelled pod, retrying while the webhook is not reachable yet.
async fn create_labelled(pods: &Api<Pod>, pod: Pod) -> anyhow::Result<Pod> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(p) => return Ok(p),
            // Refused by admission rather than a webhook not reachable yet.
            Err(e) if e.to_string().contains("violates PodSecurity") => {
                return Err(e).context("the labelled pod was refused");
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "webhook not reachable yet");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => return Err(e).context("labelled pod never admitted"),
        }
    }
}

/// The operator (controller and webhooks) for the fixture's namespace,
/// serving the webhooks on `port` with the certificate in `dir`.
fn operator_with_webhooks(
    f: &Fixture,
    port: u16,
    dir: &std::path::Path,
) -> anyhow::Result<tokio::process::Child> {
    Ok(common::webhooks::operator_with_webhooks(f, port, dir).spawn()?)
}

/// The operator serving the webhook with a certificate from files (as a
/// cert-manager Secret mount provides it), configured for the fixture's
/// namespace. Keep both returned values alive while the webhook is needed.
async fn webhook_from_files(
    f: &Fixture,
) -> anyhow::Result<(tokio::process::Child, tempfile::TempDir)> {
    let (ca, dir) = cert_files()?;
    let port = free_port()?;
    prepare(f, port, Some(&ca)).await?;
    let operator = operator_with_webhooks(f, port, dir.path())?;
    Ok((operator, dir))
}

#[tokio::test]
async fn a_certificate_from_files_serves_the_webhook_as_cert_manager_would_mount_it() -> TestResult
{
    let f = Fixture::new().await?;
    let _webhook = webhook_from_files(&f).await?;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), &f.ns);
    let injected = create_labelled(&pods, pod("labelled", true)?).await?;
    assert_eq!(sidecars(&injected), 1);
    Ok(())
}

#[tokio::test]
async fn labelled_pods_get_the_sidecar_others_are_untouched_even_when_the_webhook_is_down()
-> TestResult {
    let f = Fixture::new().await?;
    let port = free_port()?;
    let config_name = prepare(&f, port, None).await?;
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(f.client.clone());

    let mut operator = f
        .operator_command()
        .args(["--namespace", &f.ns, "--leader-election-namespace", &f.ns])
        .args(["--webhook-addr", &format!("127.0.0.1:{port}")])
        .args([
            "--webhook-host",
            "127.0.0.1",
            "--webhook-config-name",
            &config_name,
        ])
        .args(["--sidecar-image", "example/bucketmap:test"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .spawn()?;

    // The operator writes its CA into the configuration.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let c = webhooks.get(&config_name).await?;
        let bundle = c
            .webhooks
            .and_then(|w| w.into_iter().next())
            .and_then(|w| w.client_config.ca_bundle);
        if bundle.is_some_and(|b| String::from_utf8_lossy(&b.0).contains("BEGIN CERTIFICATE")) {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "caBundle never written"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), &f.ns);
    // The server may need a moment after the caBundle to accept handshakes.
    let injected = create_labelled(&pods, pod("labelled", true)?).await?;
    // A hostNetwork pod asking for the sidecar is refused, with the reason.
    let mut on_host = pod("on-host", true)?;
    if let Some(spec) = on_host.spec.as_mut() {
        spec.host_network = Some(true);
    }
    let why = refused(&pods, on_host, "a hostNetwork pod with the sidecar label").await?;
    assert!(why.contains("hostNetwork"), "{why}");
    let spec = injected.spec.clone().context("spec")?;
    let init = spec.init_containers.clone().unwrap_or_default();
    assert_eq!(init.first().map(|c| c.name.as_str()), Some(SIDECAR_NAME));
    assert_eq!(
        init[0].restart_policy.as_deref(),
        Some("Always"),
        "a native sidecar"
    );
    assert_eq!(init[0].image.as_deref(), Some("example/bucketmap:test"));
    let env = spec.containers[0].env.clone().unwrap_or_default();
    assert!(
        env.iter().any(|e| e.name == "STORAGE_EMULATOR_HOST"
            && e.value.as_deref() == Some("http://127.0.0.1:9023")),
        "{env:?}"
    );
    let volume = spec
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == MAP_VOLUME)
        .context("map volume")?;
    assert_eq!(
        volume.config_map.map(|c| c.name),
        Some("bucketmap".to_owned())
    );

    let plain = pods
        .create(&PostParams::default(), &pod("plain", false)?)
        .await?;
    assert_eq!(sidecars(&plain), 0, "an unlabelled pod is untouched");
    assert!(
        plain
            .spec
            .as_ref()
            .is_some_and(|s| s.containers[0].env.is_none())
    );

    // A pod whose spec already carries the sidecar is not injected twice.
    let mut again: Pod = pod("again", true)?;
    again.spec = injected.spec.clone();
    let again = pods.create(&PostParams::default(), &again).await?;
    assert_eq!(sidecars(&again), 1);

    // The webhook goes down: unlabelled pods are still admitted, labelled
    // ones are refused rather than started without their sidecar.
    operator.kill().await?;
    let _ = operator.wait().await;
    pods.create(&PostParams::default(), &pod("plain-2", false)?)
        .await
        .context("unlabelled pod blocked by a down webhook")?;
    let refused = pods
        .create(&PostParams::default(), &pod("labelled-2", true)?)
        .await;
    let message = format!(
        "{:?}",
        refused
            .err()
            .context("a labelled pod was admitted without its sidecar")?
    );
    assert!(message.contains("inject.bucketmap.dev"), "{message}");
    Ok(())
}

/// Sets the namespace's Pod Security `enforce` level (the API server's own
/// PodSecurity admission then judges every pod created there).
async fn enforce_pod_security(f: &Fixture, level: &str) -> TestResult {
    let namespaces: Api<Namespace> = Api::all(f.client.clone());
    let labels = serde_json::json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": level,
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    namespaces
        .patch(&f.ns, &PatchParams::default(), &Patch::Merge(labels))
        .await
        .with_context(|| format!("cannot label namespace {} {level}", f.ns))?;
    Ok(())
}

/// A labelled pod whose app container meets the `restricted` profile.
fn restricted_pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {INJECT_LABEL: "true"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "app",
                "image": "example/app:1",
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))?)
}

/// The error of a pod creation that must be refused.
async fn refused(pods: &Api<Pod>, pod: Pod, what: &str) -> anyhow::Result<String> {
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => anyhow::bail!("{what} was admitted"),
        Err(e) => Ok(e.to_string()),
    }
}

#[tokio::test]
async fn pod_security_admits_injected_pods_under_restricted_and_baseline() -> TestResult {
    let f = Fixture::new().await?;
    enforce_pod_security(&f, "restricted").await?;
    let _webhook = webhook_from_files(&f).await?;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), &f.ns);

    // The webhook's sidecar next to a compliant app: admitted by the API
    // server's PodSecurity admission, after the real webhook's mutation.
    let admitted = create_labelled(&pods, restricted_pod("compliant")?).await?;
    assert_eq!(sidecars(&admitted), 1, "admitted with its sidecar");

    // PodSecurity is really enforced here: a minimal app container is
    // refused, and for the app's settings only, not for the sidecar's.
    let message = refused(&pods, pod("minimal", true)?, "a non-compliant app").await?;
    assert!(
        message.contains("violates PodSecurity \"restricted:latest\"")
            && message.contains("\"app\"")
            && !message.contains(SIDECAR_NAME),
        "{message}"
    );

    // The sidecar's probes name no host: Pod Security's baseline refuses
    // any host but the pod's own address from Kubernetes 1.34 on.
    let sidecar = admitted
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == SIDECAR_NAME))
        .context("the admitted pod has the sidecar")?;
    for probe in [
        &sidecar.readiness_probe,
        &sidecar.startup_probe,
        &sidecar.liveness_probe,
    ] {
        let host = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|g| g.host.as_ref());
        assert!(host.is_none(), "a sidecar probe names host {host:?}");
    }
    let version = f.client.apiserver_version().await?;
    let minor: u32 = version.minor.trim_end_matches('+').parse()?;
    // Older API servers (the run against the oldest Kubernetes the chart
    // admits) do not check probe hosts: there the check above is the test.
    if minor >= 34 {
        // The spec this replaced probed host 127.0.0.1: refused (the same
        // admission would refuse the webhook's output if it did that again).
        let mut old_style = admitted.clone();
        old_style.metadata = restricted_pod("old-style")?.metadata;
        if let Some(sidecar) = old_style
            .spec
            .as_mut()
            .and_then(|s| s.init_containers.as_mut())
            .and_then(|c| c.iter_mut().find(|c| c.name == SIDECAR_NAME))
            && let Some(get) = sidecar
                .readiness_probe
                .as_mut()
                .and_then(|p| p.http_get.as_mut())
        {
            get.host = Some("127.0.0.1".to_owned());
        }
        let message = refused(&pods, old_style, "a sidecar probing 127.0.0.1").await?;
        assert!(
            message.contains("probe or lifecycle host") && message.contains(SIDECAR_NAME),
            "{message}"
        );
    }

    // baseline: the webhook's sidecar next to a minimal app container.
    enforce_pod_security(&f, "baseline").await?;
    let admitted = pods
        .create(&PostParams::default(), &pod("minimal", true)?)
        .await
        .context("baseline refused an injected pod")?;
    assert_eq!(sidecars(&admitted), 1, "admitted with its sidecar");
    Ok(())
}

#[test]
fn the_documented_snippet_is_what_the_webhook_injects() -> TestResult {
    use bucketmap::webhook::inject::{InjectionConfig, client_env, inject};
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/app-with-sidecar.yaml"
    ))?;
    let deployment: k8s_openapi::api::apps::v1::Deployment = serde_yaml::from_str(&text)?;
    let documented = deployment.spec.context("spec")?.template;
    let documented_spec = documented.spec.clone().context("pod spec")?;
    let sidecar = documented_spec
        .init_containers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .next()
        .context("sidecar")?;
    let cfg = InjectionConfig {
        sidecar_image: sidecar.image.clone().context("image")?,
        port: 9023,
        admin_port: 9024,
        map_name: "bucketmap".into(),
        extra_args: Vec::new(),
    };

    // The same pod before injection: no sidecar, no map volume, no client env.
    let injected_env: Vec<String> = client_env(cfg.port).into_iter().map(|e| e.name).collect();
    let mut bare = documented_spec.clone();
    bare.init_containers = None;
    bare.volumes = None;
    for c in &mut bare.containers {
        c.env = c.env.take().map(|env| {
            env.into_iter()
                .filter(|e| !injected_env.contains(&e.name))
                .collect()
        });
        if c.env.as_ref().is_some_and(Vec::is_empty) {
            c.env = None;
        }
    }
    let labelled = |spec| -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": "app", "labels": {INJECT_LABEL: "true"}},
            "spec": spec,
        }))?)
    };
    let injected = inject(&labelled(bare)?, &cfg).context("the bare pod is injected")?;
    // The pod runs as the ServiceAccount its bucket grants access to.
    let account = injected
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone());
    assert_eq!(account.as_deref(), Some("photo-app"));
    assert_eq!(
        serde_json::to_value(injected.spec)?,
        serde_json::to_value(labelled(documented_spec)?.spec)?,
        "examples/app-with-sidecar.yaml drifted from what the webhook injects"
    );
    assert_eq!(
        injected.metadata.annotations,
        documented.metadata.and_then(|m| m.annotations),
        "the annotations of examples/app-with-sidecar.yaml drifted from the webhook's"
    );
    Ok(())
}

/// The shipped Gcs finalizer webhook (`finalizer.gcs.bucketmap.dev` of
/// deploy/webhook.yaml, its failure policy included), calling
/// `https://127.0.0.1:port/mutate-gcs` for the fixture's namespace only.
async fn prepare_finalizer_webhook(f: &Fixture, port: u16, ca: &str) -> TestResult {
    let name = "finalizer.gcs.bucketmap.dev";
    let hook = common::webhooks::register_shipped(f, name, port, "/mutate-gcs", ca).await?;
    assert_eq!(hook["failurePolicy"], "Ignore", "{hook}");
    Ok(())
}

/// Waits until something accepts connections on `port` (or, with `up`
/// false, until nothing does).
async fn wait_listening(port: u16, up: bool) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
        != up
    {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "port {port} never became {}",
            if up { "open" } else { "closed" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn finalizers(g: &bucketmap::crd::Gcs) -> Vec<String> {
    g.metadata.finalizers.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_new_gcs_gets_the_finalizer_at_admission_and_is_admitted_while_the_webhook_is_down()
-> TestResult {
    let mut f = Fixture::new().await?;
    let (ca, dir) = cert_files()?;
    let port = free_port()?;
    prepare_finalizer_webhook(&f, port, &ca).await?;
    let mut operator = operator_with_webhooks(&f, port, dir.path())?;
    wait_listening(port, true).await?;

    // The API server's answer to the create already carries the finalizer:
    // the webhook set it, before any controller saw the resource.
    let created = f
        .create("first", serde_json::json!({"bucketName": "first"}))
        .await?;
    assert_eq!(finalizers(&created), [bucketmap::crd::FINALIZER]);
    assert_eq!(created.spec.bucket_name, "first", "nothing else changed");
    f.wait_ready("first").await?;

    // The webhook is down: a new Gcs is still admitted (failurePolicy
    // Ignore), without the finalizer, and the controller adds it.
    operator.kill().await?;
    let _ = operator.wait().await;
    wait_listening(port, false).await?;
    let created = f
        .create("second", serde_json::json!({"bucketName": "second"}))
        .await?;
    assert!(finalizers(&created).is_empty(), "{created:?}");
    f.start_operator().await?;
    let ready = f.wait_ready("second").await?;
    assert_eq!(finalizers(&ready), [bucketmap::crd::FINALIZER]);
    Ok(())
}
