// Watches: the initial snapshot and own writes, the own-write rule where the app takes an event, resuming after
// a lost connection, and a daemon restart.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Client, Consistency, EventType, Mode, type WatchEvent } from "@consistd/client";
import { configMap, dropNamespace, env, freshNamespace, next, OwnDaemon, Proxy, unique, until } from "./helpers.js";

const clients: Client[] = [];
after(() => clients.forEach((c) => c.close()));
function client(socket?: string): Client {
  const c = new Client(socket);
  clients.push(c);
  return c;
}

/** "TYPE name" of an event, for comparing sequences. */
const show = (e: WatchEvent) => `${EventType[e.type]}${e.object ? ` ${e.object.name}` : ""}`;

test("a CONSISTENT watch sees the snapshot, SYNCED, then its own write as OWN_WRITE", async () => {
  const a = client();
  const ns = await freshNamespace(a);
  const stop = new AbortController();
  try {
    await a.objects.create({ resource: "configmaps", namespace: ns, object: configMap("one", { k: "v" }) });
    const events = a.watch({ resource: "configmaps", namespace: ns, mode: Mode.CONSISTENT }, { signal: stop.signal });
    const initial = await until(events, "SYNCED", (e) => e.type === EventType.SYNCED);
    assert.deepEqual(initial.map(show), ["ADDED one", "SYNCED"]);
    assert.equal(initial[0].object!.json.data.k, "v");

    const patched = await a.objects.patch({ resource: "configmaps", namespace: ns, name: "one", patch: { data: { k: "w" } } });
    const own = await next(events, "the own write");
    assert.equal(show(own), "MODIFIED one");
    assert.equal(own.consistency, Consistency.OWN_WRITE);
    assert.equal(own.object!.resourceVersion, patched.resourceVersion);
    assert.equal(own.object!.json.data.k, "w");
  } finally {
    stop.abort();
    await dropNamespace(a, ns);
  }
});

/**
 * Subscribes in `mode` to a ConfigMap the app created through daemon a; a third party (a client of the peer
 * daemon b, whose writes are not this pod's own) changes it to rv2, which reaches the app's watch while the app
 * does not take it; then the app patches it through its own client to rv3. Returns rv2, rv3 and the events
 * the app takes after its write, up to rv3.
 */
async function staleStateBufferedAcrossAnOwnWrite(mode: Mode): Promise<{ rv2: string; rv3: string; taken: WatchEvent[] }> {
  const a = client();
  const thirdParty = client(env("CONSISTD_TEST_PEER_SOCKET"));
  const observer = client();
  const ns = await freshNamespace(a);
  const stop = new AbortController();
  try {
    const target = { resource: "configmaps", namespace: ns };
    await a.objects.create({ ...target, object: configMap("cfg", { k: "1" }) });
    const events = a.watch({ ...target, mode }, { signal: stop.signal });
    const initial = await until(events, "SYNCED", (e) => e.type === EventType.SYNCED);
    assert.deepEqual(initial.map(show), ["ADDED cfg", "SYNCED"]);
    assert.ok(initial.every((e) => !e.predatesOwnWrite), "the snapshot holds the create's own state");
    // A second watch on daemon a (another client) tells when rv2 has reached daemon a.
    const observed = observer.watch({ ...target, mode: Mode.RAW }, { signal: stop.signal });
    await until(observed, "the observer's SYNCED", (e) => e.type === EventType.SYNCED);

    const rv2 = (await thirdParty.objects.patch({ ...target, name: "cfg", patch: { data: { k: "2" } } })).resourceVersion;
    await until(observed, "rv2 at daemon a", (e) => e.object?.resourceVersion === rv2);
    // No write of this pod is pending, so daemon a sends rv2 to the app's watch at once; the app does not take
    // it, and gives it time to arrive in the SDK's buffers.
    await sleep(1_000);
    const rv3 = (await a.objects.patch({ ...target, name: "cfg", patch: { data: { k: "3" } } })).resourceVersion;
    assert.ok(BigInt(rv3) > BigInt(rv2), `rv3 ${rv3} is not after rv2 ${rv2}`);
    const taken = await until(events, "rv3, the own write", (e) => e.object?.resourceVersion === rv3);
    return { rv2, rv3, taken };
  } finally {
    stop.abort();
    await dropNamespace(a, ns);
  }
}

test("a CONSISTENT watch never hands the app a state older than its own write, even one that arrived before the write", async () => {
  const { rv3, taken } = await staleStateBufferedAcrossAnOwnWrite(Mode.CONSISTENT);
  assert.deepEqual(
    taken.map((e) => `${show(e)}@${e.object?.resourceVersion}`),
    [`MODIFIED cfg@${rv3}`],
  );
  assert.equal(taken[0].consistency, Consistency.OWN_WRITE);
  assert.equal(taken[0].predatesOwnWrite, false);
  assert.equal(taken[0].object!.json.data.k, "3");
});

test("a RAW watch delivers a state older than its own write marked predatesOwnWrite, and the write's state unmarked", async () => {
  const { rv2, rv3, taken } = await staleStateBufferedAcrossAnOwnWrite(Mode.RAW);
  assert.deepEqual(
    taken.map((e) => [show(e), e.object?.resourceVersion, e.predatesOwnWrite]),
    [
      ["MODIFIED cfg", rv2, true],
      ["MODIFIED cfg", rv3, false],
    ],
  );
});

test("a watch whose connection is cut resumes from its cursor: every event once, no RESYNC_REQUIRED", async () => {
  const direct = client();
  const proxy = await Proxy.start(env("CONSISTD_SOCKET"));
  const viaProxy = client(proxy.path);
  const ns = await freshNamespace(direct);
  const stop = new AbortController();
  try {
    for (const name of ["one", "two"]) {
      await direct.objects.create({ resource: "configmaps", namespace: ns, object: configMap(name) });
    }
    const events = viaProxy.watch({ resource: "configmaps", namespace: ns, mode: Mode.RAW }, { signal: stop.signal });
    const initial = await until(events, "SYNCED", (e) => e.type === EventType.SYNCED);
    assert.deepEqual(initial.map(show).sort(), ["ADDED one", "ADDED two", "SYNCED"]);

    // Changes made while the SDK cannot reach the daemon must all arrive after it reconnects.
    proxy.paused = true;
    proxy.cut();
    await direct.objects.create({ resource: "configmaps", namespace: ns, object: configMap("three") });
    await direct.objects.patch({ resource: "configmaps", namespace: ns, name: "one", patch: { data: { x: "1" } } });
    await direct.objects.delete({ resource: "configmaps", namespace: ns, name: "two" });
    await new Promise((resolve) => setTimeout(resolve, 300));
    proxy.paused = false;
    const resumed = await until(events, "DELETED two", (e) => e.type === EventType.DELETED);
    // And the stream keeps going after the reconnect.
    await direct.objects.create({ resource: "configmaps", namespace: ns, object: configMap("four") });
    const later = await next(events, "ADDED four");

    assert.deepEqual([...resumed, later].map(show), ["ADDED three", "MODIFIED one", "DELETED two", "ADDED four"]);
    assert.ok(proxy.connections >= 2, `the SDK connected ${proxy.connections} time(s); the cut did not force a reconnect`);
  } finally {
    stop.abort();
    await proxy.close();
    await dropNamespace(direct, ns);
  }
});

test("after the daemon restarts, the watch yields RESYNC_REQUIRED, a fresh snapshot and SYNCED without failing", async () => {
  const daemon = new OwnDaemon(unique("sdk-ts-restart"));
  const stop = new AbortController();
  const direct = client();
  const ns = await freshNamespace(direct);
  try {
    await direct.objects.create({ resource: "configmaps", namespace: ns, object: configMap("kept") });
    await daemon.start();
    const own = client(daemon.socket);
    await own.waitReady(10_000);
    const events = own.watch({ resource: "configmaps", namespace: ns, mode: Mode.CONSISTENT }, { signal: stop.signal });
    const initial = await until(events, "SYNCED", (e) => e.type === EventType.SYNCED);
    assert.deepEqual(initial.map(show), ["ADDED kept", "SYNCED"]);

    await daemon.stop();
    await direct.objects.create({ resource: "configmaps", namespace: ns, object: configMap("added-while-down") });
    await daemon.start();
    const after = await until(events, "SYNCED after the restart", (e) => e.type === EventType.SYNCED, 40_000);
    assert.equal(show(after[0]), "RESYNC_REQUIRED");
    assert.deepEqual(after.slice(1).map(show).sort(), ["ADDED added-while-down", "ADDED kept", "SYNCED"]);
  } finally {
    stop.abort();
    await daemon.remove();
    await dropNamespace(direct, ns);
  }
});
