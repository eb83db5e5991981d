#!/usr/bin/env bash
# Runs every SDK's tests and example against fresh daemons (hack/with-daemons.sh), one language and verb
# at a time, and reports each. Runs under hack/with-control-plane.sh (`make test` calls it).
#
#   hack/test-sdks.sh [LANG...]     default: rust python go typescript
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
langs=("$@")
[ ${#langs[@]} -gt 0 ] || langs=(rust python go typescript)
failed=()
for lang in "${langs[@]}"; do
  for verb in test example; do
    # The Rust SDK's tests start their own daemons (testkit) and ran with `cargo test --workspace`.
    [ "$lang/$verb" = rust/test ] && continue
    start=$SECONDS
    if "$repo/hack/with-daemons.sh" "$repo/hack/sdk/$lang.sh" "$verb"; then
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
