#!/usr/bin/env bash
# The Rust SDK's verbs, like every other language's hack/sdk/<lang>.sh:
#
#   hack/sdk/rust.sh gen                           regenerate proto/src/gen (consistd-proto, which the SDK re-exports)
#   hack/sdk/rust.sh check                         fail if proto/src/gen drifted from the .proto files
#   hack/sdk/rust.sh test                          the SDK's tests (they start their own daemons through testkit)
#   hack/sdk/rust.sh example                       run examples/rust end to end (under hack/with-daemons.sh)
#   hack/sdk/rust.sh bench-subscriber NS ROUNDS    events/s of one subscriber (the Rust figure comes from
#                                                  client-sdk/rust/benches/subscriber.rs itself)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
cargo=${CARGO:-cargo}

case "${1:-}" in
gen) CONSISTD_REGENERATE=1 "$cargo" test -q -p consistd-proto --test codegen ;;
check) "$cargo" test -q -p consistd-proto --test codegen ;;
test) "$cargo" test -p consistd-client ;;
example)
  "$cargo" build -q -p consistd-example-greeting-operator
  bin=$repo/target/debug/greeting-operator
  "$repo/hack/run-example.sh" rust "$bin controller" "$bin receive"
  ;;
bench-subscriber)
  echo "rust: the Rust subscriber runs inside client-sdk/rust/benches/subscriber.rs" >&2
  exit 2
  ;;
*)
  sed -n '2,10p' "$0" >&2
  exit 2
  ;;
esac
