#!/bin/sh
# Entrypoint of the PostgreSQL stand-in image (deploy/images/build-standins.sh): the part of
# the official postgres image's entrypoint that docker-compose.yml relies on, so the two images
# are interchangeable there. As root it prepares the data and socket directories and drops to
# the postgres user; on an empty data directory it runs initdb with POSTGRES_USER (superuser,
# default postgres), POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE, and creates POSTGRES_DB
# (default: the user's name); the server listens on every address and host connections
# authenticate with scram-sha-256. Not supported: /docker-entrypoint-initdb.d scripts,
# POSTGRES_INITDB_ARGS, POSTGRES_HOST_AUTH_METHOD.
set -eu

PGDATA="${PGDATA:-/var/lib/postgresql/data}"
export PGDATA

# `docker run image -c key=value`: options for the server.
if [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
	exec "$@"
fi

# The official image's file_env: X or X_FILE (read here, as root, then passed on in X).
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
	if [ -n "${POSTGRES_PASSWORD:-}" ]; then
		echo "error: both POSTGRES_PASSWORD and POSTGRES_PASSWORD_FILE are set (but are exclusive)" >&2
		exit 1
	fi
	POSTGRES_PASSWORD="$(cat "$POSTGRES_PASSWORD_FILE")"
	export POSTGRES_PASSWORD
	unset POSTGRES_PASSWORD_FILE
fi

if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	find "$PGDATA" \! -user postgres -exec chown postgres:postgres '{}' +
	chmod 700 "$PGDATA"
	chown postgres:postgres /var/run/postgresql
	chmod 2775 /var/run/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_USER:=postgres}"
	: "${POSTGRES_DB:=$POSTGRES_USER}"
	if [ -z "${POSTGRES_PASSWORD:-}" ]; then
		echo "error: the database is uninitialized and POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE) is not set" >&2
		exit 1
	fi
	pwfile="$(mktemp)"
	printf '%s' "$POSTGRES_PASSWORD" >"$pwfile"
	initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
		--auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
	rm -f "$pwfile"
	printf '\nhost all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	if [ "$POSTGRES_DB" != postgres ]; then
		# A server on the socket only, as the official image does, to create the database.
		pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
		createdb --username="$POSTGRES_USER" -- "$POSTGRES_DB"
		pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
	fi
	echo "PostgreSQL init process complete; ready for start up."
fi
unset POSTGRES_PASSWORD
exec "$@"
