#!/usr/bin/env bash
# Runs a command with the real control plane up: starts it unless it already runs, and stops it
# afterwards only if it was started here. The command sees CONSISTD_TEST_KUBECONFIG.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cp=$repo/hack/control-plane.sh
started=0
if ! "$cp" status >/dev/null 2>&1; then
  "$cp" start
  started=1
else
  # Already running: start only checks that it runs with the feature gates asked for.
  "$cp" start
fi
stop() { if [ "$started" = 1 ]; then "$cp" stop; fi; }
trap stop EXIT
kubeconfig=$("$cp" env | sed -n 's/^export KUBECONFIG=//p')
export CONSISTD_TEST_KUBECONFIG=$kubeconfig
"$@"
