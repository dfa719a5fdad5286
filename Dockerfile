# syntax=docker/dockerfile:1
#
# tumbler's container image: `docker build -t tumbler:0.1.0 .`
# The runtime image has no shell and no package manager; the process runs as
# the distroless "nonroot" user (65532) and needs no writable filesystem.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Protos compile with a pure-Rust compiler (protox): no system protoc needed.
# The cache mounts keep the crate registry and target/ between builds, so the
# binary is copied out of target/ within the same step. Cargo.toml's release
# profile strips the binary and builds it with fat LTO.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin tumbler \
    && install -m 0755 target/release/tumbler /usr/local/bin/tumbler

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="tumbler" \
      org.opencontainers.image.description="A gRPC lock service on Redis" \
      org.opencontainers.image.licenses="MIT"
COPY --from=build /usr/local/bin/tumbler /tumbler
# MIT asks for the notice to travel with every copy of the binary.
COPY --from=build /src/LICENSE /usr/share/doc/tumbler/LICENSE
USER 65532:65532
# 50051: gRPC (lock service, grpc.health.v1, reflection); 9090: HTTP /metrics.
EXPOSE 50051 9090 50052
ENTRYPOINT ["/tumbler", "serve"]
