#!/usr/bin/env bash
# `make images`: builds starsd/operator, starsd/draft and starsd/target with the Docker engine found here,
# tagged with the release tag and :dev, and with REGISTRY set, also as REGISTRY/starsd/NAME:TAG, which PUSH=1
# pushes. Usage: images/build.sh [operator] [draft] [target] (default: all three).
#
#   make images REGISTRY=registry.example.com/team PUSH=1     # build, tag and push the release's three images
#   DRY_RUN=1 REGISTRY=... PUSH=1 images/build.sh               # print the docker commands, run nothing
#
# * Tags: one set per release. The data-plane images' CUDA variant is the release (starsd/draft:0.1.0, what the
#   chart and GPU pools use; it runs on CPUs too); VARIANT=cpu builds the CPU-only variant, tagged 0.1.0-cpu.
#   The operator image has no variant. The chart's image.registry is the REGISTRY given here.
# * Dockerfiles: images/dataplane/Dockerfile for the draft and the target (the role is the build target:
#   --target draft|target), images/operator/Dockerfile for the operator.
# * Engine: the user's (DOCKER_HOST or the default socket), else a private dockerd (lib/common.sh).
#   BuildKit when the buildx plugin is installed, else Docker's classic builder (both work: no RUN --mount,
#   one root .dockerignore).
# * Base: PYTHON_IMAGE when given; else the Dockerfiles' public default when it can be pulled; else the
#   local one from `make base-image` (Debian packages).
# * Torch: VARIANT=cuda (default: the package index, as locked) or cpu (the CPU wheel index, TORCH_CPU_INDEX).
# * Cache: each image carries the hash of its inputs (context files, Dockerfile, base image, variant, role) as
#   the label io.starsd.inputs; an image whose inputs have not changed is not rebuilt. Below that, the
#   builder's own layer cache (in the private engine, under ~/.cache/starsd/docker) makes a rebuild after a
#   code change reuse the torch layer.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

IMAGE_TAG="${IMAGE_TAG:-0.1.0}"
VARIANT="${VARIANT:-cuda}"
REGISTRY="${REGISTRY:-}"
PUSH="${PUSH:-}"
DRY_RUN="${DRY_RUN:-}"
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

# check_settings: VARIANT, REGISTRY and PUSH make sense together (before anything is built).
check_settings() {
  [[ "$VARIANT" == cuda || "$VARIANT" == cpu ]] || idie "VARIANT must be cuda (the release) or cpu, not '$VARIANT'"
  [[ -z "$PUSH" || "$PUSH" == 1 ]] || idie "PUSH must be 1 or unset, not '$PUSH'"
  if [[ "$PUSH" == 1 && -z "$REGISTRY" ]]; then
    idie "PUSH=1 needs REGISTRY, the registry (and path) to push to, e.g. REGISTRY=registry.example.com/team"
  fi
  if [[ -n "$REGISTRY" && ! "$REGISTRY" =~ ^[a-z0-9]([a-z0-9.:_-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$ ]]; then
    idie "REGISTRY must be a registry host and path without a scheme or a trailing slash (registry.example.com/team), not '$REGISTRY'"
  fi
}

# image_tag NAME: the release tag of image NAME (the data-plane images' CPU variant: TAG-cpu).
image_tag() {
  if [[ "$1" != operator && "$VARIANT" == cpu ]]; then printf '%s-cpu' "$IMAGE_TAG"; else printf '%s' "$IMAGE_TAG"; fi
}

# dockerfile NAME: the Dockerfile that builds image NAME.
dockerfile() {
  if [[ "$1" == operator ]]; then printf '%s' "$REPO_ROOT/images/operator/Dockerfile"; else printf '%s' "$REPO_ROOT/images/dataplane/Dockerfile"; fi
}

# run COMMAND...: runs it, or with DRY_RUN=1 prints it (one line, shell-quoted) on stdout.
run() {
  if [[ -n "$DRY_RUN" ]]; then printf '%q ' "$@" | sed 's/ $//'; printf '\n'; else "$@"; fi
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

# build_one NAME BASE BUILDKIT: builds (or finds cached) starsd/NAME:TAG, tags it :dev and, with REGISTRY,
# REGISTRY/starsd/NAME:TAG.
build_one() {
  local name="$1" base="$2" buildkit="$3" df tag
  df="$(dockerfile "$name")"
  tag="$(image_tag "$name")"
  local ref="starsd/$name:$tag" key base_id="$base" args=(--build-arg "PYTHON_IMAGE=$base")
  local tags=(-t "$ref" -t "starsd/$name:dev")
  [[ -n "$REGISTRY" ]] && tags+=(-t "$REGISTRY/$ref")
  if [[ "$name" != operator ]]; then
    args+=(--target "$name" --build-arg "VARIANT=$VARIANT" --build-arg "TORCH_CPU_INDEX=$TORCH_CPU_INDEX")
  fi
  [[ -n "$DRY_RUN" ]] || base_id="$(docker image inspect -f '{{.Id}}' "$base")"
  key="$(inputs_hash "$(sha256sum <"$df")" "$name" "$base_id" "$VARIANT" "$TORCH_CPU_INDEX")"
  local cmd=(docker build -f "$df" "${args[@]}" --label "io.starsd.inputs=$key" "${tags[@]}" "$REPO_ROOT")
  if [[ -n "$DRY_RUN" ]]; then run "${cmd[@]}"; return; fi
  if [[ "$(docker image inspect -f '{{index .Config.Labels "io.starsd.inputs"}}' "$ref" 2>/dev/null)" == "$key" ]]; then
    docker tag "$ref" "starsd/$name:dev"
    [[ -z "$REGISTRY" ]] || docker tag "$ref" "$REGISTRY/$ref"
    ilog "$ref: cached (inputs $key), $(image_size "$ref")"
    return
  fi
  local start=$SECONDS logfile="$STARSD_CACHE/images/build-$name.log"
  ilog "$ref: building ($([[ $buildkit == 1 ]] && echo BuildKit || echo classic builder), base $base, inputs $key; a data-plane image takes about 10 min, follow it in $logfile)"
  mkdir -p "$(dirname "$logfile")"
  if ! DOCKER_BUILDKIT="$buildkit" nice -n 10 "${cmd[@]}" >"$logfile" 2>&1; then
    tail -n 40 "$logfile" >&2
    idie "building $ref failed (full log: $logfile)"
  fi
  ilog "$ref: built in $(( SECONDS - start ))s, $(image_size "$ref") (also tagged starsd/$name:dev${REGISTRY:+ and $REGISTRY/$ref})"
}

image_size() { docker image inspect -f '{{.Size}}' "$1" | numfmt --to=iec --suffix=B; }

main() {
  local names=("$@") base buildkit=0 n
  (( ${#names[@]} )) || names=(operator draft target)
  for n in "${names[@]}"; do
    [[ "$n" == operator || "$n" == draft || "$n" == target ]] || idie "no image '$n' (operator, draft or target)"
  done
  check_settings
  if [[ -n "$DRY_RUN" ]]; then
    base="${PYTHON_IMAGE:-$PUBLIC_PYTHON_IMAGE}"
  else
    use_engine
    buildkit_available && buildkit=1
    base="$(choose_base)"
  fi
  for n in "${names[@]}"; do build_one "$n" "$base" "$buildkit"; done
  # Pushed only once every image is built, so a failed build pushes nothing of the release.
  if [[ "$PUSH" == 1 ]]; then
    for n in "${names[@]}"; do
      run docker push "$REGISTRY/starsd/$n:$(image_tag "$n")"
      [[ -n "$DRY_RUN" ]] || ilog "pushed $REGISTRY/starsd/$n:$(image_tag "$n")"
    done
  fi
}

main "$@"
