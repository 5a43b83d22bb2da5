# Build: docker build -t ctxbudget .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && strip target/release/ctxbudget

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 ctxbudget
COPY --from=build /src/target/release/ctxbudget /usr/local/bin/ctxbudget
COPY config/ctxbudget.example.toml /etc/ctxbudget/ctxbudget.toml
USER ctxbudget
EXPOSE 50051 9090
ENTRYPOINT ["ctxbudget"]
CMD ["serve", "--listen", "0.0.0.0:50051", "--metrics-listen", "0.0.0.0:9090", "--config", "/etc/ctxbudget/ctxbudget.toml"]
