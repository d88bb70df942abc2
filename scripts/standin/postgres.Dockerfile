# LOCAL STAND-IN for the official postgres image, for machines that cannot
# reach the image registry: Debian's postgresql-15 and an entrypoint that
# does what docker-compose.yml relies on from the official one. Built by
# scripts/compose-test.sh only when the real image cannot be pulled.
ARG BASE
FROM ${BASE}
# The official image's uid and gid, created before the package would pick
# others.
RUN groupadd --system --gid 999 postgres \
 && useradd --system --uid 999 --gid 999 --home-dir /var/lib/postgresql --shell /bin/bash postgres \
 && mkdir -p /etc/postgresql-common/createcluster.d \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/no-main.conf \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data
RUN install -d -o postgres -g postgres -m 1777 "$PGDATA" \
 && install -d -o postgres -g postgres -m 3777 /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["docker-entrypoint.sh"]
EXPOSE 5432
STOPSIGNAL SIGINT
CMD ["postgres"]
