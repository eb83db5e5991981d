// Every generated message, enum and service client of consistd.v1, in one namespace (exported as `proto`).
export * from "./gen/consistd/v1/inbox.js";
export * from "./gen/consistd/v1/leadership.js";
export * from "./gen/consistd/v1/object.js";
export * from "./gen/consistd/v1/objects.js";
export * from "./gen/consistd/v1/outbox.js";
export * from "./gen/consistd/v1/reconcile.js";
export * from "./gen/consistd/v1/refusal.js";
export * from "./gen/consistd/v1/rollout.js";
export * from "./gen/consistd/v1/watch.js";
export { Duration } from "./gen/google/protobuf/duration.js";
export { Timestamp } from "./gen/google/protobuf/timestamp.js";
