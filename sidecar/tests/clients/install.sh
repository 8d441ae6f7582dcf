#!/usr/bin/env bash
# Install the real GCS client libraries the sidecar integration tests drive,
# at the versions pinned next to this script, into the cache:
#
#   python  a venv with google-cloud-storage   (python/requirements.txt, every dependency pinned)
#   go      the scenario program, built         (go/go.mod + go.sum: cloud.google.com/go/storage)
#   node    node_modules with @google-cloud/storage (node/package-lock.json, `npm ci`)
#
# Usage: install.sh [python|go|node]...   (no argument: all three)
#
# Each install lives in
#   ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/sidecar-clients/<lang>-<key>
# where <key> hashes the pin files, the program's sources (Go) and the
# toolchain version, so a changed pin or toolchain gets a fresh install and an
# unchanged one is reused at no cost. Only the registries are needed (PyPI,
# the Go module proxy, npm) on first use.
#
# Prints one `lang=PATH` line per language on stdout:
#   python=<venv>/bin/python   go=<dir>/scenario   node=<dir>/node_modules
# Progress goes to stderr. Safe to run concurrently: each install is serialised
# with flock and published atomically (built in a temporary directory, renamed).
set -euo pipefail

log() { printf 'sidecar-clients: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

clients_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/sidecar-clients"
command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum (coreutils) is required"

# key FILE... -- EXTRA: a short hash of the files' contents and of EXTRA.
key() {
  local extra="${*: -1}"
  { cat -- "${@:1:$#-1}"; printf '%s' "$extra"; } | sha256sum | cut -c1-16
}

# install LANG DEST CHECK BUILD: run BUILD TMPDIR under a lock unless CHECK DEST passes.
install_one() {
  local lang="$1" dest="$2" check="$3" build="$4"
  if "$check" "$dest"; then
    return 0
  fi
  mkdir -p "$cache_root"
  local lock="$dest.lock"
  (
    exec 9>"$lock"
    if ! flock -n 9; then
      log "$lang: waiting for another install of $dest ..."
      flock 9
    fi
    if "$check" "$dest"; then
      exit 0
    fi
    local tmp
    tmp="$(mktemp -d "$cache_root/.build-$lang.XXXXXX")"
    trap 'rm -rf -- "$tmp"' EXIT
    log "$lang: installing into $dest (first run only)"
    local start=$SECONDS
    "$build" "$tmp" >&2 || die "$lang: install failed"
    "$check" "$tmp" || die "$lang: install did not produce a working client"
    rm -rf -- "$dest"
    mv -T -- "$tmp" "$dest"
    trap - EXIT
    log "$lang: installed in $((SECONDS - start))s"
  )
}

# --- python -------------------------------------------------------------------
python_bin="${PYTHON:-python3}"
check_python() {
  [[ -x "$1/bin/python" ]] && "$1/bin/python" -c 'import google.cloud.storage' >/dev/null 2>&1
}
build_python() {
  "$python_bin" -m venv "$1"
  "$1/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$clients_dir/python/requirements.txt"
}
install_python() {
  command -v "$python_bin" >/dev/null 2>&1 || die "python3 is required (or set PYTHON)"
  local version dest
  version="$("$python_bin" -c 'import sys; print(sys.version)')"
  dest="$cache_root/python-$(key "$clients_dir/python/requirements.txt" "$version")"
  install_one python "$dest" check_python build_python
  printf 'python=%s\n' "$dest/bin/python"
}

# --- go -----------------------------------------------------------------------
check_go() { [[ -x "$1/scenario" ]]; }
build_go() {
  (cd "$clients_dir/go" && go build -trimpath -mod=readonly -o "$1/scenario" .)
}
install_go() {
  command -v go >/dev/null 2>&1 || die "go is required"
  local dest
  dest="$cache_root/go-$(key "$clients_dir"/go/go.mod "$clients_dir"/go/go.sum "$clients_dir"/go/*.go "$(go version)")"
  install_one go "$dest" check_go build_go
  printf 'go=%s\n' "$dest/scenario"
}

# --- node ---------------------------------------------------------------------
check_node() { [[ -f "$1/node_modules/@google-cloud/storage/package.json" ]]; }
build_node() {
  cp -- "$clients_dir/node/package.json" "$clients_dir/node/package-lock.json" "$1/"
  (cd "$1" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
}
install_node() {
  command -v node >/dev/null 2>&1 || die "node is required"
  command -v npm >/dev/null 2>&1 || die "npm is required"
  local dest
  dest="$cache_root/node-$(key "$clients_dir/node/package.json" "$clients_dir/node/package-lock.json" "$(node --version)")"
  install_one node "$dest" check_node build_node
  printf 'node=%s\n' "$dest/node_modules"
}

langs=("$@")
[[ ${#langs[@]} -gt 0 ]] || langs=(python go node)
for lang in "${langs[@]}"; do
  case "$lang" in
    python) install_python ;;
    go) install_go ;;
    node) install_node ;;
    *) die "unknown client '$lang' (expected python, go or node)" ;;
  esac
done
