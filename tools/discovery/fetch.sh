#!/usr/bin/env bash
# Re-fetch the GCS JSON API discovery document (storage v1) the sidecar's
# router is built from, from the discovery cache shipped in the Python package index's
# google-api-python-client, at the version pinned below.
#
# Usage: bash tools/discovery/fetch.sh [VERSION]
# Writes sidecar-core/discovery/storage.v1.json and updates the version recorded
# in sidecar-core/discovery/README.md. Review the diff, then run
# `cargo test -p bucketmap-sidecar --lib discovery`: a method added upstream
# fails `every_discovery_method_is_classified` until it is classified in
# sidecar-core/src/discovery.rs.
set -euo pipefail

package=google-api-python-client
version="${1:-2.202.0}"
member=googleapiclient/discovery_cache/documents/storage.v1.json

repo="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="$repo/sidecar-core/discovery"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m pip download --quiet --no-deps "$package==$version" -d "$work" >&2
wheel="$(find "$work" -name '*.whl' -print -quit)"
[[ -n "$wheel" ]] || { echo "no wheel downloaded for $package==$version" >&2; exit 1; }
python3 - "$wheel" "$member" "$dest/storage.v1.json" <<'PY'
import sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, open(out, "wb") as f:
    f.write(z.read(member))
PY
revision="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["revision"])' "$dest/storage.v1.json")"
sed -i -E "s/^(- package: ).*/\1\`$package==$version\` (the Python package index)/; s/^(- revision: ).*/\1\`$revision\`/" "$dest/README.md"
echo "sidecar-core/discovery/storage.v1.json: $package==$version, revision $revision" >&2
