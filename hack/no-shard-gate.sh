#!/usr/bin/env bash
# The watches of a shard against an apiserver without sharded watches (KEP-5866's ShardedListAndWatch gate off),
# on a control plane of its own: the daemon then applies the shard itself. `make test` runs it beside the
# integration suites (hack/integration.py --beside).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cargo=${CARGO:-cargo}
export CONSISTD_CP_FEATURE_GATES= CONSISTD_CP_DIR=$repo/target/control-plane-no-shard-gate
cd "$repo"
exec hack/with-control-plane.sh sh -c "$cargo test -p consistd --test shard_watch && $cargo test -p consistd --test sharded by_namespace"
