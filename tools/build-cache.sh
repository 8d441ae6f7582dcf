#!/usr/bin/env bash
# Keeps the compiled dependencies of the workspace (and of the fuzz targets'
# workspace) between clean clones of the repository, the way CI caches of
# Rust projects do: a fresh clone compiles only its own crates.
#
# Usage: build-cache.sh restore | save
#
#   restore  copies the cache into target/ and sidecar-core/fuzz/target/
#            when the clone has none yet (a clone with a target directory of
#            its own is left alone). Prints what it did.
#   save     copies target/ and sidecar-core/fuzz/target/, less the
#            workspace's own crates, into the cache, and removes older
#            caches. CI saves after a run that passed.
#
# The cache lives under ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/cargo-target/KEY,
# KEY a hash of what decides how the dependencies compile: the lock files,
# the pinned toolchains, `rustc -vV` and the build profiles. A cache of
# another key is never restored: cargo would rebuild most of it and the
# stale artifacts would grow the cache forever.
#
# Why this is sound: cargo decides what to rebuild by its fingerprints, not
# by the directory it finds them in. A dependency from the crate registry
# is named by a hash of its version, features and profile, independent of
# where the clone lives; the workspace's crates are rebuilt because a clone
# gives their sources new modification times (and their artifacts are left
# out of the cache anyway). Build scripts' outputs that name their old
# output directory are rewritten by cargo when the target directory moves.
# Copies, not hard links: rustc and cargo rewrite some files in place, which
# would change the cache under a later clone.
set -euo pipefail

tool=build-cache
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$tools_dir/lib.sh"
root="$(cd -- "$tools_dir/.." && pwd)"
cd "$root"

# Written into each build directory restored, at the time of the restore.
restored_marker=.build-cache-restored

# The build directories kept: the workspace's and the fuzz targets'.
targets=(target sidecar-core/fuzz/target)
manifests=(Cargo.toml sidecar-core/fuzz/Cargo.toml)

key() {
  {
    cat Cargo.lock sidecar-core/fuzz/Cargo.lock rust-toolchain.toml \
      sidecar-core/fuzz/rust-toolchain.toml
    rustc -vV
    sed -n '/^\[profile/,$p' Cargo.toml
  } | sha256sum | cut -c1-16
}

# workspace_names: every package and target name of both workspaces, with
# `-` and `_` (artifact files use the crate name, fingerprints the
# package name). `save` reads them once into `workspace`.
declare -A workspace=()
workspace_names() {
  local manifest
  for manifest in "${manifests[@]}"; do
    cargo metadata --no-deps --format-version 1 --locked --manifest-path "$manifest"
  done | python3 -c '
import json, sys
names = set()
for line in sys.stdin:
    for p in json.loads(line)["packages"]:
        for n in [p["name"]] + [t["name"] for t in p["targets"]]:
            names.update({n, n.replace("-", "_")})
print("\n".join(sorted(names)))'
}

# is_workspace_artifact PATH: whether PATH (under a profile's deps,
# .fingerprint or build) belongs to a crate of the workspace: its name, less
# a `lib` prefix and the `-<hash>` suffix, is in `workspace`.
is_workspace_artifact() {
  local base="${1##*/}"
  base="${base#lib}"
  [[ -n ${workspace[${base%-*}]:-} ]]
}

# used_profiles TARGET: the profile directories under TARGET (./debug,
# ./<host>/dist-sidecar) cargo built in since the clone was made: those
# holding the lock file cargo takes there (the cache leaves it out, so a
# restored directory has none until cargo uses it). A profile directory
# restored but unused is not saved again, so one a run stopped building
# leaves the cache.
used_profiles() {
  (cd "$1" && find . -mindepth 2 -maxdepth 3 -type f -name .cargo-lock) | while IFS= read -r lock; do
    if [[ -d "$1/${lock%/.cargo-lock}/.fingerprint" ]]; then printf '%s\n' "${lock%/.cargo-lock}"; fi
  done
}

# built_since_restore TARGET: whether a dependency's artifact under TARGET
# is newer than the restore (the workspace's own always are).
built_since_restore() {
  local target="$1" dir entry
  while IFS= read -r dir; do
    while IFS= read -r entry; do
      is_workspace_artifact "$entry" || return 0
    done < <(find "$target/$dir"/{deps,.fingerprint,build} -mindepth 1 -maxdepth 1 \
      -newer "$target/$restored_marker" 2>/dev/null)
  done < <(used_profiles "$target")
  return 1
}

# excludes TARGET: the paths under TARGET (as tar names them: ./...) the
# cache leaves out. Kept: the profile directories (those holding
# .fingerprint, such as ./debug or ./<host>/dist-sidecar) with only their
# deps, .fingerprint and build, less the workspace's own artifacts there.
# Left out: the files cargo copies up beside them, incremental state, and
# everything that is not a profile directory (logs, profiles, scratch).
excludes() {
  local target="$1" entry parent dir
  declare -A profiles=() keep=()
  while IFS= read -r dir; do profiles[$dir]=1; done < <(used_profiles "$target")
  for dir in "${!profiles[@]}"; do keep[$dir]=1 keep[$(dirname "$dir")]=1; done
  while IFS= read -r entry; do
    parent="$(dirname "$entry")"
    if [[ -n ${keep[$entry]:-} ]]; then continue; fi
    if [[ -n ${profiles[$parent]:-} ]]; then
      case "${entry##*/}" in deps | .fingerprint | build) continue ;; esac
    elif [[ -z ${keep[$parent]:-} ]]; then
      continue # inside a directory left out, or inside deps, .fingerprint or build
    fi
    printf '%s\n' "$entry"
  done < <(cd "$target" && find . -mindepth 1 -maxdepth 3)
  for dir in "${!profiles[@]}"; do
    for entry in "$target/$dir"/{deps,.fingerprint,build}/*; do
      [[ -e $entry ]] || continue
      if is_workspace_artifact "$entry"; then printf '%s\n' "./${entry#"$target"/./}"; fi
    done
  done
}

restore() {
  local cache target restored=0
  cache="$(cache_root)/cargo-target/$(key)"
  if [[ ! -d $cache ]]; then
    log "no cache for this lock file and toolchain ($cache): building from scratch"
    return 0
  fi
  for target in "${targets[@]}"; do
    if [[ -e $target ]]; then
      log "$target exists: left as it is"
      continue
    fi
    [[ -d $cache/$target ]] || continue
    mkdir -p "$(dirname "$target")"
    cp -a "$cache/$target" "$target"
    touch "$target/$restored_marker"
    restored=1
  done
  if ((restored)); then log "restored the compiled dependencies from $cache ($(du -sh "$cache" | cut -f1))"; fi
}

save() {
  local base cache tmp target old fresh=0
  base="$(cache_root)/cargo-target"
  cache="$base/$(key)"
  mkdir -p "$base"
  exec 9>"$base.lock"
  flock 9
  local name
  while IFS= read -r name; do workspace[$name]=1; done < <(workspace_names)
  ((${#workspace[@]})) || die "cargo metadata named no workspace crate"
  for target in "${targets[@]}"; do
    [[ -d $target ]] || continue
    if [[ ! -f $target/$restored_marker ]] || built_since_restore "$target"; then fresh=1; fi
  done
  if ((!fresh)) && [[ -d $cache ]]; then
    log "no dependency compiled since the restore: $cache is current"
    return 0
  fi
  tmp="$(mktemp -d "$base/.saving.XXXXXX")"
  for target in "${targets[@]}"; do
    [[ -d $target ]] || continue
    mkdir -p "$tmp/$target"
    excludes "$target" >"$tmp/excludes"
    tar -C "$target" --anchored --no-wildcards --exclude-from="$tmp/excludes" -cf - . | tar -C "$tmp/$target" -xf -
  done
  rm -f "$tmp/excludes"
  rm -rf "$cache"
  mv -T "$tmp" "$cache"
  for old in "$base"/*; do
    [[ $old == "$cache" ]] || rm -rf "$old"
  done
  log "saved the compiled dependencies to $cache ($(du -sh "$cache" | cut -f1))"
}

case "$#:${1:-}" in
  1:restore) restore ;;
  1:save) save ;;
  *) die "usage: build-cache.sh restore | save" ;;
esac
