#!/usr/bin/env bash
# Provide the real control-plane binaries (kube-apiserver and etcd) used by the
# integration tests and `cargo dev`, the same ones controller-runtime's
# envtest runs.
#
# Prints, as the last line of stdout, a directory holding `kube-apiserver` and
# `etcd`:
#   1. $KUBEBUILDER_ASSETS, when set and it holds both binaries;
#   2. otherwise the cache directory
#        ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/envtest/k8s-v<K8S>-etcd-v<ETCD>
#      (versions read from go.mod next to this script), building the binaries
#      from the pinned Go module on first use (see ../lib.sh).
#
# Progress goes to stderr. Safe to run concurrently.
set -euo pipefail

tool=envtest
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

has_assets() { [[ -x "$1/kube-apiserver" && -x "$1/etcd" ]]; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if has_assets "$KUBEBUILDER_ASSETS"; then
    printf '%s\n' "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS does not hold both kube-apiserver and etcd (unset it to build them)"
fi

k8s_version="$(pinned_version k8s.io/kubernetes)"
etcd_version="$(pinned_version go.etcd.io/etcd/server/v3)"
assets="$(cache_root)/envtest/k8s-$k8s_version-etcd-$etcd_version"

build() {
  local ldflags built
  ldflags="$(kubernetes_ldflags "$k8s_version")"
  log "building kube-apiserver $k8s_version and etcd $etcd_version into $assets"
  log "(first run only; this takes several minutes and needs the Go module proxy or a warm module cache)"
  (cd "$tools_dir" && go build -trimpath -ldflags="$ldflags" -o "$1/" \
    k8s.io/kubernetes/cmd/kube-apiserver go.etcd.io/etcd/server/v3) || return 1
  # The etcd server's main package is go.etcd.io/etcd/server/v3; go names the
  # binary after the last non-version path element (`server`; `v3` in old Go).
  for built in server v3; do
    if [[ -f "$1/$built" ]]; then
      mv -- "$1/$built" "$1/etcd"
      break
    fi
  done
}

build_once "$assets" has_assets build KUBEBUILDER_ASSETS
printf '%s\n' "$assets"
