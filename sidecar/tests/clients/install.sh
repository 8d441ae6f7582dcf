#!/usr/bin/env bash
# Install the real GCS client libraries the sidecar integration tests drive,
# at the versions pinned next to this script, into the cache:
#
#   python  a venv with google-cloud-storage   (python/requirements.txt, every dependency pinned)
#   go      the scenario program, built         (go/go.mod + go.sum: cloud.google.com/go/storage)
#   node    node_modules with @google-cloud/storage (node/package-lock.json, `npm ci`)
#   java    the scenario compiled against com.google.cloud:google-cloud-storage
#           (java/pom.xml: the version libraries-bom pins; Maven resolves the jars)
#   rust    the scenario program built with the google-cloud-storage crate
#           (rust/Cargo.toml + rust/Cargo.lock, `cargo build --locked`)
#
# Usage: install.sh [python|go|node|java|rust]...   (no argument: all five)
#
# Each install lives in
#   ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/sidecar-clients/<lang>-<key>
# where <key> hashes the pin files, the program's sources (Go) and the
# toolchain version, so a changed pin or toolchain gets a fresh install and an
# unchanged one is reused at no cost. Only the package registries are
# needed (the Python package index, the Go module proxy, the npm registry,
# the Maven repository, the crate registry) on first use.
#
# Prints one `lang=PATH` line per language on stdout:
#   python=<venv>/bin/python   go=<dir>/scenario   node=<dir>/node_modules
#   java=<dir> (classes/ and lib/*.jar)   rust=<dir>/scenario
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
  [[ -x "$1/bin/python" ]] && "$1/bin/python" -c 'import google.cloud.storage, gcsfs' >/dev/null 2>&1
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

# --- java ---------------------------------------------------------------------
# Maven only resolves the pinned jars (into its own repository in the cache);
# javac compiles the scenarios (JSON API: Scenario; gRPC: GrpcScenario) against them.
check_java() {
  [[ -f "$1/classes/Scenario.class" && -f "$1/classes/GrpcScenario.class" ]] &&
    compgen -G "$1/lib/google-cloud-storage-*.jar" >/dev/null
}
build_java() {
  local m2="$cache_root/m2"
  (cd "$clients_dir/java" && mvn -B -q -Dmaven.repo.local="$m2" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$1/lib")
  mkdir -p "$1/classes"
  javac -encoding UTF-8 -d "$1/classes" -cp "$1/lib/*" "$clients_dir"/java/src/main/java/*.java
}
install_java() {
  command -v mvn >/dev/null 2>&1 || die "mvn (Maven) is required"
  command -v javac >/dev/null 2>&1 || die "javac (a JDK, 17 or newer) is required"
  local dest
  dest="$cache_root/java-$(key "$clients_dir/java/pom.xml" "$clients_dir"/java/src/main/java/*.java "$(javac -version 2>&1)")"
  install_one java "$dest" check_java build_java
  printf 'java=%s\n' "$dest"
}

# --- rust ---------------------------------------------------------------------
# Built outside the workspace (its own Cargo.lock), in a target directory kept
# in the cache so a changed source rebuilds only the program.
check_rust() { [[ -x "$1/scenario" ]]; }
build_rust() {
  cargo build --quiet --locked --manifest-path "$clients_dir/rust/Cargo.toml" \
    --target-dir "$cache_root/rust-target"
  cp -- "$cache_root/rust-target/debug/scenario" "$1/scenario"
}
install_rust() {
  command -v cargo >/dev/null 2>&1 || die "cargo is required"
  local dest
  dest="$cache_root/rust-$(key "$clients_dir/rust/Cargo.toml" "$clients_dir/rust/Cargo.lock" "$clients_dir"/rust/src/*.rs "$(cargo --version)")"
  install_one rust "$dest" check_rust build_rust
  printf 'rust=%s\n' "$dest/scenario"
}

langs=("$@")
[[ ${#langs[@]} -gt 0 ]] || langs=(python go node java rust)
for lang in "${langs[@]}"; do
  case "$lang" in
    python) install_python ;;
    go) install_go ;;
    node) install_node ;;
    java) install_java ;;
    rust) install_rust ;;
    *) die "unknown client '$lang' (expected python, go, node, java or rust)" ;;
  esac
done
