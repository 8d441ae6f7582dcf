//! The product installed on a [`Node`] as a user installs it: the images
//! loaded into the node's containerd, GCS where pods reach it (the
//! in-memory mock for the operator, fake-gcs-server for object data), the
//! chart installed with `helm install`, the examples applied with
//! `kubectl apply`. Shared by the node tests and `cargo dev --node`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::netns::Forwarder;
use super::{NODE_IP, Node};
use crate::images;
use crate::mock_gcs::{MockGcs, MockHandle};
use anyhow::{Context as _, Result, bail, ensure};

/// fake-gcs-server's port on the node's address.
pub const FAKE_GCS_PORT: u16 = 4443;
/// The chart's release.
pub const RELEASE: &str = "bucketmap";
/// The namespace the chart is installed into.
pub const SYSTEM_NAMESPACE: &str = "bucketmap-system";
/// The examples applied (the by-hand sidecar example forwards to the real
/// GCS, which pods here cannot reach).
pub const EXAMPLES: [&str; 3] = ["photos.yaml", "logs-all-fields.yaml", "photo-app.yaml"];

/// What runs besides the chart: GCS, as pods and the machine reach it.
pub struct Product {
    /// The operator's GCS.
    pub mock: MockGcs,
    /// fake-gcs-server (object data) as the machine reaches it.
    pub fake_gcs: Forwarder,
    mirror: tokio::task::JoinHandle<()>,
}

impl Drop for Product {
    fn drop(&mut self) {
        self.mirror.abort();
    }
}

/// Loads the images, starts GCS, installs the chart and applies the
/// examples.
pub async fn install(node: &mut Node) -> Result<Product> {
    load_images(node).await?;
    let mock = MockGcs::serve_std(node.bind(0)?, MockHandle::new())?;
    let fake_gcs = start_fake_gcs(node).await?;
    let mirror = tokio::spawn(mirror_buckets(
        mock.handle(),
        fake_gcs.local_addr().to_string(),
    ));
    helm_install(node, mock.addr().port()).await?;
    let mut args = vec!["apply".to_owned()];
    for file in EXAMPLES {
        args.push("-f".to_owned());
        args.push(
            crate::repo_path(&format!("examples/{file}"))
                .display()
                .to_string(),
        );
    }
    kubectl(node, &args).await?;
    Ok(Product {
        mock,
        fake_gcs,
        mirror,
    })
}

async fn load_images(node: &Node) -> Result<()> {
    let out = tempfile::tempdir()?.keep();
    let pause = node.node_binaries().join("pause");
    let address = node.containerd_address();
    tokio::task::spawn_blocking(move || -> Result<()> {
        for archive in [
            images::pause_image(&pause, &out)?,
            images::product_image(&out)?,
            images::example_app_image(&out)?,
        ] {
            images::import(&address, &archive)?;
        }
        std::fs::remove_dir_all(&out).ok();
        Ok(())
    })
    .await
    .context("the image task panicked")?
}

async fn start_fake_gcs(node: &mut Node) -> Result<Forwarder> {
    let bin = tool("tools/fake-gcs-server/install.sh").await?;
    let host = format!("{NODE_IP}:{FAKE_GCS_PORT}");
    let args: Vec<String> = [
        "-scheme",
        "http",
        "-host",
        NODE_IP,
        "-backend",
        "memory",
        "-log-level",
        "error",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([
        "-port".to_owned(),
        FAKE_GCS_PORT.to_string(),
        "-public-host".to_owned(),
        host.clone(),
        "-external-url".to_owned(),
        format!("http://{host}"),
    ])
    .collect();
    node.spawn("fake-gcs-server", &bin, &args)?;
    let forwarder = node.forward(FAKE_GCS_PORT).await?;
    let addr = forwarder.local_addr().to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, _)) = crate::http::request(&addr, "GET", "/_internal/healthcheck", "").await
        {
            return Ok(forwarder);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "fake-gcs-server did not come up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Object data lives in fake-gcs-server, buckets are made by the operator
/// in the mock: every bucket the mock holds is created in fake-gcs-server
/// too (never the other way round).
async fn mirror_buckets(mock: MockHandle, fake_gcs: String) {
    let mut mirrored = std::collections::BTreeSet::new();
    loop {
        for bucket in mock.buckets() {
            let id = bucket.bucket_id.clone();
            if mirrored.contains(&id) {
                continue;
            }
            let body = serde_json::json!({ "name": id }).to_string();
            let path = "/storage/v1/b?project=bucketmap-node";
            if let Ok((200 | 409, _)) = crate::http::request(&fake_gcs, "POST", path, &body).await {
                mirrored.insert(id);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The values the node installs with, as a platform team keeps them in Git:
/// numbers unquoted (helm hands the chart a values file's numbers as
/// floats), the operator pointed at the mock and the injected sidecars at
/// fake-gcs-server.
fn values_file(mock_port: u16) -> String {
    format!(
        "defaultProject: bucketmap-node
serviceAccount:
  gcpServiceAccount: \"\"
workloadIdentity:
  pool: bucketmap-node.svc.id.goog
  projectNumber: 123456789012
extraArgs:
  - --gcs-endpoint=http://{NODE_IP}:{mock_port}
  - --gcs-anonymous
sidecar:
  extraArgs:
    - --upstream=http://{NODE_IP}:{FAKE_GCS_PORT}
    - --no-auth
"
    )
}

/// `helm install -f` of the chart with the images loaded into the node,
/// from a values file as GitOps tools install it ([`values_file`]).
async fn helm_install(node: &Node, mock_port: u16) -> Result<()> {
    let helm = tool("tools/helm/install.sh").await?;
    let chart = chart();
    let dir = tempfile::tempdir()?;
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, values_file(mock_port))
        .with_context(|| format!("cannot write {}", values.display()))?;
    let args: Vec<String> = vec![
        "install".into(),
        RELEASE.into(),
        chart.display().to_string(),
        "--namespace".into(),
        SYSTEM_NAMESPACE.into(),
        "--create-namespace".into(),
        "--kubeconfig".into(),
        node.kubeconfig_path().display().to_string(),
        "-f".into(),
        values.display().to_string(),
        "--wait".into(),
        "--timeout".into(),
        "5m".into(),
    ];
    run(&helm, &args).await.map(drop)
}

/// `kubectl apply -f -` of `yaml` against the node.
pub async fn kubectl_apply(node: &Node, yaml: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(node.kubeconfig_path())
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run kubectl")?;
    let mut stdin = child.stdin.take().context("kubectl without stdin")?;
    stdin.write_all(yaml.as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    ensure!(
        out.status.success(),
        "kubectl apply failed: {}\n{yaml}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// `kubectl ARGS` against the node; its stdout.
pub async fn kubectl(node: &Node, args: &[String]) -> Result<String> {
    let mut full = vec![
        "--kubeconfig".to_owned(),
        node.kubeconfig_path().display().to_string(),
    ];
    full.extend_from_slice(args);
    run(Path::new("kubectl"), &full).await
}

/// The chart, as the node installs it.
pub fn chart() -> PathBuf {
    crate::repo_path("deploy/chart/bucketmap")
}

/// `helm ARGS` (the pinned helm) against the node; its stdout.
pub async fn helm(node: &Node, args: &[&str]) -> Result<String> {
    let helm = tool("tools/helm/install.sh").await?;
    let mut full: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    full.push("--kubeconfig".into());
    full.push(node.kubeconfig_path().display().to_string());
    run(&helm, &full).await
}

/// Runs `program args…`; its stdout, or an error with its stderr.
async fn run(program: &Path, args: &[String]) -> Result<String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("cannot run {}", program.display()))?;
    if !out.status.success() {
        bail!(
            "`{} {}` failed ({}): {}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A tool from `tools/*/install.sh` (built once, cached): its path.
async fn tool(script: &str) -> Result<PathBuf> {
    let out = run(
        Path::new("bash"),
        &[crate::repo_path(script).display().to_string()],
    )
    .await?;
    out.lines()
        .last()
        .map(PathBuf::from)
        .with_context(|| format!("{script} printed no path"))
}

/// Waits until the example app has written `hello.txt` through its
/// sidecar: the object is in the physical bucket of `staging/photos`.
/// Returns that bucket's name.
pub async fn example_object_written(node: &Node, product: &Product) -> Result<String> {
    let addr = product.fake_gcs.local_addr().to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let mut last = String::from("the Gcs staging/photos has no physical bucket yet");
    loop {
        let args = [
            "get",
            "gcs",
            "photos",
            "-n",
            "staging",
            "-o",
            "jsonpath={.status.bucketFullName}",
        ]
        .map(str::to_owned);
        if let Ok(physical) = kubectl(node, &args).await
            && !physical.is_empty()
        {
            let path = format!("/storage/v1/b/{physical}/o/hello.txt");
            match crate::http::request(&addr, "GET", &path, "").await {
                Ok((200, _)) => return Ok(physical),
                Ok((code, body)) => last = format!("{path}: {code} {body}"),
                Err(e) => last = format!("{path}: {e:#}"),
            }
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the example app wrote no hello.txt within 5 minutes (last: {last})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
