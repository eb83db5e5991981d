// Leadership: one leader per election, followers see who leads, a resigning leader hands over at once, and a
// leader whose sidecar freezes demotes itself at leaderUntil.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Client, LeadershipState, type Leadership } from "@consistd/client";
import { env, next, OwnDaemon, Proxy, unique, until, within } from "./helpers.js";

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

test("a leader whose sidecar is frozen (SIGSTOP) is told it no longer leads at leaderUntil; renewals are no new states", async () => {
  const daemon = new OwnDaemon(unique("sdk-ts-frozen"));
  const stop = new AbortController();
  let frozen = false;
  try {
    await daemon.start();
    const own = new Client(daemon.socket);
    clients.push(own);
    await own.waitReady(10_000);
    const timing = { leaseDurationMs: 4_000, renewDeadlineMs: 3_000, retryPeriodMs: 1_000 };
    const states = own.campaign(unique("ts-frozen"), { signal: stop.signal, timing });
    const [leading] = (await until(states, "to lead", (s) => s.isLeader, 30_000)).slice(-1);
    assert.ok(leading.leaderUntil instanceof Date, "a LEADER state carries leaderUntil");
    const firstUntil = leading.leaderUntil.getTime();
    assert.ok(firstUntil > Date.now(), "leaderUntil is ahead");
    assert.ok(firstUntil <= Date.now() + timing.renewDeadlineMs + 500, `leaderUntil ${firstUntil - Date.now()} ms ahead`);

    // About three renewals (one a second): none is a new state, each moves the held state's leaderUntil on.
    const following = states.next();
    const quiet = await Promise.race([following, sleep(3_000).then(() => "quiet" as const)]);
    const got = quiet === "quiet" || quiet.done ? quiet : `${quiet.value.stateName} until ${quiet.value.leaderUntil?.toISOString()}`;
    assert.equal(got, "quiet", "renewals must not be yielded");
    assert.ok(leading.isLeader, "renewed: still leader past the first leaderUntil");
    assert.ok(leading.leaderUntil!.getTime() > firstUntil, "renewals moved leaderUntil on");

    assert.ok(daemon.kill("SIGSTOP"), "froze the daemon");
    frozen = true;
    const frozenAt = Date.now();
    // Without the SDK's own deadline nothing would come: the frozen sidecar keeps the stream open and silent.
    const result = await within(timing.renewDeadlineMs + 1_500 + 500, "a non-leader state after SIGSTOP", following);
    const at = Date.now();
    assert.ok(!result.done, "the stream ended");
    const demoted = result.value;
    // The deadline of the last renewal the app heard of (one still in flight at the freeze may have moved it).
    const deadline = leading.leaderUntil!.getTime();
    assert.notEqual(demoted.state, LeadershipState.LEADER, `got ${demoted.stateName}`);
    assert.equal(demoted.stateName, "UNKNOWN");
    assert.equal(demoted.holder, "");
    assert.equal(demoted.term, leading.term);
    assert.ok(!leading.isLeader, "the held LEADER state no longer leads");
    assert.ok(deadline <= frozenAt + timing.renewDeadlineMs + 100, `leaderUntil ${deadline - frozenAt} ms after the freeze`);
    assert.ok(at >= deadline - 100, `demoted ${deadline - at} ms before leaderUntil`);
    assert.ok(at <= deadline + 1_500, `demoted ${at - deadline} ms after leaderUntil`);
  } finally {
    if (frozen) daemon.kill("SIGCONT");
    stop.abort();
    await daemon.remove();
  }
});
