#!/usr/bin/env bash
# A real etcd + kube-apiserver on 127.0.0.1, for integration tests, `make dev` and benchmarks.
#
#   hack/control-plane.sh build   build both binaries from Go modules (once; cached by version)
#   hack/control-plane.sh built   exit 0 if both binaries are built (cached), else 1: whether start needs no build
#   hack/control-plane.sh start   build if needed, start both on free loopback ports, wait for /readyz
#   hack/control-plane.sh stop    stop both by their saved PIDs
#   hack/control-plane.sh env     print `export KUBECONFIG=...` for the running control plane
#   hack/control-plane.sh status  say whether it runs, and where
#   hack/control-plane.sh restart-apiserver   kill -9 of kube-apiserver, started again on the same port
#
# State (certificates, kubeconfig, logs, etcd data, PIDs) lives in $CONSISTD_CP_DIR, default
# target/control-plane. The apiserver's audit log (every request's metadata: user, verb, resource,
# namespace) is audit.log there, so tests can prove a request never reached the apiserver. Binaries are
# cached in $CONSISTD_CACHE (default ~/.cache/consistd).
#
# CONSISTD_CP_NODE=1 at start: for a node (hack/node.sh), admit pods as a cluster does (the ServiceAccount
# admission plugin: default ServiceAccount, automounted token), and call webhooks (the injector) at their
# Service's endpoints rather than its cluster IP, which nothing on the host routes (no kube-proxy). Off by default, because without the
# controller-manager that hack/node.sh runs no namespace has a `default` ServiceAccount and every pod
# would be refused. The serving certificate always names the `kubernetes` Service (10.96.0.1 and its DNS
# names) as well as 127.0.0.1, so pods can reach the apiserver through the Service IP.
#
# CONSISTD_CP_FEATURE_GATES at start: the apiserver's --feature-gates, default ShardedListAndWatch=true
# (KEP-5866, alpha in 1.37: list and watch a shard of a resource); empty for the defaults, as an apiserver
# without sharded watches (the daemon then filters a shard itself).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=versions.env
source "$repo/hack/versions.env"
cache=${CONSISTD_CACHE:-$HOME/.cache/consistd}
state=${CONSISTD_CP_DIR:-$repo/target/control-plane}
feature_gates=${CONSISTD_CP_FEATURE_GATES-ShardedListAndWatch=true}
apiserver_bin=$cache/kube-apiserver/$KUBERNETES_VERSION/kube-apiserver
etcd_bin=$cache/etcd/$ETCD_VERSION/etcd

log() { printf 'control-plane: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# Builds one Go binary from its wrapper module in hack/tools/NAME unless the cached one exists.
# Two builds at once (two test runs) must not corrupt the cache: build into a temp file, then rename.
build_tool() {
  local name=$1 pkg=$2 out=$3 ldflags=$4
  [ -x "$out" ] && return 0
  command -v go >/dev/null || die "go is not installed; it is needed to build $name"
  mkdir -p "$(dirname "$out")"
  log "building $name into $out (once; takes minutes on 2 cores)"
  local tmp
  tmp=$(mktemp "$out.XXXXXX")
  # -p 2: the machine has 2 cores; more parallel compiles only cost memory.
  (cd "$repo/hack/tools/$name" &&
    GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p 2 -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg") ||
    { rm -f "$tmp"; die "building $name failed"; }
  mv -f "$tmp" "$out"
}

cmd_build() {
  local v=${KUBERNETES_VERSION#v} vpkg=k8s.io/component-base/version
  local minor=${v#*.}
  minor=${minor%%.*}
  build_tool kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$apiserver_bin" \
    "-s -w -X $vpkg.gitVersion=$KUBERNETES_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
  build_tool etcd go.etcd.io/etcd/server/v3 "$etcd_bin" "-s -w"
}

free_port() { "$repo/hack/free-port.sh"; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

running() { pid_alive "$state/etcd.pid" && pid_alive "$state/apiserver.pid" && [ -f "$state/kubeconfig" ]; }

# Throwaway PKI: a CA, a serving certificate for 127.0.0.1/localhost and the `kubernetes` Service, an admin client certificate in
# system:masters, and the service-account signing key.
make_pki() {
  local pki=$state/pki
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=consistd-test-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout serving.key -out serving.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,%s\nextendedKeyUsage=serverAuth\n' \
      'DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local' >serving.ext
    openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
      -extfile serving.ext -out serving.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=consistd-admin" \
      -keyout admin.key -out admin.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >admin.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
      -extfile admin.ext -out admin.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

write_kubeconfig() {
  local server=$1 pki=$state/pki
  cat >"$state/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: consistd-local
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: consistd-admin
  user:
    client-certificate-data: $(base64 -w0 <"$pki/admin.crt")
    client-key-data: $(base64 -w0 <"$pki/admin.key")
contexts:
- name: consistd-local
  context:
    cluster: consistd-local
    user: consistd-admin
    namespace: default
current-context: consistd-local
EOF
}

show_logs() {
  for f in "$state"/etcd.log "$state"/apiserver.log; do
    [ -f "$f" ] && { log "last lines of $f:"; tail -n 40 "$f" >&2; }
  done
}

# start_apiserver: kube-apiserver on the port and etcd that $state/server and $state/etcd name.
start_apiserver() {
  local pki=$state/pki port etcd
  port=$(sed 's/.*://' "$state/server")
  etcd=$(cat "$state/etcd")
  local admission=(--disable-admission-plugins ServiceAccount)
  [ -f "$state/node-mode" ] && admission=(--enable-aggregator-routing=true)
  local gates=()
  [ -s "$state/feature-gates" ] && gates=(--feature-gates "$(cat "$state/feature-gates")")
  # podtemplates#0: no watch cache for PodTemplates, so their watches are served from etcd and a watch
  # resumed from a compacted revision gets 410 Gone (tests of the relist path use them).
  "$apiserver_bin" \
    --etcd-servers "$etcd" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
    --endpoint-reconciler-type none \
    --tls-cert-file "$pki/serving.crt" --tls-private-key-file "$pki/serving.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --authorization-mode RBAC \
    "${admission[@]}" "${gates[@]}" \
    --allow-privileged=true \
    --watch-cache-sizes podtemplates#0 \
    --audit-policy-file "$state/audit-policy.yaml" --audit-log-path "$state/audit.log" \
    --audit-log-maxsize 200 --audit-log-maxbackup 1 \
    --v 1 >>"$state/apiserver.log" 2>&1 &
  echo $! >"$state/apiserver.pid"
}

# wait_ready: until kube-apiserver answers /readyz (up to 120 s: a cold one on a busy 2-core machine takes
# a while to finish RBAC bootstrap); stops everything and dies if it does not.
wait_ready() {
  local pki=$state/pki server
  server=$(cat "$state/server")
  local deadline=$((SECONDS + 120))
  until curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "$server/readyz" >/dev/null 2>&1; do
    if ! pid_alive "$state/etcd.pid" || ! pid_alive "$state/apiserver.pid"; then
      show_logs
      cmd_stop >/dev/null 2>&1 || true
      die "a control-plane process exited during start"
    fi
    if [ $SECONDS -ge $deadline ]; then
      show_logs
      cmd_stop >/dev/null 2>&1 || true
      die "kube-apiserver was not ready within 120 s"
    fi
    sleep 0.5
  done
}

# restart-apiserver: kill -9 of kube-apiserver, started again on the same port with the same etcd (tests of
# what the daemon does while the apiserver is gone and after it is back).
cmd_restart_apiserver() {
  running || die "not running; start it with: hack/control-plane.sh start"
  local pid
  pid=$(cat "$state/apiserver.pid")
  kill -9 "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  start_apiserver
  wait_ready
  log "kube-apiserver restarted: $(cat "$state/server")"
}

cmd_start() {
  if running; then
    local running_gates
    running_gates=$(cat "$state/feature-gates" 2>/dev/null || true)
    [ "$running_gates" = "$feature_gates" ] ||
      die "already running with feature gates '$running_gates', not '$feature_gates': stop it, or give another CONSISTD_CP_DIR"
    log "already running (KUBECONFIG=$state/kubeconfig)"
    return 0
  fi
  cmd_stop >/dev/null 2>&1 || true
  cmd_build
  rm -rf "$state"
  mkdir -p "$state"
  printf '%s' "$feature_gates" >"$state/feature-gates"
  make_pki
  local etcd_client etcd_peer api_port
  etcd_client=$(free_port)
  etcd_peer=$(free_port)
  api_port=$(free_port)

  # --unsafe-no-fsync: test data only; fsync on every write makes a busy 2-core machine crawl.
  "$etcd_bin" --name consistd-test --data-dir "$state/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "consistd-test=http://127.0.0.1:$etcd_peer" \
    --unsafe-no-fsync --log-level warn >"$state/etcd.log" 2>&1 &
  echo $! >"$state/etcd.pid"

  cat >"$state/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
EOF

  if [ "${CONSISTD_CP_NODE:-0}" = 1 ]; then
    touch "$state/node-mode"
  fi
  local server="https://127.0.0.1:$api_port"
  echo "$server" >"$state/server"
  echo "http://127.0.0.1:$etcd_client" >"$state/etcd"
  start_apiserver
  write_kubeconfig "$server"
  wait_ready
  # What a cluster admin installs once, so guarded writes are fenced at the apiserver in every test. A
  # node-mode cluster is left without it: the README walkthrough that the node e2e runs installs it.
  if [ "${CONSISTD_CP_NODE:-0}" != 1 ]; then
    # Its discovery cache in the state dir, not ~/.kube/cache: the host is left as it was.
    KUBECONFIG=$state/kubeconfig KUBECACHEDIR=$state/kubectl-cache \
      "$("$repo/hack/tools.sh" kubectl)" apply -k "$repo/manifests/fencing" >/dev/null ||
      die "kubectl apply -k manifests/fencing failed"
  fi
  log "ready: $server (KUBECONFIG=$state/kubeconfig)"
}

stop_pid() {
  local f=$1
  [ -f "$f" ] || return 0
  local pid
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

cmd_stop() {
  stop_pid "$state/apiserver.pid"
  stop_pid "$state/etcd.pid"
  log "stopped"
}

cmd_env() {
  running || die "not running; start it with: hack/control-plane.sh start"
  echo "export KUBECONFIG=$state/kubeconfig"
}

cmd_built() {
  [ -x "$apiserver_bin" ] && [ -x "$etcd_bin" ]
}

cmd_status() {
  if running; then
    echo "running: $(cat "$state/server") KUBECONFIG=$state/kubeconfig"
  else
    echo "not running"
    return 1
  fi
}

case "${1:-}" in
build) cmd_build ;;
built) cmd_built ;;
start) cmd_start ;;
stop) cmd_stop ;;
env) cmd_env ;;
status) cmd_status ;;
restart-apiserver) cmd_restart_apiserver ;;
*)
  echo "usage: $0 build|built|start|stop|env|status|restart-apiserver" >&2
  exit 2
  ;;
esac
