// Sends with awaitable outcomes to a peer (daemon b), b's inbox handler (ACK on return, NACK and redelivery on
// throw), and the OpenTelemetry trace context and guard the messages carry. One file: tests of a file run one after
// another, files side by side, and b's inbox hands each message to any one of its receivers.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Metadata, status } from "@grpc/grpc-js";
import {
  AckOutcome,
  Client,
  ConsistdError,
  type Guard,
  type InboxMessage,
  type Message,
  proto,
  type Sent,
} from "@consistd/client";
import { context, ROOT_CONTEXT, type SpanContext, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { callsStarted, env, OwnDaemon, Proxy, unique, until, within } from "./helpers.js";

const clients: Client[] = [];
after(() => clients.forEach((c) => c.close()));

// The spans of this process (the SDK's and the tests' own) end up here: what an app installing the SDK would do.
const spans = new InMemorySpanExporter();
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }));
const tracer = trace.getTracer("test");

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

/** A message to b about `resourceId`. */
function toB(resourceId: string): Message {
  return { to: { peer: env("CONSISTD_TEST_PEER_ADDRESS") }, resourceId, eventId: "1", payload: {} };
}

/** Resolves once `sent` is ACKED. */
async function acked(sent: Sent): Promise<void> {
  assert.equal((await within(20_000, "the ACK", sent.ack)).kindName, "ACKED");
}

/** The CONSUMER spans of message `messageId` once `count` have ended, in the order they ended. */
async function consumerSpans(messageId: string, count: number): Promise<ReadableSpan[]> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const found = spans
      .getFinishedSpans()
      .filter((s) => s.kind === SpanKind.CONSUMER && s.attributes["messaging.message.id"] === messageId);
    if (found.length >= count) return found;
    assert.ok(Date.now() < deadline, `${found.length} of ${count} consumer spans of message ${messageId}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test("a handler runs in a CONSUMER span under the sender's span, and a throw marks it failed", async () => {
  const a = new Client();
  clients.push(a);
  const resourceId = unique("ts-traced");
  const stop = new AbortController();
  const seen: { message: InboxMessage; active?: SpanContext }[] = [];
  const serving = serveB(resourceId, stop.signal, (message) => {
    seen.push({ message, active: trace.getActiveSpan()?.spanContext() });
    if (message.deliveryAttempt === 1) throw new Error("not yet");
  });
  try {
    const producer = tracer.startSpan("producer");
    const { traceId, spanId } = producer.spanContext();
    // No explicit context: send reads the active one.
    const sent = await context.with(trace.setSpan(context.active(), producer), () => a.send(toB(resourceId)));
    producer.end();
    await acked(sent);

    assert.deepEqual(
      seen.map((s) => s.message.deliveryAttempt),
      [1, 2],
      "the failed first attempt is redelivered",
    );
    for (const { message } of seen) {
      assert.equal(message.traceparent, `00-${traceId}-${spanId}-01`, "the message carries the sender's span");
      assert.equal(message.tracestate, "");
    }
    const [first, second] = await consumerSpans(sent.messageId, 2);
    for (const [span, { active }] of [
      [first, seen[0]],
      [second, seen[1]],
    ] as const) {
      assert.equal(span.name, "process consistd.inbox");
      assert.equal(span.instrumentationScope.name, "consistd");
      assert.equal(span.spanContext().traceId, traceId, "in the sender's trace");
      assert.equal(span.parentSpanContext?.spanId, spanId, "the consumer span is the sending span's child");
      assert.equal(span.parentSpanContext?.isRemote, true);
      assert.notEqual(span.spanContext().spanId, spanId);
      assert.deepEqual(active, span.spanContext(), "the handler runs in its consumer span");
      assert.equal(span.attributes["messaging.system"], "consistd");
      assert.equal(span.attributes["messaging.operation.type"], "process");
      assert.equal(span.attributes["messaging.destination.name"], "consistd.inbox");
    }
    assert.deepEqual(first.status, { code: SpanStatusCode.ERROR, message: "not yet" }, "the failed attempt is marked");
    assert.deepEqual(
      first.events.map((e) => [e.name, e.attributes?.["exception.message"]]),
      [["exception", "not yet"]],
    );
    assert.equal(second.status.code, SpanStatusCode.UNSET);
    assert.deepEqual(second.events, []);
  } finally {
    stop.abort();
    await serving;
  }
});

test("a send under no span, with its own traceparent, or under an explicit context is delivered as such", async () => {
  const a = new Client();
  const b = new Client(env("CONSISTD_TEST_PEER_SOCKET"));
  clients.push(a, b);
  const [untraced, own, explicit] = ["ts-untraced", "ts-own-trace", "ts-explicit-trace"].map(unique);
  const ownTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const active = tracer.startSpan("active producer");
  const given = tracer.startSpan("given producer");
  const sends = [await a.send(toB(untraced))];
  await context.with(trace.setSpan(context.active(), active), async () => {
    sends.push(await a.send({ ...toB(own), traceparent: ownTraceparent, tracestate: "v=1" }));
    sends.push(await a.send(toB(explicit), { context: trace.setSpan(ROOT_CONTEXT, given) }));
  });
  active.end();
  given.end();

  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), 20_000);
  const pending = new Set([untraced, own, explicit]);
  try {
    for await (const delivery of b.inbox.receive({ signal: stop.signal })) {
      const m = delivery.message;
      const parent = trace.getSpanContext(delivery.context);
      if (m.resourceId === untraced) {
        assert.deepEqual([m.traceparent, m.tracestate], ["", ""]);
        assert.equal(parent, undefined, "no parent for a message sent under no span");
      } else if (m.resourceId === own) {
        assert.deepEqual([m.traceparent, m.tracestate], [ownTraceparent, "v=1"], "the message's own context wins");
        assert.equal(parent?.traceId, "0af7651916cd43dd8448eb211c80319c");
        assert.equal(parent?.spanId, "b7ad6b7169203331");
        assert.equal(parent?.isRemote, true);
        assert.equal(parent?.traceState?.serialize(), "v=1");
      } else if (m.resourceId === explicit) {
        const { traceId, spanId } = given.spanContext();
        assert.equal(m.traceparent, `00-${traceId}-${spanId}-01`, "the given context wins over the active one");
        assert.deepEqual([parent?.traceId, parent?.spanId, parent?.isRemote], [traceId, spanId, true]);
      }
      await delivery.ack();
      pending.delete(m.resourceId);
      if (pending.size === 0) break;
    }
  } finally {
    clearTimeout(timer);
    stop.abort();
  }
  assert.equal(pending.size, 0, `not delivered: ${[...pending].join(", ")}`);
  await Promise.all(sends.map(acked));
});

test("a guarded send goes only in the term its sender leads, and the receiver sees the guard it was sent under", async () => {
  const a = new Client();
  const b = new Client(env("CONSISTD_TEST_PEER_SOCKET"));
  clients.push(a, b);
  const election = unique("ts-guarded");
  const [guarded, unguarded] = ["ts-guarded", "ts-unguarded"].map(unique);
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), 30_000);
  try {
    const states = a.campaign(election, { signal: stop.signal });
    const [leading] = (await until(states, "a to lead", (s) => s.isLeader)).slice(-1);
    // The Leadership is the guard; a term a does not lead (a plain number here) is refused.
    const sends = [await a.send(toB(guarded), { guard: leading }), await a.send(toB(unguarded))];
    const notHeld = { election, namespace: leading.namespace, term: Number(leading.term) + 1 };
    await assert.rejects(a.send(toB(unique("ts-not-held")), { guard: notHeld }), (error: unknown) => {
      assert.ok(error instanceof ConsistdError, String(error));
      assert.equal(error.code, status.FAILED_PRECONDITION, error.message);
      assert.match(error.details, /^guard: /);
      return true;
    });

    const seen = new Map<string, Guard | undefined>();
    for await (const delivery of b.inbox.receive({ signal: stop.signal })) {
      const m = delivery.message;
      if (m.resourceId === guarded || m.resourceId === unguarded) {
        assert.equal(delivery.guard, m.guard, "the delivery's guard is its message's");
        seen.set(m.resourceId, delivery.guard);
      }
      await delivery.ack();
      if (seen.size === 2) break;
    }
    assert.deepEqual(
      seen.get(guarded),
      { election, namespace: leading.namespace, term: leading.term },
      "the claim rode along to the receiver",
    );
    assert.ok(seen.has(unguarded), "the unguarded message was delivered");
    assert.equal(seen.get(unguarded), undefined, "no guard on an unguarded send");
    await Promise.all(sends.map(acked));
  } finally {
    clearTimeout(timer);
    stop.abort();
  }
});

test("concurrent sends and ACKs go out on one stream each, and a refused send fails alone", async () => {
  const [adminA, adminB] = [env("CONSISTD_TEST_ADMIN_SOCKET"), env("CONSISTD_TEST_PEER_ADMIN_SOCKET")];
  const started = async (admin: string, ...methods: string[]) =>
    Promise.all(methods.map((method) => callsStarted(admin, method)));
  const sendsBefore = await started(adminA, "SendStream", "Send");
  const acksBefore = await started(adminB, "AckStream", "Ack");
  const a = new Client();
  clients.push(a);
  const prefix = unique("ts-stream");
  const resources = Array.from({ length: 200 }, (_, i) => `${prefix}/${i}`);
  resources[57] = ""; // refused: resource_id must not be empty
  const stop = new AbortController();
  const received = new Set<string>();
  const b = new Client(env("CONSISTD_TEST_PEER_SOCKET"));
  clients.push(b);
  const serving = b.inbox.serve((m) => void (m.resourceId.startsWith(prefix) && received.add(m.resourceId)), {
    signal: stop.signal,
  });
  const to = { peer: env("CONSISTD_TEST_PEER_ADDRESS") };
  try {
    const outcomes = await Promise.allSettled(resources.map((resourceId) => a.send({ to, resourceId, eventId: "1", payload: "x" })));
    const refused = outcomes[57];
    assert.equal(refused.status, "rejected");
    const error = (refused as PromiseRejectedResult).reason;
    assert.ok(error instanceof ConsistdError, String(error));
    assert.equal(error.code, status.INVALID_ARGUMENT);
    assert.match(error.details, /resource_id/);
    const sent = outcomes.filter((_, i) => i !== 57).map((o) => {
      assert.equal(o.status, "fulfilled", o.status === "rejected" ? String(o.reason) : "");
      return (o as PromiseFulfilledResult<Sent>).value;
    });
    await Promise.all(sent.map(acked));
  } finally {
    stop.abort();
    await serving;
  }
  assert.equal(received.size, 199, "every stored message reached b's handler");
  const sendsAfter = await started(adminA, "SendStream", "Send");
  const acksAfter = await started(adminB, "AckStream", "Ack");
  assert.deepEqual(sendsAfter.map((n, i) => n - sendsBefore[i]), [1, 0], "SendStream, Send calls started on a");
  assert.deepEqual(acksAfter.map((n, i) => n - acksBefore[i]), [1, 0], "AckStream, Ack calls started on b");
});

test("a send after the connection was lost opens the stream again", async () => {
  const admin = env("CONSISTD_TEST_ADMIN_SOCKET");
  const before = await callsStarted(admin, "SendStream");
  const proxy = await Proxy.start(env("CONSISTD_SOCKET"));
  const a = new Client(proxy.path);
  const to = { peer: env("CONSISTD_TEST_PEER_ADDRESS") };
  let lost = 0;
  try {
    await a.send({ to, resourceId: unique("ts-reopen"), eventId: "1", payload: "before" });
    proxy.cut();
    let sent: Sent | undefined;
    for (let i = 0; i < 50 && !sent; i++) {
      try {
        sent = await a.send({ to, resourceId: unique("ts-reopen"), eventId: "2", payload: "after" });
      } catch (error) {
        // Only a send racing the cut may fail, and then as a lost connection.
        assert.ok(error instanceof ConsistdError && error.code === status.UNAVAILABLE, String(error));
        assert.match(error.details, /lost the connection/);
        lost++;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
    assert.ok(sent?.messageId, "a send succeeded after the cut");
    assert.ok(lost <= 3, `${lost} sends failed after the cut`);
  } finally {
    a.close();
    await proxy.close();
  }
  assert.ok(proxy.connections >= 2, "the client connected again");
  // One stream before the cut and one that carried the successful send; a send that failed may have opened one
  // more while the channel was still reconnecting.
  const opened = (await callsStarted(admin, "SendStream")) - before;
  assert.ok(opened >= 2 && opened <= 2 + lost, `${opened} SendStreams for ${lost} failed sends`);
});

/**
 * Message `messageId`'s first outcome as `client`'s sidecar answers WaitOutcome to the generated client: what the
 * daemon knows, asked without the SDK's own wait.
 */
function daemonOutcome(client: Client, messageId: string, ms = 20_000): Promise<proto.WatchAcksResponse> {
  return new Promise((resolve, reject) => {
    const options = { deadline: Date.now() + ms };
    client.services.outbox.waitOutcome({ messageId }, new Metadata(), options, (error, response) =>
      error ? reject(error) : resolve(response.outcome!),
    );
  });
}

/** Resolves once `condition` holds, asking every 20 ms for at most `ms`. */
async function eventually(what: string, condition: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await condition())) {
    assert.ok(Date.now() < deadline, `timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test("an ACK that comes while the app's connection to the sidecar is cut is seen as ACKED once it is back", async () => {
  const admin = env("CONSISTD_TEST_ADMIN_SOCKET");
  const direct = new Client();
  clients.push(direct);
  const proxy = await Proxy.start(env("CONSISTD_SOCKET"));
  const a = new Client(proxy.path);
  const resourceId = unique("ts-cut-outcome");
  const stop = new AbortController();
  let serving: Promise<void> | undefined;
  try {
    const sent = await a.send(toB(resourceId));
    const before = await callsStarted(admin, "WaitOutcome");
    // Nothing serves b's inbox yet: the wait stays open at the daemon.
    const ack = sent.ack;
    let settled: string | undefined;
    ack.then(
      (outcome) => (settled = `resolved ${outcome.kindName}`),
      (error) => (settled = `rejected ${error}`),
    );
    await eventually("the SDK's WaitOutcome call", async () => (await callsStarted(admin, "WaitOutcome")) > before);

    proxy.paused = true;
    proxy.cut();
    serving = serveB(resourceId, stop.signal, () => {});
    const acked = await daemonOutcome(direct, sent.messageId);
    assert.equal(AckOutcome[acked.outcome], "ACKED", "the daemon has the ACK while the app is cut off");
    // Long enough for the lost call to fail and a retry or two to find the socket closed.
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal(settled, undefined, "the wait went on through the lost connection");
    assert.equal(proxy.connections, 1, "the client stayed cut off");

    proxy.paused = false;
    const outcome = await within(20_000, "the outcome after the reconnect", ack);
    assert.equal(outcome.kindName, "ACKED");
    assert.equal(outcome.messageId, sent.messageId);
    assert.ok(proxy.connections >= 2, "the client connected again");
  } finally {
    stop.abort();
    await serving;
    a.close();
    await proxy.close();
  }
});

test("a message a newer event of its resource replaced before it was ACKed is SUPERSEDED", async () => {
  const a = new Client();
  clients.push(a);
  const resourceId = unique("ts-superseded");
  // Nothing serves b's inbox yet, so the first event is not ACKed when the second replaces it.
  const first = await a.send({ ...toB(resourceId), eventId: "1" });
  const second = await a.send({ ...toB(resourceId), eventId: "2" });
  const outcome = await within(20_000, "the replaced message's outcome", first.ack);
  assert.equal(outcome.kindName, "SUPERSEDED");
  assert.equal(outcome.kind, AckOutcome.SUPERSEDED);
  assert.equal(outcome.messageId, first.messageId);
  assert.equal(outcome.isAcked, false);
  const stop = new AbortController();
  const serving = serveB(resourceId, stop.signal, () => {});
  try {
    await acked(second);
  } finally {
    stop.abort();
    await serving;
  }
});

test("a timeout ends one wait for the outcome, waiting again gets it, and then it is answered without asking", async () => {
  const a = new Client();
  const resourceId = unique("ts-wait-timeout");
  const stop = new AbortController();
  let serving: Promise<void> | undefined;
  try {
    const sent = await a.send(toB(resourceId));
    const started = Date.now();
    await assert.rejects(
      within(5_000, "the wait with a 300 ms timeout", sent.outcome({ signal: AbortSignal.timeout(300) })),
      (error: Error) => error.name === "TimeoutError",
    );
    assert.ok(Date.now() - started >= 290, `the wait ended after ${Date.now() - started} ms`);

    serving = serveB(resourceId, stop.signal, () => {});
    const outcome = await within(20_000, "the outcome on the second wait", sent.ack);
    assert.equal(outcome.kindName, "ACKED");
    assert.equal(outcome.messageId, sent.messageId);

    // A closed client cannot ask the sidecar: the known outcome is what answers.
    a.close();
    assert.equal(await within(1_000, "the known outcome", sent.ack), outcome);
    assert.equal(await within(1_000, "the known outcome", sent.outcome()), outcome);
  } finally {
    stop.abort();
    await serving;
    a.close();
  }
});

test("the outcome of a message ACKed before its sidecar restarted is NOT_FOUND, as the daemon answered it", async () => {
  const daemon = new OwnDaemon(unique("sdk-ts-outcome"), "peer:\n  insecure: true\n");
  const resourceId = unique("ts-outcome-restart");
  const stop = new AbortController();
  const serving = serveB(resourceId, stop.signal, () => {});
  try {
    await daemon.start();
    const own = new Client(daemon.socket);
    clients.push(own);
    const sent = await own.send(toB(resourceId));
    const acked = await daemonOutcome(own, sent.messageId);
    assert.equal(AckOutcome[acked.outcome], "ACKED");

    await daemon.stop();
    await daemon.start();
    const error = await within(
      20_000,
      "the outcome after the restart",
      sent.ack.then(
        (outcome) => assert.fail(`resolved ${outcome.kindName}`),
        (error: unknown) => error,
      ),
    );
    assert.ok(error instanceof ConsistdError, String(error));
    assert.equal(error.code, status.NOT_FOUND, error.message);
    assert.match(error.details, new RegExp(`message ${sent.messageId}: its outcome is not known`));
  } finally {
    stop.abort();
    await serving;
    await daemon.remove();
  }
});

test("a send never awaited asks the sidecar for nothing after it is stored", async () => {
  const admin = env("CONSISTD_TEST_ADMIN_SOCKET");
  const before = await callsStarted(admin, "WaitOutcome");
  const a = new Client();
  const resourceId = unique("ts-unawaited");
  const stop = new AbortController();
  let received = 0;
  const serving = serveB(resourceId, stop.signal, () => void received++);
  try {
    const sent = await a.send(toB(resourceId));
    assert.ok(sent.messageId);
    await eventually("b's handler to get the message", async () => received === 1, 20_000);
    // A wait running now would fail with CANCELLED: an unhandled rejection, had the send started one.
    a.close();
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.equal(await callsStarted(admin, "WaitOutcome"), before, "WaitOutcome calls started on a");
  } finally {
    stop.abort();
    await serving;
    a.close();
  }
});
