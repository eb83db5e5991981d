// The Greeting operator on the consistd TypeScript SDK: publishes each Greeting's message in a ConfigMap it owns.
//
// What it does and prints is examples/README.md's spec, the same in every language.
//
//   node greeting-operator.js controller   campaign; reconcile the Greetings (apply, event, notify EXAMPLE_PEER, Ready)
//   node greeting-operator.js receive      print each notification from peers, then ACK it
//
// The reconcile queue is named after the election (EXAMPLE_ELECTION, a DNS label) and hands out the Greetings of
// EXAMPLE_NAMESPACE only while this sidecar leads it: a spec change (the generation filter), or a change by someone
// else of the ConfigMap a Greeting owns (the related query), queues one pass; the queue keeps the finalizer
// example.consistd.io/cleanup on each Greeting and hands a Greeting being deleted out as a finalize pass. A handler
// that throws hands the Greeting back for a retry with backoff. Every line goes out through console.log, which
// writes synchronously to a file or a pipe, so nothing waits in a buffer.
//
// Environment: CONSISTD_SOCKET (the SDK's default), EXAMPLE_NAMESPACE ("default"), EXAMPLE_ELECTION
// ("greeting-operator"), EXAMPLE_PEER (whom to notify: host:port of a peer's consistd, or service/NAME for every
// ready endpoint of the Service NAME in the sidecar's namespace; unset: no notification), EXAMPLE_EXIT_AFTER
// (receive only: exit 0 after that many). Either command stops on SIGTERM or SIGINT: it resigns and exits 0.
import {
  Client,
  ConsistdError,
  type Message,
  PatchType,
  type ReconcileSpec,
  status,
  type WorkItem,
} from "@consistd/client";

const FINALIZER = "example.consistd.io/cleanup";
const FIELD_MANAGER = "greeting-operator";
const MANAGED_BY = "app.kubernetes.io/managed-by";

const namespace = process.env.EXAMPLE_NAMESPACE || "default";
const election = process.env.EXAMPLE_ELECTION || "greeting-operator";
const peer = process.env.EXAMPLE_PEER || undefined; // as given, for the `notified` line
const exitAfter = process.env.EXAMPLE_EXIT_AFTER ? Number(process.env.EXAMPLE_EXIT_AFTER) : Infinity;

/**
 * The reconcile queue: the Greetings, queued by a change of their spec (generation) or of the ConfigMap each one
 * controls, each kept with the finalizer, handed out only while this sidecar leads the election.
 */
const queue: ReconcileSpec = {
  name: election,
  resource: "greetings.example.consistd.io",
  namespace,
  onlyChangesOf: { generation: true },
  related: [
    { resource: "configmaps", namespace, labelSelector: `${MANAGED_BY}=${FIELD_MANAGER}`, controllerOwner: true },
  ],
  finalizer: FINALIZER,
  election: { name: election, namespace },
};

interface Greeting {
  metadata: { name: string; namespace: string; uid: string; generation: number };
  spec: { message: string };
}

interface ConfigMap {
  metadata: { ownerReferences?: { controller?: boolean; uid: string }[] };
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
 * Campaigns and, meanwhile, reconciles the Greetings until `stopping`. The campaign is left (the sidecar resigns)
 * once the reconciler has stopped and completed its leases.
 */
async function controller(client: Client, stopping: AbortSignal): Promise<void> {
  const leave = new AbortController();
  const working = client
    .reconcile<Greeting>(queue, (item) => (item.finalizing ? finalize(item) : reconcile(client, item)), {
      signal: stopping,
    })
    .catch((error) => {
      console.error(`reconcile queue ${election}: ${error}`); // a spec the daemon refused
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
 * One pass over a Greeting: unless its ConfigMap already holds the message and names it as controller, applies
 * the ConfigMap, records the Published event and notifies the peer; then says Ready.
 */
async function reconcile(client: Client, item: WorkItem<Greeting>): Promise<void> {
  if (item.deleted || !item.object) return; // gone without the finalizer: nothing left to clean up
  const { key } = item;
  console.log(`reconciling ${key} attempt=${item.attempt} term=${item.term} ${item.consistencyName}`);
  const greeting = item.object.json;
  const note = `ConfigMap ${item.name} holds the message`;
  if (!publishes(await readConfigMap(item), greeting)) {
    const resourceVersion = await applyConfigMap(item, greeting);
    const generation = greeting.metadata.generation;
    console.log(`published ${key} generation=${generation} configmap=${item.name} resourceVersion=${resourceVersion}`);
    const event = { severity: "Normal", reason: "Published", action: "Publish", note } as const;
    await item.recordEvent(event).catch(failing(`record the Published event about ${key}`));
    if (peer) await notify(client, peer, item, greeting.spec.message, resourceVersion);
  }
  const ready = { type: "Ready", status: "True", reason: "Published", message: note } as const;
  await item.setCondition(ready).catch(failing(`set the Ready condition of ${key}`));
}

/** Whether `configMap` holds the Greeting's message and names the Greeting as its controller. */
function publishes(configMap: ConfigMap | undefined, greeting: Greeting): boolean {
  const controller = configMap?.metadata.ownerReferences?.find((owner) => owner.controller);
  return configMap?.data?.message === greeting.spec.message && controller?.uid === greeting.metadata.uid;
}

/** The Greeting's ConfigMap as consistd serves it; undefined when there is none. */
async function readConfigMap(item: WorkItem<Greeting>): Promise<ConfigMap | undefined> {
  const target = { resource: "configmaps", namespace: item.namespace, name: item.name };
  const configMap = await item.objects
    .get<ConfigMap>(target)
    .catch((error) => (isNotFound(error) ? undefined : failing(`read ConfigMap ${item.key}`)(error)));
  return configMap?.json;
}

/**
 * Applies the Greeting's ConfigMap (server-side apply, forced) through the item's objects: the write names the
 * lease, so it queues no further pass, and carries the item's guard, so a deposed leader's late write is refused.
 * Resolves with the applied resourceVersion.
 */
async function applyConfigMap(item: WorkItem<Greeting>, greeting: Greeting): Promise<string> {
  const configMap = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: {
      name: item.name,
      namespace: item.namespace,
      labels: { [MANAGED_BY]: FIELD_MANAGER },
      ownerReferences: [
        {
          apiVersion: "example.consistd.io/v1",
          kind: "Greeting",
          name: item.name,
          uid: greeting.metadata.uid,
          controller: true,
        },
      ],
    },
    data: { message: greeting.spec.message },
  };
  const target = { resource: "configmaps", namespace: item.namespace, name: item.name };
  const request = { ...target, patch: configMap, type: PatchType.APPLY, fieldManager: FIELD_MANAGER, force: true };
  const applied = await item.objects
    .patch({ ...request, guard: item.guard })
    .catch(failing(`apply ConfigMap ${item.key}`));
  return applied.resourceVersion;
}

/** The finalize pass: deletes the Greeting's ConfigMap (already gone is fine); returning removes the finalizer. */
async function finalize(item: WorkItem<Greeting>): Promise<void> {
  console.log(`finalizing ${item.key} term=${item.term}`);
  const target = { resource: "configmaps", namespace: item.namespace, name: item.name, guard: item.guard };
  await item.objects
    .delete(target)
    .catch((error) => (isNotFound(error) ? undefined : failing(`delete ConfigMap ${item.key}`)(error)));
  console.log(`finalized ${item.key}`);
}

/** Sends `peer` an ACK-tracked notification of the published message and waits for its outcome, or the lease's end. */
async function notify(
  client: Client,
  peer: string,
  item: WorkItem<Greeting>,
  message: string,
  resourceVersion: string,
): Promise<void> {
  const sent = await client
    .send({
      to: destination(peer),
      resourceId: `greetings/${item.namespace}/${item.name}`,
      eventId: resourceVersion,
      payload: { namespace: item.namespace, name: item.name, message },
      contentType: "application/json",
    })
    .catch(failing(`notify ${peer} of ${item.key}`));
  try {
    // The wait ends when the lease is lost; the sidecar goes on delivering the message.
    const outcome = await sent.outcome({ signal: item.signal });
    console.log(`notified ${peer} ${outcome.kindName} ${sent.messageId}`);
  } catch (error) {
    if (!item.signal.aborted) failing(`wait for ${peer}'s answer to ${sent.messageId}`)(error);
  }
}

function isNotFound(error: unknown): boolean {
  return error instanceof ConsistdError && error.code === status.NOT_FOUND;
}

/** A rejection handler that fails naming `operation`: its message is the pass's RETRY's (the next `lastError`). */
function failing(operation: string): (error: unknown) => never {
  return (error) => {
    throw new Error(`${operation}: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
  };
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
  console.error("usage: greeting-operator.js controller|receive");
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
