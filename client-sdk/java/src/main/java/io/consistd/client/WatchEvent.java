// One event of a watch, or a marker.
package io.consistd.client;

/**
 * One change of a watched object, or a marker (SYNCED, RESYNC_REQUIRED).
 *
 * @param type what happened
 * @param object the object; null for SYNCED and RESYNC_REQUIRED
 * @param cursor the resume position after this event ({@link WatchRequest#resumeCursor})
 * @param consistency how the state relates to this pod's own writes when the daemon sent it
 * @param predatesOwnWrite RAW mode only: a write through this client returned a newer version of the object before
 *     the app took this event (in CONSISTENT mode such an event is never handed over)
 * @param previousResourceVersion for a MODIFIED event, the resourceVersion of the state of this object that the
 *     daemon's watch saw directly before this one, so no write to the object came between the two (a CONSISTENT
 *     watch may not have delivered that state: it is the daemon's watch's previous state, not this watch's); empty
 *     when that is not known: ADDED and DELETED events, markers, and states from a list or a snapshot (the first
 *     one, a relist, a resync), where writes in between were never seen. With it an app tells the state its own
 *     write made on top of a state it had (this state's resourceVersion is the one its write returned, and this is
 *     the state it wrote on) from one that also holds someone else's change
 */
public record WatchEvent(
    Type type,
    KubeObject object,
    String cursor,
    Consistency consistency,
    boolean predatesOwnWrite,
    String previousResourceVersion) {
  /** Null {@code previousResourceVersion} is empty: none known. */
  public WatchEvent {
    previousResourceVersion = previousResourceVersion == null ? "" : previousResourceVersion;
  }

  /** An event with no previous state known ({@link #previousResourceVersion} empty). */
  public WatchEvent(Type type, KubeObject object, String cursor, Consistency consistency, boolean predatesOwnWrite) {
    this(type, object, cursor, consistency, predatesOwnWrite, "");
  }

  /** What a watch event tells. */
  public enum Type {
    /** The object exists (initial state, creation, or reappearance after a relist). */
    ADDED,
    /** The object changed. */
    MODIFIED,
    /** The object is gone; the object is its last known state. */
    DELETED,
    /** Every object of the initial state (or of a fresh snapshot) has been delivered. */
    SYNCED,
    /** Events were lost (the watcher fell behind, or its cursor expired): a fresh snapshot follows, then SYNCED. */
    RESYNC_REQUIRED
  }

  /** How a state relates to this pod's own writes. */
  public enum Consistency {
    /** Not stated (markers). */
    UNSPECIFIED,
    /** No write of this pod to the object is pending. */
    CONSISTENT,
    /** A write of this pod is pending and this state predates it (RAW mode only). */
    AWAITING_OWN_WRITE,
    /** Exactly the state this pod's own write produced. */
    OWN_WRITE,
    /** This pod's write was not seen within the daemon's consistency timeout; the latest state known. */
    TIMED_OUT
  }

  static WatchEvent from(consistd.v1.Watch.SubscribeResponse r) {
    Type type = switch (r.getType()) {
      case EVENT_TYPE_ADDED -> Type.ADDED;
      case EVENT_TYPE_MODIFIED -> Type.MODIFIED;
      case EVENT_TYPE_DELETED -> Type.DELETED;
      case EVENT_TYPE_SYNCED -> Type.SYNCED;
      case EVENT_TYPE_RESYNC_REQUIRED -> Type.RESYNC_REQUIRED;
      default -> throw new IllegalStateException("the sidecar sent an event of type " + r.getType());
    };
    Consistency consistency = switch (r.getConsistency()) {
      case CONSISTENCY_CONSISTENT -> Consistency.CONSISTENT;
      case CONSISTENCY_AWAITING_OWN_WRITE -> Consistency.AWAITING_OWN_WRITE;
      case CONSISTENCY_OWN_WRITE -> Consistency.OWN_WRITE;
      case CONSISTENCY_TIMED_OUT -> Consistency.TIMED_OUT;
      default -> Consistency.UNSPECIFIED;
    };
    KubeObject object = r.hasObject() ? KubeObject.from(r.getObject()) : null;
    return new WatchEvent(type, object, r.getCursor(), consistency, false, r.getPreviousResourceVersion());
  }

  WatchEvent markedPredatesOwnWrite() {
    return new WatchEvent(type, object, cursor, consistency, true, previousResourceVersion);
  }
}
