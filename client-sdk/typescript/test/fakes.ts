// Fakes of the tests that run without a daemon (no tests of its own): a client on a socket nobody serves, whose
// generated WatchService.subscribe is replaced by streams the test feeds; a test's own fake replaces more.
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, type proto } from "@consistd/client";
import { unique, within } from "./helpers.js";

/** A stream the test feeds and ends: what a fake subscribe or reconcile returns (messages() iterates and cancels it). */
export class FakeStream<T> {
  /** What the SDK wrote to it (a bidirectional stream's requests). */
  readonly written: unknown[] = [];
  private readonly queue: (T | undefined)[] = [];
  private wake?: () => void;

  /** Sends `messages` (they wait in the stream until the SDK reads them). */
  push(...messages: T[]): void {
    this.queue.push(...messages);
    this.wake?.();
  }

  /** Ends the stream without an error, as a daemon going away does. */
  end(): void {
    this.queue.push(undefined);
    this.wake?.();
  }

  cancel(): void {
    this.end();
  }

  write(message: unknown): boolean {
    this.written.push(message);
    return true;
  }

  on(): this {
    return this;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    for (;;) {
      while (this.queue.length === 0) await new Promise<void>((resolve) => (this.wake = resolve));
      const message = this.queue.shift();
      if (!message) return;
      yield message;
    }
  }
}

const clients: Client[] = [];

/** Closes the client of every FakeClient made so far: a test file's `after(closeFakeClients)`. */
export function closeFakeClients(): void {
  clients.forEach((c) => c.close());
}

/** A client on a socket nobody serves, whose subscribes are fakes. */
export class FakeClient {
  readonly client: Client;
  /** Every subscribe request, and the stream it got, in order. */
  readonly requests: proto.SubscribeRequest[] = [];
  readonly streams: FakeStream<proto.SubscribeResponse>[] = [];

  constructor() {
    this.client = new Client(join(tmpdir(), `${unique("consistd-no-daemon")}.sock`));
    clients.push(this.client);
    const watch = this.client.services.watch;
    watch.subscribe = ((request: proto.SubscribeRequest) => {
      this.requests.push(request);
      const stream = new FakeStream<proto.SubscribeResponse>();
      this.streams.push(stream);
      return stream;
    }) as unknown as typeof watch.subscribe;
  }

  /** The nth subscribe's stream, once the watch subscribed that often. */
  async stream(n: number): Promise<FakeStream<proto.SubscribeResponse>> {
    await within(5_000, `subscribe #${n + 1}`, waitFor(() => this.streams.length > n));
    return this.streams[n];
  }
}

/** Resolves once `condition` holds, looking every 5 ms. */
export async function waitFor(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 5));
}
