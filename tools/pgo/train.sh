#!/usr/bin/env bash
# Refreshes tools/pgo/sidecar.profdata.xz, the profile tools/pgo/build.sh
# builds the shipped sidecar with. Run it after changes to the sidecar's
# request path or its dependencies, and commit the new profile with them.
#
#   1. builds the sidecar instrumented (-Cprofile-generate), in
#      target/pgo-train/build;
#   2. runs the sidecar bench's training workload through it
#      (BUCKETMAP_BENCH_PHASES=train, sidecar/benches/proxy/train.rs):
#      metadata GETs above all, transfers, every other kind of request, in
#      front of plain and TLS upstreams and over gRPC; each sidecar is
#      stopped with SIGTERM and writes its counts as it exits;
#   3. merges the counts (llvm-profdata merge --sparse: functions that never
#      ran are left out, as they would count nothing) into the profile, and
#      compresses it (xz, one thread, so that the same profile always packs
#      to the same bytes).
#
# llvm-profdata must read the raw profiles of rustc's LLVM: the one of the
# toolchain's llvm-tools component when installed (rustup component add
# llvm-tools), otherwise $LLVM_PROFDATA, otherwise llvm-profdata-19 (Debian
# bookworm's llvm-19, which reads the raw format of rustc 1.95's LLVM 22).
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)"
host="$(rustc -vV | sed -n 's/^host: //p')"
work="$root/target/pgo-train"
profiles="$work/profiles"

profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [[ ! -x "$profdata" ]]; then
  profdata="${LLVM_PROFDATA:-$(command -v llvm-profdata-19 || true)}"
fi
[[ -n "$profdata" && -x "$profdata" ]] || {
  echo "pgo: no llvm-profdata: rustup component add llvm-tools, or apt-get install llvm-19" >&2
  exit 1
}

cd "$root"
rm -rf "$profiles"
mkdir -p "$profiles"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$profiles" \
  cargo build --profile dist-sidecar --locked -p bucketmap-sidecar --bin bucketmap-sidecar \
  --target "$host" --target-dir "$work/build"
instrumented="$work/build/$host/dist-sidecar/bucketmap-sidecar"

BUCKETMAP_BENCH_PHASES=train BUCKETMAP_BENCH_SIDECAR_BIN="$instrumented" \
  cargo bench --locked -p bucketmap-sidecar --bench proxy

shopt -s nullglob
raw=("$profiles"/*.profraw)
(( ${#raw[@]} > 0 )) || { echo "pgo: the training run wrote no profile in $profiles" >&2; exit 1; }
"$profdata" merge --sparse -o "$work/sidecar.profdata" "${raw[@]}"
xz -9e -T1 -c "$work/sidecar.profdata" >"$root/tools/pgo/sidecar.profdata.xz"
echo "pgo: wrote tools/pgo/sidecar.profdata.xz from ${#raw[@]} raw profile(s) with $profdata" >&2
