//! A single-node Kubernetes cluster on this machine, inside a network
//! namespace of its own: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, containerd (with its CRI plugin) and runc, the kubelet,
//! kube-proxy and the CNI plugins (bridge, host-local, loopback, portmap).
//!
//! Every address the cluster uses (the node's [`NODE_IP`], the pod subnet,
//! the Service range, whatever the tests bind with [`Node::bind`]) exists
//! only inside the namespace, which has no route out: nothing is configured
//! on the machine's own network. The machine reaches the API server through
//! a loopback [`Forwarder`](netns::Forwarder); [`Node::kubeconfig_path`] is a
//! kubeconfig for it.
//!
//! The binaries: kube-apiserver and etcd as in [`crate::testenv`], the
//! others from `tools/node/install.sh` (built once from the pinned Go
//! modules and cached; it also installs containerd, runc and the CNI
//! plugins from Debian's packages when missing): the kubelet, kube-proxy,
//! the controller manager and the scheduler, all at the API server's
//! release, as a kind node image has them. It needs root.
//!
//! One node runs on a machine at a time (containerd and the kubelet write
//! to fixed paths too): [`Node::start`] takes a lock, sweeps whatever a
//! crashed run left, and [`Drop`] takes everything down again: processes,
//! containers, mounts, the namespace, cgroups, and the machine-wide sysctls
//! the kubelet changes are put back.

mod cleanup;
mod config;
mod layout;
pub mod netns;
mod pki;
pub mod product;
mod start;

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

pub use layout::{
    API_PORT, API_SERVICE_IP, CONTAINERD_NAMESPACE, NETNS, NODE_IP, NODE_NAME, POD_SUBNET,
    SANDBOX_IMAGE, SERVICE_RANGE,
};

use crate::testenv::Process;
use layout::Layout;
use netns::Forwarder;

/// A running single-node cluster, taken down on drop.
pub struct Node {
    // Field order is drop order: the daemons go first, the sweep in Drop
    // takes the rest.
    /// Behind a lock so that a scenario sharing the node can restart one.
    processes: tokio::sync::Mutex<Vec<Process>>,
    forwarder: Forwarder,
    config: kube::Config,
    layout: Layout,
    node_bin: PathBuf,
    _lock: File,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("api", &self.forwarder.local_addr())
            .field("dir", &self.layout.dir)
            .finish_non_exhaustive()
    }
}

/// Why the node cannot run on this machine, if it cannot.
pub fn unavailable() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned))
        });
    if uid.as_deref() != Some("0") {
        return Some(
            "the node needs root (it creates a network namespace, runs containerd and the kubelet)"
                .to_owned(),
        );
    }
    let missing: Vec<&str> = ["ip", "nsenter", "umount", "go", "cc"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    if !missing.is_empty() {
        return Some(format!("the node needs {} on PATH", missing.join(", ")));
    }
    None
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

impl Node {
    /// Brings the node up and waits until the Node object is Ready.
    pub async fn start() -> Result<Node> {
        if let Some(problem) = unavailable() {
            anyhow::bail!("{problem}");
        }
        start::start().await
    }

    /// The admin kubeconfig (through the loopback forwarder), for kubectl
    /// and helm on the machine.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.layout.admin_kubeconfig()
    }

    /// A kube-rs client for the admin user.
    pub fn client(&self) -> Result<kube::Client> {
        crate::install_crypto_provider();
        kube::Client::try_from(self.config.clone()).context("cannot build a client for the node")
    }

    /// containerd's socket (for `ctr --address`), namespace
    /// [`CONTAINERD_NAMESPACE`] for the kubelet's images.
    pub fn containerd_address(&self) -> PathBuf {
        self.layout.containerd_socket()
    }

    /// The directory of the node's logs (one file per component).
    pub fn log_dir(&self) -> PathBuf {
        self.layout.logs()
    }

    /// The directory holding the node components' binaries and `pause`.
    pub fn node_binaries(&self) -> &Path {
        &self.node_bin
    }

    /// A listener on `port` of [`NODE_IP`] (0: any free port), inside the
    /// node's namespace: what pods reach, such as a GCS emulator.
    pub fn bind(&self, port: u16) -> Result<TcpListener> {
        let addr: SocketAddr = format!("{NODE_IP}:{port}").parse()?;
        netns::bind_in(NETNS, addr)
    }

    /// Starts `program args…` inside the node's namespace, logging to
    /// `<log_dir>/<name>.log`; it stops with the node.
    pub fn spawn(&mut self, name: &'static str, program: &Path, args: &[String]) -> Result<()> {
        let process = start::spawn_in_node(&self.layout, name, program, args)?;
        self.processes.get_mut().push(process);
        Ok(())
    }

    /// Kills the node's process `name` (`kube-apiserver`, `kubelet`, …) as
    /// a crash would and starts it again with the same arguments; for the
    /// API server, waits until it answers `/readyz` again.
    pub async fn restart(&self, name: &str) -> Result<()> {
        let mut processes = self.processes.lock().await;
        let process = processes
            .iter_mut()
            .find(|p| p.name() == name)
            .with_context(|| format!("the node runs no {name}"))?;
        process.restart().await?;
        if name == "kube-apiserver" {
            let client = self.client()?;
            start::wait_for("kube-apiserver /readyz", &mut processes, || async {
                crate::testenv::readyz(&client).await.is_ok()
            })
            .await?;
        }
        Ok(())
    }

    /// Forwards a loopback port of the machine to `port` on [`NODE_IP`].
    pub async fn forward(&self, port: u16) -> Result<Forwarder> {
        Forwarder::start(NETNS, format!("{NODE_IP}:{port}").parse()?).await
    }

    /// Forwards a loopback port of the machine to `target` as the node
    /// reaches it (a pod's IP and port, for instance).
    pub async fn forward_to(&self, target: SocketAddr) -> Result<Forwarder> {
        Forwarder::start(NETNS, target).await
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Daemons first, in reverse order of start, then everything else.
        while let Some(process) = self.processes.get_mut().pop() {
            drop(process);
        }
        if let Err(err) = cleanup::sweep(&self.layout) {
            eprintln!("the node was not completely taken down: {err:#}");
        }
    }
}
