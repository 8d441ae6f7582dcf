#!/usr/bin/env bash
# Provide the real control-plane binaries (kube-apiserver and etcd) used by the
# integration tests and `cargo dev`, the same ones controller-runtime's
# envtest runs.
#
# Usage: install.sh [--oldest]
#
# Prints, as the last line of stdout, a directory holding `kube-apiserver` and
# `etcd`, usable as KUBEBUILDER_ASSETS:
#   1. $KUBEBUILDER_ASSETS, when set and it holds both binaries;
#   2. otherwise the cache directory
#        ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/envtest/k8s-v<K8S>-etcd-v<ETCD>
#      (versions read from go.mod next to this script: the newest Kubernetes
#      release), filled on first use: from the envtest release archive of
#      that version for this host (the binaries setup-envtest installs)
#      when archives.tsv lists its sha512 and it can be fetched and holds
#      these versions (archive.sh), else by building the binaries from the
#      pinned Go modules (see ../lib.sh). It says which, and why it built.
#      BUCKETMAP_ENVTEST_FETCH=0 skips the fetch; BUCKETMAP_ENVTEST_ARCHIVE_URL
#      fetches from a mirror (archive.sh).
#
# With --oldest, the directory holds the kube-apiserver pinned in
# oldest/go.mod (the oldest release the chart's kubeVersion admits, the
# other end of the range CI tests) and the pinned etcd, copied from the
# pinned directory: k8s-v<OLDEST K8S>-etcd-v<ETCD> (its kube-apiserver
# fetched or built the same way). KUBEBUILDER_ASSETS is
# not read then: it stands for the pinned binaries, and the caller sets it
# to what this prints for the run against the oldest.
#
# Progress goes to stderr. Safe to run concurrently.
set -euo pipefail

tool=envtest
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"
# shellcheck source-path=SCRIPTDIR source=archive.sh
source "$tools_dir/archive.sh"

# other: the directory of the other release's go.mod (oldest/), or empty.
other=""
case "$#:${1:-}" in
  0:) ;;
  1:--oldest) other=oldest ;;
  *) die "usage: install.sh [--oldest]" ;;
esac

has_assets() { [[ -x "$1/kube-apiserver" && -x "$1/etcd" ]]; }

if [[ -z $other && -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if has_assets "$KUBEBUILDER_ASSETS"; then
    printf '%s\n' "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS does not hold both kube-apiserver and etcd (unset it to build them)"
fi

k8s_version="$(pinned_version k8s.io/kubernetes)"
etcd_version="$(pinned_version go.etcd.io/etcd/server/v3)"
assets="$(cache_root)/envtest/k8s-$k8s_version-etcd-$etcd_version"

# check_apiserver_version DIR VERSION: fails unless DIR/kube-apiserver says it
# is VERSION (the ldflags stamp it; a server that misreports its version
# would have the tests check the wrong one).
check_apiserver_version() {
  local reported
  reported="$("$1/kube-apiserver" --version)" || return 1
  [[ $reported == "Kubernetes $2" ]] && return 0
  log "the kube-apiserver reports '$reported', not 'Kubernetes $2'"
  return 1
}

# check_etcd_version DIR VERSION: fails unless DIR/etcd says it is VERSION.
check_etcd_version() {
  local reported
  reported="$("$1/etcd" --version)" || return 1
  reported="${reported%%$'\n'*}"
  [[ $reported == "etcd Version: ${2#v}" ]] && return 0
  log "the etcd reports '$reported', not 'etcd Version: ${2#v}'"
  return 1
}

# fetch_checked DIR VERSION CHECK MEMBER...: fetch_archive, then `CHECK DIR`
# (the binaries are the pinned versions); on failure DIR holds none of
# them and fetch_failure says why.
fetch_checked() {
  local dir=$1 version=$2 check=$3 member
  shift 3
  fetch_archive "$dir" "$version" "$@" || return 1
  if "$check" "$dir"; then
    log "fetched the envtest archive $fetched (sha512 verified against tools/envtest/archives.tsv; versions checked)"
    return 0
  fi
  for member in "$@"; do rm -f -- "$dir/$member"; done
  fail "the archive's binaries are not the pinned versions (above)"
}

# fetch_or_build DIR FETCH BUILD: `FETCH DIR`, else says why and `BUILD DIR`.
fetch_or_build() {
  if "$2" "$1"; then
    return 0
  fi
  log "building from the pinned Go modules because $fetch_failure"
  require_go KUBEBUILDER_ASSETS
  "$3" "$1"
}

check_pinned() {
  check_apiserver_version "$1" "$k8s_version" && check_etcd_version "$1" "$etcd_version"
}
fetch() { fetch_checked "$1" "$k8s_version" check_pinned kube-apiserver etcd; }
provide() { fetch_or_build "$1" fetch build; }

build() {
  local ldflags built
  ldflags="$(kubernetes_ldflags "$k8s_version")"
  log "building kube-apiserver $k8s_version and etcd $etcd_version into $assets"
  log "(first run only; this takes several minutes and needs the Go module proxy or a warm module cache)"
  (cd "$tools_dir" && go_build -ldflags="$ldflags" -o "$1/" \
    k8s.io/kubernetes/cmd/kube-apiserver go.etcd.io/etcd/server/v3) || return 1
  # The etcd server's main package is go.etcd.io/etcd/server/v3; go names the
  # binary after the last non-version path element (`server`; `v3` in old Go).
  for built in server v3; do
    if [[ -f "$1/$built" ]]; then
      mv -- "$1/$built" "$1/etcd"
      break
    fi
  done
  check_apiserver_version "$1" "$k8s_version"
}

# build_other DIR: the other release's kube-apiserver beside a copy of the
# pinned etcd (a copy, not a link, so that rebuilding the pinned directory
# cannot break this one).
build_other() {
  log "building kube-apiserver $other_version into $other_assets, with etcd $etcd_version from $assets"
  log "(first run only; this takes several minutes and needs the Go module proxy or a warm module cache)"
  (cd "$tools_dir/$other" && go_build -ldflags="$(kubernetes_ldflags "$other_version")" \
    -o "$1/" k8s.io/kubernetes/cmd/kube-apiserver) || return 1
  cp -- "$assets/etcd" "$1/etcd" || return 1
  check_apiserver_version "$1" "$other_version"
}

# fetch_other DIR: the other release's kube-apiserver from its archive,
# beside a copy of the pinned etcd (as build_other).
fetch_other() {
  check_other() { check_apiserver_version "$1" "$other_version"; }
  fetch_checked "$1" "$other_version" check_other kube-apiserver || return 1
  cp -- "$assets/etcd" "$1/etcd" || { rm -f -- "$1/kube-apiserver"; fail "cannot copy $assets/etcd"; }
}
provide_other() { fetch_or_build "$1" fetch_other build_other; }

publish_once "$assets" has_assets provide
if [[ -z $other ]]; then
  printf '%s\n' "$assets"
  exit 0
fi

other_version="$(pinned_version_in "$tools_dir/$other" k8s.io/kubernetes)"
other_assets="$(cache_root)/envtest/k8s-$other_version-etcd-$etcd_version"
# No override: KUBEBUILDER_ASSETS names the pinned assets, not these.
publish_once "$other_assets" has_assets provide_other
printf '%s\n' "$other_assets"
