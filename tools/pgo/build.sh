#!/usr/bin/env bash
# Builds bucketmap-sidecar as the image ships it: the `dist-sidecar` profile
# (Cargo.toml), optimised with the profile of its own training run,
# tools/pgo/sidecar.profdata.xz (profile-guided optimisation: LLVM lays out
# and inlines the code by how often each branch ran; what that is worth:
# docs/BENCHMARKS.md).
#
# Prints, as the last line of stdout, the path of the binary. Further
# arguments go to `cargo build` (the bench adds --message-format). The
# Dockerfile, the sidecar bench and tools/profile/flamegraph.sh build the
# shipped sidecar with this script; tools/pgo/train.sh refreshes the profile.
#
# The profile is committed compressed (xz), beside the script that makes
# it, and unpacked into the per-user cache (tools/lib.sh's cache_root) under
# a name made of its content's hash. Its path is part of RUSTFLAGS, which
# cargo's fingerprints hold: a path that moved with the clone, or a file
# rewritten with the same content, would rebuild every crate it optimises,
# and the compiled dependencies tools/build-cache.sh keeps would never serve.
#
# The build is for the host's target, named explicitly (--target), so that
# the profile applies to the sidecar's code and its dependencies and not to
# build scripts and procedural macros, and so that it has its own
# directory, target/<host>/dist-sidecar, apart from a plain `cargo build
# --profile dist-sidecar`. A function changed since the profile was taken
# is compiled as if it had no profile (LLVM matches each function by a hash
# of its control flow): a stale profile costs speed, never correctness.
set -euo pipefail

root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)"
packed="$root/tools/pgo/sidecar.profdata.xz"
[[ -f "$packed" ]] || { echo "pgo: missing $packed (tools/pgo/train.sh makes it)" >&2; exit 1; }
command -v xz >/dev/null || { echo "pgo: xz unpacks $packed (Debian: apt-get install xz-utils)" >&2; exit 1; }
host="$(rustc -vV | sed -n 's/^host: //p')"
[[ -n "$host" ]] || { echo "pgo: rustc -vV names no host" >&2; exit 1; }

cd "$root"
target_dir="$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)"
tool=pgo
tools_dir="$root/tools"
# shellcheck source=../lib.sh
source "$root/tools/lib.sh"
mkdir -p "$(cache_root)/pgo"
profile="$(cache_root)/pgo/sidecar-$(sha256sum "$packed" | cut -c1-16).profdata"
if [[ ! -f $profile ]]; then
  # A temporary name of this process's own, renamed into place: CI runs
  # this script twice at once (its background shipped build and the node
  # tests' image build).
  unpacked="$(mktemp "$profile.new.XXXXXX")"
  xz -dc "$packed" >"$unpacked"
  mv "$unpacked" "$profile"
fi

RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$profile" \
  cargo build --profile dist-sidecar --locked -p bucketmap-sidecar --bin bucketmap-sidecar \
  --target "$host" "$@"
printf '%s\n' "$target_dir/$host/dist-sidecar/bucketmap-sidecar"
