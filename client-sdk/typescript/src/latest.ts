// The newest state per object of a CONSISTENT watch, handed to the app's workers when they ask, with the own-write
// rule applied at that moment and the state of a worker's own write on the state it had not handed back: the way
// to consume a watch whose handler is slow (`client.watchLatest`).
//
// An app that reads a watch into a buffer of its own (the newest state per object) while a worker per object
// handles one state at a time takes each state twice: when its reader takes it from the watch, and when its worker
// takes it from the buffer. The watch applies the own-write rule at the first take; a state taken while the worker
// was still writing then waits in the buffer, and the worker, once its write returned, handles a state older than
// it (issue 46, item 5: a Kopf-shaped app executed one value twice in 56). Here the buffer is the SDK's, and the
// rule is applied when a worker is handed a state.
//
// A worker that writes the object it was handed is then handed the state of that write, which it already knows: a
// Kopf-shaped app wakes once more for nothing, and a handler that is not idempotent runs twice on one change. The
// watch's `previousResourceVersion` says when such a state is exactly the worker's write on the state the workers
// last had, nothing else in between; that one is not handed out.
import { status } from "@grpc/grpc-js";
import type { Cancellable } from "./call.js";
import { ConsistdError, toConsistdError } from "./errors.js";
import { Consistency, EventType } from "./gen/consistd/v1/watch.js";
import type { KubeObject } from "./objects.js";
import type { OwnWrites } from "./ownwrites.js";
import { WatchEvent } from "./watch.js";

/** What the books keep of an object the watch says exists: its identity. */
interface Identity {
  uid: string;
  namespace: string;
  name: string;
  resourceVersion: string;
}

/** A state of an object, by the fields that tell one state from another: its uid and resourceVersion. */
interface Version {
  uid: string;
  resourceVersion: string;
}

/** An object's key: JSON of [namespace, name]. */
function keyOf(object: { namespace: string; name: string }): string {
  return JSON.stringify([object.namespace, object.name]);
}

/**
 * The state handed to a worker (`await latest.next()`): the object's newest event when it was handed out. The
 * object stays in progress, handed to no other worker, until `done()`.
 */
export class Taken {
  private finished = false;

  /** @internal */
  constructor(
    /** ADDED, MODIFIED or DELETED. */
    readonly event: WatchEvent,
    private readonly release: () => void,
  ) {}

  /** The object's namespace; empty when cluster-scoped. */
  get namespace(): string {
    return (this.event.object as KubeObject).namespace;
  }

  /** The object's name. */
  get name(): string {
    return (this.event.object as KubeObject).name;
  }

  /** Ends the work on this object: a state that came meanwhile is handed out next. Calling it again does nothing. */
  done(): void {
    if (this.finished) return;
    this.finished = true;
    this.release();
  }
}

/**
 * The newest state of each object of a CONSISTENT watch, for workers that ask for the next one when they are ready
 * (`client.watchLatest(query)`):
 *
 *     const latest = client.watchLatest({ resource: "configmaps", namespace: "default" });
 *     const worker = async () => {
 *       for (;;) {
 *         const taken = await latest.next(); // the object's newest state; no other worker has it meanwhile
 *         try { await handle(taken.event); } finally { taken.done(); }
 *       }
 *     };
 *     await Promise.all([worker(), worker(), worker(), worker()]);
 *
 * - One pending state per object. A loop of the SDK's reads the watch continuously and keeps, per object
 *   (namespace and name), only the newest state not yet handed out: a DELETED replaces whatever waited, and so does
 *   a later state (a re-created object's ADDED replaces its deletion). That is the bound: one event per object,
 *   plus the identity (namespace, name, uid, resourceVersion) of each object the watch says exists, to tell
 *   deletions after a resync, and the uid and resourceVersion of the state last handed out per existing object.
 * - Pulled, never pushed. A worker asks for the next object's newest state; a slow worker never holds up the
 *   reader, and is never handed a state that waited in a queue while a newer one came.
 * - The own-write rule where the worker takes it. An ADDED or MODIFIED state older than a write through
 *   `client.objects` that returned is dropped when it would be handed out, however long it waited: a worker is
 *   never handed a state that predates its own write (the write's own state follows).
 * - Not handed back its own write. An ADDED or MODIFIED state is dropped when it would be handed out if it is
 *   exactly the state this client's own write (through `client.objects`) returned, and the watch says
 *   (`previousResourceVersion`) that it came directly after the state of the object last handed to a worker (or
 *   last dropped so): the workers already have it, and nothing else happened to the object in between. Still handed
 *   out: a state whose previous state is another writer's (a change no worker saw came between), a state with no
 *   previous state (from a list, a relist or a resync), and a state made by more than one write since the last
 *   hand-out (its previous state is not the one the workers had). After a deletion the object starts afresh.
 * - One worker per object at a time. An object handed out is in progress until `taken.done()`; newer states wait
 *   meanwhile and are handed out after. So any number of workers can share one `Latest`, each on a different
 *   object.
 * - Markers. SYNCED and RESYNC_REQUIRED are not handed out. After RESYNC_REQUIRED (the watch could not resume),
 *   every object of the fresh snapshot is handed out again, and at its SYNCED each object the watch said existed
 *   but the snapshot does not hold is handed out as DELETED, its object carrying only its identity (JSON
 *   `{"metadata": {name, namespace, uid, resourceVersion}}`).
 * - Errors. An error that ends the watch (anything but a lost connection, which the watch resumes from) rejects
 *   every `next()` from then on, at once, as a ConsistdError; states still pending are dropped. After `close()`
 *   (or the signal's abort) they reject with ConsistdError CANCELLED.
 */
export class Latest {
  /** The newest state of each object not handed out yet. */
  private readonly pending = new Map<string, WatchEvent>();
  /** Keys with a pending state and no worker, oldest first: the order they are handed out in. */
  private ready: string[] = [];
  /** Keys a worker holds. */
  private readonly taken = new Set<string>();
  /** The identity of each object the watch says exists: what a resync's snapshot is checked against. */
  private readonly live = new Map<string, Identity>();
  /** Since RESYNC_REQUIRED and until its SYNCED, the keys the fresh snapshot held. */
  private resync?: Set<string>;
  /**
   * Per key, the state of the object last handed to a worker, or last dropped as the state of the client's own
   * write on it: what a state's `previousResourceVersion` is compared with. A deletion (handed out, or arriving)
   * forgets the key, so this holds no more than the objects that exist.
   */
  private readonly seen = new Map<string, Version>();
  /** What ended the watch. */
  private failed?: ConsistdError;
  /** Workers waiting in next(), woken at every change. */
  private waiters: (() => void)[] = [];

  /** @internal `events` is the watch without the own-write rule; `stop` ends it. */
  constructor(
    events: AsyncIterable<WatchEvent>,
    private readonly ownWrites: OwnWrites,
    private readonly stop: () => void,
  ) {
    void this.read(events);
  }

  /** How many objects have a state waiting (held by a worker or not). */
  get size(): number {
    return this.pending.size;
  }

  /**
   * Waits for the next object with a pending state that no worker holds, and hands its newest state out (dropping,
   * at this moment, a state older than the client's own write to it, and the state of the client's own write made
   * directly on the state the workers last had). Call `done()` on what it resolves to when the work is over.
   * Rejects with the ConsistdError that ended the watch, or the signal's reason when it aborts.
   */
  async next(options: Cancellable = {}): Promise<Taken> {
    const { signal } = options;
    for (;;) {
      signal?.throwIfAborted();
      if (this.failed) throw this.failed;
      const taken = this.handOut();
      if (taken) return taken;
      await new Promise<void>((resolve, reject) => {
        const onAbort = () => reject(signal?.reason);
        signal?.addEventListener("abort", onAbort, { once: true });
        this.waiters.push(() => {
          signal?.removeEventListener("abort", onAbort);
          resolve();
        });
      });
    }
  }

  /** Ends the watch; workers waiting in `next()` reject with ConsistdError CANCELLED. */
  close(): void {
    this.fail(new ConsistdError(status.CANCELLED, "the newest-state watch was closed"));
    this.stop();
  }

  /** Every event of the watch into the books, until the watch fails or is stopped. */
  private async read(events: AsyncIterable<WatchEvent>): Promise<void> {
    try {
      for await (const event of events) {
        if (this.failed) return;
        this.arrived(event);
        this.wake();
      }
    } catch (error) {
      const e = toConsistdError(error);
      this.fail(e instanceof ConsistdError ? e : new ConsistdError(status.UNKNOWN, String(e)));
      return;
    }
    this.fail(new ConsistdError(status.CANCELLED, "the newest-state watch was closed"));
  }

  /** Takes in one event of the watch. */
  private arrived(event: WatchEvent): void {
    switch (event.type) {
      case EventType.RESYNC_REQUIRED:
        this.resync = new Set();
        return;
      case EventType.SYNCED: {
        const seen = this.resync;
        this.resync = undefined;
        if (!seen) return;
        for (const [key, identity] of [...this.live]) {
          if (seen.has(key)) continue;
          this.live.delete(key);
          this.put(key, deleted(identity, event.cursor));
        }
        return;
      }
      case EventType.ADDED:
      case EventType.MODIFIED:
      case EventType.DELETED: {
        const object = event.object;
        if (!object) return;
        const key = keyOf(object);
        if (event.type === EventType.DELETED) {
          this.live.delete(key);
        } else {
          const { uid, namespace, name, resourceVersion } = object;
          this.live.set(key, { uid, namespace, name, resourceVersion });
          this.resync?.add(key);
        }
        this.put(key, event);
        return;
      }
      default:
        return;
    }
  }

  /** Makes `event` the key's pending state, replacing an older one; the key becomes ready unless it already was or
   * a worker holds it. */
  private put(key: string, event: WatchEvent): void {
    if (event.type === EventType.DELETED) this.seen.delete(key); // a state after it is another object's
    if (!this.pending.has(key) && !this.taken.has(key)) this.ready.push(key);
    this.pending.set(key, event);
  }

  /** The next ready key's state, the key now taken; a state older than the client's own write is dropped here (the
   * own-write rule at the take), and so is the state of the client's own write on the state the workers had. */
  private handOut(): Taken | undefined {
    for (;;) {
      const key = this.ready.shift();
      if (key === undefined) return undefined;
      const event = this.pending.get(key);
      if (!event) continue;
      this.pending.delete(key);
      const isState = event.type === EventType.ADDED || event.type === EventType.MODIFIED;
      if (isState && this.ownWrites.predates(event.object)) continue; // its own write's state follows
      if (event.type === EventType.DELETED) this.seen.delete(key);
      if (isState && event.object) {
        const { uid, resourceVersion } = event.object;
        const had = this.seen.get(key);
        this.seen.set(key, { uid, resourceVersion });
        if (had && this.ownWriteOn(had, event)) continue; // the workers have it already
      }
      this.taken.add(key);
      return new Taken(event, () => this.release(key));
    }
  }

  /**
   * Whether `event` is the state the client's own write made directly on `had`, the state the workers last had:
   * same object, its previous state (as the watch saw it) is `had`, and its version is exactly the newest one the
   * client's own writes returned for it. Nothing but that write happened in between.
   */
  private ownWriteOn(had: Version, event: WatchEvent): boolean {
    const previous = event.previousResourceVersion;
    return (
      event.object?.uid === had.uid &&
      previous !== "" &&
      previous === had.resourceVersion &&
      this.ownWrites.wrote(event.object)
    );
  }

  private release(key: string): void {
    this.taken.delete(key);
    if (this.pending.has(key)) this.ready.push(key);
    this.wake();
  }

  private fail(error: ConsistdError): void {
    if (this.failed) return;
    this.failed = error;
    this.pending.clear();
    this.seen.clear();
    this.ready = [];
    this.wake();
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}

/** The DELETED event of an object a resync's snapshot no longer holds: its identity, and as JSON its metadata. */
function deleted(identity: Identity, cursor: string): WatchEvent {
  const metadata: Record<string, string> = {
    name: identity.name,
    uid: identity.uid,
    resourceVersion: identity.resourceVersion,
  };
  if (identity.namespace) metadata.namespace = identity.namespace;
  const json = Buffer.from(JSON.stringify({ metadata }));
  return new WatchEvent({
    type: EventType.DELETED,
    object: { ...identity, json },
    cursor,
    consistency: Consistency.UNSPECIFIED,
    previousResourceVersion: "",
  });
}
