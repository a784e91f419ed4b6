#!/usr/bin/env bash
# `make base-image`: a local Python base image from Debian's packages, for machines that cannot pull
# python:3.11-slim-bookworm (no registry access). debootstrap builds a minimal Debian root file system from
# the mirror apt already uses; a small Dockerfile adds python3 and python3-venv. Cached: the root file system
# tarball under ~/.cache/starsd/base/, the image in the engine (rebuilt only when its inputs change).
#
# This image is for building and testing here only: it trusts this machine's CA bundle (HTTPS here is
# re-signed by a local CA, so pip inside a build needs it). Release images use the public base.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

# apt_mirror: the first Debian mirror in apt's sources (deb822 or one-line format).
apt_mirror() {
  local m
  m="$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)"
  [[ -n "$m" ]] || m="$(sed -n 's/^deb \(http[^ ]*\/debian\)\/\{0,1\} .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -n1)"
  printf '%s' "${m:-http://deb.debian.org/debian}"
}

main() {
  command -v debootstrap >/dev/null || idie "debootstrap is required (Debian: apt-get install debootstrap)"
  [[ $(id -u) == 0 ]] || idie "debootstrap needs root"
  use_engine
  local mirror dockerfile="$REPO_ROOT/images/base/Dockerfile" ca=/etc/ssl/certs/ca-certificates.crt key
  mirror="$(apt_mirror)"
  key="$( { echo "$BASE_SUITE $mirror"; cat "$dockerfile" "$ca"; } | sha256sum | cut -c1-16)"
  if [[ "$(docker image inspect -f '{{index .Config.Labels "io.starsd.inputs"}}' "$BASE_IMAGE" 2>/dev/null)" == "$key" ]]; then
    ilog "base image $BASE_IMAGE: cached ($key)"; return
  fi
  local dir
  dir="$STARSD_CACHE/base/$BASE_SUITE-$(printf '%s' "$mirror" | sha256sum | cut -c1-12)"
  local tarball="$dir/rootfs.tar" start=$SECONDS
  if [[ ! -s "$tarball" ]]; then
    ilog "debootstrap $BASE_SUITE from $mirror (minbase; about 2 minutes)"
    rm -rf "$dir/rootfs" && mkdir -p "$dir"
    nice -n 10 debootstrap --variant=minbase "$BASE_SUITE" "$dir/rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1 \
      || { tail -n 30 "$dir/debootstrap.log" >&2; idie "debootstrap failed (log: $dir/debootstrap.log)"; }
    rm -rf "$dir/rootfs/var/cache/apt/archives/"*.deb "$dir/rootfs/var/lib/apt/lists/"*
    tar -C "$dir/rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$dir/rootfs"
  fi
  ilog "importing the root file system as starsd.local/debian:$BASE_SUITE"
  docker import "$tarball" "starsd.local/debian:$BASE_SUITE" >/dev/null
  local ctx="$dir/context"
  rm -rf "$ctx" && mkdir -p "$ctx" && cp "$ca" "$ctx/ca-certificates.crt"
  DOCKER_BUILDKIT=0 nice -n 10 docker build -q -f "$dockerfile" \
    --build-arg "DEBIAN_IMAGE=starsd.local/debian:$BASE_SUITE" --build-arg "MIRROR=$mirror" \
    --label "io.starsd.inputs=$key" -t "$BASE_IMAGE" "$ctx" >/dev/null
  ilog "base image $BASE_IMAGE: built in $(( SECONDS - start ))s ($(docker image inspect -f '{{.Size}}' "$BASE_IMAGE" | numfmt --to=iec))"
}

main "$@"
