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
# Safe to run concurrently (flock on nginx.lock, atomic publish).
set -euo pipefail

tool=nginx
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"

binary_override NGINX_BIN

# Debian bookworm's nginx: the security update first, then the point
# release's. The archive keeps only the newest security update, so the
# second pin is what a machine gets once the first has been superseded;
# bump both together with the docs.
versions=(1.22.1-9+deb12u12 1.22.1-9+deb12u9)
binary=usr/sbin/nginx

# has_modules BIN: BIN runs and was built with the modules the bench uses.
has_modules() {
  local config
  config="$("$1" -V 2>&1)" || return 1
  [[ "$config" == *--with-http_ssl_module* && "$config" == *--with-http_sub_module* ]]
}

complete() { [[ -x "$1/$binary" ]] && has_modules "$1/$binary"; }

# fetch DIR VERSION: unpacks the package into DIR; fails when the archive
# does not have VERSION.
fetch() {
  local dir=$1 version=$2 deb
  command -v apt-get >/dev/null 2>&1 || die "apt-get is required to fetch nginx $version (or set NGINX_BIN)"
  command -v dpkg >/dev/null 2>&1 || die "dpkg is required to unpack nginx $version (or set NGINX_BIN)"
  log "fetching Debian nginx $version"
  # apt-get download writes into the current directory.
  if ! (cd "$dir" && apt-get download -q "nginx=$version" >&2); then
    log "the archive has no nginx $version"
    return 1
  fi
  deb="$(find "$dir" -maxdepth 1 -name 'nginx_*.deb' -print -quit)"
  [[ -n "$deb" ]] || die "apt-get download left no nginx_*.deb in $dir"
  dpkg -x "$deb" "$dir" || die "cannot unpack $deb"
  rm -f -- "$deb"
}

# A version already unpacked is used as it is.
for version in "${versions[@]}"; do
  dest="$(cache_root)/nginx/$version"
  if complete "$dest"; then
    printf '%s\n' "$dest/$binary"
    exit 0
  fi
done

command -v flock >/dev/null 2>&1 || die "flock (util-linux) is required"
mkdir -p "$(cache_root)/nginx"
exec 9>"$(cache_root)/nginx.lock"
flock 9
for version in "${versions[@]}"; do
  dest="$(cache_root)/nginx/$version"
  if complete "$dest"; then
    printf '%s\n' "$dest/$binary"
    exit 0
  fi
  tmp="$(mktemp -d "$(cache_root)/nginx/.fetch.XXXXXX")"
  trap 'rm -rf -- "$tmp"' EXIT
  if ! fetch "$tmp" "$version"; then
    rm -rf -- "$tmp"
    trap - EXIT
    continue
  fi
  [[ -x "$tmp/$binary" ]] || die "the package has no $binary"
  has_modules "$tmp/$binary" || die "$binary lacks http_ssl_module or http_sub_module (nginx -V)"
  chmod 755 "$tmp"
  rm -rf -- "$dest"
  mv -T -- "$tmp" "$dest"
  trap - EXIT
  printf '%s\n' "$dest/$binary"
  exit 0
done
die "cannot download nginx ${versions[*]} (is this Debian bookworm with bookworm-security in the sources, and has apt-get update run?)"
