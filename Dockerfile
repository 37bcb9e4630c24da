# The image of docker-compose.yml and of deploy/kubernetes/: a Rust toolchain compiles,
# a slim Debian of the same release runs. tests/it/docker_build.rs lays out exactly what
# the COPY lines below name (after .dockerignore) and runs the build command there, so a
# file the build needs and this file forgets fails CI; it also lints this file.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Cargo.toml names targets under tests/ and benches/ ([[test]], [[bench]]): the manifest
# does not load without their files, even though only the two binaries are built.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY examples ./examples
COPY tests ./tests
COPY benches ./benches
RUN cargo build --release --locked --bin idemgate --example toy_backend \
 && mkdir -p /var/lib/idemgate

FROM debian:bookworm-slim
# Trust anchors for https:// upstreams and rediss:// (the rust image installs
# ca-certificates), so this stage installs nothing and needs no package manager run.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /src/target/release/idemgate /src/target/release/examples/toy_backend /usr/local/bin/
COPY config /etc/idemgate
# The file store's directory (store.kind: file, config/file.yaml): made empty in the
# build stage and owned by the image's user, so that a fresh volume mounted there is
# writable; a volume, so that keys survive a new container.
COPY --from=build --chown=10001:10001 /var/lib/idemgate /var/lib/idemgate
VOLUME /var/lib/idemgate
# A numeric user and group: no passwd entry is needed, and Kubernetes' runAsNonRoot can
# tell that it is not root. Nothing is written outside the volume at run time, so the
# root file system can be read-only (docker-compose.yml, deploy/kubernetes/).
USER 10001:10001
EXPOSE 8080 9901
CMD ["idemgate", "--config", "/etc/idemgate/docker.yaml"]
