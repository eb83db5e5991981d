// Sends with awaitable ACKs to a peer (daemon b), and b's inbox handler: ACK on return, NACK and redelivery on throw.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { AckOutcome, Client, type InboxMessage } from "@consistd/client";
import { env, unique, within } from "./helpers.js";

const clients: Client[] = [];
after(() => clients.forEach((c) => c.close()));

/** Serves b's inbox with `handler` for the messages about `resourceId` (others are ACKed) until `stop` aborts. */
function serveB(resourceId: string, stop: AbortSignal, handler: (m: InboxMessage) => void): Promise<void> {
  const b = new Client(env("CONSISTD_TEST_PEER_SOCKET"));
  clients.push(b);
  return b.inbox.serve((m) => (m.resourceId === resourceId ? handler(m) : undefined), { signal: stop, retryAfterMs: 100 });
}

test("a message sent to a peer reaches its inbox handler and the awaited ACK is ACKED", async () => {
  const a = new Client();
  clients.push(a);
  const resourceId = unique("ts-send");
  const stop = new AbortController();
  const received: InboxMessage[] = [];
  const serving = serveB(resourceId, stop.signal, (m) => void received.push(m));
  try {
    const sent = await a.send({
      to: { peer: env("CONSISTD_TEST_PEER_ADDRESS") },
      resourceId,
      eventId: "1",
      payload: { hello: "peer" },
    });
    assert.ok(sent.messageId);
    const outcome = await within(20_000, "the ACK", sent.ack);
    assert.equal(outcome.kind, AckOutcome.ACKED);
    assert.ok(outcome.isAcked);
    assert.equal(outcome.messageId, sent.messageId);
    assert.equal(received.length, 1);
    assert.equal(received[0].sender, "sdk-a");
    assert.equal(received[0].eventId, "1");
    assert.equal(received[0].contentType, "application/json");
    assert.deepEqual(JSON.parse(received[0].payload.toString()), { hello: "peer" });
  } finally {
    stop.abort();
    await serving;
  }
});

test("a handler that throws once (with a message longer than the daemon takes as a reason) gets the message again (attempt 2), and then it is ACKED", async () => {
  const a = new Client();
  clients.push(a);
  const resourceId = unique("ts-nack");
  const stop = new AbortController();
  const attempts: number[] = [];
  const serving = serveB(resourceId, stop.signal, (m) => {
    attempts.push(m.deliveryAttempt);
    // 3 bytes per character: the 4096-byte cut falls inside one, and the NACK must still be accepted.
    if (attempts.length === 1) throw new Error("not yet: " + "€".repeat(2000));
  });
  try {
    const sent = await a.send({ to: { peer: env("CONSISTD_TEST_PEER_ADDRESS") }, resourceId, eventId: "1", payload: "text" });
    const outcome = await within(20_000, "the ACK after a NACK", sent.ack);
    assert.equal(outcome.kindName, "ACKED");
    assert.deepEqual(attempts, [1, 2]);
  } finally {
    stop.abort();
    await serving;
  }
});
