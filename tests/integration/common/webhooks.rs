//! The operator's webhooks in the tests: the shipped entries of
//! deploy/webhook.yaml registered for one fixture, and the operator binary
//! serving them.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, PostParams};

use super::{Fixture, PROJECT};

/// The shipped webhook `name`, calling `https://127.0.0.1:port{path}` and
/// trusting `ca`, registered for the fixture's namespace only.
pub async fn register_shipped(
    f: &Fixture,
    name: &str,
    port: u16,
    path: &str,
    ca: &str,
) -> anyhow::Result<serde_json::Value> {
    let url = format!("https://127.0.0.1:{port}{path}");
    let mut hook = bucketmap_testkit::shipped_webhook(name, &url, Some(ca))?;
    hook["namespaceSelector"] =
        serde_json::json!({"matchLabels": {"kubernetes.io/metadata.name": f.ns}});
    let config: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{name}-{}", f.ns)},
        "webhooks": [hook.clone()],
    }))?;
    Api::<MutatingWebhookConfiguration>::all(f.client.clone())
        .create(&PostParams::default(), &config)
        .await?;
    Ok(hook)
}

/// `bucketmap operator` (controller and webhooks) for the fixture's
/// namespace, serving the webhooks on `port` with the certificate in
/// `dir`; callers add their flags and spawn it.
pub fn operator_with_webhooks(
    f: &Fixture,
    port: u16,
    dir: &std::path::Path,
) -> tokio::process::Command {
    let mut command = f.operator_command();
    command
        .args(["--namespace", &f.ns])
        .args(["--webhook-addr", &format!("127.0.0.1:{port}")])
        .arg("--webhook-cert-dir")
        .arg(dir)
        .args(["--default-project", PROJECT])
        .args(["--metrics-addr", "127.0.0.1:0"]);
    command
}
