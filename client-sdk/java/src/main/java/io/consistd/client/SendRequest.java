// One message to send: where it goes, what it is about, and its body.
package io.consistd.client;

import com.google.protobuf.ByteString;
import java.nio.charset.StandardCharsets;
import java.util.Objects;

/**
 * One message for a destination, built from where it goes: {@code SendRequest.to(Destination.peer("10.0.0.7:7443"))
 * .resourceId("orders/42").eventId("7").payload("{\"state\":\"paid\"}").contentType("application/json")}. Immutable;
 * each method returns a changed copy. The sidecar checks it when it is sent (INVALID_ARGUMENT naming the field: an
 * empty resource or event id, no destination, a malformed traceparent, a guard of term 0).
 */
public final class SendRequest {
  private final Destination destination;
  private final String resourceId;
  private final String eventId;
  private final ByteString payload;
  private final String contentType;
  private final String traceparent;
  private final String tracestate;
  private final ObjectOption.Guard guard;

  private SendRequest(Destination destination, String resourceId, String eventId, ByteString payload,
      String contentType, String traceparent, String tracestate, ObjectOption.Guard guard) {
    this.destination = destination;
    this.resourceId = Objects.requireNonNull(resourceId, "resourceId");
    this.eventId = Objects.requireNonNull(eventId, "eventId");
    this.payload = payload;
    this.contentType = Objects.requireNonNull(contentType, "contentType");
    this.traceparent = Objects.requireNonNull(traceparent, "traceparent");
    this.tracestate = Objects.requireNonNull(tracestate, "tracestate");
    this.guard = guard;
  }

  /**
   * A message for {@code destination}, with no resource id, event id or payload yet. A null destination sends none,
   * which the sidecar refuses.
   */
  public static SendRequest to(Destination destination) {
    return new SendRequest(destination, "", "", ByteString.EMPTY, "", "", "", null);
  }

  /**
   * What the message is about: per (destination, resource) one message is in flight, and a newer event supersedes
   * an older one not yet ACKed.
   */
  public SendRequest resourceId(String resourceId) {
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate, guard);
  }

  /** This event of the resource; receivers deduplicate by (sender, resource, event). */
  public SendRequest eventId(String eventId) {
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate, guard);
  }

  /** The message body (copied). */
  public SendRequest payload(byte[] payload) {
    return new SendRequest(
        destination, resourceId, eventId, ByteString.copyFrom(payload), contentType, traceparent, tracestate, guard);
  }

  /** The message body as UTF-8 text. */
  public SendRequest payload(String payload) {
    return new SendRequest(destination, resourceId, eventId, ByteString.copyFrom(payload, StandardCharsets.UTF_8),
        contentType, traceparent, tracestate, guard);
  }

  /** The payload's MIME type, e.g. {@code "application/json"}. */
  public SendRequest contentType(String contentType) {
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate, guard);
  }

  /**
   * The W3C trace context the receiving app gets with the message ({@code tracestate} may be empty). Unset, the
   * sidecar uses the call's own {@code traceparent} metadata, if any.
   */
  public SendRequest trace(String traceparent, String tracestate) {
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate, guard);
  }

  /**
   * Sends the message only while this sidecar leads {@code guard}'s election in exactly that term, as {@link
   * ObjectOption#guard} does for a write: otherwise the send is refused FAILED_PRECONDITION (a description starting
   * {@code "guard: "}) and nothing is stored. The claim goes with the message: a receiving sidecar that has stored a
   * message of a later term of the same election refuses it for good, and its outcome is FAILED naming both terms.
   * The receiving app sees it as {@link InboxMessage#guard}. The guard of a LEADER status is {@link
   * LeadershipStatus#guard}: {@code .guard(led.guard())}.
   */
  public SendRequest guard(ObjectOption.Guard guard) {
    Objects.requireNonNull(guard, "guard");
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate, guard);
  }

  /** Where the message goes; null if none was given. */
  public Destination destination() {
    return destination;
  }

  public String resourceId() {
    return resourceId;
  }

  public String eventId() {
    return eventId;
  }

  /** A copy of the message body. */
  public byte[] payload() {
    return payload.toByteArray();
  }

  public String contentType() {
    return contentType;
  }

  /** The guard the message is sent under; null if none was given. */
  public ObjectOption.Guard guard() {
    return guard;
  }

  @Override
  public String toString() {
    return "SendRequest[to=" + destination + ", resourceId=" + resourceId + ", eventId=" + eventId + ", "
        + payload.size() + " bytes " + contentType + (guard == null ? "" : ", guard=" + guard) + "]";
  }

  consistd.v1.Outbox.SendRequest toProto() {
    consistd.v1.Outbox.SendRequest.Builder r = consistd.v1.Outbox.SendRequest.newBuilder()
        .setResourceId(resourceId).setEventId(eventId).setPayload(payload).setContentType(contentType)
        .setTraceparent(traceparent).setTracestate(tracestate);
    if (destination instanceof Destination.Peer p) {
      r.getDestinationBuilder().setPeer(p.address());
    } else if (destination instanceof Destination.Service s) {
      r.getDestinationBuilder().getServiceBuilder().setNamespace(s.namespace()).setName(s.name());
    } else if (destination instanceof Destination.Election e) {
      r.getDestinationBuilder().setElection(e.name());
    }
    if (guard != null) {
      r.setGuard(guard.toProto());
    }
    return r.build();
  }
}
