// One lease on one key of a reconcile queue, as a Reconciler's handler gets it.
package io.consistd.client;

import io.consistd.client.WatchEvent.Consistency;
import io.grpc.Context;
import java.time.Instant;

/**
 * A lease on one key (the namespace/name of a primary object) that needs work. Until the handler returns (or the
 * lease times out) no other pass of the key runs, in this process or any other stream of the queue.
 *
 * <p>Writes made for the item go through {@link #objects()}, which names the item's lease on every write (and,
 * when the queue has an election, guards it with the item's term), so the key's next pass waits until the queue's
 * watches show them.
 */
public final class WorkItem {
  private final String namespace;
  private final String name;
  private final KubeObject object;
  private final boolean deleted;
  private final Consistency consistency;
  private final int attempt;
  private final long term;
  private final String leaseId;
  private final Instant expiresAt;
  private final String lastError;
  private final boolean finalizing;
  /** The queue's primary resource, as its spec names it: what {@link #setCondition} writes. */
  private final String resource;
  /** The queue's name, as its spec names it: the reporting controller of {@link #recordEvent}. */
  private final String queue;
  private final ObjectsClient objects;
  /** The pass's context: cancelled when the lease is lost, times out, or the reconciler is closed. */
  private volatile Context.CancellableContext context;

  private WorkItem(consistd.v1.Reconcile.WorkItem w, QueueSpec spec, ObjectsClient objects) {
    this.namespace = w.getNamespace();
    this.name = w.getName();
    this.object = w.hasObject() ? KubeObject.from(w.getObject()) : null;
    this.deleted = w.getDeleted();
    this.consistency = switch (w.getConsistency()) {
      case CONSISTENCY_CONSISTENT -> Consistency.CONSISTENT;
      case CONSISTENCY_AWAITING_OWN_WRITE -> Consistency.AWAITING_OWN_WRITE;
      case CONSISTENCY_OWN_WRITE -> Consistency.OWN_WRITE;
      case CONSISTENCY_TIMED_OUT -> Consistency.TIMED_OUT;
      default -> Consistency.UNSPECIFIED;
    };
    this.attempt = w.getAttempt();
    this.term = w.getTerm();
    this.leaseId = w.getLeaseId();
    this.expiresAt = w.hasExpiresAt()
        ? Instant.ofEpochSecond(w.getExpiresAt().getSeconds(), w.getExpiresAt().getNanos())
        : null;
    this.lastError = w.getLastError();
    this.finalizing = w.getFinalizing();
    this.resource = spec.resource();
    this.queue = spec.name();
    this.objects = objects;
  }

  /**
   * The item the daemon sent for the queue of {@code spec} (its name, primary resource and election), with objects of
   * {@code client} that name its lease on every write and, with an election, guard it with the item's term.
   */
  static WorkItem from(consistd.v1.Reconcile.WorkItem w, ConsistdClient client, QueueSpec spec) {
    ObjectsClient objects = client.objects().withDefaults(ObjectOption.reconcileLease(w.getLeaseId()));
    QueueSpec.Election election = spec.election();
    if (election != null && w.getTerm() != 0) {
      objects = objects.withDefaults(ObjectOption.guard(
          new ObjectOption.Guard(election.election(), election.namespace(), w.getTerm())));
    }
    return new WorkItem(w, spec, objects);
  }

  void bind(Context.CancellableContext context) {
    this.context = context;
  }

  /** The primary's namespace; empty when cluster-scoped. */
  public String namespace() {
    return namespace;
  }

  /** The primary's name. */
  public String name() {
    return name;
  }

  /**
   * The primary as the sidecar's cache held it when the lease was granted; null when a related object queued a key
   * whose primary does not exist.
   */
  public KubeObject object() {
    return object;
  }

  /**
   * The primary was deleted: {@link #object()} is its last known state. A deletion is handed out once; after it the
   * key is forgotten unless the object is created again.
   */
  public boolean deleted() {
    return deleted;
  }

  /**
   * CONSISTENT: the state is at least as new as every write this pod made to the primary and, naming a lease of this
   * key, to related objects. TIMED_OUT: such a write was not seen within the sidecar's consistency timeout and this is
   * the latest state known.
   */
  public Consistency consistency() {
    return consistency;
  }

  /** 1 for the first pass after a change; n for the nth pass in a row after failures. */
  public int attempt() {
    return attempt;
  }

  /**
   * The election's term this lease was granted in (guard writes with it); 0 without an election. In a {@link
   * QueueSpec#sharded(boolean) sharded} queue, the epoch of the key's slot.
   */
  public long term() {
    return term;
  }

  /** Names the lease; {@link #objects()} passes it on every write ({@link ObjectOption#reconcileLease}). */
  public String leaseId() {
    return leaseId;
  }

  /** When the lease times out and goes back to the queue; null if the daemon did not say. */
  public Instant expiresAt() {
    return expiresAt;
  }

  /** The previous pass's error when this pass follows a failure; empty otherwise. */
  public String lastError() {
    return lastError;
  }

  /** A finalize pass: the primary is being deleted and still carries the queue's finalizer (done removes it). */
  public boolean finalizing() {
    return finalizing;
  }

  /**
   * Reads and writes objects for this item: every write names the item's lease (and, when the queue has an
   * election, is guarded by the item's term, so it is refused once this sidecar no longer leads in it); an option a
   * call gives itself overrides either. Its writes count for the own-write rule of the client's watches.
   */
  public ObjectsClient objects() {
    return objects;
  }

  /**
   * Sets the status condition {@code type} of this item's primary, as apimachinery's {@code meta.SetStatusCondition}
   * does, in the daemon ({@link ObjectsClient#setCondition} on the queue's primary resource, this item's namespace and
   * name, through {@link #objects()}). Its observedGeneration is the metadata.generation of the object this pass was
   * handed ({@link #object()}; 0, the object's generation as the daemon reads it, when there is none). The daemon
   * writes it only when something changed (the same status, reason, message and observedGeneration there already:
   * nothing is written, {@code changed} false), keeps its lastTransitionTime while its status stays (else now), and
   * applies it alone to the status subresource with server-side apply under a field manager per condition type, so
   * setting one condition never drops another: the primary's status.conditions must be a list map keyed by type, as
   * Go's {@code []metav1.Condition} with {@code +listType=map} and {@code +listMapKey=type} generates (on an atomic
   * list the write replaces every other condition). Like every write of {@link #objects()}, it is made for this item's
   * lease (the key's next pass waits until the queue's watch shows it, and it queues no pass of its own) and, when the
   * queue follows an election, guarded by the item's term (FAILED_PRECONDITION once this sidecar no longer leads in
   * it).
   *
   * <pre>{@code
   * item.setCondition("Ready", ConditionStatus.TRUE, "Available", "3 of 3 replicas");
   * }</pre>
   *
   * @return whether it wrote ({@code changed}), the condition's lastTransitionTime and the object as written or read
   * @throws io.grpc.StatusRuntimeException as the daemon answered: INVALID_ARGUMENT naming the field of a condition
   *     metav1.Condition's rules refuse, NOT_FOUND for a resource without a status subresource, ...
   */
  public ObjectsClient.ConditionSet setCondition(
      String type, ConditionStatus status, String reason, String message) {
    return objects.setCondition(
        resource, namespace, name, new ObjectsClient.Condition(type, status, reason, message, observedGeneration()));
  }

  /**
   * Records an event (events.k8s.io/v1) about this item's primary, reported by the queue: {@link
   * ObjectsClient#recordEvent} on the queue's primary resource, this item's namespace and name, the uid of the object
   * this pass was handed ({@link #object()}; empty, the daemon reads it, when there is none), with the queue's name
   * ({@link QueueSpec#name()}) as the event's reportingController, as controller-runtime's and kube-rs's recorders
   * name their controller. The daemon correlates events as client-go's recorder does, once for every app of the pod:
   * a repeat within 6 minutes (the same severity, reason, action, reporting controller and object) is counted on the
   * first one's series (its count and lastObservedTime), not written anew; and the queue's events about one object
   * pass client-go's rate limit (a burst of 25, then one per 5 minutes), one over it dropped ({@code false}). An event
   * is no write to the primary: no lease, no guard, nothing for the own-write rule. The sidecar needs RBAC to create
   * and patch events.k8s.io events.
   *
   * <pre>{@code
   * item.recordEvent(EventSeverity.WARNING, "Drifted", "Reconcile", "data moved");
   * }</pre>
   *
   * @param severity the event's type, Normal or Warning
   * @param reason why, in CamelCase; 1 to 128 characters
   * @param action what was done or failed, in CamelCase; 1 to 128 characters
   * @param note for humans; at most 1024 bytes
   * @return whether it was recorded: false when the rate limit dropped it
   * @throws io.grpc.StatusRuntimeException as the daemon answered: INVALID_ARGUMENT naming the field it refuses,
   *     PERMISSION_DENIED without the RBAC, ...
   */
  public boolean recordEvent(EventSeverity severity, String reason, String action, String note) {
    return objects.recordEvent(resource, namespace, name,
        new ObjectsClient.Event(severity, reason, action, note, object == null ? "" : object.uid(), queue));
  }

  /** The metadata.generation of the object this pass was handed; 0 when none (or it has none). */
  private long observedGeneration() {
    return object == null ? 0 : JsonFields.integer(object.json(), "metadata", "generation").orElse(0);
  }

  /**
   * Whether the lease is gone: it timed out, the connection to the sidecar was lost, or the reconciler was closed.
   * The pass's outcome is then dropped; a handler in a long loop may ask this to stop early. (Its thread is also
   * interrupted then, and gRPC calls it makes on its own thread are cancelled.)
   */
  public boolean cancelled() {
    Context.CancellableContext c = context;
    return c != null && c.isCancelled();
  }

  /** The key: "namespace/name", or "name" when cluster-scoped. */
  public String key() {
    return namespace.isEmpty() ? name : namespace + "/" + name;
  }

  /** The key, the attempt and the lease. */
  @Override
  public String toString() {
    return key() + " (attempt " + attempt + ", lease " + leaseId + ")";
  }
}
