# shellcheck shell=bash disable=SC2154  # `tool` and `tools_dir` are set by the sourcing script
# Shared by tools/*/install.sh, which source it: each of them builds a Go tool
# from the module version pinned in its go.mod, once, into a per-user cache.
#
# Builds are safe to run concurrently: they are serialised with flock on
# DEST.lock and published atomically (built in a temporary directory next to
# DEST, then renamed), so a killed run never leaves a half-built DEST.
#
# The sourcing script sets `tool` (its name in log lines) and `tools_dir`
# (its own directory) first.

log() { printf '%s: %s\n' "$tool" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# binary_override VAR: when the variable VAR is set, prints its value and
# exits (the value must be an executable file); otherwise does nothing.
binary_override() {
  local value="${!1:-}"
  [[ -n "$value" ]] || return 0
  [[ -x "$value" ]] || die "$1=$value is not an executable file (unset it to build one)"
  printf '%s\n' "$value"
  exit 0
}

# pinned_version MODULE: the version the go.mod next to the sourcing script
# (in $tools_dir) requires MODULE at; dies when there is none.
pinned_version() {
  local go_mod="$tools_dir/go.mod" version
  [[ -f "$go_mod" ]] || die "missing $go_mod"
  version="$(awk -v mod="$1" '($1 == mod || ($1 == "require" && $2 == mod)) { v = ($1 == "require") ? $3 : $2; if (v ~ /^v[0-9]/) { print v; exit } }' "$go_mod")"
  [[ -n "$version" ]] || die "cannot find the $1 version in $go_mod"
  printf '%s\n' "$version"
}

# kubernetes_ldflags VERSION: the linker flags of a Kubernetes binary built
# from the module: stripped, and stamped with VERSION the way the release
# build does, so a server reports v1.34.x instead of v0.0.0-master.
kubernetes_ldflags() {
  local version=$1 minor pkg ldflags="-s -w"
  minor="${version#v1.}"
  minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean"
  done
  printf '%s\n' "$ldflags"
}

# go_build ARGS...: `go build` as every Go tool here is built. Each binary
# is stripped at link time (-s -w in its -ldflags), so the compiler is told
# not to generate the debug information the linker would drop
# (-dwarf=false): the same binary for less CPU, which a first run spends
# mostly on building kube-apiserver (docs/BENCHMARKS.md).
go_build() { go build -trimpath -gcflags=all=-dwarf=false "$@"; }

# The cache every tool is built into.
cache_root() {
  printf '%s\n' "${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}"
}

# build_once DEST COMPLETE BUILD OVERRIDE: unless `COMPLETE DEST` already
# holds, runs `BUILD DIR` (a function writing the tool into the empty
# directory DIR) and publishes DIR as DEST, under the lock (publish_once).
# OVERRIDE names the variable that points at binaries of the user's own
# instead (for the error without Go), or is empty when there is none.
build_once() {
  local dest=$1 complete=$2 build=$3 override=$4
  "$complete" "$dest" && return 0
  require_go "$override"
  publish_once "$dest" "$complete" "$build"
}

# require_go OVERRIDE: dies unless go is on PATH, naming the variable
# OVERRIDE (when not empty) as the way around it.
require_go() {
  command -v go >/dev/null 2>&1 || die "go is required to build $tool${1:+ (or set $1)}"
}

# publish_once DEST COMPLETE MAKE: unless `COMPLETE DEST` already holds,
# runs `MAKE DIR` (a function writing the tool into the empty directory
# DIR, by building or fetching it) and publishes DIR as DEST, under the
# lock. Fails unless `COMPLETE DIR` holds afterwards.
publish_once() {
  local dest=$1 complete=$2 make=$3
  "$complete" "$dest" && return 0
  command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"

  mkdir -p "$(dirname -- "$dest")"
  exec 9>"$dest.lock"
  if ! flock -n 9; then
    log "waiting for another build of $dest ..."
    flock 9
  fi
  # Another process may have finished the build while we waited for the lock.
  "$complete" "$dest" && return 0

  build_tmp="$(mktemp -d "$(dirname -- "$dest")/.build.XXXXXX")"
  trap 'rm -rf -- "$build_tmp"' EXIT
  local start=$SECONDS
  "$make" "$build_tmp" >&2 || die "could not provide $dest (see above)"
  "$complete" "$build_tmp" || die "the build did not produce what $dest needs"
  chmod 755 "$build_tmp"

  # Publish atomically: a partial directory left by a killed run is replaced.
  rm -rf -- "$dest"
  mv -T -- "$build_tmp" "$dest"
  trap - EXIT
  log "ready in $((SECONDS - start))s"
}

# pinned_version_in DIR MODULE: like pinned_version, for the go.mod in DIR
# (a second pinned build kept in a subdirectory of the sourcing script's).
pinned_version_in() {
  local tools_dir=$1
  pinned_version "$2"
}
