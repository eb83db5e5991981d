#!/usr/bin/env bash
# Checks that Prometheus can scrape consistd: `promtool check metrics` (the Prometheus text format parses;
# names, types and help follow Prometheus' conventions) on both daemons' /metrics, after grpcurl calls that
# give the metric families samples: a Subscribe read until SYNCED, a Campaign until LEADER (its Lease seen live by
# a watch, a timed delivery), a Send from
# daemon a that daemon b's app receives and ACKs, and a reconcile queue opened and left. (Nothing is refused here, so consistd_api_calls_refused_total
# has no samples and prometheus-client leaves it out; it has the shape of consistd_api_calls_total.) A scrape
# with Prometheus' own Accept header must get OpenMetrics. Runs under hack/with-daemons.sh:
#
#   hack/with-control-plane.sh hack/with-daemons.sh hack/check-metrics.sh
#
# grpcurl and promtool come from hack/tools.sh. The scraped texts are left in $CONSISTD_METRICS_DIR
# (default target/check-metrics).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
: "${CONSISTD_TEST_ADMIN_SOCKET:?run under hack/with-daemons.sh}"
out=${CONSISTD_METRICS_DIR:-$repo/target/check-metrics}
rm -rf "$out"
mkdir -p "$out"
grpcurl=$("$repo/hack/tools.sh" grpcurl)
promtool=$("$repo/hack/tools.sh" promtool)
# What Prometheus 3 sends by default (scrape.acceptHeader over config.DefaultScrapeProtocols).
prometheus_accept='application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.7,application/openmetrics-text;version=0.0.1;q=0.6,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.3'

log() { printf 'check-metrics: %s\n' "$*" >&2; }
fail() {
  log "FAILED: $*"
  exit 1
}

# call SOCKET METHOD JSON: one unary call on consistd.v1; its JSON answer on stdout.
call() {
  "$grpcurl" -plaintext -unix -max-time 30 -d "$3" "$1" "consistd.v1.$2" 2>"$out/error" ||
    fail "$2: $(tr '\n' ' ' <"$out/error")"
}

# stream SOCKET METHOD JSON PATTERN: reads a stream of consistd.v1 until a line matches PATTERN, then cancels
# it (SIGTERM ends grpcurl); what it read is left in $out/stream.
stream() {
  "$grpcurl" -plaintext -unix -max-time 30 -d "$3" "$1" "consistd.v1.$2" >"$out/stream" 2>"$out/error" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null && ! grep -q "$4" "$out/stream"; do sleep 0.05; done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || true
  grep -q "$4" "$out/stream" || fail "$2 never answered $4: $(tr '\n' ' ' <"$out/error")"
}

# poll COMMAND...: runs COMMAND every 50 ms until it succeeds, for at most 15 s; its last status.
poll() {
  for _ in $(seq 1 300); do "$@" && return 0; sleep 0.05; done
  "$@"
}

# scrape ADMIN_SOCKET [CURL_ARGS...]: GETs /metrics; the body on stdout, the headers in $out/headers.
scrape() {
  local socket=$1
  shift
  curl -sS --fail --unix-socket "$socket" -D "$out/headers" "$@" http://localhost/metrics
}

# sample ADMIN_SOCKET NAME: the value of the unlabelled sample NAME, or nothing.
sample() { scrape "$1" | sed -n "s/^$2 //p"; }

a=$CONSISTD_SOCKET b=$CONSISTD_TEST_PEER_SOCKET
stream "$a" WatchService/Subscribe '{"resource":"namespaces","mode":"DELIVERY_MODE_RAW"}' EVENT_TYPE_SYNCED
# A watch of Leases that sees the campaign's Lease change live, after SYNCED: a timed watch delivery.
"$grpcurl" -plaintext -unix -max-time 30 -d '{"resource":"leases","namespace":"default","mode":"DELIVERY_MODE_RAW"}' \
  "$a" consistd.v1.WatchService/Subscribe >"$out/leases" 2>"$out/leases.error" &
leases=$!
live_lease() { awk '/EVENT_TYPE_SYNCED/ { synced = 1 } synced && /"check-metrics"/ { found = 1 } END { exit !found }' "$out/leases"; }
poll grep -q EVENT_TYPE_SYNCED "$out/leases" || true
# The campaign stays open until the scrapes are done, so the leader gauge has its sample.
"$grpcurl" -plaintext -unix -max-time 60 -d '{"election":"check-metrics","namespace":"default"}' \
  "$a" consistd.v1.LeadershipService/Campaign >"$out/campaign" 2>"$out/campaign.error" &
campaign=$!
trap 'kill -TERM "$campaign" 2>/dev/null || true' EXIT
poll grep -q LEADERSHIP_STATE_LEADER "$out/campaign" ||
  fail "Campaign never answered LEADERSHIP_STATE_LEADER: $(tr '\n' ' ' <"$out/campaign.error")"
seen=0
poll live_lease && seen=1
kill -TERM "$leases" 2>/dev/null || true
wait "$leases" || true
[ "$seen" = 1 ] || fail "the Lease watch never saw the campaign's Lease after SYNCED: $(tr '\n' ' ' <"$out/leases.error")"
payload=$(printf 'check-metrics' | base64)
call "$a" OutboxService/Send "{\"destination\":{\"peer\":\"$CONSISTD_TEST_PEER_ADDRESS\"},\"resourceId\":\"check-metrics\",\"eventId\":\"1\",\"payload\":\"$payload\",\"contentType\":\"text/plain\"}" >/dev/null
stream "$b" InboxService/Receive '{}' '"messageId"'
id=$(sed -n 's/.*"messageId": "\(.*\)".*/\1/p' "$out/stream" | head -n 1)
call "$b" InboxService/Ack "{\"messageId\":\"$id\"}" >/dev/null
for _ in $(seq 1 100); do
  [ "$(sample "$CONSISTD_TEST_ADMIN_SOCKET" consistd_outbox_acks_total)" = 1 ] && break
  sleep 0.1
done
[ "$(sample "$CONSISTD_TEST_ADMIN_SOCKET" consistd_outbox_acks_total)" = 1 ] ||
  fail "daemon a never counted b's ACK (consistd_outbox_acks_total)"
# A reconcile queue, so the workqueue families have samples (it lingers after the stream ends).
stream "$a" ReconcileService/Reconcile '{"spec":{"name":"check-metrics","primary":{"resource":"namespaces"},"maxLeases":1}}' '"started"'
# Read whole before grep: under pipefail, `scrape | grep -q` fails when grep stops at its match while curl
# still writes a scrape larger than the pipe's buffer.
grep -q '^consistd_workqueue_depth{name="check-metrics"}' <<<"$(scrape "$CONSISTD_TEST_ADMIN_SOCKET")" ||
  fail "daemon a shows no consistd_workqueue_depth for the queue check-metrics"

failed=0
for daemon in a b; do
  socket=$CONSISTD_TEST_ADMIN_SOCKET
  [ "$daemon" = b ] && socket=$CONSISTD_TEST_PEER_ADMIN_SOCKET
  # Plain GET, as curl and promtool's users do: the Prometheus text format.
  scrape "$socket" >"$out/$daemon.txt"
  families=$(grep -c '^# TYPE ' "$out/$daemon.txt" || true)
  samples=$(grep -vc '^#' "$out/$daemon.txt" || true)
  if "$promtool" check metrics <"$out/$daemon.txt" 2>"$out/$daemon.promtool"; then
    log "daemon $daemon: $families metric families, $samples samples: promtool check metrics found no problems"
  else
    log "daemon $daemon: promtool check metrics FAILED on $out/$daemon.txt:"
    sed 's/^/  /' "$out/$daemon.promtool" >&2
    failed=1
  fi
done

# Prometheus' own scrape asks for OpenMetrics first and gets it.
scrape "$CONSISTD_TEST_ADMIN_SOCKET" -H "Accept: $prometheus_accept" >"$out/a.openmetrics"
if ! grep -qi '^content-type: application/openmetrics-text; version=1.0.0' "$out/headers" ||
  [ "$(tail -n 1 "$out/a.openmetrics")" != "# EOF" ]; then
  log "FAILED: a scrape with Prometheus' Accept header did not get OpenMetrics: $(grep -i '^content-type' "$out/headers")"
  failed=1
fi
exit "$failed"
