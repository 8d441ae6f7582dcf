#!/usr/bin/env bash
# Prints the rows of archives.tsv for the Kubernetes versions go.mod and
# oldest/go.mod pin, on linux and darwin, amd64 and arm64, read from a
# local copy of the envtest release index (envtest-releases.yaml of the
# controller-tools repository).
#
# Usage: archives.sh INDEX
#
# Fails, naming them, when the index lacks an archive of a pinned version
# or links one elsewhere than where archive.sh fetches it from; prints the
# rows it found either way.
set -euo pipefail

tool=envtest
tools_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$tools_dir/../lib.sh"
# shellcheck source-path=SCRIPTDIR source=archive.sh
source "$tools_dir/archive.sh"

[[ $# == 1 && -f $1 ]] || die "usage: archives.sh INDEX (a copy of envtest-releases.yaml)"
index=$1

# entries: `<file name> <hash> <selfLink>` for every archive of the index.
entries="$(awk '
  /^    [^ ].*:$/ { name = $1; sub(/:$/, "", name); hash = ""; link = "" }
  /^      hash: / { hash = $2 }
  /^      selfLink: / { link = $2 }
  name != "" && hash != "" && link != "" { print name, hash, link; name = "" }
' "$index")"

missing=0
for version in "$(pinned_version k8s.io/kubernetes)" "$(pinned_version_in "$tools_dir/oldest" k8s.io/kubernetes)"; do
  for platform in linux-amd64 linux-arm64 darwin-amd64 darwin-arm64; do
    name="envtest-$version-$platform.tar.gz"
    read -r hash link < <(awk -v n="$name" '$1 == n { print $2, $3; exit }' <<<"$entries") || true
    if [[ -z ${hash:-} ]]; then
      log "the index has no $name"
      missing=1
    elif [[ $link != "$envtest_archive_base_url/envtest-$version/$name" ]]; then
      log "the index links $name at $link, not where archive.sh fetches it"
      missing=1
    else
      printf '%s\t%s\t%s\n' "$version" "$platform" "$hash"
    fi
    hash="" link=""
  done
done
exit "$missing"
