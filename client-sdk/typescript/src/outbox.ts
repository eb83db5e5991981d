// Sends with awaitable outcomes: `send` resolves once the sidecar stored the message; `sent.ack` asks the
// sidecar for the message's first outcome (OutboxService.WaitOutcome). The SDK keeps no outcome stream and no
// table of outcomes: the sidecar keeps them.
import { status } from "@grpc/grpc-js";
import { type Context, context } from "@opentelemetry/api";
import { type Cancellable, unary } from "./call.js";
import { ConsistdError, isLostConnection } from "./errors.js";
import {
  AckOutcome,
  type Destination,
  type OutboxServiceClient,
  type SendStreamRequest,
  type SendStreamResponse,
  type WatchAcksResponse,
} from "./gen/consistd/v1/outbox.js";
import { body, type Guard, type JsonBody, toGuard } from "./objects.js";
import { Ordered, refused } from "./ordered.js";
import { Backoff } from "./retry.js";
import { inject } from "./trace.js";

/** One message for a peer's app. */
export interface Message {
  /** Where it goes: `{ peer: "host:port" }`, `{ service: { namespace, name } }` or `{ election: "name" }`. */
  to: Partial<Destination>;
  /** What the message is about; a newer event for the same resource supersedes an un-ACKed older one. */
  resourceId: string;
  /** This event of the resource; the receiver deduplicates by (sender, resourceId, eventId). */
  eventId: string;
  /** The body: bytes and strings are sent as they are, any other value as JSON. */
  payload: JsonBody;
  /** MIME type of the payload; "application/json" when the payload is neither string nor bytes. */
  contentType?: string;
  /**
   * The W3C trace context to deliver with the message. Unset, the send fills it from the span of
   * `SendOptions.context`, else of the active OpenTelemetry context (none without a valid span).
   */
  traceparent?: string;
  /** W3C `tracestate` going with `traceparent`. */
  tracestate?: string;
}

/** How to send. */
export interface SendOptions extends Cancellable {
  /** The OpenTelemetry context whose span the message carries to the receiver; default the active one. */
  context?: Context;
  /**
   * Sends only while this sidecar leads `guard.election` in exactly `guard.term`: otherwise the send rejects
   * with FAILED_PRECONDITION (details starting "guard: ") and nothing is stored. The message carries the
   * claim to the receiver, whose app sees it (`Delivery.guard`, `InboxMessage.guard`); a receiving sidecar
   * that has stored a message of a later term of the same election refuses it for good, and its outcome is
   * FAILED naming both terms. A `Leadership` from `campaign`, or a `WorkItem.guard`, is a valid guard.
   * Unset, the send is unguarded.
   */
  guard?: Guard;
}

/** How a sent message ended at a receiver. */
export class Outcome {
  /** ACKED, SUPERSEDED or FAILED. */
  readonly kind: AckOutcome;
  /** Why, for FAILED. */
  readonly reason: string;
  /** The peer address that answered. */
  readonly peer: string;
  /** The message's id. */
  readonly messageId: string;
  /** When the outcome was decided. */
  readonly at?: Date;

  constructor(response: WatchAcksResponse) {
    this.kind = response.outcome;
    this.reason = response.reason;
    this.peer = response.peer;
    this.messageId = response.messageId;
    this.at = response.at;
  }

  /** Whether the receiving app acknowledged the message. */
  get isAcked(): boolean {
    return this.kind === AckOutcome.ACKED;
  }

  /** The outcome's name: "ACKED", "SUPERSEDED" or "FAILED". */
  get kindName(): string {
    return AckOutcome[this.kind] ?? String(this.kind);
  }
}

/**
 * A message the sidecar has stored; it delivers and resends it until the receiving app ACKs. Its outcome is
 * asked for only when the app asks (`ack` or `outcome()`): a send never awaited costs nothing more.
 */
export class Sent {
  /** The outcome, once the sidecar answered it. */
  private known?: Outcome;
  /** The wait `ack` started, while it runs. */
  private waiting?: Promise<Outcome>;

  /**
   * @param messageId the sidecar's id for the message
   * @param wait asks the sidecar for the message's first outcome until it answers or `signal` aborts
   */
  constructor(
    readonly messageId: string,
    private readonly wait: (signal?: AbortSignal) => Promise<Outcome>,
  ) {}

  /**
   * The message's first outcome (for a Service or election destination, the first receiver's answer): ACKED,
   * SUPERSEDED or FAILED with a reason. Reading it starts the wait (reads while it runs share it) unless the
   * outcome is known already, which it then resolves to without asking the sidecar again. Waits as long as it
   * takes, through lost connections to the sidecar (an outcome that came meanwhile is still seen). Rejects
   * with any other error as the daemon answered it, e.g. NOT_FOUND when the sidecar no longer knows the
   * outcome (it restarted since, or 10,000 later outcomes came), or with CANCELLED once the client is closed;
   * the next read then asks again. `outcome({ signal })` bounds a wait.
   */
  get ack(): Promise<Outcome> {
    if (this.known) return Promise.resolve(this.known);
    this.waiting ??= this.outcome().finally(() => (this.waiting = undefined));
    return this.waiting;
  }

  /**
   * The message's first outcome, as `ack` gives it, waiting at most until `options.signal` aborts: the wait
   * then rejects with the signal's reason (a TimeoutError for `AbortSignal.timeout(ms)`). Calling again goes
   * on waiting, and nothing that came in between is missed.
   *
   *     const outcome = await sent.outcome({ signal: AbortSignal.timeout(5_000) });
   */
  async outcome(options: Cancellable = {}): Promise<Outcome> {
    if (this.known) return this.known;
    const outcome = await this.wait(options.signal);
    this.known ??= outcome;
    return this.known;
  }
}

/** Sends this client's messages on one SendStream, and asks the sidecar for their outcomes. */
export class Outbox {
  /** Every send of this client goes out on one SendStream. */
  private readonly sends: Ordered<SendStreamRequest, SendStreamResponse>;
  /** The waits for an outcome that are running, each cancelled by its controller: close() ends them. */
  private readonly waits = new Set<AbortController>();
  private closed = false;

  constructor(private readonly service: OutboxServiceClient) {
    this.sends = new Ordered(() => service.sendStream(), "send");
  }

  /**
   * Stores the message in the sidecar's outbox and returns once it is durable. The message carries the
   * trace context of `options.context`, else of the context active at the call, unless it names its own,
   * and is sent only in the term of `options.guard`, when set.
   */
  async send(message: Message, options: SendOptions = {}): Promise<Sent> {
    const isRaw = typeof message.payload === "string" || message.payload instanceof Uint8Array;
    const request = {
      destination: message.to,
      resourceId: message.resourceId,
      eventId: message.eventId,
      payload: body(message.payload),
      contentType: message.contentType ?? (isRaw ? "" : "application/json"),
      traceparent: message.traceparent ?? "",
      tracestate: message.tracestate ?? "",
      guard: toGuard(options.guard),
    };
    inject(request, options.context ?? context.active());
    const answer = await this.sends.call({ message: request }, options.signal);
    if (answer.refusal) throw refused(answer.refusal);
    const { messageId } = answer;
    return new Sent(messageId, (signal) => this.waitOutcome(messageId, signal));
  }

  /** Ends the SendStream and every wait for an outcome; sends and waits still running fail with CANCELLED. */
  close(): void {
    this.closed = true;
    for (const wait of this.waits) wait.abort();
    this.sends.close();
  }

  /**
   * Calls WaitOutcome for message `messageId` until the sidecar answers it, again (with the reconnect backoff)
   * after a lost connection. Rejects with the daemon's error, with `signal`'s reason once it aborts, or with
   * CANCELLED once the client is closed.
   */
  private async waitOutcome(messageId: string, signal?: AbortSignal): Promise<Outcome> {
    const wait = new AbortController();
    const onAbort = () => wait.abort();
    signal?.addEventListener("abort", onAbort, { once: true });
    this.waits.add(wait);
    try {
      const backoff = new Backoff();
      for (;;) {
        this.throwIfStopped(messageId, signal);
        try {
          const request = { messageId };
          const answer = await unary(this.service.waitOutcome.bind(this.service), request, { signal: wait.signal });
          if (!answer.outcome) {
            throw new ConsistdError(status.INTERNAL, `outcome of message ${messageId}: the sidecar answered none`);
          }
          return new Outcome(answer.outcome);
        } catch (error) {
          this.throwIfStopped(messageId, signal);
          if (!isLostConnection(error)) throw error;
        }
        await backoff.wait(wait.signal);
      }
    } finally {
      signal?.removeEventListener("abort", onAbort);
      this.waits.delete(wait);
    }
  }

  /** Throws once the client is closed (CANCELLED) or `signal` aborted (its reason). */
  private throwIfStopped(messageId: string, signal?: AbortSignal): void {
    if (this.closed) {
      throw new ConsistdError(status.CANCELLED, `outcome of message ${messageId}: the client was closed`);
    }
    signal?.throwIfAborted();
  }
}
