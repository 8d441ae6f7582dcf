//! Bringing the node up, component by component, each waited for before
//! the next one needs it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;

use super::Node;
use super::cleanup;
use super::config;
use super::layout::{
    API_PORT, API_SERVICE_IP, CLUSTER_DOMAIN, Layout, NETNS, NODE_IP, NODE_NAME, POD_SUBNET,
    SERVICE_RANGE,
};
use super::netns::{self, Forwarder};
use super::pki::Pki;
use crate::testenv::{self, Process};

/// How long each component may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(200);

/// The binaries' directories: the control plane's and the node's.
struct Binaries {
    control_plane: PathBuf,
    node: PathBuf,
}

fn binaries() -> Result<Binaries> {
    let control_plane = testenv::assets_dir()?;
    tracing::info!("locating or building the node components (tools/node/install.sh)");
    let node = testenv::run_tool_script(&crate::repo_path("tools/node/install.sh"))?;
    Ok(Binaries {
        control_plane,
        node,
    })
}

/// Starts `program args…` inside the node's namespace.
pub(crate) fn spawn_in_node(
    layout: &Layout,
    name: &'static str,
    program: &Path,
    args: &[String],
) -> Result<Process> {
    let mut full = vec![
        format!("--net={}", netns::netns_path(NETNS).display()),
        "--".to_owned(),
        program.display().to_string(),
    ];
    full.extend_from_slice(args);
    let log = layout.logs().join(format!("{name}.log"));
    Process::spawn(name, Path::new("nsenter"), &full, &log)
}

pub(crate) async fn start() -> Result<Node> {
    crate::install_crypto_provider();
    let bins = tokio::task::spawn_blocking(binaries)
        .await
        .context("the task locating the binaries panicked")??;
    let layout = Layout::new();
    let lock = take_lock()?;
    cleanup::sweep(&layout).context("cannot clear what an earlier node left")?;
    for dir in [
        layout.logs(),
        layout.pki(),
        layout.cni_conf(),
        layout.cni_ipam(),
    ] {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    netns::create(NETNS, NODE_IP, SERVICE_RANGE)?;
    let pki = Pki::generate()?;
    write_pki(&layout, &pki)?;

    let mut processes = Vec::new();
    let forwarder = Forwarder::start(NETNS, format!("{NODE_IP}:{API_PORT}").parse()?).await?;
    let config = control_plane(&layout, &bins, &pki, &forwarder, &mut processes).await?;
    controllers(&layout, &bins, &mut processes)?;
    let client = kube::Client::try_from(config.clone())?;
    node_daemons(&layout, &bins, &mut processes).await?;
    wait_node_ready(&client, &mut processes).await?;
    Ok(Node {
        processes: tokio::sync::Mutex::new(processes),
        forwarder,
        config,
        layout,
        node_bin: bins.node,
        _lock: lock,
    })
}

/// The machine-wide lock: one node at a time.
fn take_lock() -> Result<File> {
    let path = Path::new("/var/lib/bucketmap-node.lock");
    let file = File::create(path).with_context(|| format!("cannot open {}", path.display()))?;
    if file.try_lock().is_err() {
        tracing::info!("another node runs on this machine; waiting for it to stop");
        file.lock()
            .with_context(|| format!("cannot lock {}", path.display()))?;
    }
    Ok(file)
}

fn write_pki(layout: &Layout, pki: &Pki) -> Result<()> {
    let dir = layout.pki();
    config::write(&dir.join("ca.crt"), &pki.ca_pem())?;
    config::write(&dir.join("sa.key"), &pki.service_account_key)?;
    config::write(&dir.join("sa.pub"), &pki.service_account_public)?;
    let service_names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        &format!("kubernetes.default.svc.{CLUSTER_DOMAIN}"),
        "localhost",
        "127.0.0.1",
        NODE_IP,
        API_SERVICE_IP,
    ];
    pki.server("kube-apiserver", &service_names)?
        .write(&dir, "apiserver")?;
    pki.client("kube-apiserver-kubelet-client", &["system:masters"])?
        .write(&dir, "apiserver-kubelet-client")?;
    let in_node = config::in_node_server();
    let components = [
        (
            "kube-controller-manager",
            "system:kube-controller-manager",
            vec![],
        ),
        ("kube-scheduler", "system:kube-scheduler", vec![]),
        ("kube-proxy", "system:kube-proxy", vec![]),
        (
            "kubelet",
            &*format!("system:node:{NODE_NAME}"),
            vec!["system:nodes"],
        ),
    ];
    for (component, user, groups) in components {
        let pair = pki.client(user, &groups)?;
        let yaml = config::kubeconfig(component, &in_node, &pki.ca_pem(), &pair.cert, &pair.key)?;
        config::write(&layout.kubeconfig(component), &yaml)?;
    }
    Ok(())
}

/// etcd and kube-apiserver; the admin's kube-rs configuration once
/// `/readyz` answers.
async fn control_plane(
    layout: &Layout,
    bins: &Binaries,
    pki: &Pki,
    forwarder: &Forwarder,
    processes: &mut Vec<Process>,
) -> Result<kube::Config> {
    let etcd_args = vec![
        format!("--data-dir={}", layout.etcd_data().display()),
        "--listen-client-urls=http://127.0.0.1:2379".to_owned(),
        "--advertise-client-urls=http://127.0.0.1:2379".to_owned(),
        "--listen-peer-urls=http://127.0.0.1:2380".to_owned(),
        "--unsafe-no-fsync=true".to_owned(),
    ];
    let etcd = spawn_in_node(layout, "etcd", &bins.control_plane.join("etcd"), &etcd_args)?;
    processes.push(etcd);
    let apiserver = bins.control_plane.join("kube-apiserver");
    processes.push(spawn_in_node(
        layout,
        "kube-apiserver",
        &apiserver,
        &apiserver_args(layout),
    )?);

    let admin = pki.client(testenv::ADMIN_USER, &["system:masters"])?;
    let server = format!("https://{}", forwarder.local_addr());
    let yaml = config::kubeconfig(
        "bucketmap-node",
        &server,
        &pki.ca_pem(),
        &admin.cert,
        &admin.key,
    )?;
    testenv::write_private_file(&layout.admin_kubeconfig(), yaml.as_bytes())?;
    let config = testenv::kube_config_from_yaml(&yaml).await?;
    let client = kube::Client::try_from(config.clone())?;
    wait_for("kube-apiserver /readyz", processes, || async {
        testenv::readyz(&client).await.is_ok()
    })
    .await?;

    Ok(config)
}

/// kube-controller-manager and kube-scheduler, with the identities a
/// kubeadm cluster gives them.
fn controllers(layout: &Layout, bins: &Binaries, processes: &mut Vec<Process>) -> Result<()> {
    let pki_dir = layout.pki();
    let kcm = vec![
        format!(
            "--kubeconfig={}",
            layout.kubeconfig("kube-controller-manager").display()
        ),
        "--leader-elect=false".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
        "--use-service-account-credentials=true".to_owned(),
        format!(
            "--service-account-private-key-file={}",
            pki_dir.join("sa.key").display()
        ),
        format!("--root-ca-file={}", pki_dir.join("ca.crt").display()),
        format!("--cluster-cidr={POD_SUBNET}"),
        format!("--service-cluster-ip-range={SERVICE_RANGE}"),
    ];
    let program = bins.node.join("kube-controller-manager");
    processes.push(spawn_in_node(
        layout,
        "kube-controller-manager",
        &program,
        &kcm,
    )?);
    let scheduler = vec![
        format!(
            "--kubeconfig={}",
            layout.kubeconfig("kube-scheduler").display()
        ),
        "--leader-elect=false".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
    ];
    let program = bins.node.join("kube-scheduler");
    processes.push(spawn_in_node(
        layout,
        "kube-scheduler",
        &program,
        &scheduler,
    )?);
    Ok(())
}

fn apiserver_args(layout: &Layout) -> Vec<String> {
    let pki = layout.pki();
    let file = |name: &str| pki.join(name).display().to_string();
    vec![
        format!("--advertise-address={NODE_IP}"),
        "--bind-address=0.0.0.0".to_owned(),
        format!("--secure-port={API_PORT}"),
        "--etcd-servers=http://127.0.0.1:2379".to_owned(),
        format!("--client-ca-file={}", file("ca.crt")),
        format!("--tls-cert-file={}", file("apiserver.crt")),
        format!("--tls-private-key-file={}", file("apiserver.key")),
        format!(
            "--kubelet-client-certificate={}",
            file("apiserver-kubelet-client.crt")
        ),
        format!(
            "--kubelet-client-key={}",
            file("apiserver-kubelet-client.key")
        ),
        // No DNS in the node: the API server reaches the kubelet (logs,
        // exec) by the node's address.
        "--kubelet-preferred-address-types=InternalIP".to_owned(),
        "--authorization-mode=Node,RBAC".to_owned(),
        "--enable-admission-plugins=NodeRestriction".to_owned(),
        format!("--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}"),
        format!("--service-account-key-file={}", file("sa.pub")),
        format!("--service-account-signing-key-file={}", file("sa.key")),
        format!("--service-cluster-ip-range={SERVICE_RANGE}"),
        "--allow-privileged=true".to_owned(),
    ]
}

/// containerd, the kubelet and kube-proxy.
async fn node_daemons(
    layout: &Layout,
    bins: &Binaries,
    processes: &mut Vec<Process>,
) -> Result<()> {
    config::write(&layout.containerd_config(), &config::containerd(layout))?;
    config::write(
        &layout.cni_conf().join("10-bucketmap.conflist"),
        &config::cni(layout),
    )?;
    config::write(&layout.resolv_conf(), "")?;
    let containerd = vec![format!("--config={}", layout.containerd_config().display())];
    processes.push(spawn_in_node(
        layout,
        "containerd",
        Path::new("containerd"),
        &containerd,
    )?);
    let socket = layout.containerd_socket();
    wait_for("containerd's socket", processes, || {
        let exists = socket.exists();
        async move { exists }
    })
    .await?;

    cleanup::record_sysctls(layout)?;
    cleanup::create_cgroup_root(layout)?;
    let kubelet_config = layout.dir.join("kubelet.yaml");
    config::write(&kubelet_config, &config::kubelet(layout))?;
    let kubelet = vec![
        format!("--config={}", kubelet_config.display()),
        format!("--kubeconfig={}", layout.kubeconfig("kubelet").display()),
        format!("--root-dir={}", layout.kubelet_root().display()),
        format!("--cert-dir={}", layout.kubelet_certs().display()),
        format!("--hostname-override={NODE_NAME}"),
        format!("--node-ip={NODE_IP}"),
    ];
    let program = bins.node.join("kubelet");
    processes.push(spawn_in_node(layout, "kubelet", &program, &kubelet)?);

    let proxy_config = layout.dir.join("kube-proxy.yaml");
    config::write(&proxy_config, &config::kube_proxy(layout))?;
    let proxy = vec![format!("--config={}", proxy_config.display())];
    let program = bins.node.join("kube-proxy");
    processes.push(spawn_in_node(layout, "kube-proxy", &program, &proxy)?);
    Ok(())
}

async fn wait_node_ready(client: &kube::Client, processes: &mut [Process]) -> Result<()> {
    let nodes: Api<NodeObject> = Api::all(client.clone());
    wait_for("the Node to be Ready", processes, || async {
        let Ok(Some(node)) = nodes.get_opt(NODE_NAME).await else {
            return false;
        };
        node.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await
}

/// Polls `ready` until it holds; fails when a process exits or after
/// [`READY_TIMEOUT`], with the log tail of the newest process.
pub(crate) async fn wait_for<F, Fut>(
    what: &str,
    processes: &mut [Process],
    mut ready: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        if ready().await {
            return Ok(());
        }
        for process in processes.iter_mut() {
            if let Some(status) = process.exited() {
                return Err(process.exited_error(status))
                    .with_context(|| format!("while waiting for {what}"));
            }
        }
        if tokio::time::Instant::now() > deadline {
            let tail = processes.last().map(Process::log_tail).unwrap_or_default();
            bail!("{what}: not within {READY_TIMEOUT:?}\n{tail}");
        }
        tokio::time::sleep(POLL).await;
    }
}
