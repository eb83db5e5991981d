// One message a peer pod sent to this pod's app, as the inbox handler gets it.
package io.consistd.client;

import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.Arrays;
import java.util.Objects;

/**
 * One message a peer sent to this pod; the sidecar delivers it again until it is ACKed.
 *
 * @param id the sidecar's id for the message
 * @param sender the sending pod's identity
 * @param resourceId what the message is about
 * @param eventId which event of the resource
 * @param payload the message body ({@link #payload()} gives a copy; {@link #text()} decodes it)
 * @param contentType the payload's MIME type, as the sender gave it (may be empty)
 * @param deliveryAttempt 1 on first delivery, higher after a NACK or a reconnect
 * @param receivedAt when the sidecar received the message
 * @param traceparent the W3C trace context the message was sent under (empty for none)
 * @param tracestate the W3C {@code tracestate} going with traceparent
 * @param guard the guard the sending app sent it under ({@link SendRequest#guard}: its election, the Lease's namespace
 *     and the term); null for an unguarded send. Once this sidecar stored it, it refuses every message of that
 *     election guarded by an older term.
 */
public record InboxMessage(String id, String sender, String resourceId, String eventId, byte[] payload,
    String contentType, int deliveryAttempt, Instant receivedAt, String traceparent, String tracestate,
    ObjectOption.Guard guard) {
  public InboxMessage {
    payload = payload.clone();
  }

  /** A message sent unguarded. */
  public InboxMessage(String id, String sender, String resourceId, String eventId, byte[] payload,
      String contentType, int deliveryAttempt, Instant receivedAt, String traceparent, String tracestate) {
    this(id, sender, resourceId, eventId, payload, contentType, deliveryAttempt, receivedAt, traceparent, tracestate,
        null);
  }

  /** A copy of the message body. */
  @Override
  public byte[] payload() {
    return payload.clone();
  }

  /** The message body decoded as UTF-8. */
  public String text() {
    return new String(payload, StandardCharsets.UTF_8);
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof InboxMessage m && id.equals(m.id) && sender.equals(m.sender)
        && resourceId.equals(m.resourceId) && eventId.equals(m.eventId) && Arrays.equals(payload, m.payload)
        && contentType.equals(m.contentType) && deliveryAttempt == m.deliveryAttempt
        && receivedAt.equals(m.receivedAt) && traceparent.equals(m.traceparent) && tracestate.equals(m.tracestate)
        && Objects.equals(guard, m.guard);
  }

  @Override
  public int hashCode() {
    return 31 * id.hashCode() + Arrays.hashCode(payload);
  }

  @Override
  public String toString() {
    return "InboxMessage[" + id + " from " + sender + ": " + resourceId + " event " + eventId + ", "
        + payload.length + " bytes " + contentType + ", attempt " + deliveryAttempt
        + (guard == null ? "" : ", guard " + guard) + "]";
  }

  static InboxMessage from(consistd.v1.Inbox.InboxMessage m) {
    return new InboxMessage(m.getMessageId(), m.getSender(), m.getResourceId(), m.getEventId(),
        m.getPayload().toByteArray(), m.getContentType(), m.getDeliveryAttempt(),
        Instant.ofEpochSecond(m.getReceivedAt().getSeconds(), m.getReceivedAt().getNanos()), m.getTraceparent(),
        m.getTracestate(), m.hasGuard() ? ObjectOption.Guard.from(m.getGuard()) : null);
  }
}
