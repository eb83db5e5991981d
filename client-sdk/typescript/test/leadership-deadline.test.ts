// A leader's deadline (leaderUntil) without a daemon: a client whose generated LeadershipService.campaign is
// replaced by a fake stream the test feeds, so it decides which statuses arrive and when, and can stay silent
// as a stopped sidecar does.
import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Client, Leadership, LeadershipState, proto } from "@consistd/client";
import { next, unique, within } from "./helpers.js";

const clients: Client[] = [];
after(() => clients.forEach((c) => c.close()));

const { LEADER, FOLLOWER, UNKNOWN } = LeadershipState;

/** How much later than its deadline a lapse may be told on a busy machine, in milliseconds. */
const LATE_MS = 500;

/** A server stream the test feeds: what the fake campaign returns (messages() iterates it and cancels it). */
class FakeStream {
  cancelled = false;
  private readonly queue: (proto.CampaignResponse | undefined)[] = [];
  private wake?: () => void;

  /** Sends statuses (they wait in the stream until the campaign reads them). */
  push(...statuses: proto.LeadershipStatus[]): void {
    this.queue.push(...statuses.map((status) => ({ status })));
    this.wake?.();
  }

  cancel(): void {
    this.cancelled = true;
    this.queue.push(undefined);
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<proto.CampaignResponse> {
    for (;;) {
      while (this.queue.length === 0) await new Promise<void>((resolve) => (this.wake = resolve));
      const response = this.queue.shift();
      if (!response) return;
      yield response;
    }
  }
}

/** A client on a socket nobody serves, whose campaigns are fakes (every stream it opened, in order). */
class Fake {
  readonly client: Client;
  readonly streams: FakeStream[] = [];
  readonly stop = new AbortController();

  constructor() {
    this.client = new Client(join(tmpdir(), `${unique("consistd-no-daemon")}.sock`));
    clients.push(this.client);
    const leadership = this.client.services.leadership;
    leadership.campaign = (() => {
      const stream = new FakeStream();
      this.streams.push(stream);
      return stream;
    }) as unknown as typeof leadership.campaign;
  }
}

/** A status of election "e" as the daemon sends it; `until` is leaderUntil (LEADER only). */
function status(state: LeadershipState, term: bigint, until?: number, holder = state === LEADER ? "me" : "other") {
  return proto.LeadershipStatus.fromPartial({
    election: "e",
    namespace: "ns",
    state,
    holder: state === UNKNOWN ? "" : holder,
    term,
    identity: "me",
    leaderUntil: until === undefined ? undefined : new Date(until),
  });
}

/** Starts a campaign on `fake` and returns its states and its (first) stream once it opened. */
async function start(fake: Fake, ...first: proto.LeadershipStatus[]) {
  const states = fake.client.campaign("e", { signal: fake.stop.signal });
  const firstState = states.next();
  await within(5_000, "the campaign stream", waitFor(() => fake.streams.length > 0));
  const stream = fake.streams[0];
  stream.push(...first);
  const result = await within(5_000, "the first state", firstState);
  assert.ok(!result.done, "the stream ended before its first state");
  return { states, stream, first: result.value };
}

async function waitFor(condition: () => boolean): Promise<void> {
  while (!condition()) await sleep(5);
}

/** How many timers are active (the deadline's must not outlive the stream). */
function timers(): number {
  return process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
}

/** Ends the campaign and checks that the stream ends quietly. */
async function finish(fake: Fake, states: AsyncGenerator<Leadership, void>): Promise<void> {
  fake.stop.abort();
  const rest: Leadership[] = [];
  await within(2_000, "the stream to end", (async () => {
    for await (const s of states) rest.push(s);
  })());
  assert.deepEqual(rest.map((s) => s.stateName), [], "nothing after the abort");
}

test("a leader whose leaderUntil passes with no newer status is told UNKNOWN at that moment", async () => {
  const fake = new Fake();
  const before = timers();
  const until = Date.now() + 400;
  const { states, stream, first: leading } = await start(fake, status(LEADER, 3n, until));
  assert.equal(leading.stateName, "LEADER");
  assert.ok(leading.isLeader);
  assert.equal(leading.leaderUntil?.getTime(), until);
  assert.equal(leading.status?.leaderUntil?.getTime(), until);

  const lapsed = await next(states, "UNKNOWN at leaderUntil", 5_000);
  const at = Date.now();
  assert.ok(at >= until, `told ${until - at} ms before leaderUntil`);
  assert.ok(at <= until + LATE_MS, `told ${at - until} ms after leaderUntil`);
  assert.equal(lapsed.stateName, "UNKNOWN");
  assert.equal(lapsed.holder, "");
  assert.equal(lapsed.term, 3n);
  assert.equal(lapsed.identity, "me");
  assert.equal(lapsed.election, "e");
  assert.equal(lapsed.namespace, "ns");
  assert.equal(lapsed.leaderUntil, undefined);
  assert.equal(lapsed.status, undefined);
  assert.equal(leading.isLeader, false, "a held LEADER state no longer leads once leaderUntil passed");
  assert.equal(stream.cancelled, false, "the stream stays open: a newer status may still come");

  await finish(fake, states);
  assert.equal(timers(), before, "no timer outlives the stream");
});

test("renewals move leaderUntil on in place and are not yielded; the last renewal's deadline is the one kept", async () => {
  const fake = new Fake();
  const t0 = Date.now();
  const { states, stream, first: leading } = await start(fake, status(LEADER, 5n, t0 + 300));
  const following = states.next();
  let yielded: Leadership | undefined;
  void following.then((r) => (yielded = r.done ? undefined : r.value));

  await sleep(150);
  stream.push(status(LEADER, 5n, t0 + 550));
  await sleep(250); // past the first deadline
  assert.equal(yielded, undefined, "a renewal is not a new state");
  assert.ok(leading.isLeader, "renewed: still leader after the first leaderUntil");
  assert.equal(leading.leaderUntil?.getTime(), t0 + 550);
  assert.equal(leading.status?.leaderUntil?.getTime(), t0 + 550);
  stream.push(status(LEADER, 5n, t0 + 800), status(LEADER, 5n, t0 + 900));

  const lapsed = await within(5_000, "UNKNOWN at the last leaderUntil", following);
  const at = Date.now();
  assert.ok(!lapsed.done);
  assert.equal(lapsed.value.stateName, "UNKNOWN", "renewals yield nothing: the next state is the lapse");
  assert.equal(leading.leaderUntil?.getTime(), t0 + 900);
  assert.ok(at >= t0 + 900, `told ${t0 + 900 - at} ms before the last leaderUntil`);
  assert.ok(at <= t0 + 900 + LATE_MS, `told ${at - t0 - 900} ms after the last leaderUntil`);
  assert.equal(leading.isLeader, false);
  await finish(fake, states);
});

test("after a lapse a later status is yielded as usual, and changes of state are never held back", async () => {
  const fake = new Fake();
  const before = timers();
  const { states, stream } = await start(fake, status(LEADER, 2n, Date.now() + 200));
  assert.equal((await next(states, "the lapse", 5_000)).stateName, "UNKNOWN");

  stream.push(status(LEADER, 2n, Date.now() + 60_000));
  const again = await next(states, "LEADER again", 2_000);
  assert.equal(again.stateName, "LEADER");
  assert.equal(again.holder, "me");
  assert.equal(again.term, 2n);
  assert.ok(again.isLeader);

  stream.push(status(FOLLOWER, 3n));
  const following = await next(states, "FOLLOWER", 2_000);
  assert.equal(following.stateName, "FOLLOWER");
  assert.equal(following.holder, "other");
  assert.equal(following.leaderUntil, undefined);
  assert.equal(again.isLeader, true, "an older state object is not changed by later states");

  stream.push(status(LEADER, 4n, Date.now() + 60_000));
  assert.equal((await next(states, "LEADER in term 4", 2_000)).term, 4n);
  await finish(fake, states);
  assert.equal(timers(), before, "no timer outlives the stream, even one 60 s away");
});

test("a LEADER status whose leaderUntil already passed on arrival is UNKNOWN, and a stale one after it is not news", async () => {
  const fake = new Fake();
  const { states, stream, first } = await start(fake, status(LEADER, 7n, Date.now() - 1_000));
  assert.equal(first.stateName, "UNKNOWN");
  assert.equal(first.holder, "");
  assert.equal(first.term, 7n);
  assert.equal(first.isLeader, false);

  stream.push(status(LEADER, 7n, Date.now() - 500), status(LEADER, 7n, Date.now() + 60_000));
  const leading = await next(states, "LEADER", 2_000);
  assert.equal(leading.stateName, "LEADER", "the stale LEADER was not yielded");
  assert.ok(leading.isLeader);

  stream.push(status(LEADER, 7n, Date.now() - 1));
  const late = await next(states, "UNKNOWN for a renewal that arrived too late", 2_000);
  assert.equal(late.stateName, "UNKNOWN");
  assert.equal(late.term, 7n);
  await finish(fake, states);
});

test("leaving the loop after a lapse resigns at once, though the sidecar never answered again", async () => {
  const fake = new Fake();
  const before = timers();
  const { states, stream } = await start(fake, status(LEADER, 1n, Date.now() + 100));
  assert.equal((await next(states, "the lapse", 5_000)).stateName, "UNKNOWN");
  const result = await within(2_000, "return() after a lapse", states.return());
  assert.ok(result.done);
  assert.ok(stream.cancelled, "the campaign call was cancelled (the sidecar resigns)");
  assert.equal(timers(), before);
});

test("a LEADER status without leaderUntil (an older daemon) leads until told otherwise; repeats are not news", async () => {
  const fake = new Fake();
  const { states, stream, first } = await start(fake, status(LEADER, 1n));
  assert.equal(first.leaderUntil, undefined);
  assert.ok(first.isLeader);
  stream.push(status(LEADER, 1n), status(FOLLOWER, 2n));
  const following = await next(states, "FOLLOWER", 2_000);
  assert.equal(following.stateName, "FOLLOWER", "the repeated LEADER was not yielded");
  assert.ok(first.isLeader, "no deadline: a LEADER state object stays LEADER");
  await finish(fake, states);
});

test("Leadership.isLeader is false once leaderUntil passed, and leaderUntil is only kept for LEADER", () => {
  const fields = { holder: "me", term: 1n, identity: "me", election: "e", namespace: "ns" };
  assert.ok(new Leadership({ ...fields, state: LEADER }).isLeader);
  assert.ok(new Leadership({ ...fields, state: LEADER, leaderUntil: new Date(Date.now() + 10_000) }).isLeader);
  assert.ok(!new Leadership({ ...fields, state: LEADER, leaderUntil: new Date(Date.now() - 1) }).isLeader);
  const fromStatus = new Leadership({ ...fields, state: LEADER, status: status(LEADER, 1n, Date.now() - 1) });
  assert.ok(!fromStatus.isLeader, "leaderUntil is taken from the status");
  const follower = new Leadership({ ...fields, state: FOLLOWER, leaderUntil: new Date(Date.now() + 10_000) });
  assert.equal(follower.leaderUntil, undefined);
  assert.ok(!follower.isLeader);
});
