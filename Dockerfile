# Multi-stage build: a full Rust toolchain to compile, a slim Debian to run.
# Both the proxy and the demo's toy backend are in the image; compose picks the command.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY examples ./examples
RUN cargo build --release --locked --bin idemgate --example toy_backend \
 && cp target/release/idemgate target/release/examples/toy_backend /usr/local/bin/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home idemgate \
 && mkdir -p /var/lib/idemgate \
 && chown 10001 /var/lib/idemgate
COPY --from=build /usr/local/bin/idemgate /usr/local/bin/toy_backend /usr/local/bin/
COPY config /etc/idemgate
USER 10001
# The file store's directory (store.kind: file, config/file.yaml): a volume, so that
# keys survive a new container; the image's user owns it.
VOLUME /var/lib/idemgate
EXPOSE 8080 9901
ENTRYPOINT []
CMD ["idemgate", "--config", "/etc/idemgate/docker.yaml"]
