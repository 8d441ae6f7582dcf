//! Shared fixture of the integration tests: a real kube-apiserver + etcd, the
//! CRD, an in-memory GCS speaking gRPC, and the operator running in-process
//! against them, scoped to one namespace.
#![allow(dead_code)]

pub mod api_proxy;
pub mod certs;
pub mod kubectl;
pub mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bucketmap::controller::{self, OperatorConfig};
use bucketmap::crd::Gcs;
use bucketmap::gcs::{GcsClient, GcsConfig};
use bucketmap::metrics::Metrics;
use bucketmap_testkit::mock_gcs::{MockGcs, MockHandle};
use bucketmap_testkit::testenv::{self, TestEnv};
use k8s_openapi::api::core::v1::Namespace;
use kube::CustomResourceExt as _;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const PROJECT: &str = "test-project";

/// One test's world.
pub struct Fixture {
    pub env: TestEnv,
    pub client: kube::Client,
    pub ns: String,
    pub mock: MockGcs,
    pub gcs: MockHandle,
    pub config: OperatorConfig,
    operator: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
    pub metrics: Arc<Metrics>,
}

/// Operator settings tuned for tests: quick resync, no pacing.
pub fn test_config(ns: &str) -> OperatorConfig {
    OperatorConfig {
        default_project: Some(PROJECT.to_owned()),
        resync: Duration::from_secs(2),
        max_name_attempts: 3,
        namespace: Some(ns.to_owned()),
        concurrency: 16,
        bucket_ops_interval: None,
        map_name: "bucketmap".to_owned(),
        operator_namespace: ns.to_owned(),
        ..OperatorConfig::default()
    }
}

impl Fixture {
    /// Control plane, CRD, mock GCS and a namespace; the operator is not started.
    pub async fn new() -> anyhow::Result<Fixture> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("warn,bucketmap=info")
            .with_test_writer()
            .try_init();
        let env = TestEnv::start().await?;
        let client = env.client().await?;
        bucketmap_testkit::testenv::install_crd(&client, &bucketmap::crd::Gcs::crd()).await?;
        let ns = testenv::create_namespace(&client, "gcs").await?;
        let mock = MockGcs::start().await?;
        let gcs = mock.handle();
        let config = test_config(&ns);
        Ok(Fixture {
            env,
            client,
            ns,
            mock,
            gcs,
            config,
            operator: None,
            metrics: Arc::new(Metrics::default()),
        })
    }

    /// Another cluster (a control plane of its own, the operator not
    /// started) in front of the same GCS: this fixture's mock state served
    /// on a port of its own, and a namespace of the same name.
    pub async fn another_cluster(&self) -> anyhow::Result<Fixture> {
        let env = TestEnv::start().await?;
        let client = env.client().await?;
        bucketmap_testkit::testenv::install_crd(&client, &bucketmap::crd::Gcs::crd()).await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(self.ns.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("create namespace {}", self.ns))?;
        let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
        let mock = MockGcs::start_with(addr, self.gcs.clone()).await?;
        Ok(Fixture {
            env,
            client,
            ns: self.ns.clone(),
            gcs: mock.handle(),
            mock,
            config: self.config.clone(),
            operator: None,
            metrics: Arc::new(Metrics::default()),
        })
    }

    /// Like [`Fixture::new`], with the operator running.
    pub async fn started() -> anyhow::Result<Fixture> {
        let mut f = Fixture::new().await?;
        f.start_operator().await?;
        Ok(f)
    }

    /// Starts an operator instance (a fresh process-like instance: new caches, new client).
    pub async fn start_operator(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.operator.is_none(), "operator already running");
        let client = self.env.client().await?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = self
            .spawn_operator(client, async {
                let _ = rx.await;
            })
            .await?;
        self.operator = Some((tx, task));
        Ok(())
    }

    /// The operator in-process against the mock GCS, talking to the API
    /// server through `client`, until `shutdown` resolves.
    pub async fn spawn_operator(
        &self,
        client: kube::Client,
        shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    ) -> anyhow::Result<JoinHandle<()>> {
        let gcs = GcsClient::connect(
            &GcsConfig {
                endpoint: Some(self.mock.endpoint()),
                anonymous: true,
            },
            self.metrics.clone(),
        )
        .await?;
        Ok(tokio::spawn(controller::run(
            client,
            gcs,
            self.metrics.clone(),
            self.config.clone(),
            || {},
            shutdown,
        )))
    }

    /// Stops the operator abruptly, as a crash would (in-flight work is dropped).
    pub async fn kill_operator(&mut self) {
        if let Some((_tx, task)) = self.operator.take() {
            task.abort();
            let _ = task.await;
        }
    }

    pub fn api(&self) -> Api<Gcs> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates a Gcs from a spec given as JSON.
    pub async fn create(&self, name: &str, spec: serde_json::Value) -> anyhow::Result<Gcs> {
        let obj: Gcs = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.bucketmap.dev/v1alpha1",
            "kind": "Gcs",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec,
        }))?;
        self.api()
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("create Gcs {name}"))
    }

    pub async fn get(&self, name: &str) -> anyhow::Result<Gcs> {
        self.api()
            .get(name)
            .await
            .with_context(|| format!("get Gcs {name}"))
    }

    pub async fn merge_spec(&self, name: &str, spec: serde_json::Value) -> anyhow::Result<Gcs> {
        self.api()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": spec})),
            )
            .await
            .with_context(|| format!("patch Gcs {name}"))
    }

    pub async fn delete(&self, name: &str) -> anyhow::Result<()> {
        self.api()
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("delete Gcs {name}"))?;
        Ok(())
    }

    /// Waits until `check` holds for the Gcs (or fails after `timeout`).
    pub async fn wait_for(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        check: impl Fn(&Gcs) -> bool,
    ) -> anyhow::Result<Gcs> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = self.api().get_opt(name).await?;
            if let Some(g) = &last
                && check(g)
            {
                return Ok(g.clone());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "Gcs {name}: {what} not reached within {timeout:?}; last seen: {last:#?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_ready(&self, name: &str) -> anyhow::Result<Gcs> {
        self.wait_for(name, Duration::from_secs(60), "Ready=True", Gcs::is_ready)
            .await
    }

    pub async fn wait_reason(&self, name: &str, reason: &str) -> anyhow::Result<Gcs> {
        self.wait_for(name, Duration::from_secs(60), reason, |g| {
            g.ready_condition().is_some_and(|c| c.reason == reason)
        })
        .await
    }

    pub async fn wait_gone(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.api().get_opt(name).await?.is_some() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "Gcs {name} still exists after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Reasons of the events recorded for a Gcs.
    pub async fn event_reasons(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.ns);
        let events = api.list(&Default::default()).await?;
        Ok(events
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.reason)
            .collect())
    }

    /// `bucketmap operator` as a child process against this fixture's API
    /// server and mock GCS (pacing off); callers add their own flags.
    pub fn operator_command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_bucketmap"));
        command
            .args([
                "operator",
                "--gcs-anonymous",
                "--gcs-endpoint",
                &self.mock.endpoint(),
            ])
            .args(["--bucket-ops-interval", "0s"])
            // The in-process operator's identity; without it the process
            // would store one in its namespace (tests/integration/manifests.rs does).
            .env("BUCKETMAP_CLUSTER_ID", &self.config.cluster_id)
            .env("KUBECONFIG", self.env.kubeconfig_path())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// Waits until an event with `reason` was recorded for the Gcs.
    pub async fn wait_event(&self, name: &str, reason: &str) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let reasons = self.event_reasons(name).await?;
            if reasons.iter().any(|r| r == reason) {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "no {reason} event for Gcs {name}; events: {reasons:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs kubectl against the test control plane (without blocking the
    /// runtime the operator runs on).
    pub async fn kubectl(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        self.kubectl_with_stdin(args, "").await
    }

    /// kubectl apply of a manifest given on stdin.
    pub async fn kubectl_apply(&self, manifest: &str) -> anyhow::Result<std::process::Output> {
        self.kubectl_with_stdin(&["apply", "-n", &self.ns, "-f", "-"], manifest)
            .await
    }

    pub async fn kubectl_with_stdin(
        &self,
        args: &[&str],
        stdin: &str,
    ) -> anyhow::Result<std::process::Output> {
        kubectl::kubectl_with_stdin(self.env.kubeconfig_path(), args, stdin).await
    }

    pub async fn annotate_namespace(&self, key: &str, value: &str) -> anyhow::Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        api.patch(
            &self.ns,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {key: value}}})),
        )
        .await?;
        Ok(())
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some((_tx, task)) = self.operator.take() {
            task.abort();
        }
    }
}

/// The physical name recorded in status.
pub fn physical(g: &Gcs) -> String {
    g.status
        .as_ref()
        .and_then(|s| s.bucket_full_name.clone())
        .unwrap_or_default()
}

/// UID of an object.
pub fn uid(g: &Gcs) -> String {
    g.uid().unwrap_or_default()
}

impl Fixture {
    /// The namespace's bucket map (empty when the ConfigMap does not exist).
    pub async fn bucket_map(&self) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.client.clone(), &self.ns);
        Ok(api
            .get_opt("bucketmap")
            .await?
            .and_then(|cm| cm.data)
            .unwrap_or_default())
    }
}

impl Fixture {
    /// Fails unless every bucket in the mock has an owner: bucketmap's
    /// complete, consistent ownership labels (the owner key matching the
    /// cluster, namespace and name they name), or its name in `unowned`,
    /// the buckets the scenario expects without one (its own foreign
    /// buckets, an abandoned one). Each of those must exist, too.
    pub fn assert_every_bucket_owned(&self, unowned: &[&str]) -> anyhow::Result<()> {
        use bucketmap::naming::{
            CLUSTER_LABEL, Identity, MANAGED_BY_LABEL, MANAGED_BY_VALUE, NAME_LABEL,
            NAMESPACE_LABEL, OWNER_LABEL,
        };
        let buckets = self.gcs.buckets();
        let mut problems = Vec::new();
        for b in &buckets {
            let label = |k: &str| b.labels.get(k).map(String::as_str);
            let owned = match (
                label(CLUSTER_LABEL),
                label(NAMESPACE_LABEL),
                label(NAME_LABEL),
            ) {
                (Some(cluster), Some(namespace), Some(name)) => {
                    let key = Identity {
                        cluster,
                        namespace,
                        name,
                    }
                    .owner_key();
                    label(OWNER_LABEL) == Some(key.as_str())
                        && label(MANAGED_BY_LABEL) == Some(MANAGED_BY_VALUE)
                }
                _ => false,
            };
            if !owned && !unowned.contains(&b.bucket_id.as_str()) {
                problems.push(format!("{} (labels {:?})", b.bucket_id, b.labels));
            }
        }
        for id in unowned {
            if !buckets.iter().any(|b| b.bucket_id == *id) {
                problems.push(format!("{id}, expected without an owner, is gone"));
            }
        }
        anyhow::ensure!(
            problems.is_empty(),
            "buckets without an owner the test expects: {}",
            problems.join("; ")
        );
        Ok(())
    }
}
