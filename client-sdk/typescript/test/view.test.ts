// Views (how much of each object a watch or a queue keeps), a queue's change filters, its finalizer and a sharded
// queue's spec, and a work item's finalize pass, without a daemon: a client whose generated WatchService.subscribe
// and ReconcileService.reconcile are replaced by fakes that record what the SDK sends (and hand out what a test
// pushes).
import assert from "node:assert/strict";
import { after, test } from "node:test";
import {
  Consistency,
  EventType,
  type ObjectView,
  proto,
  type ReconcileSpec,
  type RelatedSpec,
  ShardBy,
} from "@consistd/client";
import { closeFakeClients, FakeClient, FakeStream, waitFor } from "./fakes.js";
import { next, within } from "./helpers.js";

after(closeFakeClients);

/** A client on a socket nobody serves, whose subscribes and reconcile streams are fakes. */
class Fake extends FakeClient {
  readonly reconcileStreams: FakeStream<proto.ReconcileResponse>[] = [];

  constructor() {
    super();
    const reconcile = this.client.services.reconcile;
    reconcile.reconcile = (() => {
      const stream = new FakeStream<proto.ReconcileResponse>();
      this.reconcileStreams.push(stream);
      return stream;
    }) as unknown as typeof reconcile.reconcile;
  }

  /** The view the nth subscribe sent, once the watch subscribed that often. */
  async subscribed(n: number): Promise<proto.ObjectView | undefined> {
    await this.stream(n);
    return this.requests[n].view;
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
    const synced = {
      type: EventType.SYNCED,
      object: undefined,
      cursor: "c1",
      consistency: Consistency.CONSISTENT,
      previousResourceVersion: "",
    };
    fake.streams[0].push(synced);
    assert.equal((await first).type, EventType.SYNCED);
    fields.push("spec"); // the query was read when the watch started
    fake.streams[0].end();
    void events.next().catch(() => {}); // the app asks for more: the watch subscribes again

    const again = await fake.subscribed(1);
    assert.equal(fake.requests[1].resumeCursor, "c1");
    assert.deepEqual(again, { metadataOnly: false, fields: ["metadata.labels"], managedFields: true });
    assert.deepEqual(again, fake.requests[0].view);
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
    changes: undefined,
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

test("the parts whose change queues a pass go on the query they are asked of; unnamed, the filter is unset", async () => {
  const spec = await new Fake().queueSpec({
    name: "q",
    resource: "deployments.apps",
    onlyChangesOf: { generation: true, labels: true },
    related: [
      { resource: "pods", controllerOwner: true, onlyChangesOf: { annotations: true } },
      { resource: "secrets", label: "owner" },
      { resource: "configmaps", field: "metadata.name", onlyChangesOf: { labels: true, annotations: false } },
    ],
  });
  assert.deepEqual(spec.primary?.changes, { generation: true, labels: true, annotations: false });
  assert.deepEqual(
    spec.related.map((r) => r.query?.changes),
    [
      { generation: false, labels: false, annotations: true },
      undefined, // unnamed: every change
      { generation: false, labels: true, annotations: false },
    ],
  );
  const related: RelatedSpec[] = [{ resource: "secrets", label: "owner" }];
  const unfiltered = await new Fake().queueSpec({ name: "q", resource: "configmaps", related });
  assert.deepEqual([unfiltered.primary?.changes, unfiltered.related[0].query?.changes], [undefined, undefined]);
  // Naming no part goes as it is: the daemon refuses it, naming spec.primary.changes.
  const none = await new Fake().queueSpec({ name: "q", resource: "configmaps", onlyChangesOf: {} });
  assert.deepEqual(none.primary?.changes, { generation: false, labels: false, annotations: false });
});

test("a sharded queue is sent sharded with its election; a queue is not sharded unless asked", async () => {
  const spec = await new Fake().queueSpec({
    name: "q",
    resource: "configmaps",
    election: { name: "web", namespace: "leases" },
    sharded: true,
  });
  assert.equal(spec.sharded, true);
  assert.deepEqual(spec.election, { election: "web", namespace: "leases" });
  assert.equal((await new Fake().queueSpec({ name: "q", resource: "configmaps" })).sharded, false);
  // Without an election it goes as it is: the daemon refuses it, naming spec.sharded.
  const alone = await new Fake().queueSpec({ name: "q", resource: "configmaps", sharded: true });
  assert.deepEqual([alone.sharded, alone.election], [true, undefined]);
});

test("a sharded queue is sent sharded by namespace when asked, by key (unset) unless asked", async () => {
  const sharded: ReconcileSpec = { name: "q", resource: "configmaps", election: { name: "web" }, sharded: true };
  assert.equal((await new Fake().queueSpec(sharded)).shardBy, ShardBy.UNSPECIFIED);
  const byNamespace = await new Fake().queueSpec({ ...sharded, shardBy: ShardBy.NAMESPACE });
  assert.equal(byNamespace.shardBy, ShardBy.NAMESPACE);
  assert.deepEqual([byNamespace.sharded, byNamespace.election?.election], [true, "web"], "the other options kept");
  // Without sharded it goes as it is: the daemon refuses it, naming spec.shard_by.
  const alone = await new Fake().queueSpec({ name: "q", resource: "configmaps", shardBy: ShardBy.NAMESPACE });
  assert.deepEqual([alone.sharded, alone.shardBy], [false, ShardBy.NAMESPACE]);
});

test("a queue's finalizer is sent on its spec; unset or empty, none is", async () => {
  const spec = await new Fake().queueSpec({ name: "q", resource: "configmaps", finalizer: "example.com/cleanup" });
  assert.equal(spec.finalizer, "example.com/cleanup");
  assert.equal((await new Fake().queueSpec({ name: "q", resource: "configmaps" })).finalizer, "");
  assert.equal((await new Fake().queueSpec({ name: "q", resource: "configmaps", finalizer: "" })).finalizer, "");
  // A name without a prefix goes as it is: the daemon refuses it, naming spec.finalizer.
  const bare = await new Fake().queueSpec({ name: "q", resource: "configmaps", finalizer: "cleanup" });
  assert.equal(bare.finalizer, "cleanup");
});

test("an item is a finalize pass when its WorkItem says so, and only then", async () => {
  const fake = new Fake();
  const stop = new AbortController();
  const finalizing = new Map<string, boolean>();
  const spec: ReconcileSpec = { name: "q", resource: "configmaps", finalizer: "example.com/cleanup" };
  const run = fake.client.reconcile(spec, (item) => void finalizing.set(item.name, item.finalizing), {
    signal: stop.signal,
  });
  await within(5_000, "the reconcile stream", waitFor(() => fake.reconcileStreams.length > 0));
  const item = (name: string, finalize: boolean) =>
    proto.ReconcileResponse.fromPartial({
      item: { leaseId: `lease-${name}`, namespace: "ns", name, attempt: 1, finalizing: finalize },
    });
  fake.reconcileStreams[0].push(
    proto.ReconcileResponse.fromPartial({ started: { name: "q" } }),
    item("deleting", true),
    item("live", false),
  );
  await within(5_000, "both passes", waitFor(() => finalizing.size === 2));
  stop.abort();
  await within(5_000, "the reconciler to stop", run);
  assert.deepEqual(Object.fromEntries(finalizing), { deleting: true, live: false });
});
