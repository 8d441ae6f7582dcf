# Both product binaries in one minimal image (the test kit and the developer
# tooling in testkit/ and devtools/ are not built; tests/product.rs checks):
#   bucketmap          (the operator: `bucketmap operator ...`)
#   bucketmap-sidecar  (the per-pod proxy)
# The sidecar and the operator carry their own web PKI roots (webpki-roots),
# and distroless/cc adds the system CA bundle as well.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p bucketmap -p bucketmap-sidecar \
 && mkdir /out \
 && cp target/release/bucketmap target/release/bucketmap-sidecar /out/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/bucketmap /out/bucketmap-sidecar /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/bucketmap"]
