#!/usr/bin/env bash
# Calls the daemon with stock gRPC clients (libraries nobody here wrote, each with its default options and
# no authority override) over its Unix socket: Health/Check, ObjectsService/List of namespaces, and a
# WatchService/Subscribe to namespaces read until SYNCED and then cancelled. Reports each client and
# fails if any did, after running them all. Runs under hack/with-daemons.sh (daemon a's $CONSISTD_SOCKET):
#
#   hack/with-control-plane.sh hack/with-daemons.sh hack/stock-clients.sh [CLIENT...]
#
#   CLIENT: python  grpcio, targets unix:PATH and unix:///ABSOLUTE_PATH (the Python SDK's venv, target/sdk/python);
#                   also ReconcileService/Reconcile: a queue of namespaces, STARTED, a lease, DONE, the next lease
#           java    grpc-java from Maven Central: NettyChannelBuilder over epoll with a DomainSocketAddress,
#                   and Grpc.newChannelBuilder("unix:PATH")
#           go      grpc-go, grpc.NewClient("unix:PATH")
#           node    @grpc/grpc-js, unix:PATH
#           grpcurl grpcurl -plaintext -unix PATH (server reflection; hack/tools.sh installs it)
#           default: all of them
#
# The clients live in hack/stock-clients/<client>/. What they need is built into target/stock-clients/ and
# rebuilt only when their inputs change (mvn package, go build, npm ci); Maven's cache is ~/.m2.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
: "${CONSISTD_SOCKET:?run under hack/with-daemons.sh}"
src=$repo/hack/stock-clients
out=$repo/target/stock-clients
venv=${CONSISTD_PYTHON_VENV:-$repo/target/sdk/python}
export GOTOOLCHAIN=local
clients=("$@")
[ ${#clients[@]} -gt 0 ] || clients=(python java go node grpcurl)
for client in "${clients[@]}"; do
  case $client in
  python | java | go | node | grpcurl) ;;
  *)
    echo "usage: $0 [python|java|go|node|grpcurl ...]" >&2
    exit 2
    ;;
  esac
done
socket=$CONSISTD_SOCKET
abs_socket=$(realpath -ms "$socket")
mkdir -p "$out"

log() { printf 'stock-clients: %s\n' "$*" >&2; }

# fresh NAME FILE...: true when NAME was built from exactly these files' contents (the stamp
# $out/NAME.inputs holds their hash); otherwise records the hash to write after a build in $want.
fresh() {
  local stamp=$out/$1.inputs
  shift
  want=$(cd "$repo" && sha256sum "$@" | sha256sum | cut -d' ' -f1)
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]
}
built() { echo "$want" >"$out/$1.inputs"; }

# files DIR...: every file under the directories, sorted, relative to the repository.
files() { (cd "$repo" && find "$@" -type f -not -name '*.pyc' | LC_ALL=C sort); }

build_python() {
  # The Python SDK's venv has grpcio, grpcio-health-checking and the SDK (editable, so consistd.v1 imports).
  if ! "$venv/bin/python" -c 'import grpc, grpc_health.v1, consistd.v1' 2>/dev/null; then
    log "creating the Python SDK's venv"
    # `check` creates the venv first; whether the SDK's generated code drifted is test-sdks.sh's concern.
    "$repo/hack/sdk/python.sh" check >&2 || true
    "$venv/bin/python" -c 'import grpc, grpc_health.v1, consistd.v1' || return
  fi
}

build_java() {
  local -a inputs
  mapfile -t inputs < <(files hack/stock-clients/java proto/consistd/v1)
  fresh java "${inputs[@]}" && [ -f "$out/java/stock-client-java-0.jar" ] && return 0
  log "building the grpc-java client (mvn package)"
  # Maven 3.8 prints colour resets even with -B -q; only they are dropped.
  mvn -B -q --no-transfer-progress -f "$src/java/pom.xml" package 2>&1 | sed 's/\x1b\[0m//g' >&2 || return
  built java
}

build_go() {
  local -a inputs
  mapfile -t inputs < <(files hack/stock-clients/go client-sdk/go/gen)
  inputs+=(client-sdk/go/go.mod client-sdk/go/go.sum)
  fresh go "${inputs[@]}" && [ -x "$out/go/stock-client-go" ] && return 0
  log "building the grpc-go client (go build)"
  (cd "$src/go" && GOFLAGS=-mod=readonly go build -o "$out/go/stock-client-go" .) || return
  built go
}

build_node() {
  fresh node hack/stock-clients/node/package.json hack/stock-clients/node/package-lock.json &&
    [ -d "$out/node/node_modules/@grpc/grpc-js" ] && return 0
  log "installing the grpc-js client's packages (npm ci)"
  mkdir -p "$out/node"
  cp "$src/node/package.json" "$src/node/package-lock.json" "$out/node/" || return
  (cd "$out/node" && npm ci --no-audit --no-fund --loglevel=error --ignore-scripts >&2) || return
  built node
}

build_grpcurl() {
  grpcurl=$("$repo/hack/tools.sh" grpcurl)
}

passed=()
failed=()
# run NAME CMD...: runs one client (bounded, in case a call hangs past its own deadline) and reports it.
run() {
  local name=$1
  shift
  if timeout --kill-after=5 180 "$@"; then
    log "$name passed"
    passed+=("$name")
  else
    log "$name FAILED"
    failed+=("$name")
  fi
}

# build CLIENT NAME...: builds what CLIENT needs; when that fails, every one of its NAMEs failed. (The
# build_* functions run where `set -e` does not apply, so each step checks its own status.)
build() {
  local client=$1
  shift
  "build_$client" && return 0
  for name in "$@"; do
    log "$name FAILED (building the $client client failed)"
    failed+=("$name")
  done
  return 1
}

java_cp="$out/java/stock-client-java-0.jar:$out/java/lib/*"
for client in "${clients[@]}"; do
  case $client in
  python)
    build python "python-grpcio unix:PATH" "python-grpcio unix:///PATH" || continue
    run "python-grpcio unix:PATH" "$venv/bin/python" "$src/python/client.py" "unix:$socket"
    run "python-grpcio unix:///PATH" "$venv/bin/python" "$src/python/client.py" "unix://$abs_socket"
    ;;
  java)
    build java "grpc-java NettyChannelBuilder(DomainSocketAddress)" "grpc-java unix:PATH" || continue
    run "grpc-java NettyChannelBuilder(DomainSocketAddress)" java -cp "$java_cp" stock.StockClient netty-epoll "$socket"
    run "grpc-java unix:PATH" java -cp "$java_cp" stock.StockClient unix-target "$socket"
    ;;
  go)
    build go "grpc-go unix:PATH" || continue
    run "grpc-go unix:PATH" "$out/go/stock-client-go" "$socket"
    ;;
  node)
    build node "grpc-js unix:PATH" || continue
    run "grpc-js unix:PATH" env NODE_PATH="$out/node/node_modules" node "$src/node/client.js" "$socket"
    ;;
  grpcurl)
    build grpcurl "grpcurl -unix PATH" || continue
    run "grpcurl -unix PATH" "$src/grpcurl/client.sh" "$grpcurl" "$socket"
    ;;
  esac
done

if [ ${#failed[@]} -gt 0 ]; then
  log "${#passed[@]} passed, ${#failed[@]} failed: $(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')"
  exit 1
fi
log "${#passed[@]} passed, 0 failed: every stock client called the daemon"
