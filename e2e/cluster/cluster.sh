#!/usr/bin/env bash
# A real Kubernetes control plane for the e2e tests, without containers: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler built from their Go modules, kwok simulating the kubelets of
# fake GPU nodes. See e2e/README.md.
#
#   cluster.sh build        build every component into the cache (a no-op when cached)
#   cluster.sh build-helm   build only helm (what the chart tests need)
#   cluster.sh build-node   build the real node's kubelet, kube-proxy, CoreDNS and pause (REAL_NODE=1)
#   cluster.sh up           build if needed, start the cluster, write .cluster/kubeconfig
#   cluster.sh down         stop everything `up` started; safe to run at any time
#   cluster.sh status       show what is running
#   cluster.sh env          print shell exports (KUBECONFIG, PATH) for the running cluster
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib/common.sh
source "$here/lib/common.sh"
# shellcheck source=SCRIPTDIR/lib/build.sh
source "$here/lib/build.sh"
# shellcheck source=SCRIPTDIR/lib/node-build.sh
source "$here/lib/node-build.sh"

usage() { sed -n '6,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

case "${1:-}" in
  build) build_all ;;
  build-helm) build_helm; printf '%s\n' "$HELM_BIN/helm" ;;
  build-node) build_node ;;
  up|down|status|env)
    # shellcheck source=SCRIPTDIR/lib/run.sh
    source "$here/lib/run.sh"
    "cluster_$1" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
