#!/usr/bin/env bash
# Usage: check-version.sh TAG (vX.Y.Z). Prints X.Y.Z when the tag, the
# operator's Cargo.toml and the chart's appVersion name the same version;
# fails, naming the three, otherwise. The release workflow runs it first.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag="${1:?usage: check-version.sh vX.Y.Z}"
tag="${tag#v}"
crate="$(sed -n '/^\[package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)"
app="$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' deploy/chart/bucketmap/Chart.yaml)"
if [ "$tag" != "$crate" ] || [ "$tag" != "$app" ]; then
  echo "versions differ: tag $tag, Cargo.toml $crate, chart appVersion $app" >&2
  exit 1
fi
echo "$tag"
