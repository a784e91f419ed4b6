#!/usr/bin/env bash
# `make images`: builds starsd/operator, starsd/draft and starsd/target with the Docker engine found here,
# tagged with the release tag and :dev. Usage: images/build.sh [operator] [draft] [target] (default: all).
#
# * Engine: the user's (DOCKER_HOST or the default socket), else a private dockerd (lib/common.sh).
#   BuildKit when the buildx plugin is installed, else Docker's classic builder (both work: no RUN --mount,
#   one root .dockerignore).
# * Base: PYTHON_IMAGE when given; else the Dockerfiles' public default when it can be pulled; else the
#   local one from `make base-image` (Debian packages).
# * Torch: VARIANT=cpu (CPU wheel index), cuda (the package index, as locked), or auto (default): cpu when
#   the CPU wheel index answers, else cuda, which runs on CPUs too.
# * Cache: each image carries the hash of its inputs (context files, Dockerfile, base image, variant) as the
#   label io.starsd.inputs; an image whose inputs have not changed is not rebuilt. Below that, the builder's
#   own layer cache (in the private engine, under ~/.cache/starsd/docker) makes a rebuild after a code change
#   reuse the torch layer.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

IMAGE_TAG="${IMAGE_TAG:-0.1.0}"
VARIANT="${VARIANT:-auto}"
PUBLIC_PYTHON_IMAGE="python:3.11.14-slim-bookworm"  # the Dockerfiles' default (ARG PYTHON_IMAGE)
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
# What the images copy (the root .dockerignore also lets the shipped models in, for examples/models/).
CONTEXT_PATHS=(requirements.lock pyproject.toml README.md starsd operator)

choose_base() {
  if [[ -n "${PYTHON_IMAGE:-}" ]]; then printf '%s' "$PYTHON_IMAGE"; return; fi
  if image_exists "$PUBLIC_PYTHON_IMAGE" || timeout 60 docker pull -q "$PUBLIC_PYTHON_IMAGE" >/dev/null 2>&1; then
    printf '%s' "$PUBLIC_PYTHON_IMAGE"; return
  fi
  ilog "cannot pull $PUBLIC_PYTHON_IMAGE: using the local base image $BASE_IMAGE (make base-image)"
  bash "$REPO_ROOT/images/base-image.sh"
  printf '%s' "$BASE_IMAGE"
}

choose_variant() {
  case "$VARIANT" in
    cpu|cuda) printf '%s' "$VARIANT" ;;
    auto)
      if curl -fsS --max-time 15 -o /dev/null "$TORCH_CPU_INDEX/torch/" 2>/dev/null; then
        printf cpu
      else
        ilog "the CPU wheel index ($TORCH_CPU_INDEX) cannot be reached: torch comes from the package index (VARIANT=cuda)"
        printf cuda
      fi ;;
    *) idie "VARIANT must be auto, cpu or cuda, not '$VARIANT'" ;;
  esac
}

# inputs_hash DOCKERFILE BASE_ID VARIANT: what the image is made of, as 16 hex digits.
inputs_hash() {
  {
    printf '%s\n' "$@"
    (cd "$REPO_ROOT" && find "${CONTEXT_PATHS[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
      | sort -z | xargs -0 sha256sum)
    sha256sum "$REPO_ROOT/.dockerignore"
  } | sha256sum | cut -c1-16
}

build_one() {
  local name="$1" base="$2" variant="$3" buildkit="$4" dockerfile="$REPO_ROOT/images/$1/Dockerfile"
  local tag="$IMAGE_TAG" args=(--build-arg "PYTHON_IMAGE=$base")
  if [[ "$name" != operator ]]; then
    args+=(--build-arg "VARIANT=$variant" --build-arg "TORCH_CPU_INDEX=$TORCH_CPU_INDEX")
    [[ "$variant" == cuda ]] && tag="$IMAGE_TAG-cuda"
  fi
  local ref="starsd/$name:$tag" key base_id
  base_id="$(docker image inspect -f '{{.Id}}' "$base")"
  key="$(inputs_hash "$(sha256sum <"$dockerfile")" "$base_id" "$variant" "$TORCH_CPU_INDEX")"
  if [[ "$(docker image inspect -f '{{index .Config.Labels "io.starsd.inputs"}}' "$ref" 2>/dev/null)" == "$key" ]]; then
    docker tag "$ref" "starsd/$name:dev"
    ilog "$ref: cached (inputs $key), $(image_size "$ref")"
    return
  fi
  ilog "$ref: building ($([[ $buildkit == 1 ]] && echo BuildKit || echo classic builder), base $base, inputs $key)"
  local start=$SECONDS logfile="$STARSD_CACHE/images/build-$name.log"
  mkdir -p "$(dirname "$logfile")"
  if ! DOCKER_BUILDKIT="$buildkit" nice -n 10 docker build -f "$dockerfile" "${args[@]}" \
      --label "io.starsd.inputs=$key" -t "$ref" -t "starsd/$name:dev" "$REPO_ROOT" >"$logfile" 2>&1; then
    tail -n 40 "$logfile" >&2
    idie "building $ref failed (full log: $logfile)"
  fi
  ilog "$ref: built in $(( SECONDS - start ))s, $(image_size "$ref") (also tagged starsd/$name:dev)"
}

image_size() { docker image inspect -f '{{.Size}}' "$1" | numfmt --to=iec --suffix=B; }

main() {
  local names=("$@") base variant buildkit=0 n
  (( ${#names[@]} )) || names=(operator draft target)
  for n in "${names[@]}"; do
    [[ -f "$REPO_ROOT/images/$n/Dockerfile" ]] || idie "no image '$n' (operator, draft or target)"
  done
  use_engine
  buildkit_available && buildkit=1
  base="$(choose_base)"
  variant="$(choose_variant)"
  for n in "${names[@]}"; do build_one "$n" "$base" "$variant" "$buildkit"; done
}

main "$@"
