#!/usr/bin/env bash
# Bookworm stand-ins for the official base images, built from Debian's own packages with
# mmdebstrap, for machines that reach Debian's mirror but no image registry (CI here):
#
#   cronhook-standin/python:3.11-bookworm    for python:3.11-slim-bookworm (Debian's 3.11)
#   cronhook-standin/postgres:15-bookworm    for postgres:16-bookworm (bookworm has 15 only)
#
#   deploy/images/build-standins.sh      # prints PYTHON_IMAGE=... and POSTGRES_IMAGE=...
#
# Then `PYTHON_IMAGE=... POSTGRES_IMAGE=... docker-compose up --build` (or put them in .env).
# An image is rebuilt only when missing or when its recipe (this script, deploy/images/postgres/)
# changed: the recipe's hash is the image's label cronhook.recipe. Needs root, mmdebstrap and a
# running Docker engine (deploy/compose-e2e/prepare.sh sees to both).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

PYTHON_STANDIN="${PYTHON_STANDIN:-cronhook-standin/python:3.11-bookworm}"
POSTGRES_STANDIN="${POSTGRES_STANDIN:-cronhook-standin/postgres:15-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
sources=(
  "deb $MIRROR bookworm main"
  "deb $MIRROR bookworm-updates main"
  "deb $SECURITY_MIRROR bookworm-security main"
)
# The image's PATH and locale, as the official images set them.
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
recipe="$(cat "$0" "$here"/postgres/* | sha256sum | cut -c1-16)"

current() {
  [ "$(docker image inspect --format '{{ index .Config.Labels "cronhook.recipe" }}' "$1" 2>/dev/null)" = "$recipe" ]
}

# The image a rebuild replaces is removed (unless a container still uses it).
drop_replaced() {
  local tag="$1" old="$2"
  if [ -n "$old" ] && [ "$old" != "$(docker image inspect --format '{{.Id}}' "$tag")" ]; then
    docker rmi "$old" >/dev/null 2>&1 || true
  fi
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A root file system of bookworm with `packages`, as a tar file (not piped into `docker
# import`: a failed mmdebstrap must not leave an empty image under the tag). No docs, man
# pages or apt lists (mmdebstrap removes the lists itself).
rootfs() {
  local packages="$1"
  shift
  mmdebstrap --quiet --variant=apt --format=tar --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$@" bookworm "$work/rootfs.tar" "${sources[@]}"
}

if current "$PYTHON_STANDIN"; then
  echo "kept $PYTHON_STANDIN" >&2
else
  started=$SECONDS
  old="$(docker image inspect --format '{{.Id}}' "$PYTHON_STANDIN" 2>/dev/null || true)"
  # python3-venv: the Dockerfile's builder makes a venv; passwd: groupadd/useradd.
  rootfs python3,python3-venv,ca-certificates,passwd,tzdata
  docker import --change "ENV PATH=$path" --change 'ENV LANG=C.UTF-8' \
      --change "LABEL cronhook.recipe=$recipe" --change 'CMD ["python3"]' "$work/rootfs.tar" "$PYTHON_STANDIN" >/dev/null
  rm -f "$work/rootfs.tar"
  drop_replaced "$PYTHON_STANDIN" "$old"
  echo "built $PYTHON_STANDIN in $((SECONDS - started)) s" >&2
fi

if current "$POSTGRES_STANDIN"; then
  echo "kept $POSTGRES_STANDIN" >&2
else
  started=$SECONDS
  old="$(docker image inspect --format '{{.Id}}' "$POSTGRES_STANDIN" 2>/dev/null || true)"
  base="${POSTGRES_STANDIN}-rootfs"
  # No "main" cluster from the package: the entrypoint makes the one in PGDATA.
  rootfs postgresql-15,tzdata,ca-certificates \
    --essential-hook='mkdir -p "$1/etc/postgresql-common/createcluster.d" && echo "create_main_cluster = false" > "$1/etc/postgresql-common/createcluster.d/no-main-cluster.conf"'
  docker import "$work/rootfs.tar" "$base" >/dev/null
  rm -f "$work/rootfs.tar"
  DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE=$base" --label "cronhook.recipe=$recipe" \
    -t "$POSTGRES_STANDIN" "$here/postgres" >/dev/null 2>"$work/build.log" || { cat "$work/build.log" >&2; exit 1; }
  docker rmi "$base" >/dev/null
  drop_replaced "$POSTGRES_STANDIN" "$old"
  echo "built $POSTGRES_STANDIN in $((SECONDS - started)) s" >&2
fi

echo "PYTHON_IMAGE=$PYTHON_STANDIN"
echo "POSTGRES_IMAGE=$POSTGRES_STANDIN"
