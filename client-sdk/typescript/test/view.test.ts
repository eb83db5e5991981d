// Views (how much of each object a watch or a queue keeps), without a daemon: a client whose generated
// WatchService.subscribe and ReconcileService.reconcile are replaced by fakes that record what the SDK sends.
import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { Client, Consistency, EventType, type ObjectView, proto, type ReconcileSpec } from "@consistd/client";
import { next, unique, within } from "./helpers.js";

const clients: Client[] = [];
after(() => clients.forEach((c) => c.close()));

/** A stream the test feeds and ends (what the fake subscribe and reconcile return; messages() iterates it). */
class FakeStream<T> {
  /** What the SDK wrote to it (a bidirectional stream's requests). */
  readonly written: unknown[] = [];
  private readonly queue: (T | undefined)[] = [];
  private wake?: () => void;

  push(...messages: T[]): void {
    this.queue.push(...messages);
    this.wake?.();
  }

  /** Ends the stream without an error, as a daemon going away does. */
  end(): void {
    this.queue.push(undefined);
    this.wake?.();
  }

  cancel(): void {
    this.end();
  }

  write(message: unknown): boolean {
    this.written.push(message);
    return true;
  }

  on(): this {
    return this;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    for (;;) {
      while (this.queue.length === 0) await new Promise<void>((resolve) => (this.wake = resolve));
      const message = this.queue.shift();
      if (!message) return;
      yield message;
    }
  }
}

/** A client on a socket nobody serves, whose subscribes and reconcile streams are fakes. */
class Fake {
  readonly client: Client;
  /** Every subscribe request, and the stream it got, in order. */
  readonly subscribes: proto.SubscribeRequest[] = [];
  readonly watchStreams: FakeStream<proto.SubscribeResponse>[] = [];
  readonly reconcileStreams: FakeStream<proto.ReconcileResponse>[] = [];

  constructor() {
    this.client = new Client(join(tmpdir(), `${unique("consistd-no-daemon")}.sock`));
    clients.push(this.client);
    const { watch, reconcile } = this.client.services;
    watch.subscribe = ((request: proto.SubscribeRequest) => {
      this.subscribes.push(request);
      const stream = new FakeStream<proto.SubscribeResponse>();
      this.watchStreams.push(stream);
      return stream;
    }) as unknown as typeof watch.subscribe;
    reconcile.reconcile = (() => {
      const stream = new FakeStream<proto.ReconcileResponse>();
      this.reconcileStreams.push(stream);
      return stream;
    }) as unknown as typeof reconcile.reconcile;
  }

  /** The view the nth subscribe sent, once the watch subscribed that often. */
  async subscribed(n: number): Promise<proto.ObjectView | undefined> {
    await within(5_000, `subscribe #${n + 1}`, waitFor(() => this.subscribes.length > n));
    return this.subscribes[n].view;
  }

  /** The spec the reconciler's first stream opened the queue with: reconciles `spec` until it wrote one. */
  async queueSpec(spec: ReconcileSpec): Promise<proto.QueueSpec> {
    const stop = new AbortController();
    const run = this.client.reconcile(spec, () => assert.fail("no work was handed out"), { signal: stop.signal });
    await within(5_000, "the queue's spec", waitFor(() => this.reconcileStreams[0]?.written.length > 0));
    stop.abort();
    await within(5_000, "the reconciler to stop", run);
    const request = this.reconcileStreams[0].written[0] as proto.ReconcileRequest;
    assert.ok(request.spec, "the first message is the spec");
    return request.spec;
  }
}

async function waitFor(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 5));
}

/** The first subscribe's view of a watch of `view`. */
async function watchView(view: ObjectView | undefined): Promise<proto.ObjectView | undefined> {
  const fake = new Fake();
  const stop = new AbortController();
  try {
    const events = fake.client.watch({ resource: "configmaps", namespace: "ns", view }, { signal: stop.signal });
    void events.next().catch(() => {}); // starts the generator, which subscribes
    return await fake.subscribed(0);
  } finally {
    stop.abort();
  }
}

test("a watch without a view sends none: the whole object without managedFields", async () => {
  assert.equal(await watchView(undefined), undefined);
});

test("a watch's view is sent as the protocol's ObjectView, unset fields at their defaults", async () => {
  assert.deepEqual(await watchView({ metadataOnly: true }), { metadataOnly: true, fields: [], managedFields: false });
  assert.deepEqual(await watchView({ fields: ["spec.replicas", "status.conditions"] }), {
    metadataOnly: false,
    fields: ["spec.replicas", "status.conditions"],
    managedFields: false,
  });
  assert.deepEqual(await watchView({ managedFields: true }), { metadataOnly: false, fields: [], managedFields: true });
  assert.deepEqual(await watchView({}), { metadataOnly: false, fields: [], managedFields: false });
});

test("a view the daemon refuses is sent as it is, for the daemon to name the field", async () => {
  const fields = Array.from({ length: 33 }, (_, i) => `spec.f${i}`);
  assert.deepEqual(await watchView({ metadataOnly: true, fields: ["spec", "a..b"] }), {
    metadataOnly: true,
    fields: ["spec", "a..b"],
    managedFields: false,
  });
  assert.deepEqual((await watchView({ fields }))?.fields, fields);
});

test("a watch that reconnects subscribes again with the same view, from its last cursor", async () => {
  const fake = new Fake();
  const stop = new AbortController();
  const fields = ["metadata.labels"];
  try {
    const events = fake.client.watch(
      { resource: "configmaps", namespace: "ns", view: { fields, managedFields: true } },
      { signal: stop.signal },
    );
    const first = next(events, "SYNCED");
    await fake.subscribed(0);
    const synced = { type: EventType.SYNCED, object: undefined, cursor: "c1", consistency: Consistency.CONSISTENT };
    fake.watchStreams[0].push(synced);
    assert.equal((await first).type, EventType.SYNCED);
    fields.push("spec"); // the query was read when the watch started
    fake.watchStreams[0].end();
    void events.next().catch(() => {}); // the app asks for more: the watch subscribes again

    const again = await fake.subscribed(1);
    assert.equal(fake.subscribes[1].resumeCursor, "c1");
    assert.deepEqual(again, { metadataOnly: false, fields: ["metadata.labels"], managedFields: true });
    assert.deepEqual(again, fake.subscribes[0].view);
  } finally {
    stop.abort();
  }
});

test("a queue sends its primary's view and each related query's own; one without a view sends none", async () => {
  const spec = await new Fake().queueSpec({
    name: "q",
    resource: "deployments.apps",
    namespace: "ns",
    view: { fields: ["spec.replicas", "status.conditions"] },
    related: [
      { resource: "pods", namespace: "ns", controllerOwner: true, view: { metadataOnly: true } },
      { resource: "configmaps", label: "app", view: { metadataOnly: true, managedFields: true } },
      { resource: "secrets", annotation: "example.com/owner" },
    ],
  });
  assert.deepEqual(spec.primary, {
    resource: "deployments.apps",
    namespace: "ns",
    labelSelector: "",
    fieldSelector: "",
    view: { metadataOnly: false, fields: ["spec.replicas", "status.conditions"], managedFields: false },
  });
  assert.deepEqual(
    spec.related.map((r) => r.query?.view),
    [
      { metadataOnly: true, fields: [], managedFields: false },
      { metadataOnly: true, fields: [], managedFields: true },
      undefined,
    ],
  );
  assert.deepEqual(
    spec.related.map((r) => [r.controllerOwner, r.label, r.annotation]),
    [
      [true, undefined, undefined],
      [undefined, "app", undefined],
      [undefined, undefined, "example.com/owner"],
    ],
  );
});

test("a queue without views sends none", async () => {
  const spec = await new Fake().queueSpec({
    name: "q",
    resource: "configmaps",
    related: [{ resource: "secrets", field: "metadata.name" }],
  });
  assert.equal(spec.primary?.view, undefined);
  assert.equal(spec.related[0].query?.view, undefined);
});
