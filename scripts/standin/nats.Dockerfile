# LOCAL STAND-IN for the official nats alpine image, for machines that
# cannot reach the image registry: Debian's base, wget for the health
# check, and nats-server built from the Go module proxy at the version in
# go.mod (copied into the build context). Built by scripts/compose-test.sh
# only when the real image cannot be pulled.
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends wget \
 && rm -rf /var/lib/apt/lists/*
COPY nats-server /usr/local/bin/nats-server
EXPOSE 4222 8222
CMD ["nats-server"]
