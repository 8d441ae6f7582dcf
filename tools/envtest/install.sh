#!/usr/bin/env bash
# Provide the real control-plane binaries (kube-apiserver and etcd) used by the
# integration tests and `bucketmap dev`, the same ones controller-runtime's
# envtest runs.
#
# Prints, as the last line of stdout, a directory holding `kube-apiserver` and
# `etcd`:
#   1. $KUBEBUILDER_ASSETS, when set and it holds both binaries;
#   2. otherwise the cache directory
#        ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/envtest/k8s-v<K8S>-etcd-v<ETCD>
#      (versions read from go.mod next to this script), building the binaries
#      from the pinned Go module on first use.
#
# Progress goes to stderr. Safe to run concurrently: builds are serialised with
# flock and published atomically (built in a temporary directory, then renamed).
set -euo pipefail

log() { printf 'envtest: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

has_assets() { [[ -x "$1/kube-apiserver" && -x "$1/etcd" ]]; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if has_assets "$KUBEBUILDER_ASSETS"; then
    printf '%s\n' "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS does not hold both kube-apiserver and etcd (unset it to build them)"
fi

tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
go_mod="$tools_dir/go.mod"
[[ -f "$go_mod" ]] || die "missing $go_mod"

# `module version` from the require block of go.mod (the versions the tools are pinned to).
module_version() {
  awk -v mod="$1" '($1 == mod || ($1 == "require" && $2 == mod)) { v = ($1 == "require") ? $3 : $2; if (v ~ /^v[0-9]/) { print v; exit } }' "$go_mod"
}
k8s_version="$(module_version k8s.io/kubernetes)"
etcd_version="$(module_version go.etcd.io/etcd/server/v3)"
[[ -n "$k8s_version" ]] || die "cannot find the k8s.io/kubernetes version in $go_mod"
[[ -n "$etcd_version" ]] || die "cannot find the go.etcd.io/etcd/server/v3 version in $go_mod"

cache_root="${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}"
assets="$cache_root/envtest/k8s-$k8s_version-etcd-$etcd_version"

if has_assets "$assets"; then
  printf '%s\n' "$assets"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "go is required to build kube-apiserver and etcd (or set KUBEBUILDER_ASSETS)"
command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"

mkdir -p "$cache_root/envtest"
exec 9>"$assets.lock"
if ! flock -n 9; then
  log "waiting for another build of $assets ..."
  flock 9
fi

# Another process may have finished the build while we waited for the lock.
if has_assets "$assets"; then
  printf '%s\n' "$assets"
  exit 0
fi

tmp="$(mktemp -d "$cache_root/envtest/.build.XXXXXX")"
trap 'rm -rf -- "$tmp"' EXIT

# Stamp the version the way the Kubernetes release build does, so the server
# reports v1.34.x instead of v0.0.0-master.
k8s_minor="${k8s_version#v1.}"
k8s_minor="${k8s_minor%%.*}"
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean"
done

log "building kube-apiserver $k8s_version and etcd $etcd_version into $assets"
log "(first run only; this takes several minutes and needs the Go module proxy or a warm module cache)"
start=$SECONDS
(
  cd "$tools_dir"
  go build -trimpath -ldflags="-s -w$version_ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver go.etcd.io/etcd/server/v3
) >&2 || die "go build failed"
# The etcd server's main package is go.etcd.io/etcd/server/v3; go names the
# binary after the last non-version path element (`server`; `v3` in old Go).
for built in server v3; do
  if [[ -f "$tmp/$built" ]]; then
    mv -- "$tmp/$built" "$tmp/etcd"
    break
  fi
done
has_assets "$tmp" || die "build did not produce both kube-apiserver and etcd"
chmod 755 "$tmp"

# Publish atomically: a partial directory left by a killed run is replaced.
rm -rf -- "$assets"
mv -T -- "$tmp" "$assets"
trap - EXIT
log "built in $((SECONDS - start))s"

printf '%s\n' "$assets"
