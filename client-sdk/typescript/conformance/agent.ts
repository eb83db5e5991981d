// The TypeScript SDK's conformance agent: serves the agent protocol of client-sdk/conformance/README.md with
// one `Client` on CONSISTD_SOCKET, using the SDK's public API only, as an app would.
//
//   CONSISTD_SOCKET=/path/to/consistd.sock node build/conformance/agent.js
//
// Commands come one JSON object per line on stdin; each is handled concurrently with the others and answered
// with one JSON line on stdout ({"id", "ok"} or {"id", "error": {"code", "message"}}), and watches and
// campaigns print lines of their own ({"stream", "item"} or {"stream", "error"}), as do reconcilers, whose
// handler prints each work item and waits for the `handle` of its name. Anything else goes to stderr. The
// agent exits 0 once stdin closes. hack/sdk/typescript.sh conformance runs the suite with it.
import { createInterface } from "node:readline";
import {
  type ChangeFilter,
  Client,
  type Condition,
  ConsistdError,
  type Guard,
  type Latest,
  Mode,
  type ObjectEvent,
  PatchType,
  type ReconcileSpec,
  type Sent,
  status,
  type Taken,
  type WatchEvent,
  type WorkItem,
} from "@consistd/client";

/** A JSON value as the protocol carries it. */
type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** One command: its number `id`, its `op`, and the op's fields. */
type Command = { [key: string]: Json };

/** What a failed command or stream reports: the gRPC code's canonical name and a message. */
type Failure = { code: string; message: string };

/** A command the agent refuses before it reaches the SDK (unknown op, missing or mistyped field). */
class InvalidArgument extends Error {}

/** The agent's failure for `error`: a ConsistdError keeps the SDK's code; anything else is UNKNOWN. */
function failure(error: unknown): Failure {
  if (error instanceof ConsistdError) return { code: error.codeName, message: error.details };
  if (error instanceof InvalidArgument) return { code: "INVALID_ARGUMENT", message: error.message };
  return { code: "UNKNOWN", message: error instanceof Error ? `${error.name}: ${error.message}` : String(error) };
}

/**
 * Prints one protocol line, in a single write so that lines of concurrent commands never interleave (and
 * stdout to a pipe is written synchronously on Linux, so nothing printed is lost when the agent exits).
 */
function print(line: Json): void {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

/** A stream's line for an error that ended it. */
function streamError(stream: string, error: unknown): void {
  print({ stream, error: failure(error) });
}

/** A watch event as the protocol prints it: type without a prefix; name and resourceVersion empty for markers. */
function eventItem(event: WatchEvent): Json {
  return {
    type: event.typeName,
    name: event.object?.name ?? "",
    resourceVersion: event.object?.resourceVersion ?? "",
    predatesOwnWrite: event.predatesOwnWrite,
    previousResourceVersion: event.previousResourceVersion,
  };
}

// Field readers: a missing or mistyped field answers INVALID_ARGUMENT, as the protocol asks.

function text(command: Command, name: string): string {
  const value = command[name];
  if (typeof value !== "string") throw new InvalidArgument(`${name}: must be a string`);
  return value;
}

function wholeNumber(command: Command, name: string): number {
  const value = command[name];
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) {
    throw new InvalidArgument(`${name}: must be a whole number`);
  }
  return value;
}

function flag(command: Command, name: string): boolean {
  const value = command[name];
  if (typeof value !== "boolean") throw new InvalidArgument(`${name}: must be a boolean`);
  return value;
}

/** The `guard` field: `{"election", "namespace", "term"}`, undefined when absent or null. */
function guard(command: Command): Guard | undefined {
  const value = command.guard;
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "object" || Array.isArray(value)) {
    throw new InvalidArgument("guard: must be a JSON object or null");
  }
  const { term } = value;
  if (typeof term !== "number" || !Number.isInteger(term) || term < 0) {
    throw new InvalidArgument("guard.term: must be a whole number");
  }
  return { election: text(value, "election"), namespace: text(value, "namespace"), term };
}

/**
 * The `changes` field: `{"generation", "labels", "annotations"}` booleans (a missing one false), undefined when
 * absent or null.
 */
function changes(command: Command): ChangeFilter | undefined {
  const value = command.changes;
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "object" || Array.isArray(value)) {
    throw new InvalidArgument("changes: must be a JSON object or null");
  }
  const part = (name: string) => {
    const named = value[name];
    if (named !== undefined && typeof named !== "boolean") {
      throw new InvalidArgument(`changes.${name}: must be a boolean`);
    }
    return named ?? false;
  };
  return { generation: part("generation"), labels: part("labels"), annotations: part("annotations") };
}

/** A condition the `handle` op sets: type, status, reason and message. */
type ItemCondition = Omit<Condition, "observedGeneration">;

/**
 * The `condition` field: `{"type", "status": "True" | "False" | "Unknown", "reason", "message"}`, null when absent
 * or null.
 */
function condition(command: Command): ItemCondition | null {
  const value = command.condition;
  if (value === undefined || value === null) return null;
  if (typeof value !== "object" || Array.isArray(value)) {
    throw new InvalidArgument("condition: must be a JSON object or null");
  }
  const part = (name: string) => {
    const named = value[name];
    if (typeof named !== "string") throw new InvalidArgument(`condition.${name}: must be a string`);
    return named;
  };
  const status = part("status");
  if (status !== "True" && status !== "False" && status !== "Unknown") {
    throw new InvalidArgument(`condition.status: ${JSON.stringify(status)} is not True, False or Unknown`);
  }
  return { type: part("type"), status, reason: part("reason"), message: part("message") };
}

/**
 * The `event` field: `{"severity": "Normal" | "Warning", "reason", "action", "note"}`, null when absent or null.
 */
function event(command: Command): Required<ObjectEvent> | null {
  const value = command.event;
  if (value === undefined || value === null) return null;
  if (typeof value !== "object" || Array.isArray(value)) {
    throw new InvalidArgument("event: must be a JSON object or null");
  }
  const part = (name: string) => {
    const named = value[name];
    if (typeof named !== "string") throw new InvalidArgument(`event.${name}: must be a string`);
    return named;
  };
  const severity = part("severity");
  if (severity !== "Normal" && severity !== "Warning") {
    throw new InvalidArgument(`event.severity: ${JSON.stringify(severity)} is not Normal or Warning`);
  }
  return { severity, reason: part("reason"), action: part("action"), note: part("note") };
}

/** A watch started with `take` false: its iterator, pulled only by `take`, one `take` at a time. */
interface Paused {
  events: AsyncIterator<WatchEvent, void>;
  /** The end of the last `take` queued on this watch; the next one starts after it. */
  turn: Promise<void>;
}

/** What a `handle` tells the reconcile handler waiting with its item's name. */
interface Handle {
  /** The JSON merge patch to write to the item's primary; null for none. */
  patch: { [key: string]: Json } | Json[] | null;
  /** The status condition to set first, through the item's helper; null for none. */
  condition: ItemCondition | null;
  /** The event to record next, through the item's helper; null for none. */
  event: Required<ObjectEvent> | null;
  /** DONE (the handler resolves) or RETRY (it throws). */
  done: boolean;
  /** Answers the `handle` with the write's result. */
  answer: (written: Promise<Json>) => void;
}

/** The key of a waiting reconcile handler: its stream and its item's name. */
function waitingKey(stream: string, name: string): string {
  return JSON.stringify([stream, name]);
}

/** The agent's state between commands, and one method per op. */
class Agent {
  /** What each `send` returned, by message id, for `outcome`. */
  private readonly sent = new Map<string, Sent>();
  /** Watches started with `take` false, by stream name. */
  private readonly paused = new Map<string, Paused>();
  /** Reconcile handlers waiting for their `handle`, by `waitingKey(stream, item name)`. */
  private readonly waiting = new Map<string, (handle: Handle) => void>();
  /** The newest-state watches, by stream name. */
  private readonly latest = new Map<string, Latest>();
  /** What each worker of a newest-state watch holds, by `waitingKey(stream, worker)`. */
  private readonly held = new Map<string, Taken>();

  constructor(private readonly client: Client) {}

  /** Runs one command and prints its answer; never rejects. */
  async run(command: Command): Promise<void> {
    const id = command.id ?? null;
    try {
      print({ id, ok: await this.dispatch(command) });
    } catch (error) {
      print({ id, error: failure(error) });
    }
  }

  private dispatch(c: Command): Promise<Json> {
    switch (c.op) {
      case "get":
        return this.get(c);
      case "patch":
        return this.patch(c);
      case "watch":
        return this.watch(c);
      case "take":
        return this.take(c);
      case "send":
        return this.send(c);
      case "outcome":
        return this.outcome(c);
      case "campaign":
        return this.campaign(c);
      case "reconcile":
        return this.reconcile(c);
      case "handle":
        return this.handle(c);
      case "latest":
        return this.openLatest(c);
      case "next":
        return this.next(c);
      case "done":
        return this.done(c);
      default:
        return Promise.reject(new InvalidArgument(`op: unknown op ${JSON.stringify(c.op ?? null)}`));
    }
  }

  /** Opens the SDK's newest-state consumer of a CONSISTENT watch. */
  private async openLatest(c: Command): Promise<Json> {
    const stream = text(c, "stream");
    this.latest.set(stream, this.client.watchLatest({ resource: text(c, "resource"), namespace: text(c, "namespace") }));
    return {};
  }

  /** A worker asks for the next object's newest state, and holds it until its `done`. */
  private async next(c: Command): Promise<Json> {
    const stream = text(c, "stream");
    const worker = text(c, "worker");
    const latest = this.latest.get(stream);
    if (!latest) throw new InvalidArgument(`stream: no newest-state watch ${JSON.stringify(stream)}`);
    const key = waitingKey(stream, worker);
    if (this.held.has(key)) throw new InvalidArgument(`worker: ${JSON.stringify(worker)} holds an object already`);
    const taken = await latest.next();
    this.held.set(key, taken);
    return eventItem(taken.event);
  }

  /** The worker is done with the object it holds. */
  private async done(c: Command): Promise<Json> {
    const key = waitingKey(text(c, "stream"), text(c, "worker"));
    const taken = this.held.get(key);
    if (!taken) throw new InvalidArgument(`worker: ${JSON.stringify(text(c, "worker"))} holds nothing`);
    this.held.delete(key);
    taken.done();
    return {};
  }

  /** Reads the object. */
  private async get(c: Command): Promise<Json> {
    const request = { resource: text(c, "resource"), namespace: text(c, "namespace"), name: text(c, "name") };
    const object = await this.client.objects.get(request);
    return { resourceVersion: object.resourceVersion };
  }

  /** Patches the object with a JSON merge patch through the objects client, so the own-write rule records it. */
  private async patch(c: Command): Promise<Json> {
    const patch = c.patch;
    if (patch === undefined || patch === null || typeof patch !== "object") {
      throw new InvalidArgument("patch: must be a JSON object");
    }
    const target = { resource: text(c, "resource"), namespace: text(c, "namespace"), name: text(c, "name") };
    const object = await this.client.objects.patch({ ...target, patch, type: PatchType.MERGE });
    return { resourceVersion: object.resourceVersion, uid: object.uid };
  }

  /**
   * Subscribes. With `take` true, a loop of its own takes every event as it comes and prints it; with `take`
   * false the iterator is kept and pulled only by `take`, so the SDK applies the own-write rule when the app
   * (the suite) takes the event, not when it arrived.
   */
  private async watch(c: Command): Promise<Json> {
    const stream = text(c, "stream");
    const mode = text(c, "mode");
    if (mode !== "RAW" && mode !== "CONSISTENT") {
      throw new InvalidArgument(`mode: ${JSON.stringify(mode)} is neither RAW nor CONSISTENT`);
    }
    const query = { resource: text(c, "resource"), namespace: text(c, "namespace"), mode: Mode[mode] };
    const takeAll = flag(c, "take");
    const events = this.client.watch(query);
    if (takeAll) {
      void (async () => {
        try {
          for await (const event of events) print({ stream, item: eventItem(event) });
        } catch (error) {
          streamError(stream, error);
        }
      })();
    } else {
      this.paused.set(stream, { events, turn: Promise.resolve() });
    }
    return {};
  }

  /** Takes the next `count` events of a paused watch, printing each; answers after the last. */
  private async take(c: Command): Promise<Json> {
    const stream = text(c, "stream");
    const n = wholeNumber(c, "count");
    const watch = this.paused.get(stream);
    if (!watch) throw new InvalidArgument(`stream: no watch ${JSON.stringify(stream)} started with take false`);
    // Takes on one watch run one after another, each taking its events in a row.
    const taking = watch.turn.then(async () => {
      for (let i = 0; i < n; i++) {
        let next: IteratorResult<WatchEvent, void>;
        try {
          next = await watch.events.next();
        } catch (error) {
          streamError(stream, error);
          return;
        }
        if (next.done) return;
        print({ stream, item: eventItem(next.value) });
      }
    });
    watch.turn = taking;
    await taking;
    return {};
  }

  /**
   * Sends the message (its payload as text) to a peer address, guarded by `guard` when set (the SDK's own
   * `{ guard }` option), keeping what `send` returned for `outcome`.
   */
  private async send(c: Command): Promise<Json> {
    const message = {
      to: { peer: text(c, "peer") },
      resourceId: text(c, "resourceId"),
      eventId: text(c, "eventId"),
      payload: text(c, "payload"),
    };
    const sent = await this.client.send(message, { guard: guard(c) });
    this.sent.set(sent.messageId, sent);
    return { messageId: sent.messageId };
  }

  /**
   * Awaits the outcome of a send, bounded by `timeoutMs` (0: none) through the SDK's own API:
   * `sent.outcome({ signal })`, whose wait rejects with the signal's TimeoutError, reported DEADLINE_EXCEEDED.
   */
  private async outcome(c: Command): Promise<Json> {
    const messageId = text(c, "messageId");
    const timeoutMs = c.timeoutMs === undefined ? 0 : wholeNumber(c, "timeoutMs");
    const sent = this.sent.get(messageId);
    if (!sent) throw new InvalidArgument(`messageId: this agent sent no message ${JSON.stringify(messageId)}`);
    const signal = timeoutMs > 0 ? AbortSignal.timeout(timeoutMs) : undefined;
    try {
      const outcome = await sent.outcome({ signal });
      return { outcome: outcome.kindName, peer: outcome.peer, reason: outcome.reason };
    } catch (error) {
      if (signal?.aborted && error === signal.reason) {
        throw new ConsistdError(status.DEADLINE_EXCEEDED, `no outcome within ${timeoutMs} ms`);
      }
      throw error;
    }
  }

  /** Campaigns in the election and prints every state the SDK yields, from a loop of its own. */
  private async campaign(c: Command): Promise<Json> {
    const stream = text(c, "stream");
    const election = text(c, "election");
    const states = this.client.campaign(election, { namespace: text(c, "namespace") });
    void (async () => {
      try {
        for await (const s of states) {
          print({ stream, item: { state: s.stateName, holder: s.holder, term: Number(s.term) } });
        }
      } catch (error) {
        streamError(stream, error);
      }
    })();
    return {};
  }

  /**
   * Runs the SDK's reconciler on the queue, its primaries `resource` in `namespace`, following the election
   * (none when `election` is absent or empty), a change of a primary queueing a pass only if it moves a part
   * `changes` names (every change without it), keeping the finalizer `finalizer` on them (none when absent,
   * null or empty), in a loop of its own; its handler is `handler`. Answers once it is started.
   */
  private async reconcile(c: Command): Promise<Json> {
    const stream = text(c, "stream");
    const election = c.election === undefined || c.election === null ? "" : text(c, "election");
    const finalizer = c.finalizer === undefined || c.finalizer === null ? "" : text(c, "finalizer");
    const spec: ReconcileSpec = {
      name: text(c, "queue"),
      resource: text(c, "resource"),
      namespace: text(c, "namespace"),
      election: election === "" ? undefined : { name: election, namespace: text(c, "electionNamespace") },
      onlyChangesOf: changes(c),
      finalizer: finalizer === "" ? undefined : finalizer,
    };
    this.client.reconcile(spec, (item) => this.handler(stream, item)).catch((error) => {
      console.error(`conformance agent: the reconciler ${JSON.stringify(stream)} ended: ${error}`);
      streamError(stream, error);
    });
    return {};
  }

  /**
   * The reconcile handler: waits (registered before it prints the item, so a `handle` that follows the line
   * finds it) for the `handle` of its item's name, sets the condition as told through `item.setCondition`, records
   * the event as told through `item.recordEvent` (an error of either answers the `handle` and ends the pass with a
   * retry), writes as told through the item's own objects client, answers the `handle` with the results, then ends
   * as told: DONE resolves, RETRY throws.
   */
  private async handler(stream: string, item: WorkItem): Promise<void> {
    const told = new Promise<Handle>((resolve) => this.waiting.set(waitingKey(stream, item.name), resolve));
    const line = {
      namespace: item.namespace,
      name: item.name,
      term: Number(item.term),
      attempt: item.attempt,
      leaseId: item.leaseId,
      finalizing: item.finalizing,
    };
    print({ stream, item: line });
    const handle = await told;
    const answer: { [key: string]: Json } = {};
    if (handle.condition !== null) {
      try {
        const set = await item.setCondition(handle.condition);
        answer.condition = { changed: set.changed, lastTransitionTime: set.lastTransitionTime };
      } catch (error) {
        handle.answer(Promise.reject(error));
        throw new Error("the condition was not set");
      }
    }
    if (handle.event !== null) {
      try {
        answer.event = { recorded: await item.recordEvent(handle.event) };
      } catch (error) {
        handle.answer(Promise.reject(error));
        throw new Error("the event was not recorded");
      }
    }
    // The write settles before the handler does: the lease is completed only after it.
    const written = this.write(item, handle.patch).then((result) => ({ ...answer, ...result }));
    handle.answer(written);
    await written.catch(() => {});
    if (!handle.done) throw new Error("the suite asked for a retry");
  }

  /** Patches the item's primary through `item.objects` (no guard of the agent's own); `{}` without a patch. */
  private async write(item: WorkItem, patch: Handle["patch"]): Promise<{ [key: string]: Json }> {
    if (patch === null) return {};
    const target = { resource: "configmaps", namespace: item.namespace, name: item.name };
    const object = await item.objects.patch({ ...target, patch, type: PatchType.MERGE });
    return { resourceVersion: object.resourceVersion };
  }

  /**
   * Hands the handler waiting with item `name` its condition, event, patch and outcome; answers with the results (or
   * the first error).
   */
  private async handle(c: Command): Promise<Json> {
    const stream = text(c, "stream");
    const name = text(c, "name");
    const outcome = text(c, "outcome");
    if (outcome !== "DONE" && outcome !== "RETRY") {
      throw new InvalidArgument(`outcome: ${JSON.stringify(outcome)} is neither DONE nor RETRY`);
    }
    const patch = c.patch ?? null;
    if (patch !== null && typeof patch !== "object") throw new InvalidArgument("patch: must be a JSON object or null");
    const set = condition(c);
    const record = event(c);
    const key = waitingKey(stream, name);
    const waiting = this.waiting.get(key);
    if (!waiting) throw new InvalidArgument(`name: no handler waits with item ${JSON.stringify(name)}`);
    this.waiting.delete(key);
    return new Promise<Json>((resolve, reject) => {
      const answer = (written: Promise<Json>) => written.then(resolve, reject);
      waiting({ patch, condition: set, event: record, done: outcome === "DONE", answer });
    });
  }
}

/** How long the agent lets commands still running answer after stdin closed, in milliseconds. */
const DRAIN_MS = 1_000;

const client = new Client();
const agent = new Agent(client);
/** The commands still running, so that the ones the client's close ends can answer before the agent exits. */
const running = new Set<Promise<void>>();
const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on("line", (line) => {
  if (line.trim() === "") return;
  let command: unknown;
  try {
    command = JSON.parse(line);
  } catch (error) {
    console.error(`conformance agent: not a JSON command (${error}): ${line}`);
    return;
  }
  if (command === null || typeof command !== "object" || Array.isArray(command)) {
    console.error(`conformance agent: not a JSON object: ${line}`);
    return;
  }
  // Not awaited: a command that waits (outcome, take, next) must not hold up the next one.
  const run = agent.run(command as Command).finally(() => running.delete(run));
  running.add(run);
});
// The suite is done once it closes stdin: close the client (which ends its streams and waits), give the
// commands still running a moment to answer, and exit 0 whatever is left.
lines.on("close", () => {
  client.close();
  const drained = Promise.allSettled(running);
  const timer = new Promise((resolve) => setTimeout(resolve, DRAIN_MS).unref());
  void Promise.race([drained, timer]).then(() => process.exit(0));
});
