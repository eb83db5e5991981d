// Leadership as async iterators of states: campaign while iterating, or observe without taking part.
import type { ClientReadableStream } from "@grpc/grpc-js";
import { type Cancellable, messages } from "./call.js";
import { ended, isRetryable, toConsistdError } from "./errors.js";
import type { Duration } from "./gen/google/protobuf/duration.js";
import {
  type LeadershipServiceClient,
  LeadershipState,
  type LeadershipStatus,
  type LeaseTiming,
} from "./gen/consistd/v1/leadership.js";
import { Backoff } from "./retry.js";

/** Election timing in milliseconds; unset fields take the daemon's defaults (client-go's 15 s / 10 s / 2 s). */
export interface Timing {
  /** How long a Lease stays valid after its last renewal. */
  leaseDurationMs?: number;
  /** A leader that has not renewed for this long stops reporting LEADER; below leaseDurationMs. */
  renewDeadlineMs?: number;
  /** How often candidates try to acquire and leaders renew; below renewDeadlineMs. */
  retryPeriodMs?: number;
}

/** Which election to observe. */
export interface ObserveOptions extends Cancellable {
  /** Namespace of the Lease; unset means the daemon's own namespace. */
  namespace?: string;
}

/** Which election to stand in, and how. */
export interface CampaignOptions extends ObserveOptions {
  /** Candidate identity; unset means the daemon's identity (by default the pod name). */
  identity?: string;
  timing?: Timing;
}

/** What a Leadership is made of. */
export interface LeadershipFields {
  state: LeadershipState;
  holder: string;
  term: bigint;
  identity: string;
  election: string;
  namespace: string;
  status?: LeadershipStatus;
  /** Taken from `status` when unset; ignored unless `state` is LEADER. */
  leaderUntil?: Date;
}

/** One state of an election as this sidecar sees it. It is also a valid write guard. */
export class Leadership {
  /** LEADER, FOLLOWER or UNKNOWN. */
  readonly state: LeadershipState;
  /** The current holder's identity; empty when nobody holds the Lease. */
  readonly holder: string;
  /**
   * The fencing term: 1 for an election's first leader, higher on every change of holder; 0 only in an
   * UNKNOWN state before any Lease was read. Pass it in a write's guard.
   */
  readonly term: bigint;
  /** This sidecar's identity in the election. */
  readonly identity: string;
  /** The election (the Lease's name). */
  readonly election: string;
  /** The Lease's namespace. */
  readonly namespace: string;
  /**
   * Everything the daemon reported (timing, acquiredAt, renewedAt, observedAt, leaderUntil): its latest
   * status for this state, so a leader's renewals update it. Undefined for a local UNKNOWN.
   */
  readonly status?: LeadershipStatus;
  /**
   * Set only while LEADER (and the daemon reports it): the moment, on this node's clock, until which the
   * sidecar says LEADER without renewing again. Each renewal moves it on in place (without a new state
   * from `campaign`/`observe`); once it passes with no renewal the app no longer leads: `isLeader` turns
   * false, and the stream yields UNKNOWN at that moment even if the sidecar is stopped or cut off.
   */
  readonly leaderUntil?: Date;

  constructor(fields: LeadershipFields) {
    this.state = fields.state;
    this.holder = fields.holder;
    this.term = fields.term;
    this.identity = fields.identity;
    this.election = fields.election;
    this.namespace = fields.namespace;
    this.status = fields.status;
    this.leaderUntil =
      fields.state === LeadershipState.LEADER ? (fields.leaderUntil ?? fields.status?.leaderUntil) : undefined;
  }

  /**
   * Whether this sidecar leads now: the only state in which the app may act as leader. False once
   * `leaderUntil` has passed, so ask it again before acting rather than keeping the answer.
   */
  get isLeader(): boolean {
    if (this.state !== LeadershipState.LEADER) return false;
    return this.leaderUntil === undefined || Date.now() < this.leaderUntil.getTime();
  }

  /** The state's name: "LEADER", "FOLLOWER" or "UNKNOWN". */
  get stateName(): string {
    return LeadershipState[this.state] ?? String(this.state);
  }
}

/** Which side of an election a stream takes. */
type Role = { campaign: CampaignOptions } | { observe: ObserveOptions };

/**
 * Streams an election's states: the current state first, then every change (rapid changes coalesced, the
 * last one always current). While campaigning, ending the iteration resigns at once. If the connection to
 * the sidecar is lost the stream yields UNKNOWN straight away (stop acting as leader) and opens the stream
 * again with backoff; any other error ends it with that error.
 *
 * A leader's renewals (the same state, holder and term with a later leaderUntil) are not yielded: they move
 * the last state's leaderUntil on. When leaderUntil passes with no newer status (the sidecar is stopped or
 * cut off and cannot say so) the stream yields UNKNOWN at that moment; a LEADER status whose leaderUntil
 * has already passed when it arrives is yielded as UNKNOWN too.
 */
export async function* elect(
  service: LeadershipServiceClient,
  election: string,
  role: Role,
): AsyncGenerator<Leadership, void> {
  const options = "campaign" in role ? role.campaign : role.observe;
  const { signal } = options;
  const backoff = new Backoff();
  // The last state yielded to the app.
  let last = new Leadership({
    state: LeadershipState.UNSPECIFIED,
    holder: "",
    term: 0n,
    identity: ("campaign" in role && role.campaign.identity) || "",
    election,
    namespace: options.namespace ?? "",
  });
  while (!signal?.aborted) {
    let failure: unknown = ended("election stream");
    const call = open(service, election, role);
    const responses = messages(call, signal);
    // The stream's next message, while the app was told of a lapse before it came.
    let pending: Promise<IteratorResult<{ status?: LeadershipStatus | undefined }, void>> | undefined;
    try {
      for (;;) {
        pending ??= responses.next();
        const result = await beforeLapse(pending, last);
        if (result === LAPSED) {
          last = unknown(last);
          yield last;
          continue;
        }
        pending = undefined;
        if (result.done) break;
        const status = result.value.status;
        if (!status) continue;
        backoff.reset();
        const next = fromStatus(status);
        if (sameState(next, last)) {
          // A renewal (or a repeat): it only moves the deadline of the state the app holds.
          if (next.state === LeadershipState.LEADER) renew(last, next);
          continue;
        }
        last = next;
        yield last;
      }
    } catch (error) {
      failure = toConsistdError(error);
    } finally {
      // Leaving with a message still awaited (the app stopped after a lapse): cancelling ends that wait.
      call.cancel();
      pending?.catch(() => {});
      responses.return().catch(() => {});
    }
    if (signal?.aborted) return;
    if (!isRetryable(failure)) throw failure;
    // Tell the app at once that it may no longer lead, then try again.
    if (last.state !== LeadershipState.UNKNOWN) {
      last = unknown(last);
      yield last;
    }
    await backoff.wait(signal);
  }
}

/** What `beforeLapse` answers when a leader's deadline passed first. */
const LAPSED = Symbol("lapsed");

/** The longest a Node timer waits (about 24.8 days); a later deadline is waited for in steps. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * `next` if it settles while `last` still leads, else LAPSED once `last.leaderUntil` passed (at once if it
 * already has). The timer is cleared either way, so nothing is left to keep the process alive.
 */
async function beforeLapse<T>(next: Promise<T>, last: Leadership): Promise<T | typeof LAPSED> {
  for (;;) {
    if (last.state !== LeadershipState.LEADER || last.leaderUntil === undefined) return next;
    const left = last.leaderUntil.getTime() - Date.now();
    if (left <= 0) return LAPSED;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<typeof LAPSED>((resolve) => {
      timer = setTimeout(() => resolve(LAPSED), Math.min(left, MAX_TIMER_MS));
    });
    try {
      const result = await Promise.race([next, timeout]);
      if (result !== LAPSED) return result;
    } finally {
      clearTimeout(timer);
    }
    // The timer fired: look at the clock again (a long deadline is waited for in steps, and the timer's
    // clock is not the wall clock leaderUntil is on).
  }
}

/** The UNKNOWN the SDK tells on its own (sidecar lost, or its leadership lapsed): no holder, the same term. */
function unknown(last: Leadership): Leadership {
  const { term, identity, election, namespace } = last;
  return new Leadership({ state: LeadershipState.UNKNOWN, holder: "", term, identity, election, namespace });
}

/** Whether two states are the same to the app: state, holder and term (timestamps and leaderUntil aside). */
function sameState(a: Leadership, b: Leadership): boolean {
  return a.state === b.state && a.holder === b.holder && a.term === b.term;
}

/** Moves the state the app holds on to a renewal's status and deadline (the fields are readonly to the app only). */
function renew(held: Leadership, renewal: Leadership): void {
  const mutable = held as { status?: LeadershipStatus; leaderUntil?: Date };
  mutable.status = renewal.status;
  mutable.leaderUntil = renewal.leaderUntil;
}

function open(
  service: LeadershipServiceClient,
  election: string,
  role: Role,
): ClientReadableStream<{ status?: LeadershipStatus | undefined }> {
  if ("observe" in role) return service.observe({ election, namespace: role.observe.namespace ?? "" });
  const { namespace = "", identity = "", timing } = role.campaign;
  return service.campaign({ election, namespace, identity, timing: timing && toLeaseTiming(timing) });
}

/**
 * The state a status tells the app: as reported, except that a LEADER whose leaderUntil has already passed
 * does not lead (UNKNOWN, as when its deadline passes while the app holds it).
 */
function fromStatus(status: LeadershipStatus): Leadership {
  const { state, holder, term, identity, election, namespace } = status;
  const leadership = new Leadership({ state, holder, term, identity, election, namespace, status });
  return state === LeadershipState.LEADER && !leadership.isLeader ? unknown(leadership) : leadership;
}

function toLeaseTiming(timing: Timing): LeaseTiming {
  return {
    leaseDuration: duration(timing.leaseDurationMs),
    renewDeadline: duration(timing.renewDeadlineMs),
    retryPeriod: duration(timing.retryPeriodMs),
  };
}

/** A protobuf Duration from milliseconds; undefined stays unset. */
export function duration(ms: number | undefined): Duration | undefined {
  if (ms === undefined) return undefined;
  const whole = Math.floor(ms);
  return { seconds: BigInt(Math.floor(whole / 1000)), nanos: (whole % 1000) * 1_000_000 };
}
