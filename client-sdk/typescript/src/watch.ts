// Watch streams that reconnect on their own and resume after the last event they delivered.
import { type Cancellable, messages } from "./call.js";
import { ended, isRetryable, toConsistdError } from "./errors.js";
import {
  Consistency,
  DeliveryMode,
  EventType,
  type SubscribeResponse,
  type WatchServiceClient,
} from "./gen/consistd/v1/watch.js";
import type { ObjectView as ObjectViewProto } from "./gen/consistd/v1/object.js";
import { KubeObject } from "./objects.js";
import type { OwnWrites } from "./ownwrites.js";
import { Backoff } from "./retry.js";

/**
 * How much of each object a watch (or a queue's query) keeps and delivers: less held is less memory in the
 * sidecar. Unset, objects come whole but for `metadata.managedFields`. Queries with different views are
 * different upstream watches, each with its own cache; queries with the same view share one. The daemon
 * refuses a view it cannot keep with INVALID_ARGUMENT naming the field, e.g. `view.fields[1]`.
 *
 *     { metadataOnly: true }                              // metadata only, as client-go's metadata informer
 *     { fields: ["spec.replicas", "status.conditions"] }  // a projection
 */
export interface ObjectView {
  /**
   * Only each object's metadata, read with the apiserver's metadata-only requests (PartialObjectMetadata, as
   * controller-runtime's OnlyMetadata): no spec, status or data; apiVersion and kind still name the resource.
   * Not with `fields`.
   */
  metadataOnly?: boolean;
  /**
   * Only these fields, as dot-separated paths ("spec.replicas", "status.conditions", "metadata.labels"; a
   * leading "." is allowed), beside apiVersion, kind and metadata's name, namespace, uid, resourceVersion,
   * generation and deletionTimestamp, which every view keeps. An array is kept whole; a path the object does
   * not have keeps nothing. At most 32 paths; not with `metadataOnly`.
   */
  fields?: string[];
  /** Keep `metadata.managedFields` (server-side apply's bookkeeping), dropped by default. */
  managedFields?: boolean;
}

/** What to watch. */
export interface WatchQuery {
  /** "configmaps", "deployments.apps", "apps/v1/deployments", or a kind such as "Deployment". */
  resource: string;
  /** Only this namespace; empty or unset watches every namespace (or a cluster-scoped resource). */
  namespace?: string;
  /** A Kubernetes label selector, e.g. "app=web,tier!=db". */
  labelSelector?: string;
  /** A Kubernetes field selector, e.g. "metadata.name=cfg". */
  fieldSelector?: string;
  /** CONSISTENT (the default: states consistent with this pod's own writes) or RAW (every event). */
  mode?: DeliveryMode;
  /** Start after the event with this cursor instead of from a fresh snapshot (only a watch of the same view). */
  resumeCursor?: string;
  /** How much of each object to keep and deliver; unset is the whole object without managedFields. */
  view?: ObjectView;
}

/** One event of a watch, or one of its markers (SYNCED, RESYNC_REQUIRED). */
export class WatchEvent {
  /** ADDED, MODIFIED, DELETED, or the markers SYNCED and RESYNC_REQUIRED. */
  readonly type: EventType;
  /** The object; undefined for SYNCED and RESYNC_REQUIRED. */
  readonly object?: KubeObject;
  /** Resume position after this event. */
  readonly cursor: string;
  /** How the state relates to this pod's own writes. */
  readonly consistency: Consistency;
  /**
   * RAW mode only: a write this client made returned a newer state of the object (larger resourceVersion)
   * before the app took this event. A CONSISTENT watch never delivers such a state (the own-write rule).
   */
  readonly predatesOwnWrite: boolean;
  /**
   * For a MODIFIED event: the resourceVersion of the state of this object that the daemon's watch saw
   * directly before this one, so no write to the object came between the two (it names the watch's previous
   * state, which a CONSISTENT watch may not have delivered). Empty when that is not known: ADDED and DELETED
   * events, and states from a list or a snapshot (the first one, a relist, a resync), where writes in between
   * were never seen. With it an app can tell the state its own write made on top of a state it had (this
   * state's resourceVersion is the one the write returned, and this field the state it wrote on) from one
   * that also holds another writer's change.
   */
  readonly previousResourceVersion: string;

  constructor(response: SubscribeResponse, predatesOwnWrite = false) {
    this.type = response.type;
    this.object = response.object && new KubeObject(response.object);
    this.cursor = response.cursor;
    this.consistency = response.consistency;
    this.previousResourceVersion = response.previousResourceVersion;
    this.predatesOwnWrite = predatesOwnWrite;
  }

  /** The event type's name, e.g. "ADDED" or "SYNCED". */
  get typeName(): string {
    return EventType[this.type] ?? String(this.type);
  }
}

/**
 * Streams a watch's events. When the connection to the sidecar is lost (UNAVAILABLE, or the stream ends
 * without the caller stopping it) it subscribes again from the last cursor it delivered, with backoff, so
 * each event arrives once; if the daemon cannot resume from there, the stream yields RESYNC_REQUIRED and a
 * fresh snapshot. Any other error ends the stream with that error. Aborting the signal, or leaving the
 * `for await` loop, ends the subscription.
 *
 * The own-write rule: when the app takes an event (this generator runs only inside the app's `next()`, so
 * the check below happens then, not when the event arrived and waited in a buffer), an ADDED or MODIFIED
 * state older than one `ownWrites` recorded for its uid is dropped in CONSISTENT mode and marked
 * `predatesOwnWrite` in RAW mode. The daemon judged it before the app's write reached the daemon. With `judged`
 * false the rule is not applied here.
 */
export async function* watch(
  service: WatchServiceClient,
  query: WatchQuery,
  ownWrites: OwnWrites,
  options: Cancellable = {},
  judged = true,
): AsyncGenerator<WatchEvent, void> {
  const { signal } = options;
  const backoff = new Backoff();
  const mode = query.mode ?? DeliveryMode.CONSISTENT;
  let cursor = query.resumeCursor ?? "";
  const view = toView(query.view);
  while (!signal?.aborted) {
    const call = service.subscribe({
      resource: query.resource,
      namespace: query.namespace ?? "",
      labelSelector: query.labelSelector ?? "",
      fieldSelector: query.fieldSelector ?? "",
      mode,
      resumeCursor: cursor,
      view,
    });
    let failure: unknown = ended("watch");
    try {
      for await (const response of messages(call, signal)) {
        backoff.reset();
        // A dropped event moves the resume position too, so a reconnect does not bring it back.
        if (response.cursor) cursor = response.cursor;
        // Not `judged`: the reader of a Latest, which applies the rule where its worker takes a state and must see
        // every state the daemon sent to keep its books.
        const predates = judged && isState(response.type) && ownWrites.predates(response.object);
        if (predates && mode === DeliveryMode.CONSISTENT) continue;
        yield new WatchEvent(response, predates);
      }
    } catch (error) {
      failure = toConsistdError(error);
    }
    if (signal?.aborted) return;
    if (!isRetryable(failure)) throw failure;
    await backoff.wait(signal);
  }
}

/** The protocol's ObjectView for `view`: unset fields are their defaults; undefined (the default view) for none. */
export function toView(view: ObjectView | undefined): ObjectViewProto | undefined {
  return (
    view && {
      metadataOnly: view.metadataOnly ?? false,
      fields: [...(view.fields ?? [])],
      managedFields: view.managedFields ?? false,
    }
  );
}

/** ADDED and MODIFIED: the events the own-write rule may hold back (never DELETED or a marker). */
function isState(type: EventType): boolean {
  return type === EventType.ADDED || type === EventType.MODIFIED;
}
