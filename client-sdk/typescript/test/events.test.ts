// Events without a daemon: a client whose generated ObjectsService.recordEvent (and, for the item helper,
// ReconcileService.reconcile) are fakes, so the test sees every request the SDK sends and decides what the daemon
// answers.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { ConsistdError, type ObjectEvent, proto, status } from "@consistd/client";
import { callOnAnItem, closeFakeClients, FakeClient } from "./fakes.js";

after(closeFakeClients);

/** A client on a socket nobody serves, whose recordEvent is a fake. */
class Fake extends FakeClient {
  /** Every RecordEventRequest the SDK sent, in order. */
  readonly sent: proto.RecordEventRequest[] = [];
  /** What the next recordEvent answers: a response, or an error the call fails with. */
  answer: proto.RecordEventResponse | Error = { recorded: true };

  constructor() {
    super();
    type Callback = (e: Error | null, r?: object) => void;
    const recordEvent = (request: proto.RecordEventRequest, _m: unknown, _o: unknown, callback: Callback) => {
      this.sent.push(request);
      const answer = this.answer;
      setImmediate(() => (answer instanceof Error ? callback(answer) : callback(null, answer)));
      return { cancel() {} };
    };
    (this.client.services.objects as unknown as Record<string, unknown>).recordEvent = recordEvent;
  }
}

/** What `recordEvent(event)` on an item with the object `handed` resolved or rejected with (callOnAnItem). */
function onAnItem(fake: Fake, event: ObjectEvent, handed?: proto.KubeObject): Promise<boolean | unknown> {
  return callOnAnItem(fake, "recordEvent", (item) => item.recordEvent(event), handed);
}

const handed: proto.KubeObject = {
  uid: "uid-7",
  namespace: "ns",
  name: "w",
  resourceVersion: "5",
  json: Buffer.from(JSON.stringify({ metadata: { name: "w", namespace: "ns", uid: "uid-7" } })),
};

test("item.recordEvent sends the queue's resource, the item's key, the handed object's uid, the event, and the queue's name as its reporting controller", async () => {
  const fake = new Fake();
  const event = { severity: "Warning", reason: "Drifted", action: "Reconcile", note: "data moved" } as const;
  assert.equal(await onAnItem(fake, event, handed), true);
  assert.deepEqual(fake.sent, [
    {
      resource: "widgets.example.com",
      namespace: "ns",
      name: "w",
      uid: "uid-7",
      severity: proto.EventSeverity.WARNING,
      reason: "Drifted",
      action: "Reconcile",
      note: "data moved",
      reportingController: "widgets",
    },
  ]);

  fake.answer = { recorded: false };
  assert.equal(await onAnItem(fake, event, handed), false, "an event the rate limit dropped");
});

test("item.recordEvent maps each severity as Kubernetes spells it, sends no uid without an object, and refuses any other severity unsent", async () => {
  const fake = new Fake();
  await onAnItem(fake, { severity: "Normal", reason: "Created", action: "Create" });
  await onAnItem(fake, { severity: "Warning", reason: "Failed", action: "Create", note: "n" }, handed);
  assert.deepEqual(
    fake.sent.map((r) => [r.severity, r.reason, r.action, r.note, r.uid]),
    [
      [proto.EventSeverity.NORMAL, "Created", "Create", "", ""],
      [proto.EventSeverity.WARNING, "Failed", "Create", "n", "uid-7"],
    ],
  );

  for (const wrong of ["normal", "WARNING", "Error", "constructor", "", undefined]) {
    const event = { severity: wrong as "Normal", reason: "Created", action: "Create" };
    const refused = await onAnItem(fake, event, handed);
    assert.ok(refused instanceof ConsistdError, `severity ${JSON.stringify(wrong)}: ${refused}`);
    assert.equal(refused.code, status.INVALID_ARGUMENT);
    assert.match(refused.details, /^severity: /);
  }
  assert.equal(fake.sent.length, 2, "a refused severity was sent");
});

test("objects.recordEvent sends its defaults, names no lease, and rejects with the daemon's error", async () => {
  const fake = new Fake();
  const event = { resource: "configmaps", name: "cm", severity: "Normal", reason: "Seen", action: "Observe" } as const;
  assert.deepEqual(await fake.client.objects.recordEvent(event), { recorded: true });
  assert.deepEqual(fake.sent, [
    {
      resource: "configmaps",
      namespace: "",
      name: "cm",
      uid: "",
      severity: proto.EventSeverity.NORMAL,
      reason: "Seen",
      action: "Observe",
      note: "",
      reportingController: "",
    },
  ]);

  const refusal = Object.assign(new Error("3 INVALID_ARGUMENT: reason: must be 1 to 128 characters"), {
    code: status.INVALID_ARGUMENT,
    details: "reason: must be 1 to 128 characters",
  });
  fake.answer = refusal;
  const refused = await fake.client.objects.recordEvent({ ...event, reason: "" }).catch((e: unknown) => e);
  assert.ok(refused instanceof ConsistdError, String(refused));
  assert.equal(refused.code, status.INVALID_ARGUMENT);
  assert.equal(refused.details, "reason: must be 1 to 128 characters");

  const info = { ...event, severity: "Info" as "Normal" };
  const bad = await fake.client.objects.recordEvent(info).catch((e: unknown) => e);
  assert.ok(bad instanceof ConsistdError && bad.code === status.INVALID_ARGUMENT, String(bad));
  assert.match(bad.details, /^severity: "Info" is not/);
  assert.equal(fake.sent.length, 2, "a refused severity was sent");
});
