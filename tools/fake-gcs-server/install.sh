#!/usr/bin/env bash
# Provide fake-gcs-server, the GCS emulator the sidecar's integration tests
# use as their upstream.
#
# Prints, as the last line of stdout, the path of the `fake-gcs-server`
# binary:
#   1. $FAKE_GCS_SERVER_BIN, when set and executable;
#   2. otherwise
#        ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/fake-gcs-server/<version>/fake-gcs-server
#      (version read from go.mod next to this script), built from the pinned Go
#      module on first use (see ../lib.sh).
#
# Progress goes to stderr. Safe to run concurrently.
set -euo pipefail

tool=fake-gcs-server
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

binary_override FAKE_GCS_SERVER_BIN

module=github.com/fsouza/fake-gcs-server
version="$(pinned_version "$module")"
dest="$(cache_root)/fake-gcs-server/$version"

has_binary() { [[ -x "$1/fake-gcs-server" ]]; }

build() {
  log "building $module $version into $dest"
  log "(first run only; about two minutes, needs the Go module proxy or a warm module cache)"
  (cd "$tools_dir" && go_build -ldflags="-s -w" -o "$1/fake-gcs-server" "$module")
}

build_once "$dest" has_binary build FAKE_GCS_SERVER_BIN
printf '%s\n' "$dest/fake-gcs-server"
