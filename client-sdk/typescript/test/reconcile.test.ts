// The reconciler against real daemons: each key once and never two passes of one key at a time, one more pass
// for a change during a pass, RETRY / REQUEUE / TERMINAL from how the handler ends, writes through item.objects
// naming the lease, a refused spec, a lease that times out, stopping, a daemon restart, a queue with a change filter
// (only a change of a part it names queues a pass), and a queue with an election (work only while this daemon leads;
// each item's term and guard).
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  Client,
  ConsistdError,
  Consistency,
  type Guard,
  type Leadership,
  type ReconcileHandler,
  type ReconcileOptions,
  type ReconcileSpec,
  type RelatedSpec,
  requeueAfter,
  status,
  TerminalError,
  type WorkItem,
} from "@consistd/client";
import { consistencyHolds, dropNamespace, env, freshNamespace, OwnDaemon, unique, until, watchPosition, within } from "./helpers.js";

const clients: Client[] = [];
after(() => clients.forEach((c) => c.close()));
function client(socket?: string): Client {
  const c = new Client(socket);
  clients.push(c);
  return c;
}

/** The label every primary of these tests carries (a namespace may hold other ConfigMaps, e.g. kube-root-ca.crt). */
const PRIMARY = "role=primary";

/** A ConfigMap the queues below take as a primary. */
function primary(name: string, data: Record<string, string> = {}): object {
  return { metadata: { name, labels: { role: "primary" } }, data };
}

/** A queue of the primaries in `ns`. */
function queue(ns: string, extra: Partial<ReconcileSpec> = {}): ReconcileSpec {
  return { name: unique("q"), resource: "configmaps", namespace: ns, labelSelector: PRIMARY, ...extra };
}

/** One call of the handler, as the handler saw it. */
interface Pass {
  name: string;
  attempt: number;
  lastError: string;
  consistency: Consistency;
  consistencyName: string;
  term: bigint;
  guard?: Guard;
  resourceVersion?: string;
  data?: Record<string, string>;
  started: number;
  ended?: number;
}

/** Wraps a handler: records each pass, and every time a pass started while another pass of its key ran. */
class Recorder {
  readonly passes: Pass[] = [];
  /** Keys a pass started for while another pass of the same key was running: must stay empty. */
  readonly overlaps: string[] = [];
  /** The most passes that ran at once. */
  maxRunning = 0;
  private readonly running = new Map<string, number>();

  wrap(handler: (item: WorkItem, pass: Pass) => ReturnType<ReconcileHandler>): ReconcileHandler {
    return async (item) => {
      const runs = this.running.get(item.key) ?? 0;
      if (runs > 0) this.overlaps.push(item.key);
      this.running.set(item.key, runs + 1);
      this.maxRunning = Math.max(this.maxRunning, [...this.running.values()].reduce((a, b) => a + b, 0));
      const pass: Pass = {
        name: item.name,
        attempt: item.attempt,
        lastError: item.lastError,
        consistency: item.consistency,
        consistencyName: item.consistencyName,
        term: item.term,
        guard: item.guard,
        resourceVersion: item.object?.resourceVersion,
        data: item.object?.json.data,
        started: Date.now(),
      };
      this.passes.push(pass);
      try {
        return await handler(item, pass);
      } finally {
        pass.ended = Date.now();
        this.running.set(item.key, (this.running.get(item.key) ?? 1) - 1);
      }
    };
  }

  of(name: string): Pass[] {
    return this.passes.filter((p) => p.name === name);
  }

  /** Waits until `done()` holds, failing after `ms`. */
  async until(what: string, done: () => boolean, ms = 20_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!done()) {
      if (Date.now() > deadline) {
        throw new Error(`timed out after ${ms} ms waiting for ${what}; passes: ${this.show()}`);
      }
      await sleep(20);
    }
  }

  show(): string {
    const shown = this.passes.map(({ name, attempt, lastError }) => ({ name, attempt, lastError: lastError.slice(0, 40) }));
    return JSON.stringify(shown);
  }
}

/** A running reconciler: `stop()` aborts it and waits until its promise settles (rethrowing its error). */
class Running {
  settled = false;
  error?: unknown;
  readonly done: Promise<void>;
  private readonly abort = new AbortController();

  constructor(c: Client, spec: ReconcileSpec, handler: ReconcileHandler, options: ReconcileOptions = {}) {
    this.done = c.reconcile(spec, handler, { ...options, signal: this.abort.signal }).then(
      () => {
        this.settled = true;
      },
      (error: unknown) => {
        this.settled = true;
        this.error = error;
      },
    );
  }

  /** Fails if the reconciler already ended. */
  assertRunning(): void {
    assert.equal(this.error, undefined, `the reconciler failed: ${this.error}`);
    assert.ok(!this.settled, "the reconciler ended by itself");
  }

  async stop(): Promise<void> {
    this.abort.abort();
    await within(20_000, "the reconciler to stop", this.done);
    if (this.error) throw this.error;
  }
}

/** A promise and its resolve function. */
function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

test("each key is handled once, a change during a pass gives exactly one more, and never two passes of a key at once", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const target = { resource: "configmaps", namespace: ns };
  const calls = new Recorder();
  const aHeld = gate();
  const aRelease = gate();
  let running: Running | undefined;
  try {
    for (const name of ["a", "b", "c"]) await c.objects.create({ ...target, object: primary(name, { v: "0" }) });
    running = new Running(
      c,
      queue(ns, { maxLeases: 3 }),
      calls.wrap(async (item) => {
        if (item.name === "a" && calls.of("a").length === 1) {
          aHeld.open();
          await aRelease.promise;
        }
      }),
    );
    await calls.until("a, b and c", () => calls.passes.length >= 3);
    assert.deepEqual(calls.passes.map((p) => p.name).sort(), ["a", "b", "c"], "each key once");
    assert.ok(calls.passes.every((p) => p.attempt === 1 && p.lastError === ""), calls.show());
    for (const p of calls.passes) {
      assert.deepEqual([p.term, p.guard], [0n, undefined], "no election: term 0 and no guard");
      assert.deepEqual([p.consistency, p.consistencyName], [Consistency.CONSISTENT, "CONSISTENT"]);
    }
    await within(10_000, "a's first pass", aHeld.promise);
    // Three changes while a's pass runs: not a second pass now, one after it.
    for (const v of ["1", "2", "3"]) await c.objects.patch({ ...target, name: "a", patch: { data: { v } } });
    await sleep(1_500);
    assert.equal(calls.of("a").length, 1, `no second pass of a while its first runs: ${calls.show()}`);
    aRelease.open();
    await calls.until("a's second pass", () => calls.of("a").length >= 2);
    assert.equal(calls.of("a")[1].data?.v, "3", "the state when the pass was granted, after every change");
    await sleep(2_000);
    assert.deepEqual(
      ["a", "b", "c"].map((n) => calls.of(n).length),
      [2, 1, 1],
      `exactly one more pass of a, none of b and c: ${calls.show()}`,
    );
    assert.deepEqual(calls.overlaps, [], "two passes of one key at once");
    assert.ok(calls.maxRunning <= 3, `at most maxLeases at once, saw ${calls.maxRunning}`);
    running.assertRunning();
  } finally {
    aRelease.open();
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("a handler that throws is called again after the backoff with attempt 2 and its error; a long one is cut to 4096 bytes", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const calls = new Recorder();
  const long = "é".repeat(3_000); // 6000 bytes of UTF-8
  let running: Running | undefined;
  try {
    await c.objects.create({ resource: "configmaps", namespace: ns, object: primary("obj") });
    running = new Running(
      c,
      queue(ns, { retry: { baseDelayMs: 200 } }),
      calls.wrap(async () => {
        const n = calls.passes.length;
        if (n === 1) throw new Error("the backend said no");
        if (n === 2) throw new Error(long);
      }),
    );
    await calls.until("three passes", () => calls.passes.length >= 3);
    const [first, second, third] = calls.passes;
    assert.deepEqual([first.attempt, first.lastError], [1, ""]);
    assert.deepEqual([second.attempt, second.lastError], [2, "the backend said no"]);
    assert.ok(second.started - first.ended! >= 200, `after the 200 ms backoff: ${second.started - first.ended!} ms`);
    assert.equal(third.attempt, 3);
    const bytes = Buffer.byteLength(third.lastError, "utf8");
    assert.ok(bytes <= 4096 && bytes >= 4094, `cut to at most 4096 bytes, whole characters: ${bytes}`);
    assert.ok(long.startsWith(third.lastError), "the start of the message");
    await sleep(1_000);
    assert.equal(calls.passes.length, 3, `the third pass succeeded: ${calls.show()}`);
    running.assertRunning();
  } finally {
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("requeueAfter rounds up to whole milliseconds, takes 0 as 1 ms and caps at a day; a negative delay throws", () => {
  assert.equal(requeueAfter(0).afterMs, 1);
  assert.equal(requeueAfter(0.2).afterMs, 1);
  assert.equal(requeueAfter(1.5).afterMs, 2);
  assert.equal(requeueAfter(30_000).afterMs, 30_000);
  assert.equal(requeueAfter(2 * 86_400_000).afterMs, 86_400_000);
  for (const bad of [-1, -0.5, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
    assert.throws(() => requeueAfter(bad), RangeError, `requeueAfter(${bad})`);
  }
});

test("requeueAfter(300) hands the key out again after at least 300 ms", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const calls = new Recorder();
  let running: Running | undefined;
  try {
    await c.objects.create({ resource: "configmaps", namespace: ns, object: primary("obj") });
    running = new Running(
      c,
      queue(ns),
      calls.wrap(() => (calls.passes.length === 1 ? requeueAfter(300) : undefined)),
    );
    await calls.until("the pass after the requeue", () => calls.passes.length >= 2);
    const [first, second] = calls.passes;
    const waited = second.started - first.ended!;
    assert.ok(waited >= 300, `requeued after ${waited} ms`);
    assert.ok(waited < 5_000, `requeued after ${waited} ms`);
    assert.equal(second.lastError, "");
    await sleep(1_000);
    assert.equal(calls.passes.length, 2, `done after the second pass: ${calls.show()}`);
    running.assertRunning();
  } finally {
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("a TerminalError leaves the key alone until its object changes", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const target = { resource: "configmaps", namespace: ns };
  const calls = new Recorder();
  let running: Running | undefined;
  try {
    await c.objects.create({ ...target, object: primary("obj", { v: "0" }) });
    running = new Running(
      c,
      queue(ns), // default retry: a RETRY would come back within milliseconds
      calls.wrap(() => {
        if (calls.passes.length === 1) throw new TerminalError("this can never work");
      }),
    );
    await calls.until("the first pass", () => calls.passes.length >= 1);
    await sleep(2_000);
    assert.equal(calls.passes.length, 1, `not handed out again: ${calls.show()}`);
    await c.objects.patch({ ...target, name: "obj", patch: { data: { v: "1" } } });
    await calls.until("the pass after the change", () => calls.passes.length >= 2);
    assert.equal(calls.passes[1].data?.v, "1");
    assert.equal(calls.passes[1].attempt, 1);
    running.assertRunning();
  } finally {
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("a queue filtering on labels hands out an object's first state, then not a change of its data, then a label change", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const target = { resource: "configmaps", namespace: ns, name: "obj" };
  const calls = new Recorder();
  let running: Running | undefined;
  try {
    await c.objects.create({ ...target, object: primary("obj", { v: "0" }) });
    running = new Running(c, queue(ns, { onlyChangesOf: { labels: true } }), calls.wrap(() => {}));
    await calls.until("the first state", () => calls.passes.length >= 1);
    assert.equal(calls.passes[0].data?.v, "0");
    await c.objects.patch({ ...target, patch: { data: { v: "1" } } });
    await sleep(2_000);
    assert.equal(calls.passes.length, 1, `a change of the data (not named) was handed out: ${calls.show()}`);
    await c.objects.patch({ ...target, patch: { metadata: { labels: { tier: "web" } } } });
    await calls.until("the pass after the label change", () => calls.passes.length >= 2);
    assert.equal(calls.passes[1].data?.v, "1", "the state after both changes");
    assert.equal(calls.passes[1].attempt, 1);
    running.assertRunning();
  } finally {
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("the pass after a handler's own patch through item.objects carries that patch or newer", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const calls = new Recorder();
  const written: string[] = [];
  let running: Running | undefined;
  try {
    await c.objects.create({ resource: "configmaps", namespace: ns, object: primary("obj", { round: "0" }) });
    running = new Running(
      c,
      queue(ns),
      calls.wrap(async (item) => {
        const round = calls.passes.length;
        if (round > 3) return;
        // Someone else's change during the pass brings the key once more (the pass's own write would not),
        // and that next pass must carry the own write made after it.
        await c.objects.patch({
          resource: "configmaps",
          namespace: item.namespace,
          name: item.name,
          patch: { data: { third: String(round) } },
        });
        const patched = await item.objects.patch({
          resource: "configmaps",
          namespace: item.namespace,
          name: item.name,
          patch: { data: { round: String(round) } },
        });
        written.push(patched.resourceVersion);
      }),
    );
    await calls.until("four passes", () => calls.passes.length >= 4);
    for (let round = 1; round <= 3; round++) {
      const next = calls.passes[round];
      assert.ok(
        BigInt(next.resourceVersion!) >= BigInt(written[round - 1]),
        `pass ${round + 1} got ${next.resourceVersion}, older than the write ${written[round - 1]}`,
      );
      assert.equal(next.data?.round, String(round));
      assert.equal(next.consistency, Consistency.CONSISTENT);
    }
    running.assertRunning();
  } finally {
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("writes through item.objects name the lease: the next pass is held for a write the queue's watches never show", async () => {
  // The queue has a related watch of TLS Secrets: the daemon cannot judge a `type` field selector itself, so
  // a Secret written for a lease is waited for on that watch, which never delivers it (it is Opaque). Named by
  // the lease, the key's next pass is held, and the daemon counts the hold in the queue's
  // consistd_workqueue_consistency_holds_total; not named, the pass is not held and the count stays 0.
  // How long the hold lasts is the apiserver's to say: until a bookmark moves that watch past the write, or
  // consistency.timeout (5 s in hack/with-daemons.sh), whichever comes first. A new watch gets a bookmark about
  // every second until one at or past its list's version went out, then about once a minute (Kubernetes' watch
  // cache); so the write waits until the watch has listed and 2 s more, and the pass then comes TIMED_OUT after
  // the whole timeout, or CONSISTENT when a minutely bookmark happens to come first. (One that came in the
  // milliseconds between the write and the requeued key's grant would leave the pass not held at all.)
  const c = client();
  const admin = env("CONSISTD_TEST_ADMIN_SOCKET");
  const ns = await freshNamespace(c, "ts-rec");
  const calls = new Recorder();
  let running: Running | undefined;
  try {
    await c.objects.create({ resource: "configmaps", namespace: ns, object: primary("obj") });
    const related = [{ resource: "secrets", namespace: ns, fieldSelector: "type=kubernetes.io/tls", label: "owner" }];
    const spec = queue(ns, { related });
    running = new Running(
      c,
      spec,
      calls.wrap(async (item) => {
        if (calls.passes.length > 1) return;
        const deadline = Date.now() + 20_000;
        while ((await watchPosition(admin, "v1/secrets", ns)) === 0) {
          if (Date.now() > deadline) throw new Error("the queue's watch of Secrets did not list within 20 s");
          await sleep(50);
        }
        await sleep(2_000);
        const unwatched = { metadata: { name: "unwatched", labels: { owner: item.name } }, type: "Opaque" };
        await item.objects.create({ resource: "secrets", namespace: ns, object: unwatched });
        return requeueAfter(1);
      }),
    );
    await calls.until("the second pass", () => calls.passes.length >= 2, 30_000);
    const [first, second] = calls.passes;
    assert.equal(first.consistency, Consistency.CONSISTENT);
    assert.equal(second.lastError, "", "the first pass ended without an error");
    // Read while the queue runs: the daemon drops a queue's series when it stops.
    const holds = await consistencyHolds(admin, spec.name);
    const held = second.started - first.ended!;
    assert.ok(holds >= 1, `the second pass was not held for the lease's write (${holds} holds; it came after ${held} ms)`);
    if (second.consistency === Consistency.TIMED_OUT) {
      assert.equal(second.consistencyName, "TIMED_OUT");
      assert.ok(held >= 3_000, `held for consistency.timeout, not ${held} ms`);
    } else {
      // A bookmark moved the watch past the write before the timeout.
      assert.equal(second.consistencyName, "CONSISTENT", `held ${held} ms`);
    }
    running.assertRunning();
  } finally {
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("a spec the daemon refuses rejects with its code and the field, and no handler runs", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const never: ReconcileHandler = () => assert.fail("the handler ran");
  const refused = async (spec: ReconcileSpec): Promise<ConsistdError> => {
    const error = await within(10_000, `the refusal of ${JSON.stringify(spec)}`, c.reconcile(spec, never)).then(
      () => assert.fail("reconcile resolved"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof ConsistdError, `not a ConsistdError: ${error}`);
    return error;
  };
  try {
    let error = await refused(queue(ns, { name: "Not_A_Label" }));
    assert.deepEqual([error.code, error.details.split(":")[0]], [status.INVALID_ARGUMENT, "spec.name"], error.message);
    error = await refused(queue(ns, { maxLeases: 0 }));
    assert.deepEqual([error.code, error.details.split(":")[0]], [status.INVALID_ARGUMENT, "spec.max_leases"], error.message);
    error = await refused(queue(ns, { related: [{ resource: "configmaps" } as RelatedSpec] }));
    assert.deepEqual(
      [error.code, error.details.split(":")[0]],
      [status.INVALID_ARGUMENT, "spec.related[0].maps_by"],
      error.message,
    );
    error = await refused(queue(ns, { resource: "nosuchthings" }));
    assert.deepEqual([error.code, error.details.split(":")[0]], [status.NOT_FOUND, "spec.primary"], error.message);
    // The same name with another spec, while the queue runs.
    await c.objects.create({ resource: "configmaps", namespace: ns, object: primary("obj") });
    const spec = queue(ns);
    const calls = new Recorder();
    const running = new Running(c, spec, calls.wrap(() => {}));
    try {
      await calls.until("a pass of the running queue", () => calls.passes.length >= 1);
      error = await refused({ ...spec, labelSelector: "role=other" });
      assert.deepEqual([error.code, error.details.split(":")[0]], [status.FAILED_PRECONDITION, "spec"], error.message);
    } finally {
      await running.stop();
    }
  } finally {
    await dropNamespace(c, ns);
  }
});

test("a lease that times out: its completion is refused and logged, and the key waits for the running pass", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const calls = new Recorder();
  const warnings: string[] = [];
  let abortedAfter: number | undefined;
  let reason: unknown;
  let running: Running | undefined;
  try {
    await c.objects.create({ resource: "configmaps", namespace: ns, object: primary("obj") });
    running = new Running(
      c,
      // Two leases: the daemon may hand the key to this stream again while the timed-out pass still runs.
      queue(ns, { maxLeases: 2, leaseTimeoutMs: 2_000 }),
      calls.wrap(async (item, pass) => {
        if (calls.passes.length > 1) return;
        item.signal.addEventListener("abort", () => {
          abortedAfter = Date.now() - pass.started;
          reason = item.signal.reason;
        });
        await sleep(3_000);
      }),
      { warn: (message) => warnings.push(message) },
    );
    await calls.until("the pass after the timed-out one", () => calls.passes.length >= 2);
    const [first, second] = calls.passes;
    assert.deepEqual(calls.overlaps, [], "the second pass started while the first ran");
    assert.ok(second.started >= first.ended!, "the second pass waited for the first");
    const timely = abortedAfter !== undefined && abortedAfter >= 1_900 && abortedAfter < 2_900;
    assert.ok(timely, `item.signal aborted at ${abortedAfter} ms`);
    assert.ok(reason instanceof ConsistdError && reason.code === status.DEADLINE_EXCEEDED, `${reason}`);
    await within(5_000, "the warning", (async () => {
      while (warnings.length === 0) await sleep(20);
    })());
    assert.match(warnings[0], /refused: FAILED_PRECONDITION: complete\.lease_id/);
    running.assertRunning();
  } finally {
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("at most maxLeases passes at once, even while a timed-out lease's handler still runs", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const calls = new Recorder();
  let running: Running | undefined;
  try {
    for (const name of ["a", "b"]) {
      await c.objects.create({ resource: "configmaps", namespace: ns, object: primary(name) });
    }
    running = new Running(
      c,
      // One lease: when the first pass's lease times out the daemon hands this stream another key.
      queue(ns, { maxLeases: 1, leaseTimeoutMs: 2_000 }),
      calls.wrap(async () => {
        if (calls.passes.length === 1) await sleep(3_000);
      }),
      { warn: () => {} },
    );
    // A change puts the other key ahead of the first one, which goes back to the queue when its lease times out.
    await calls.until("the first pass", () => calls.passes.length >= 1);
    const other = calls.passes[0].name === "a" ? "b" : "a";
    await c.objects.patch({ resource: "configmaps", namespace: ns, name: other, patch: { data: { v: "1" } } });
    await calls.until("both keys", () => new Set(calls.passes.map((p) => p.name)).size === 2);
    const [first, second] = calls.passes;
    assert.equal(second.name, other);
    assert.equal(calls.maxRunning, 1, `${calls.maxRunning} passes ran at once`);
    assert.ok(second.started >= first.ended!, "the second pass started while the first ran");
    running.assertRunning();
  } finally {
    await running?.stop();
    await dropNamespace(c, ns);
  }
});

test("stopping waits for the running pass and sends its outcome; another process of the queue then takes the key", async () => {
  const c = client();
  const other = client();
  const ns = await freshNamespace(c, "ts-rec");
  const spec = queue(ns);
  const first = new Recorder();
  const second = new Recorder();
  const release = gate();
  let sawAbort = false;
  let b: Running | undefined;
  try {
    await c.objects.create({ resource: "configmaps", namespace: ns, object: primary("obj") });
    const a = new Running(
      c,
      spec,
      first.wrap(async (item) => {
        await release.promise;
        sawAbort = item.signal.aborted;
        throw new Error("stopped before it was done");
      }),
    );
    await first.until("the first process's pass", () => first.passes.length >= 1);
    b = new Running(other, spec, second.wrap(() => {}));
    await sleep(500);
    const stopping = a.stop();
    await sleep(500);
    assert.ok(!a.settled, "stop() resolved while a pass ran");
    assert.equal(second.passes.length, 0, "the key went to the other process while the first worked on it");
    release.open();
    await stopping;
    assert.ok(sawAbort, "item.signal aborted when stopping");
    await second.until("the other process's pass", () => second.passes.length >= 1);
    assert.deepEqual(
      [second.passes[0].attempt, second.passes[0].lastError],
      [2, "stopped before it was done"],
      "the stopped pass's RETRY was sent before the stream ended",
    );
    b.assertRunning();
  } finally {
    release.open();
    await b?.stop();
    await dropNamespace(c, ns);
  }
});

test("a daemon restart: the reconciler opens the queue again and goes on", async () => {
  const daemon = new OwnDaemon(unique("sdk-ts-reconcile"));
  const direct = client();
  const ns = await freshNamespace(direct, "ts-rec");
  const target = { resource: "configmaps", namespace: ns };
  const calls = new Recorder();
  let running: Running | undefined;
  try {
    await direct.objects.create({ ...target, object: primary("before") });
    await daemon.start();
    const own = client(daemon.socket);
    await own.waitReady(10_000);
    running = new Running(own, queue(ns), calls.wrap(() => {}));
    await calls.until("the pass before the restart", () => calls.of("before").length >= 1);

    await daemon.stop();
    await direct.objects.create({ ...target, object: primary("during") });
    await sleep(500);
    running.assertRunning();
    await daemon.start();
    await calls.until("the pass of the object made while it was down", () => calls.of("during").length >= 1, 40_000);
    await direct.objects.create({ ...target, object: primary("after") });
    await calls.until("the pass of the object made after the restart", () => calls.of("after").length >= 1);
    assert.deepEqual(calls.overlaps, []);
    running.assertRunning();
  } finally {
    await running?.stop();
    await daemon.remove();
    await dropNamespace(direct, ns);
  }
});

/** Campaigns in `election` through `c` until it leads; `stop()` leaves the campaign (the daemon resigns). */
class Campaign {
  private readonly abort = new AbortController();
  private readonly states: AsyncGenerator<Leadership, void>;

  private constructor(c: Client, election: string, namespace: string | undefined) {
    this.states = c.campaign(election, { namespace, signal: this.abort.signal });
  }

  /** Campaigns and resolves once it leads, with that state. */
  static async lead(c: Client, election: string, namespace?: string): Promise<[Campaign, Leadership]> {
    const campaign = new Campaign(c, election, namespace);
    try {
      const [leading] = (await until(campaign.states, `to lead ${election}`, (s) => s.isLeader, 30_000)).slice(-1);
      return [campaign, leading];
    } catch (error) {
      await campaign.stop();
      throw error;
    }
  }

  async stop(): Promise<void> {
    this.abort.abort();
    await within(10_000, "the campaign to end", this.states.return());
  }
}

test("with an election, work is handed out only while this daemon leads, each item with its term and a guard whose write succeeds", async () => {
  const c = client(); // daemon a: the reconciler's
  const peer = client(env("CONSISTD_TEST_PEER_SOCKET")); // daemon b: another pod of the controller
  const ns = await freshNamespace(c, "ts-rec");
  const target = { resource: "configmaps", namespace: ns };
  const election = unique("ts-rec-election");
  const calls = new Recorder();
  /** Per pass that wrote: the guarded patch's resourceVersion, or its error. */
  const writes: unknown[] = [];
  const campaigns: Campaign[] = [];
  let running: Running | undefined;
  const passes = () => calls.passes.length;
  try {
    await c.objects.create({ ...target, object: primary("obj", { v: "0" }) });
    running = new Running(
      c,
      queue(ns, { election: { name: election, namespace: ns } }),
      calls.wrap(async (item) => {
        if (item.object?.json.data?.by === String(item.term)) return; // this term's write is done
        try {
          const patch = { data: { by: String(item.term) } };
          const patched = await item.objects.patch({ ...target, name: item.name, patch, guard: item.guard });
          writes.push(patched.resourceVersion);
        } catch (error) {
          writes.push(error);
          throw error;
        }
      }),
    );

    // Nobody campaigns: no work.
    await sleep(2_000);
    assert.equal(passes(), 0, `work handed out while nobody led: ${calls.show()}`);
    // Daemon b leads: still none, also after a change.
    let [other, otherLeads] = await Campaign.lead(peer, election, ns);
    campaigns.push(other);
    assert.equal(otherLeads.holder, "sdk-b");
    await c.objects.patch({ ...target, name: "obj", patch: { data: { v: "1" } } });
    await sleep(2_000);
    assert.equal(passes(), 0, `work handed out while daemon b led: ${calls.show()}`);
    await other.stop();

    // This daemon leads (the app campaigning through the SDK): the key comes, in its term, with its guard.
    let [mine, leading] = await Campaign.lead(c, election, ns);
    campaigns.push(mine);
    assert.equal(leading.holder, "sdk-a");
    await calls.until("the pass while leading", () => passes() >= 1, 30_000);
    const first = calls.passes[0];
    assert.equal(first.term, leading.term, "the item's term is the leader's");
    assert.deepEqual(first.guard, { election, namespace: ns, term: leading.term });
    assert.equal(first.data?.v, "1", "the change made while daemon b led");
    await calls.until("the first pass's write", () => writes.length >= 1);
    assert.equal(typeof writes[0], "string", `the guarded write failed: ${writes[0]}`);
    // Its own write (naming its lease) gives no pass by itself; anyone else's change gives one more, in the
    // same term, which has nothing to write.
    await c.objects.patch({ ...target, name: "obj", patch: { data: { other: "yes" } } });
    await calls.until("the pass after another's change", () => passes() >= 2);
    assert.equal(calls.passes[1].term, leading.term);
    assert.equal(calls.passes[1].data?.by, String(leading.term));
    let stored = await c.objects.get<{ data: Record<string, string> }>({ ...target, name: "obj" });
    assert.equal(stored.json.data.by, String(leading.term), "the guarded write is stored");

    // This daemon resigns and b leads: no more work here, and the old term's guard is refused.
    await mine.stop();
    [other, otherLeads] = await Campaign.lead(peer, election, ns);
    campaigns.push(other);
    assert.ok(otherLeads.term > leading.term, `term ${otherLeads.term} after ${leading.term}`);
    const handed = passes();
    await c.objects.patch({ ...target, name: "obj", patch: { data: { v: "2" } } });
    await sleep(2_000);
    assert.equal(passes(), handed, `work handed out after this daemon resigned: ${calls.show()}`);
    const stale = c.objects.patch({ ...target, name: "obj", patch: { data: { by: "stale" } }, guard: first.guard });
    const refused = await stale.then(
      () => assert.fail("a write guarded by an ended term succeeded"),
      (error: unknown) => error,
    );
    assert.ok(refused instanceof ConsistdError && refused.code === status.FAILED_PRECONDITION, `${refused}`);
    await other.stop();

    // This daemon leads again: the change made meanwhile comes, in the new term, with the new term's guard.
    [mine, leading] = await Campaign.lead(c, election, ns);
    campaigns.push(mine);
    assert.ok(leading.term > otherLeads.term, `term ${leading.term} after ${otherLeads.term}`);
    await calls.until("the pass after leading again", () => passes() > handed, 30_000);
    const again = calls.passes[handed];
    assert.equal(again.data?.v, "2");
    assert.equal(again.term, leading.term);
    assert.deepEqual(again.guard, { election, namespace: ns, term: leading.term });
    await calls.until("its write", () => writes.length >= 2);
    assert.equal(typeof writes[1], "string", `the guarded write failed: ${writes[1]}`);
    stored = await c.objects.get<{ data: Record<string, string> }>({ ...target, name: "obj" });
    assert.equal(stored.json.data.by, String(leading.term));
    assert.deepEqual(calls.overlaps, []);
    running.assertRunning();
  } finally {
    await running?.stop();
    for (const campaign of campaigns) await campaign.stop();
    await dropNamespace(c, ns);
  }
});

test("an election without a namespace: the guard's namespace is empty (the daemon's own) and its write succeeds", async () => {
  const c = client();
  const ns = await freshNamespace(c, "ts-rec");
  const target = { resource: "configmaps", namespace: ns };
  const election = unique("ts-rec-election"); // its Lease is in the daemon's own namespace
  const calls = new Recorder();
  const writes: unknown[] = [];
  let campaign: Campaign | undefined;
  let running: Running | undefined;
  try {
    await c.objects.create({ ...target, object: primary("obj") });
    let leading: Leadership;
    [campaign, leading] = await Campaign.lead(c, election);
    running = new Running(
      c,
      queue(ns, { election: { name: election } }),
      calls.wrap(async (item) => {
        if (calls.passes.length > 1) return;
        const patch = { data: { by: String(item.term) } };
        await item.objects.patch({ ...target, name: item.name, patch, guard: item.guard }).then(
          (patched) => writes.push(patched.resourceVersion),
          (error: unknown) => writes.push(error),
        );
      }),
    );
    await calls.until("the pass while leading", () => calls.passes.length >= 1);
    const [first] = calls.passes;
    assert.equal(first.term, leading.term);
    assert.deepEqual(first.guard, { election, namespace: "", term: leading.term });
    await calls.until("its write", () => writes.length >= 1);
    assert.equal(typeof writes[0], "string", `the guarded write failed: ${writes[0]}`);
    running.assertRunning();
  } finally {
    await running?.stop();
    await campaign?.stop();
    await dropNamespace(c, ns);
  }
});
