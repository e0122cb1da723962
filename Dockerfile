# syntax=docker/dockerfile:1
# Multi-stage build: a static musl binary on a distroless, non-root runtime image.
#   docker build -t karpenter-exoscale .
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/karpenter-exoscale:<tag> --push .
# The build stage runs on the target platform, so the musl target is the native one.
#
# Base images are pinned by digest (of the multi-platform index), the tag kept beside it for
# people: a tag says what the image is, the digest decides which image is used. To update one,
# read the new digest and change both in one reviewed commit:
#   docker buildx imagetools inspect rust:1.95-bookworm | grep -m1 Digest
#   docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot | grep -m1 Digest
# (or `crane digest <image>`). The `chart` test refuses a FROM without a digest.

FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src
# Only what the binary is built from: sources, the embedded catalogue and the manifest. The
# benches and the sandbox and scale examples are declared in Cargo.toml, so cargo needs their
# files to read the manifest.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY data ./data
COPY benches ./benches
COPY hack/sandbox ./hack/sandbox
COPY hack/scale ./hack/scale
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-musl" \
 && cargo build --profile dist --locked --target "$target" --bin karpenter-exoscale \
 && install -D -m 0555 "target/$target/dist/karpenter-exoscale" /out/karpenter-exoscale

# distroless/static: CA certificates, /etc/passwd with nonroot (65532), no shell, no libc.
FROM gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639
LABEL org.opencontainers.image.title="karpenter-exoscale" \
      org.opencontainers.image.description="Karpenter node autoscaler with the Exoscale cloud provider" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/karpenter-exoscale/karpenter-exoscale"
COPY --from=build /out/karpenter-exoscale /karpenter-exoscale
USER 65532:65532
ENTRYPOINT ["/karpenter-exoscale"]
CMD ["run"]
