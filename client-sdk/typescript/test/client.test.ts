// Connecting, waiting for readiness, objects, and errors that keep the daemon's code and message.
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { after, test } from "node:test";
import { Client, Consistency, ConsistdError, connect, EventType, Mode, NotReadyError, status } from "@consistd/client";
import { configMap, dropNamespace, env, freshNamespace, until } from "./helpers.js";

const clients: Client[] = [];
after(() => clients.forEach((c) => c.close()));

test("a client made with no arguments talks to CONSISTD_SOCKET once ready", async () => {
  const client = new Client();
  clients.push(client);
  assert.equal(client.socket, resolve(env("CONSISTD_SOCKET")));
  await client.waitReady(10_000);
  const other = connect();
  clients.push(other);
  await other.waitReady(10_000);
});

test("waitReady on a missing socket fails after the timeout, naming the socket and the last error", async () => {
  const client = new Client("/nonexistent/consistd.sock");
  clients.push(client);
  const started = Date.now();
  const error = await client.waitReady(700).then(
    () => assert.fail("waitReady resolved"),
    (e: unknown) => e,
  );
  const elapsed = Date.now() - started;
  assert.ok(error instanceof NotReadyError, `not a NotReadyError: ${error}`);
  assert.equal(error.code, status.UNAVAILABLE);
  assert.match(error.message, /^UNAVAILABLE: consistd at \/nonexistent\/consistd\.sock not ready within 700 ms: .+/);
  assert.ok(elapsed >= 600 && elapsed < 5_000, `gave up after ${elapsed} ms`);
});

test("a watch with an empty resource fails with INVALID_ARGUMENT naming the field", async () => {
  const client = new Client();
  clients.push(client);
  const error = await (async () => {
    for await (const _ of client.watch({ resource: "" })) assert.fail("the watch delivered an event");
  })().then(
    () => assert.fail("the watch ended without an error"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof ConsistdError, `not a ConsistdError: ${error}`);
  assert.equal(error.code, status.INVALID_ARGUMENT);
  assert.equal(error.codeName, "INVALID_ARGUMENT");
  assert.match(error.details, /^resource/);
});

test("a list answer larger than 4 MiB comes back whole", async () => {
  // gRPC clients refuse answers over 4 MiB by default; the SDK's channel takes any size the sidecar sends.
  const client = new Client();
  clients.push(client);
  const ns = await freshNamespace(client);
  const value = "x".repeat(900 * 1024);
  const names = Array.from({ length: 6 }, (_, i) => `big-${i}`);
  try {
    for (const name of names) {
      await client.objects.create({ resource: "configmaps", namespace: ns, object: configMap(name, { v: value }) });
    }
    const listed = await client.objects.list({ resource: "configmaps", namespace: ns });
    assert.deepEqual(listed.items.map((o) => o.name).sort(), names);
    for (const o of listed.items) assert.ok(o.json.data.v === value && Object.keys(o.json.data).length === 1, `${o.name} lost data`);
    const size = listed.items.reduce((sum, o) => sum + o.raw.byteLength, 0);
    assert.ok(size > 4 * 1024 * 1024, `the objects' JSON adds up to ${size} bytes, not more than 4 MiB`);
  } finally {
    // No namespace controller runs in the test control plane: delete the ConfigMaps themselves.
    for (const name of names) await client.objects.delete({ resource: "configmaps", namespace: ns, name }).catch(() => {});
    await dropNamespace(client, ns);
  }
});

test("objects are written and read as JSON, and a missing one is NOT_FOUND", async () => {
  const client = new Client();
  clients.push(client);
  const ns = await freshNamespace(client);
  try {
    const created = await client.objects.create({ resource: "configmaps", namespace: ns, object: configMap("cfg", { a: "1" }) });
    assert.equal(created.name, "cfg");
    assert.equal(created.json.data.a, "1");
    const patched = await client.objects.patch({ resource: "configmaps", namespace: ns, name: "cfg", patch: { data: { b: "2" } } });
    assert.deepEqual(patched.json.data, { a: "1", b: "2" });
    assert.notEqual(patched.resourceVersion, created.resourceVersion);
    const got = await client.objects.get({ resource: "configmaps", namespace: ns, name: "cfg", readYourWrites: true });
    assert.equal(got.resourceVersion, patched.resourceVersion);
    const listed = await client.objects.list({ resource: "configmaps", namespace: ns, fieldSelector: "metadata.name=cfg" });
    assert.deepEqual(listed.items.map((o) => o.name), ["cfg"]);
    await client.objects.delete({ resource: "configmaps", namespace: ns, name: "cfg" });
    const error = await client.objects.get({ resource: "configmaps", namespace: ns, name: "cfg" }).then(
      () => assert.fail("got a deleted object"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof ConsistdError && error.code === status.NOT_FOUND, `not NOT_FOUND: ${error}`);
  } finally {
    await dropNamespace(client, ns);
  }
});

test("an update or patch that would change nothing comes back unchanged, unless sent anyway; a change never does", async () => {
  const client = new Client();
  clients.push(client);
  const ns = await freshNamespace(client);
  const stop = new AbortController();
  try {
    const target = { resource: "configmaps", namespace: ns };
    const created = await client.objects.create({ ...target, object: configMap("cfg", { a: "1" }) });
    assert.equal(created.unchanged, false);
    // The sidecar answers a no-op write from a synced watch's cache only, when one holds the object.
    const events = client.watch({ ...target, mode: Mode.CONSISTENT }, { signal: stop.signal });
    await until(events, "SYNCED", (e) => e.type === EventType.SYNCED);

    const patched = await client.objects.patch({ ...target, name: "cfg", patch: { data: { a: "1" } } });
    assert.equal(patched.unchanged, true, "a merge patch that changes nothing is answered from the cache");
    assert.equal(patched.resourceVersion, created.resourceVersion, "the cached object");
    assert.deepEqual(patched.json.data, { a: "1" });
    const updated = await client.objects.update({ ...target, object: created.json });
    assert.equal(updated.unchanged, true, "the object as created, written back, changes nothing");
    // Recorded as an own write at the cached version: it predates nothing, and holds back nothing newer.
    assert.equal(client.predatesOwnWrite(updated), false);

    const sentPatch = await client.objects.patch({ ...target, name: "cfg", patch: { data: { a: "1" } }, sendUnchanged: true });
    assert.equal(sentPatch.unchanged, false, "sendUnchanged: the apiserver answered the patch");
    const sentUpdate = await client.objects.update({ ...target, object: created.json, sendUnchanged: true });
    assert.equal(sentUpdate.unchanged, false, "sendUnchanged: the apiserver answered the update");

    const changed = await client.objects.patch({ ...target, name: "cfg", patch: { data: { a: "2" } } });
    assert.equal(changed.unchanged, false);
    assert.ok(BigInt(changed.resourceVersion) > BigInt(created.resourceVersion), "a new version");
    // The watch hands the app the change's state after the unchanged answers, as its own write.
    const taken = await until(events, "the change", (e) => e.object?.resourceVersion === changed.resourceVersion);
    const last = taken[taken.length - 1];
    assert.equal(last.consistency, Consistency.OWN_WRITE);
    assert.equal(last.object!.unchanged, false, "only a write's answer is ever unchanged");
    assert.deepEqual(last.object!.json.data, { a: "2" });
    const got = await client.objects.get({ ...target, name: "cfg" });
    assert.equal(got.unchanged, false);
  } finally {
    stop.abort();
    await dropNamespace(client, ns);
  }
});
