// A ConfigMap controller on the consistd TypeScript SDK: leads an election, and only while leading records
// each ConfigMap's data keys in an annotation (a write fenced by its term) and notifies a peer, ACK-tracked.
//
//   node configmap-controller.js controller   campaign; while LEADER, watch and patch ConfigMaps, notify EXAMPLE_PEER
//   node configmap-controller.js receive      print each notification from peers, then ACK it
//
// Environment: CONSISTD_SOCKET (the SDK's default), EXAMPLE_NAMESPACE ("default"), EXAMPLE_ELECTION
// ("configmap-controller"), EXAMPLE_SELECTOR ("example.consistd.io/watch=true"), EXAMPLE_PEER (host:port of the
// peer's consistd; unset: no notification), EXAMPLE_EXIT_AFTER (exit 0 after that many; unset: run forever).
import { Client, ConsistdError, EventType, type Leadership, Mode, status } from "@consistd/client";

const OBSERVED_KEYS = "example.consistd.io/observed-keys";
const HANDLED_BY = "example.consistd.io/handled-by";

const namespace = process.env.EXAMPLE_NAMESPACE || "default";
const election = process.env.EXAMPLE_ELECTION || "configmap-controller";
const selector = process.env.EXAMPLE_SELECTOR || "example.consistd.io/watch=true";
const peer = process.env.EXAMPLE_PEER || undefined;
const exitAfter = process.env.EXAMPLE_EXIT_AFTER ? Number(process.env.EXAMPLE_EXIT_AFTER) : Infinity;

interface ConfigMap {
  metadata: { name: string; annotations?: Record<string, string> };
  data?: Record<string, string>;
}

/** Campaigns; while LEADER, reconciles ConfigMaps in the namespace until `exitAfter` are handled. */
async function controller(client: Client): Promise<void> {
  const done = new AbortController();
  let handled = 0;
  let leading: { term: bigint; stop: AbortController; running: Promise<void> } | undefined;
  const stopLeading = async () => {
    leading?.stop.abort();
    await leading?.running;
    leading = undefined;
  };
  for await (const state of client.campaign(election, { namespace, signal: done.signal })) {
    console.log(`leadership ${state.stateName} holder=${state.holder || "-"} term=${state.term}`);
    if (leading && leading.term !== state.term) await stopLeading();
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
        to: { peer },
        resourceId: `configmaps/${namespace}/${name}`,
        eventId: resourceVersion,
        payload: { namespace, name, keys },
        contentType: "application/json",
      });
      const outcome = await sent.ack;
      console.log(`notified ${peer} ${outcome.kindName} ${sent.messageId}`);
    }
    onHandled();
  }
}

/** Prints each message from peers; returning ACKs it. Stops once `exitAfter` messages are ACKed. */
async function receive(client: Client): Promise<void> {
  const done = new AbortController();
  let received = 0;
  await client.inbox.serve(
    (message) => {
      console.log(`received ${message.resourceId} ${message.eventId} ${message.payload.toString("utf8")}`);
      if (++received >= exitAfter) done.abort(); // serve resolves once this message's ACK is stored
    },
    { signal: done.signal },
  );
}

const mode = process.argv[2];
if (mode !== "controller" && mode !== "receive") {
  console.error("usage: configmap-controller.js controller|receive");
  process.exit(64);
}
const client = new Client();
try {
  await client.waitReady(30_000);
  await (mode === "controller" ? controller(client) : receive(client));
} finally {
  client.close();
}
