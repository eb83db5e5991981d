// A ConfigMap controller on the consistd TypeScript SDK: leads an election, and only while leading records
// each ConfigMap's data keys in an annotation (a write fenced by its term) and notifies a peer, ACK-tracked.
//
//   node configmap-controller.js controller   campaign; while LEADER, watch and patch ConfigMaps, notify EXAMPLE_PEER
//   node configmap-controller.js receive      print each notification from peers, then ACK it
//
// Environment: CONSISTD_SOCKET (the SDK's default), EXAMPLE_NAMESPACE ("default"), EXAMPLE_ELECTION
// ("configmap-controller"), EXAMPLE_SELECTOR ("example.consistd.io/watch=true"), EXAMPLE_PEER (whom to notify:
// host:port of a peer's consistd, or service/NAME for every ready endpoint of the Service NAME in the sidecar's
// namespace; unset: no notification), EXAMPLE_EXIT_AFTER (exit 0 after that many; unset: run until SIGTERM or
// SIGINT, then resign and exit 0).
import { Client, ConsistdError, EventType, type Leadership, type Message, Mode, status } from "@consistd/client";

const OBSERVED_KEYS = "example.consistd.io/observed-keys";
const HANDLED_BY = "example.consistd.io/handled-by";

const namespace = process.env.EXAMPLE_NAMESPACE || "default";
const election = process.env.EXAMPLE_ELECTION || "configmap-controller";
const selector = process.env.EXAMPLE_SELECTOR || "example.consistd.io/watch=true";
const peer = process.env.EXAMPLE_PEER || undefined; // as given, for the `notified` line
const exitAfter = process.env.EXAMPLE_EXIT_AFTER ? Number(process.env.EXAMPLE_EXIT_AFTER) : Infinity;

interface ConfigMap {
  metadata: { name: string; annotations?: Record<string, string> };
  data?: Record<string, string>;
}

/**
 * EXAMPLE_PEER as a destination: "service/NAME" is every ready endpoint of the Service NAME in the sidecar's
 * namespace (the sidecar follows its EndpointSlices), anything else one peer's "host:port".
 */
function destination(peer: string): Message["to"] {
  return peer.startsWith("service/") ? { service: { namespace: "", name: peer.slice("service/".length) } } : { peer };
}

/** Campaigns; while LEADER, reconciles ConfigMaps in the namespace until `exitAfter` are handled, or until `stopping`. */
async function controller(client: Client, stopping: AbortSignal): Promise<void> {
  const done = new AbortController();
  let handled = 0;
  let leading: { term: bigint; stop: AbortController; running: Promise<void> } | undefined;
  const stopLeading = async () => {
    leading?.stop.abort();
    await leading?.running;
    leading = undefined;
  };
  // Ending the campaign (done, or stopping) resigns: the sidecar releases the Lease at once.
  const signal = AbortSignal.any([stopping, done.signal]);
  for await (const state of client.campaign(election, { namespace, signal })) {
    console.log(`leadership ${state.stateName} holder=${state.holder || "-"} term=${state.term}`);
    // Not LEADER (UNKNOWN when the sidecar is out of reach), or LEADER in a new term: stop acting under the old one.
    if (leading && !(state.isLeader && leading.term === state.term)) await stopLeading();
    if (!state.isLeader || leading) continue;
    const stop = new AbortController();
    const running = reconcile(client, state, stop.signal, () => {
      if (++handled >= exitAfter) done.abort();
    }).catch((error) => {
      console.error(`controller: ${error}`);
      process.exitCode = 1;
      done.abort();
    });
    leading = { term: state.term, stop, running };
  }
  await stopLeading();
}

/** Watches the selected ConfigMaps (CONSISTENT: our own patches are seen) and records their keys while `lead` holds. */
async function reconcile(client: Client, lead: Leadership, signal: AbortSignal, onHandled: () => void): Promise<void> {
  const query = { resource: "configmaps", namespace, labelSelector: selector, mode: Mode.CONSISTENT };
  for await (const event of client.watch(query, { signal })) {
    if (event.type !== EventType.ADDED && event.type !== EventType.MODIFIED) continue;
    const cm = event.object!.json as ConfigMap;
    const keys = Object.keys(cm.data ?? {}).sort();
    if (cm.metadata.annotations?.[OBSERVED_KEYS] === keys.join(",")) continue;
    const name = cm.metadata.name;
    let resourceVersion: string;
    try {
      const patch = { metadata: { annotations: { [OBSERVED_KEYS]: keys.join(","), [HANDLED_BY]: "typescript-example" } } };
      const patched = await client.objects.patch({ resource: "configmaps", namespace, name, patch, guard: lead });
      resourceVersion = patched.resourceVersion;
    } catch (error) {
      // The guard refused the write: this replica no longer leads in that term; the campaign will say so.
      if (error instanceof ConsistdError && error.code === status.FAILED_PRECONDITION) {
        console.error(`controller: not patching ${namespace}/${name}: ${error.details}`);
        continue;
      }
      throw error;
    }
    console.log(`patched ${namespace}/${name} keys=${keys.join(",")} resourceVersion=${resourceVersion}`);
    if (peer) {
      const sent = await client.send({
        to: destination(peer),
        resourceId: `configmaps/${namespace}/${name}`,
        eventId: resourceVersion,
        payload: { namespace, name, keys },
        contentType: "application/json",
      });
      const outcome = await unlessAborted(sent.ack, signal);
      if (!outcome) return; // this term's work was stopped meanwhile; the sidecar still delivers the message
      console.log(`notified ${peer} ${outcome.kindName} ${sent.messageId}`);
    }
    onHandled();
  }
}

/** `promise`'s value, or undefined if `signal` is aborted first. */
async function unlessAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T | undefined> {
  if (signal.aborted) return undefined;
  let onAbort = () => {};
  const aborted = new Promise<undefined>((resolve) => (onAbort = () => resolve(undefined)));
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    return await Promise.race([promise, aborted]);
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

/** Prints each message from peers; returning ACKs it. Stops once `exitAfter` messages are ACKed, or on `stopping`. */
async function receive(client: Client, stopping: AbortSignal): Promise<void> {
  const done = new AbortController();
  let received = 0;
  await client.inbox.serve(
    (message) => {
      console.log(`received ${message.resourceId} ${message.eventId} ${message.payload.toString("utf8")}`);
      if (++received >= exitAfter) done.abort(); // serve resolves once this message's ACK is stored
    },
    { signal: AbortSignal.any([stopping, done.signal]) },
  );
}

const mode = process.argv[2];
if (mode !== "controller" && mode !== "receive") {
  console.error("usage: configmap-controller.js controller|receive");
  process.exit(64);
}
// SIGTERM or SIGINT stops the command (leaving the campaign resigns), and the process exits 0.
const stopping = new AbortController();
for (const name of ["SIGTERM", "SIGINT"] as const) {
  process.on(name, () => {
    console.log(`stopping on ${name}`);
    stopping.abort();
  });
}
const client = new Client();
try {
  await client.waitReady(30_000, { signal: stopping.signal });
  await (mode === "controller" ? controller(client, stopping.signal) : receive(client, stopping.signal));
} catch (error) {
  if (!stopping.signal.aborted) throw error; // once stopping, what the stop cut short is no failure
} finally {
  client.close();
}
if (stopping.signal.aborted) console.log("stopped");
