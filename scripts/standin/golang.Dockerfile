# LOCAL STAND-IN for the official golang image, for machines that cannot
# reach the image registry: Debian's base and this machine's own Go
# toolchain (copied into the build context as go/). It trusts what this
# machine trusts (its local CAs, copied as local-ca/), so that the image
# build reaches the Go module proxy the way this machine does. Built by
# scripts/compose-test.sh only when the real image cannot be pulled.
ARG BASE
FROM ${BASE}
COPY local-ca/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && update-ca-certificates
COPY go /usr/local/go
ENV GOPATH=/go \
    PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go
