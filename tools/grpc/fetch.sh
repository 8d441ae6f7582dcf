#!/usr/bin/env bash
# Re-fetch the protobuf definitions the sidecar's gRPC rewriting is derived
# from: google.storage.v2 and google.storage.control.v2 and everything they
# import, from the proto jars Google publishes in the Maven repository, at the
# versions pinned below.
#
# Usage: bash tools/grpc/fetch.sh
# Writes sidecar/proto/ (the import closure of the two service files) and
# records the versions in sidecar/proto/README.md. Then regenerate the table:
#   cargo dev grpc-schema
# and review the diff of sidecar-core/src/grpc/schema.rs; an RPC added upstream
# fails `every_rpc_is_classified` until it is classified in
# sidecar/src/grpc/policy.rs.
set -euo pipefail

jars=(
  com.google.api.grpc:proto-google-cloud-storage-v2:2.63.0
  com.google.api.grpc:proto-google-cloud-storage-control-v2:2.62.0
  com.google.api.grpc:proto-google-iam-v1:1.76.0
  com.google.api.grpc:proto-google-common-protos:2.81.0
)
roots=(google/storage/v2/storage.proto google/storage/control/v2/storage_control.proto)

repo="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="$repo/sidecar/proto"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
m2="${MAVEN_REPO:-$HOME/.m2/repository}"

for coordinate in "${jars[@]}"; do
  IFS=: read -r group artifact version <<<"$coordinate"
  mvn -q dependency:get -Dartifact="$coordinate" -Dtransitive=false >&2
  jar="$m2/${group//.//}/$artifact/$version/$artifact-$version.jar"
  [[ -f "$jar" ]] || { echo "not downloaded: $jar" >&2; exit 1; }
  (cd "$work" && unzip -qo "$jar" '*.proto')
done

# The import closure of the roots (google/protobuf/* are built into protox).
python3 - "$work" "$dest" "${roots[@]}" <<'PY'
import os, re, shutil, sys
work, dest, roots = sys.argv[1], sys.argv[2], sys.argv[3:]
seen, todo = set(), list(roots)
while todo:
    path = todo.pop()
    if path in seen or path.startswith("google/protobuf/"):
        continue
    seen.add(path)
    text = open(os.path.join(work, path), encoding="utf-8").read()
    todo.extend(re.findall(r'^import\s+(?:public\s+)?"([^"]+)";', text, re.M))
shutil.rmtree(os.path.join(dest, "google"), ignore_errors=True)
for path in sorted(seen):
    os.makedirs(os.path.dirname(os.path.join(dest, path)), exist_ok=True)
    shutil.copyfile(os.path.join(work, path), os.path.join(dest, path))
print(f"sidecar/proto: {len(seen)} files", file=sys.stderr)
PY

{
  echo "# Vendored protobuf definitions"
  echo
  echo "The sidecar's gRPC bucket-name table (\`sidecar-core/src/grpc/schema.rs\`) is derived"
  echo "from these files: \`google.api.resource_reference\`, \`google.api.resource\` and"
  echo "\`google.api.routing\` annotations say which fields hold bucket names. Fetched by"
  echo "\`tools/grpc/fetch.sh\` from the Maven repository; do not edit by hand."
  echo
  for coordinate in "${jars[@]}"; do echo "- \`$coordinate\`"; done
} >"$dest/README.md"
