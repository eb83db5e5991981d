// Leadership through the sidecar: campaign in an election or observe it (an Election), or ask who leads now.
package io.consistd.client;

import consistd.v1.Leadership.CampaignRequest;
import consistd.v1.Leadership.GetLeadershipRequest;
import consistd.v1.Leadership.ObserveRequest;
import consistd.v1.LeadershipServiceGrpc;
import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.time.Instant;
import java.util.Objects;
import java.util.function.BiConsumer;
import java.util.function.Function;

/**
 * Lease-based elections (coordination.k8s.io/v1) run by the sidecar for the app: {@link #campaign} stands in one
 * while the returned {@link Election} is open, {@link #observe} follows one without taking part, {@link #get}
 * answers who leads now. An election is named by the Lease's name and namespace; an empty namespace is the sidecar's
 * own.
 *
 * <pre>{@code
 * try (Election election = client.leadership().campaign("controller", "")) {
 *   LeadershipStatus led = election.awaitLeader(Duration.ofMinutes(1));
 *   // write with ObjectOption.guard(led.guard()), send with SendRequest.guard(led.guard()), while election.isLeader()
 * }
 * }</pre>
 */
public final class Leadership {
  private final ConsistdClient client;
  private final LeadershipServiceGrpc.LeadershipServiceStub stub;
  private final LeadershipServiceGrpc.LeadershipServiceBlockingStub blocking;

  Leadership(ConsistdClient client) {
    this.client = client;
    this.stub = LeadershipServiceGrpc.newStub(client.channel());
    this.blocking = LeadershipServiceGrpc.newBlockingStub(client.channel());
  }

  /**
   * Makes this sidecar a candidate in the election until the returned election is closed (which resigns). Pull its
   * statuses from the election ({@link Election#next}, {@link Election#awaitLeader}, ...).
   */
  public Election campaign(String election, String namespace, CampaignOption... options) {
    return campaign(election, namespace, null, options);
  }

  /**
   * {@link #campaign(String, String, CampaignOption...)}, telling {@code listener} each new status on a thread of
   * the SDK's (coalesced: see {@link LeadershipListener}).
   */
  public Election campaign(
      String election, String namespace, LeadershipListener listener, CampaignOption... options) {
    Objects.requireNonNull(election, "election");
    Objects.requireNonNull(namespace, "namespace");
    CampaignOption.Settings s = CampaignOption.Settings.of(options);
    CampaignRequest.Builder request = CampaignRequest.newBuilder()
        .setElection(election).setNamespace(namespace).setIdentity(s.identity);
    if (s.timing != null) {
      request.setTiming(s.timing);
    }
    CampaignRequest built = request.build();
    return new Election(election, namespace, s.identity, "campaign",
        opener(stub::campaign, built, r -> r.hasStatus() ? r.getStatus() : null), this::resetConnectBackoff, listener);
  }

  /** Follows the election's statuses without taking part, until the returned election is closed. */
  public Election observe(String election, String namespace) {
    return observe(election, namespace, null);
  }

  /**
   * {@link #observe(String, String)}, telling {@code listener} each new status on a thread of the SDK's (coalesced:
   * see {@link LeadershipListener}).
   */
  public Election observe(String election, String namespace, LeadershipListener listener) {
    Objects.requireNonNull(election, "election");
    Objects.requireNonNull(namespace, "namespace");
    ObserveRequest request = ObserveRequest.newBuilder().setElection(election).setNamespace(namespace).build();
    return new Election(election, namespace, "", "observe",
        opener(stub::observe, request, r -> r.hasStatus() ? r.getStatus() : null), this::resetConnectBackoff, listener);
  }

  /**
   * The election's current status, at once: UNKNOWN if it says LEADER with a leaderUntil already past. Its
   * leaderUntil is the one it was read with; nothing moves it.
   *
   * @throws StatusRuntimeException as the daemon sent it (INVALID_ARGUMENT names the field; UNAVAILABLE when the
   *     sidecar cannot be reached)
   */
  public LeadershipStatus get(String election, String namespace) {
    Objects.requireNonNull(election, "election");
    Objects.requireNonNull(namespace, "namespace");
    GetLeadershipRequest request =
        GetLeadershipRequest.newBuilder().setElection(election).setNamespace(namespace).build();
    return LeadershipStatus.from(blocking.getLeadership(request).getStatus(), Instant.now());
  }

  private void resetConnectBackoff() {
    client.channel().resetConnectBackoff();
  }

  /**
   * Opens a stream of {@code call} in a context of its own, whose cancellation ends it (and resigns a campaign);
   * {@code status} is a response's status, null if it has none (skipped). Once the client is closed, the election
   * ends with CANCELLED.
   */
  private <Q, R> Election.Opener opener(
      BiConsumer<Q, StreamObserver<R>> call, Q request, Function<R, consistd.v1.Leadership.LeadershipStatus> status) {
    return statuses -> {
      if (client.channel().isShutdown()) {
        // Not a lost connection: the app closed the client, and the election ends with it.
        throw Status.CANCELLED.withDescription("the client is closed").asRuntimeException();
      }
      // Not the caller's context: the election lives until it is closed, not as long as the call that started it.
      Context.CancellableContext context = Context.ROOT.withCancellation();
      context.run(() -> call.accept(request, new StreamObserver<R>() {
        @Override
        public void onNext(R response) {
          consistd.v1.Leadership.LeadershipStatus s = status.apply(response);
          if (s != null) {
            statuses.onNext(s);
          }
        }

        @Override
        public void onError(Throwable t) {
          statuses.onError(t);
        }

        @Override
        public void onCompleted() {
          statuses.onCompleted();
        }
      }));
      return () -> context.cancel(null);
    };
  }
}
