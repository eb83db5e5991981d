#!/usr/bin/env bash
# The Java SDK (client-sdk/java) and its example (examples/java):
#
#   hack/sdk/java.sh gen           nothing to commit: Maven generates the stubs from proto/consistd/v1 at build
#   hack/sdk/java.sh check         the stubs generated from proto/consistd/v1 compile with the SDK (javac -Xlint)
#   hack/sdk/java.sh test          its JUnit 5 tests (Maven Surefire) against hack/with-daemons.sh's daemons
#   hack/sdk/java.sh example       the Greeting operator end to end (hack/run-example.sh): installs the SDK into
#                                  the local Maven repository, packages examples/java into target/examples/java
#   hack/sdk/java.sh conformance   the SDK conformance suite (client-sdk/conformance) with the Java agent, under
#                                  hack/with-control-plane.sh
#   hack/sdk/java.sh bench-subscriber NAMESPACE ROUNDS  one JSON line per round on stdout (RAW watch to SYNCED)
#   hack/sdk/java.sh bench-send [MESSAGES [RATE [WARMUP [RECEIVERS]]]]  Send -> ACKED latency at RATE/s
#                                  (default 10000 at 1000/s after 2000 unmeasured, 16 inbox handlers), one JSON line
#                                  per phase, under hack/with-daemons.sh
#
# Maven and grpc-java come from Maven Central (protoc and protoc-gen-grpc-java too, as Maven artifacts);
# the build goes to target/sdk/java, the example's to target/examples/java.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
sdk=$repo/client-sdk/java
out=$repo/target/sdk/java

log() { printf 'java-sdk: %s\n' "$*" >&2; }
mvn_() { mvn -B -q --no-transfer-progress -f "$sdk/pom.xml" "$@"; }

case "${1:-}" in
gen)
  log "nothing to regenerate: the stubs are generated from proto/consistd/v1 by every build"
  ;;
check)
  # Fails when the SDK no longer compiles against what proto/consistd/v1 generates (a renamed field, a removed
  # message): the drift check of an SDK whose generated code is not committed.
  mvn_ test-compile
  log "client-sdk/java compiles against proto/consistd/v1"
  ;;
test)
  : "${CONSISTD_SOCKET:?run under hack/with-daemons.sh}"
  mvn_ test
  ;;
example)
  # Not the tests: they are test's to compile (into the same target/sdk/java), and the example needs the jar only.
  mvn_ install -Dmaven.test.skip=true
  mvn -B -q --no-transfer-progress -f "$repo/examples/java/pom.xml" package
  jar=$repo/target/examples/java/greeting-operator.jar
  "$repo/hack/run-example.sh" java "java -jar '$jar' controller" "java -jar '$jar' receive"
  ;;
conformance)
  : "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
  mvn_ test-compile dependency:build-classpath -Dmdep.outputFile="$out/classpath" -Dmdep.includeScope=test
  agent="java -cp '$out/classes:$out/test-classes:$(cat "$out/classpath")' io.consistd.client.conformance.Agent"
  (cd "$repo" && CONSISTD_CONFORMANCE_AGENT="$agent" cargo test -p consistd-conformance --test conformance ${CONSISTD_CONFORMANCE_TESTS:-})
  ;;
bench-subscriber)
  namespace=${2:?usage: $0 bench-subscriber NAMESPACE ROUNDS} rounds=${3:?usage: $0 bench-subscriber NAMESPACE ROUNDS}
  # stdout is the bench's: Maven's goes to stderr.
  mvn_ test-compile dependency:build-classpath -Dmdep.outputFile="$out/classpath" -Dmdep.includeScope=test >&2
  java -cp "$out/classes:$out/test-classes:$(cat "$out/classpath")" io.consistd.client.bench.BenchSubscriber \
    "$namespace" "$rounds"
  ;;
bench-send)
  : "${CONSISTD_TEST_PEER_SOCKET:?run under hack/with-daemons.sh}"
  mvn_ test-compile dependency:build-classpath -Dmdep.outputFile="$out/classpath" -Dmdep.includeScope=test >&2
  java -cp "$out/classes:$out/test-classes:$(cat "$out/classpath")" io.consistd.client.bench.BenchSend "${@:2}"
  ;;
*)
  echo "usage: $0 gen|check|test|example|conformance" >&2
  exit 2
  ;;
esac
