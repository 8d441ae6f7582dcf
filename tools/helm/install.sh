#!/usr/bin/env bash
# Provide the helm CLI that tests/chart.rs uses to render deploy/chart/bucketmap.
#
# Prints, as the last line of stdout, the path of the `helm` binary:
#   1. $HELM_BIN, when set and executable;
#   2. otherwise
#        ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/helm/<version>/helm
#      (version read from go.mod next to this script), built from the pinned Go
#      module on first use.
#
# Progress goes to stderr. Safe to run concurrently: builds are serialised with
# flock and published atomically (built in a temporary directory, then renamed).
set -euo pipefail

log() { printf 'helm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -n "${HELM_BIN:-}" ]]; then
  [[ -x "$HELM_BIN" ]] || die "HELM_BIN=$HELM_BIN is not an executable file (unset it to build one)"
  printf '%s\n' "$HELM_BIN"
  exit 0
fi

tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
go_mod="$tools_dir/go.mod"
[[ -f "$go_mod" ]] || die "missing $go_mod"

module=helm.sh/helm/v3
version="$(awk -v mod="$module" '($1 == mod || ($1 == "require" && $2 == mod)) { v = ($1 == "require") ? $3 : $2; if (v ~ /^v[0-9]/) { print v; exit } }' "$go_mod")"
[[ -n "$version" ]] || die "cannot find the $module version in $go_mod"

cache_root="${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}"
dest="$cache_root/helm/$version"
bin="$dest/helm"

if [[ -x "$bin" ]]; then
  printf '%s\n' "$bin"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "go is required to build helm (or set HELM_BIN)"
command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"

mkdir -p "$cache_root/helm"
exec 9>"$dest.lock"
if ! flock -n 9; then
  log "waiting for another build of $dest ..."
  flock 9
fi

# Another process may have finished the build while we waited for the lock.
if [[ -x "$bin" ]]; then
  printf '%s\n' "$bin"
  exit 0
fi

tmp="$(mktemp -d "$cache_root/helm/.build.XXXXXX")"
trap 'rm -rf -- "$tmp"' EXIT

# Stamp the version the way helm's Makefile does, so `helm version` reports it.
version_ldflags="-X helm.sh/helm/v3/internal/version.version=$version"

log "building $module $version into $dest"
log "(first run only; a few minutes, needs the Go module proxy or a warm module cache)"
start=$SECONDS
(
  cd "$tools_dir"
  go build -trimpath -ldflags="-s -w $version_ldflags" -o "$tmp/helm" "$module/cmd/helm"
) >&2 || die "go build failed"
[[ -x "$tmp/helm" ]] || die "build did not produce helm"
chmod 755 "$tmp"

# Publish atomically: a partial directory left by a killed run is replaced.
rm -rf -- "$dest"
mv -T -- "$tmp" "$dest"
trap - EXIT
log "built in $((SECONDS - start))s"

printf '%s\n' "$bin"
