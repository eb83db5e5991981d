// What an app gives campaign or observe to be told each new leadership status on a thread of the SDK's.
package io.consistd.client;

import io.grpc.StatusRuntimeException;

/**
 * Told the statuses of an {@link Election} on a thread of the SDK's, one call at a time, in order. Calls are
 * coalesced: a listener still busy when statuses come is next called with the newest one only, never a backlog; and
 * it never holds up the SDK's reading of the stream (renewals and the leader's deadline are kept meanwhile). It may
 * call {@link Election#close} itself.
 */
@FunctionalInterface
public interface LeadershipListener {
  /**
   * A new status. Stop acting as leader on the first that is not LEADER. Renewals of the Lease are not new statuses
   * (they move {@link Election#leaderUntil}). An exception thrown here is logged and the listener is called again
   * with the next status.
   */
  void onStatus(LeadershipStatus status);

  /**
   * The daemon refused the election with {@code error} (anything but a lost connection, e.g. INVALID_ARGUMENT): the
   * last call; the election is over and this sidecar does not lead. Called instead of statuses not yet told. Not
   * called when the app closes the election.
   */
  default void onError(StatusRuntimeException error) {}
}
