//! The files the node's components read: containerd's configuration, the
//! CNI network, the kubelet's and kube-proxy's configurations, and the
//! kubeconfigs. Every path lives under the node's state directory, every
//! address inside its namespace.

use std::path::Path;

use anyhow::{Context as _, Result};
use base64::Engine as _;

use super::layout::{
    API_PORT, CLUSTER_DOMAIN, CNI_NETWORK, Layout, NODE_IP, NODE_NAME, POD_GATEWAY, POD_SUBNET,
    SANDBOX_IMAGE,
};

/// containerd with its CRI plugin, state under the layout's directories.
/// `restrict_oom_score_adj`: this machine may not lower a process's OOM
/// score (no CAP_SYS_RESOURCE), which runc otherwise does for every
/// sandbox and fails.
pub(crate) fn containerd(layout: &Layout) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  # Pod namespaces under the state directory, not /run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
"#,
        root = layout.containerd_root().display(),
        state = layout.containerd_state().display(),
        socket = layout.containerd_socket().display(),
        cni_bin = layout.cni_bin.display(),
        cni_conf = layout.cni_conf().display(),
    )
}

/// One bridge network for every pod, addresses from the pod subnet, the
/// bridge's address as gateway. The node namespace has no route out, so
/// neither do pods.
pub(crate) fn cni(layout: &Layout) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": layout.cni_ipam(),
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// The kubelet: cgroupfs driver on this machine's cgroup v1, pods under
/// their own cgroup root, webhook authentication and authorisation
/// against the API server, no swap.
pub(crate) fn kubelet(layout: &Layout) -> String {
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root(),
        "failCgroupV1": false,
        "failSwapOn": false,
        "protectKernelDefaults": false,
        "containerRuntimeEndpoint": format!("unix://{}", layout.containerd_socket().display()),
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": layout.pki().join("ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": layout.resolv_conf(),
        "podLogsDir": layout.pod_logs(),
        "volumePluginDir": layout.dir.join("volume-plugins"),
        "staticPodPath": "",
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": false,
    })
    .to_string()
}

/// kube-proxy in iptables mode; conntrack sysctls left as the machine has
/// them (zero means "do not set").
pub(crate) fn kube_proxy(layout: &Layout) -> String {
    serde_json::json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clusterCIDR": POD_SUBNET,
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        "clientConnection": {"kubeconfig": layout.kubeconfig("kube-proxy")},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    })
    .to_string()
}

/// A kubeconfig for `server` with a client certificate, trusting `ca`.
pub(crate) fn kubeconfig(
    context: &str,
    server: &str,
    ca: &str,
    cert: &str,
    key: &str,
) -> Result<String> {
    let b64 = |data: &str| base64::engine::general_purpose::STANDARD.encode(data);
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca),
        }}],
        "users": [{"name": context, "user": {
            "client-certificate-data": b64(cert),
            "client-key-data": b64(key),
        }}],
        "contexts": [{"name": context, "context": {
            "cluster": context, "user": context, "namespace": "default",
        }}],
        "current-context": context,
        "preferences": {},
    });
    serde_yaml::to_string(&config).context("cannot serialise a kubeconfig")
}

/// The API server's address as the node's components see it.
pub(crate) fn in_node_server() -> String {
    format!("https://{NODE_IP}:{API_PORT}")
}

/// Writes `contents` to `path`, creating its directory.
pub(crate) fn write(path: &Path, contents: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}
