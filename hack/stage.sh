#!/usr/bin/env bash
# Times one stage of `make test`: runs COMMAND..., then prints and records how long it took.
#
#   hack/stage.sh NAME COMMAND...   run it; its exit code is the command's
#   hack/stage.sh report            the stages recorded since the last `reset`, one line each, and their sum
#   hack/stage.sh reset             forget them
#
# Stages are recorded in $CONSISTD_STAGES (default target/stages.tsv) as NAME, seconds, ok|failed; stages run
# side by side record each their own time, so the sum can exceed the wall-clock time.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
file=${CONSISTD_STAGES:-$repo/target/stages.tsv}

case "${1:-}" in
report)
  [ -f "$file" ] || { echo "stages: none recorded"; exit 0; }
  awk -F'\t' '{ printf "stage %-22s %5d s  %s\n", $1, $2, $3; sum += $2 } END { printf "stages: %d s in all\n", sum }' "$file"
  ;;
reset)
  mkdir -p "$(dirname "$file")"
  : >"$file"
  ;;
'' | -*)
  echo "usage: $0 NAME COMMAND... | report | reset" >&2
  exit 2
  ;;
*)
  name=$1
  shift
  [ $# -gt 0 ] || { echo "stage $name: no command" >&2; exit 2; }
  mkdir -p "$(dirname "$file")"
  start=$SECONDS
  rc=0
  "$@" || rc=$?
  took=$((SECONDS - start))
  outcome=ok
  [ "$rc" = 0 ] || outcome=failed
  printf '%s\t%d\t%s\n' "$name" "$took" "$outcome" >>"$file"
  echo "stage $name: $took s, $outcome" >&2
  exit "$rc"
  ;;
esac
