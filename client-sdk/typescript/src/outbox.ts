// ACK-tracked sends: `send` resolves once the sidecar stored the message; `sent.ack` resolves to its outcome.
import type { ClientReadableStream } from "@grpc/grpc-js";
import { type Cancellable, unary } from "./call.js";
import { status } from "@grpc/grpc-js";
import { type Context, context } from "@opentelemetry/api";
import { ConsistdError, ended, toConsistdError } from "./errors.js";
import {
  AckOutcome,
  type Destination,
  type OutboxServiceClient,
  type SendStreamRequest,
  type SendStreamResponse,
  type WatchAcksResponse,
} from "./gen/consistd/v1/outbox.js";
import { body, type JsonBody } from "./objects.js";
import { Ordered, refused } from "./ordered.js";
import { inject } from "./trace.js";

/** Outcomes that arrive before their Send has answered are kept, up to this many. */
const EARLY_OUTCOMES = 10_000;

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

/** A message the sidecar has stored; it delivers and resends it until the receiving app ACKs. */
export class Sent {
  /**
   * @param messageId the sidecar's id for the message
   * @param ack resolves to the outcome (for a Service or election destination, the first receiver's);
   *   rejects only when the outcome can no longer be seen (the connection to the sidecar was lost)
   */
  constructor(
    readonly messageId: string,
    readonly ack: Promise<Outcome>,
  ) {}
}

interface Waiter {
  resolve(outcome: Outcome): void;
  reject(error: unknown): void;
}

/**
 * Matches outcomes from one WatchAcks stream to the sends waiting for them. The stream is opened before a
 * send and stays open while any send or outcome is pending (so an idle client does not keep Node running).
 */
export class AckTracker {
  private stream?: ClientReadableStream<WatchAcksResponse>;
  private opening?: Promise<void>;
  private readonly waiting = new Map<string, Waiter>();
  private readonly early = new Map<string, Outcome>();
  private sending = 0;

  /** Every send of this client goes out on one SendStream. */
  private readonly sends: Ordered<SendStreamRequest, SendStreamResponse>;

  constructor(private readonly service: OutboxServiceClient) {
    this.sends = new Ordered(() => service.sendStream(), "send");
  }

  /**
   * Stores the message in the sidecar's outbox and returns once it is durable. The message carries the
   * trace context of `options.context`, else of the context active at the call, unless it names its own.
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
    };
    inject(request, options.context ?? context.active());
    this.sending++;
    try {
      await this.open();
      const answer = await this.sends.call({ message: request }, options.signal);
      if (answer.refusal) throw refused(answer.refusal);
      const { messageId } = answer;
      return new Sent(messageId, this.outcome(messageId));
    } finally {
      this.sending--;
      this.closeIfIdle();
    }
  }

  /** Cancels the outcome stream; sends still waiting fail. */
  close(): void {
    this.sends.close();
    this.fail(new ConsistdError(status.CANCELLED, "the client was closed"));
  }

  private outcome(messageId: string): Promise<Outcome> {
    const ack = new Promise<Outcome>((resolve, reject) => {
      const early = this.early.get(messageId);
      if (early) {
        this.early.delete(messageId);
        resolve(early);
      } else if (!this.stream) {
        reject(ended(`outcome stream before message ${messageId} was answered`));
      } else {
        this.waiting.set(messageId, { resolve, reject });
      }
    });
    // A caller that never awaits the outcome must not crash the process with an unhandled rejection.
    ack.catch(() => {});
    return ack;
  }

  /** Opens the WatchAcks stream unless it is open, and waits until the daemon answered it. */
  private open(): Promise<void> {
    if (this.stream && !this.opening) return Promise.resolve();
    this.opening ??= new Promise<void>((resolve, reject) => {
      const stream = this.service.watchAcks({ resourceId: "" });
      this.stream = stream;
      stream.on("metadata", () => {
        this.opening = undefined;
        resolve();
      });
      stream.on("data", (response: WatchAcksResponse) => this.settle(response));
      stream.on("error", (error) => {
        if (this.stream !== stream) return;
        const failure = toConsistdError(error);
        if (this.opening) {
          this.opening = undefined;
          this.stream = undefined;
          reject(failure);
        }
        this.fail(failure);
      });
      stream.on("end", () => this.stream === stream && this.fail(ended("outcome stream")));
    });
    return this.opening;
  }

  private settle(response: WatchAcksResponse): void {
    const outcome = new Outcome(response);
    const waiter = this.waiting.get(response.messageId);
    if (waiter) {
      this.waiting.delete(response.messageId);
      waiter.resolve(outcome);
      this.closeIfIdle();
      return;
    }
    if (this.early.size >= EARLY_OUTCOMES) this.early.delete(this.early.keys().next().value!);
    this.early.set(response.messageId, outcome);
  }

  /** Ends the stream and fails every send still waiting: its outcome can no longer be seen. */
  private fail(error: unknown): void {
    const stream = this.stream;
    this.stream = undefined;
    stream?.cancel();
    for (const [id, waiter] of this.waiting) {
      waiter.reject(
        error instanceof ConsistdError ? new ConsistdError(error.code, `outcome of message ${id}: ${error.details}`) : error,
      );
    }
    this.waiting.clear();
    this.early.clear();
  }

  private closeIfIdle(): void {
    if (this.sending === 0 && this.waiting.size === 0 && this.stream && !this.opening) {
      const stream = this.stream;
      this.stream = undefined;
      this.early.clear();
      stream.cancel();
    }
  }
}
