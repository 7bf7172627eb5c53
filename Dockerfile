# LoopX attached session broker.
#   docker build -t loopx .
#   docker run -d --name loopx -p 127.0.0.1:7317:7317 -v loopx-data:/data loopx
#   docker exec loopx cat /data/owner.token
#
# The build context is exactly what the COPY lines below name (plus
# .dockerignore); `.ci/docker-check` rebuilds that context in a temporary
# folder and compiles it, so a missing workspace file fails CI, not a user.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
# The options the bundled SQLite is compiled with (LIBSQLITE3_FLAGS).
COPY .cargo .cargo
COPY src src
COPY migrations migrations
COPY openapi openapi
# The benchmark is a workspace member: cargo needs its manifest to load the
# workspace, though only the broker is built.
COPY bench bench
RUN cargo build --release --locked -p loopx --bin loopx && cp target/release/loopx /usr/local/bin/loopx

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --user-group --home-dir /data --no-create-home loopx \
    && mkdir /data \
    && chown loopx:loopx /data \
    && chmod 0700 /data
COPY --from=build /usr/local/bin/loopx /usr/local/bin/loopx
USER loopx
VOLUME /data
ENV LOOPX_DATA_DIR=/data
EXPOSE 7317
# The binary checks itself: GET /healthz on the container's own port (no curl
# in the image); exit 0 healthy, 1 store unavailable, 3 not answering.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["loopx", "health", "--broker-url", "http://127.0.0.1:7317"]
ENTRYPOINT ["loopx"]
CMD ["serve", "--listen", "0.0.0.0:7317", "--allow-remote"]
