# Build: docker build -t leader-gate .
# A static-ish release binary (glibc) on a distroless base, running as non-root.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs && cargo build --release --locked

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/leader-gate /usr/local/bin/leader-gate
USER nonroot:nonroot
EXPOSE 4040 4041
ENTRYPOINT ["/usr/local/bin/leader-gate"]
CMD ["serve", "--help"]
