#!/usr/bin/env bash
# Makes this machine ready for the compose end-to-end test (tests/compose/), and leaves it so:
#
#   deploy/compose-e2e/prepare.sh                # then: pytest -m compose tests/compose
#   deploy/compose-e2e/prepare.sh stop-dockerd   # stops the engine, if this script started it
#
# 1. Debian's docker.io (engine 20.10), docker-compose (v1.29) and mmdebstrap, via apt, unless
#    present (bounded; the log goes to $STATE_DIR/apt.log).
# 2. A Docker engine: when `docker info` fails, dockerd is started in the background (detached,
#    so it outlives this script; its pid in $STATE_DIR/dockerd.pid, its log next to it).
# 3. The bookworm stand-in base images (deploy/images/build-standins.sh; kept when current).
# 4. The machine's CA bundle as deploy/ca/build-host-bundle.crt (gitignored), for pip in the
#    image's builder stage where TLS goes through an intercepting proxy; the runtime image does
#    not trust it (Dockerfile).
#
# Idempotent: a second run finds everything in place in a few seconds. Each step's time is
# printed. Needs root (apt, dockerd, mmdebstrap).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
STATE_DIR="${STATE_DIR:-/tmp/cronhook-compose-e2e}"
BUILD_CA_BUNDLE="${BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
mkdir -p "$STATE_DIR"

step() {
  printf 'prepare: %-28s %4d s  %s\n' "$1" "$(($(date +%s) - $2))" "$3"
}

stop_dockerd() {
  local pidfile="$STATE_DIR/dockerd.pid"
  [ -f "$pidfile" ] || { echo "prepare: no dockerd started by this script"; return 0; }
  local pid
  pid="$(cat "$pidfile")"
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
    kill "$pid"
    # dockerd stops its containers and its containerd first; give it time.
    for _ in $(seq 1 150); do
      [ -d "/proc/$pid" ] || break
      sleep 0.2
    done
    echo "prepare: stopped dockerd ($pid)"
  fi
  rm -f "$pidfile"
}

if [ "${1:-}" = stop-dockerd ]; then
  stop_dockerd
  exit 0
fi

# 1. Packages.
started=$(date +%s)
if command -v dockerd >/dev/null && command -v docker-compose >/dev/null && command -v mmdebstrap >/dev/null; then
  step "packages" "$started" "present"
else
  if ! timeout 300 bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose mmdebstrap' \
      >"$STATE_DIR/apt.log" 2>&1; then
    tail -20 "$STATE_DIR/apt.log" >&2
    echo "prepare: could not install docker.io docker-compose mmdebstrap (log: $STATE_DIR/apt.log)" >&2
    exit 1
  fi
  step "packages" "$started" "installed docker.io docker-compose mmdebstrap"
fi

# 2. The engine.
started=$(date +%s)
if docker info >/dev/null 2>&1; then
  step "dockerd" "$started" "already running"
else
  setsid nohup dockerd >"$STATE_DIR/dockerd.log" 2>&1 </dev/null &
  echo $! >"$STATE_DIR/dockerd.pid"
  deadline=$(($(date +%s) + 60))
  until docker info >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ] || ! [ -d "/proc/$(cat "$STATE_DIR/dockerd.pid")" ]; then
      tail -20 "$STATE_DIR/dockerd.log" >&2
      echo "prepare: dockerd did not come up (log: $STATE_DIR/dockerd.log)" >&2
      exit 1
    fi
    sleep 0.2
  done
  step "dockerd" "$started" "started, pid $(cat "$STATE_DIR/dockerd.pid") (stop: $0 stop-dockerd)"
fi

# 3. Base images.
started=$(date +%s)
images="$("$root/deploy/images/build-standins.sh" 2>"$STATE_DIR/standins.log")" || {
  cat "$STATE_DIR/standins.log" >&2
  exit 1
}
step "base images" "$started" "$(grep -E '^(kept|built)' "$STATE_DIR/standins.log" | paste -sd ';' -)"

# 4. The build's CA bundle (copied only when it changed: an identical file keeps the image
# build's cache).
started=$(date +%s)
if [ -s "$BUILD_CA_BUNDLE" ]; then
  if ! cmp -s "$BUILD_CA_BUNDLE" "$root/deploy/ca/build-host-bundle.crt"; then
    cp "$BUILD_CA_BUNDLE" "$root/deploy/ca/build-host-bundle.crt"
  fi
  step "build CA" "$started" "deploy/ca/build-host-bundle.crt"
else
  step "build CA" "$started" "no $BUILD_CA_BUNDLE: the build trusts the base image's CAs only"
fi

echo "$images"
