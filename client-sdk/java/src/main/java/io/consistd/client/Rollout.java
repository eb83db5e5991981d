// Rollout channels through the sidecar: publish versions, apply them on every replica, wait until all have.
package io.consistd.client;

import com.google.protobuf.ByteString;
import com.google.protobuf.Timestamp;
import consistd.v1.Rollout.GetRolloutStatusRequest;
import consistd.v1.Rollout.GetRolloutStatusResponse;
import consistd.v1.Rollout.MemberStatus;
import consistd.v1.Rollout.PublishRequest;
import consistd.v1.Rollout.ReportAppliedRequest;
import consistd.v1.Rollout.SubscribeVersionsRequest;
import consistd.v1.Rollout.SubscribeVersionsResponse;
import consistd.v1.Rollout.WaitAppliedRequest;
import consistd.v1.Rollout.WaitAppliedResponse;
import consistd.v1.RolloutServiceGrpc;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Objects;

/**
 * A replica barrier on named channels (RolloutService): each change published on a channel gets a strictly
 * increasing version and is pushed to every replica whose app subscribes; the app applies it and reports so; any
 * replica answers "has every live replica applied version N?".
 *
 * <pre>{@code
 * Rollout rollout = new Rollout(client);
 * try (Rollout.Versions versions = rollout.subscribeVersions("config")) { // joins the channel
 *   for (Rollout.Version v : versions) {
 *     apply(v.payload());
 *     rollout.reportApplied("config", v.version());
 *   }
 * }
 * // elsewhere: long v = rollout.publish("config", bytes, "application/json"); // or with an ObjectOption.Guard
 * //            rollout.waitApplied("config", v, Duration.ofSeconds(30)).allApplied()
 * }</pre>
 *
 * <p>A channel is an election in the sidecar's namespace: a replica is a member while its app subscribes, and
 * subscribing needs a sidecar with a peer address (peer.listen, and peer.advertise or POD_IP) the channel's leader
 * can send versions to, else FAILED_PRECONDITION. Errors are the daemon's, unchanged: INVALID_ARGUMENT names the
 * field; Publish on a channel nobody subscribes to (so nobody leads it) is UNAVAILABLE.
 */
public final class Rollout {
  /**
   * One version of a channel, to apply.
   *
   * @param channel the channel
   * @param version its number, strictly increasing per channel
   * @param payload what was published (not copied: do not change it)
   * @param contentType what was published with it
   * @param publishedAt when it was published; null if the daemon did not say
   */
  public record Version(String channel, long version, byte[] payload, String contentType, Instant publishedAt) {}

  /**
   * One member of a channel.
   *
   * @param member its identity (pod name)
   * @param appliedVersion the highest version its app reported applied
   * @param live whether it is still counted as live
   * @param lastSeen when it was last seen; null if the daemon did not say
   */
  public record Member(String member, long appliedVersion, boolean live, Instant lastSeen) {}

  /**
   * The members of a channel and whether every live one applied a version.
   *
   * @param channel the channel
   * @param version the version asked about (the latest when 0 was asked)
   * @param latestVersion the latest published version; 0 when none was
   * @param members every member with what it applied
   * @param allApplied every live member applied {@code version} or newer (false for version 0)
   */
  public record RolloutStatus(
      String channel, long version, long latestVersion, List<Member> members, boolean allApplied) {}

  /**
   * What {@link #waitApplied} found.
   *
   * @param allApplied the barrier opened: every live member applied the version or newer
   * @param members every member with what it applied
   * @param lagging the live members that had not applied it when the timeout passed
   */
  public record Barrier(boolean allApplied, List<Member> members, List<String> lagging) {}

  private final ConsistdClient client;
  private final RolloutServiceGrpc.RolloutServiceBlockingStub stub;

  /** Rollouts through {@code client}'s sidecar. */
  Rollout(ConsistdClient client) {
    this.client = Objects.requireNonNull(client, "client");
    this.stub = RolloutServiceGrpc.newBlockingStub(client.channel());
  }

  /**
   * Publishes a change on {@code channel}: the channel's leader (this sidecar or, through it, another replica)
   * assigns the next version, returned, and sends it to every member.
   *
   * @throws StatusRuntimeException UNAVAILABLE when no replica leads the channel (nobody subscribes to it), or the
   *     daemon's refusal (INVALID_ARGUMENT naming the field)
   */
  public long publish(String channel, byte[] payload, String contentType) {
    return stub.publish(publishRequest(channel, payload, contentType).build()).getVersion();
  }

  /**
   * {@link #publish(String, byte[], String)} made only while this sidecar leads {@code guard}'s election in exactly
   * that term, as {@link ObjectOption#guard} does for a write; the claim goes with the version: the channel refuses
   * it once that election has published on it in a later term, and the members' sidecars refuse the version once
   * they have stored a message of a later term. The guard of a LEADER status is {@link LeadershipStatus#guard}:
   * {@code publish("config", bytes, "application/json", led.guard())}.
   *
   * @throws StatusRuntimeException FAILED_PRECONDITION, a description starting {@code "guard: "}, when this sidecar
   *     does not lead that election in that term; FAILED_PRECONDITION naming both terms when the channel has a
   *     version of a later term of the election; else as {@link #publish(String, byte[], String)}
   */
  public long publish(String channel, byte[] payload, String contentType, ObjectOption.Guard guard) {
    Objects.requireNonNull(guard, "guard");
    return stub.publish(publishRequest(channel, payload, contentType).setGuard(guard.toProto()).build()).getVersion();
  }

  private static PublishRequest.Builder publishRequest(String channel, byte[] payload, String contentType) {
    return PublishRequest.newBuilder()
        .setChannel(channel).setPayload(ByteString.copyFrom(payload)).setContentType(contentType);
  }

  /**
   * Joins {@code channel} (this replica is a member, and a candidate for its leader, while the subscription is open)
   * and gives the versions to apply: the latest published first, then each newer one. Close it to leave.
   *
   * <p>When the connection is lost (UNAVAILABLE, or the stream ends without the app closing it) it subscribes again,
   * with backoff; the daemon then sends the latest version first, so the app never sees a version twice nor one
   * older than it has seen, but may not see every version published while the connection was down (only the
   * latest of them): a version is the whole state to apply, not a change to the one before.
   */
  public Versions subscribeVersions(String channel) {
    Objects.requireNonNull(channel, "channel");
    return new Versions(channel);
  }

  /**
   * Records that this replica's app applied {@code version} (and everything before it) of {@code channel}.
   *
   * @throws StatusRuntimeException FAILED_PRECONDITION when this replica is not a member (its app does not
   *     subscribe) or the version was never published; INVALID_ARGUMENT naming the field
   */
  public void reportApplied(String channel, long version) {
    stub.reportApplied(ReportAppliedRequest.newBuilder().setChannel(channel).setVersion(version).build());
  }

  /**
   * Waits until every live member of {@code channel} applied {@code version} or newer, or {@code timeout} passes
   * (at most an hour), and says which.
   *
   * @throws StatusRuntimeException the daemon's refusal (INVALID_ARGUMENT naming the field)
   */
  public Barrier waitApplied(String channel, long version, Duration timeout) {
    Objects.requireNonNull(timeout, "timeout");
    WaitAppliedResponse r = stub.waitApplied(WaitAppliedRequest.newBuilder()
        .setChannel(channel).setVersion(version).setTimeout(QueueSpec.duration(timeout)).build());
    return new Barrier(r.getAllApplied(), members(r.getMembersList()), List.copyOf(r.getLaggingList()));
  }

  /** The members of {@code channel} and what they applied, about {@code version} (0: the latest). */
  public RolloutStatus status(String channel, long version) {
    GetRolloutStatusResponse r = stub.getRolloutStatus(
        GetRolloutStatusRequest.newBuilder().setChannel(channel).setVersion(version).build());
    return new RolloutStatus(r.getChannel(), r.getVersion(), r.getLatestVersion(), members(r.getMembersList()),
        r.getAllApplied());
  }

  private static List<Member> members(List<MemberStatus> members) {
    return members.stream()
        .map(m -> new Member(m.getMember(), m.getAppliedVersion(), m.getLive(),
            m.hasLastSeen() ? instant(m.getLastSeen()) : null))
        .toList();
  }

  private static Instant instant(Timestamp t) {
    return Instant.ofEpochSecond(t.getSeconds(), t.getNanos());
  }

  /**
   * The versions of one channel, taken one at a time: a blocking {@link Iterator}, and an {@link Iterable} whose
   * single iterator is the subscription itself. Close it to leave the channel; {@link #close} may be called from any
   * thread and ends a blocked {@code hasNext} with false. The daemon's refusal (FAILED_PRECONDITION without a peer
   * address, INVALID_ARGUMENT naming the field) is thrown from {@code hasNext} or {@code next} and ends it.
   */
  public final class Versions implements Iterator<Version>, Iterable<Version>, AutoCloseable {
    private final ResumingStream<SubscribeVersionsRequest, SubscribeVersionsResponse> stream;
    private SubscribeVersionsResponse pending;
    /** The highest version handed to the app: after a reconnect, nothing at or below it is handed out again. */
    private long last;
    private boolean iterated;

    private Versions(String channel) {
      SubscribeVersionsRequest request = SubscribeVersionsRequest.newBuilder().setChannel(channel).build();
      RolloutServiceGrpc.RolloutServiceStub stub =
          RolloutServiceGrpc.newStub(client.channel()).withExecutor(Runnable::run);
      this.stream = new ResumingStream<>(client, "version", stub::subscribeVersions, () -> request);
    }

    /** This subscription, once. */
    @Override
    public Iterator<Version> iterator() {
      if (iterated) {
        throw new IllegalStateException("a subscription is iterated once; subscribe again to read again");
      }
      iterated = true;
      return this;
    }

    /** Waits until a newer version has arrived; false once closed. */
    @Override
    public boolean hasNext() {
      if (pending == null) {
        pending = receive();
      }
      return pending != null;
    }

    /**
     * Takes the next version, waiting for it.
     *
     * @throws NoSuchElementException once closed
     * @throws StatusRuntimeException the daemon's refusal (anything but a lost connection)
     */
    @Override
    public Version next() {
      if (!hasNext()) {
        throw new NoSuchElementException("the subscription is closed");
      }
      SubscribeVersionsResponse r = pending;
      pending = null;
      last = r.getVersion();
      return new Version(r.getChannel(), r.getVersion(), r.getPayload().toByteArray(), r.getContentType(),
          r.hasPublishedAt() ? instant(r.getPublishedAt()) : null);
    }

    /** Leaves the channel; a {@code hasNext} blocked in another thread returns false. */
    @Override
    public void close() {
      stream.close();
    }

    /** The next version newer than the last taken, subscribing (again) as needed; null once closed. */
    private SubscribeVersionsResponse receive() {
      SubscribeVersionsResponse response;
      do {
        response = stream.receive(); // after a reconnect, the latest again: skipped if the app has it
      } while (response != null && response.getVersion() <= last);
      return response;
    }
  }
}
