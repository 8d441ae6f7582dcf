# shellcheck shell=bash disable=SC2154  # `tool` and `tools_dir` are set by install.sh
# Sourced by install.sh: fetches kube-apiserver and etcd from the envtest
# release archive of a Kubernetes version, the archive setup-envtest
# installs, instead of building them. The archive is accepted only when its
# sha512 is the one archives.tsv (next to this file) lists for the version
# and this host's platform; it is downloaded into the build's temporary
# directory, and only the requested members are kept.
#
# BUCKETMAP_ENVTEST_FETCH=0 turns the fetch off (install.sh builds);
# BUCKETMAP_ENVTEST_ARCHIVE_URL replaces the base URL below (a mirror, or a
# test's local server): the archive of version V for platform P is
# $base/envtest-V/envtest-V-P.tar.gz, as the release index lays them out.

# Base URL of the envtest release archives: the release assets of the
# controller-tools repository, where setup-envtest's index points.
envtest_archive_base_url="https://github.com/kubernetes-sigs/controller-tools/releases/download"

# Members of an archive are under this directory.
envtest_archive_prefix="controller-tools/envtest"

# Why the last fetch_archive failed, for install.sh's message.
fetch_failure=""

# fail REASON: records why the fetch failed and fails.
fail() {
  fetch_failure=$1
  return 1
}

# host_platform: sets `platform` to `<os>-<arch>` as the archives are
# named (linux-amd64).
host_platform() {
  local os arch
  case "$(uname -s)" in
    Linux) os=linux ;;
    Darwin) os=darwin ;;
    *) fail "no envtest archive is published for $(uname -s)" || return 1 ;;
  esac
  case "$(uname -m)" in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) fail "no envtest archive is published for $(uname -m)" || return 1 ;;
  esac
  platform="$os-$arch"
}

# archive_sha512 VERSION PLATFORM: sets `expected` to the sha512
# archives.tsv lists for the archive, or fails saying there is none.
archive_sha512() {
  local table="$tools_dir/archives.tsv"
  [[ -f $table ]] || fail "$table is missing" || return 1
  expected="$(awk -F '\t' -v v="$1" -v p="$2" \
    '$1 !~ /^#/ && $1 == v && $2 == p { print $3; exit }' "$table")"
  [[ -n $expected ]] || fail "tools/envtest/archives.tsv lists no envtest archive of Kubernetes $1 for $2" || return 1
  [[ $expected =~ ^[0-9a-f]{128}$ ]] ||
    fail "tools/envtest/archives.tsv lists '$expected' for $1 $2, not a sha512" || return 1
}

# sha512_of FILE: the file's sha512, hex.
sha512_of() {
  local out
  if command -v sha512sum >/dev/null 2>&1; then
    out="$(sha512sum -- "$1")" || return 1
  else
    out="$(shasum -a 512 -- "$1")" || return 1
  fi
  printf '%s\n' "${out%% *}"
}

# download URL FILE: the body of URL into FILE, or a failure with curl's
# reason. A transfer that stalls for 30 s is abandoned, not a slow one.
download() {
  local err
  command -v curl >/dev/null 2>&1 || fail "curl is not installed" || return 1
  err="$(curl --fail --silent --show-error --location --proto '=https,http' \
    --connect-timeout 10 --speed-limit 1024 --speed-time 30 \
    --output "$2" -- "$1" 2>&1)" || fail "the download of $1 failed: ${err:-curl failed}" || return 1
}

# unpack ARCHIVE DIR MEMBER...: extracts MEMBERs (names under the archive's
# prefix) into DIR, each a regular file made executable.
unpack() {
  local archive=$1 dir=$2 member err paths=()
  shift 2
  for member in "$@"; do paths+=("$envtest_archive_prefix/$member"); done
  err="$(tar -xzf "$archive" -C "$dir" --no-same-owner -- "${paths[@]}" 2>&1)" ||
    fail "the archive cannot be unpacked or lacks ${paths[*]}: $err" || return 1
  for member in "${paths[@]}"; do
    [[ -f $dir/$member && ! -L $dir/$member ]] || fail "the archive's $member is not a regular file" || return 1
    chmod 755 "$dir/$member"
  done
}

# fetch_archive DIR VERSION MEMBER...: puts MEMBERs (kube-apiserver, etcd)
# of the envtest archive of Kubernetes VERSION for this host into DIR, after
# checking the archive's sha512 against archives.tsv, and sets `fetched` to
# the archive's name and URL. On failure DIR is as it was, and
# fetch_failure says why.
fetch_archive() {
  local dir=$1 version=$2 platform expected url work actual
  shift 2
  [[ ${BUCKETMAP_ENVTEST_FETCH:-1} != 0 ]] || fail "BUCKETMAP_ENVTEST_FETCH=0" || return 1
  host_platform || return 1
  archive_sha512 "$version" "$platform" || return 1
  url="${BUCKETMAP_ENVTEST_ARCHIVE_URL:-$envtest_archive_base_url}"
  url="${url%/}/envtest-$version/envtest-$version-$platform.tar.gz"
  work="$(mktemp -d "$dir/.fetch.XXXXXX")" || fail "cannot create a directory in $dir" || return 1
  log "fetching $url"
  if download "$url" "$work/archive.tar.gz" &&
    { actual="$(sha512_of "$work/archive.tar.gz")" || fail "cannot compute the archive's sha512"; } &&
    { [[ $actual == "$expected" ]] ||
      fail "the archive from $url has sha512 $actual, not the $expected tools/envtest/archives.tsv lists"; } &&
    unpack "$work/archive.tar.gz" "$work" "$@" &&
    take_members "$work/$envtest_archive_prefix" "$dir" "$@"; then
    rm -rf -- "$work"
    fetched="envtest-$version-$platform.tar.gz from $url"
    return 0
  fi
  rm -rf -- "$work"
  return 1
}

# take_members FROM DIR MEMBER...: moves the MEMBERs from FROM into DIR,
# all or none.
take_members() {
  local from=$1 dir=$2 member
  shift 2
  for member in "$@"; do
    mv -- "$from/$member" "$dir/$member" && continue
    for member in "$@"; do rm -f -- "$dir/$member"; done
    fail "cannot move the archive's $member into $dir" || return 1
  done
}
