#!/usr/bin/env bash
# Builds the example application of the node tests (examples/app/go: the
# official Go client, cloud.google.com/go/storage, at the version its go.mod
# pins) as one static binary (CGO_ENABLED=0), so that its image needs
# nothing else. testkit/src/images assembles the image around it.
#
# Prints, as the last line of stdout, the path of the binary. Progress goes
# to stderr. Built once per content of the sources and Go version, into the
# per-user cache (tools/lib.sh); safe to run concurrently.
set -euo pipefail

tool=example-app
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

binary_override BUCKETMAP_EXAMPLE_APP

src="$(cd -- "$tools_dir/../../examples/app/go" && pwd)"
command -v go >/dev/null 2>&1 || die "go is required to build the example app"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum (coreutils) is required"
key="$({ cat -- "$src"/go.mod "$src"/go.sum "$src"/*.go; go version; } | sha256sum | cut -c1-16)"
dest="$(cache_root)/example-app/photo-app-$key"

has_binary() { [[ -x "$1/photo-app" ]]; }
build() {
  log "building $src into $dest"
  (cd "$src" && CGO_ENABLED=0 go_build -mod=readonly -ldflags="-s -w" -o "$1/photo-app" .)
}

build_once "$dest" has_binary build BUCKETMAP_EXAMPLE_APP
printf '%s\n' "$dest/photo-app"
