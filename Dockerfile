# LoopX attached session broker.
#   docker build -t loopx .
#   docker run -d --name loopx -p 127.0.0.1:7317:7317 -v loopx-data:/data loopx
#   docker exec loopx cat /data/owner.token

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY migrations migrations
COPY openapi openapi
RUN cargo build --release --locked && cp target/release/loopx /usr/local/bin/loopx

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
ENTRYPOINT ["loopx"]
CMD ["serve", "--listen", "0.0.0.0:7317", "--allow-remote"]
