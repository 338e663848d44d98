# Build: docker build -t leader-gate .
#
# For those with a builder (Docker, BuildKit, buildah). Without one,
# scripts/build-image.sh makes the same image from the binary this file's
# build stage produces, and scripts/check-image-run.sh runs it in
# containerd (docs/image.md).
#
# Platforms: this file builds one platform per build, TARGET naming its
# Rust target (default x86_64-unknown-linux-gnu, linux/amd64: the one
# replayed and run here). The two-platform image (an OCI image index,
# linux/amd64 and linux/arm64) is built by the scripts, not by buildx:
# scripts/build-arm64.sh cross-builds the arm64 binary from Debian's
# packages and scripts/build-image.sh packs both (docs/image.md). For an
# arm64 image from this file, `docker buildx build --platform linux/arm64
# --build-arg TARGET=aarch64-unknown-linux-gnu .` should work: the build
# stage then runs in rust's arm64 image (emulated on an amd64 builder, so
# slow) and builds natively there, with its own gcc for ring, and the
# distroless base has an arm64 image. Not run here (no Docker engine), and
# one buildx call for both platforms cannot give each its TARGET.
#
# A statically linked release binary (glibc linked in with crt-static) on a
# distroless static base, running as the numeric non-root user 65532 (the
# kubelet only honours runAsNonRoot for a numeric USER). The binary is
# static because the exec gate is copied into collector images whose libc we
# do not control (`leader-gate install DEST`).
#
# scripts/check-image-build.sh replays the build stage without Docker (CI
# runs it): it copies what the COPY lines name, sets the ARG/ENV lines and
# runs the RUN lines in that copy. Keep them in the forms it parses: one
# KEY=VALUE per ARG/ENV, paths relative to WORKDIR, no CARGO_TARGET_DIR.

ARG TARGET=x86_64-unknown-linux-gnu

FROM rust:1.95-slim-bookworm AS build
ARG TARGET
# With --target, these flags reach the binary only (not build scripts or
# proc-macros); ring's C code is compiled by the image's gcc and linked in.
ENV RUSTFLAGS="-C target-feature=+crt-static"
WORKDIR /src
# Dependencies first, so source edits do not rebuild them: the real
# manifests, and a stand-in for every target they declare (main, lib, the
# failover bench, any example).
COPY Cargo.toml Cargo.lock ./
COPY scripts/stub-targets.sh ./scripts/
RUN sh scripts/stub-targets.sh >.stubs \
    && cargo build --release --locked --target "$TARGET" \
    && xargs rm -f <.stubs && rm .stubs
# The image builds only the binary; targets it does not build (benches,
# examples) stay stand-ins so the manifest still resolves.
COPY src ./src
RUN sh scripts/stub-targets.sh && touch src/main.rs src/lib.rs \
    && cargo build --release --locked --target "$TARGET" --bin leader-gate

FROM gcr.io/distroless/static-debian12
ARG TARGET
COPY --from=build /src/target/${TARGET}/release/leader-gate /usr/local/bin/leader-gate
USER 65532:65532
EXPOSE 4040 4041
ENTRYPOINT ["/usr/local/bin/leader-gate"]
CMD ["serve", "--help"]
