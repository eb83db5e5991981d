#!/usr/bin/env bash
# The TypeScript SDK's verbs (client-sdk/typescript, package @consistd/client):
#
#   hack/sdk/typescript.sh gen                          regenerate src/gen/ from proto/consistd/v1 (ts-proto via buf)
#   hack/sdk/typescript.sh check                        fail if the committed src/gen/ differs from a fresh generation
#   hack/sdk/typescript.sh test                         build, then node's test runner against the daemons of hack/with-daemons.sh
#   hack/sdk/typescript.sh example                      run examples/typescript end to end (hack/run-example.sh)
#   hack/sdk/typescript.sh conformance                  the SDK conformance suite (client-sdk/conformance) with the
#                                                       agent conformance/agent.ts, under hack/with-control-plane.sh
#   hack/sdk/typescript.sh bench-subscriber NS ROUNDS   one JSON line per round: events until SYNCED, and the seconds it took
#
# Installs its tools on first use with `npm ci` into client-sdk/typescript/node_modules (ts-proto, tsc and
# @types/node pinned exactly in package.json; package-lock.json pins the rest). Only the bench's JSON lines go
# to stdout; everything else goes to stderr.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
sdk=$repo/client-sdk/typescript
bin=$sdk/node_modules/.bin

# install: npm ci when node_modules is missing or was installed from another package-lock.json.
install() {
  if ! cmp -s "$sdk/package-lock.json" "$sdk/node_modules/.consistd-installed-lock" 2>/dev/null; then
    echo "typescript: installing node modules (npm ci)" >&2
    (cd "$sdk" && npm ci --no-audit --no-fund --loglevel=error --ignore-scripts >&2)
    cp "$sdk/package-lock.json" "$sdk/node_modules/.consistd-installed-lock"
  fi
}

# generate DIR: ts-proto output for proto/consistd/v1 into DIR/src/gen.
generate() {
  local buf
  buf=$("$repo/hack/tools.sh" buf)
  (cd "$sdk" && "$buf" generate "$repo/proto" --template buf.gen.yaml --path "$repo/proto/consistd/v1" -o "$1")
}

# build: the package (dist/), then the tests, bench, conformance agent and example (build/).
build() {
  (cd "$sdk" && "$bin/tsc" -p tsconfig.json && "$bin/tsc" -p tsconfig.test.json &&
    "$bin/tsc" -p "$repo/examples/typescript/tsconfig.json")
}

verb=${1:-}
case "$verb" in
gen)
  install
  rm -rf "$sdk/src/gen"
  generate "$sdk"
  echo "typescript: regenerated client-sdk/typescript/src/gen" >&2
  ;;
check)
  install
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  if ! diff -r "$sdk/src/gen" "$tmp/src/gen" >&2; then
    echo "typescript: client-sdk/typescript/src/gen is out of date with proto/; run hack/sdk/typescript.sh gen" >&2
    exit 1
  fi
  echo "typescript: generated code is up to date" >&2
  ;;
test)
  : "${CONSISTD_SOCKET:?run under hack/with-daemons.sh}"
  install
  build
  cd "$sdk"
  node --test --test-timeout=60000 build/test/*.test.js
  ;;
example)
  : "${CONSISTD_SOCKET:?run under hack/with-daemons.sh}"
  install
  build
  run="node client-sdk/typescript/build/examples/greeting-operator.js"
  "$repo/hack/run-example.sh" typescript "$run controller" "$run receive"
  ;;
conformance)
  : "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
  install
  build >&2
  agent=$sdk/build/conformance/agent.js
  # The suite runs the agent with sh -c: quote the path.
  (cd "$repo" && CONSISTD_CONFORMANCE_AGENT="node '$agent'" cargo test -p consistd-conformance --test conformance >&2)
  ;;
bench-subscriber)
  ns=${2:?usage: $0 bench-subscriber NAMESPACE ROUNDS} rounds=${3:?usage: $0 bench-subscriber NAMESPACE ROUNDS}
  install
  build >&2
  node "$sdk/build/bench/subscriber.js" "$ns" "$rounds"
  ;;
*)
  echo "usage: $0 gen|check|test|example|conformance|bench-subscriber NAMESPACE ROUNDS" >&2
  exit 2
  ;;
esac
