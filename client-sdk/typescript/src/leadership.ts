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
  /** Everything the daemon reported (timing, acquiredAt, renewedAt, observedAt); undefined for a local UNKNOWN. */
  readonly status?: LeadershipStatus;

  constructor(fields: Omit<Leadership, "isLeader" | "stateName">) {
    this.state = fields.state;
    this.holder = fields.holder;
    this.term = fields.term;
    this.identity = fields.identity;
    this.election = fields.election;
    this.namespace = fields.namespace;
    this.status = fields.status;
  }

  /** Whether this sidecar leads: the only state in which the app may act as leader. */
  get isLeader(): boolean {
    return this.state === LeadershipState.LEADER;
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
 */
export async function* elect(
  service: LeadershipServiceClient,
  election: string,
  role: Role,
): AsyncGenerator<Leadership, void> {
  const options = "campaign" in role ? role.campaign : role.observe;
  const { signal } = options;
  const backoff = new Backoff();
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
    try {
      for await (const response of messages(open(service, election, role), signal)) {
        if (!response.status) continue;
        backoff.reset();
        last = fromStatus(response.status);
        yield last;
      }
    } catch (error) {
      failure = toConsistdError(error);
    }
    if (signal?.aborted) return;
    if (!isRetryable(failure)) throw failure;
    // Tell the app at once that it may no longer lead, then try again.
    if (last.state !== LeadershipState.UNKNOWN) {
      last = new Leadership({ ...last, state: LeadershipState.UNKNOWN, holder: "", status: undefined });
      yield last;
    }
    await backoff.wait(signal);
  }
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

function fromStatus(status: LeadershipStatus): Leadership {
  const { state, holder, term, identity, election, namespace } = status;
  return new Leadership({ state, holder, term, identity, election, namespace, status });
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
