#!/usr/bin/env bash
# Provide nginx, the reverse proxy the sidecar bench compares itself with.
#
# Prints, as the last line of stdout, the path of the `nginx` binary:
#   1. $NGINX_BIN, when set and executable;
#   2. otherwise
#        ${BUCKETMAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketmap}/nginx/<version>/usr/sbin/nginx
#      unpacked on first use from the pinned Debian package (fetched with
#      `apt-get download`, unpacked with `dpkg -x`: no root, no system
#      service). The bench runs it as its own child with its own prefix and
#      configuration, so nothing from nginx-common (/etc/nginx) is needed.
#
# Fails with a message when the package cannot be fetched (no apt, not a
# Debian bookworm archive, no network) or the binary lacks the modules the
# bench needs (http_ssl_module, http_sub_module). Progress goes to stderr.
# Safe to run concurrently (flock on DEST.lock, atomic publish).
set -euo pipefail

tool=nginx
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

binary_override NGINX_BIN

# Debian bookworm's nginx (security update); bump together with the docs.
version=1.22.1-9+deb12u11
dest="$(cache_root)/nginx/$version"
binary=usr/sbin/nginx

# has_modules BIN: BIN runs and was built with the modules the bench uses.
has_modules() {
  local config
  config="$("$1" -V 2>&1)" || return 1
  [[ "$config" == *--with-http_ssl_module* && "$config" == *--with-http_sub_module* ]]
}

complete() { [[ -x "$1/$binary" ]] && has_modules "$1/$binary"; }

fetch() {
  local dir=$1 deb
  command -v apt-get >/dev/null 2>&1 || die "apt-get is required to fetch nginx $version (or set NGINX_BIN)"
  command -v dpkg >/dev/null 2>&1 || die "dpkg is required to unpack nginx $version (or set NGINX_BIN)"
  log "fetching Debian nginx $version into $dest"
  # apt-get download writes into the current directory.
  (cd "$dir" && apt-get download -q "nginx=$version" >&2) ||
    die "cannot download nginx=$version (is this Debian bookworm with bookworm-security in the sources, and has apt-get update run?)"
  deb="$(find "$dir" -maxdepth 1 -name 'nginx_*.deb' -print -quit)"
  [[ -n "$deb" ]] || die "apt-get download left no nginx_*.deb in $dir"
  dpkg -x "$deb" "$dir" || die "cannot unpack $deb"
  rm -f -- "$deb"
}

if ! complete "$dest"; then
  command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"
  mkdir -p "$(dirname -- "$dest")"
  exec 9>"$dest.lock"
  flock 9
  if ! complete "$dest"; then
    tmp="$(mktemp -d "$(dirname -- "$dest")/.fetch.XXXXXX")"
    trap 'rm -rf -- "$tmp"' EXIT
    fetch "$tmp"
    [[ -x "$tmp/$binary" ]] || die "the package has no $binary"
    has_modules "$tmp/$binary" || die "$binary lacks http_ssl_module or http_sub_module (nginx -V)"
    chmod 755 "$tmp"
    rm -rf -- "$dest"
    mv -T -- "$tmp" "$dest"
    trap - EXIT
  fi
fi
printf '%s\n' "$dest/$binary"
