// The reconcile queue: the daemon leases keys that need work; a handler per lease, its outcome the lease's completion.
import { type ClientDuplexStream, status } from "@grpc/grpc-js";
import { type Cancellable, messages } from "./call.js";
import { ConsistdError, ended, isRetryable, toConsistdError } from "./errors.js";
import {
  type ChangeFilter as ChangeFilterProto,
  type Completion,
  type ObjectQuery,
  Outcome,
  type QueueSpec,
  type ReconcileRequest,
  type ReconcileResponse,
  type ReconcileServiceClient,
  type RelatedQuery,
  ShardBy,
  type WorkItem as WorkItemProto,
} from "./gen/consistd/v1/reconcile.js";
import { Consistency } from "./gen/consistd/v1/watch.js";
import { cut } from "./inbox.js";
import { duration } from "./leadership.js";
import {
  type Condition,
  type Guard,
  KubeObject,
  type ObjectEvent,
  type Objects,
  type SetConditionResult,
} from "./objects.js";
import { refused } from "./ordered.js";
import { Backoff } from "./retry.js";
import { type ObjectView, toView } from "./watch.js";

/** Objects of one resource: what a queue's primary or related query names. */
export interface ReconcileQuery {
  /** "configmaps", "deployments.apps", "apps/v1/deployments", or a kind such as "Deployment". */
  resource: string;
  /** Only this namespace; empty or unset for every namespace (or a cluster-scoped resource). */
  namespace?: string;
  /** A Kubernetes label selector, e.g. "app=web". */
  labelSelector?: string;
  /** A Kubernetes field selector, e.g. "metadata.name=cfg". */
  fieldSelector?: string;
  /**
   * How much of each object the queue's watch keeps and hands out (`WorkItem.object`), as for a watch; unset is
   * the whole object without managedFields. A related query's projection also keeps what its mapping reads; a
   * metadata-only one can map by owner, label, annotation or a field under metadata.
   */
  view?: ObjectView;
  /**
   * Only a change of these parts of an object queues a pass (`ObjectQuery.changes`), as controller-runtime's
   * GenerationChangedPredicate and label and annotation predicates (kube-rs's predicates): any part named will do,
   * and a change of nothing named (say a status write under `{ generation: true }`) queues nothing. An object's
   * first state, its deletion, its deletionTimestamp being set and a related object's move to another primary
   * always queue one. Unset: every change. Naming no part (`{}`) is sent as it is: the daemon refuses it,
   * `INVALID_ARGUMENT` naming spec.primary.changes (or spec.related[i].query.changes).
   */
  onlyChangesOf?: ChangeFilter;
}

/** The parts of an object whose change queues a pass (`ReconcileQuery.onlyChangesOf`); unset fields are false. */
export interface ChangeFilter {
  /**
   * `metadata.generation`, which the apiserver moves on a change of the spec (not of status or metadata); an
   * object without one (a ConfigMap, a Secret) counts every change.
   */
  generation?: boolean;
  /** `metadata.labels`. */
  labels?: boolean;
  /** `metadata.annotations`. */
  annotations?: boolean;
}

/**
 * How a related object names its primary: exactly one of these. A value "name" names the primary in the
 * related object's own namespace; "namespace/name" names it anywhere (and a cluster-scoped primary by "name").
 */
export type MapsBy =
  /** The object's controller ownerReference (controller: true) whose kind is the primary's. */
  | { controllerOwner: true; label?: never; annotation?: never; field?: never }
  /** The value of this label. */
  | { label: string; controllerOwner?: never; annotation?: never; field?: never }
  /** The value of this annotation. */
  | { annotation: string; controllerOwner?: never; label?: never; field?: never }
  /** The string at this dot-separated path of the object, e.g. "spec.configMapName". */
  | { field: string; controllerOwner?: never; label?: never; annotation?: never };

/**
 * Objects whose changes queue the primary they name (a child, a referenced ConfigMap); `priority` is that of
 * the passes their changes queue (the primary's changes: 0): a higher one is handed out first.
 */
export type RelatedSpec = ReconcileQuery & MapsBy & { priority?: number };

/** Retry delays of a queue; unset fields take client-go's defaults. */
export interface RetryOptions {
  /** A key's first retry waits this long, doubling per failure in a row; default 5 ms. */
  baseDelayMs?: number;
  /** The longest per-key retry delay; default 1000 s. */
  maxDelayMs?: number;
  /** Retries per second across the queue; default 10. */
  rate?: number;
  /** Retries the queue may make at once beyond `rate`; default 100. */
  burst?: number;
}

/**
 * A reconcile queue: the primary objects (each one key, namespace/name), the related objects that queue
 * them, and how work is handed out. Every process that opens the same `name` shares the queue (its spec
 * must then be the same): a key is leased to one of them at a time.
 */
export interface ReconcileSpec extends ReconcileQuery {
  /** The queue's name: a DNS label (lowercase letters, digits, '-'); metrics and `consistd status` show it. */
  name: string;
  /** Other objects whose changes queue the primary they name. */
  related?: RelatedSpec[];
  /**
   * How many items this reconciler works on at once (controller-runtime's MaxConcurrentReconciles);
   * default 1, at most 10000. An explicit 0 is sent as it is (and refused).
   */
  maxLeases?: number;
  /** Retry delays after a handler throws; unset fields take client-go's defaults. */
  retry?: RetryOptions;
  /** A lease not completed in this time goes back to the queue; default 10 minutes, at least 1 s. */
  leaseTimeoutMs?: number;
  /**
   * Work only while this pod leads this election (`namespace`: its Lease's; empty or unset means the daemon's
   * own); every item then carries its term and the `guard` to pass to its writes. With `sharded`, it names the
   * group whose members share the keys instead.
   */
  election?: { name: string; namespace?: string };
  /**
   * Spread the keys over every pod whose daemon runs this queue (same name, same spec) under `election`: a key
   * is leased to one pod at a time across the whole group. Needs `election` (without one the daemon refuses the
   * spec, `INVALID_ARGUMENT` naming spec.sharded). Each item's `term` is then the epoch of the key's slot, and
   * its `guard` works unchanged. Default false.
   */
  sharded?: boolean;
  /**
   * What a `sharded` queue hashes a key by to find its slot: `ShardBy.KEY` (as the default) spreads the keys
   * evenly; `ShardBy.NAMESPACE` keeps a namespace's keys together, and each pod's daemon then lists and watches
   * only its share of the namespaces (Kubernetes' sharded list and watch, KEP-5866). Needs `sharded` and a primary
   * of a namespaced resource in every namespace (otherwise the daemon refuses the spec, `INVALID_ARGUMENT` naming
   * spec.shard_by). Default: by key (sent unset, `ShardBy.UNSPECIFIED`).
   */
  shardBy?: ShardBy;
  /**
   * A finalizer the queue keeps on its primaries (unset or empty: none), a qualified name such as
   * "example.com/cleanup", as controller-runtime's controllerutil and kube-rs's finalizer() keep one: the daemon adds
   * it before an object's first pass, and an object being deleted that still carries it is handed out as a finalize
   * pass (`item.finalizing`). Completing that pass DONE removes it, any other outcome keeps it, and a deposed
   * leader's removal is refused (the key goes back to the queue). The daemon must be allowed to patch the primaries;
   * a name without a "domain/" prefix is refused, `INVALID_ARGUMENT` naming spec.finalizer.
   */
  finalizer?: string;
}

/** How `reconcile` runs. */
export interface ReconcileOptions extends Cancellable {
  /** Where warnings go (a completion the daemon refused, e.g. of a lease that timed out); default `console.warn`. */
  warn?: (message: string) => void;
}

/** The daemon's default lease timeout (QueueSpec.lease_timeout), when the spec sets none. */
const DEFAULT_LEASE_TIMEOUT_MS = 10 * 60_000;
/** The longest REQUEUE delay the daemon takes. */
const MAX_REQUEUE_MS = 24 * 60 * 60_000;
/** After the last completion of a stopping reconciler, how long the daemon may take to end the stream. */
const END_GRACE_MS = 5_000;

/** What a handler resolves with to have its key handed out again after a delay: see `requeueAfter`. */
export class Requeue {
  /** The delay in whole milliseconds: at least 1, at most a day. */
  readonly afterMs: number;
  /** The priority of the pass it queues: a higher one is handed out first (default 0). */
  readonly priority: number;

  /** `afterMs` as `requeueAfter` takes it: throws RangeError unless it is finite and not negative. */
  constructor(afterMs: number, priority = 0) {
    if (!Number.isFinite(afterMs) || afterMs < 0) throw new RangeError(`requeueAfter: ${afterMs} is not a delay in ms`);
    if (!Number.isInteger(priority)) throw new RangeError(`requeueAfter: priority ${priority} is not an integer`);
    this.afterMs = Math.min(Math.max(Math.ceil(afterMs), 1), MAX_REQUEUE_MS);
    this.priority = priority;
  }
}

/**
 * The handler's result that hands the key out again after `ms` milliseconds (OUTCOME_REQUEUE), sooner if the
 * object changes meanwhile: `return requeueAfter(30_000)`. A fraction of a millisecond rounds up, 0 counts as
 * 1 ms and more than a day as a day. A negative `ms`, NaN or ±Infinity throws RangeError (thrown in a handler,
 * it makes the pass a RETRY with that message). `priority` (an integer, default 0) is the pass's: a higher one
 * is handed out first (controller-runtime's Result.Priority).
 */
export function requeueAfter(ms: number, options?: { priority?: number }): Requeue {
  return new Requeue(ms, options?.priority);
}

/**
 * Thrown by a handler when retrying cannot help (OUTCOME_TERMINAL): the key waits until its object, or a
 * related one, changes. Any other error is retried with backoff.
 */
export class TerminalError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "TerminalError";
  }
}

/** One lease on one key: the handler's argument. No other lease on the key is out until it settles. */
export class WorkItem<T = any> {
  /** Names the lease; writes through `objects` carry it. */
  readonly leaseId: string;
  /** The key: the primary's namespace (empty when cluster-scoped) ... */
  readonly namespace: string;
  /** ... and name. */
  readonly name: string;
  /**
   * The primary as the daemon's cache held it when the lease was granted; undefined when a related object
   * queued a key whose primary does not exist.
   */
  readonly object?: KubeObject<T>;
  /** The primary was deleted: `object` is its last known state. Handed out once. */
  readonly deleted: boolean;
  /**
   * CONSISTENT: the state is at least as new as every write this pod made to it and, through this key's
   * earlier leases, to its related objects. TIMED_OUT: such a write was not seen in time; the latest state.
   */
  readonly consistency: Consistency;
  /** 1 for the first pass after a change; n for the nth pass in a row after the handler threw. */
  readonly attempt: number;
  /**
   * The election term the lease was granted in (a write guard's term); 0n without an election. In a `sharded`
   * queue, the epoch of the key's slot.
   */
  readonly term: bigint;
  /**
   * With an election (`ReconcileSpec.election`), the write guard of the term the lease was granted in: its
   * election and namespace (empty: the daemon's own) are the spec's, its term is `term`. A write that passes
   * `guard: item.guard` succeeds only while this daemon still leads in that term (else FAILED_PRECONDITION). In
   * a `sharded` queue, a write through `objects` (it names the lease) that passes it carries the slot's claim.
   * Undefined without an election.
   */
  readonly guard?: Guard;
  /** When the daemon takes the lease back unless it is completed. */
  readonly expiresAt?: Date;
  /** The previous attempt's error message, when this pass follows one that threw. */
  readonly lastError: string;
  /** A finalize pass: the primary is being deleted and still carries the spec's `finalizer`; DONE removes it. */
  readonly finalizing: boolean;
  /**
   * The client's objects with every write naming this lease (`Objects.forLease`): the key's next pass waits
   * until the queue's watches show these writes (say a child this pass created), not only writes to the
   * primary itself, which are always waited for. When the queue follows an election the daemon guards each of
   * them that carries no guard of its own with the lease's term (and refuses one naming a lease no longer held).
   */
  readonly objects: Objects;
  /**
   * Aborted when the lease is lost: the connection to the sidecar went (the daemon gave the key back to the
   * queue), the lease timed out, or the reconciler is stopping. Pass it to long calls.
   */
  readonly signal: AbortSignal;
  /** The queue's primary resource, as its spec names it (`ReconcileSpec.resource`): what `setCondition` sets on. */
  private readonly resource: string;
  /** The queue's name (`ReconcileSpec.name`): the reporting controller of `recordEvent`'s events. */
  private readonly queue: string;

  /**
   * `election`: the queue's (`ReconcileSpec.election`), for `guard`; `resource`: the queue's primary resource
   * (`ReconcileSpec.resource`), for `setCondition` and `recordEvent`; `queue`: the queue's name
   * (`ReconcileSpec.name`), the reporting controller of `recordEvent`.
   */
  constructor(
    item: WorkItemProto,
    objects: Objects,
    signal: AbortSignal,
    election?: ReconcileSpec["election"],
    resource = "",
    queue = "",
  ) {
    this.leaseId = item.leaseId;
    this.namespace = item.namespace;
    this.name = item.name;
    this.object = item.object && new KubeObject<T>(item.object);
    this.deleted = item.deleted;
    this.consistency = item.consistency;
    this.attempt = item.attempt;
    this.term = item.term;
    this.guard = election && { election: election.name, namespace: election.namespace ?? "", term: item.term };
    this.expiresAt = item.expiresAt;
    this.lastError = item.lastError;
    this.finalizing = item.finalizing;
    this.objects = objects.forLease(item.leaseId);
    this.signal = signal;
    this.resource = resource;
    this.queue = queue;
  }

  /**
   * Sets one status condition of this item's primary (the queue's `resource`, this key), as apimachinery's
   * meta.SetStatusCondition does, in the daemon (`Objects.setCondition`):
   *
   *     await item.setCondition({ type: "Ready", status: "True", reason: "Available", message: "3 of 3 replicas" });
   *
   * Its observedGeneration is the metadata.generation of the object this pass was handed (`object`; 0 when there is
   * none or it has no generation, and the daemon then takes the generation it reads). The daemon writes only when
   * something changed (`changed`; false when the condition of that type already says the same for the same
   * generation), and keeps the lastTransitionTime while the status stays (a new status: now). It applies the
   * condition alone to the status subresource with server-side apply under a field manager per condition type
   * ("consistd/Ready"), so setting one condition never drops another: the primary's status.conditions must be a list
   * map keyed by type, as Go's []metav1.Condition with `+listType=map` and `+listMapKey=type` generates it. The write
   * goes through `objects`, so it names this lease (the next pass waits for it, and it queues none of its own) and,
   * when the queue follows an election, is guarded by the lease's term. A `status` other than "True", "False" or
   * "Unknown" rejects with a `ConsistdError` `INVALID_ARGUMENT` naming `condition.status`, before anything is sent;
   * the daemon's refusals (a reason that is not CamelCase, a resource without a status subresource: NOT_FOUND)
   * reject as every write's do.
   */
  setCondition(condition: Omit<Condition, "observedGeneration">, options?: Cancellable): Promise<SetConditionResult<T>> {
    const request = {
      resource: this.resource,
      namespace: this.namespace,
      name: this.name,
      condition: { ...condition, observedGeneration: generationOf(this.object) },
    };
    return this.objects.setCondition<T>(request, options);
  }

  /**
   * Records an event (events.k8s.io/v1) about this item's primary (the queue's `resource`, this key, the uid of the
   * object this pass was handed), reported by the queue: its name is the reporting controller. It resolves to
   * whether it was recorded:
   *
   *     await item.recordEvent({ severity: "Warning", reason: "Drifted", action: "Reconcile", note: "data moved" });
   *
   * The daemon records it as client-go's event recorder does (`Objects.recordEvent`), once for every app of the
   * pod: a repeat within 6 minutes (the same severity, reason, action, reporting controller and object) is counted
   * on the first one's series (its count), not written anew, whichever app of the pod recorded the first; and the
   * queue's events about one object pass client-go's rate limit (a burst of 25, then one per 5 minutes): one over
   * it is dropped, and this resolves to false. An event is not a write of the primary: no lease, no guard. The
   * sidecar's service account needs create and patch on events.k8s.io events. A `severity` other than "Normal" or
   * "Warning" rejects with a `ConsistdError` `INVALID_ARGUMENT` naming `severity`, before anything is sent; the
   * daemon's refusals (an empty reason or action, or one over 128 characters; a note over 1024 bytes) reject as
   * every call's do.
   */
  async recordEvent(event: ObjectEvent, options?: Cancellable): Promise<boolean> {
    const { severity, reason, action, note } = event;
    const request = {
      resource: this.resource,
      namespace: this.namespace,
      name: this.name,
      uid: this.object?.uid ?? "",
      severity,
      reason,
      action,
      note,
      reportingController: this.queue,
    };
    return (await this.objects.recordEvent(request, options)).recorded;
  }

  /** "namespace/name", or "name" when cluster-scoped. */
  get key(): string {
    return keyOf(this);
  }

  /** Whether a write of this pod was not seen in time and the latest known state was handed out. */
  get timedOut(): boolean {
    return this.consistency === Consistency.TIMED_OUT;
  }

  /** The consistency's name: "CONSISTENT" or "TIMED_OUT". */
  get consistencyName(): string {
    return Consistency[this.consistency] ?? String(this.consistency);
  }
}

/**
 * Works on a queue: resolving is DONE, resolving with `requeueAfter(ms)` is REQUEUE, throwing a
 * `TerminalError` is TERMINAL, throwing anything else is RETRY with its message.
 */
export type ReconcileHandler<T = any> = (item: WorkItem<T>) => Promise<void | Requeue> | void | Requeue;

/**
 * Opens the queue `spec` names and calls `handler` with each work item, at most `maxLeases` at once and never
 * two for one key, sending its outcome as the lease's completion when it settles. On a lost connection
 * (UNAVAILABLE, or the stream ended unasked) the stream is opened again with the same spec, with backoff:
 * the daemon gave the old stream's leases back, so the completions of handlers still running for it are
 * dropped (their `item.signal` is aborted), and a key they hold is not handed to the handler again before
 * they settle. A refused completion is a warning. Resolves when `options.signal` aborts, once every running
 * handler has settled (their completions are still sent); rejects with the ConsistdError of a spec the daemon
 * refuses (INVALID_ARGUMENT or NOT_FOUND naming the field, FAILED_PRECONDITION, PERMISSION_DENIED).
 */
export function reconcile<T>(
  service: ReconcileServiceClient,
  objects: Objects,
  spec: ReconcileSpec,
  handler: ReconcileHandler<T>,
  options: ReconcileOptions = {},
): Promise<void> {
  return new Reconciler(service, objects, spec, handler as ReconcileHandler, options).run();
}

/** One Reconcile stream: its leases end with it. */
class Stream {
  /** The daemon answered the spec. */
  started = false;
  /** Handlers of this stream's leases still running. */
  running = 0;
  /** The app has half-closed it (stopping): nothing more is written. */
  ended = false;
  /** Aborted when the stream is over: its leases went back to the queue. */
  readonly lost = new AbortController();
  /** Cancels the call. */
  readonly cancel = new AbortController();
  private timer?: NodeJS.Timeout;

  constructor(readonly call: ClientDuplexStream<ReconcileRequest, ReconcileResponse>) {}

  /** Sends a completion, unless the stream is over (the lease went back with it). */
  complete(completion: Completion): void {
    if (this.ended || this.lost.signal.aborted) return;
    this.call.write({ complete: completion });
  }

  /** Half-closes the stream, so the daemon ends it once it took the completions; cancels it if it does not. */
  end(): void {
    if (this.ended || this.lost.signal.aborted) return;
    this.ended = true;
    this.call.end();
    this.timer = setTimeout(() => this.cancel.abort(), END_GRACE_MS);
  }

  /** The stream is over: its leases are gone. */
  lose(): void {
    clearTimeout(this.timer);
    const why = "reconcile: the stream ended; its leases went back to the queue";
    this.lost.abort(new ConsistdError(status.UNAVAILABLE, why));
  }
}

/** A lease received and not yet handed to the handler. */
interface Lease {
  item: WorkItemProto;
  stream: Stream;
  key: string;
  /** When it arrived (Date.now()): its lease times out `leaseTimeoutMs` later at the latest. */
  received: number;
}

class Reconciler {
  private readonly request: ReconcileRequest;
  private readonly max: number;
  private readonly leaseTimeoutMs: number;
  private readonly warn: (message: string) => void;
  /** Leases waiting for a free slot or for their key's running handler. */
  private readonly pending: Lease[] = [];
  /** Per key, the handler running for it (settles, never rejects). */
  private readonly busy = new Map<string, Promise<void>>();

  constructor(
    private readonly service: ReconcileServiceClient,
    private readonly objects: Objects,
    private readonly spec: ReconcileSpec,
    private readonly handler: ReconcileHandler,
    private readonly options: ReconcileOptions,
  ) {
    this.request = { spec: toQueueSpec(spec) };
    this.max = spec.maxLeases ?? 1;
    this.leaseTimeoutMs = spec.leaseTimeoutMs ?? DEFAULT_LEASE_TIMEOUT_MS;
    this.warn = options.warn ?? ((message) => console.warn(message));
  }

  async run(): Promise<void> {
    const { signal } = this.options;
    const backoff = new Backoff();
    try {
      while (!signal?.aborted) {
        const failure = await this.stream(backoff);
        if (signal?.aborted) return;
        if (!isRetryable(failure)) throw failure;
        await backoff.wait(signal);
      }
    } finally {
      this.pending.length = 0;
      while (this.busy.size > 0) await Promise.all(this.busy.values());
    }
  }

  /** Runs one stream until it ends; returns why it ended. */
  private async stream(backoff: Backoff): Promise<unknown> {
    const { signal } = this.options;
    const stream = new Stream(this.service.reconcile());
    stream.call.on("error", () => {}); // read by the loop below; a write racing the stream's end must not throw
    // Stopping: no new handlers; the running ones settle and send their completions, then the stream ends.
    const onAbort = () => {
      this.pending.length = 0;
      if (!stream.started) stream.cancel.abort();
      else if (stream.running === 0) stream.end();
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    let failure: unknown = ended("reconcile stream");
    try {
      stream.call.write(this.request);
      for await (const response of messages(stream.call, stream.cancel.signal)) {
        if (response.started) {
          stream.started = true;
          backoff.reset();
        } else if (response.item) {
          if (signal?.aborted) continue; // stopping: the lease goes back when the stream ends
          const item = response.item;
          this.pending.push({ item, stream, key: keyOf(item), received: Date.now() });
          this.pump();
        } else if (response.refused) {
          const { leaseId, refusal } = response.refused;
          const why = refusal ? refused(refusal).message : "no reason given";
          this.warn(`consistd reconcile ${this.spec.name}: completion of lease ${leaseId} refused: ${why}`);
        }
      }
    } catch (error) {
      failure = toConsistdError(error);
    } finally {
      signal?.removeEventListener("abort", onAbort);
      stream.lose();
    }
    return failure;
  }

  /** Starts the pending leases whose key is free, while fewer than `max` handlers run. */
  private pump(): void {
    for (let i = 0; i < this.pending.length && this.running() < this.max; ) {
      const lease = this.pending[i];
      const expired = Date.now() >= lease.received + this.leaseTimeoutMs;
      if (lease.stream.lost.signal.aborted || this.options.signal?.aborted || expired) {
        this.pending.splice(i, 1); // its lease is gone (the key may be another's already)
      } else if (this.busy.has(lease.key)) {
        i++; // a handler of a lost stream, or of a lease that timed out, still works on the key
      } else {
        this.pending.splice(i, 1);
        this.start(lease);
      }
    }
  }

  private running(): number {
    return this.busy.size;
  }

  private start(lease: Lease): void {
    const { stream, key } = lease;
    stream.running++;
    const settled = this.handle(lease).then(() => {
      this.busy.delete(key);
      stream.running--;
      if (this.options.signal?.aborted && stream.running === 0) stream.end();
      this.pump();
    });
    this.busy.set(key, settled);
  }

  /** Runs the handler on one lease and sends its outcome; never rejects. */
  private async handle({ item, stream, received }: Lease): Promise<void> {
    const lost = new AbortController();
    const sources = [stream.lost.signal, this.options.signal].filter((s): s is AbortSignal => s !== undefined);
    const onLost = (event: Event) => lost.abort((event.target as AbortSignal).reason);
    for (const source of sources) {
      if (source.aborted) lost.abort(source.reason);
      else source.addEventListener("abort", onLost, { once: true });
    }
    // The daemon's clock started at the grant, a little before `received`: this fires a little after it.
    const expired = setTimeout(
      () => lost.abort(new ConsistdError(status.DEADLINE_EXCEEDED, `reconcile: lease ${item.leaseId} timed out`)),
      Math.max(0, received + this.leaseTimeoutMs - Date.now()),
    );
    let completion: Completion;
    try {
      const { election, resource, name } = this.spec;
      const handed = new WorkItem(item, this.objects, lost.signal, election, resource, name);
      const result = await this.handler(handed);
      completion =
        result instanceof Requeue
          ? {
              leaseId: item.leaseId,
              outcome: Outcome.REQUEUE,
              requeueAfter: duration(result.afterMs),
              error: "",
              priority: result.priority,
            }
          : { leaseId: item.leaseId, outcome: Outcome.DONE, requeueAfter: undefined, error: "", priority: 0 };
    } catch (error) {
      const outcome = error instanceof TerminalError ? Outcome.TERMINAL : Outcome.RETRY;
      completion = { leaseId: item.leaseId, outcome, requeueAfter: undefined, error: cut(messageOf(error)), priority: 0 };
    } finally {
      clearTimeout(expired);
      for (const source of sources) source.removeEventListener("abort", onLost);
    }
    stream.complete(completion);
  }
}

/** The spec as the protocol says it. */
function toQueueSpec(spec: ReconcileSpec): QueueSpec {
  return {
    name: spec.name,
    primary: toQuery(spec),
    related: (spec.related ?? []).map(toRelated),
    maxLeases: spec.maxLeases ?? 1,
    retry: spec.retry && {
      baseDelay: duration(spec.retry.baseDelayMs),
      maxDelay: duration(spec.retry.maxDelayMs),
      rate: spec.retry.rate ?? 0,
      burst: spec.retry.burst ?? 0,
    },
    leaseTimeout: duration(spec.leaseTimeoutMs),
    election: spec.election && { election: spec.election.name, namespace: spec.election.namespace ?? "" },
    // Without an election it goes as it is: the daemon refuses it, naming spec.sharded.
    sharded: spec.sharded ?? false,
    // Without sharded it goes as it is: the daemon refuses it, naming spec.shard_by.
    shardBy: spec.shardBy ?? ShardBy.UNSPECIFIED,
    finalizer: spec.finalizer ?? "",
  };
}

function toQuery(query: ReconcileQuery): ObjectQuery {
  return {
    resource: query.resource,
    namespace: query.namespace ?? "",
    labelSelector: query.labelSelector ?? "",
    fieldSelector: query.fieldSelector ?? "",
    view: toView(query.view),
    changes: toChanges(query.onlyChangesOf),
  };
}

/** The protocol's ChangeFilter for `parts`: unset parts are false; undefined (every change) for none. */
function toChanges(parts: ChangeFilter | undefined): ChangeFilterProto | undefined {
  return (
    parts && {
      generation: parts.generation ?? false,
      labels: parts.labels ?? false,
      annotations: parts.annotations ?? false,
    }
  );
}

/** A related query; its one way of naming the primary (none, or `controllerOwner: false`, is refused). */
function toRelated(related: RelatedSpec): RelatedQuery {
  const query = toQuery(related);
  const priority = related.priority ?? 0;
  if (related.label !== undefined) return { query, label: related.label, priority };
  if (related.annotation !== undefined) return { query, annotation: related.annotation, priority };
  if (related.field !== undefined) return { query, field: related.field, priority };
  return { query, controllerOwner: related.controllerOwner, priority };
}

/** The metadata.generation of `object`; 0n when there is none (no object, none in it, or not JSON). */
function generationOf(object: KubeObject | undefined): bigint {
  try {
    const generation: unknown = object?.json?.metadata?.generation;
    return typeof generation === "number" && Number.isSafeInteger(generation) ? BigInt(generation) : 0n;
  } catch {
    return 0n;
  }
}

function keyOf(item: { namespace: string; name: string }): string {
  return item.namespace ? `${item.namespace}/${item.name}` : item.name;
}

/** What a RETRY or TERMINAL completion says went wrong: the error's message (its name when it has none). */
function messageOf(error: unknown): string {
  return error instanceof Error ? error.message || error.name : String(error);
}
