# shellcheck shell=bash
# `cluster.sh build`: compiles etcd, the Kubernetes control plane, kubectl, kwok and helm from their Go
# modules (CGO_ENABLED=0) into the version-keyed cache. Components already in the cache are skipped, so a
# second build is a no-op. Sourced by cluster.sh after lib/common.sh.

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
BUILD_SRC="$STARSD_CACHE/src"

# run_logged LOG CMD...: runs CMD with its output in LOG, printing a heartbeat every 30 s so that a
# long compile is visibly alive. `go build -v` prints one line per package compiled: the heartbeat
# counts them.
run_logged() {
  local logfile="$1"; shift
  local start=$SECONDS last=$SECONDS
  nice -n 10 "$@" >"$logfile" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    if (( SECONDS - last >= 30 )) && kill -0 "$pid" 2>/dev/null; then
      last=$SECONDS
      log "  ... $(( SECONDS - start ))s, $(wc -l <"$logfile") packages/lines so far"
    fi
  done
  if ! wait "$pid"; then
    tail -n 40 "$logfile" >&2
    die "command failed: $* (full log: $logfile)"
  fi
}

# have BIN...: true when every named binary already exists and runs.
have() {
  local b
  for b in "$@"; do [[ -x "$b" ]] || return 1; done
}

# fresh_module DIR NAME: an empty wrapper Go module in DIR.
fresh_module() {
  rm -rf "$1" && mkdir -p "$1"
  (cd "$1" && go mod init "$2" >/dev/null 2>&1)
}

build_etcd() {
  if have "$ETCD_BIN/etcd"; then log "etcd $ETCD_VERSION: cached"; return; fi
  log "etcd $ETCD_VERSION: building"
  local dir="$BUILD_SRC/etcd-$ETCD_VERSION"
  fresh_module "$dir" starsd.local/etcd-build
  (cd "$dir" && run_logged "$dir/get.log" go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
  (cd "$dir" && run_logged "$dir/build.log" go build -v -trimpath -ldflags "-s -w" \
    -o "$dir/out/etcd" go.etcd.io/etcd/server/v3)
  mkdir -p "$ETCD_BIN" && mv "$dir/out/etcd" "$ETCD_BIN/etcd"
  log "etcd $ETCD_VERSION: done"
}

# k8s_replaces: `replace` lines pinning every staging module that k8s.io/kubernetes requires at v0.0.0
# (and replaces with a local path in its own go.mod) to the published v0.Y.Z of the same release.
k8s_replaces() {
  local gomod staging_version="v0.${K8S_VERSION#v1.}"
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "$gomod" ]] || die "could not download the go.mod of k8s.io/kubernetes@$K8S_VERSION"
  awk -v v="$staging_version" '
    /^replace \(/ { inblock = 1; next }
    inblock && /^\)/ { inblock = 0 }
    inblock && $2 == "=>" && $3 ~ /^\.\/staging\// { printf "replace %s => %s %s\n", $1, $1, v }
  ' "$gomod"
}

k8s_ldflags() {
  local major minor date pkg flags="-s -w"
  major="${K8S_VERSION#v}"; major="${major%%.*}"
  minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
  date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  printf '%s' "$flags"
}

K8S_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

build_k8s() {
  local bins=() c
  for c in "${K8S_COMMANDS[@]}"; do bins+=("$K8S_BIN/$c"); done
  if have "${bins[@]}"; then log "kubernetes $K8S_VERSION: cached"; return; fi
  local dir="$BUILD_SRC/k8s-$K8S_VERSION"
  fresh_module "$dir" starsd.local/k8s-build
  log "kubernetes $K8S_VERSION: generating the staging replace lines"
  k8s_replaces >>"$dir/go.mod"
  log "kubernetes $K8S_VERSION: $(grep -c '^replace' "$dir/go.mod") staging modules replaced; downloading modules"
  (cd "$dir" && run_logged "$dir/get.log" go get "k8s.io/kubernetes@$K8S_VERSION")
  local ldflags i=0
  ldflags="$(k8s_ldflags)"
  mkdir -p "$K8S_BIN"
  for c in "${K8S_COMMANDS[@]}"; do
    i=$((i + 1))
    if have "$K8S_BIN/$c"; then log "kubernetes: $c cached"; continue; fi
    log "kubernetes $K8S_VERSION: compiling $c ($i/${#K8S_COMMANDS[@]})"
    (cd "$dir" && run_logged "$dir/build-$c.log" go build -v -trimpath -ldflags "$ldflags" \
      -o "$dir/out/$c" "k8s.io/kubernetes/cmd/$c")
    mv "$dir/out/$c" "$K8S_BIN/$c"
  done
  log "kubernetes $K8S_VERSION: done"
}

build_kwok() {
  if have "$KWOK_BIN/kwok"; then log "kwok $KWOK_VERSION: cached"; return; fi
  log "kwok $KWOK_VERSION: building"
  local dir="$BUILD_SRC/kwok-$KWOK_VERSION"
  rm -rf "$dir" && mkdir -p "$dir"
  run_logged "$dir/build.log" env GOBIN="$dir/out" go install -v -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mkdir -p "$KWOK_BIN" && mv "$dir/out/kwok" "$KWOK_BIN/kwok"
  log "kwok $KWOK_VERSION: done"
}

build_helm() {
  if have "$HELM_BIN/helm"; then log "helm $HELM_VERSION: cached"; return; fi
  log "helm $HELM_VERSION: building"
  local dir="$BUILD_SRC/helm-$HELM_VERSION" minor="${K8S_VERSION#v1.}"
  minor="${minor%%.*}"
  rm -rf "$dir" && mkdir -p "$dir"
  run_logged "$dir/build.log" env GOBIN="$dir/out" go install -v -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mkdir -p "$HELM_BIN" && mv "$dir/out/helm" "$HELM_BIN/helm"
  log "helm $HELM_VERSION: done"
}

# build_all: everything `up` needs. Helm first: it is the smallest and the chart tests need it alone.
build_all() {
  command -v go >/dev/null || die "Go is required to build the test cluster (https://go.dev/dl)"
  local start=$SECONDS
  log "building into $STARSD_CACHE (cached per version; only missing components are built)"
  build_helm
  build_etcd
  build_kwok
  build_k8s
  log "build finished in $(( SECONDS - start ))s"
}
