#!/usr/bin/env bash
# `make bench`, inside hack/with-control-plane.sh: consistd's benchmarks, the SDKs' subscribers, then client-go's leader
# election on the same control plane, so the figures compare side by side in one run.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cargo bench -p consistd --bench watch --bench leadership --bench outbox --bench rollout --bench scale
echo
cargo build -q --release -p consistd
CONSISTD_BIN=$repo/target/release/consistd cargo bench -p consistd-client --bench subscriber
echo
echo "client-go, same control plane, for comparison:"
(cd hack/bench/client-go-election && GOTOOLCHAIN=local go build -o "$repo/target/bench/client-go-election" .)
KUBECONFIG=$CONSISTD_TEST_KUBECONFIG "$repo/target/bench/client-go-election" 2>/dev/null
KUBECONFIG=$CONSISTD_TEST_KUBECONFIG "$repo/target/bench/client-go-election" idle 100 2>/dev/null
