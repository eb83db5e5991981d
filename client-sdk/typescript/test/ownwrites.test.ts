// The own-write rule where the app takes an event, without a daemon: a client whose generated WatchService and
// ObjectsService methods are replaced by fakes the test feeds, so it decides which states arrive, when, and what
// each write returns.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Consistency, EventType, Mode, proto, type WatchEvent } from "@consistd/client";
import { closeFakeClients, FakeClient } from "./fakes.js";
import { next, until } from "./helpers.js";

after(closeFakeClients);

/** A client on a socket nobody serves, whose watches and object writes are fakes. */
class Fake extends FakeClient {
  /** What the next write answers (its object; none for a delete that sent none back). */
  answer?: proto.KubeObject;

  constructor() {
    super();
    const services = this.client.services;
    const write = (_request: unknown, _metadata: unknown, _options: unknown, callback: (e: null, r: object) => void) => {
      const object = this.answer;
      setImmediate(() => callback(null, { object }));
      return { cancel() {} };
    };
    for (const method of ["create", "update", "patch", "delete"]) {
      (services.objects as unknown as Record<string, unknown>)[method] = write;
    }
  }

  /** A write through `client.objects` (patch unless `how` says otherwise) that returns `uid` at `resourceVersion`. */
  async write(uid: string, resourceVersion: string, how: "create" | "update" | "patch" | "delete" = "patch"): Promise<void> {
    this.answer = object(uid, resourceVersion);
    const target = { resource: "configmaps", namespace: "ns", name: uid };
    if (how === "create") await this.client.objects.create({ ...target, object: {} });
    else if (how === "update") await this.client.objects.update({ ...target, object: {}, subresource: "status" });
    else if (how === "delete") await this.client.objects.delete(target);
    else await this.client.objects.patch({ ...target, patch: {} });
  }
}

function object(uid: string, resourceVersion: string): proto.KubeObject {
  return { uid, namespace: "ns", name: uid, resourceVersion, json: Buffer.from("{}") };
}

/** A SubscribeResponse; markers (SYNCED, RESYNC_REQUIRED) have no object. */
function event(type: EventType, cursor: string, uid?: string, resourceVersion = ""): proto.SubscribeResponse {
  return {
    type,
    object: uid === undefined ? undefined : object(uid, resourceVersion),
    cursor,
    consistency: Consistency.CONSISTENT,
    previousResourceVersion: "",
  };
}

/** "TYPE uid@rv" of an event, with "!" when it predates an own write. */
const show = (e: WatchEvent) =>
  `${EventType[e.type]}${e.object ? ` ${e.object.uid}@${e.object.resourceVersion}` : ""}${e.predatesOwnWrite ? "!" : ""}`;

const { ADDED, MODIFIED, DELETED, SYNCED, RESYNC_REQUIRED } = EventType;

/**
 * Subscribes in `mode`, takes the snapshot, then lets states of u1 arrive before and after a write of u1 at
 * version 8 and returns what the app takes once the write returned, up to the last SYNCED.
 */
async function aroundAWrite(mode: Mode): Promise<string[]> {
  const fake = new Fake();
  const stop = new AbortController();
  try {
    const events = fake.client.watch({ resource: "configmaps", namespace: "ns", mode }, { signal: stop.signal });
    const first = next(events, "ADDED u1");
    const stream = await fake.stream(0);
    stream.push(event(ADDED, "c1", "u1", "5"), event(SYNCED, "c2"));
    assert.equal(show(await first), "ADDED u1@5");
    assert.equal(show(await next(events, "SYNCED")), "SYNCED");

    // Arrived (the watch's buffers hold them) but not taken when the write returns.
    stream.push(event(MODIFIED, "c3", "u1", "6"), event(MODIFIED, "c4", "u2", "3"));
    await new Promise((resolve) => setImmediate(resolve));
    await fake.write("u1", "8");
    stream.push(
      event(MODIFIED, "c5", "u1", "7"),
      event(MODIFIED, "c6", "u1", "8"), // the write's own state: equal passes
      event(MODIFIED, "c7", "u1", "9"),
      event(DELETED, "c8", "u1", "7"), // never dropped, whatever its version
      event(RESYNC_REQUIRED, "c9"),
      event(ADDED, "c10", "u1", "7"),
      event(SYNCED, "c11"),
    );
    const taken = await until(events, "SYNCED", (e) => e.type === SYNCED, 5_000);
    assert.equal(fake.requests.length, 1, "the watch subscribed again");
    return taken.map(show);
  } finally {
    stop.abort();
  }
}

test("CONSISTENT: an ADDED or MODIFIED state older than an own write is dropped when taken, even if it arrived first", async () => {
  assert.deepEqual(await aroundAWrite(Mode.CONSISTENT), [
    "MODIFIED u2@3",
    "MODIFIED u1@8",
    "MODIFIED u1@9",
    "DELETED u1@7",
    "RESYNC_REQUIRED",
    "SYNCED",
  ]);
});

test("RAW: the same states are all delivered, those older than an own write marked predatesOwnWrite", async () => {
  assert.deepEqual(await aroundAWrite(Mode.RAW), [
    "MODIFIED u1@6!",
    "MODIFIED u2@3",
    "MODIFIED u1@7!",
    "MODIFIED u1@8",
    "MODIFIED u1@9",
    "DELETED u1@7",
    "RESYNC_REQUIRED",
    "ADDED u1@7!",
    "SYNCED",
  ]);
});

test("every kind of write records its version, the largest wins, and non-integer versions are never compared", async () => {
  const fake = new Fake();
  const stop = new AbortController();
  try {
    await fake.write("created", "5", "create");
    await fake.write("status", "5", "update");
    await fake.write("deleted", "5", "delete");
    await fake.write("twice", "9");
    await fake.write("twice", "6"); // an answer that arrives late does not lower the record
    await fake.write("opaque", "abc"); // not an integer: not recorded
    await fake.write("integer", "10");
    fake.answer = undefined;
    await fake.client.objects.delete({ resource: "configmaps", namespace: "ns", name: "gone" }); // no object back

    const events = fake.client.watch({ resource: "configmaps", namespace: "ns" }, { signal: stop.signal });
    const first = next(events, "the first event");
    (await fake.stream(0)).push(
      event(ADDED, "c1", "created", "4"),
      event(ADDED, "c2", "status", "4"),
      event(ADDED, "c3", "deleted", "4"),
      event(ADDED, "c4", "twice", "8"),
      event(ADDED, "c5", "opaque", "1"),
      event(ADDED, "c6", "integer", "x9"), // not an integer: never compared, so delivered
      event(ADDED, "c7", "integer", "09"),
      event(ADDED, "c8", "integer", ""),
      event(ADDED, "c9", "integer", "011"),
      event(SYNCED, "c10"),
    );
    const taken = [await first, ...(await until(events, "SYNCED", (e) => e.type === SYNCED, 5_000))];
    assert.deepEqual(taken.map(show), [
      "ADDED opaque@1",
      "ADDED integer@x9",
      "ADDED integer@",
      "ADDED integer@011",
      "SYNCED",
    ]);
  } finally {
    stop.abort();
  }
});

test("a dropped event still moves the resume cursor: after a reconnect it is not delivered again", async () => {
  const fake = new Fake();
  const stop = new AbortController();
  try {
    const events = fake.client.watch({ resource: "configmaps", namespace: "ns" }, { signal: stop.signal });
    const first = next(events, "ADDED u1");
    const stream = await fake.stream(0);
    stream.push(event(ADDED, "c1", "u1", "1"), event(SYNCED, "c2"));
    await first;
    await next(events, "SYNCED");

    stream.push(event(MODIFIED, "c3", "u1", "2"));
    await fake.write("u1", "3");
    stream.end(); // the daemon goes away right after the state the rule drops
    const taken = next(events, "the own write after the reconnect");
    const resumed = await fake.stream(1);
    assert.deepEqual(
      fake.requests.map((r) => r.resumeCursor),
      ["", "c3"],
    );
    // The fake daemon resumes after c3, as the real one does with the cursor it was given.
    resumed.push(event(MODIFIED, "c4", "u1", "3"));
    assert.equal(show(await taken), "MODIFIED u1@3");
    assert.equal((await taken).cursor, "c4");
  } finally {
    stop.abort();
  }
});

test("the record is per client: another client's write holds nothing back", async () => {
  const watching = new Fake();
  const writing = new Fake();
  const stop = new AbortController();
  try {
    await writing.write("u1", "9");
    const events = watching.client.watch({ resource: "configmaps", namespace: "ns" }, { signal: stop.signal });
    const first = next(events, "ADDED u1");
    (await watching.stream(0)).push(event(ADDED, "c1", "u1", "5"));
    assert.equal(show(await first), "ADDED u1@5");
  } finally {
    stop.abort();
  }
});

test("the record is bounded: the least recently written object is forgotten first", async () => {
  const fake = new Fake();
  const stop = new AbortController();
  try {
    await fake.write("first", "5");
    await fake.write("second", "5");
    await fake.write("first", "5"); // written again: now newer than "second"
    for (let i = 0; i < 9_999; i++) await fake.write(`other-${i}`, "5");
    // 10,001 objects were written: "second" is the one forgotten.
    const events = fake.client.watch({ resource: "configmaps", namespace: "ns" }, { signal: stop.signal });
    const first = next(events, "the first event");
    (await fake.stream(0)).push(
      event(ADDED, "c1", "first", "4"),
      event(ADDED, "c2", "second", "4"),
      event(ADDED, "c3", "other-0", "4"),
      event(SYNCED, "c4"),
    );
    const taken = [await first, ...(await until(events, "SYNCED", (e) => e.type === SYNCED, 5_000))];
    assert.deepEqual(taken.map(show), ["ADDED second@4", "SYNCED"]);
  } finally {
    stop.abort();
  }
});

test("predatesOwnWrite judges a state the app took into a queue of its own again, once its write returned", async () => {
  const fake = new Fake();
  const other = new Fake();
  const stop = new AbortController();
  try {
    const events = fake.client.watch({ resource: "configmaps", namespace: "ns" }, { signal: stop.signal });
    const first = next(events, "ADDED u1");
    (await fake.stream(0)).push(event(ADDED, "c1", "u1", "5"));
    const queued = (await first).object; // taken before the write: the watch could not drop it
    assert.ok(queued);
    assert.equal(fake.client.predatesOwnWrite(queued), false);
    await fake.write("u1", "8");
    assert.equal(fake.client.predatesOwnWrite(queued), true, "a state older than the app's own write was judged current");
    assert.equal(fake.client.predatesOwnWrite(object("u1", "8")), false, "the write's own state");
    assert.equal(fake.client.predatesOwnWrite(object("u1", "x")), false, "a version that is not an integer");
    assert.equal(other.client.predatesOwnWrite(queued), false, "another client's write");
  } finally {
    stop.abort();
  }
});
