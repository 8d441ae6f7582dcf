#!/usr/bin/env bash
# A flame graph of the sidecar's metadata path (issue 12): the sidecar bench's
# requests-per-second phase (metadata GETs at 1 and 16 connections, every
# path; nginx too when tools/nginx/install.sh can have it) with `perf record`
# attached to the sidecar process, folded and drawn by inferno.
#
#   tools/profile/flamegraph.sh [OUT.svg]    # default target/flamegraph/sidecar-metadata.svg
#
# Needs `perf` (Debian: linux-perf) allowed to profile the sidecar
# (kernel.perf_event_paranoid <= 2 for a child of this user). inferno is
# installed once, pinned, into the per-user cache. The CPU-per-request
# figures this run prints for the sidecar include perf's own sampling
# overhead: take figures from a bench run without it.
set -euo pipefail

tool=profile
tools_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$tools_dir/../lib.sh"

repo="$(cd "$tools_dir/../.." && pwd)"
out="${1:-$repo/target/flamegraph/sidecar-metadata.svg}"
inferno_version=0.12.8
inferno_root="$(cache_root)/inferno-$inferno_version"

command -v perf >/dev/null || die "perf is not installed (Debian: apt-get install linux-perf)"
if [[ ! -x "$inferno_root/bin/inferno-flamegraph" ]]; then
  log "installing inferno $inferno_version into $inferno_root"
  cargo install --locked --quiet --version "=$inferno_version" --root "$inferno_root" inferno
fi

# The sidecar as the image ships it (tools/pgo/build.sh: the `dist-sidecar`
# profile, profile-guided), with line tables so that perf can name inlined
# frames; in its own target directory, so that the shipped build in target/
# is not replaced by one with debug information.
log "building the shipped sidecar with line tables, and the bench"
cd "$repo"
sidecar="$(CARGO_PROFILE_DIST_SIDECAR_DEBUG=line-tables-only CARGO_TARGET_DIR="$repo/target/prof" \
  bash tools/pgo/build.sh --quiet | tail -n 1)"
bench="$(cargo bench -p bucketmap-sidecar --bench proxy --no-run --message-format=json 2>/dev/null |
  jq -r 'select(.reason == "compiler-artifact" and .target.name == "proxy" and .executable != null) | .executable' |
  tail -n 1)"
[[ -x "$bench" ]] || die "cannot find the bench binary"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The bench starts this instead of the sidecar: perf attaches to the
# sidecar's pid (the exec keeps it) and records until the phase is over.
cat >"$work/sidecar" <<EOF
#!/bin/sh
(sleep 0.3; exec perf record -q -F 1999 --call-graph dwarf,16384 -p \$\$ -o "$work/perf.data" -- sleep 60 >/dev/null 2>&1) &
exec "$sidecar" "\$@"
EOF
chmod +x "$work/sidecar"

log "running the requests-per-second phase with perf on the sidecar"
(cd "$repo/sidecar" && BUCKETMAP_BENCH_PHASES=rps BUCKETMAP_BENCH_SIDECAR_BIN="$work/sidecar" "$bench" --bench >"$work/bench.txt")
# perf stops at the end of its `sleep`; wait for it to write its data.
while pgrep -f "perf record .*$work/perf.data" >/dev/null; do sleep 1; done

mkdir -p "$(dirname "$out")"
perf script -i "$work/perf.data" 2>/dev/null |
  "$inferno_root/bin/inferno-collapse-perf" >"$work/folded"
# Frames narrower than half a pixel are left out: the line tables name
# every inlined frame, and the drawing would be three times the size.
"$inferno_root/bin/inferno-flamegraph" --minwidth 0.5 --title "bucketmap-sidecar: metadata GETs (bench rps phase)" <"$work/folded" >"$out"
cp "$work/folded" "${out%.svg}.folded"
log "wrote $out (and ${out%.svg}.folded)"
