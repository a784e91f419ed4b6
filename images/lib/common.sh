# shellcheck shell=bash
# shellcheck disable=SC2034  # the settings here are used by the scripts that source this file
# Shared settings for images/*.sh: the cache, the image names, logging, and a Docker engine to talk to.
# Sourced, never run.

STARSD_CACHE="${STARSD_CACHE:-$HOME/.cache/starsd}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# The local base image (`make base-image`): Debian from its packages, for machines without registry access.
BASE_SUITE="${BASE_SUITE:-bookworm}"
BASE_IMAGE="${BASE_IMAGE:-starsd.local/python:3.11-$BASE_SUITE}"

# A private engine, started only when no engine answers: its data (the layer cache) stays under the cache.
PRIVATE_DOCKER_DIR="$STARSD_CACHE/docker"
PRIVATE_DOCKER_HOST="unix://$PRIVATE_DOCKER_DIR/docker.sock"

ilog() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
idie() { ilog "error: $*"; exit 1; }

# engine_answers: true when `docker` reaches a daemon (DOCKER_HOST as exported).
engine_answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# use_engine: exports DOCKER_HOST for a daemon that answers: the user's own (DOCKER_HOST or the default
# socket) when there is one, else a private dockerd started from Debian's docker.io (root only). Fails with
# what to install when neither is possible.
use_engine() {
  command -v docker >/dev/null || idie "no docker client: install a Docker engine (Debian: apt-get install docker.io)"
  if engine_answers; then return; fi
  export DOCKER_HOST="$PRIVATE_DOCKER_HOST"
  if engine_answers; then return; fi
  command -v dockerd >/dev/null \
    || idie "no Docker engine answers and dockerd is not installed (Debian: apt-get install docker.io)"
  [[ $(id -u) == 0 ]] || idie "no Docker engine answers; start one (a private dockerd needs root)"
  mkdir -p "$PRIVATE_DOCKER_DIR/data" "$PRIVATE_DOCKER_DIR/exec"
  ilog "starting a private dockerd (data in $PRIVATE_DOCKER_DIR, log in $PRIVATE_DOCKER_DIR/dockerd.log)"
  setsid dockerd --data-root "$PRIVATE_DOCKER_DIR/data" --exec-root "$PRIVATE_DOCKER_DIR/exec" \
    --pidfile "$PRIVATE_DOCKER_DIR/dockerd.pid" -H "$PRIVATE_DOCKER_HOST" \
    >"$PRIVATE_DOCKER_DIR/dockerd.log" 2>&1 </dev/null &
  local i
  for i in $(seq 60); do
    engine_answers && { ilog "dockerd ready"; return; }
    sleep 0.5
  done
  tail -n 20 "$PRIVATE_DOCKER_DIR/dockerd.log" >&2
  idie "dockerd did not answer within 30s (log: $PRIVATE_DOCKER_DIR/dockerd.log)"
}

# buildkit_available: true when `docker build` can use BuildKit (the buildx plugin is installed).
buildkit_available() { docker buildx version >/dev/null 2>&1; }

# image_exists REF: true when the engine holds REF.
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
