#!/bin/bash
# LOCAL STAND-IN for the official postgres image's entrypoint: only what
# docker-compose.yml relies on. On an empty PGDATA it creates the cluster
# with POSTGRES_USER, the password of POSTGRES_PASSWORD_FILE (or
# POSTGRES_PASSWORD) and POSTGRES_DB, with password (scram) logins over
# TCP; then it runs the server as the postgres account.
set -Eeuo pipefail

if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA"
	chown postgres:postgres "$PGDATA"
	chmod 0700 "$PGDATA"
	# Read as root, like the official image: the file may belong to
	# another uid. The password then travels in the environment only.
	if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
		POSTGRES_PASSWORD="$(< "$POSTGRES_PASSWORD_FILE")"
		export POSTGRES_PASSWORD
		unset POSTGRES_PASSWORD_FILE
	fi
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -z "${POSTGRES_PASSWORD:-}" ]; then
		echo "stand-in postgres: no POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE" >&2
		exit 1
	fi
	initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
		--auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA"
	printf '%s\n' "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
	printf '%s\n' "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
	# The first run listens on its socket only, so a health check over
	# TCP passes only once the real server is up.
	pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
	if [ "$POSTGRES_DB" != postgres ]; then
		psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
			--set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
	fi
	pg_ctl -D "$PGDATA" -m fast -w stop
fi
unset POSTGRES_PASSWORD
exec "$@"
