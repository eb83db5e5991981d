// The type of a Kubernetes event: Normal or Warning.
package io.consistd.client;

/**
 * The type of an event (events.k8s.io/v1 Event's {@code type}) an app records ({@link WorkItem#recordEvent}, {@link
 * ObjectsClient#recordEvent}).
 */
public enum EventSeverity {
  /** "Normal": something happened, nothing to worry about. */
  NORMAL,
  /** "Warning": something is not as it should be. */
  WARNING;

  consistd.v1.Objects.EventSeverity toProto() {
    return switch (this) {
      case NORMAL -> consistd.v1.Objects.EventSeverity.EVENT_SEVERITY_NORMAL;
      case WARNING -> consistd.v1.Objects.EventSeverity.EVENT_SEVERITY_WARNING;
    };
  }
}
