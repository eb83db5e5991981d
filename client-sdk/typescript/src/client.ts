// A connection to one consistd sidecar over its Unix socket, and the entry points to every feature.
import { resolve } from "node:path";
import { Channel, type ChannelOptions, Client as GrpcClient, credentials } from "@grpc/grpc-js";
import type { Cancellable } from "./call.js";
import { NotReadyError } from "./errors.js";
import { InboxServiceClient } from "./gen/consistd/v1/inbox.js";
import { LeadershipServiceClient } from "./gen/consistd/v1/leadership.js";
import { ObjectsServiceClient } from "./gen/consistd/v1/objects.js";
import { OutboxServiceClient } from "./gen/consistd/v1/outbox.js";
import { ReconcileServiceClient } from "./gen/consistd/v1/reconcile.js";
import { RolloutServiceClient } from "./gen/consistd/v1/rollout.js";
import { DeliveryMode, WatchServiceClient } from "./gen/consistd/v1/watch.js";
import { checkHealth, ServingStatus } from "./health.js";
import { Inbox } from "./inbox.js";
import { Latest } from "./latest.js";
import { type CampaignOptions, elect, type Leadership, type ObserveOptions } from "./leadership.js";
import { Objects } from "./objects.js";
import { type Message, Outbox, type SendOptions, type Sent } from "./outbox.js";
import { OwnWrites } from "./ownwrites.js";
import { reconcile, type ReconcileHandler, type ReconcileOptions, type ReconcileSpec } from "./reconcile.js";
import { sleep } from "./retry.js";
import { watch, type WatchEvent, type WatchQuery } from "./watch.js";

/** Where the sidecar listens unless CONSISTD_SOCKET says otherwise. */
export const DEFAULT_SOCKET = "/var/run/consistd/consistd.sock";

/** How often `waitReady` asks again, in milliseconds. */
const READY_POLL_MS = 50;

/**
 * Reconnect quickly to a restarting sidecar: it is local, so grpc-js's defaults (1 s growing to 120 s)
 * would only delay recovery. The SDK's own streams back off on top of this.
 */
const CHANNEL_OPTIONS: ChannelOptions = {
  "grpc.initial_reconnect_backoff_ms": 100,
  "grpc.max_reconnect_backoff_ms": 1_000,
  // Answers of any size: a List (or a get, or a watch event) of big objects passes gRPC's default 4 MiB
  // receive limit, and the sidecar is the app's own, trusted, over a local socket.
  "grpc.max_receive_message_length": -1,
};

/** How to reach the sidecar. */
export interface ClientOptions {
  /** The socket path; default CONSISTD_SOCKET, else /var/run/consistd/consistd.sock. */
  socket?: string;
  /** Extra grpc-js channel options. */
  channelOptions?: ChannelOptions;
}

/**
 * A connection to one consistd sidecar. Connects lazily and reconnects on its own; call `close()` when done
 * so Node can exit.
 */
export class Client {
  /** The socket this client talks to (absolute). */
  readonly socket: string;
  /** The gRPC channel every service client below shares. */
  readonly channel: Channel;
  /** Reads and writes of Kubernetes objects (JSON in, JSON out). */
  readonly objects: Objects;
  /** Messages peers sent to this pod's app. */
  readonly inbox: Inbox;
  /** The generated service clients, for calls this layer does not wrap. */
  readonly services: {
    watch: WatchServiceClient;
    objects: ObjectsServiceClient;
    leadership: LeadershipServiceClient;
    outbox: OutboxServiceClient;
    inbox: InboxServiceClient;
    rollout: RolloutServiceClient;
    reconcile: ReconcileServiceClient;
  };
  private readonly health: GrpcClient;
  private readonly outbox: Outbox;
  /** The states this client's writes returned, per uid: what its watches apply the own-write rule with. */
  private readonly ownWrites = new OwnWrites();
  /** Aborted by close(): ends every stream of this client. */
  private readonly closed = new AbortController();

  /** A client for `socket` (a path, or options); with no argument, CONSISTD_SOCKET or the default path. */
  constructor(socket?: string | ClientOptions) {
    const options = typeof socket === "string" ? { socket } : (socket ?? {});
    this.socket = resolve(options.socket ?? process.env.CONSISTD_SOCKET ?? DEFAULT_SOCKET);
    const target = `unix:${this.socket}`;
    const insecure = credentials.createInsecure();
    this.channel = new Channel(target, insecure, { ...CHANNEL_OPTIONS, ...options.channelOptions });
    const shared = { channelOverride: this.channel };
    this.services = {
      watch: new WatchServiceClient(target, insecure, shared),
      objects: new ObjectsServiceClient(target, insecure, shared),
      leadership: new LeadershipServiceClient(target, insecure, shared),
      outbox: new OutboxServiceClient(target, insecure, shared),
      inbox: new InboxServiceClient(target, insecure, shared),
      rollout: new RolloutServiceClient(target, insecure, shared),
      reconcile: new ReconcileServiceClient(target, insecure, shared),
    };
    this.health = new GrpcClient(target, insecure, shared);
    this.objects = new Objects(this.services.objects, this.ownWrites);
    this.inbox = new Inbox(this.services.inbox);
    this.outbox = new Outbox(this.services.outbox);
  }

  /**
   * Waits until the sidecar's health service reports SERVING, asking again while the socket is missing or
   * the daemon is starting. Rejects with a NotReadyError naming the socket and the last answer seen.
   */
  async waitReady(timeoutMs = 30_000, options: Cancellable = {}): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      let last: string;
      try {
        const health = await checkHealth(this.health, new Date(Math.max(deadline, Date.now() + READY_POLL_MS)));
        if (health === ServingStatus.SERVING) return;
        last = `health is ${ServingStatus[health] ?? health}`;
      } catch (error) {
        // grpc-js appends an empty "Resolution note: " to connection errors; it says nothing here.
        last = (error instanceof Error ? error.message : String(error)).replace(/\s*Resolution note:\s*$/, "");
      }
      options.signal?.throwIfAborted();
      if (Date.now() + READY_POLL_MS > deadline) throw new NotReadyError(this.socket, timeoutMs, last);
      await sleep(READY_POLL_MS, options.signal);
    }
  }

  /**
   * Streams a watch's events (see WatchQuery; CONSISTENT mode unless `mode` says RAW). Reconnects and
   * resumes after the last delivered event on its own; SYNCED and RESYNC_REQUIRED arrive as events.
   * When the app takes an ADDED or MODIFIED state older than one a write through `this.objects` returned,
   * a CONSISTENT watch drops it and a RAW watch delivers it with `predatesOwnWrite` set.
   *
   *     for await (const ev of client.watch({ resource: "configmaps", namespace: "default" }, { signal })) { ... }
   */
  watch(query: WatchQuery, options: Cancellable = {}): AsyncGenerator<WatchEvent, void> {
    return watch(this.services.watch, query, this.ownWrites, { signal: this.signal(options) });
  }

  /**
   * The newest state of each object `query` names, from a CONSISTENT watch, handed to workers as they ask (see
   * Latest): the way to consume a CONSISTENT watch when the handler is slow. A worker never handles a state older
   * than this client's own write to the object, and never an object another worker holds. Nor is it handed back
   * the state of this client's own write made directly on the state the workers last had (the watch's
   * `previousResourceVersion` names it, and its version is the one the write returned): the workers have it
   * already. Another writer's change is handed out, and so is a state with no previous state (from a list or a
   * resync) and one that more than one write made since the last hand-out. The reader starts at once and runs
   * until `latest.close()`, the signal's abort or the client's close.
   *
   *     const latest = client.watchLatest({ resource: "configmaps", namespace: "default" });
   *     const taken = await latest.next(); // ADDED, MODIFIED or DELETED: the object's newest state
   *     try { ... } finally { taken.done(); }
   */
  watchLatest(query: Omit<WatchQuery, "mode" | "resumeCursor">, options: Cancellable = {}): Latest {
    const stop = new AbortController();
    const signal = AbortSignal.any([stop.signal, this.signal(options)]);
    const consistent = { ...query, mode: DeliveryMode.CONSISTENT, resumeCursor: "" };
    const events = watch(this.services.watch, consistent, this.ownWrites, { signal }, false);
    const latest = new Latest(events, this.ownWrites, () => stop.abort());
    signal.addEventListener("abort", () => latest.close(), { once: true });
    return latest;
  }

  /**
   * Whether `object` is older than a state a write through `this.objects` returned: the own-write rule a
   * watch applies as the app takes each event, for an app that keeps the events it took in a queue of its
   * own (a worker per object on the newest state, say). Such an app asks again when its worker takes a
   * state from that queue, since its own write may have returned while the state waited there. False for a
   * resourceVersion that is not a decimal integer (those are never compared).
   */
  predatesOwnWrite(object: { uid: string; resourceVersion: string }): boolean {
    return this.ownWrites.predates(object);
  }

  /**
   * Campaigns in `election` while the loop runs and streams this sidecar's view of it; leaving the loop
   * (or aborting) resigns at once. Yields UNKNOWN at once when the sidecar is lost, then campaigns again.
   *
   *     for await (const s of client.campaign("my-app", { signal })) if (s.isLeader) { ... }
   */
  campaign(election: string, options: CampaignOptions = {}): AsyncGenerator<Leadership, void> {
    return elect(this.services.leadership, election, { campaign: { ...options, signal: this.signal(options) } });
  }

  /** Streams `election`'s state without taking part, like `campaign`. */
  observe(election: string, options: ObserveOptions = {}): AsyncGenerator<Leadership, void> {
    return elect(this.services.leadership, election, { observe: { ...options, signal: this.signal(options) } });
  }

  /**
   * Stores a message in the sidecar's outbox; resolves once it is durable. `await sent.ack` for its first
   * outcome (ACKED, SUPERSEDED or FAILED with a reason), which the sidecar keeps until it is asked: waiting
   * starts only then, goes on through lost connections, and `sent.outcome({ signal })` bounds it.
   * The message carries the W3C trace context of the active OpenTelemetry span (or of `options.context`) to
   * the receiving app, unless it names its own `traceparent`. With `options.guard` (a `Leadership`, say) the
   * message is sent only while this sidecar leads that election in that term (else FAILED_PRECONDITION), and
   * carries the claim: the receiving app sees it as `delivery.guard`, and a receiving sidecar that has stored
   * a message of a later term refuses it (its outcome is FAILED).
   *
   *     await client.send(message, { guard: leadership });
   */
  send(message: Message, options: SendOptions = {}): Promise<Sent> {
    return this.outbox.send(message, options);
  }

  /**
   * Works on the reconcile queue `spec` names until `signal` aborts: `handler` gets each work item, at most
   * `spec.maxLeases` (default 1) at once and never two for one key, and how it settles completes the lease:
   * resolving is DONE, resolving with `requeueAfter(ms)` REQUEUE, throwing a `TerminalError` TERMINAL, throwing
   * anything else RETRY with its message (the key comes again after its backoff, with `attempt` and
   * `lastError`). Writes through `item.objects` name the lease, so the key's next pass waits until the queue's
   * watches show them. Reopens the stream after a lost connection; a refused completion is a warning. Resolves
   * once `signal` aborted and running handlers settled; rejects with the ConsistdError of a refused spec.
   *
   *     await client.reconcile({ name: "cm", resource: "configmaps", namespace: "default" }, async (item) => {
   *       if (item.deleted) return;
   *       await item.objects.patch({ resource: "configmaps", namespace: item.namespace, name: item.name, patch });
   *     }, { signal });
   */
  reconcile<T = any>(spec: ReconcileSpec, handler: ReconcileHandler<T>, options: ReconcileOptions = {}): Promise<void> {
    const signal = this.signal(options);
    return reconcile(this.services.reconcile, this.objects, spec, handler, { ...options, signal });
  }

  /** Ends every stream of this client and closes the connection. */
  close(): void {
    this.closed.abort();
    this.outbox.close();
    this.inbox.close();
    this.channel.close();
  }

  private signal(options: Cancellable): AbortSignal {
    return options.signal ? AbortSignal.any([options.signal, this.closed.signal]) : this.closed.signal;
  }
}

/** A client for `socket`, or for CONSISTD_SOCKET (else the default path) with no argument. */
export function connect(socket?: string | ClientOptions): Client {
  return new Client(socket);
}
