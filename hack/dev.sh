#!/usr/bin/env bash
# The local development loop behind `make dev`: the real control plane, a consistd daemon beside it,
# and proof that it works.
#
#   hack/dev.sh start   start both (if not running), then show `consistd status` and grpcurl calls
#   hack/dev.sh stop    stop the daemon and the control plane
#   hack/dev.sh check   start, check every answer, stop: what `make test` runs to keep `make dev` honest
#
# The daemon's sockets, message store and log live in $CONSISTD_DEV_DIR (default target/dev). It receives
# peer sends in plaintext on 127.0.0.1:$CONSISTD_DEV_PEER_PORT (default 7070), so the examples can notify it.
set -euo pipefail
shopt -s inherit_errexit
repo=$(cd "$(dirname "$0")/.." && pwd)
dev=${CONSISTD_DEV_DIR:-$repo/target/dev}
bin=${CONSISTD_BIN:-$repo/target/debug/consistd}
socket=$dev/consistd.sock
admin=$dev/admin.sock
peer_port=${CONSISTD_DEV_PEER_PORT:-7070}

log() { printf 'dev: %s\n' "$*" >&2; }

start() {
  [ -x "$bin" ] || { log "no $bin; run 'cargo build' (make dev does)"; exit 1; }
  "$repo/hack/control-plane.sh" start
  eval "$("$repo/hack/control-plane.sh" env)"
  mkdir -p "$dev"
  if [ -f "$dev/consistd.pid" ] && kill -0 "$(cat "$dev/consistd.pid")" 2>/dev/null; then
    log "consistd already running (pid $(cat "$dev/consistd.pid"))"
  else
    printf 'peer:\n  listen: "127.0.0.1:%s"\n  insecure: true\n' "$peer_port" >"$dev/consistd.yaml"
    KUBECONFIG=$KUBECONFIG "$bin" run --config "$dev/consistd.yaml" --socket "$socket" --admin-socket "$admin" \
      --store-dir "$dev/store" >"$dev/consistd.log" 2>&1 &
    echo $! >"$dev/consistd.pid"
    for _ in $(seq 1 100); do
      "$bin" status --admin-socket "$admin" >/dev/null 2>&1 && break
      kill -0 "$(cat "$dev/consistd.pid")" 2>/dev/null || { cat "$dev/consistd.log" >&2; log "consistd exited"; exit 1; }
      sleep 0.2
    done
  fi
  show
}

show() {
  local grpcurl
  grpcurl=$("$repo/hack/tools.sh" grpcurl)
  echo
  echo "\$ consistd status --admin-socket $admin"
  "$bin" status --admin-socket "$admin"
  echo
  echo "\$ grpcurl -unix -plaintext $socket list"
  "$grpcurl" -unix -plaintext "$socket" list
  echo
  echo "\$ grpcurl -unix -plaintext $socket grpc.health.v1.Health/Check"
  "$grpcurl" -unix -plaintext "$socket" grpc.health.v1.Health/Check
  echo
  echo "\$ grpcurl -unix -plaintext -d '{\"resource\":\"namespaces\"}' $socket consistd.v1.ObjectsService/List  (names only)"
  "$grpcurl" -unix -plaintext -d '{"resource":"namespaces"}' "$socket" consistd.v1.ObjectsService/List | grep '"name"'
  echo
  echo "consistd is running (pid $(cat "$dev/consistd.pid"), log $dev/consistd.log)."
  echo "Point apps at CONSISTD_SOCKET=$socket; it receives peer sends at 127.0.0.1:$peer_port."
  echo "Examples: examples/README.md. Stop everything with: make dev-stop"
}

stop() {
  if [ -f "$dev/consistd.pid" ]; then
    local pid
    pid=$(cat "$dev/consistd.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$dev/consistd.pid"
    log "consistd stopped"
  fi
  "$repo/hack/control-plane.sh" stop
}

check() {
  local out
  # Its own control plane and daemon, so a `make dev` session left running is not disturbed.
  export CONSISTD_CP_DIR=$repo/target/dev-check/control-plane
  dev=$repo/target/dev-check/daemon socket=$repo/target/dev-check/daemon/consistd.sock
  admin=$repo/target/dev-check/daemon/admin.sock
  peer_port=$("$repo/hack/free-port.sh")
  trap stop EXIT
  out=$(start)
  printf '%s\n' "$out"
  for want in "ready" "consistd.v1.WatchService" "consistd.v1.RolloutService" "grpc.health.v1.Health" '"status": "SERVING"' '"name": "default"'; do
    grep -qF "$want" <<<"$out" || { log "make dev output lacks: $want"; exit 1; }
  done
  log "make dev works: 1 passed, 0 failed"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
check) check ;;
*)
  echo "usage: $0 start|stop|check" >&2
  exit 2
  ;;
esac
