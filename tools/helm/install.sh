#!/usr/bin/env bash
# Provide the helm CLI that tests/integration/chart/ uses to render deploy/chart/bucketmap.
#
# Prints, as the last line of stdout, the path of the `helm` binary:
#   1. $HELM_BIN, when set and executable;
#   2. otherwise
#        ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/helm/<version>/helm
#      (version read from go.mod next to this script), built from the pinned Go
#      module on first use (see ../lib.sh).
#
# Progress goes to stderr. Safe to run concurrently.
set -euo pipefail

tool=helm
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

binary_override HELM_BIN

module=helm.sh/helm/v3
version="$(pinned_version "$module")"
# The Kubernetes version helm assumes when it talks to no cluster (`helm
# template`, `helm lint`): helm's Makefile stamps it from its client-go
# module (v0.N.x is Kubernetes 1.N); unstamped, helm assumes 1.20 and
# refuses the chart's kubeVersion.
client_go="$(pinned_version k8s.io/client-go)"
k8s_minor="${client_go#v0.}"
k8s_minor="${k8s_minor%%.*}"
dest="$(cache_root)/helm/$version-k8s1.$k8s_minor"

has_binary() { [[ -x "$1/helm" ]]; }

build() {
  log "building $module $version into $dest"
  log "(first run only; a few minutes, needs the Go module proxy or a warm module cache)"
  # Stamp the version the way helm's Makefile does, so `helm version` reports it.
  local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version" pkg
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  (cd "$tools_dir" && go_build -ldflags="$ldflags" -o "$1/helm" "$module/cmd/helm")
}

build_once "$dest" has_binary build HELM_BIN
printf '%s\n' "$dest/helm"
