// @consistd/client: the TypeScript client for the consistd sidecar (watch, lead, send, receive, reconcile).
/**
 * Connect to the sidecar's Unix socket (CONSISTD_SOCKET, else /var/run/consistd/consistd.sock), wait until
 * it is ready, then watch, lead, write, send and receive:
 *
 *     const client = new Client();
 *     await client.waitReady(10_000);
 *     for await (const ev of client.watch({ resource: "configmaps", namespace: "default" })) {
 *       console.log(ev.typeName, ev.object?.name);
 *     }
 *
 * @module
 */
export { Client, type ClientOptions, connect, DEFAULT_SOCKET } from "./client.js";
export type { Cancellable } from "./call.js";
export { ConsistdError, NotReadyError } from "./errors.js";
export { ServingStatus } from "./health.js";
export { DEFAULT_RETRY_AFTER_MS, Delivery, Inbox, type ServeOptions } from "./inbox.js";
export { Latest, Taken } from "./latest.js";
export { type CampaignOptions, Leadership, type LeadershipFields, type ObserveOptions, type Timing } from "./leadership.js";
export {
  type Condition,
  type CreateRequest,
  type DeleteRequest,
  type GetRequest,
  type Guard,
  type JsonBody,
  KubeObject,
  type ListRequest,
  type ListResult,
  type ObjectEvent,
  Objects,
  type PatchRequest,
  type RecordEventRequest,
  type RecordEventResult,
  type SetConditionRequest,
  type SetConditionResult,
  type UpdateRequest,
} from "./objects.js";
export { type Message, Outcome, type SendOptions, Sent } from "./outbox.js";
export {
  type ChangeFilter,
  type MapsBy,
  type ReconcileHandler,
  type ReconcileOptions,
  type ReconcileQuery,
  type ReconcileSpec,
  type RelatedSpec,
  Requeue,
  requeueAfter,
  type RetryOptions,
  TerminalError,
  WorkItem,
} from "./reconcile.js";
export { inject as injectTraceContext, context as messageContext, type TraceFields } from "./trace.js";
export { type ObjectView, WatchEvent, type WatchQuery } from "./watch.js";

// The protocol's enums, by their short names (ts-proto's removeEnumPrefix): EventType.ADDED, Mode.CONSISTENT.
export type { InboxMessage } from "./gen/consistd/v1/inbox.js";
export { LeadershipState } from "./gen/consistd/v1/leadership.js";
export { PatchType, PropagationPolicy, ReadSource } from "./gen/consistd/v1/objects.js";
export { AckOutcome } from "./gen/consistd/v1/outbox.js";
export { ShardBy } from "./gen/consistd/v1/reconcile.js";
export { Consistency, DeliveryMode, DeliveryMode as Mode, EventType } from "./gen/consistd/v1/watch.js";
export { status } from "@grpc/grpc-js";

/** The generated messages and service clients, for everything this layer does not wrap. */
export * as proto from "./proto.js";
