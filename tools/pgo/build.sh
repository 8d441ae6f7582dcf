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
# it, and unpacked here into the target directory; it is written only when
# its content changed, since rustc takes the file as an input of every crate
# it optimises and a new copy would rebuild them all.
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
target_dir="$(mkdir -p "${CARGO_TARGET_DIR:-target}/pgo" && cd "${CARGO_TARGET_DIR:-target}" && pwd)"
profile="$target_dir/pgo/sidecar.profdata"
# A temporary name of this process's own: CI runs this script twice at once
# (its background shipped build and the node tests' image build), and a
# shared name let one run remove the file the other was about to move.
unpacked="$(mktemp "$profile.new.XXXXXX")"
xz -dc "$packed" >"$unpacked"
if cmp -s "$unpacked" "$profile"; then rm "$unpacked"; else mv "$unpacked" "$profile"; fi

RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$profile" \
  cargo build --profile dist-sidecar --locked -p bucketmap-sidecar --bin bucketmap-sidecar \
  --target "$host" "$@"
printf '%s\n' "$target_dir/$host/dist-sidecar/bucketmap-sidecar"
