#!/usr/bin/env bash
# Provide rclone, whose GCS backend (google.golang.org/api/storage/v1, the
# generated JSON API client) the sidecar's integration tests drive through
# the sidecar and directly.
#
# Prints, as the last line of stdout, the path of the `rclone` binary:
#   1. $RCLONE_BIN, when set and executable;
#   2. otherwise
#        ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/rclone/<version>-<hash>/rclone
#      (version read from go.mod next to this script), built from the pinned Go
#      module on first use (see ../lib.sh): main.go, rclone with the
#      backends and commands the tests use. The directory's name also holds
#      a hash of main.go and go.sum, so a changed selection is rebuilt.
#
# Progress goes to stderr. Safe to run concurrently.
set -euo pipefail

tool=rclone
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

binary_override RCLONE_BIN

module=github.com/rclone/rclone
version="$(pinned_version "$module")"
dest="$(cache_root)/rclone/$version-$(cat "$tools_dir/main.go" "$tools_dir/go.sum" | sha256sum | cut -c1-12)"

has_binary() { [[ -x "$1/rclone" ]]; }

build() {
  log "building $module $version into $dest"
  log "(first run only; about a minute, needs the Go module proxy or a warm module cache)"
  (cd "$tools_dir" && go_build -ldflags="-s -w" -o "$1/rclone" .)
}

build_once "$dest" has_binary build RCLONE_BIN
printf '%s\n' "$dest/rclone"
