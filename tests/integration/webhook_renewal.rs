//! The self-managed webhook certificate is renewed on a real API server:
//! once the Secret says its certificate expires within the renewal window,
//! the operator replaces the Secret's material, serves the new certificate
//! and writes the new CA into the MutatingWebhookConfiguration's
//! `caBundle`, while the API server keeps calling the webhook: no
//! admission fails, before, during or after the renewal.

// A scenario reads top to bottom; the one-screen rule for functions is for
// product code (CONTRIBUTING.md).
#![allow(clippy::too_many_lines)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bucketmap::webhook::inject::{INJECT_LABEL, SIDECAR_NAME};
use bucketmap::webhook::tls::{self, CertSource};
use bucketmap::webhook::{InjectionConfig, serve};
use bucketmap_testkit::free_port;
use bucketmap_testkit::testenv::{self, TestEnv};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::time::Instant;

const SECRET: &str = "bucketmap-webhook-tls";
const NOT_AFTER: &str = "bucketmap.dev/not-after";
/// How often the operator checks the certificate here (a minute when it ships).
const REFRESH: Duration = Duration::from_millis(500);

fn labelled_pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {INJECT_LABEL: "true"}},
        "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
    }))?)
}

fn injected(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .any(|c| c.name == SIDECAR_NAME)
    })
}

/// The CA in the configuration's first webhook, as PEM text.
async fn ca_bundle(api: &Api<MutatingWebhookConfiguration>, name: &str) -> anyhow::Result<String> {
    let config = api.get(name).await?;
    let bundle = config
        .webhooks
        .and_then(|w| w.into_iter().next())
        .and_then(|w| w.client_config.ca_bundle)
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    Ok(bundle.unwrap_or_default())
}

/// The Secret's `ca.crt` and its not-after annotation.
async fn secret_state(api: &Api<Secret>) -> anyhow::Result<(String, String)> {
    let secret = api.get(SECRET).await?;
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default();
    let not_after = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NOT_AFTER))
        .cloned()
        .unwrap_or_default();
    Ok((ca, not_after))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_almost_expired_certificate_is_renewed_without_a_failed_admission() -> anyhow::Result<()>
{
    bucketmap_testkit::install_crypto_provider();
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    let ns = testenv::create_namespace(&client, "renewal").await?;
    // No controller-manager makes the `default` ServiceAccount here.
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await?;

    // The webhook as the API server sees it: failurePolicy Fail, so a
    // handshake the CA bundle does not vouch for is a failed admission.
    let port = free_port()?;
    let config_name = format!("bucketmap-{ns}");
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let config: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": config_name},
        "webhooks": [{
            "name": "inject.bucketmap.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/mutate-pods")},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "objectSelector": {"matchLabels": {INJECT_LABEL: "true"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        }],
    }))?;
    configs.create(&PostParams::default(), &config).await?;

    // The operator's certificate handling and webhook server, in process,
    // checking the certificate every REFRESH.
    let source = CertSource::SelfManaged {
        client: client.clone(),
        namespace: ns.clone(),
        secret: SECRET.to_owned(),
        hosts: vec!["127.0.0.1".to_owned()],
        webhook_config: config_name.clone(),
    };
    let certs = tls::start(source, REFRESH).await?;
    let cfg = InjectionConfig {
        sidecar_image: "example/bucketmap:test".to_owned(),
        port: 9023,
        admin_port: 9024,
        map_name: "bucketmap".to_owned(),
        extra_args: Vec::new(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        format!("127.0.0.1:{port}").parse()?,
        certs,
        cfg,
        None,
        async move {
            let _ = stopped.await;
        },
        // The drain after `stop`: this test waits for no request.
        std::time::Duration::from_secs(10),
    ));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let (first_ca, first_not_after) = secret_state(&secrets).await?;
    anyhow::ensure!(
        first_ca.contains("BEGIN CERTIFICATE"),
        "no CA in the Secret"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // The first admission: the API server may take a moment to use the
    // configuration's new caBundle; from then on, none may fail.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match pods
            .create(&PostParams::default(), &labelled_pod("first")?)
            .await
        {
            Ok(pod) => {
                assert!(injected(&pod), "the first pod was not injected");
                break;
            }
            Err(e) if Instant::now() < deadline => {
                tracing::info!(error = %e, "webhook not trusted yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("the first labelled pod was never admitted"),
        }
    }

    // Pods are created all along, one after the other.
    let running = Arc::new(AtomicBool::new(true));
    let traffic = tokio::spawn({
        let (pods, running) = (pods.clone(), running.clone());
        async move {
            let (mut admitted, mut failures) = (0usize, Vec::new());
            let mut i = 0;
            while running.load(Ordering::SeqCst) {
                i += 1;
                match pods
                    .create(&PostParams::default(), &labelled_pod(&format!("pod-{i}"))?)
                    .await
                {
                    Ok(pod) if injected(&pod) => admitted += 1,
                    Ok(_) => failures.push(format!("pod-{i} admitted without the sidecar")),
                    Err(e) => failures.push(format!("pod-{i}: {e}")),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok((admitted, failures))
        }
    });

    // The Secret now says its certificate expires tomorrow, inside the
    // renewal window (the operator reads the expiry it recorded there).
    tokio::time::sleep(REFRESH * 2).await;
    let tomorrow =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(24);
    secrets
        .patch(
            SECRET,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {NOT_AFTER: tomorrow.to_string()}}
            })),
        )
        .await?;

    // Renewed: new material in the Secret, valid again for long, and its CA
    // in the caBundle.
    let deadline = Instant::now() + Duration::from_secs(60);
    let renewed_ca = loop {
        let (ca, not_after) = secret_state(&secrets).await?;
        let bundle = ca_bundle(&configs, &config_name).await?;
        if ca != first_ca && bundle == ca {
            assert_ne!(
                not_after,
                tomorrow.to_string(),
                "renewed but still expiring"
            );
            assert_ne!(not_after, first_not_after, "renewed with the old expiry");
            let not_after: k8s_openapi::jiff::Timestamp = not_after.parse()?;
            assert!(
                not_after > tomorrow + k8s_openapi::jiff::SignedDuration::from_hours(24 * 30),
                "the renewed certificate expires at {not_after}"
            );
            break ca;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not renewed: Secret CA changed {}, caBundle follows it {}",
            ca != first_ca,
            bundle == ca
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Some admissions after the caBundle changed: the new certificate is
    // the one served, and it is trusted.
    tokio::time::sleep(REFRESH * 4).await;
    running.store(false, Ordering::SeqCst);
    let (admitted, failures) = traffic.await??;
    assert!(
        renewed_ca.contains("BEGIN CERTIFICATE"),
        "the renewed Secret holds no CA"
    );
    eprintln!("{admitted} pods admitted while the certificate was renewed");
    assert_eq!(failures, Vec::<String>::new(), "failed admissions");
    // The traffic spanned the renewal: pods were admitted throughout.
    assert!(admitted >= 10, "only {admitted} pods admitted meanwhile");
    let last = pods
        .create(&PostParams::default(), &labelled_pod("last")?)
        .await
        .context("a pod after the renewal")?;
    assert!(injected(&last), "the last pod was not injected");
    let _ = stop.send(());
    server.await??;
    Ok(())
}
