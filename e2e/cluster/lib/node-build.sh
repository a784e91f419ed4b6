# shellcheck shell=bash
# `cluster.sh build-node`: what a real node needs beside the control plane, compiled from Go modules
# (CGO_ENABLED=0) into version-keyed cache folders: the kubelet and kube-proxy of the control plane's
# Kubernetes release, CoreDNS, and a pause binary for the pod sandboxes. Cached components are skipped.
# Sourced by cluster.sh after lib/common.sh and lib/build.sh.

COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"
NODE_K8S_BIN="$STARSD_CACHE/k8s-node-$K8S_VERSION/bin"
COREDNS_BIN="$STARSD_CACHE/coredns-$COREDNS_VERSION/bin"
PAUSE_DIR="$STARSD_CACHE/pause-$(sha256sum "$(dirname "${BASH_SOURCE[0]}")/../pause/main.go" | cut -c1-12)"
NODE_COMMANDS=(kubelet kube-proxy)

build_node_k8s() {
  local bins=() c
  for c in "${NODE_COMMANDS[@]}"; do bins+=("$NODE_K8S_BIN/$c"); done
  if have "${bins[@]}"; then log "kubelet, kube-proxy $K8S_VERSION: cached"; return; fi
  local dir="$BUILD_SRC/k8s-node-$K8S_VERSION" pkgs=()
  fresh_module "$dir" starsd.local/k8s-node-build
  k8s_replaces >>"$dir/go.mod"
  log "kubelet, kube-proxy $K8S_VERSION: downloading modules"
  (cd "$dir" && run_logged "$dir/get.log" go get "k8s.io/kubernetes@$K8S_VERSION")
  for c in "${NODE_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  log "kubelet, kube-proxy $K8S_VERSION: compiling (one build: they share most packages)"
  mkdir -p "$dir/out"
  (cd "$dir" && run_logged "$dir/build.log" go build -v -trimpath -ldflags "$(k8s_ldflags)" -o "$dir/out/" "${pkgs[@]}")
  mkdir -p "$NODE_K8S_BIN"
  for c in "${NODE_COMMANDS[@]}"; do mv "$dir/out/$c" "$NODE_K8S_BIN/$c"; done
  log "kubelet, kube-proxy $K8S_VERSION: done"
}

build_coredns() {
  if have "$COREDNS_BIN/coredns"; then log "coredns $COREDNS_VERSION: cached"; return; fi
  log "coredns $COREDNS_VERSION: building"
  local dir="$BUILD_SRC/coredns-$COREDNS_VERSION"
  rm -rf "$dir" && mkdir -p "$dir"
  run_logged "$dir/build.log" env GOBIN="$dir/out" go install -v -trimpath -ldflags "-s -w" \
    "github.com/coredns/coredns@$COREDNS_VERSION"
  mkdir -p "$COREDNS_BIN" && mv "$dir/out/coredns" "$COREDNS_BIN/coredns"
  log "coredns $COREDNS_VERSION: done"
}

build_pause() {
  if have "$PAUSE_DIR/pause"; then log "pause: cached"; return; fi
  local src
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../pause" && pwd)"
  mkdir -p "$PAUSE_DIR"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$PAUSE_DIR/pause" .)
  log "pause: built"
}

# build_node: everything `up` with REAL_NODE=1 adds to build_all. The small ones first.
build_node() {
  command -v go >/dev/null || die "Go is required to build the real node (https://go.dev/dl)"
  local start=$SECONDS
  build_pause
  build_coredns
  build_node_k8s
  log "node build finished in $(( SECONDS - start ))s"
}
