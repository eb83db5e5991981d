// Messages from peer pods: a handler that ACKs when it returns and NACKs when it throws, or deliveries to ACK by hand.
import { type Context, context, SpanStatusCode, trace } from "@opentelemetry/api";
import { type Cancellable, messages, unary } from "./call.js";
import { ended, isRetryable, toConsistdError } from "./errors.js";
import type {
  AckStreamRequest,
  AckStreamResponse,
  InboxMessage,
  InboxServiceClient,
} from "./gen/consistd/v1/inbox.js";
import { duration } from "./leadership.js";
import type { Guard } from "./objects.js";
import { Ordered, refused } from "./ordered.js";
import { Backoff } from "./retry.js";
import { context as messageContext, startProcessing } from "./trace.js";

/** How long a NACKed message waits before it is delivered again, unless the caller says otherwise. */
export const DEFAULT_RETRY_AFTER_MS = 1_000;

/** How `serve` handles failures. */
export interface ServeOptions extends Cancellable {
  /** How long a message whose handler threw waits before it comes again; default 1 s. */
  retryAfterMs?: number;
}

/** One message handed to this app; the sidecar redelivers it until it is ACKed. */
export class Delivery {
  constructor(
    /** The message: sender, resourceId, eventId, payload, contentType, deliveryAttempt (1 at first), guard. */
    readonly message: InboxMessage,
    private readonly service: InboxServiceClient,
    private readonly acks: Ordered<AckStreamRequest, AckStreamResponse>,
  ) {}

  /**
   * The OpenTelemetry context the message was sent under, holding the sender's span as a remote parent
   * for the span of its processing; the root context when it was sent under none.
   */
  get context(): Context {
    return messageContext(this.message);
  }

  /**
   * The guard the sending app sent the message under (`SendOptions.guard`): its election, the Lease's
   * namespace and the term (a bigint) it led in; undefined for an unguarded send. This sidecar refuses every
   * later message of that election guarded by an older term.
   */
  get guard(): Guard | undefined {
    return this.message.guard;
  }

  /** Confirms the message was processed; resolves once the ACK is stored (it then travels back to the sender). */
  async ack(): Promise<void> {
    const answer = await this.acks.call({ messageId: this.message.messageId });
    if (answer.refusal) throw refused(answer.refusal);
  }

  /** Asks for the message again after `retryAfterMs`, with `reason` logged at the sidecar (cut to 4096 bytes). */
  async nack(reason: string, retryAfterMs = DEFAULT_RETRY_AFTER_MS): Promise<void> {
    const request = { messageId: this.message.messageId, retryAfter: duration(retryAfterMs), reason: cut(reason) };
    await unary(this.service.nack.bind(this.service), request);
  }
}

/** The pod's inbox: messages peers sent to this app. */
export class Inbox {
  /** Every ACK of this client goes out on one AckStream. */
  private readonly acks: Ordered<AckStreamRequest, AckStreamResponse>;

  constructor(private readonly service: InboxServiceClient) {
    this.acks = new Ordered(() => service.ackStream(), "ack");
  }

  /** Ends the ACK stream; ACKs still waiting fail with CANCELLED. */
  close(): void {
    this.acks.close();
  }

  /**
   * Streams the messages peers sent, oldest first, one at a time: the next comes once this one is ACKed or
   * NACKed. Reconnects when the sidecar restarts (a message not yet ACKed then comes again); any other
   * error ends the stream. Ends when `signal` aborts or the loop is left.
   */
  async *receive(options: Cancellable = {}): AsyncGenerator<Delivery, void> {
    const { signal } = options;
    const backoff = new Backoff();
    while (!signal?.aborted) {
      let failure: unknown = ended("inbox stream");
      try {
        for await (const response of messages(this.service.receive({}), signal)) {
          backoff.reset();
          if (response.message) yield new Delivery(response.message, this.service, this.acks);
        }
      } catch (error) {
        failure = toConsistdError(error);
      }
      if (signal?.aborted) return;
      if (!isRetryable(failure)) throw failure;
      await backoff.wait(signal);
    }
  }

  /**
   * Calls `handler` with each message: when it returns (or its promise resolves) the message is ACKed; when
   * it throws, the message is NACKed with the error's message as reason and comes again after
   * `retryAfterMs`. Reconnects to a restarting sidecar. Resolves when `signal` aborts: a message whose
   * handler is running is still settled first, so aborting from inside the handler stops after its ACK.
   * Rejects when a call fails with an error that reconnecting cannot mend.
   *
   * Each call runs in an OpenTelemetry CONSUMER span `process consistd.inbox`, child of the context the
   * message was sent under and active while the handler runs (`trace.getActiveSpan()`, given a context
   * manager); a throw records the exception and marks it ERROR. The span ends once the message is ACKed or
   * NACKed. Spans come from the global tracer provider, a no-op unless the app registered one.
   */
  async serve(handler: (message: InboxMessage) => unknown, options: ServeOptions = {}): Promise<void> {
    const { signal, retryAfterMs = DEFAULT_RETRY_AFTER_MS } = options;
    const stop = new AbortController();
    let busy = false;
    const onAbort = () => {
      if (!busy) stop.abort();
    };
    if (signal?.aborted) return;
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      for await (const delivery of this.receive({ signal: stop.signal })) {
        busy = true;
        const span = startProcessing(delivery.message.messageId, delivery.context);
        let settled: Promise<void>;
        try {
          await context.with(trace.setSpan(context.active(), span), handler, undefined, delivery.message);
          settled = delivery.ack();
        } catch (error) {
          const reason = error instanceof Error ? error.message : String(error);
          span.recordException(error instanceof Error ? error : reason);
          span.setStatus({ code: SpanStatusCode.ERROR, message: reason });
          settled = delivery.nack(reason, retryAfterMs);
        }
        try {
          await settled;
        } catch (error) {
          // An ACK or NACK lost to a restarting sidecar is harmless: the message comes again.
          if (!isRetryable(error)) throw error;
        } finally {
          span.end();
          busy = false;
        }
        if (signal?.aborted) break;
      }
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }
}

/** The longest NACK reason the daemon takes, in bytes. */
const MAX_REASON_BYTES = 4096;

/** `reason` cut to MAX_REASON_BYTES of UTF-8 without splitting a character. */
export function cut(reason: string): string {
  const bytes = Buffer.from(reason, "utf8");
  if (bytes.length <= MAX_REASON_BYTES) return reason;
  // Decoding a cut sequence yields U+FFFD at the end; drop it.
  return bytes.subarray(0, MAX_REASON_BYTES).toString("utf8").replace(/\uFFFD+$/, "");
}
