#!/usr/bin/env bash
# Proves stock grpcurl (-plaintext -unix, server reflection, no -authority) can call consistd on its socket,
# and that a Send under its -H traceparent reaches the peer daemon's app with that trace (under with-daemons.sh).
#
#   hack/stock-clients/grpcurl/client.sh GRPCURL SOCKET_PATH
#
# One line per call on stdout, or "FAILED: <grpcurl's error>" on stderr; exits 1 if any call failed.
set -uo pipefail
grpcurl=${1:?usage: $0 GRPCURL SOCKET_PATH} socket=${2:?usage: $0 GRPCURL SOCKET_PATH}
label="grpcurl -unix $socket"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ok=true

# call NAME ARGS...: one unary call; its JSON answer is left in $out/answer.
call() {
  local name=$1
  shift
  if ! "$grpcurl" -plaintext -unix -max-time 30 "$@" >"$out/answer" 2>"$out/error"; then
    echo "$label: $name FAILED: $(tr '\n' ' ' <"$out/error")" >&2
    return 1
  fi
}

if call Health/Check "$socket" grpc.health.v1.Health/Check; then
  status=$(python3 -c 'import json, sys; print(json.load(sys.stdin).get("status", "UNKNOWN"))' <"$out/answer")
  if [ "$status" = SERVING ]; then
    echo "$label: Health/Check $status"
  else
    echo "$label: Health/Check FAILED: status $status, want SERVING" >&2
    ok=false
  fi
else
  ok=false
fi

if call ObjectsService/List -d '{"resource":"namespaces"}' "$socket" consistd.v1.ObjectsService/List; then
  # "N items (a, b)" from the JSON answer, or nothing when it lists none.
  items=$(python3 -c 'import json, sys
names = [o["name"] for o in json.load(sys.stdin).get("objects", [])]
joined = ", ".join(names)
print(f"{len(names)} items ({joined})" if names else "")' <"$out/answer")
  if [ -n "$items" ]; then
    echo "$label: ObjectsService/List $items"
  else
    echo "$label: ObjectsService/List FAILED: no namespaces listed" >&2
    ok=false
  fi
else
  ok=false
fi

# The stream: grpcurl prints each event as it arrives; read its output until SYNCED, then end grpcurl
# (SIGTERM), which cancels the call. -max-time bounds it if SYNCED never comes.
"$grpcurl" -plaintext -unix -max-time 30 -d '{"resource":"namespaces","mode":"DELIVERY_MODE_RAW"}' \
  "$socket" consistd.v1.WatchService/Subscribe >"$out/events" 2>"$out/error" &
pid=$!
synced=false
while kill -0 "$pid" 2>/dev/null; do
  if grep -q '"type": "EVENT_TYPE_SYNCED"' "$out/events"; then
    synced=true
    kill -TERM "$pid"
    break
  fi
  sleep 0.05
done
wait "$pid"
rc=$?
# grpcurl may have printed SYNCED and exited in the same instant.
grep -q '"type": "EVENT_TYPE_SYNCED"' "$out/events" && synced=true
if $synced; then
  # Top-level "type" lines (two spaces in) before the SYNCED one are the events before it.
  before=$(sed '/"type": "EVENT_TYPE_SYNCED"/q' "$out/events" | grep -c '^  "type": ')
  echo "$label: WatchService/Subscribe SYNCED after $((before - 1)) events, then cancelled"
else
  echo "$label: WatchService/Subscribe FAILED (exit $rc) after $(grep -c '^  "type": ' "$out/events") events" \
    "without SYNCED: $(tr '\n' ' ' <"$out/error")" >&2
  ok=false
fi

# An ACK-tracked send made under a W3C trace (grpcurl -H traceparent, as OpenTelemetry instrumentation sends
# it) reaches the peer's app with that traceparent. Needs hack/with-daemons.sh's peer daemon.
if [ -n "${CONSISTD_TEST_PEER_ADDRESS:-}" ] && [ -n "${CONSISTD_TEST_PEER_SOCKET:-}" ]; then
  traceparent="00-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')-00f067aa0ba902b7-01"
  resource="grpcurl-traced-$$"
  send=$(printf '{"destination":{"peer":"%s"},"resource_id":"%s","event_id":"1"}' "$CONSISTD_TEST_PEER_ADDRESS" "$resource")
  if call OutboxService/Send -H "traceparent: $traceparent" -d "$send" "$socket" consistd.v1.OutboxService/Send; then
    "$grpcurl" -plaintext -unix -max-time 30 "$CONSISTD_TEST_PEER_SOCKET" consistd.v1.InboxService/Receive \
      >"$out/inbox" 2>"$out/error" &
    pid=$!
    # The peer's inbox may hold other tests' messages: wait for this one.
    found=""
    while kill -0 "$pid" 2>/dev/null; do
      found=$(python3 - "$out/inbox" "$resource" <<'PY'
import json, sys
text, decoder, at = open(sys.argv[1]).read(), json.JSONDecoder(), 0
while True:
    start = text.find("{", at)
    if start < 0:
        break
    try:
        answer, at = decoder.raw_decode(text, start)
    except ValueError:
        break
    m = answer.get("message", {})
    if m.get("resourceId") == sys.argv[2]:
        print(m.get("messageId", ""), m.get("traceparent", ""))
        break
PY
      )
      [ -n "$found" ] && break
      sleep 0.05
    done
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    read -r message_id received <<<"$found"
    if [ "${received:-}" = "$traceparent" ]; then
      echo "$label: OutboxService/Send under traceparent $traceparent reached the peer's app with it"
      call InboxService/Ack -d "{\"message_id\":\"$message_id\"}" "$CONSISTD_TEST_PEER_SOCKET" \
        consistd.v1.InboxService/Ack || ok=false
    else
      echo "$label: OutboxService/Send FAILED: the peer's app got traceparent '${received:-<no message>}', want $traceparent" >&2
      ok=false
    fi
  else
    ok=false
  fi
fi

$ok
