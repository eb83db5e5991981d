// Fakes of the tests that run without a daemon (no tests of its own): a client on a socket nobody serves, whose
// generated WatchService.subscribe is replaced by streams the test feeds; a test's own fake replaces more.
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, Consistency, type proto, type WorkItem } from "@consistd/client";
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

/** A work item as the daemon hands it out: lease "lease-1" on ns/w, its object `handed` (none: undefined). */
function workItem(handed?: proto.KubeObject): proto.WorkItem {
  return {
    leaseId: "lease-1",
    namespace: "ns",
    name: "w",
    object: handed,
    deleted: false,
    consistency: Consistency.CONSISTENT,
    attempt: 1,
    term: 0n,
    expiresAt: undefined,
    lastError: "",
    finalizing: false,
  };
}

/**
 * Runs a reconciler of the queue "widgets" of widgets.example.com in "ns" on `fake` (its ReconcileService.reconcile
 * made a fake stream), hands its handler one item (lease "lease-1" on ns/w) with the object `handed`, and returns
 * what `call(item)` in the handler resolved or rejected with; `what` names the call in a timeout.
 */
export async function callOnAnItem<T>(
  fake: FakeClient,
  what: string,
  call: (item: WorkItem) => Promise<T>,
  handed?: proto.KubeObject,
): Promise<T | unknown> {
  const stream = new FakeStream<proto.ReconcileResponse>();
  (fake.client.services.reconcile as unknown as Record<string, unknown>).reconcile = () => stream;
  const stop = new AbortController();
  let settle!: (outcome: T | unknown) => void;
  const settled = new Promise<T | unknown>((resolve) => (settle = resolve));
  const handler = async (item: WorkItem) => {
    settle(await call(item).catch((error: unknown) => error));
  };
  const spec = { name: "widgets", resource: "widgets.example.com", namespace: "ns" };
  const running = fake.client.reconcile(spec, handler, { signal: stop.signal });
  stream.push({ started: { name: "widgets", comparableResourceVersions: true } });
  stream.push({ item: workItem(handed) });
  try {
    return await within(5_000, `the handler's ${what}`, settled);
  } finally {
    stop.abort();
    await within(5_000, "the reconciler to stop", running);
  }
}

/** Resolves once `condition` holds, looking every 5 ms. */
export async function waitFor(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 5));
}
