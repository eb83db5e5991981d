#!/usr/bin/env bash
# The Java SDK (client-sdk/java):
#
#   hack/sdk/java.sh gen           nothing to commit: Maven generates the stubs from proto/consistd/v1 at build
#   hack/sdk/java.sh check         the stubs generated from proto/consistd/v1 compile with the SDK (javac -Xlint)
#   hack/sdk/java.sh test          its JUnit 5 tests (Maven Surefire) against hack/with-daemons.sh's daemons
#   hack/sdk/java.sh conformance   the SDK conformance suite (client-sdk/conformance) with the Java agent, under
#                                  hack/with-control-plane.sh
#
# Maven and grpc-java come from Maven Central (protoc and protoc-gen-grpc-java too, as Maven artifacts);
# the build goes to target/sdk/java.
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
conformance)
  : "${CONSISTD_TEST_KUBECONFIG:?run under hack/with-control-plane.sh}"
  mvn_ test-compile dependency:build-classpath -Dmdep.outputFile="$out/classpath" -Dmdep.includeScope=test
  agent="java -cp '$out/classes:$out/test-classes:$(cat "$out/classpath")' io.consistd.client.conformance.Agent"
  (cd "$repo" && CONSISTD_CONFORMANCE_AGENT="$agent" cargo test -p consistd-conformance --test conformance ${CONSISTD_CONFORMANCE_TESTS:-})
  ;;
*)
  echo "usage: $0 gen|check|test|conformance" >&2
  exit 2
  ;;
esac
