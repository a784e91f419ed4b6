# shellcheck shell=bash
# `cluster.sh up|down|status|env`: runs the control plane as local processes on free loopback ports.
# Everything lives in $CLUSTER_DIR: pki/, kubeconfigs, logs/, pids/, bin/ (kubectl, helm), ports.env.
# Sourced by cluster.sh after lib/common.sh and lib/build.sh.

here_lib="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/pki.sh
source "$here_lib/pki.sh"
# shellcheck source=SCRIPTDIR/node.sh
source "$here_lib/node.sh"

PIDS_DIR="$CLUSTER_DIR/pids"
LOGS_DIR="$CLUSTER_DIR/logs"
PKI_DIR="$CLUSTER_DIR/pki"
# Start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

# free_ports N: N distinct free TCP ports on 127.0.0.1, all held open until every one is chosen.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# start NAME BINARY ARGS...: starts BINARY in its own session (it outlives this shell), logs to
# logs/NAME.log, records its pid in pids/NAME.pid.
start() {
  local name="$1"; shift
  setsid "$@" >"$LOGS_DIR/$name.log" 2>&1 </dev/null &
  echo "$!" >"$PIDS_DIR/$name.pid"
  log "started $name (pid $!)"
}

# ours PID NAME: true when PID is alive and still runs the binary we started (pids get reused).
ours() {
  [[ -r "/proc/$1/cmdline" ]] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q -- "$2"
}

# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds; on timeout shows the logs and fails.
wait_for() {
  local what="$1" limit="$2" start=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - start > limit )); then
      local f
      for f in "$LOGS_DIR"/*.log; do log "--- last lines of $f"; tail -n 15 "$f" >&2; done
      die "$what not ready after ${limit}s"
    fi
    check_alive
    sleep 0.5
  done
  log "$what ready ($(( SECONDS - start ))s)"
}

# check_alive: fails as soon as a started component has exited, showing its log.
check_alive() {
  local f name
  for f in "$PIDS_DIR"/*.pid; do
    [[ -e "$f" ]] || continue
    name="$(basename "$f" .pid)"
    if ! kill -0 "$(cat "$f")" 2>/dev/null; then
      tail -n 30 "$LOGS_DIR/$name.log" >&2
      die "$name exited (log: $LOGS_DIR/$name.log)"
    fi
  done
}

https_ok() {  # https_ok URL: an authenticated GET as the admin.
  curl -fsS --max-time 5 --cacert "$PKI_DIR/ca.crt" --cert "$PKI_DIR/admin.crt" \
    --key "$PKI_DIR/admin.key" "$1"
}

cluster_up() {
  [[ -x "$K8S_BIN/kube-apiserver" && -x "$ETCD_BIN/etcd" && -x "$KWOK_BIN/kwok" && -x "$HELM_BIN/helm" ]] \
    || build_all
  cluster_down quiet  # leftovers of an interrupted run
  local start=$SECONDS
  rm -rf "$CLUSTER_DIR" && mkdir -p "$PIDS_DIR" "$LOGS_DIR" "$CLUSTER_DIR/bin" "$CLUSTER_DIR/etcd"
  trap 'log "up failed; stopping what was started"; cluster_down quiet' ERR

  make_pki "$PKI_DIR"
  # REAL_NODE=1: one real node beside the fakes (lib/node.sh); the apiserver then also listens on its address.
  local node_address="" api_node_flags=() authorization=RBAC
  if [[ "${REAL_NODE:-0}" == 1 ]]; then
    authorization=Node,RBAC  # the kubelet's own identity
    node_preflight
    node_address="$(node_ip)"
    node_pki "$PKI_DIR" "$node_address"
    mapfile -t api_node_flags < <(node_apiserver_flags "$PKI_DIR" "$node_address")
  fi
  local etcd_port etcd_peer api_port cm_port sched_port kwok_port
  read -r etcd_port etcd_peer api_port cm_port sched_port kwok_port <<<"$(free_ports 6)"
  local server="https://127.0.0.1:$api_port"
  printf 'API_PORT=%s\nETCD_PORT=%s\nSERVER=%s\n' "$api_port" "$etcd_port" "$server" \
    >"$CLUSTER_DIR/ports.env"
  local who
  for who in admin controller-manager scheduler kwok; do
    write_kubeconfig "$CLUSTER_DIR/$who.kubeconfig" "$server" "$PKI_DIR" "$who"
  done
  cp "$CLUSTER_DIR/admin.kubeconfig" "$CLUSTER_DIR/kubeconfig"
  ln -s "$K8S_BIN/kubectl" "$CLUSTER_DIR/bin/kubectl"
  ln -s "$HELM_BIN/helm" "$CLUSTER_DIR/bin/helm"

  start etcd "$ETCD_BIN/etcd" --data-dir="$CLUSTER_DIR/etcd" --unsafe-no-fsync \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer" \
    --initial-cluster="default=http://127.0.0.1:$etcd_peer" --log-level=warn
  wait_for etcd 30 curl -fsS "http://127.0.0.1:$etcd_port/health"

  start kube-apiserver "$K8S_BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --tls-cert-file="$PKI_DIR/apiserver.crt" --tls-private-key-file="$PKI_DIR/apiserver.key" \
    --client-ca-file="$PKI_DIR/ca.crt" --authorization-mode="$authorization" \
    --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI_DIR/sa.pub" --service-account-signing-key-file="$PKI_DIR/sa.key" \
    --enable-priority-and-fairness=false --profiling=false --cert-dir="$PKI_DIR/apiserver-generated" \
    "${api_node_flags[@]}"
  wait_for kube-apiserver 120 https_ok "$server/readyz"

  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port="$cm_port" \
    --service-account-private-key-file="$PKI_DIR/sa.key" --root-ca-file="$PKI_DIR/ca.crt" \
    --use-service-account-credentials=true --profiling=false --node-monitor-grace-period=120s
  start kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port="$sched_port" --profiling=false
  # kwok renews a Lease per fake node (every 10 s for a 40 s lease): the node lifecycle controller takes it as
  # the heartbeat. Without leases the nodes flap NotReady between kwok's status patches and their pods lose
  # Ready. The longer grace period tolerates a busy 2-core machine delaying a renewal.
  start kwok "$KWOK_BIN/kwok" --kubeconfig="$CLUSTER_DIR/kwok.kubeconfig" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --cidr=10.244.0.0/16 --node-ip=10.240.0.1 --server-address="127.0.0.1:$kwok_port" \
    --node-lease-duration-seconds=40
  wait_for kube-controller-manager 60 curl -fsSk "https://127.0.0.1:$cm_port/healthz"
  wait_for kube-scheduler 60 curl -fsSk "https://127.0.0.1:$sched_port/healthz"

  local kubectl=("$K8S_BIN/kubectl" --kubeconfig="$CLUSTER_DIR/kubeconfig")
  "${kubectl[@]}" apply -f "$here_lib/../nodes.yaml" >/dev/null
  wait_for "fake nodes" 60 "${kubectl[@]}" wait --for=condition=Ready node --all --timeout=1s
  wait_for "default service account" 60 "${kubectl[@]}" get serviceaccount default -n default
  [[ -z "$node_address" ]] || node_up "$server" "$node_address"
  trap - ERR
  cluster_env >"$CLUSTER_DIR/env"
  log "cluster up in $(( SECONDS - start ))s."
  up_notes >&2
}

# up_notes: what `up` tells its user last: how to reach the cluster, and that its nodes are fakes.
up_notes() {
  local dir="$CLUSTER_DIR"
  [[ "$dir" == "$REPO_ROOT/.cluster" ]] && dir=".cluster"
  cat <<EOF
  Use it from this shell (KUBECONFIG, and $dir/bin first on PATH for its kubectl and helm):
      source $dir/env                 # or: eval "\$(make -s cluster-env)"
  Its nodes are kwok's fakes: pods become Running and Ready without running anything. The operator
  Deployment the chart installs is such a pod, so nothing reconciles until you run the operator here:
      source $dir/env && .venv/bin/starsd operator
  (that is what the e2e tests do; the draft's load URL resolves only inside a real cluster, so the
  rebalancer reports LoadUnavailable unless the starsd.io/load-url annotation points at a draft you run).
EOF
}

# stop_pidfile FILE MARKER: stops the process recorded in FILE if it still runs MARKER (TERM, then KILL
# after 10 s), removes FILE; true when it stopped something.
stop_pidfile() {
  local file="$1" marker="$2" pid waited=0
  [[ -f "$file" ]] || return 1
  pid="$(cat "$file")"
  rm -f "$file"
  ours "$pid" "$marker" || return 1
  kill -TERM "$pid" 2>/dev/null || true
  while ours "$pid" "$marker" && (( waited < 100 )); do sleep 0.1; waited=$((waited + 1)); done
  if ours "$pid" "$marker"; then kill -KILL "$pid" 2>/dev/null || true; fi
}

# cluster_down [quiet]: stops what the tests started beside the cluster (pids/test-*.pid: the operator, a
# draft server), then every component in reverse start order, and removes the cluster state except logs/.
# Idempotent: safe after a failed or killed run.
cluster_down() {
  local i file stopped=0
  for file in "$PIDS_DIR"/test-*.pid; do
    if stop_pidfile "$file" starsd; then stopped=$((stopped + 1)); fi
  done
  node_down
  for (( i=${#COMPONENTS[@]}-1; i>=0; i-- )); do
    if stop_pidfile "$PIDS_DIR/${COMPONENTS[i]}.pid" "${COMPONENTS[i]}"; then stopped=$((stopped + 1)); fi
  done
  # Keep only the logs, for a look after a failed run.
  if [[ -d "$CLUSTER_DIR" ]]; then
    find "$CLUSTER_DIR" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
  fi
  [[ "${1:-}" == quiet ]] || log "cluster down ($stopped processes stopped; logs kept in $LOGS_DIR)"
}

cluster_status() {
  local name pid state
  for name in "${COMPONENTS[@]}" "${NODE_COMPONENTS[@]}"; do
    [[ -f "$PIDS_DIR/$name.pid" || " ${COMPONENTS[*]} " == *" $name "* ]] || continue
    pid="$(cat "$PIDS_DIR/$name.pid" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && ours "$pid" "$name"; then state="running (pid $pid)"; else state="stopped"; fi
    printf '%-24s %s\n' "$name" "$state"
  done
  if [[ -n "$(cat "$PIDS_DIR/kube-apiserver.pid" 2>/dev/null || true)" ]]; then
    "$K8S_BIN/kubectl" --kubeconfig="$CLUSTER_DIR/kubeconfig" get nodes -L starsd.io/pool 2>&1 || true
  fi
}

cluster_env() {
  [[ -f "$CLUSTER_DIR/kubeconfig" ]] || die "no cluster: run '$0 up' first"
  # shellcheck disable=SC2016  # $PATH is for the shell that evaluates this output
  printf 'export KUBECONFIG=%q\nexport PATH=%q:"$PATH"\n' "$CLUSTER_DIR/kubeconfig" "$CLUSTER_DIR/bin"
}
