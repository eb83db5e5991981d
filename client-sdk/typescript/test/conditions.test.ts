// Status conditions without a daemon: a client whose generated ObjectsService.setCondition (and, for the item helper,
// ReconcileService.reconcile; for the own-write rule, WatchService.subscribe) are fakes, so the test sees every
// request the SDK sends and decides what the daemon answers.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import {
  type Condition,
  ConsistdError,
  Consistency,
  EventType,
  proto,
  type SetConditionResult,
  status,
  type WatchEvent,
} from "@consistd/client";
import { callOnAnItem, closeFakeClients, FakeClient } from "./fakes.js";
import { next, until } from "./helpers.js";

after(closeFakeClients);

/** A client on a socket nobody serves, whose setCondition (and watches) are fakes. */
class Fake extends FakeClient {
  /** Every SetConditionRequest the SDK sent, in order. */
  readonly sent: proto.SetConditionRequest[] = [];
  /** What the next setCondition answers. */
  answer: proto.SetConditionResponse = response(false, object("u", "1"));

  constructor() {
    super();
    const setCondition = (request: proto.SetConditionRequest, _m: unknown, _o: unknown, callback: (e: null, r: object) => void) => {
      this.sent.push(request);
      const answer = this.answer;
      setImmediate(() => callback(null, answer));
      return { cancel() {} };
    };
    (this.client.services.objects as unknown as Record<string, unknown>).setCondition = setCondition;
  }
}

function object(uid: string, resourceVersion: string, json: object = {}): proto.KubeObject {
  return { uid, namespace: "ns", name: "w", resourceVersion, json: Buffer.from(JSON.stringify(json)) };
}

function response(changed: boolean, written: proto.KubeObject): proto.SetConditionResponse {
  return { object: written, changed, lastTransitionTime: "2026-12-07T11:20:22Z", fence: 0 };
}

/** What `setCondition(condition)` on an item with the object `handed` resolved or rejected with (callOnAnItem). */
function onAnItem(
  fake: Fake,
  condition: Omit<Condition, "observedGeneration">,
  handed?: proto.KubeObject,
): Promise<SetConditionResult<unknown> | unknown> {
  return callOnAnItem(fake, "setCondition", (item) => item.setCondition(condition), handed);
}

test("item.setCondition sends the queue's resource, the item's key and lease, the condition and its handed generation", async () => {
  const fake = new Fake();
  const handed = object("u", "5", { metadata: { name: "w", namespace: "ns", generation: 7 } });
  fake.answer = response(true, object("u", "6"));
  const set = await onAnItem(fake, { type: "Ready", status: "True", reason: "Available", message: "3 of 3" }, handed);
  assert.deepEqual(fake.sent, [
    {
      resource: "widgets.example.com",
      namespace: "ns",
      name: "w",
      condition: { type: "Ready", status: proto.ConditionStatus.TRUE, reason: "Available", message: "3 of 3", observedGeneration: 7n },
      fieldManager: "",
      guard: undefined,
      reconcileLease: "lease-1",
    },
  ]);
  const result = set as SetConditionResult<unknown>;
  assert.equal(result.changed, true);
  assert.equal(result.lastTransitionTime, "2026-12-07T11:20:22Z");
  assert.equal(result.object.resourceVersion, "6");
});

test("item.setCondition maps each status as Kubernetes spells it, takes generation 0 without one, and refuses any other status unsent", async () => {
  const fake = new Fake();
  const noGeneration = object("u", "5", { metadata: { name: "w" } });
  await onAnItem(fake, { type: "Ready", status: "False", reason: "Creating" }, noGeneration);
  await onAnItem(fake, { type: "Synced", status: "Unknown", reason: "Waiting", message: "m" });
  assert.deepEqual(
    fake.sent.map((r) => r.condition),
    [
      { type: "Ready", status: proto.ConditionStatus.FALSE, reason: "Creating", message: "", observedGeneration: 0n },
      { type: "Synced", status: proto.ConditionStatus.UNKNOWN, reason: "Waiting", message: "m", observedGeneration: 0n },
    ],
  );

  for (const wrong of ["true", "TRUE", "Ready", "constructor", ""]) {
    const refused = await onAnItem(fake, { type: "Ready", status: wrong as "True", reason: "Available" });
    assert.ok(refused instanceof ConsistdError, `status ${JSON.stringify(wrong)}: ${refused}`);
    assert.equal(refused.code, status.INVALID_ARGUMENT);
    assert.match(refused.details, /^condition\.status: /);
  }
  assert.equal(fake.sent.length, 2, "a refused status was sent");
});

test("objects.setCondition records its answer for the own-write rule only when it wrote", async () => {
  const fake = new Fake();
  const stop = new AbortController();
  try {
    const target = { resource: "widgets.example.com", namespace: "ns", name: "w" };
    const ready = { type: "Ready", status: "True", reason: "Available" } as const;
    fake.answer = response(false, object("read", "9"));
    const unchanged = await fake.client.objects.setCondition({ ...target, condition: ready });
    assert.equal(unchanged.changed, false);
    fake.answer = response(true, object("written", "9"));
    assert.equal((await fake.client.objects.setCondition({ ...target, condition: ready })).changed, true);
    // A lease of its own in the request wins over none.
    await fake.client.objects.setCondition({ ...target, condition: ready, reconcileLease: "l" });
    assert.deepEqual(
      fake.sent.map((r) => r.reconcileLease),
      ["", "", "l"],
    );

    const events = fake.client.watch({ resource: "widgets.example.com", namespace: "ns" }, { signal: stop.signal });
    const first = next(events, "the first event");
    const state = (uid: string, cursor: string): proto.SubscribeResponse => ({
      type: EventType.ADDED,
      object: object(uid, "8"),
      cursor,
      consistency: Consistency.CONSISTENT,
      previousResourceVersion: "",
    });
    const synced = { type: EventType.SYNCED, object: undefined, cursor: "c3", consistency: 0, previousResourceVersion: "" };
    (await fake.stream(0)).push(state("read", "c1"), state("written", "c2"), synced);
    const taken = [await first, ...(await until(events, "SYNCED", (e) => e.type === EventType.SYNCED, 5_000))];
    const show = (e: WatchEvent) => `${EventType[e.type]}${e.object ? ` ${e.object.uid}@${e.object.resourceVersion}` : ""}`;
    assert.deepEqual(taken.map(show), ["ADDED read@8", "SYNCED"], "only the written state holds back an older one");
  } finally {
    stop.abort();
  }
});
