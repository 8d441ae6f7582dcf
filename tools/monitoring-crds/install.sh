#!/usr/bin/env bash
# Provide the CRDs of the monitoring objects the chart can render, so that
# tests/integration/chart/ can apply those objects to a real API server (server-side dry
# run): ServiceMonitor, PodMonitor and PrometheusRule (monitoring.coreos.com/v1),
# PodMonitoring, ClusterPodMonitoring and ClusterRules (monitoring.googleapis.com/v1).
#
# They come from the Go modules pinned in go.mod next to this script (the
# module zips hold the projects' generated CRD YAML), downloaded from the Go
# module proxy and verified against go.sum, then copied into
#   ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/monitoring-crds/<versions>/
# Prints, as the last line of stdout, that directory (one YAML file per CRD),
# or $MONITORING_CRDS_DIR when set (a directory holding the same files).
#
# Progress goes to stderr. Safe to run concurrently.
set -euo pipefail

tool=monitoring-crds
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

if [[ -n "${MONITORING_CRDS_DIR:-}" ]]; then
  [[ -d "$MONITORING_CRDS_DIR" ]] || die "MONITORING_CRDS_DIR=$MONITORING_CRDS_DIR is not a directory"
  printf '%s\n' "$MONITORING_CRDS_DIR"
  exit 0
fi

operator=github.com/prometheus-operator/prometheus-operator
engine=github.com/GoogleCloudPlatform/prometheus-engine
operator_version="$(pinned_version "$operator")"
engine_version="$(pinned_version "$engine")"
dest="$(cache_root)/monitoring-crds/prometheus-operator-$operator_version-prometheus-engine-$engine_version"

# Each CRD: the module it comes from, and its path inside the module.
crds=(
  "$operator example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
  "$operator example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"
  "$operator example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"
  "$engine charts/operator/crds/monitoring.googleapis.com_podmonitorings.yaml"
  "$engine charts/operator/crds/monitoring.googleapis.com_clusterpodmonitorings.yaml"
  "$engine charts/operator/crds/monitoring.googleapis.com_clusterrules.yaml"
)

complete() {
  local entry
  for entry in "${crds[@]}"; do
    [[ -s "$1/$(basename -- "${entry#* }")" ]] || return 1
  done
}

# The module's directory in the module cache, downloaded (and checked
# against go.sum) when absent. GOFLAGS=-mod=mod lets go read go.mod as it is.
module_dir() {
  local dir
  dir="$(cd "$tools_dir" && GOFLAGS=-mod=mod go mod download -json "$1" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -n "$dir" && -d "$dir" ]] || die "go mod download $1 gave no directory"
  printf '%s\n' "$dir"
}

fetch() {
  log "taking the CRDs from $operator $operator_version and $engine $engine_version into $dest"
  local entry module path dir
  for entry in "${crds[@]}"; do
    module="${entry%% *}"
    path="${entry#* }"
    dir="$(module_dir "$module")"
    [[ -f "$dir/$path" ]] || die "$module has no $path"
    cp -- "$dir/$path" "$1/"
  done
}

build_once "$dest" complete fetch MONITORING_CRDS_DIR
printf '%s\n' "$dest"
