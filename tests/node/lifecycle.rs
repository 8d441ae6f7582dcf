//! Scenario (g): the helm lifecycle a platform team runs from a values
//! file, as a GitOps tool does: `helm get values` saved, `helm uninstall`
//! (the CRD and every `Gcs` stay), `helm install -f` of the saved values,
//! `helm upgrade --reuse-values`. After each install the operator checks
//! every resource again (asked through the annotation
//! `bucketmap.dev/reconcile-requested-at`) and finds the same bucket:
//! nothing replaced, no second bucket, every resource Ready.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context as _, Result, ensure};
use bucketmap::crd::{Gcs, RECONCILE_REQUEST_ANNOTATION};
use bucketmap_testkit::node::product::{RELEASE, SYSTEM_NAMESPACE, chart, helm};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use crate::cluster::Cluster;
use crate::scenarios::eventually;

/// Every Ready `Gcs`: "namespace/name" → (uid, physical bucket).
async fn ready_buckets(c: &Cluster) -> Result<BTreeMap<String, (String, String)>> {
    let all: Api<Gcs> = Api::all(c.client.clone());
    let mut out = BTreeMap::new();
    for g in all.list(&ListParams::default()).await? {
        let physical = g.status.as_ref().and_then(|s| s.bucket_full_name.clone());
        if let (true, Some(physical)) = (g.is_ready(), physical) {
            let key = format!(
                "{}/{}",
                g.metadata.namespace.clone().unwrap_or_default(),
                g.metadata.name.clone().unwrap_or_default()
            );
            out.insert(key, (g.metadata.uid.clone().unwrap_or_default(), physical));
        }
    }
    Ok(out)
}

/// Asks the operator to check every resource of `expected` now, and waits
/// until it did and each is Ready with the same uid and bucket.
async fn checked_again(
    c: &Cluster,
    expected: &BTreeMap<String, (String, String)>,
    step: &str,
) -> Result<()> {
    let requested = format!("{step}-{}", std::process::id());
    for key in expected.keys() {
        let (ns, name) = key.split_once('/').context("a namespace/name key")?;
        let api: Api<Gcs> = Api::namespaced(c.client.clone(), ns);
        let patch = serde_json::json!({"metadata": {"annotations": {RECONCILE_REQUEST_ANNOTATION: requested}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    eventually(&format!("every Gcs checked again after {step}"), || async {
        let all: Api<Gcs> = Api::all(c.client.clone());
        let handled = all
            .list(&ListParams::default())
            .await?
            .into_iter()
            .filter(|g| {
                g.is_ready()
                    && g.status
                        .as_ref()
                        .and_then(|s| s.last_handled_reconcile_at.as_deref())
                        == Some(requested.as_str())
            });
        Ok((handled.count() >= expected.len()).then_some(()))
    })
    .await?;
    let now = ready_buckets(c).await?;
    for (key, was) in expected {
        ensure!(
            now.get(key) == Some(was),
            "after {step}, {key} is {:?}, was {was:?}",
            now.get(key)
        );
    }
    Ok(())
}

/// `helm get values` of the release, as a platform team saves it: the
/// project number's digits in it; written to a file in `dir`.
async fn saved_values(c: &Cluster, dir: &std::path::Path) -> Result<String> {
    let args = [
        "get",
        "values",
        RELEASE,
        "-n",
        SYSTEM_NAMESPACE,
        "-o",
        "yaml",
    ];
    let values = helm(&c.node, &args).await?;
    ensure!(
        values.contains("projectNumber: 123456789012\n"),
        "helm get values:\n{values}"
    );
    let file = dir.join("values.yaml");
    std::fs::write(&file, &values)?;
    Ok(file.display().to_string())
}

/// `helm uninstall`: every `Gcs` stays.
async fn uninstall(c: &Cluster, expected: usize) -> Result<()> {
    helm(
        &c.node,
        &["uninstall", RELEASE, "-n", SYSTEM_NAMESPACE, "--wait"],
    )
    .await?;
    let kept: Api<Gcs> = Api::all(c.client.clone());
    let left = kept.list(&ListParams::default()).await?.items.len();
    ensure!(
        left >= expected,
        "{left} Gcs left after the uninstall, {expected} before"
    );
    Ok(())
}

/// (g) See the module's comment.
pub async fn the_helm_lifecycle_keeps_every_bucket(c: Arc<Cluster>) -> Result<()> {
    let expected = ready_buckets(&c).await?;
    ensure!(
        expected.contains_key("staging/photos"),
        "Ready: {expected:?}"
    );
    let buckets = c.product.mock.handle().buckets().len();
    let dir = tempfile::tempdir()?;
    let file = saved_values(&c, dir.path()).await?;
    let chart = chart().display().to_string();
    uninstall(&c, expected.len()).await?;
    let wait = ["--wait", "--timeout", "5m"];
    let install = [
        "install",
        RELEASE,
        &chart,
        "-n",
        SYSTEM_NAMESPACE,
        "-f",
        &file,
    ];
    helm(&c.node, &[&install[..], &wait[..]].concat()).await?;
    checked_again(&c, &expected, "reinstall").await?;
    let upgrade = [
        "upgrade",
        RELEASE,
        &chart,
        "-n",
        SYSTEM_NAMESPACE,
        "--reuse-values",
    ];
    helm(&c.node, &[&upgrade[..], &wait[..]].concat()).await?;
    checked_again(&c, &expected, "upgrade").await?;
    let now = c.product.mock.handle().buckets().len();
    ensure!(
        now == buckets,
        "{now} buckets in GCS, {buckets} before: a bucket was created again"
    );
    Ok(())
}
