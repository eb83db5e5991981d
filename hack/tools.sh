#!/usr/bin/env bash
# Installs the command-line tools the Makefile uses, from package registries, into caches:
#   hack/tools.sh buf       buf (proto lint), from npm, into hack/tools/node/node_modules
#   hack/tools.sh grpcurl   grpcurl, from the Go module proxy, into $CONSISTD_CACHE/bin
# Prints the tool's path on stdout.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${CONSISTD_CACHE:-$HOME/.cache/consistd}
# v1.9.4: v1.9.3 ignores -unix and dials TCP.
GRPCURL_VERSION=v1.9.4

case "${1:-}" in
buf)
  bin=$repo/hack/tools/node/node_modules/.bin/buf
  if [ ! -x "$bin" ]; then
    echo "tools: installing buf from npm" >&2
    # Not `npm ci`: npm 11's lock omits other platforms' optional packages of @bufbuild/buf and then
    # refuses the lock as out of sync. The version is pinned exactly in package.json.
    (cd "$repo/hack/tools/node" && npm install --no-audit --no-fund --no-save --loglevel=error >&2)
  fi
  echo "$bin"
  ;;
grpcurl)
  dir=$cache/grpcurl/$GRPCURL_VERSION
  if [ ! -x "$dir/grpcurl" ]; then
    echo "tools: building grpcurl $GRPCURL_VERSION" >&2
    GOTOOLCHAIN=local GOBIN=$dir go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION" >&2
  fi
  echo "$dir/grpcurl"
  ;;
*)
  echo "usage: $0 buf|grpcurl" >&2
  exit 2
  ;;
esac
