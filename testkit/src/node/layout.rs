//! Names, addresses and paths of the node. One node runs on a machine at a
//! time: containerd and the kubelet also write to fixed paths of the
//! machine (`/run/containerd`, `/var/lib/kubelet/device-plugins`,
//! `/var/log/containers`), so the harness takes a lock and sweeps what a
//! crashed run left before it starts.

use std::path::PathBuf;

/// The node's network namespace (`/run/netns/<name>`).
pub const NETNS: &str = "bucketmap-node";
/// The Node object's name.
pub const NODE_NAME: &str = "bucketmap-node";
/// The node's address, inside its namespace only.
pub const NODE_IP: &str = "10.200.0.2";
/// The API server's port on [`NODE_IP`].
pub const API_PORT: u16 = 6443;
/// Pod addresses (the bridge `cni0` in the node namespace).
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The bridge's address, every pod's gateway.
pub const POD_GATEWAY: &str = "10.244.0.1";
/// Service cluster IPs; the first is the `kubernetes` Service.
pub const SERVICE_RANGE: &str = "10.96.0.0/16";
/// The `kubernetes` Service's cluster IP.
pub const API_SERVICE_IP: &str = "10.96.0.1";
/// The cluster's DNS domain (no DNS server runs: pods use Service IPs).
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The sandbox image containerd starts for every pod (the tests import it).
pub const SANDBOX_IMAGE: &str = crate::images::PAUSE_IMAGE;
/// The CNI network's name (its results are kept under this prefix).
pub const CNI_NETWORK: &str = "bucketmap-node";
/// containerd's namespace for the CRI plugin's images and containers.
pub const CONTAINERD_NAMESPACE: &str = "k8s.io";

/// Where the node keeps its state: certificates, etcd, containerd, the
/// kubelet's root, logs.
pub(crate) const STATE_DIR: &str = "/var/lib/bucketmap-node";

/// The node's directories and files.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub dir: PathBuf,
    pub cni_bin: PathBuf,
}

impl Layout {
    pub(crate) fn new() -> Layout {
        Layout {
            dir: PathBuf::from(STATE_DIR),
            cni_bin: PathBuf::from("/usr/lib/cni"),
        }
    }

    pub(crate) fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }
    pub(crate) fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub(crate) fn etcd_data(&self) -> PathBuf {
        self.dir.join("etcd")
    }
    pub(crate) fn containerd_root(&self) -> PathBuf {
        self.dir.join("containerd/root")
    }
    pub(crate) fn containerd_state(&self) -> PathBuf {
        self.dir.join("containerd/state")
    }
    pub(crate) fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }
    pub(crate) fn containerd_config(&self) -> PathBuf {
        self.dir.join("containerd/config.toml")
    }
    pub(crate) fn cni_conf(&self) -> PathBuf {
        self.dir.join("cni/net.d")
    }
    pub(crate) fn cni_ipam(&self) -> PathBuf {
        self.dir.join("cni/networks")
    }
    pub(crate) fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    pub(crate) fn kubelet_certs(&self) -> PathBuf {
        self.dir.join("kubelet-pki")
    }
    pub(crate) fn pod_logs(&self) -> PathBuf {
        self.dir.join("pods")
    }
    pub(crate) fn resolv_conf(&self) -> PathBuf {
        self.dir.join("resolv.conf")
    }
    pub(crate) fn sysctls(&self) -> PathBuf {
        self.dir.join("sysctls.json")
    }
    pub(crate) fn kubeconfig(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.kubeconfig"))
    }
    /// The admin kubeconfig for the machine (through the forwarder).
    pub(crate) fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }
    /// The pods' cgroup parent in every controller (`/sys/fs/cgroup/*/…`).
    pub(crate) fn cgroup_root(&self) -> &'static str {
        "/bucketmap-node"
    }
}
