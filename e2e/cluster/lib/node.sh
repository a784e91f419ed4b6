# shellcheck shell=bash
# `make cluster-up REAL_NODE=1`: one real node beside kwok's fakes. Host processes, no systemd: containerd
# (Debian's, its CRI plugin), a sandbox image from the project's own pause binary, CNI (Debian's bridge,
# host-local and portmap plugins), the kubelet and kube-proxy of the control plane's release, and CoreDNS
# answering cluster DNS on the node's address. The project's images (make images), the data-plane ones with
# the shipped model pair baked in at /models by the users' recipe (examples/models/Dockerfile, tag
# dev-models), are imported into the node's containerd, whose store lives in the cache, so a warm `up`
# imports nothing. The node is labelled
# node.starsd.io/real=true and starsd.io/pool=real: a GPU-less pool of its own.
# One real node per machine: kube-proxy's iptables rules and DNS port 53 are machine-wide.
# Sourced by lib/run.sh.

NODE_DIR="$CLUSTER_DIR/node"
NODE_NAME="${REAL_NODE_NAME:-real-0}"
NODE_POD_CIDR="10.85.0.0/24"
NODE_BRIDGE="starsd0"
NODE_CONTAINERD_ROOT="$STARSD_CACHE/node-containerd"
NODE_IMAGES=(starsd/operator:dev starsd/draft:dev-models starsd/target:dev-models)
# Host processes in start order (pids/NAME.pid); node_down stops them in reverse.
NODE_COMPONENTS=(containerd coredns kube-proxy kubelet)

# node_ip: the address of the interface of the default route (the kubelet's --node-ip must not be loopback:
# pods reach the node's services there, traffic stays on this machine).
node_ip() {
  local dev ip
  dev="$(ip -4 route show default 2>/dev/null | awk '{print $5; exit}')"
  [[ -n "$dev" ]] && ip="$(ip -4 -o addr show dev "$dev" scope global | awk '{sub(/\/.*/, "", $4); print $4; exit}')"
  [[ -n "${ip:-}" ]] || die "no IPv4 address on a default route for the real node's --node-ip"
  printf '%s' "$ip"
}

# node_preflight: what the real node needs on the machine, with how to get it.
node_preflight() {
  [[ $(id -u) == 0 ]] || die "REAL_NODE=1 needs root (containerd, cgroups, iptables)"
  local missing=() cmd
  for cmd in containerd ctr runc iptables conntrack docker; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/firewall ]] || missing+=("CNI plugins")
  (( ${#missing[@]} == 0 )) || die "the real node needs ${missing[*]}: apt-get install -y docker.io containernetworking-plugins conntrack iptables"
}

# node_pki PKI_DIR NODE_IP: the apiserver's serving certificate also for NODE_IP (pods reach it through the
# kubernetes Service, routed to NODE_IP), and client identities for the kubelet, kube-proxy, CoreDNS and the
# apiserver's calls to the kubelet (logs, exec).
node_pki() {
  local d="$1" ip="$2" who
  sign_cert "$d" apiserver "/CN=kube-apiserver" \
    "subjectAltName=IP:127.0.0.1,IP:$ip,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
  for who in "kubelet:/CN=system:node:$NODE_NAME/O=system:nodes" \
             "kube-proxy:/CN=system:kube-proxy" \
             "coredns:/CN=starsd-coredns" \
             "apiserver-kubelet-client:/CN=kube-apiserver-kubelet-client/O=system:masters"; do
    new_key "$d/${who%%:*}.key"
    sign_cert "$d" "${who%%:*}" "${who#*:}" "extendedKeyUsage=clientAuth"
  done
}

# node_apiserver_flags PKI_DIR NODE_IP: what the apiserver adds for a real node (printed one per line; the
# Node authorizer comes with them, see cluster_up).
node_apiserver_flags() {
  printf '%s\n' --bind-address=0.0.0.0 --advertise-address="$2" \
    --kubelet-client-certificate="$1/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$1/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname
}

# node_pause_image: the sandbox image, from the project's pause binary, keyed by its hash.
node_pause_image() { printf 'starsd.local/pause:%s' "${PAUSE_DIR##*-}"; }

write_node_config() {
  local ip="$1" kubelet_port="$2" server="$3" dns_ready="$4"
  mkdir -p "$NODE_DIR/cni" "$NODE_DIR/containerd-state" "$NODE_CONTAINERD_ROOT"
  cat >"$NODE_DIR/containerd.toml" <<TOML
version = 2
root = "$NODE_CONTAINERD_ROOT"
state = "$NODE_DIR/containerd-state"
[grpc]
  address = "$NODE_DIR/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$(node_pause_image)"
  # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails ("can't get final child's PID").
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
TOML
  # firewall: accept the pods' traffic in FORWARD, whose policy a Docker engine on the machine sets to DROP
  # (with bridge netfilter on, even traffic between two pods on the bridge passes FORWARD).
  cat >"$NODE_DIR/cni/10-starsd.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "starsd", "plugins": [
  {"type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$NODE_POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$NODE_DIR/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "firewall"}
]}
JSON
  # Pods ask CoreDNS on the node's address; it needs no upstream (there is no outside network).
  printf 'nameserver %s\n' "$ip" >"$NODE_DIR/resolv.conf"
  cat >"$NODE_DIR/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$NODE_DIR/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
port: $kubelet_port
healthzPort: 0
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$PKI_DIR/ca.crt"}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: ["$ip"]
resolvConf: "$NODE_DIR/resolv.conf"
# The imported images cannot be pulled again: never garbage-collect them, never evict for a full disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
YAML
  # Cluster names from the API; every other name is NXDOMAIN at once (there is no upstream), so that resolvers
  # walking the pods' search list (a SERVFAIL would stop them) reach NAME.NAMESPACE.svc.cluster.local.
  cat >"$NODE_DIR/Corefile" <<COREFILE
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $ip
    errors
    ready 127.0.0.1:$dns_ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $CLUSTER_DIR/coredns.kubeconfig starsd-e2e
        pods insecure
    }
    cache 5
}
.:53 {
    bind $ip
    template ANY ANY {
        rcode NXDOMAIN
    }
}
COREFILE
  local who
  for who in kubelet kube-proxy coredns; do write_kubeconfig "$CLUSTER_DIR/$who.kubeconfig" "$server" "$PKI_DIR" "$who"; done
}

# node_ctr ARGS...: ctr against the node's containerd, in the CRI's namespace.
node_ctr() { ctr --address "$NODE_DIR/containerd.sock" --namespace k8s.io "$@"; }

# node_import_images: the pause image and the project's images into the node's containerd, skipped when the
# store already holds the same image ids (a stamp beside the store).
node_import_images() {
  local stamp="$NODE_CONTAINERD_ROOT/imported" ids want=() ref
  # shellcheck source=SCRIPTDIR/../../../images/lib/common.sh
  source "$REPO_ROOT/images/lib/common.sh"
  use_engine
  for ref in starsd/operator:dev starsd/draft:dev starsd/target:dev; do
    image_exists "$ref" || die "image $ref is missing: build the images first (make images)"
  done
  for ref in draft target; do  # a layer of 10 MB over the image, cached by the builder
    DOCKER_BUILDKIT=0 docker build -q -f "$REPO_ROOT/examples/models/Dockerfile" --build-arg "BASE=starsd/$ref:dev" \
      -t "starsd/$ref:dev-models" "$REPO_ROOT" >/dev/null 2>"$LOGS_DIR/models-image.log" \
      || { cat "$LOGS_DIR/models-image.log" >&2; die "building starsd/$ref:dev-models failed"; }
  done
  local pause
  pause="$(node_pause_image)"
  if ! image_exists "$pause"; then
    tar -C "$PAUSE_DIR" -c pause | docker import --change 'ENTRYPOINT ["/pause"]' - "$pause" >/dev/null
  fi
  want=("$pause" "${NODE_IMAGES[@]}")
  ids="$(for ref in "${want[@]}"; do printf '%s %s\n' "$ref" "$(docker image inspect -f '{{.Id}}' "$ref")"; done)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$ids" ]]; then
    log "real node: images cached in its containerd (${want[*]})"
    return
  fi
  local start=$SECONDS
  log "real node: importing ${want[*]} into its containerd (about a minute per GB)"
  docker save "${want[@]}" \
    | nice -n 10 ctr --address "$NODE_DIR/containerd.sock" --namespace k8s.io images import - \
      >"$LOGS_DIR/ctr-import.log" 2>&1 \
    || { tail -n 20 "$LOGS_DIR/ctr-import.log" >&2; die "importing the images into the node failed"; }
  # ctr also names each imported image by its digest; dropping those names lets containerd's garbage
  # collector free the images this import replaced (gigabytes each).
  local digest_names=()
  mapfile -t digest_names < <(node_ctr images list -q | grep '^sha256:' || true)
  (( ${#digest_names[@]} == 0 )) || node_ctr images remove "${digest_names[@]}" >/dev/null
  printf '%s\n' "$ids" >"$stamp"
  log "real node: images imported in $(( SECONDS - start ))s"
}

# node_up SERVER NODE_IP: starts the node's host services, imports the images, waits for the node Ready.
node_up() {
  local server="$1" ip="$2" kubelet_port proxy_metrics proxy_health dns_ready
  read -r kubelet_port proxy_metrics proxy_health dns_ready <<<"$(free_ports 4)"
  build_node
  write_node_config "$ip" "$kubelet_port" "$server" "$dns_ready"
  local kubectl=("$K8S_BIN/kubectl" --kubeconfig="$CLUSTER_DIR/kubeconfig")
  "${kubectl[@]}" apply -f "$REPO_ROOT/e2e/cluster/real-node.yaml" >/dev/null
  # Service traffic between pods on the one bridge must pass iptables (kube-proxy's DNAT).
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.ipv4.ip_forward=1 || die "cannot enable bridge netfilter"
  start containerd containerd --config "$NODE_DIR/containerd.toml"
  wait_for containerd 30 node_ctr version
  node_import_images
  start coredns "$COREDNS_BIN/coredns" -conf "$NODE_DIR/Corefile"
  start kube-proxy "$NODE_K8S_BIN/kube-proxy" --kubeconfig="$CLUSTER_DIR/kube-proxy.kubeconfig" \
    --hostname-override="$NODE_NAME" --proxy-mode=iptables --cluster-cidr="$NODE_POD_CIDR" \
    --conntrack-max-per-core=0 --metrics-bind-address="127.0.0.1:$proxy_metrics" \
    --healthz-bind-address="127.0.0.1:$proxy_health"
  start kubelet "$NODE_K8S_BIN/kubelet" --config="$NODE_DIR/kubelet.yaml" \
    --kubeconfig="$CLUSTER_DIR/kubelet.kubeconfig" --hostname-override="$NODE_NAME" --node-ip="$ip" \
    --root-dir="$NODE_DIR/kubelet" --cert-dir="$NODE_DIR/kubelet-pki" \
    --node-labels=node.starsd.io/real=true,starsd.io/pool=real
  wait_for "real node $NODE_NAME" 120 "${kubectl[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
  wait_for "cluster DNS" 60 curl -fsS "http://127.0.0.1:$dns_ready/ready"
}

# node_down: stops the node's pods (their containers outlive containerd otherwise), then its services;
# unmounts the kubelet's volumes and removes kube-proxy's rules and the pods' bridge. Safe when nothing runs.
node_down() {
  local i id mnt
  [[ -d "$NODE_DIR" ]] || return 0
  if [[ -S "$NODE_DIR/containerd.sock" ]]; then
    stop_pidfile "$PIDS_DIR/kubelet.pid" kubelet || true
    for id in $(node_ctr tasks list -q 2>/dev/null); do node_ctr tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 1
    for id in $(node_ctr tasks list -q 2>/dev/null); do node_ctr tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(node_ctr containers list -q 2>/dev/null); do node_ctr containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  for (( i=${#NODE_COMPONENTS[@]}-1; i>=0; i-- )); do
    stop_pidfile "$PIDS_DIR/${NODE_COMPONENTS[i]}.pid" "${NODE_COMPONENTS[i]}" || true
  done
  if [[ -d "$NODE_DIR" ]]; then
    findmnt -rn -o TARGET | grep -F "$NODE_DIR/" | sort -r | while read -r mnt; do umount -l "$mnt" || true; done
  fi
  [[ -x "$NODE_K8S_BIN/kube-proxy" ]] && "$NODE_K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  ip link delete "$NODE_BRIDGE" >/dev/null 2>&1 || true
  node_cni_cleanup
  for id in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$id" 2>/dev/null || true; done
}

# node_cni_cleanup: the iptables rules CNI left for pods that were killed without a CNI DEL (node_down kills
# them through ctr): the firewall plugin's chains, and the bridge plugin's masquerade rules of network starsd.
node_cni_cleanup() {
  local rule chain
  iptables -D FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD 2>/dev/null || true
  for chain in CNI-FORWARD CNI-ADMIN; do
    iptables -F "$chain" 2>/dev/null && iptables -X "$chain" 2>/dev/null || true
  done
  iptables -t nat -S POSTROUTING 2>/dev/null | grep -F 'name: \"starsd\"' | while read -r rule; do
    eval "iptables -t nat ${rule/#-A/-D}" 2>/dev/null || true
  done
  for chain in $(iptables -t nat -S 2>/dev/null | awk '/^-N CNI-[0-9a-f]+$/ {print $2}'); do
    iptables -t nat -F "$chain" 2>/dev/null && iptables -t nat -X "$chain" 2>/dev/null || true
  done
}
