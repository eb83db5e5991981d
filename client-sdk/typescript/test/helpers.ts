// Shared test fixtures: the harness's daemons, fresh namespaces, timeouts, a cuttable proxy and an own daemon.
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createConnection, createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@consistd/client";

/** An environment variable hack/with-daemons.sh sets. */
export function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run under hack/with-control-plane.sh hack/with-daemons.sh`);
  return value;
}

/** A name no other test or run uses. */
export function unique(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

/** Creates a fresh namespace through `client` and returns its name. */
export async function freshNamespace(client: Client, prefix = "ts-sdk"): Promise<string> {
  const name = unique(prefix);
  await client.objects.create({ resource: "namespaces", object: { metadata: { name } } });
  return name;
}

/** Deletes a namespace, ignoring failures (cleanup only). */
export async function dropNamespace(client: Client, name: string): Promise<void> {
  await client.objects.delete({ resource: "namespaces", name }).catch(() => {});
}

/** A ConfigMap body. */
export function configMap(name: string, data: Record<string, string> = {}): object {
  return { metadata: { name }, data };
}

/** Resolves `promise`, or rejects after `ms` naming `what`. */
export async function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** The iterator's next value within `ms`; fails if it ends. */
export async function next<T>(items: AsyncIterator<T>, what: string, ms = 15_000): Promise<T> {
  const result = await within(ms, what, items.next());
  if (result.done) throw new Error(`stream ended while waiting for ${what}`);
  return result.value;
}

/** Values from the iterator until one matches `done` (included), within `ms` overall. */
export async function until<T>(items: AsyncIterator<T>, what: string, done: (item: T) => boolean, ms = 20_000): Promise<T[]> {
  const seen: T[] = [];
  const deadline = Date.now() + ms;
  for (;;) {
    const item = await next(items, what, Math.max(1, deadline - Date.now()));
    seen.push(item);
    if (done(item)) return seen;
  }
}

/**
 * A Unix-socket proxy in front of a daemon's socket: `cut()` drops every connection, and while `paused`
 * new connections are dropped at once, so the client stays disconnected.
 */
export class Proxy {
  readonly path: string;
  paused = false;
  connections = 0;
  private readonly sockets = new Set<Socket>();
  private readonly server: Server;
  private readonly dir: string;

  private constructor(target: string) {
    this.dir = mkdtempSync(join(tmpdir(), "consistd-ts-proxy-"));
    this.path = join(this.dir, "proxy.sock");
    this.server = createServer((downstream) => {
      if (this.paused) return downstream.destroy();
      this.connections++;
      const upstream = createConnection(target);
      for (const [from, to] of [[downstream, upstream], [upstream, downstream]] as const) {
        this.sockets.add(from);
        from.pipe(to);
        from.on("error", () => to.destroy());
        from.on("close", () => {
          this.sockets.delete(from);
          to.destroy();
        });
      }
    });
  }

  /** Starts a proxy to `target`. */
  static async start(target: string): Promise<Proxy> {
    const proxy = new Proxy(target);
    await new Promise<void>((resolve) => proxy.server.listen(proxy.path, resolve));
    return proxy;
  }

  /** Drops every open connection (both sides). */
  cut(): void {
    for (const socket of this.sockets) socket.destroy();
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A consistd of the test's own (CONSISTD_BIN), which it can stop and start again on the same socket and store. */
export class OwnDaemon {
  readonly dir: string;
  readonly socket: string;
  private process?: ChildProcess;
  private log = "";

  /** `config` is more of its consistd.yaml (YAML lines), after the identity. */
  constructor(
    readonly identity: string,
    config = "",
  ) {
    this.dir = mkdtempSync(join(tmpdir(), "consistd-ts-daemon-"));
    this.socket = join(this.dir, "consistd.sock");
    writeFileSync(join(this.dir, "consistd.yaml"), `identity: ${identity}\n${config}`);
  }

  /** Starts the daemon and waits until its admin socket reports ready. */
  async start(): Promise<void> {
    const bin = env("CONSISTD_BIN");
    const admin = join(this.dir, "admin.sock");
    const args = ["run", "--config", join(this.dir, "consistd.yaml"), "--socket", this.socket];
    this.process = spawn(bin, [...args, "--admin-socket", admin, "--store-dir", join(this.dir, "store")], {
      env: { ...process.env, KUBECONFIG: env("CONSISTD_TEST_KUBECONFIG") },
      stdio: ["ignore", "ignore", "pipe"],
    });
    this.process.stderr!.on("data", (chunk: Buffer) => (this.log = (this.log + chunk.toString()).slice(-4000)));
    const deadline = Date.now() + 30_000;
    while (spawnSync(bin, ["status", "--admin-socket", admin]).status !== 0) {
      if (this.process.exitCode !== null || Date.now() > deadline) {
        throw new Error(`own daemon did not become ready; its log ends:\n${this.log}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  /** Sends `signal` to the running daemon (SIGSTOP freezes it, SIGCONT lets it go on); false if it is not running. */
  kill(signal: NodeJS.Signals): boolean {
    const child = this.process;
    return child !== undefined && child.exitCode === null && child.signalCode === null && child.kill(signal);
  }

  /** Stops the daemon (SIGTERM) and waits until it exited. */
  async stop(): Promise<void> {
    const child = this.process;
    this.process = undefined;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    child.kill("SIGCONT"); // a daemon a test froze (SIGSTOP) handles SIGTERM only once it runs again
    await within(20_000, "the own daemon to exit", exited);
  }

  async remove(): Promise<void> {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** The daemon's Prometheus text from its admin socket's /metrics (HTTP/1.0: the answer ends with the connection). */
export async function metrics(adminSocket: string): Promise<string> {
  const response = await new Promise<string>((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = createConnection(adminSocket, () => socket.write("GET /metrics HTTP/1.0\r\nHost: consistd\r\n\r\n"));
    socket.on("data", (chunk: Buffer) => chunks.push(chunk));
    socket.on("end", () => resolve(Buffer.concat(chunks).toString()));
    socket.on("error", reject);
  });
  const [head, body = ""] = response.split("\r\n\r\n", 2);
  assert.match(head, /^HTTP\/1\.[01] 200/, `/metrics answered ${head}`);
  return body;
}

/** The values of the samples of `family` (e.g. "consistd_grpc_server_started_total") whose labels include every one of `labels`. */
async function samples(adminSocket: string, family: string, ...labels: string[]): Promise<number[]> {
  return (await metrics(adminSocket))
    .split("\n")
    .filter((line) => line.startsWith(`${family}{`) && labels.every((label) => line.includes(label)))
    .map((line) => Number(line.slice(line.lastIndexOf(" ") + 1)));
}

/**
 * How many calls of gRPC `method` (e.g. "SendStream") the daemon has started, from
 * `consistd_grpc_server_started_total` on its admin socket's /metrics.
 */
export async function callsStarted(adminSocket: string, method: string): Promise<number> {
  const started = await samples(adminSocket, "consistd_grpc_server_started_total", `grpc_method="${method}"`);
  return started.reduce((sum, n) => sum + n, 0);
}

/**
 * How many grants of the reconcile queue `queue` the daemon held back until its watches showed the pod's writes
 * under the key's earlier leases (`consistd_workqueue_consistency_holds_total`); 0 when none was. The daemon drops a
 * queue's series when the queue stops: read it while the reconciler runs.
 */
export async function consistencyHolds(adminSocket: string, queue: string): Promise<number> {
  const holds = await samples(adminSocket, "consistd_workqueue_consistency_holds_total", `name="${queue}"`);
  return holds.reduce((sum, n) => sum + n, 0);
}

/**
 * The highest position (`consistd_watch_resource_version`, the resourceVersion its cache reflects) of the daemon's
 * watches of `resource` (as the daemon names it: "v1/secrets") in `namespace`; 0 while none has listed.
 */
export async function watchPosition(adminSocket: string, resource: string, namespace: string): Promise<number> {
  const positions = await samples(
    adminSocket,
    "consistd_watch_resource_version",
    `resource="${resource}"`,
    `namespace="${namespace}"`,
  );
  return Math.max(0, ...positions);
}
