// How a sent message ended at its receiver: ACKED, SUPERSEDED or FAILED.
package io.consistd.client;

import consistd.v1.Outbox.WatchAcksResponse;
import io.grpc.Status;
import java.time.Instant;

/**
 * The first outcome of a sent message (for a Service or election destination, the first member's).
 *
 * @param kind ACKED, SUPERSEDED or FAILED
 * @param peer the peer that answered: {@code "host:port"}, or {@code "identity@host:port"} for a member known by
 *     its sidecar's identity
 * @param reason why, for FAILED; empty otherwise
 * @param at when the outcome was recorded
 */
public record Outcome(Kind kind, String peer, String reason, Instant at) {
  /** How a message's life ended. */
  public enum Kind {
    /** The receiving app acknowledged the message. */
    ACKED,
    /** A newer event for the same destination and resource replaced it before it was ACKed. */
    SUPERSEDED,
    /** Delivery was given up; {@link #reason} says why. */
    FAILED
  }

  /** Whether the receiving app acknowledged the message. */
  public boolean isAcked() {
    return kind == Kind.ACKED;
  }

  static Outcome from(WatchAcksResponse r) {
    Kind kind = switch (r.getOutcome()) {
      case ACK_OUTCOME_ACKED -> Kind.ACKED;
      case ACK_OUTCOME_SUPERSEDED -> Kind.SUPERSEDED;
      case ACK_OUTCOME_FAILED -> Kind.FAILED;
      default -> throw Status.INTERNAL
          .withDescription("message " + r.getMessageId() + ": the sidecar answered the outcome " + r.getOutcome())
          .asRuntimeException();
    };
    Instant at = Instant.ofEpochSecond(r.getAt().getSeconds(), r.getAt().getNanos());
    return new Outcome(kind, r.getPeer(), r.getReason(), at);
  }
}
