#!/usr/bin/env bash
# Makes the Rust toolchains pinned in rust-toolchain.toml (the workspace) and
# sidecar-core/fuzz/rust-toolchain.toml (the fuzz targets' nightly) available.
#
# rustup installs a missing pinned toolchain by itself when it can reach its
# distribution server. This machine may not: when a toolchain of the same
# version is installed under another name (`stable`, `nightly`), the pinned
# name is made an alias of it in rustup's toolchains directory, which needs
# no network (`rustup toolchain link` refuses official channel names).
# Prints the two pinned names.
set -euo pipefail
cd "$(dirname "$0")/.."

channel() { sed -n 's/^channel = "\(.*\)"$/\1/p' "$1"; }
installed() { grep -q "^$1\(-\| \|$\)" <<<"$(rustup toolchain list)"; }

# ensure PINNED CANDIDATE EXPECTED: PINNED exists, or CANDIDATE's `rustc
# --version` contains EXPECTED and is linked as PINNED, or rustup installs it.
ensure() {
  local pinned="$1" candidate="$2" expected="$3"
  installed "$pinned" && return 0
  if installed "$candidate" \
    && grep -qF "$expected" <<<"$(rustc +"$candidate" --version)"; then
    local host dir
    host="$(rustc +"$candidate" -vV | sed -n 's/^host: //p')"
    dir="${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
    echo "using the installed $candidate toolchain as $pinned (same version)" >&2
    ln -sfn "$(rustc +"$candidate" --print sysroot)" "$dir/$pinned-$host"
  else
    rustup toolchain install "$pinned" --profile minimal --component rustfmt,clippy
  fi
}

stable="$(channel rust-toolchain.toml)"
nightly="$(channel sidecar-core/fuzz/rust-toolchain.toml)"
ensure "$stable" stable "rustc $stable "
# nightly-YYYY-MM-DD is built from the previous day's commit.
day="$(date -u -d "${nightly#nightly-} -1 day" +%Y-%m-%d)"
ensure "$nightly" nightly "$day)"
echo "$stable $nightly"
