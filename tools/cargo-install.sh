#!/usr/bin/env bash
# Installs a cargo subcommand the checks run (cargo-machete, cargo-deny,
# cargo-fuzz) at its pinned version, unless that version is installed.
#
# Usage: cargo-install.sh CRATE VERSION
#
# Built with the crate's own lock file, but with a release profile that is
# quick to build: no link-time optimisation, many codegen units, no debug
# information. These tools run for seconds in CI; their own release
# profiles (cargo-deny's is fat LTO with one codegen unit) cost minutes of
# CPU on a fresh machine, for a speed nobody waits on.
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: cargo-install.sh CRATE VERSION" >&2; exit 2; }
crate=$1 version=$2
# grep reads all of the list (no -q): under pipefail an early exit would
# fail the writer.
if cargo install --list | grep -xF "$crate v$version:" >/dev/null; then
  exit 0
fi
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_INCREMENTAL=false \
  cargo install --locked --version "=$version" "$crate"
