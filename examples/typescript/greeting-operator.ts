// A ConfigMap controller on the consistd TypeScript SDK: campaigns in an election and, meanwhile, runs the SDK's
// reconciler on a work queue that hands out ConfigMaps only while this sidecar leads that election. For each one
// it records the data keys in an annotation (a write fenced by the item's guard that names the item's lease) and
// notifies a peer, ACK-tracked.
//
//   node configmap-controller.js controller   campaign; reconcile the queue's ConfigMaps (patch, notify EXAMPLE_PEER)
//   node configmap-controller.js receive      print each notification from peers, then ACK it
//
// The queue is named after the election (EXAMPLE_ELECTION, a DNS label), so the examples of several languages
// sharing one daemon keep apart. Each item with an object is printed first (`reconciling <ns>/<name>
// attempt=<n> term=<t> CONSISTENT`); a write that fails is thrown, and the queue retries the key with backoff.
//
// Environment: CONSISTD_SOCKET (the SDK's default), EXAMPLE_NAMESPACE ("default"), EXAMPLE_ELECTION
// ("configmap-controller"), EXAMPLE_SELECTOR ("example.consistd.io/watch=true"), EXAMPLE_PEER (whom to notify:
// host:port of a peer's consistd, or service/NAME for every ready endpoint of the Service NAME in the sidecar's
// namespace; unset: no notification), EXAMPLE_EXIT_AFTER (exit 0 after that many; unset: run until SIGTERM or
// SIGINT, then resign and exit 0).
import { Client, type Message, type ReconcileSpec, type WorkItem } from "@consistd/client";

const OBSERVED_KEYS = "example.consistd.io/observed-keys";
const HANDLED_BY = "example.consistd.io/handled-by";

const namespace = process.env.EXAMPLE_NAMESPACE || "default";
const election = process.env.EXAMPLE_ELECTION || "configmap-controller";
const selector = process.env.EXAMPLE_SELECTOR || "example.consistd.io/watch=true";
const peer = process.env.EXAMPLE_PEER || undefined; // as given, for the `notified` line
const exitAfter = process.env.EXAMPLE_EXIT_AFTER ? Number(process.env.EXAMPLE_EXIT_AFTER) : Infinity;

/** The work queue: the selected ConfigMaps, handed out only while this sidecar leads the election. */
const queue: ReconcileSpec = {
  name: election,
  resource: "configmaps",
  namespace,
  labelSelector: selector,
  maxLeases: 4,
  election: { name: election, namespace },
};

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

/**
 * Campaigns and, meanwhile, reconciles the queue until `exitAfter` ConfigMaps are handled or until `stopping`.
 * The campaign is left (the sidecar resigns) once the reconciler has stopped and completed its leases.
 */
async function controller(client: Client, stopping: AbortSignal): Promise<void> {
  const enough = new AbortController();
  const leave = new AbortController();
  let handled = 0;
  const working = client
    .reconcile<ConfigMap>(
      queue,
      async (item) => {
        if ((await handle(client, item)) && ++handled >= exitAfter) enough.abort();
      },
      { signal: AbortSignal.any([stopping, enough.signal]) },
    )
    .catch((error) => {
      console.error(`controller: ${error}`); // a spec the daemon refused
      process.exitCode = 1;
    })
    .finally(() => leave.abort());
  await campaign(client, AbortSignal.any([stopping, leave.signal]));
  await working;
}

/** Prints each leadership state until `signal` aborts; ending the campaign resigns. */
async function campaign(client: Client, signal: AbortSignal): Promise<void> {
  for await (const state of client.campaign(election, { namespace, signal })) {
    console.log(`leadership ${state.stateName} holder=${state.holder || "-"} term=${state.term}`);
  }
}

/**
 * One work item: records the ConfigMap's data keys unless they are recorded already, then notifies the peer.
 * Resolves true when it handled the ConfigMap; a failed write throws, and the queue retries the key.
 */
async function handle(client: Client, item: WorkItem<ConfigMap>): Promise<boolean> {
  if (item.deleted || !item.object) return false;
  const { key } = item;
  console.log(`reconciling ${key} attempt=${item.attempt} term=${item.term} ${item.consistencyName}`);
  const cm = item.object.json;
  const keys = Object.keys(cm.data ?? {}).sort();
  const observed = keys.join(",");
  if (cm.metadata.annotations?.[OBSERVED_KEYS] === observed) return false;
  const resourceVersion = await recordKeys(item, observed);
  console.log(`patched ${key} keys=${observed} resourceVersion=${resourceVersion}`);
  if (peer) {
    const notified = await notify(client, peer, item, keys, resourceVersion);
    if (!notified) return false; // the lease was lost meanwhile; the sidecar still delivers the message
    console.log(`notified ${peer} ${notified.outcome} ${notified.messageId}`);
  }
  return true;
}

/**
 * Merge-patches the keys annotation through the item's objects (the write names the lease, so the key's next
 * pass sees it), with the item's guard (the queue's election, the lease's term): refused unless this sidecar
 * still leads in that term. Resolves with the patched resourceVersion.
 */
async function recordKeys(item: WorkItem<ConfigMap>, observed: string): Promise<string> {
  const patch = { metadata: { annotations: { [OBSERVED_KEYS]: observed, [HANDLED_BY]: "typescript-example" } } };
  const target = { resource: "configmaps", namespace: item.namespace, name: item.name };
  const patched = await item.objects.patch({ ...target, patch, guard: item.guard });
  return patched.resourceVersion;
}

/** Sends `peer` a notification and waits for its outcome; undefined if the lease is lost first. */
async function notify(
  client: Client,
  peer: string,
  item: WorkItem<ConfigMap>,
  keys: string[],
  resourceVersion: string,
): Promise<{ outcome: string; messageId: string } | undefined> {
  const sent = await client.send({
    to: destination(peer),
    resourceId: `configmaps/${item.namespace}/${item.name}`,
    eventId: resourceVersion,
    payload: { namespace: item.namespace, name: item.name, keys },
    contentType: "application/json",
  });
  try {
    // The wait ends when the lease is lost; the sidecar goes on delivering the message.
    const outcome = await sent.outcome({ signal: item.signal });
    return { outcome: outcome.kindName, messageId: sent.messageId };
  } catch (error) {
    if (item.signal.aborted) return undefined;
    throw error;
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
