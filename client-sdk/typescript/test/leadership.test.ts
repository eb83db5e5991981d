// Leadership: one leader per election, followers see who leads, and a resigning leader hands over at once.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Client, LeadershipState, type Leadership } from "@consistd/client";
import { env, next, Proxy, unique, until } from "./helpers.js";

const clients: Client[] = [];
after(() => clients.forEach((c) => c.close()));

test("a campaigns and leads, b follows a, and b leads once a stops campaigning", async () => {
  const a = new Client();
  const b = new Client(env("CONSISTD_TEST_PEER_SOCKET"));
  clients.push(a, b);
  const election = unique("ts-election");
  const stopA = new AbortController();
  const stopB = new AbortController();
  try {
    const onA = a.campaign(election, { signal: stopA.signal });
    const [leading] = (await until(onA, "a to lead", (s) => s.state !== LeadershipState.UNKNOWN)).slice(-1);
    assert.equal(leading.stateName, "LEADER");
    assert.ok(leading.isLeader);
    assert.equal(leading.holder, "sdk-a");
    assert.equal(leading.identity, "sdk-a");
    assert.equal(leading.election, election);
    // The fencing term is the Lease's leaseTransitions + 1: 1 when a created the Lease, higher if it existed.
    assert.equal(typeof leading.term, "bigint");
    assert.ok(leading.term >= 1n, `terms start at 1, got ${leading.term}`);

    const onB = b.campaign(election, { signal: stopB.signal });
    const [following] = (await until(onB, "b to follow", (s) => s.state !== LeadershipState.UNKNOWN)).slice(-1);
    assert.equal(following.stateName, "FOLLOWER");
    assert.equal(following.holder, "sdk-a");
    assert.equal(following.term, leading.term);

    stopA.abort();
    const rest: Leadership[] = [];
    for await (const s of onA) rest.push(s);
    assert.deepEqual(rest, [], "a's stream ends quietly when aborted");
    const [taken] = (await until(onB, "b to lead", (s) => s.isLeader, 30_000)).slice(-1);
    assert.equal(taken.holder, "sdk-b");
    assert.ok(taken.term > leading.term, `term ${taken.term} after ${leading.term}`);
  } finally {
    stopA.abort();
    stopB.abort();
  }
});

test("when the connection to the sidecar is lost, a leader is told UNKNOWN at once and campaigns again", async () => {
  const proxy = await Proxy.start(env("CONSISTD_SOCKET"));
  const viaProxy = new Client(proxy.path);
  clients.push(viaProxy);
  const stop = new AbortController();
  try {
    const states = viaProxy.campaign(unique("ts-reconnect"), { signal: stop.signal });
    const [leading] = (await until(states, "to lead", (s) => s.isLeader)).slice(-1);
    proxy.paused = true;
    proxy.cut();
    const lost = await next(states, "UNKNOWN after the cut", 2_000);
    assert.equal(lost.stateName, "UNKNOWN");
    assert.equal(lost.holder, "");
    assert.equal(lost.term, leading.term);
    proxy.paused = false;
    const [again] = (await until(states, "to lead again", (s) => s.isLeader, 30_000)).slice(-1);
    assert.equal(again.holder, "sdk-a");
    assert.ok(proxy.connections >= 2, `connected ${proxy.connections} time(s)`);
  } finally {
    stop.abort();
    await proxy.close();
  }
});
