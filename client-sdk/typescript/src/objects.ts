// Reads and writes of Kubernetes objects through the sidecar, as JSON, optionally fenced by a leader's term.
import { status as grpcStatus } from "@grpc/grpc-js";
import { type Cancellable, unary } from "./call.js";
import { ConsistdError } from "./errors.js";
import type { KubeObject as KubeObjectProto, WriteGuard } from "./gen/consistd/v1/object.js";
import {
  type Condition as ConditionProto,
  ConditionStatus,
  EventSeverity,
  type ObjectsServiceClient,
  PatchType,
  type PropagationPolicy,
  type ReadSource,
} from "./gen/consistd/v1/objects.js";
import { OwnWrites } from "./ownwrites.js";

/** A Kubernetes object as the sidecar served it: the fields apps route by, and its JSON. */
export class KubeObject<T = any> {
  /** metadata.uid: stable for the object's life; a re-created object has a new one. */
  readonly uid: string;
  /** metadata.namespace; empty for cluster-scoped objects. */
  readonly namespace: string;
  /** metadata.name. */
  readonly name: string;
  /**
   * metadata.resourceVersion. Kubernetes 1.35+ makes it a decimal integer that grows with every change
   * (KEP-5504), so two versions of one object compare as numbers; before 1.35, compare for equality only.
   */
  readonly resourceVersion: string;
  /**
   * The object as JSON bytes, as the apiserver served it. From a watch or a queue, as its `view` keeps it (by
   * default whole but for metadata.managedFields); from `objects`, whole (one read from a watch's cache has
   * managedFields only if that watch keeps them).
   */
  readonly raw: Uint8Array;
  /**
   * True when an `update` or `patch` would have changed nothing and was not sent: the sidecar's synced watch
   * cache already showed the object as the write would leave it, and this is that cached object (its
   * resourceVersion unchanged). False for every object not returned by such a write, and for a write sent with
   * `sendUnchanged`.
   */
  readonly unchanged: boolean;
  private parsed?: T;

  constructor(proto: KubeObjectProto, unchanged = false) {
    this.uid = proto.uid;
    this.namespace = proto.namespace;
    this.name = proto.name;
    this.resourceVersion = proto.resourceVersion;
    this.raw = proto.json;
    this.unchanged = unchanged;
  }

  /** The object (apiVersion, kind, metadata, spec, data, status, ...) of `raw`, parsed once on first use. */
  get json(): T {
    this.parsed ??= JSON.parse(Buffer.from(this.raw.buffer, this.raw.byteOffset, this.raw.byteLength).toString("utf8"));
    return this.parsed as T;
  }
}

/**
 * Names an election and the term the write is made in: the daemon refuses the write (FAILED_PRECONDITION)
 * unless it leads that election in exactly that term. A `Leadership` from `campaign` is a valid guard. Sends
 * take one too (`SendOptions.guard`).
 */
export interface Guard {
  /** Election name. */
  election: string;
  /** Namespace of the election's Lease; empty or unset means the daemon's own namespace. */
  namespace?: string;
  /**
   * The fencing term the app was told it leads in. Terms start at 1: a guard with term 0 (what an unset
   * term reads as) is refused with INVALID_ARGUMENT naming `guard.term`.
   */
  term: bigint | number | string;
}

/** A JSON document: any value is serialised with JSON.stringify; a string or bytes are sent as they are. */
export type JsonBody = string | Uint8Array | object;

/** What every object request names. */
interface Target {
  /** The resource: "configmaps", "deployments.apps", "apps/v1/deployments" or a kind such as "Deployment". */
  resource: string;
  /** Namespace; empty or unset for cluster-scoped resources (for list: every namespace). */
  namespace?: string;
}

/** One object to read. */
export interface GetRequest extends Target {
  name: string;
  /** When served from cache, first wait until this pod's pending writes to the object are visible. */
  readYourWrites?: boolean;
}

/** Objects to list. */
export interface ListRequest extends Target {
  labelSelector?: string;
  fieldSelector?: string;
  /** When served from cache, first wait until this pod's pending writes are visible. */
  readYourWrites?: boolean;
}

/** The objects a list found. */
export interface ListResult<T> {
  items: KubeObject<T>[];
  /** The list's resourceVersion. */
  resourceVersion: string;
  /** Whether the watch hub's cache or the apiserver answered. */
  source: ReadSource;
}

/** An object to create. */
export interface CreateRequest extends Target {
  /** The object; metadata.name (or generateName) must be set. */
  object: JsonBody;
  /** Field manager recorded by the apiserver; default "consistd". */
  fieldManager?: string;
  guard?: Guard;
  /** The reconcile lease (`WorkItem.leaseId`) this write is made for; see `WorkItem.objects`. */
  reconcileLease?: string;
}

/** A replacement for an object; metadata.resourceVersion in it makes the update conditional. */
export interface UpdateRequest extends Target {
  /** Defaults to the object's metadata.name. */
  name?: string;
  object: JsonBody;
  /** "status" to replace the status subresource. */
  subresource?: string;
  fieldManager?: string;
  guard?: Guard;
  /** The reconcile lease (`WorkItem.leaseId`) this write is made for; see `WorkItem.objects`. */
  reconcileLease?: string;
  /**
   * Send the write to the apiserver even when the sidecar's watch cache shows it would change nothing (the answer
   * is then never `unchanged`): for an app that wants the apiserver's own answer (its admission, its
   * resourceVersion check) every time. Default false: such a write is answered from the cache, `unchanged`.
   */
  sendUnchanged?: boolean;
}

/** A patch of an object. */
export interface PatchRequest extends Target {
  name: string;
  /** The patch document (for APPLY, the applied configuration). */
  patch: JsonBody;
  /** Default MERGE (RFC 7386 JSON merge patch). */
  type?: PatchType;
  /** "status" to patch the status subresource. */
  subresource?: string;
  /** Required for APPLY. */
  fieldManager?: string;
  /** APPLY only: take ownership of conflicting fields. */
  force?: boolean;
  guard?: Guard;
  /** The reconcile lease (`WorkItem.leaseId`) this write is made for; see `WorkItem.objects`. */
  reconcileLease?: string;
  /**
   * Send the write to the apiserver even when the sidecar's watch cache shows it would change nothing (the answer
   * is then never `unchanged`): for an app that wants the apiserver's own answer (its admission, its
   * resourceVersion check) every time. Default false: such a write is answered from the cache, `unchanged`.
   */
  sendUnchanged?: boolean;
}

/** An object to delete, optionally only while it still has a given uid or resourceVersion. */
export interface DeleteRequest extends Target {
  name: string;
  preconditionUid?: string;
  preconditionResourceVersion?: string;
  propagationPolicy?: PropagationPolicy;
  guard?: Guard;
  /** The reconcile lease (`WorkItem.leaseId`) this write is made for; see `WorkItem.objects`. */
  reconcileLease?: string;
}

/**
 * One status condition, as metav1.Condition has it; its lastTransitionTime is the daemon's to set. The daemon
 * checks each field as metav1.Condition's rules say and refuses a wrong one, `INVALID_ARGUMENT` naming it
 * ("condition.reason: ...").
 */
export interface Condition {
  /** The condition's type, e.g. "Ready" (at most 316 characters, an optional DNS subdomain prefix and '/'). */
  type: string;
  /**
   * "True", "False" or "Unknown", as Kubernetes spells it. Anything else is refused before it is sent, with a
   * `ConsistdError` `INVALID_ARGUMENT` naming `condition.status`.
   */
  status: "True" | "False" | "Unknown";
  /** Why, in CamelCase, e.g. "Available" (a letter, then letters, digits, '_', ',' and ':'). */
  reason: string;
  /** For humans; default empty. */
  message?: string;
  /**
   * The metadata.generation the condition was judged on; unset or 0: the generation of the object as the daemon
   * reads it. `WorkItem.setCondition` sets it to the generation of the object the pass was handed.
   */
  observedGeneration?: bigint | number;
}

/** A status condition to set on one object (`Objects.setCondition`). */
export interface SetConditionRequest extends Target {
  name: string;
  condition: Condition;
  /** The prefix of the field managers; default "consistd". Each condition type is applied as "<prefix>/<type>". */
  fieldManager?: string;
  guard?: Guard;
  /** The reconcile lease (`WorkItem.leaseId`) this write is made for; see `WorkItem.objects`. */
  reconcileLease?: string;
}

/** What setting a status condition did. */
export interface SetConditionResult<T> {
  /** Whether a write was sent: false when the object already had the condition as asked. */
  changed: boolean;
  /** The condition's lastTransitionTime (RFC 3339), as written, or as it was when nothing was written. */
  lastTransitionTime: string;
  /** The object as the write left it, or as the daemon read it when nothing was written. */
  object: KubeObject<T>;
}

/**
 * An event about an object, as events.k8s.io/v1 has it: what `WorkItem.recordEvent` takes. The daemon checks each
 * field and refuses a wrong one, `INVALID_ARGUMENT` naming it.
 */
export interface ObjectEvent {
  /**
   * "Normal" (something happened, nothing to worry about) or "Warning" (something is not as it should be), as
   * Kubernetes spells an event's type. Anything else is refused before it is sent, with a `ConsistdError`
   * `INVALID_ARGUMENT` naming `severity`.
   */
  severity: "Normal" | "Warning";
  /** Why, in CamelCase, e.g. "ScalingReplicaSet" (1 to 128 characters). */
  reason: string;
  /** What was done or failed, in CamelCase, e.g. "Scale" (1 to 128 characters). */
  action: string;
  /** For humans (at most 1024 bytes); default empty. */
  note?: string;
}

/** An event to record about one object (`Objects.recordEvent`). */
export interface RecordEventRequest extends Target, ObjectEvent {
  name: string;
  /**
   * The object's metadata.uid, when the app has it; unset or empty: the daemon reads it (and names an object that
   * is gone without one). `WorkItem.recordEvent` sends the uid of the object the pass was handed.
   */
  uid?: string;
  /**
   * The controller reporting it, e.g. "example.com/bucket-operator" (at most 128 characters); default "consistd".
   * `WorkItem.recordEvent` sends the queue's name.
   */
  reportingController?: string;
}

/** What recording an event did. */
export interface RecordEventResult {
  /** False when the rate limit of the reporting controller's events about the object dropped it. */
  recorded: boolean;
}

/**
 * Kubernetes objects through the sidecar. Every write records an expectation, so CONSISTENT watchers
 * of this pod see its own write; apiserver errors keep their meaning (conflict is ABORTED, 404 NOT_FOUND).
 * Every write also records the state it returned in `ownWrites` (the client's), so that the client's
 * watches hold back a state older than it that was already on its way (the own-write rule); a `setCondition`
 * that wrote nothing records nothing.
 */
export class Objects {
  /**
   * `lease`: the reconcile lease every write names unless its request says otherwise (`forLease`); empty for
   * none.
   */
  constructor(
    private readonly service: ObjectsServiceClient,
    private readonly ownWrites: OwnWrites = new OwnWrites(),
    private readonly lease = "",
  ) {}

  /**
   * The same objects, with every write naming the reconcile lease `leaseId` (a `WorkItem.leaseId`): the key's
   * next pass then waits until the queue's watch of the written object shows the write (a child created for
   * the key, say). `WorkItem.objects` is this view for its lease. A write made after its lease ended is not
   * waited for.
   */
  forLease(leaseId: string): Objects {
    return new Objects(this.service, this.ownWrites, leaseId);
  }

  /** Reads one object. */
  async get<T = any>(request: GetRequest, options?: Cancellable): Promise<KubeObject<T>> {
    const { resource, namespace = "", name, readYourWrites = false } = request;
    const response = await unary(this.service.get.bind(this.service), { resource, namespace, name, readYourWrites }, options);
    return toObject<T>(response.object);
  }

  /** Lists the objects matching the selectors. */
  async list<T = any>(request: ListRequest, options?: Cancellable): Promise<ListResult<T>> {
    const { resource, namespace = "", labelSelector = "", fieldSelector = "", readYourWrites = false } = request;
    const response = await unary(
      this.service.list.bind(this.service),
      { resource, namespace, labelSelector, fieldSelector, readYourWrites },
      options,
    );
    return {
      items: response.objects.map((o) => new KubeObject<T>(o)),
      resourceVersion: response.resourceVersion,
      source: response.source,
    };
  }

  /** Creates an object and returns it as stored. */
  async create<T = any>(request: CreateRequest, options?: Cancellable): Promise<KubeObject<T>> {
    const { resource, namespace = "", object, fieldManager = "", guard } = request;
    const response = await unary(
      this.service.create.bind(this.service),
      {
        resource,
        namespace,
        object: body(object),
        fieldManager,
        guard: toGuard(guard),
        reconcileLease: this.leaseOf(request),
      },
      options,
    );
    return this.written(toObject<T>(response.object));
  }

  /**
   * Replaces an object (or its status) and returns it as stored; when the sidecar's watch cache shows the update
   * would change nothing, it is not sent and the cached object comes back marked `unchanged` (see
   * `sendUnchanged`).
   */
  async update<T = any>(request: UpdateRequest, options?: Cancellable): Promise<KubeObject<T>> {
    const { resource, namespace = "", object, subresource = "", fieldManager = "", guard } = request;
    const name = request.name ?? (object as { metadata?: { name?: string } }).metadata?.name ?? "";
    const response = await unary(
      this.service.update.bind(this.service),
      {
        resource,
        namespace,
        name,
        object: body(object),
        subresource,
        fieldManager,
        guard: toGuard(guard),
        reconcileLease: this.leaseOf(request),
        sendUnchanged: request.sendUnchanged ?? false,
      },
      options,
    );
    return this.written(toObject<T>(response.object, response.unchanged));
  }

  /**
   * Patches an object (a JSON merge patch unless `type` says otherwise) and returns it as stored; a merge or JSON
   * patch that the sidecar's watch cache shows would change nothing is not sent, and the cached object comes back
   * marked `unchanged` (see `sendUnchanged`).
   */
  async patch<T = any>(request: PatchRequest, options?: Cancellable): Promise<KubeObject<T>> {
    const { resource, namespace = "", name, patch, type = PatchType.MERGE, subresource = "" } = request;
    const response = await unary(
      this.service.patch.bind(this.service),
      {
        resource,
        namespace,
        name,
        patchType: type,
        patch: body(patch),
        subresource,
        fieldManager: request.fieldManager ?? "",
        force: request.force ?? false,
        guard: toGuard(request.guard),
        reconcileLease: this.leaseOf(request),
        sendUnchanged: request.sendUnchanged ?? false,
      },
      options,
    );
    return this.written(toObject<T>(response.object, response.unchanged));
  }

  /** Deletes an object; returns its last state when the apiserver sent it back. */
  async delete<T = any>(request: DeleteRequest, options?: Cancellable): Promise<KubeObject<T> | undefined> {
    const { resource, namespace = "", name, guard } = request;
    const response = await unary(
      this.service.delete.bind(this.service),
      {
        resource,
        namespace,
        name,
        preconditionUid: request.preconditionUid ?? "",
        preconditionResourceVersion: request.preconditionResourceVersion ?? "",
        propagationPolicy: request.propagationPolicy ?? 0,
        guard: toGuard(guard),
        reconcileLease: this.leaseOf(request),
      },
      options,
    );
    return response.object && this.written(new KubeObject<T>(response.object));
  }

  /**
   * Sets one condition of an object's status.conditions, as apimachinery's meta.SetStatusCondition does, in the
   * daemon (`ObjectsService.SetCondition`): it reads the object and writes nothing when the condition of that type
   * is already there with the same status, reason, message and observedGeneration (`changed` false); otherwise it
   * applies that condition alone to the status subresource with server-side apply, under a field manager of its
   * own per type ("<fieldManager>/<type>") so that setting one condition never drops another, its
   * lastTransitionTime kept while its status stays, else now. status.conditions must therefore be a list map keyed
   * by type (`x-kubernetes-list-type: map`, `x-kubernetes-list-map-keys: [type]`, what Go's []metav1.Condition with
   * `+listType=map` and `+listMapKey=type` generates): on an atomic list the write replaces every other condition. A
   * resource without a status subresource is NOT_FOUND. A write is recorded for the own-write rule; an answer that
   * wrote nothing is not (its object is only as the daemon read it). `WorkItem.setCondition` fills the request in
   * for an item's primary.
   */
  async setCondition<T = any>(request: SetConditionRequest, options?: Cancellable): Promise<SetConditionResult<T>> {
    const { resource, namespace = "", name, fieldManager = "", guard } = request;
    const response = await unary(
      this.service.setCondition.bind(this.service),
      {
        resource,
        namespace,
        name,
        condition: toCondition(request.condition),
        fieldManager,
        guard: toGuard(guard),
        reconcileLease: this.leaseOf(request),
      },
      options,
    );
    const object = toObject<T>(response.object);
    if (response.changed) this.written(object);
    return { changed: response.changed, lastTransitionTime: response.lastTransitionTime, object };
  }

  /**
   * Records an event (events.k8s.io/v1) about an object, correlated in the daemon (`ObjectsService.RecordEvent`) as
   * client-go's event recorder does, once for every app of the pod: an event whose severity, reason, action,
   * reporting controller and object match one recorded within 6 minutes is counted on that one's series (its count
   * and lastObservedTime; its note stays the first's), not written anew; and a reporting controller's events about
   * one object pass client-go's rate limit (a burst of 25, then one per 5 minutes), one over it dropped and answered
   * `recorded: false`. It is written to the object's namespace ("default" for a cluster-scoped one). It is not a
   * write of the object: it names no lease and records nothing for the own-write rule. A `severity` other than
   * "Normal" or "Warning" rejects with a `ConsistdError` `INVALID_ARGUMENT` naming `severity`, before anything is
   * sent; the daemon's refusals reject as every call's do. The sidecar needs RBAC to create and patch
   * events.k8s.io events. `WorkItem.recordEvent` fills the request in for an item's primary.
   */
  async recordEvent(request: RecordEventRequest, options?: Cancellable): Promise<RecordEventResult> {
    const { resource, namespace = "", name, uid = "", reason, action, note = "", reportingController = "" } = request;
    const response = await unary(
      this.service.recordEvent.bind(this.service),
      {
        resource,
        namespace,
        name,
        uid,
        severity: toEventSeverity(request.severity),
        reason,
        action,
        note,
        reportingController,
      },
      options,
    );
    return { recorded: response.recorded };
  }

  /** The lease a write names: its request's, else this view's. */
  private leaseOf(request: { reconcileLease?: string }): string {
    return request.reconcileLease ?? this.lease;
  }

  /**
   * Records the state a write returned, for the own-write rule of the client's watches. An `unchanged` answer is
   * recorded like any other: the cached object is a state the object really has, never older than this pod's own
   * writes to it, so a state older than it is rightly held back; the record keeps the largest version either way.
   */
  private written<T>(object: KubeObject<T>): KubeObject<T> {
    this.ownWrites.record(object);
    return object;
  }
}

/** The bytes of a JSON body. */
export function body(value: JsonBody): Buffer {
  if (typeof value === "string") return Buffer.from(value, "utf8");
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  return Buffer.from(JSON.stringify(value), "utf8");
}

/** The protocol's WriteGuard for `guard`: an unset namespace is empty (the daemon's own); undefined for none. */
export function toGuard(guard: Guard | undefined): WriteGuard | undefined {
  return guard && { election: guard.election, namespace: guard.namespace ?? "", term: BigInt(guard.term) };
}

/**
 * The protocol's Condition for `condition`; a status other than "True", "False" or "Unknown", or an observedGeneration
 * that is not a whole number, is refused here as the daemon would refuse it: INVALID_ARGUMENT naming the field.
 */
function toCondition(condition: Condition): ConditionProto {
  const { type, reason, message = "", observedGeneration = 0 } = condition;
  const generation = typeof observedGeneration === "bigint" ? observedGeneration : Number(observedGeneration);
  if (typeof generation === "number" && !Number.isSafeInteger(generation)) {
    const why = `${String(observedGeneration)} is not a whole number`;
    throw new ConsistdError(grpcStatus.INVALID_ARGUMENT, `condition.observedGeneration: ${why}`);
  }
  return { type, status: toConditionStatus(condition.status), reason, message, observedGeneration: BigInt(generation) };
}

/** The protocol's ConditionStatus for a status as Kubernetes spells it. */
function toConditionStatus(status: unknown): ConditionStatus {
  switch (status) {
    case "True":
      return ConditionStatus.TRUE;
    case "False":
      return ConditionStatus.FALSE;
    case "Unknown":
      return ConditionStatus.UNKNOWN;
    default: {
      const why = `${JSON.stringify(status) ?? String(status)} is not "True", "False" or "Unknown"`;
      throw new ConsistdError(grpcStatus.INVALID_ARGUMENT, `condition.status: ${why}`);
    }
  }
}

/**
 * The protocol's EventSeverity for a severity as Kubernetes spells an event's type; anything else is refused here
 * as the daemon would refuse it: INVALID_ARGUMENT naming `severity`.
 */
function toEventSeverity(severity: unknown): EventSeverity {
  switch (severity) {
    case "Normal":
      return EventSeverity.NORMAL;
    case "Warning":
      return EventSeverity.WARNING;
    default: {
      const why = `${JSON.stringify(severity) ?? String(severity)} is not "Normal" or "Warning"`;
      throw new ConsistdError(grpcStatus.INVALID_ARGUMENT, `severity: ${why}`);
    }
  }
}

function toObject<T>(proto: KubeObjectProto | undefined, unchanged = false): KubeObject<T> {
  if (!proto) throw new Error("consistd answered without an object");
  return new KubeObject<T>(proto, unchanged);
}
