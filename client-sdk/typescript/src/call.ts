// Calls on grpc-js clients as promises and async iterators, cancelled by an AbortSignal.
import type { CallOptions, ClientReadableStream, ClientUnaryCall, Metadata, ServiceError } from "@grpc/grpc-js";
import { Metadata as GrpcMetadata } from "@grpc/grpc-js";
import { toConsistdError } from "./errors.js";

/** Cancellation shared by every streaming and waiting call of the SDK. */
export interface Cancellable {
  /** Aborting it ends the call: a stream then ends without an error, a promise rejects. */
  signal?: AbortSignal;
}

/** A generated unary method, bound to its client. */
export type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** Makes one unary call; rejects with a ConsistdError (or the signal's reason when aborted). */
export function unary<Req, Res>(method: UnaryMethod<Req, Res>, request: Req, options: Cancellable = {}): Promise<Res> {
  const { signal } = options;
  return new Promise<Res>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => call.cancel();
    const call = method(request, new GrpcMetadata(), {}, (error, response) => {
      signal?.removeEventListener("abort", onAbort);
      if (error) reject(signal?.aborted ? signal.reason : toConsistdError(error));
      else resolve(response);
    });
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * The messages of a server stream. Ends when the stream ends or `signal` aborts (the call is then
 * cancelled), throws a ConsistdError when it fails, and cancels the call when the caller stops early.
 */
export async function* messages<T>(call: ClientReadableStream<T>, signal?: AbortSignal): AsyncGenerator<T, void> {
  const onAbort = () => call.cancel();
  if (signal?.aborted) onAbort();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    for await (const message of call) {
      if (signal?.aborted) return;
      yield message as T;
    }
  } catch (error) {
    if (signal?.aborted) return;
    throw toConsistdError(error);
  } finally {
    signal?.removeEventListener("abort", onAbort);
    call.cancel();
  }
}
