// When a stream to the sidecar is opened again, and how long to wait before doing so: the values
// proto/consistd/v1/watch.proto states for every client.
import { setTimeout as delay } from "node:timers/promises";

/** First pause before reconnecting, in milliseconds. */
const INITIAL_MS = 100;
/** Longest pause between reconnects, in milliseconds. */
const CAP_MS = 5_000;

/** Doubling pauses from 100 ms up to 5 s, back to the start after a success (as every SDK does). */
export class Backoff {
  private nextMs = INITIAL_MS;

  /** Waits the current pause (less if `signal` aborts first) and doubles the next one. */
  async wait(signal?: AbortSignal): Promise<void> {
    const ms = this.nextMs;
    this.nextMs = Math.min(ms * 2, CAP_MS);
    await sleep(ms, signal);
  }

  /** Starts again from the shortest pause (after the stream delivered something). */
  reset(): void {
    this.nextMs = INITIAL_MS;
  }
}

/** Sleeps `ms` milliseconds, or until `signal` aborts; never rejects. */
export async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  try {
    await delay(ms, undefined, { signal });
  } catch {
    // Aborted: the caller checks its signal.
  }
}
