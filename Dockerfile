# Multi-stage build: a static musl binary on a distroless, non-root runtime image.
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl && apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY data ./data
COPY benches ./benches
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin karpenter-exoscale

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/karpenter-exoscale /karpenter-exoscale
USER 65532:65532
ENTRYPOINT ["/karpenter-exoscale"]
CMD ["run"]
