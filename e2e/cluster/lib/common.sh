# shellcheck shell=bash
# shellcheck disable=SC2034  # the settings here are used by the scripts that source this file
# Shared settings for e2e/cluster/*.sh: pinned versions, cache and state paths, logging.
# Sourced, never run.

# Pinned component versions. Changing one changes the cache key, so the next build rebuilds it.
K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"

# Built binaries live outside the repository, one folder per component and version.
STARSD_CACHE="${STARSD_CACHE:-$HOME/.cache/starsd}"
K8S_BIN="$STARSD_CACHE/k8s-$K8S_VERSION/bin"
ETCD_BIN="$STARSD_CACHE/etcd-$ETCD_VERSION/bin"
KWOK_BIN="$STARSD_CACHE/kwok-$KWOK_VERSION/bin"
HELM_BIN="$STARSD_CACHE/helm-$HELM_VERSION/bin"

# The running cluster's state (certificates, kubeconfig, logs, pids) lives in the repository's .cluster/.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CLUSTER_DIR="${STARSD_CLUSTER_DIR:-$REPO_ROOT/.cluster}"

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
