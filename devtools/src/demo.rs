//! The data-plane half of `cargo dev`: the sidecar in front of a local
//! GCS emulator, fed with one namespace's bucket map, and an example app
//! that writes through it with a real client library and the logical name.
//!
//! The operator's GCS in `cargo dev` is the in-memory gRPC mock (the
//! control plane); object data needs the JSON/XML APIs, which
//! fake-gcs-server provides. The demo keeps the two in step: every bucket
//! in the namespace's map is created in fake-gcs-server too, and the map is
//! written to files the way the kubelet mounts the ConfigMap.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use bucketmap_sidecar::config::Config;
use clap::Parser as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use tokio::process::{Child, Command};

use bucketmap_testkit::free_port;
use bucketmap_testkit::http::request as http;

/// Runs an install script of the repository and returns its last stdout line.
async fn install(script: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("bash")
        .arg(bucketmap_testkit::repo_path(script))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("cannot run {script}"))?;
    anyhow::ensure!(out.status.success(), "{script} failed ({})", out.status);
    String::from_utf8(out.stdout)?
        .lines()
        .last()
        .map(str::to_owned)
        .with_context(|| format!("{script} printed nothing"))
}

/// The programs the demo runs beside the sidecar, each installed (built
/// on first use, then cached) by its script.
pub struct Tools {
    /// fake-gcs-server, the data plane.
    fake_gcs: String,
    /// The Python interpreter with Google's client, for the example app.
    python: String,
}

/// Installs the demo's programs. `cargo dev` runs this while the control
/// plane starts: on a first run both are built, and later they are found
/// in the cache.
pub async fn install_tools() -> anyhow::Result<Tools> {
    let (fake_gcs, python) = tokio::try_join!(
        install("tools/fake-gcs-server/install.sh", &[]),
        install("sidecar/tests/clients/install.sh", &["python"]),
    )?;
    let python = python.strip_prefix("python=").unwrap_or(&python).to_owned();
    Ok(Tools { fake_gcs, python })
}

async fn wait_http(addr: &str, path: &str, what: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((200, _)) = http(addr, "GET", path, "").await {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{what} did not come up on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The running data plane of the demo.
pub struct Demo {
    _fake_gcs: Child,
    /// `None` once stopped.
    sidecar: Option<Sidecar>,
    sync: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
    /// Where applications point `STORAGE_EMULATOR_HOST`.
    pub sidecar_url: String,
    /// The example app's Python.
    python: String,
    /// fake-gcs-server's address (host:port).
    pub data_plane: String,
}

impl Demo {
    /// Stops the sidecar before its map's directory goes, then the rest.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.sync.abort();
        match self.sidecar.take() {
            Some(sidecar) => sidecar.stop().await,
            None => Ok(()),
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.sync.abort();
        // Dropped without `stop` (an error on the way): the sidecar task
        // stops when its sender goes, draining on its own.
    }
}

/// Writes the map as a mounted ConfigMap and creates its buckets in the
/// data plane. Returns the map.
async fn sync_once(
    client: &kube::Client,
    namespace: &str,
    map_name: &str,
    dir: &Path,
    data_plane: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let map = api
        .get_opt(map_name)
        .await?
        .and_then(|c| c.data)
        .unwrap_or_default();
    for (logical, physical) in &map {
        // 409 when it exists already: fine.
        let body = serde_json::json!({ "name": physical }).to_string();
        http(
            data_plane,
            "POST",
            "/storage/v1/b?project=bucketmap-dev",
            &body,
        )
        .await?;
        let tmp = dir.join(format!(".{logical}.tmp"));
        std::fs::write(&tmp, physical)?;
        std::fs::rename(&tmp, dir.join(logical))?;
    }
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && !map.contains_key(&name) {
            std::fs::remove_file(dir.join(&name))?;
        }
    }
    Ok(map)
}

/// Starts fake-gcs-server and the sidecar for `namespace`, and keeps the
/// sidecar's map in step with the namespace's ConfigMap. With
/// `grpc_upstream` (the mock GCS), the sidecar's gRPC side forwards there.
pub async fn start(
    client: &kube::Client,
    namespace: &str,
    map_name: &str,
    grpc_upstream: Option<&str>,
    tools: Tools,
) -> anyhow::Result<Demo> {
    let (fake_gcs, data_plane) = start_fake_gcs(&tools.fake_gcs).await?;
    let dir = tempfile::Builder::new()
        .prefix("bucketmap-dev-map-")
        .tempdir()?;
    sync_once(client, namespace, map_name, dir.path(), &data_plane).await?;
    let sync = {
        let (client, namespace, map_name) =
            (client.clone(), namespace.to_owned(), map_name.to_owned());
        let (dir, data_plane) = (dir.path().to_owned(), data_plane.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                if let Err(e) = sync_once(&client, &namespace, &map_name, &dir, &data_plane).await {
                    tracing::warn!(error = %format!("{e:#}"), "cannot sync the demo's bucket map");
                }
            }
        })
    };
    let (sidecar, sidecar_addr) = start_sidecar(&data_plane, grpc_upstream, dir.path()).await?;
    Ok(Demo {
        _fake_gcs: fake_gcs,
        sidecar: Some(sidecar),
        sync,
        _dir: dir,
        sidecar_url: format!("http://{sidecar_addr}"),
        python: tools.python,
        data_plane,
    })
}

/// fake-gcs-server (in memory, plain HTTP) on a free loopback port, once it
/// answers its health check: (process, host:port).
async fn start_fake_gcs(fake_bin: &str) -> anyhow::Result<(Child, String)> {
    let port = free_port()?;
    let data_plane = format!("127.0.0.1:{port}");
    let fake_gcs = Command::new(fake_bin)
        .args([
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-backend",
            "memory",
        ])
        .args(["-port", &port.to_string(), "-public-host", &data_plane])
        .args(["-external-url", &format!("http://{data_plane}")])
        .args(["-log-level", "error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start fake-gcs-server ({fake_bin})"))?;
    wait_http(&data_plane, "/_internal/healthcheck", "fake-gcs-server").await?;
    Ok((fake_gcs, data_plane))
}

/// `bucketmap-sidecar` in front of `data_plane` with the map in `map_dir`,
/// once it is ready: (the running sidecar, host:port). It runs inside this
/// process, from the flags a pod's sidecar gets (as the binary parses
/// them), until the demo ends.
async fn start_sidecar(
    data_plane: &str,
    grpc_upstream: Option<&str>,
    map_dir: &Path,
) -> anyhow::Result<(Sidecar, String)> {
    let sidecar_addr = format!("127.0.0.1:{}", free_port()?);
    let upstream = format!("http://{data_plane}");
    let mut args: Vec<OsString> = [
        "bucketmap-sidecar",
        "--listen",
        &sidecar_addr,
        "--upstream",
        &upstream,
        "--no-auth",
    ]
    .map(OsString::from)
    .into();
    if let Some(url) = grpc_upstream {
        args.extend(["--grpc-upstream", url].map(OsString::from));
    }
    args.extend([OsString::from("--mapping-dir"), map_dir.into()]);
    let config = Config::try_parse_from(args).context("the demo's sidecar flags")?;
    config.validate().map_err(anyhow::Error::msg)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut task = tokio::spawn(bucketmap_sidecar::server::run_until(config, async {
        let _ = stopped.await;
    }));
    tokio::select! {
        ready = wait_http(&sidecar_addr, "/_bucketmap/readyz", "bucketmap-sidecar") => ready?,
        ended = &mut task => {
            ended.context("the sidecar's task")??;
            anyhow::bail!("the sidecar stopped before it was ready");
        }
    }
    Ok((Sidecar { stop, task }, sidecar_addr))
}

/// The demo's sidecar, running on this process's runtime.
struct Sidecar {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Sidecar {
    /// Stops it as SIGTERM stops the binary, and waits while it drains.
    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("the sidecar's task")?
    }
}

impl Demo {
    /// Waits until the sidecar maps `logical`. The sidecar is ready once it
    /// has read a map, even an empty one, and the operator publishes the map
    /// a moment after the bucket is Ready: until then `logical` gets a 404.
    async fn wait_mapped(&self, logical: &str) -> anyhow::Result<()> {
        let addr = self
            .sidecar_url
            .strip_prefix("http://")
            .unwrap_or(&self.sidecar_url);
        let path = format!("/storage/v1/b/{logical}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = http(addr, "GET", &path, "").await?;
            if status != 404 {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the sidecar never mapped {logical}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `GetBucket` with the logical name through the sidecar's gRPC side
    /// (the generated `google.storage.v2` client); the bucket name the
    /// answer shows.
    pub async fn grpc_get_bucket(&self, logical: &str) -> anyhow::Result<String> {
        use bucketmap_testkit::mock_gcs::proto;
        let channel = tonic::transport::Endpoint::from_shared(self.sidecar_url.clone())?
            .connect()
            .await
            .context("cannot open an HTTP/2 connection to the sidecar")?;
        let mut client = proto::storage_client::StorageClient::new(channel);
        let name = format!("projects/_/buckets/{logical}");
        let mut request = tonic::Request::new(proto::GetBucketRequest {
            name: name.clone(),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("x-goog-request-params", format!("bucket={name}").parse()?);
        let bucket = client
            .get_bucket(request)
            .await
            .with_context(|| format!("GetBucket {name} through the sidecar"))?
            .into_inner();
        anyhow::ensure!(
            bucket.name.ends_with(&format!("/buckets/{logical}")),
            "GetBucket {name} through the sidecar answered {}",
            bucket.name
        );
        Ok(bucket.name)
    }

    /// Runs `examples/app/photo_app.py` (the Python client, logical name
    /// `logical`) through the sidecar, then reads the object back from the
    /// physical bucket in the data plane. Returns the app's output.
    pub async fn run_example_app(&self, logical: &str, physical: &str) -> anyhow::Result<String> {
        self.wait_mapped(logical).await?;
        let out = Command::new(&self.python)
            .arg(bucketmap_testkit::repo_path("examples/app/photo_app.py"))
            .arg(logical)
            .env("STORAGE_EMULATOR_HOST", &self.sidecar_url)
            .output()
            .await
            .context("cannot run the example app")?;
        anyhow::ensure!(
            out.status.success(),
            "the example app failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (status, body) = http(
            &self.data_plane,
            "GET",
            &format!("/storage/v1/b/{physical}/o/hello.txt?alt=media"),
            "",
        )
        .await?;
        anyhow::ensure!(
            status == 200,
            "hello.txt is not in the physical bucket {physical} ({status}): {body}"
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}
