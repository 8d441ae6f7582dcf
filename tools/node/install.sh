#!/usr/bin/env bash
# Provide the rest of the single-node cluster that the node tests and
# `cargo dev --node` run (testkit/src/node/), beside tools/envtest's
# kube-apiserver and etcd: the kubelet, kube-proxy, kube-controller-manager
# and kube-scheduler, built from tools/envtest's module at the API server's
# release (one release for the whole node, as a kind node image has; they
# share most of the API server's packages, so Go's build cache compiles
# them once), and the pause image's binary, from the same module's source.
# The kubelet is told to start on a cgroup v1 host (`failCgroupV1: false`,
# testkit/src/node/config.rs), which the machines CI runs on are.
#
# The container runtime comes from Debian's packages: containerd (with its
# CRI plugin), runc and the CNI plugins (bridge, host-local, loopback,
# portmap). They are installed when missing, at the versions Debian's
# stable release pins (`--check` only reports what is missing).
#
# Prints, as the last line of stdout, a directory holding the four binaries
# and `pause`: $BUCKETMAP_NODE_BINARIES when set (it must hold them all),
# else the cache directory, built on first use. Progress goes to stderr.
# Safe to run concurrently.
set -euo pipefail

tool=node
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

binaries=(kubelet kube-controller-manager kube-scheduler kube-proxy pause)
has_binaries() {
  local bin
  for bin in "${binaries[@]}"; do [[ -x "$1/$bin" ]] || return 1; done
}

# Debian's packages for the runtime; the commands they provide.
runtime_ready() {
  command -v containerd >/dev/null && command -v runc >/dev/null \
    && command -v ctr >/dev/null && [[ -x /usr/lib/cni/bridge ]] \
    && [[ -x /usr/lib/cni/host-local ]] && [[ -x /usr/lib/cni/loopback ]] \
    && [[ -x /usr/lib/cni/portmap ]] && command -v nsenter >/dev/null \
    && command -v ip >/dev/null && command -v iptables >/dev/null
}
if ! runtime_ready; then
  [[ "${1:-}" != --check ]] || die "containerd, runc, the CNI plugins, iproute2 or iptables are missing"
  [[ $EUID -eq 0 ]] || die "containerd, runc and the CNI plugins are missing; install them as root: apt-get install containerd runc containernetworking-plugins iproute2 iptables util-linux"
  log "installing containerd, runc and the CNI plugins (Debian packages)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    containerd runc containernetworking-plugins iproute2 iptables util-linux >&2
  runtime_ready || die "the Debian packages did not provide containerd, runc and the CNI plugins"
fi

if [[ -n "${BUCKETMAP_NODE_BINARIES:-}" ]]; then
  has_binaries "$BUCKETMAP_NODE_BINARIES" \
    || die "BUCKETMAP_NODE_BINARIES=$BUCKETMAP_NODE_BINARIES lacks one of: ${binaries[*]}"
  printf '%s\n' "$BUCKETMAP_NODE_BINARIES"
  exit 0
fi

control_dir="$tools_dir/../envtest"
k8s_version="$(pinned_version_in "$control_dir" k8s.io/kubernetes)"
dest="$(cache_root)/node/k8s-$k8s_version"

build() {
  local src
  log "building the kubelet, kube-proxy, kube-controller-manager and kube-scheduler $k8s_version into $dest"
  log "(first run only; this takes minutes and needs the Go module proxy or a warm module cache)"
  (cd "$control_dir" && go_build -ldflags="$(kubernetes_ldflags "$k8s_version")" \
    -o "$1/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler) \
    || return 1
  # The pause container's program, from the same module's source (the
  # sandbox image holds nothing else).
  src="$(cd "$control_dir" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  command -v cc >/dev/null || die "a C compiler (cc) is required to build the pause binary"
  cc -Os -static -DVERSION="$k8s_version" -o "$1/pause" "$src" || return 1
  strip "$1/pause"
}

build_once "$dest" has_binaries build BUCKETMAP_NODE_BINARIES
printf '%s\n' "$dest"
