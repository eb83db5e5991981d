#!/usr/bin/env bash
# `make bench`, inside hack/with-control-plane.sh: consistd's benchmarks (the Kopf comparison among them), the SDKs'
# subscribers, then client-go's leader election and 64 informers on the same control plane, so the figures compare
# side by side in one run. Every benchmark also records its figures in target/bench/figures.jsonl;
# hack/bench/charts.py draws them into docs/bench/*.png (matplotlib from PyPI). The venv target/bench/venv holds matplotlib, the Kopf comparison's Kopf
# (hack/bench/kopf/requirements.txt), the Kopf Greeting operator's Kubernetes client (hack/bench/operator/kopf/requirements.txt)
# and the consistd Python SDK; it is made again when any of those lists changes. The Kopf
# comparison's Java sides run from one jar, target/bench/josdk/kopf-bench-java.jar (hack/bench/josdk: the Java Operator
# SDK and the consistd Java SDK, from Maven Central and client-sdk/java); it is built again when its sources, the Java
# SDK's or the protocol change.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
mkdir -p target/bench
export CONSISTD_BENCH_FIGURES=$repo/target/bench/figures.jsonl
: >"$CONSISTD_BENCH_FIGURES"

venv=$repo/target/bench/venv
want=$(cat hack/bench/kopf/requirements.txt hack/bench/operator/kopf/requirements.txt client-sdk/python/pyproject.toml |
  sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.consistd-bench" 2>/dev/null)" != "$want" ] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check matplotlib -r hack/bench/kopf/requirements.txt \
    -r hack/bench/operator/kopf/requirements.txt -e client-sdk/python >&2
  echo "$want" >"$venv/.consistd-bench"
fi
export CONSISTD_BENCH_PYTHON=$venv/bin/python

# The Kopf comparison's Java sides: the consistd Java SDK installed into the local Maven repository as hack/sdk/java.sh
# example installs it (built in a folder of its own, target/bench/sdk-java, so a concurrent SDK build in
# target/sdk/java is left alone), then the jar hack/bench/josdk shades it into.
jar=$repo/target/bench/josdk/kopf-bench-java.jar
want=$(find client-sdk/java/pom.xml client-sdk/java/src/main proto/consistd/v1 hack/bench/josdk -type f | LC_ALL=C sort |
  xargs sha256sum | sha256sum | cut -d' ' -f1)
if [ "$(cat "$jar.consistd-bench" 2>/dev/null)" != "$want" ] || [ ! -f "$jar" ]; then
  mvn -B -q --no-transfer-progress -f client-sdk/java/pom.xml install -Dmaven.test.skip=true \
    -Dsdk.out="$repo/target/bench/sdk-java" >&2
  mvn -B -q --no-transfer-progress -f hack/bench/josdk/pom.xml package >&2
  echo "$want" >"$jar.consistd-bench"
fi
export CONSISTD_BENCH_JOSDK_JAR=$jar

# The informers' children, built first: the memory bench runs client-go's informer beside the daemon.
(cd hack/bench/informers && GOTOOLCHAIN=local go build -o "$repo/target/bench/informers" . &&
  GOTOOLCHAIN=local go build -o "$repo/target/bench/informers-app" ./app)
export CONSISTD_BENCH_INFORMERS=$repo/target/bench/informers
# The Greeting operator side by side (daemon/benches/operator.rs): the controller-runtime operator, and the kube-rs one
# and the consistd Rust example in the release profile the bench is built in (it takes them from there).
(cd hack/bench/operator/controller-runtime &&
  GOTOOLCHAIN=local go build -o "$repo/target/bench/controller-runtime-greeting-operator" .)
export CONSISTD_BENCH_CONTROLLER_RUNTIME=$repo/target/bench/controller-runtime-greeting-operator
cargo build -q --release -p consistd-bench-kube-rs-operator -p consistd-example-greeting-operator
cargo bench -p consistd --bench watch --bench memory --bench leadership --bench outbox --bench rollout --bench scale --bench kopf --bench operator --bench reconcile --bench fencing --bench link --bench sharded --bench shard_watch
# The watch of a shard once more against an apiserver without sharded watches (KEP-5866's gate off), on a control
# plane of its own: the daemon applies the shard itself. The shard-watch charts set both apiservers side by side.
CONSISTD_CP_FEATURE_GATES= CONSISTD_CP_DIR=$repo/target/control-plane-no-shard-gate \
  hack/with-control-plane.sh cargo bench -p consistd --bench shard_watch
echo
cargo build -q --release -p consistd
CONSISTD_BIN=$repo/target/release/consistd cargo bench -p consistd-client --bench subscriber
echo
echo "client-go, same control plane, for comparison:"
(cd hack/bench/client-go-election && GOTOOLCHAIN=local go build -o "$repo/target/bench/client-go-election" .)
KUBECONFIG=$CONSISTD_TEST_KUBECONFIG "$repo/target/bench/client-go-election" 2>/dev/null
# Idle candidates at the sizes the scale bench runs consistd at, for the projection beside it.
for n in 25 100 250; do
  KUBECONFIG=$CONSISTD_TEST_KUBECONFIG "$repo/target/bench/client-go-election" idle "$n" 2>/dev/null
done
echo
echo "64 apps: a client-go informer in each, against one consistd shared by them:"
KUBECONFIG=$CONSISTD_TEST_KUBECONFIG CONSISTD_BIN=$repo/target/release/consistd "$repo/target/bench/informers" run 64

"$venv/bin/python" hack/bench/charts.py "$CONSISTD_BENCH_FIGURES" docs/bench
