# shellcheck shell=bash
# Certificates and keys for the test cluster, made locally with openssl (ECDSA P-256: quick to generate).
# Sourced by lib/run.sh.

# new_key FILE
new_key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }

# make_pki DIR: a CA, the apiserver's serving certificate, client certificates for the admin and the
# control-plane components, and the service-account signing key pair.
make_pki() {
  local d="$1"
  mkdir -p "$d"
  new_key "$d/ca.key"
  openssl req -x509 -new -key "$d/ca.key" -sha256 -days 30 -subj "/CN=starsd-e2e-ca" \
    -out "$d/ca.crt" 2>/dev/null

  new_key "$d/apiserver.key"
  sign_cert "$d" apiserver "/CN=kube-apiserver" \
    "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"

  # Client identities: CN is the user, O the group. The control-plane users have built-in RBAC roles.
  local who
  for who in "admin:/CN=starsd-admin/O=system:masters" \
             "controller-manager:/CN=system:kube-controller-manager" \
             "scheduler:/CN=system:kube-scheduler" \
             "kwok:/CN=starsd-kwok/O=system:masters"; do
    new_key "$d/${who%%:*}.key"
    sign_cert "$d" "${who%%:*}" "${who#*:}" "extendedKeyUsage=clientAuth"
  done

  new_key "$d/sa.key"
  openssl ec -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

# sign_cert DIR NAME SUBJECT EXTENSIONS: DIR/NAME.crt for DIR/NAME.key, signed by DIR/ca.
sign_cert() {
  local d="$1" name="$2" subj="$3" ext="$4"
  openssl req -new -key "$d/$name.key" -subj "$subj" -out "$d/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" >"$d/$name.ext"
  openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 30 -sha256 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
  rm -f "$d/$name.csr" "$d/$name.ext"
}

# write_kubeconfig FILE SERVER PKI_DIR USER: a kubeconfig that authenticates with PKI_DIR/USER.{crt,key}.
write_kubeconfig() {
  local file="$1" server="$2" pki="$3" user="$4"
  cat >"$file" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
  - name: starsd-e2e
    cluster:
      server: $server
      certificate-authority: $pki/ca.crt
users:
  - name: $user
    user:
      client-certificate: $pki/$user.crt
      client-key: $pki/$user.key
contexts:
  - name: starsd-e2e
    context: {cluster: starsd-e2e, user: $user}
current-context: starsd-e2e
KUBECONFIG
}
