#!/usr/bin/env bash
# Runs a command with two consistd daemons beside the running control plane, for the SDK tests,
# examples and SDK benchmarks (the Rust tests start their own through testkit).
#
#   hack/with-daemons.sh CMD [ARGS...]
#
# Needs CONSISTD_TEST_KUBECONFIG (hack/with-control-plane.sh sets it). Daemon "a" is the app's
# sidecar; daemon "b" is a peer pod's sidecar that receives ACK-tracked sends (plaintext peer
# transport on loopback). The command sees:
#
#   CONSISTD_SOCKET               daemon a's app socket (what the SDKs connect to with no arguments)
#   CONSISTD_TEST_PEER_SOCKET     daemon b's app socket (its inbox is where sends to b arrive)
#   CONSISTD_TEST_PEER_ADDRESS    daemon b's peer address, host:port (a Destination.peer)
#   CONSISTD_TEST_ADMIN_SOCKET    daemon a's admin socket (/metrics, /debug/state, `consistd status`)
#   CONSISTD_TEST_PEER_ADMIN_SOCKET  daemon b's admin socket
#   CONSISTD_TEST_KUBECONFIG      the control plane (unchanged)
#   CONSISTD_BIN                  the consistd binary, for tests that start (and kill) their own daemon
#
# Daemon logs are kept in $CONSISTD_SDK_DIR (default target/sdk-test/<pid>) and printed on failure.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
: "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
export CONSISTD_BIN=${CONSISTD_BIN:-$repo/target/debug/consistd}
dir=${CONSISTD_SDK_DIR:-$repo/target/sdk-test/$$}
[ -x "$CONSISTD_BIN" ] || { echo "with-daemons: no $CONSISTD_BIN; run 'cargo build'" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"

free_port() { "$repo/hack/free-port.sh"; }

pids=()
# start NAME CONFIG: starts a daemon in $dir/NAME and waits until its socket answers health checks.
start() {
  local name=$1 config=$2 d=$dir/$1
  mkdir -p "$d"
  printf '%s\n' "$config" >"$d/consistd.yaml"
  KUBECONFIG=$CONSISTD_TEST_KUBECONFIG CONSISTD_LOG_LEVEL=${CONSISTD_LOG_LEVEL:-consistd=debug,info} \
    "$CONSISTD_BIN" run --config "$d/consistd.yaml" --socket "$d/consistd.sock" \
    --admin-socket "$d/admin.sock" --store-dir "$d/store" >"$d/consistd.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 150); do
    if "$CONSISTD_BIN" status --admin-socket "$d/admin.sock" >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.2
  done
  cat "$d/consistd.log" >&2
  echo "with-daemons: daemon $name did not become ready" >&2
  exit 1
}

stop() {
  local rc=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$rc" != 0 ]; then
    for log in "$dir"/*/consistd.log; do
      [ -f "$log" ] && { echo "--- last lines of $log" >&2; tail -n 40 "$log" >&2; }
    done
  fi
  exit "$rc"
}
trap stop EXIT

b_port=$(free_port)
start a "identity: sdk-a
peer:
  insecure: true
outbox:
  backoff:
    initial: 50ms
    cap: 1s"
start b "identity: sdk-b
peer:
  listen: \"127.0.0.1:$b_port\"
  insecure: true"

export CONSISTD_SOCKET=$dir/a/consistd.sock
export CONSISTD_TEST_PEER_SOCKET=$dir/b/consistd.sock
export CONSISTD_TEST_PEER_ADDRESS=127.0.0.1:$b_port
export CONSISTD_TEST_ADMIN_SOCKET=$dir/a/admin.sock
export CONSISTD_TEST_PEER_ADMIN_SOCKET=$dir/b/admin.sock
"$@"
