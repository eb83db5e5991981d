// One message to send: where it goes, what it is about, and its body.
package io.consistd.client;

import com.google.protobuf.ByteString;
import java.nio.charset.StandardCharsets;
import java.util.Objects;

/**
 * One message for a destination, built from where it goes: {@code SendRequest.to(Destination.peer("10.0.0.7:7443"))
 * .resourceId("orders/42").eventId("7").payload("{\"state\":\"paid\"}").contentType("application/json")}. Immutable;
 * each method returns a changed copy. The sidecar checks it when it is sent (INVALID_ARGUMENT naming the field: an
 * empty resource or event id, no destination, a malformed traceparent).
 */
public final class SendRequest {
  private final Destination destination;
  private final String resourceId;
  private final String eventId;
  private final ByteString payload;
  private final String contentType;
  private final String traceparent;
  private final String tracestate;

  private SendRequest(Destination destination, String resourceId, String eventId, ByteString payload,
      String contentType, String traceparent, String tracestate) {
    this.destination = destination;
    this.resourceId = Objects.requireNonNull(resourceId, "resourceId");
    this.eventId = Objects.requireNonNull(eventId, "eventId");
    this.payload = payload;
    this.contentType = Objects.requireNonNull(contentType, "contentType");
    this.traceparent = Objects.requireNonNull(traceparent, "traceparent");
    this.tracestate = Objects.requireNonNull(tracestate, "tracestate");
  }

  /**
   * A message for {@code destination}, with no resource id, event id or payload yet. A null destination sends none,
   * which the sidecar refuses.
   */
  public static SendRequest to(Destination destination) {
    return new SendRequest(destination, "", "", ByteString.EMPTY, "", "", "");
  }

  /**
   * What the message is about: per (destination, resource) one message is in flight, and a newer event supersedes
   * an older one not yet ACKed.
   */
  public SendRequest resourceId(String resourceId) {
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate);
  }

  /** This event of the resource; receivers deduplicate by (sender, resource, event). */
  public SendRequest eventId(String eventId) {
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate);
  }

  /** The message body (copied). */
  public SendRequest payload(byte[] payload) {
    return new SendRequest(
        destination, resourceId, eventId, ByteString.copyFrom(payload), contentType, traceparent, tracestate);
  }

  /** The message body as UTF-8 text. */
  public SendRequest payload(String payload) {
    return new SendRequest(destination, resourceId, eventId, ByteString.copyFrom(payload, StandardCharsets.UTF_8),
        contentType, traceparent, tracestate);
  }

  /** The payload's MIME type, e.g. {@code "application/json"}. */
  public SendRequest contentType(String contentType) {
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate);
  }

  /**
   * The W3C trace context the receiving app gets with the message ({@code tracestate} may be empty). Unset, the
   * sidecar uses the call's own {@code traceparent} metadata, if any.
   */
  public SendRequest trace(String traceparent, String tracestate) {
    return new SendRequest(destination, resourceId, eventId, payload, contentType, traceparent, tracestate);
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

  @Override
  public String toString() {
    return "SendRequest[to=" + destination + ", resourceId=" + resourceId + ", eventId=" + eventId + ", "
        + payload.size() + " bytes " + contentType + "]";
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
    return r.build();
  }
}
