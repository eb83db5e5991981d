#!/usr/bin/env bash
# Builds what the later stages of `make test` need in the background, at the lowest CPU and I/O priority,
# while the Rust tests run (they mostly wait on the apiserver and leave a core idle):
#
#   hack/prebuild.sh start   grpcurl, promtool and helm (hack/tools.sh); kubelet, kube-scheduler,
#                            kube-controller-manager and kubectl (hack/node.sh build); make e2e's images
#                            (hack/image.sh), in that order: the order the later stages need them
#   hack/prebuild.sh wait    wait for it to finish; fails, showing its log, if a build failed
#   hack/prebuild.sh stop    stop it and everything it started (idempotent), e.g. when a test failed first
#
# Every step only fills a cache the later stage would fill itself (all of them are safe to run twice at
# once), so with warm caches this costs seconds. The log is $CONSISTD_PREBUILD_DIR/log (default target/prebuild).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${CONSISTD_PREBUILD_DIR:-$repo/target/prebuild}

log() { printf 'prebuild: %s\n' "$*" >&2; }

# A killed child of a script that has exited stays a zombie until PID 1 reaps it: that is not alive.
live() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${st#Z}" = "$st" ]; }

run() {
  local start=$SECONDS t
  for t in grpcurl promtool helm; do "$repo/hack/tools.sh" "$t" >/dev/null; done
  "$repo/hack/node.sh" build
  "$repo/hack/image.sh" consistd example-python pause busybox >/dev/null
  log "done in $((SECONDS - start)) s"
}

case "${1:-}" in
start)
  "$0" stop
  mkdir -p "$dir"
  rm -f "$dir/rc"
  io=()
  command -v ionice >/dev/null && io=(ionice -c 3)
  # setsid: its own process group, so `stop` can end the go and cargo processes it started too.
  setsid "${io[@]}" nice -n 19 bash -c '"$0" run >"$1/log" 2>&1; echo $? >"$1/rc"' "$0" "$dir" </dev/null &
  echo $! >"$dir/pid"
  log "started (pid $!, log $dir/log)"
  ;;
run) run ;;
wait)
  [ -f "$dir/pid" ] || { log "not started"; exit 1; }
  pid=$(cat "$dir/pid")
  while [ ! -f "$dir/rc" ] && live "$pid"; do sleep 1; done
  rc=$(cat "$dir/rc" 2>/dev/null || echo killed)
  rm -f "$dir/pid"
  if [ "$rc" != 0 ]; then
    tail -n 40 "$dir/log" >&2 || true
    log "failed ($rc); its log is $dir/log"
    exit 1
  fi
  tail -n 1 "$dir/log" >&2
  ;;
stop)
  [ -f "$dir/pid" ] || exit 0
  pid=$(cat "$dir/pid")
  rm -f "$dir/pid"
  if live "$pid"; then
    kill -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do live "$pid" || break; sleep 0.2; done
    kill -9 -- "-$pid" 2>/dev/null || true
    log "stopped"
  fi
  ;;
*)
  echo "usage: $0 start|wait|stop" >&2
  exit 2
  ;;
esac
