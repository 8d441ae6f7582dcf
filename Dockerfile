# Both product binaries in one minimal image (the test kit and the developer
# tooling in testkit/ and devtools/ are not built; tests/product.rs checks):
#   bucketmap          (the operator: `bucketmap operator ...`)
#   bucketmap-sidecar  (the per-pod proxy)
# The sidecar and the operator carry their own web PKI roots (webpki-roots),
# and distroless/cc adds the system CA bundle as well.
# Both base images are pinned by digest (the multi-platform index a tag
# named when pinned; the tag stays for the reader), so a rebuild starts from
# the bytes that were reviewed. Renovate (renovate.json) proposes new pins
# as pull requests.
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
COPY . .
# The `dist` profile (Cargo.toml): `release` plus fat LTO and one codegen unit;
# the sidecar's `dist-sidecar` also aborts on a panic, and tools/pgo/build.sh
# builds it with the profile of its training run, tools/pgo/sidecar.profdata.xz
# (profile-guided optimisation; tools/pgo/train.sh refreshes the profile).
# One package per build: built together, Cargo would unify their dependencies'
# features, and the sidecar would carry what only the operator needs.
RUN cargo build --profile dist --locked -p bucketmap \
 && bash tools/pgo/build.sh > /tmp/shipped-sidecar \
 && mkdir /out \
 && cp target/dist/bucketmap "$(tail -n 1 /tmp/shipped-sidecar)" /out/

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=build /out/bucketmap /out/bucketmap-sidecar /usr/local/bin/
# One malloc arena: the operator's heap is many small, long-lived objects
# (caches) touched from a few threads; one arena holds them in less memory
# (peak RSS at 5000 resources, docs/BENCHMARKS.md). The bench runs the
# operator with the same environment (devtools/src/bench/measure.rs).
ENV MALLOC_ARENA_MAX=1
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/bucketmap"]
