// Benchmark subscriber (hack/sdk/typescript.sh bench-subscriber NAMESPACE ROUNDS): per round, subscribes to the
// namespace's ConfigMaps in RAW mode, counts events until SYNCED, and prints one JSON line on stdout.
import { Client, EventType, Mode } from "@consistd/client";

const [namespace, roundsArg] = process.argv.slice(2);
const rounds = Number(roundsArg);
if (!namespace || !Number.isInteger(rounds) || rounds < 1) {
  console.error("usage: subscriber.js NAMESPACE ROUNDS");
  process.exit(64);
}

const client = new Client();
try {
  await client.waitReady(30_000);
  for (let round = 0; round < rounds; round++) {
    let events = 0;
    const started = performance.now();
    for await (const event of client.watch({ resource: "configmaps", namespace, mode: Mode.RAW })) {
      if (event.type === EventType.SYNCED) break; // leaving the loop ends the subscription
      events++;
    }
    const seconds = (performance.now() - started) / 1000;
    process.stdout.write(`${JSON.stringify({ language: "typescript", events, seconds: Number(seconds.toFixed(3)) })}\n`);
  }
} finally {
  client.close();
}
