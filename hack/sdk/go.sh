#!/usr/bin/env bash
# The Go SDK (client-sdk/go) and its example (examples/go):
#
#   hack/sdk/go.sh gen                                regenerate client-sdk/go/gen from proto/consistd/v1
#   hack/sdk/go.sh check                              fail if the committed generated code has drifted
#   hack/sdk/go.sh test                               go vet + go test against hack/with-daemons.sh's daemons
#   hack/sdk/go.sh example                            the Greeting operator end to end (hack/run-example.sh)
#   hack/sdk/go.sh conformance                        the SDK conformance suite (client-sdk/conformance) with
#                                                     the Go agent, under hack/with-control-plane.sh
#   hack/sdk/go.sh bench-subscriber NAMESPACE ROUNDS  one JSON line per round on stdout (RAW watch to SYNCED)
#   hack/sdk/go.sh bench-send [MESSAGES [RATE [WARMUP [RECEIVERS]]]]  Send -> ACKED latency at RATE/s
#                                                     (default 10000 at 1000/s after 2000 unmeasured, 16
#                                                     inbox handlers), one JSON line per phase, under
#                                                     hack/with-daemons.sh
#
# The code generators are pinned below and `go install`ed on first use into
# $CONSISTD_CACHE/go-plugins/<plugin>@<version> (default cache: $HOME/.cache/consistd); buf comes from
# hack/tools.sh. Binaries are built into target/sdk/go/bin, the conformance agent into
# target/conformance/go-agent.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
sdk=$repo/client-sdk/go
examples=$repo/examples/go
bin=$repo/target/sdk/go/bin
cache=${CONSISTD_CACHE:-$HOME/.cache/consistd}
# protoc-gen-go's version is google.golang.org/protobuf's, which go.mod requires at the same version.
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
# The toolchain installed here, never one downloaded because a go.mod asks for a newer one.
export GOTOOLCHAIN=local
# go.mod and go.sum are committed; a build must never rewrite them.
export GOFLAGS=-mod=readonly

log() { printf 'go-sdk: %s\n' "$*" >&2; }

# plugin NAME PACKAGE VERSION: installs one protoc plugin into the cache (once); prints its directory.
plugin() {
  local dir=$cache/go-plugins/$1@$3
  if [ ! -x "$dir/$1" ]; then
    log "installing $1 $3"
    GOBIN=$dir go install "$2@$3" >&2
  fi
  echo "$dir"
}

# generate OUT: writes the generated code for proto/consistd/v1 into OUT/gen.
generate() {
  local out=$1 buf go_dir grpc_dir
  buf=$("$repo/hack/tools.sh" buf)
  go_dir=$(plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION")
  grpc_dir=$(plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION")
  # Only consistd/v1: consistd/peer is the daemons' own protocol, not the app API.
  (cd "$repo/proto" && PATH=$go_dir:$grpc_dir:$PATH "$buf" generate --template "$sdk/buf.gen.yaml" \
    --path consistd/v1 --output "$out")
}

# build NAME DIR PACKAGE: compiles a main package of the module in DIR into $bin/NAME.
build() {
  mkdir -p "$bin"
  (cd "$2" && go build -o "$bin/$1" "$3")
}

case "${1:-}" in
gen)
  rm -rf "$sdk/gen"
  generate "$sdk"
  log "regenerated client-sdk/go/gen"
  ;;
check)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  if ! diff -r "$sdk/gen" "$tmp/gen" >"$tmp/diff"; then
    cat "$tmp/diff" >&2
    log "client-sdk/go/gen differs from what proto/consistd/v1 generates: run hack/sdk/go.sh gen and commit"
    exit 1
  fi
  log "client-sdk/go/gen is up to date"
  ;;
test)
  : "${CONSISTD_SOCKET:?run under hack/with-daemons.sh}"
  (cd "$sdk" && go vet ./... && go test -count=1 -timeout 110s ./...)
  (cd "$examples" && go vet ./...)
  ;;
example)
  build greeting-operator "$examples" ./greeting-operator
  "$repo/hack/run-example.sh" go "'$bin/greeting-operator' controller" "'$bin/greeting-operator' receive"
  ;;
bench-subscriber)
  namespace=${2:?usage: $0 bench-subscriber NAMESPACE ROUNDS} rounds=${3:?usage: $0 bench-subscriber NAMESPACE ROUNDS}
  build bench-subscriber "$sdk" ./internal/benchsubscriber >&2
  "$bin/bench-subscriber" "$namespace" "$rounds"
  ;;
bench-send)
  : "${CONSISTD_TEST_PEER_SOCKET:?run under hack/with-daemons.sh}"
  build bench-send "$sdk" ./internal/benchsend >&2
  "$bin/bench-send" "${@:2}"
  ;;
conformance)
  : "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
  agent=$repo/target/conformance/go-agent
  mkdir -p "$(dirname "$agent")"
  (cd "$sdk" && go build -o "$agent" ./cmd/conformance-agent)
  # The suite runs the agent with sh -c: quote the path.
  (cd "$repo" && CONSISTD_CONFORMANCE_AGENT="'$agent'" cargo test -p consistd-conformance --test conformance)
  ;;
*)
  echo "usage: $0 gen|check|test|example|conformance|bench-subscriber NAMESPACE ROUNDS|bench-send" >&2
  exit 2
  ;;
esac
