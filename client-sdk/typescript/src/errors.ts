// Errors from the sidecar, keeping the gRPC status code and the message the daemon sent.
import { type Metadata, status } from "@grpc/grpc-js";

/** A call to the sidecar failed. `code` is the gRPC status and `details` the daemon's own message. */
export class ConsistdError extends Error {
  /** The gRPC status code, e.g. `status.INVALID_ARGUMENT`. */
  readonly code: status;
  /** The message as the daemon sent it; INVALID_ARGUMENT names the field first ("resource: ..."). */
  readonly details: string;
  /** Trailing metadata, when the daemon sent any. */
  readonly metadata?: Metadata;

  constructor(code: status, details: string, options?: { metadata?: Metadata; cause?: unknown }) {
    super(`${status[code] ?? code}: ${details}`, { cause: options?.cause });
    this.name = "ConsistdError";
    this.code = code;
    this.details = details;
    this.metadata = options?.metadata;
  }

  /** The status code's name, e.g. "INVALID_ARGUMENT". */
  get codeName(): string {
    return status[this.code] ?? String(this.code);
  }
}

/** The sidecar did not report SERVING within the time `waitReady` was given. */
export class NotReadyError extends ConsistdError {
  /** The socket that was asked. */
  readonly socket: string;
  /** How long `waitReady` waited, in milliseconds. */
  readonly timeoutMs: number;
  /** The last answer seen (a health status, or the connection error). */
  readonly last: string;

  constructor(socket: string, timeoutMs: number, last: string) {
    super(status.UNAVAILABLE, `consistd at ${socket} not ready within ${timeoutMs} ms: ${last}`);
    this.name = "NotReadyError";
    this.socket = socket;
    this.timeoutMs = timeoutMs;
    this.last = last;
  }
}

/** Turns what grpc-js rejected or emitted into a ConsistdError; other errors are returned unchanged. */
export function toConsistdError(error: unknown): unknown {
  if (error instanceof ConsistdError) return error;
  if (error instanceof Error && typeof (error as { code?: unknown }).code === "number") {
    const e = error as Error & { code: status; details?: string; metadata?: Metadata };
    return new ConsistdError(e.code, e.details ?? e.message, { metadata: e.metadata, cause: error });
  }
  return error;
}

/**
 * Whether a failed call is worth repeating: the sidecar restarted, shut down or was not reachable.
 * Every other code is the daemon's answer to the request and goes to the caller.
 */
export function isRetryable(error: unknown): boolean {
  return error instanceof ConsistdError && error.code === status.UNAVAILABLE;
}

/**
 * Whether a call the SDK did not cancel failed because its connection to the sidecar went: UNAVAILABLE, or
 * the CANCELLED or UNKNOWN grpc-js reports for a call whose connection broke under it.
 */
export function isLostConnection(error: unknown): boolean {
  if (!(error instanceof ConsistdError)) return false;
  return error.code === status.UNAVAILABLE || error.code === status.CANCELLED || error.code === status.UNKNOWN;
}

/** The error a stream reports when the sidecar ended it without an error status. */
export function ended(what: string): ConsistdError {
  return new ConsistdError(status.UNAVAILABLE, `the sidecar ended the ${what}`);
}
