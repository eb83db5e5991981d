// One long-lived bidirectional stream shared by many calls (SendStream, AckStream): each call's request goes
// out on it and its answer comes back in request order, so calls made together share the sidecar's disk
// flush instead of each paying for a unary call of its own.
import { type ClientDuplexStream, status } from "@grpc/grpc-js";
import { ConsistdError, isLostConnection, toConsistdError } from "./errors.js";
import type { Refusal } from "./gen/consistd/v1/refusal.js";

/** A call waiting for its answer; `settled` once answered, failed, or given up by its caller. */
interface Waiter<Res> {
  resolve(response: Res): void;
  reject(error: unknown): void;
  settled: boolean;
}

/** The error of a request the sidecar refused on the stream: the status its unary call would have answered. */
export function refused(refusal: Refusal): ConsistdError {
  return new ConsistdError(refusal.code as status, refusal.message);
}

/** A shared stream, opened by the first call and again by the first call after it broke. */
export class Ordered<Req, Res> {
  private stream?: OpenStream<Req, Res>;
  private closed = false;

  /** `open` starts the gRPC call; `what` names the operation in errors ("send", "ack"). */
  constructor(
    private readonly open: () => ClientDuplexStream<Req, Res>,
    private readonly what: string,
  ) {}

  /**
   * Sends `request` on the stream and resolves with its answer. A caller whose `signal` aborts is rejected
   * with its reason at once; its request stays on the stream and its answer is dropped.
   */
  call(request: Req, signal?: AbortSignal): Promise<Res> {
    if (this.closed) return Promise.reject(new ConsistdError(status.CANCELLED, `${this.what}: the client was closed`));
    if (!this.stream || this.stream.broken) this.stream = new OpenStream(this.open(), this.what);
    return this.stream.call(request, signal);
  }

  /** Ends the stream; waiting and later calls fail with CANCELLED. */
  close(): void {
    this.closed = true;
    this.stream?.break(new ConsistdError(status.CANCELLED, `${this.what}: the client was closed`));
  }
}

class OpenStream<Req, Res> {
  /** Why the stream broke; no call uses it after that. */
  broken?: ConsistdError;
  private readonly waiting: Waiter<Res>[] = [];

  constructor(
    private readonly duplex: ClientDuplexStream<Req, Res>,
    private readonly what: string,
  ) {
    duplex.on("data", (response: Res) => {
      // Answers come in request order: this one is the oldest waiting call's.
      const waiter = this.waiting.shift();
      if (waiter && !waiter.settled) {
        waiter.settled = true;
        waiter.resolve(response);
      }
    });
    duplex.on("error", (error: unknown) => this.break(this.lost(error)));
    duplex.on("end", () => this.break(this.lost(new ConsistdError(status.UNAVAILABLE, "the sidecar ended the stream"))));
  }

  call(request: Req, signal?: AbortSignal): Promise<Res> {
    if (this.broken) return Promise.reject(this.broken);
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<Res>((resolve, reject) => {
      const onAbort = () => {
        if (!waiter.settled) {
          waiter.settled = true;
          reject(signal?.reason);
        }
      };
      const waiter: Waiter<Res> = {
        resolve: (response) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(response);
        },
        reject: (error) => {
          signal?.removeEventListener("abort", onAbort);
          reject(error);
        },
        settled: false,
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      // The waiter and its request join in the same order: writes are queued by the stream in call order.
      this.waiting.push(waiter);
      this.duplex.write(request);
    });
  }

  /** Fails every call waiting on the stream with `error` and cancels it. */
  break(error: ConsistdError): void {
    if (this.broken) return;
    this.broken = error;
    for (const waiter of this.waiting.splice(0)) {
      if (!waiter.settled) {
        waiter.settled = true;
        waiter.reject(error);
      }
    }
    this.duplex.cancel();
  }

  /** The error for the calls of a stream that failed: a lost connection is UNAVAILABLE, as for a unary call. */
  private lost(error: unknown): ConsistdError {
    const e = toConsistdError(error);
    if (!(e instanceof ConsistdError) || isLostConnection(e)) {
      const details = e instanceof ConsistdError ? e.details : String(error);
      return new ConsistdError(status.UNAVAILABLE, `${this.what}: lost the connection to the sidecar: ${details}`, {
        cause: error,
      });
    }
    return new ConsistdError(e.code, `${this.what}: ${e.details}`, { cause: error });
  }
}
