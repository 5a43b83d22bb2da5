# Build: docker build -t ctxbudget .
FROM rust:1.95-bookworm AS build
WORKDIR /src

# Dependencies first, in a layer of their own, rebuilt only when the
# manifests, the lock file or the build scripts and their inputs (proto/, the
# store crate's lua/, and the three files of the core crate the store's
# build.rs compiles in: the dimensions, the shared layout and the script
# calls' schema) change — not on every code change. Placeholders stand in for
# the crates' own targets: each crate's library, the binary, and the benches
# the manifests declare (cargo refuses to load them without their files).
COPY Cargo.toml Cargo.lock ./
COPY crates/core/Cargo.toml crates/core/Cargo.toml
COPY crates/store/Cargo.toml crates/store/build.rs crates/store/
COPY crates/store/lua crates/store/lua
COPY crates/engine/Cargo.toml crates/engine/Cargo.toml
COPY crates/server/Cargo.toml crates/server/build.rs crates/server/
COPY proto proto
COPY crates/core/src/dimension.rs crates/core/src/layout.rs crates/core/src/
COPY crates/core/src/budget/calls.rs crates/core/src/budget/calls.rs
RUN mkdir -p src crates/store/src crates/engine/src crates/server/src \
        crates/engine/benches crates/server/benches \
    && touch src/lib.rs crates/core/src/lib.rs crates/store/src/lib.rs \
        crates/engine/src/lib.rs crates/server/src/lib.rs \
    && echo 'fn main() {}' > src/main.rs \
    && echo 'fn main() {}' > crates/server/benches/hot_paths.rs \
    && echo 'fn main() {}' > crates/engine/benches/tokenizers.rs \
    && cargo build --release --locked \
    && rm -rf src crates/core/src crates/store/src crates/engine/src crates/server/src \
        crates/engine/benches crates/server/benches

# Then the real tree. Cargo rebuilds by modification time and the copied
# sources may be older than the placeholders' build: touch the crate roots so
# each crate itself is always rebuilt (the dependencies are not).
COPY . .
RUN touch src/lib.rs src/main.rs crates/*/src/lib.rs \
    && cargo build --release --locked \
    && strip target/release/ctxbudget

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 ctxbudget
COPY --from=build /src/target/release/ctxbudget /usr/local/bin/ctxbudget
COPY config/ctxbudget.example.toml /etc/ctxbudget/ctxbudget.toml
USER ctxbudget
EXPOSE 50051 9090 8080
# `ctxbudget health --addr 127.0.0.1:50051` exits 0 while the service is
# SERVING: the healthcheck of docker-compose.yml, and of any orchestrator.
ENTRYPOINT ["ctxbudget"]
CMD ["serve", "--listen", "0.0.0.0:50051", "--metrics-listen", "0.0.0.0:9090", "--config", "/etc/ctxbudget/ctxbudget.toml"]
