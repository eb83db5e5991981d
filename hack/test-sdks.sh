#!/usr/bin/env bash
# Runs every SDK's tests and example against fresh daemons (hack/with-daemons.sh), then the conformance
# suite against its agent (client-sdk/conformance, which starts daemons of its own), one language and verb
# at a time, and reports each. Runs under hack/with-control-plane.sh (`make test` calls it).
#
#   hack/test-sdks.sh [LANG...]     default: rust python go typescript java
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
langs=("$@")
[ ${#langs[@]} -gt 0 ] || langs=(rust python go typescript java)
failed=()
for lang in "${langs[@]}"; do
  for verb in test example conformance; do
    # The Rust SDK's tests start their own daemons (testkit), and the conformance suite runs the Rust agent
    # by default: both ran with `cargo test --workspace`.
    case $lang/$verb in rust/test | rust/conformance) continue ;; esac
    run=("$repo/hack/with-daemons.sh" "$repo/hack/sdk/$lang.sh" "$verb")
    [ "$verb" = conformance ] && run=("$repo/hack/sdk/$lang.sh" conformance)
    start=$SECONDS
    if "${run[@]}"; then
      echo "sdk: $lang $verb passed in $((SECONDS - start)) s" >&2
    else
      echo "sdk: $lang $verb FAILED" >&2
      failed+=("$lang/$verb")
    fi
  done
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "sdk: failed: ${failed[*]}" >&2
  exit 1
fi
echo "sdk: every SDK's tests and example passed: ${langs[*]}" >&2
