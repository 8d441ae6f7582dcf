#!/usr/bin/env bash
# Usage: pin-digest.sh VALUES_YAML sha256:DIGEST. Sets the chart's
# image.digest and sidecar.image.digest (both empty in the repository) to
# the released image's digest, so that an install pulls exactly what was
# built; fails unless both were set. The release workflow runs it before
# `helm package`.
set -euo pipefail
values="${1:?usage: pin-digest.sh VALUES_YAML sha256:DIGEST}"
digest="${2:?usage: pin-digest.sh VALUES_YAML sha256:DIGEST}"
[[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "not an image digest: $digest" >&2; exit 1; }
sed -i "s|^\( *\)digest: \"\"|\1digest: \"$digest\"|" "$values"
pinned="$(grep -c "^ *digest: \"$digest\"" "$values" || true)"
[ "$pinned" = 2 ] || { echo "expected 2 image digests in $values, set $pinned" >&2; exit 1; }
