// One observation of an election: who leads, in which term (the fencing token), and until when this sidecar says so.
package io.consistd.client;

import java.time.Instant;
import java.util.Objects;

/**
 * One observation of an election, as this sidecar sees it.
 *
 * @param election the election's name (the Lease's name)
 * @param namespace the Lease's namespace
 * @param state LEADER, FOLLOWER or UNKNOWN
 * @param holder the current holder's identity; empty when nobody holds the Lease (and in an UNKNOWN the SDK reports
 *     itself)
 * @param term the fencing token: 1 for an election's first leader, higher on every change of holder; 0 only before
 *     any Lease was read. Pass it in a write's {@link ObjectOption#guard}, a send's or a publish's: {@link #guard}.
 * @param identity this sidecar's identity in the election (the candidate's name when campaigning)
 * @param leaderUntil in a LEADER state, the moment (on this node's clock, which the sidecar shares) until which the
 *     sidecar says LEADER without renewing the Lease again; null in other states and from daemons that do not send
 *     it. Renewals move it on without a new status: {@link Election#leaderUntil} is the moved one, and the SDK reports
 *     UNKNOWN itself when it passes with no renewal.
 */
public record LeadershipStatus(
    String election, String namespace, State state, String holder, long term, String identity, Instant leaderUntil) {
  /** This sidecar's view of an election. */
  public enum State {
    /** This sidecar holds the Lease and renewed it in time: the only state to act as leader in. */
    LEADER,
    /** Another candidate holds a live Lease. */
    FOLLOWER,
    /** The apiserver or the sidecar cannot be reached, or no leader is decided yet. */
    UNKNOWN
  }

  public LeadershipStatus {
    Objects.requireNonNull(election, "election");
    Objects.requireNonNull(namespace, "namespace");
    Objects.requireNonNull(state, "state");
    Objects.requireNonNull(holder, "holder");
    Objects.requireNonNull(identity, "identity");
  }

  /**
   * The status the daemon sent, as it stands at {@code now}: a LEADER whose leader_until has already passed does not
   * lead and is UNKNOWN (no holder, same term).
   */
  static LeadershipStatus from(consistd.v1.Leadership.LeadershipStatus s, Instant now) {
    State state = switch (s.getState()) {
      case LEADERSHIP_STATE_LEADER -> State.LEADER;
      case LEADERSHIP_STATE_FOLLOWER -> State.FOLLOWER;
      default -> State.UNKNOWN;
    };
    Instant until = null;
    if (state == State.LEADER && s.hasLeaderUntil()) {
      until = Instant.ofEpochSecond(s.getLeaderUntil().getSeconds(), s.getLeaderUntil().getNanos());
    }
    LeadershipStatus status = new LeadershipStatus(
        s.getElection(), s.getNamespace(), state, s.getHolder(), s.getTerm(), s.getIdentity(), until);
    return status.lapsedAt(now) ? status.unknownAfter() : status;
  }

  /**
   * The guard of this election and term, for a write ({@link ObjectOption#guard}), a send ({@link
   * SendRequest#guard}) or a publish ({@link Rollout#publish(String, byte[], String, ObjectOption.Guard)}) made as
   * this LEADER: it goes only while this term lasts, and whatever checks it later refuses it once a later term has
   * acted there. From any other state it is refused (FAILED_PRECONDITION; INVALID_ARGUMENT for term 0).
   */
  public ObjectOption.Guard guard() {
    return new ObjectOption.Guard(election, namespace, term);
  }

  /** What an election says before the daemon told anything: UNKNOWN, nobody holds it, term 0. */
  static LeadershipStatus unknown(String election, String namespace, String identity) {
    return new LeadershipStatus(election, namespace, State.UNKNOWN, "", 0, identity, null);
  }

  /** The UNKNOWN that tells an app following this status that it may no longer lead. */
  LeadershipStatus unknownAfter() {
    return new LeadershipStatus(election, namespace, State.UNKNOWN, "", term, identity, null);
  }

  /** This status with the deadline a renewal brought. */
  LeadershipStatus renewedUntil(Instant until) {
    return new LeadershipStatus(election, namespace, state, holder, term, identity, until);
  }

  /** Whether this is a LEADER whose leaderUntil is {@code now} or earlier. */
  boolean lapsedAt(Instant now) {
    return state == State.LEADER && leaderUntil != null && !now.isBefore(leaderUntil);
  }

  /** Whether {@code other} tells nothing new: the same state, holder and term (a renewal, or a stream reopened). */
  boolean sameAs(LeadershipStatus other) {
    return state == other.state && holder.equals(other.holder) && term == other.term;
  }
}
