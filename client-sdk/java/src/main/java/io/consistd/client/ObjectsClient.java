// Reads and writes Kubernetes objects through the sidecar, recording what writes return for the own-write rule.
package io.consistd.client;

import com.google.protobuf.ByteString;
import consistd.v1.Objects.CreateRequest;
import consistd.v1.Objects.DeleteRequest;
import consistd.v1.Objects.DeleteResponse;
import consistd.v1.Objects.GetRequest;
import consistd.v1.Objects.ListRequest;
import consistd.v1.Objects.ListResponse;
import consistd.v1.Objects.PatchRequest;
import consistd.v1.Objects.PatchResponse;
import consistd.v1.Objects.PropagationPolicy;
import consistd.v1.Objects.RecordEventRequest;
import consistd.v1.Objects.SetConditionRequest;
import consistd.v1.Objects.SetConditionResponse;
import consistd.v1.Objects.UpdateRequest;
import consistd.v1.Objects.UpdateResponse;
import consistd.v1.ObjectsServiceGrpc;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import java.util.Optional;

/**
 * Reads and writes Kubernetes objects as JSON. Reads are served from the sidecar's watch cache when a watch covers
 * the query. Every write records, per object uid, the resourceVersion it returned, so the client's watches never
 * hand the app a state older than its own write (see {@link Watch}); a condition set records only a write it made,
 * and an event recorded ({@link #recordEvent}) is no write to its object. Apiserver errors keep their meaning as
 * {@link StatusRuntimeException}: a conflict is ABORTED, 403 PERMISSION_DENIED, 404 NOT_FOUND.
 */
public final class ObjectsClient {
  /** The patch formats the apiserver accepts. */
  public enum PatchType {
    /** RFC 6902 JSON patch. */
    JSON,
    /** RFC 7386 JSON merge patch. */
    MERGE,
    /** Kubernetes strategic merge patch (built-in types only). */
    STRATEGIC,
    /** Server-side apply; needs {@link ObjectOption#fieldManager}. */
    APPLY
  }

  /** A list of objects and the resourceVersion it was read at. */
  public record ObjectList(List<KubeObject> objects, String resourceVersion) {}

  /**
   * One condition of an object's status.conditions, as metav1.Condition has it; its lastTransitionTime is the
   * daemon's to set ({@link #setCondition}).
   *
   * @param type the condition's type, e.g. "Ready" (metav1.Condition's rules: a name of at most 316 characters, with
   *     an optional DNS subdomain prefix and '/')
   * @param status True, False or Unknown
   * @param reason why, in CamelCase (a letter, then letters, digits, '_', ',' and ':'; at most 1024 characters)
   * @param message for humans; at most 32768 bytes
   * @param observedGeneration the metadata.generation the condition was judged on (a work item's object's); 0: the
   *     generation of the object as the daemon reads it
   */
  public record Condition(
      String type, ConditionStatus status, String reason, String message, long observedGeneration) {
    public Condition {
      Objects.requireNonNull(type, "type");
      Objects.requireNonNull(status, "status");
      Objects.requireNonNull(reason, "reason");
      Objects.requireNonNull(message, "message");
    }

    /** A condition judged on the generation of the object as the daemon reads it ({@code observedGeneration} 0). */
    public Condition(String type, ConditionStatus status, String reason, String message) {
      this(type, status, reason, message, 0);
    }

    consistd.v1.Objects.Condition toProto() {
      return consistd.v1.Objects.Condition.newBuilder()
          .setType(type).setStatus(status.toProto()).setReason(reason).setMessage(message)
          .setObservedGeneration(observedGeneration).build();
    }
  }

  /**
   * What {@link #setCondition} did.
   *
   * @param object the object as the write left it, or as the daemon read it when nothing was written
   * @param changed whether a write was sent: false when the object already had the condition (the same status,
   *     reason, message and observedGeneration)
   * @param lastTransitionTime the condition's lastTransitionTime (RFC 3339) as written, or as it was when nothing was
   *     written
   */
  public record ConditionSet(KubeObject object, boolean changed, String lastTransitionTime) {}

  /**
   * An event (events.k8s.io/v1) about an object ({@link #recordEvent}).
   *
   * @param severity its type, Normal or Warning
   * @param reason why, in CamelCase ("ScalingReplicaSet"); 1 to 128 characters
   * @param action what was done or failed, in CamelCase ("Scale"); 1 to 128 characters
   * @param note for humans; at most 1024 bytes
   * @param uid the object's uid when the app has it (a work item's object's); empty: the daemon reads it, and names
   *     an object that is gone without one
   * @param reportingController the controller reporting it ("example.com/bucket-operator"; a work item's is its
   *     queue's name); empty: the daemon's default, "consistd"; at most 128 characters
   */
  public record Event(
      EventSeverity severity, String reason, String action, String note, String uid, String reportingController) {
    public Event {
      Objects.requireNonNull(severity, "severity");
      Objects.requireNonNull(reason, "reason");
      Objects.requireNonNull(action, "action");
      Objects.requireNonNull(note, "note");
      Objects.requireNonNull(uid, "uid");
      Objects.requireNonNull(reportingController, "reportingController");
    }

    /** An event the daemon finds the object's uid for, reported by its default controller, "consistd". */
    public Event(EventSeverity severity, String reason, String action, String note) {
      this(severity, reason, action, note, "", "");
    }
  }

  private final ObjectsServiceGrpc.ObjectsServiceBlockingStub stub;
  private final OwnWrites writes;
  /** Options every call takes before its own (which override them): a work item's lease and guard. */
  private final ObjectOption[] defaults;

  ObjectsClient(ManagedChannel channel, OwnWrites writes) {
    this(ObjectsServiceGrpc.newBlockingStub(channel), writes, new ObjectOption[0]);
  }

  private ObjectsClient(
      ObjectsServiceGrpc.ObjectsServiceBlockingStub stub, OwnWrites writes, ObjectOption[] defaults) {
    this.stub = stub;
    this.writes = writes;
    this.defaults = defaults;
  }

  /**
   * This client with {@code options} added before every call's own (a call's option of the same kind wins): a
   * {@link WorkItem}'s objects, whose writes name its lease. Shares the connection and the own-write record.
   */
  ObjectsClient withDefaults(ObjectOption... options) {
    return new ObjectsClient(stub, writes, concat(defaults, options));
  }

  private ObjectOption.Settings settings(ObjectOption... options) {
    return ObjectOption.Settings.of(defaults.length == 0 ? options : concat(defaults, options));
  }

  private static ObjectOption[] concat(ObjectOption[] first, ObjectOption[] then) {
    ObjectOption[] all = Arrays.copyOf(first, first.length + then.length);
    System.arraycopy(then, 0, all, first.length, then.length);
    return all;
  }

  /** One object ({@link ObjectOption#readYourWrites} applies). */
  public KubeObject get(String resource, String namespace, String name, ObjectOption... options) {
    ObjectOption.Settings s = settings(options);
    GetRequest request = GetRequest.newBuilder()
        .setResource(resource).setNamespace(namespace).setName(name).setReadYourWrites(s.readYourWrites).build();
    return KubeObject.from(stub.get(request).getObject());
  }

  /** The objects matching a label selector (empty: all); {@link ObjectOption#readYourWrites} applies. */
  public ObjectList list(String resource, String namespace, String labelSelector, ObjectOption... options) {
    ObjectOption.Settings s = settings(options);
    ListRequest request = ListRequest.newBuilder()
        .setResource(resource).setNamespace(namespace).setLabelSelector(labelSelector)
        .setReadYourWrites(s.readYourWrites).build();
    ListResponse response = stub.list(request);
    return new ObjectList(
        response.getObjectsList().stream().map(KubeObject::from).toList(), response.getResourceVersion());
  }

  /** Creates the object {@code json} describes; guard, field manager and reconcile lease apply. */
  public KubeObject create(String resource, String namespace, String json, ObjectOption... options) {
    ObjectOption.Settings s = settings(options);
    CreateRequest.Builder request = CreateRequest.newBuilder()
        .setResource(resource).setNamespace(namespace).setObject(utf8(json))
        .setFieldManager(s.fieldManager).setReconcileLease(s.reconcileLease);
    if (s.guard != null) {
      request.setGuard(s.guardProto());
    }
    return written(stub.create(request.build()).getObject());
  }

  /**
   * Replaces the object (or its subresource); guard, field manager, reconcile lease and {@link
   * ObjectOption#sendUnchanged()} apply. When a synced watch's cache in the sidecar shows the update would change
   * nothing, it is not sent, and the cached object comes back with {@link KubeObject#unchanged()} true.
   */
  public KubeObject update(String resource, String namespace, String name, String json, ObjectOption... options) {
    ObjectOption.Settings s = settings(options);
    UpdateRequest.Builder request = UpdateRequest.newBuilder()
        .setResource(resource).setNamespace(namespace).setName(name).setObject(utf8(json))
        .setSubresource(s.subresource).setFieldManager(s.fieldManager).setReconcileLease(s.reconcileLease)
        .setSendUnchanged(s.sendUnchanged);
    if (s.guard != null) {
      request.setGuard(s.guardProto());
    }
    UpdateResponse response = stub.update(request.build());
    return written(response.getObject(), response.getUnchanged());
  }

  /**
   * Patches the object (or its subresource); guard, field manager, force, reconcile lease and {@link
   * ObjectOption#sendUnchanged()} apply. When a synced watch's cache in the sidecar shows a MERGE or JSON patch would
   * change nothing, it is not sent, and the cached object comes back with {@link KubeObject#unchanged()} true
   * (STRATEGIC and APPLY patches always go).
   */
  public KubeObject patch(
      String resource, String namespace, String name, PatchType type, String patch, ObjectOption... options) {
    ObjectOption.Settings s = settings(options);
    PatchRequest.Builder request = PatchRequest.newBuilder()
        .setResource(resource).setNamespace(namespace).setName(name)
        .setPatchType(switch (type) {
          case JSON -> consistd.v1.Objects.PatchType.PATCH_TYPE_JSON;
          case MERGE -> consistd.v1.Objects.PatchType.PATCH_TYPE_MERGE;
          case STRATEGIC -> consistd.v1.Objects.PatchType.PATCH_TYPE_STRATEGIC;
          case APPLY -> consistd.v1.Objects.PatchType.PATCH_TYPE_APPLY;
        })
        .setPatch(utf8(patch)).setSubresource(s.subresource).setFieldManager(s.fieldManager).setForce(s.force)
        .setReconcileLease(s.reconcileLease).setSendUnchanged(s.sendUnchanged);
    if (s.guard != null) {
      request.setGuard(s.guardProto());
    }
    PatchResponse response = stub.patch(request.build());
    return written(response.getObject(), response.getUnchanged());
  }

  /**
   * Deletes the object; guard, preconditions, propagation and reconcile lease apply. The object's last state when
   * the apiserver returned one (finalizers may keep it around, marked for deletion).
   */
  public Optional<KubeObject> delete(String resource, String namespace, String name, ObjectOption... options) {
    ObjectOption.Settings s = settings(options);
    DeleteRequest.Builder request = DeleteRequest.newBuilder()
        .setResource(resource).setNamespace(namespace).setName(name)
        .setPreconditionUid(s.preconditionUid).setPreconditionResourceVersion(s.preconditionResourceVersion)
        .setReconcileLease(s.reconcileLease);
    if (s.propagation != null) {
      request.setPropagationPolicy(switch (s.propagation) {
        case ORPHAN -> PropagationPolicy.PROPAGATION_POLICY_ORPHAN;
        case BACKGROUND -> PropagationPolicy.PROPAGATION_POLICY_BACKGROUND;
        case FOREGROUND -> PropagationPolicy.PROPAGATION_POLICY_FOREGROUND;
      });
    }
    if (s.guard != null) {
      request.setGuard(s.guardProto());
    }
    DeleteResponse response = stub.delete(request.build());
    return response.hasObject() ? Optional.of(written(response.getObject())) : Optional.empty();
  }

  /**
   * Sets one condition of the object's status.conditions, as apimachinery's {@code meta.SetStatusCondition} does, in
   * the daemon: it reads the object (from a covering watch's cache, else the apiserver) and writes nothing when the
   * condition is there already; otherwise it applies the condition alone to the status subresource with server-side
   * apply under the field manager {@code <field manager>/<type>} ("consistd/Ready" by default), so setting one
   * condition never drops another, the lastTransitionTime kept while the status stays, else now. status.conditions
   * must be a list map keyed by type (Go's {@code []metav1.Condition} with {@code +listType=map} and {@code
   * +listMapKey=type}); on an atomic list the write replaces every other condition. Guard, field manager (the prefix)
   * and reconcile lease apply. A write is recorded for the own-write rule; an answer that wrote nothing is not. A
   * resource without a status subresource is NOT_FOUND. {@link WorkItem#setCondition} fills it in for an item's
   * primary.
   */
  public ConditionSet setCondition(
      String resource, String namespace, String name, Condition condition, ObjectOption... options) {
    Objects.requireNonNull(condition, "condition");
    ObjectOption.Settings s = settings(options);
    SetConditionRequest.Builder request = SetConditionRequest.newBuilder()
        .setResource(resource).setNamespace(namespace).setName(name).setCondition(condition.toProto())
        .setFieldManager(s.fieldManager).setReconcileLease(s.reconcileLease);
    if (s.guard != null) {
      request.setGuard(s.guardProto());
    }
    SetConditionResponse response = stub.setCondition(request.build());
    KubeObject object = response.getChanged() ? written(response.getObject()) : KubeObject.from(response.getObject());
    return new ConditionSet(object, response.getChanged(), response.getLastTransitionTime());
  }

  /**
   * Records an event (events.k8s.io/v1) about the object, in its namespace ("default" for a cluster-scoped one), as
   * client-go's recorder does, once in the daemon for every app of the pod: an event whose severity, reason, action,
   * reporting controller and object match one recorded within 6 minutes is counted on that one's series (its count
   * and lastObservedTime patched, its note the first's), not written anew; and a reporting controller's events about
   * one object pass client-go's rate limit (a burst of 25, then one per 5 minutes), one over it dropped. It is no
   * write to the object: no option applies and nothing is recorded for the own-write rule. The sidecar needs RBAC to
   * create and patch events.k8s.io events. {@link WorkItem#recordEvent} fills it in for an item's primary.
   *
   * @return whether it was recorded: false when the rate limit dropped it
   * @throws StatusRuntimeException as the daemon answered: INVALID_ARGUMENT naming a field it refuses (a reason or
   *     action empty or over 128 characters, a reporting controller over 128, a note over 1024 bytes), ...
   */
  public boolean recordEvent(String resource, String namespace, String name, Event event) {
    Objects.requireNonNull(event, "event");
    RecordEventRequest request = RecordEventRequest.newBuilder()
        .setResource(resource).setNamespace(namespace).setName(name).setUid(event.uid())
        .setSeverity(event.severity().toProto()).setReason(event.reason()).setAction(event.action())
        .setNote(event.note()).setReportingController(event.reportingController()).build();
    return stub.recordEvent(request).getRecorded();
  }

  private KubeObject written(consistd.v1.Object.KubeObject object) {
    return written(object, false);
  }

  /**
   * The object a write returned, recorded for the own-write rule. An unchanged answer is recorded like any other: the
   * cached object is a state the object has, never older than this pod's own writes to it, so a state older than it
   * is rightly held back; the record keeps the largest version either way.
   */
  private KubeObject written(consistd.v1.Object.KubeObject object, boolean unchanged) {
    KubeObject o = KubeObject.from(object, unchanged);
    writes.record(o);
    return o;
  }

  private static ByteString utf8(String json) {
    return ByteString.copyFrom(json, StandardCharsets.UTF_8);
  }
}
