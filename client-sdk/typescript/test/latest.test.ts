// The newest state per object (`client.watchLatest`): one pending state per object, handed to workers as they ask,
// the own-write rule applied at the hand-out, one worker per object at a time. The first tests run on the daemons,
// a third party's writes coming through the peer daemon; the rest feed fake watch streams.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Client, Consistency, ConsistdError, EventType, type Latest, proto, status, type Taken } from "@consistd/client";
import { closeFakeClients, FakeClient, type FakeStream } from "./fakes.js";
import { configMap, dropNamespace, env, freshNamespace, within } from "./helpers.js";

const clients: Client[] = [];
after(() => {
  clients.forEach((c) => c.close());
  closeFakeClients();
});
function client(socket?: string): Client {
  const c = new Client(socket);
  clients.push(c);
  return c;
}

/** "TYPE name@rv" of what a worker was handed. */
const show = (t: Taken) => `${EventType[t.event.type]} ${t.event.object?.name}@${t.event.object?.resourceVersion}`;

/** The next state handed out, within 15 s. */
function handed(latest: Latest): Promise<Taken> {
  return within(15_000, "a state handed out", latest.next());
}

/** Checks that nothing is handed out within `ms`. */
async function nothingReady(latest: Latest, ms = 50): Promise<void> {
  const stop = new AbortController();
  const taken = latest.next({ signal: stop.signal }).then(show, () => undefined);
  await sleep(ms);
  stop.abort();
  assert.equal(await taken, undefined, "something was handed out");
}

test("a worker is handed the newest state and never one older than its own write", async () => {
  const app = client();
  const other = client(env("CONSISTD_TEST_PEER_SOCKET"));
  const ns = await freshNamespace(app);
  const target = { resource: "configmaps", namespace: ns, name: "slow" };
  const latest = app.watchLatest({ resource: "configmaps", namespace: ns });
  try {
    const object = configMap("slow", { v: "0" });
    const created = await app.objects.create({ resource: "configmaps", namespace: ns, object });
    const first = await handed(latest);
    assert.equal(show(first), `ADDED slow@${created.resourceVersion}`);
    assert.equal(first.namespace, ns);
    // Another writer changes it twice while the worker works: both states reach the client and wait there.
    await other.objects.patch({ ...target, patch: { data: { v: "1" } } });
    const theirs = await other.objects.patch({ ...target, patch: { data: { v: "2" } } });
    await sleep(1_000);
    await nothingReady(latest, 200);
    assert.equal(latest.size, 1, "one pending state: the newest");
    const mine = await app.objects.patch({ ...target, patch: { data: { v: "mine" } } });
    first.done();
    const second = await handed(latest);
    assert.notEqual(second.event.object?.resourceVersion, theirs.resourceVersion, "older than the worker's own write");
    assert.equal(show(second), `MODIFIED slow@${mine.resourceVersion}`);
    second.done();
    await other.objects.delete(target);
    const gone = await handed(latest);
    assert.equal(EventType[gone.event.type], "DELETED");
  } finally {
    latest.close();
    await dropNamespace(app, ns);
  }
});

test("the error that ends the watch reaches the worker", async () => {
  const latest = client().watchLatest({ resource: "nosuchthings", namespace: "default" });
  try {
    await assert.rejects(handed(latest), (e: unknown) => e instanceof ConsistdError && e.code === status.NOT_FOUND);
  } finally {
    latest.close();
  }
});

// Without a daemon.

/** A fake client whose writes through `client.objects` return what `write` says. */
class Fake extends FakeClient {
  private answer?: proto.KubeObject;

  constructor() {
    super();
    const write = (_r: unknown, _m: unknown, _o: unknown, callback: (e: null, r: object) => void) => {
      const object = this.answer;
      setImmediate(() => callback(null, { object }));
      return { cancel() {} };
    };
    (this.client.services.objects as unknown as Record<string, unknown>).patch = write;
  }

  /** A patch through `client.objects` that returns object `name` at `resourceVersion`. */
  async write(name: string, resourceVersion: string): Promise<void> {
    this.answer = object(name, resourceVersion);
    await this.client.objects.patch({ resource: "configmaps", namespace: "ns", name, patch: {} });
  }
}

function object(name: string, resourceVersion: string): proto.KubeObject {
  return { uid: `uid-${name}`, namespace: "ns", name, resourceVersion, json: Buffer.from("{}") };
}

const { ADDED, MODIFIED, DELETED, SYNCED, RESYNC_REQUIRED } = EventType;

/** A state of object `name`; `previous` is the version the watch saw directly before it (none: unknown). */
function state(type: EventType, name: string, resourceVersion: string, previous = ""): proto.SubscribeResponse {
  const consistency = Consistency.CONSISTENT;
  const cursor = `c${resourceVersion}`;
  return { type, object: object(name, resourceVersion), cursor, consistency, previousResourceVersion: previous };
}

function marker(type: EventType): proto.SubscribeResponse {
  return { type, object: undefined, cursor: "", consistency: Consistency.UNSPECIFIED, previousResourceVersion: "" };
}

/** A Latest on a fake client, and its (first) watch stream. */
async function fake(): Promise<{ fake: Fake; latest: Latest; stream: FakeStream<proto.SubscribeResponse> }> {
  const f = new Fake();
  const latest = f.client.watchLatest({ resource: "configmaps", namespace: "ns" });
  return { fake: f, latest, stream: await f.stream(0) };
}

/** Lets the reader take in what was pushed. */
const settled = () => sleep(20);

test("only the newest state of each object is handed out, in the order objects became ready", async () => {
  const { latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"), state(ADDED, "b", "2"), marker(SYNCED));
    stream.push(state(MODIFIED, "a", "3"), state(MODIFIED, "a", "4"));
    await settled();
    assert.equal(latest.size, 2);
    assert.equal(show(await handed(latest)), "MODIFIED a@4");
    assert.equal(show(await handed(latest)), "ADDED b@2");
    await nothingReady(latest);
  } finally {
    latest.close();
  }
});

test("an object a worker holds is handed to no other until it is done, then its newest state is", async () => {
  const { latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"));
    const held = await handed(latest);
    stream.push(state(MODIFIED, "a", "2"), state(MODIFIED, "a", "3"));
    await settled();
    await nothingReady(latest);
    stream.push(state(ADDED, "b", "4"));
    assert.equal((await handed(latest)).name, "b", "another object is handed out meanwhile");
    let after: string | undefined;
    const waiting = handed(latest).then((t) => (after = show(t)));
    await settled();
    assert.equal(after, undefined, "a was handed out while held");
    held.done();
    held.done(); // again: nothing more
    await waiting;
    assert.equal(after, "MODIFIED a@3");
  } finally {
    latest.close();
  }
});

test("a state older than an own write that returned while it waited is dropped when handed out", async () => {
  const { fake: f, latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"));
    const held = await handed(latest);
    // Another writer's state arrives while the worker writes; the worker's write returns version 3.
    stream.push(state(MODIFIED, "a", "2"));
    await settled();
    await f.write("a", "3");
    held.done();
    await nothingReady(latest);
    assert.equal(latest.size, 0, "the older state was dropped");
    stream.push(state(MODIFIED, "a", "3"));
    assert.equal(show(await handed(latest)), "MODIFIED a@3", "the write's own state is handed out");
  } finally {
    latest.close();
  }
});

test("a deletion replaces the waiting state and is handed out whatever the own writes", async () => {
  const { fake: f, latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"));
    const held = await handed(latest);
    stream.push(state(MODIFIED, "a", "2"), state(DELETED, "a", "2"));
    await settled();
    await f.write("a", "9");
    held.done();
    assert.equal(show(await handed(latest)), "DELETED a@2");
  } finally {
    latest.close();
  }
});

test("the state a worker's own write made on the state it had is not handed back; the next writer's is", async () => {
  const { fake: f, latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"), marker(SYNCED));
    const held = await handed(latest);
    // The worker writes on a@1; the write's state arrives while it still holds the object.
    await f.write("a", "2");
    stream.push(state(MODIFIED, "a", "2", "1"));
    await settled();
    held.done();
    await nothingReady(latest);
    assert.equal(latest.size, 0, "the state of the worker's own write was dropped");
    // The app writes again on the state it dropped: the workers have that one too.
    await f.write("a", "3");
    stream.push(state(MODIFIED, "a", "3", "2"));
    await settled();
    await nothingReady(latest);
    // Another writer's change on top of it is handed out.
    stream.push(state(MODIFIED, "a", "4", "3"));
    const theirs = await handed(latest);
    assert.equal(show(theirs), "MODIFIED a@4");
    assert.equal(theirs.event.previousResourceVersion, "3", "the watch event carries the previous version");
    // The worker writes on that one and is done before its write's state arrives: dropped all the same.
    await f.write("a", "5");
    theirs.done();
    stream.push(state(MODIFIED, "a", "5", "4"));
    await settled();
    await nothingReady(latest);
    assert.equal(latest.size, 0, "the state of the worker's own write was dropped");
  } finally {
    latest.close();
  }
});

test("the state of an own write made on top of another writer's change is handed out", async () => {
  const { fake: f, latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"), marker(SYNCED));
    const held = await handed(latest);
    // Another writer changes a@1 to a@2 before the worker's write, which then is made on a@2, not on a@1.
    stream.push(state(MODIFIED, "a", "2", "1"));
    await f.write("a", "3");
    stream.push(state(MODIFIED, "a", "3", "2"));
    await settled();
    held.done();
    const mine = await handed(latest);
    assert.equal(show(mine), "MODIFIED a@3", "it holds a change no worker saw");
    // The worker has a@3 now: its write on it is not handed back.
    await f.write("a", "4");
    stream.push(state(MODIFIED, "a", "4", "3"));
    await settled();
    mine.done();
    await nothingReady(latest);
    assert.equal(latest.size, 0);
  } finally {
    latest.close();
  }
});

test("the state of an own write with no previous version (from a resync's snapshot) is handed out", async () => {
  const { fake: f, latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"), marker(SYNCED));
    const held = await handed(latest);
    await f.write("a", "2");
    // The watch could not resume: the snapshot holds the write's state, with no previous version.
    stream.push(marker(RESYNC_REQUIRED), state(ADDED, "a", "2"), marker(SYNCED));
    await settled();
    held.done();
    const listed = await handed(latest);
    assert.equal(show(listed), "ADDED a@2", "writes in between were never seen");
    // The worker has a@2 now: its write on it is not handed back.
    await f.write("a", "3");
    stream.push(state(MODIFIED, "a", "3", "2"));
    await settled();
    listed.done();
    await nothingReady(latest);
    assert.equal(latest.size, 0);
  } finally {
    latest.close();
  }
});

test("after a deletion, what the workers had of the object is forgotten", async () => {
  const { fake: f, latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"), marker(SYNCED));
    const held = await handed(latest);
    await f.write("a", "2");
    stream.push(state(MODIFIED, "a", "2", "1"));
    await settled();
    held.done();
    await nothingReady(latest);
    assert.equal(latest.size, 0, "the state of the worker's own write was dropped");
    stream.push(state(DELETED, "a", "2"));
    (await handed(latest)).done();
    // The fake brings back the same uid, on the state before the deletion (a real daemon names no previous state
    // for a new object): what the workers had before the deletion no longer counts.
    await f.write("a", "3");
    stream.push(state(MODIFIED, "a", "3", "2"));
    const again = await handed(latest);
    assert.equal(show(again), "MODIFIED a@3", "the rule carried over a deletion handed out");
    // A deletion that arrives and is replaced before it is handed out forgets it too.
    stream.push(state(DELETED, "a", "3"));
    await f.write("a", "4");
    stream.push(state(MODIFIED, "a", "4", "3"));
    await settled();
    again.done();
    assert.equal(show(await handed(latest)), "MODIFIED a@4", "the rule carried over a deletion that arrived");
  } finally {
    latest.close();
  }
});

test("after a resync, objects missing from the snapshot are handed out deleted", async () => {
  const { latest, stream } = await fake();
  try {
    stream.push(state(ADDED, "a", "1"), state(ADDED, "b", "2"), state(ADDED, "c", "3"), marker(SYNCED));
    for (let i = 0; i < 3; i++) (await handed(latest)).done();
    stream.push(state(DELETED, "c", "4"));
    (await handed(latest)).done();
    // The watch could not resume: a fresh snapshot without b.
    stream.push(marker(RESYNC_REQUIRED), state(ADDED, "a", "1"));
    await settled();
    assert.equal(show(await handed(latest)), "ADDED a@1", "a is handed out again");
    await nothingReady(latest);
    stream.push(marker(SYNCED));
    const gone = await handed(latest);
    assert.equal(show(gone), "DELETED b@2");
    assert.deepEqual(gone.event.object?.json.metadata, { name: "b", namespace: "ns", uid: "uid-b", resourceVersion: "2" });
    await nothingReady(latest);
  } finally {
    latest.close();
  }
});

test("the error that ends the watch reaches every worker that asks, and close ends the waits", async () => {
  const f = new Fake();
  const watch = f.client.services.watch;
  watch.subscribe = (() => {
    const refused = Object.assign(new Error("no such resource"), { code: status.NOT_FOUND, details: "no such resource" });
    return {
      cancel() {},
      on() {
        return this;
      },
      async *[Symbol.asyncIterator]() {
        await sleep(30);
        throw refused;
      },
    };
  }) as unknown as typeof watch.subscribe;
  const latest = f.client.watchLatest({ resource: "configmaps" });
  const isNotFound = (e: unknown) =>
    e instanceof ConsistdError && e.code === status.NOT_FOUND && e.details === "no such resource";
  await assert.rejects(handed(latest), isNotFound);
  await assert.rejects(latest.next(), isNotFound);

  const { latest: closed } = await fake();
  const waiting = closed.next();
  await settled();
  closed.close();
  await assert.rejects(waiting, (e: unknown) => e instanceof ConsistdError && e.code === status.CANCELLED);
});
