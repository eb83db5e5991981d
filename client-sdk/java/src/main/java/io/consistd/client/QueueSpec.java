// A reconcile queue's spec: which objects are the keys, which others queue them, and how the work is handed out.
package io.consistd.client;

import com.google.protobuf.Duration;
import consistd.v1.Reconcile.ChangeFilter;
import consistd.v1.Reconcile.ElectionRef;
import consistd.v1.Reconcile.ObjectQuery;
import consistd.v1.Reconcile.ReconcileRequest;
import consistd.v1.Reconcile.RelatedQuery;
import consistd.v1.Reconcile.RetryPolicy;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.EnumSet;
import java.util.List;
import java.util.Objects;
import java.util.Set;

/**
 * The work queue a {@link Reconciler} works on, built from its name and primary resource: {@code
 * QueueSpec.of("web", "configmaps").namespace("default").labelSelector("app=web").maxLeases(4)}; with {@code
 * .view(ObjectView.onlyFields("spec", "status.conditions"))} its watch keeps (and its items carry) only those fields
 * of each primary; with {@code .onlyChangesOf(QueueSpec.Changed.GENERATION)} only a change of a primary's generation
 * (its spec) queues a pass; with {@code .finalizer("example.com/cleanup")} a deleted primary stays until its finalize
 * pass ({@link WorkItem#finalizing()}) is done. Immutable; each method returns a changed copy. Streams that give the
 * same name share one queue in the sidecar (their specs must be equal, else FAILED_PRECONDITION), so two processes of a
 * pod never work on one key at once.
 *
 * @param name the queue's name: a DNS label (lowercase letters, digits, '-'), the {@code name} label of its
 *     metrics and the name {@code consistd status} shows
 * @param resource the primary resource, in any form a watch accepts ("configmaps", "apps/v1/deployments",
 *     "Deployment"); each of its objects is one key, namespace/name
 * @param namespace the primary objects' namespace; empty for all namespaces (or a cluster-scoped resource)
 * @param labelSelector narrows the primary objects (a Kubernetes label selector; empty for none)
 * @param fieldSelector narrows the primary objects (a Kubernetes field selector; empty for none)
 * @param view how much of each primary object the queue's watch keeps and {@link WorkItem#object()} carries;
 *     {@link ObjectView#DEFAULT} is the whole object without managedFields
 * @param related other objects whose changes queue the primary they name
 * @param maxLeases how many keys are reconciled at once, as controller-runtime's {@code MaxConcurrentReconciles};
 *     0 means 1, at most 10000
 * @param retry the delays of failed passes; null takes client-go's defaults
 * @param leaseTimeout how long one pass may take before its lease goes back to the queue; null (or zero) is the
 *     daemon's default, 10 minutes; at least 1 second
 * @param election when set, work is handed out only while this sidecar leads that election, and each item carries
 *     the term it was granted in (its {@link WorkItem#objects()} guard their writes with it); null for none. With
 *     {@code sharded}, it names the group whose members share the keys instead
 * @param sharded spread the keys over every pod whose sidecar runs this queue (same name, same spec) under {@code
 *     election}: a key is leased to one pod at a time across the whole group. Needs {@code election} (without one
 *     the sidecar refuses the spec, INVALID_ARGUMENT naming spec.sharded). Each item's {@link WorkItem#term()} is
 *     then the epoch of the key's slot, and the guard its {@link WorkItem#objects()} add works unchanged
 * @param shardBy what a sharded queue hashes a key by to find its slot: null (the default, as {@link ShardBy#KEY})
 *     its namespace and name, {@link ShardBy#NAMESPACE} its namespace, so that each member lists and watches only its
 *     slots' namespaces. Needs {@code sharded} (without it the sidecar refuses the spec, INVALID_ARGUMENT naming
 *     spec.shard_by)
 * @param changes the parts of a primary whose change queues a pass ({@link #onlyChangesOf(Changed...)}); empty (or
 *     null) for every change
 * @param finalizer a finalizer the queue keeps on its primary objects, a qualified name ("example.com/cleanup"), so
 *     that a deleted one is handed out as a finalize pass before it goes ({@link #finalizer(String)}); empty (or
 *     null) for none
 */
public record QueueSpec(
    String name,
    String resource,
    String namespace,
    String labelSelector,
    String fieldSelector,
    ObjectView view,
    List<Related> related,
    int maxLeases,
    Retry retry,
    java.time.Duration leaseTimeout,
    Election election,
    boolean sharded,
    ShardBy shardBy,
    Set<Changed> changes,
    String finalizer) {

  /**
   * A part of an object whose change queues a pass ({@link QueueSpec#onlyChangesOf(Changed...)}, {@link
   * Related#onlyChangesOf(Changed...)}): controller-runtime's GenerationChangedPredicate and its label and annotation
   * predicates, kube-rs's predicates.
   */
  public enum Changed {
    /**
     * metadata.generation, which the apiserver moves on a change of the spec (not of status or metadata); an object
     * without one (a ConfigMap, a Secret) counts every change.
     */
    GENERATION,
    /** metadata.labels. */
    LABELS,
    /** metadata.annotations. */
    ANNOTATIONS
  }

  /** What a sharded queue hashes a key by to find its slot ({@link #shardBy(ShardBy)}). */
  public enum ShardBy {
    /** The key, namespace and name: keys spread evenly over the slots; every member watches every object. */
    KEY,
    /**
     * The key's namespace, as Kubernetes' sharded list and watch (KEP-5866) hashes object.metadata.namespace: a
     * namespace's keys are owned together, and each member lists and watches only the namespaces of its slots (where
     * the apiserver honours shard selectors; elsewhere the sidecar drops the rest itself). Only for a primary of a
     * namespaced resource in all namespaces (the sidecar refuses the spec otherwise, INVALID_ARGUMENT naming
     * spec.shard_by); related queries are watched whole.
     */
    NAMESPACE
  }

  /**
   * A query whose objects name a primary key: a change to such an object queues that key. A value "name" names the
   * primary in the related object's own namespace; "namespace/name" names it anywhere (a cluster-scoped primary by
   * "name"). Made with {@link #controllerOwner}, {@link #byLabel}, {@link #byAnnotation} or {@link #byField}; its
   * {@link #view(ObjectView)} says how much of each related object the queue's watch keeps: {@code
   * Related.controllerOwner("pods", "default").view(ObjectView.onlyMetadata())}.
   *
   * @param resource the related resource, in any form a watch accepts
   * @param namespace their namespace; empty for all
   * @param labelSelector a Kubernetes label selector; empty for none
   * @param fieldSelector a Kubernetes field selector; empty for none
   * @param view how much of each related object the queue's watch keeps; {@link ObjectView#DEFAULT} is the whole
   *     object without managedFields. A projection also keeps what {@code mapsBy} reads; a metadata-only view can
   *     map by controller owner, label, annotation or a field under metadata
   * @param mapsBy how an object names its primary; null sends none, which the daemon refuses naming the field
   * @param key the label, annotation or dot-separated field path; empty for {@link MapsBy#CONTROLLER_OWNER}
   * @param priority the priority of the passes this query's changes queue (the primary's changes: 0): a higher one
   *     is handed out first, and a key already queued rises to it
   * @param changes the parts of a related object whose change queues its primary ({@link
   *     #onlyChangesOf(Changed...)}); empty (or null) for every change
   */
  public record Related(
      String resource,
      String namespace,
      String labelSelector,
      String fieldSelector,
      ObjectView view,
      MapsBy mapsBy,
      String key,
      int priority,
      Set<Changed> changes) {
    /** How a related object names its primary. */
    public enum MapsBy {
      /** Its controller ownerReference (controller: true) whose kind is the primary's. */
      CONTROLLER_OWNER,
      /** The value of a label. */
      LABEL,
      /** The value of an annotation. */
      ANNOTATION,
      /** The string at a dot-separated path of the object, e.g. "spec.configMapName". */
      FIELD
    }

    public Related {
      Objects.requireNonNull(resource, "resource");
      Objects.requireNonNull(namespace, "namespace");
      Objects.requireNonNull(labelSelector, "labelSelector");
      Objects.requireNonNull(fieldSelector, "fieldSelector");
      Objects.requireNonNull(view, "view");
      Objects.requireNonNull(key, "key");
      changes = parts(changes);
    }

    /** A related query whose every change queues its primary. */
    public Related(
        String resource,
        String namespace,
        String labelSelector,
        String fieldSelector,
        ObjectView view,
        MapsBy mapsBy,
        String key,
        int priority) {
      this(resource, namespace, labelSelector, fieldSelector, view, mapsBy, key, priority, Set.of());
    }

    /** A related query at priority 0. */
    public Related(
        String resource,
        String namespace,
        String labelSelector,
        String fieldSelector,
        ObjectView view,
        MapsBy mapsBy,
        String key) {
      this(resource, namespace, labelSelector, fieldSelector, view, mapsBy, key, 0);
    }

    /** A related query of the default view: the whole object without managedFields. */
    public Related(
        String resource, String namespace, String labelSelector, String fieldSelector, MapsBy mapsBy, String key) {
      this(resource, namespace, labelSelector, fieldSelector, ObjectView.DEFAULT, mapsBy, key);
    }

    /** Objects of {@code resource} in {@code namespace} (empty: all) owned by a primary as its controller. */
    public static Related controllerOwner(String resource, String namespace) {
      return new Related(resource, namespace, "", "", ObjectView.DEFAULT, MapsBy.CONTROLLER_OWNER, "");
    }

    /** Objects of {@code resource} in {@code namespace} (empty: all) naming their primary in label {@code label}. */
    public static Related byLabel(String resource, String namespace, String label) {
      return new Related(resource, namespace, "", "", ObjectView.DEFAULT, MapsBy.LABEL, label);
    }

    /** Objects naming their primary in annotation {@code annotation}. */
    public static Related byAnnotation(String resource, String namespace, String annotation) {
      return new Related(resource, namespace, "", "", ObjectView.DEFAULT, MapsBy.ANNOTATION, annotation);
    }

    /** Objects naming their primary in the string at {@code path}, e.g. "spec.configMapName". */
    public static Related byField(String resource, String namespace, String path) {
      return new Related(resource, namespace, "", "", ObjectView.DEFAULT, MapsBy.FIELD, path);
    }

    public Related labelSelector(String labelSelector) {
      return new Related(resource, namespace, labelSelector, fieldSelector, view, mapsBy, key, priority, changes);
    }

    public Related fieldSelector(String fieldSelector) {
      return new Related(resource, namespace, labelSelector, fieldSelector, view, mapsBy, key, priority, changes);
    }

    /**
     * How much of each related object the queue's watch keeps: {@code ObjectView.onlyMetadata()}, {@code
     * ObjectView.onlyFields("status.phase")}, or {@link ObjectView#DEFAULT}.
     */
    public Related view(ObjectView view) {
      return new Related(resource, namespace, labelSelector, fieldSelector, view, mapsBy, key, priority, changes);
    }

    /** The priority of the passes this query's changes queue: a higher one is handed out first (default 0). */
    public Related priority(int priority) {
      return new Related(resource, namespace, labelSelector, fieldSelector, view, mapsBy, key, priority, changes);
    }

    /**
     * Only a change of one of these parts of a related object (besides those already named; any of them will do)
     * queues its primary, as {@link QueueSpec#onlyChangesOf(Changed...)}; a related object's first state, its
     * deletion, its deletionTimestamp being set and its move to another primary always do. None named: every change.
     */
    public Related onlyChangesOf(Changed... parts) {
      return new Related(resource, namespace, labelSelector, fieldSelector, view, mapsBy, key, priority,
          union(changes, parts));
    }

    RelatedQuery toProto() {
      RelatedQuery.Builder q = RelatedQuery.newBuilder()
          .setQuery(query(resource, namespace, labelSelector, fieldSelector, view, changes))
          .setPriority(priority);
      if (mapsBy != null) {
        switch (mapsBy) {
          case CONTROLLER_OWNER -> q.setControllerOwner(true);
          case LABEL -> q.setLabel(key);
          case ANNOTATION -> q.setAnnotation(key);
          case FIELD -> q.setField(key);
        }
      }
      return q.build();
    }
  }

  /**
   * Per key, the nth retry in a row waits {@code baseDelay * 2^(n-1)}, at most {@code maxDelay}, and a token of a
   * bucket the queue shares ({@code rate} per second, {@code burst}), whichever is later. A null duration or a zero
   * number takes client-go's default: 5 ms, 1000 s, 10/s, 100.
   */
  public record Retry(java.time.Duration baseDelay, java.time.Duration maxDelay, double rate, int burst) {
    /** Every field at its default. */
    public static final Retry DEFAULTS = new Retry(null, null, 0, 0);

    public Retry baseDelay(java.time.Duration baseDelay) {
      return new Retry(baseDelay, maxDelay, rate, burst);
    }

    public Retry maxDelay(java.time.Duration maxDelay) {
      return new Retry(baseDelay, maxDelay, rate, burst);
    }

    public Retry rate(double rate) {
      return new Retry(baseDelay, maxDelay, rate, burst);
    }

    public Retry burst(int burst) {
      return new Retry(baseDelay, maxDelay, rate, burst);
    }
  }

  /**
   * An election, as in LeadershipService.
   *
   * @param election its name
   * @param namespace its Lease's namespace; empty means the sidecar's own
   */
  public record Election(String election, String namespace) {
    public Election {
      Objects.requireNonNull(election, "election");
      Objects.requireNonNull(namespace, "namespace");
    }
  }

  public QueueSpec {
    Objects.requireNonNull(name, "name");
    Objects.requireNonNull(resource, "resource");
    Objects.requireNonNull(namespace, "namespace");
    Objects.requireNonNull(labelSelector, "labelSelector");
    Objects.requireNonNull(fieldSelector, "fieldSelector");
    Objects.requireNonNull(view, "view");
    related = List.copyOf(related);
    changes = parts(changes);
    finalizer = finalizer == null ? "" : finalizer;
  }

  /** A spec without a finalizer. */
  public QueueSpec(
      String name,
      String resource,
      String namespace,
      String labelSelector,
      String fieldSelector,
      ObjectView view,
      List<Related> related,
      int maxLeases,
      Retry retry,
      java.time.Duration leaseTimeout,
      Election election,
      boolean sharded,
      ShardBy shardBy,
      Set<Changed> changes) {
    this(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry, leaseTimeout,
        election, sharded, shardBy, changes, "");
  }

  /** A spec whose every change of a primary queues a pass. */
  public QueueSpec(
      String name,
      String resource,
      String namespace,
      String labelSelector,
      String fieldSelector,
      ObjectView view,
      List<Related> related,
      int maxLeases,
      Retry retry,
      java.time.Duration leaseTimeout,
      Election election,
      boolean sharded,
      ShardBy shardBy) {
    this(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry, leaseTimeout,
        election, sharded, shardBy, Set.of());
  }

  /** A spec whose keys, when {@code sharded}, are hashed by key (the default {@code shardBy}). */
  public QueueSpec(
      String name,
      String resource,
      String namespace,
      String labelSelector,
      String fieldSelector,
      ObjectView view,
      List<Related> related,
      int maxLeases,
      Retry retry,
      java.time.Duration leaseTimeout,
      Election election,
      boolean sharded) {
    this(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry, leaseTimeout,
        election, sharded, null);
  }

  /** A spec that is not sharded. */
  public QueueSpec(
      String name,
      String resource,
      String namespace,
      String labelSelector,
      String fieldSelector,
      ObjectView view,
      List<Related> related,
      int maxLeases,
      Retry retry,
      java.time.Duration leaseTimeout,
      Election election) {
    this(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry, leaseTimeout,
        election, false, null);
  }

  /** A spec of the default view of the primary objects (the whole object without managedFields), not sharded. */
  public QueueSpec(
      String name,
      String resource,
      String namespace,
      String labelSelector,
      String fieldSelector,
      List<Related> related,
      int maxLeases,
      Retry retry,
      java.time.Duration leaseTimeout,
      Election election) {
    this(name, resource, namespace, labelSelector, fieldSelector, ObjectView.DEFAULT, related, maxLeases, retry,
        leaseTimeout, election, false, null);
  }

  /** The queue {@code name} of every object of {@code resource} in every namespace, one lease at a time. */
  public static QueueSpec of(String name, String resource) {
    return new QueueSpec(name, resource, "", "", "", ObjectView.DEFAULT, List.of(), 0, null, null, null, false, null,
        Set.of(), "");
  }

  public QueueSpec namespace(String namespace) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  public QueueSpec labelSelector(String labelSelector) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  public QueueSpec fieldSelector(String fieldSelector) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  /**
   * How much of each primary object the queue's watch keeps and {@link WorkItem#object()} carries: {@code
   * ObjectView.onlyMetadata()}, {@code ObjectView.onlyFields("spec", "status.conditions")}, or {@link
   * ObjectView#DEFAULT}. A related query's view is its own ({@link Related#view(ObjectView)}).
   */
  public QueueSpec view(ObjectView view) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  /**
   * Only a change of one of these parts of a primary (besides those already named; any of them will do) queues a
   * pass, as controller-runtime's GenerationChangedPredicate and its label and annotation predicates: with {@link
   * Changed#GENERATION} a write of status or metadata alone hands out nothing. An object's first state, its deletion
   * and its deletionTimestamp being set always queue one. None named (the default): every change does. A related
   * query's filter is its own ({@link Related#onlyChangesOf(Changed...)}).
   */
  public QueueSpec onlyChangesOf(Changed... parts) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, union(changes, parts), finalizer);
  }

  /**
   * The finalizer the queue keeps on its primary objects, a qualified name ({@code "example.com/cleanup"}; empty or
   * null for none, the default), as controller-runtime's controllerutil and kube-rs's finalizer() do: the sidecar adds
   * it before a key's first pass, and a primary being deleted that still carries it comes as a finalize pass ({@link
   * WorkItem#finalizing()}). Completing that pass DONE removes the finalizer, so the object goes; any other outcome
   * keeps it, and a deposed leader's removal is refused. A name without a prefix is refused by the sidecar,
   * INVALID_ARGUMENT naming spec.finalizer.
   */
  public QueueSpec finalizer(String finalizer) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  /** These related queries, after the ones already given. */
  public QueueSpec related(Related... more) {
    List<Related> all = new ArrayList<>(related);
    all.addAll(Arrays.asList(more));
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, all, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  public QueueSpec maxLeases(int maxLeases) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  public QueueSpec retry(Retry retry) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  public QueueSpec leaseTimeout(java.time.Duration leaseTimeout) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  /**
   * Hands out work only while this sidecar leads {@code election} in {@code namespace} (empty: its own); with
   * {@link #sharded(boolean)}, the election names the group whose members share the keys instead.
   */
  public QueueSpec election(String election, String namespace) {
    return new QueueSpec(name, resource, namespace(), labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, new Election(election, namespace), sharded, shardBy, changes, finalizer);
  }

  /**
   * Spreads the keys over every pod whose sidecar runs this queue (same name, same spec) under its {@link
   * #election(String, String) election}: {@code QueueSpec.of("web", "configmaps").election("web", "").sharded(true)}.
   * A key is leased to one pod at a time across the whole group. Needs the election (without one the sidecar
   * refuses the spec, INVALID_ARGUMENT naming spec.sharded). Each item's {@link WorkItem#term()} is then the epoch of
   * the key's slot, and the guard its {@link WorkItem#objects()} add works unchanged.
   */
  public QueueSpec sharded(boolean sharded) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  /**
   * What the keys of a {@link #sharded(boolean) sharded} queue are hashed by to find their slot: {@code
   * QueueSpec.of("web", "configmaps").election("web", "").sharded(true).shardBy(QueueSpec.ShardBy.NAMESPACE)}
   * hashes each key's namespace, so that each member lists and watches only its slots' namespaces; null (the
   * default) or {@link ShardBy#KEY} hashes the key. Needs {@code sharded} (without it the sidecar refuses the spec,
   * INVALID_ARGUMENT naming spec.shard_by).
   */
  public QueueSpec shardBy(ShardBy shardBy) {
    return new QueueSpec(name, resource, namespace, labelSelector, fieldSelector, view, related, maxLeases, retry,
        leaseTimeout, election, sharded, shardBy, changes, finalizer);
  }

  /** How many passes run at once: maxLeases, 0 meaning 1. */
  int leases() {
    return maxLeases == 0 ? 1 : maxLeases;
  }

  /**
   * The spec as the stream's first message. A value this API cannot even send is refused here as the daemon refuses
   * the others: INVALID_ARGUMENT, "field: why".
   */
  ReconcileRequest toProto() {
    if (maxLeases < 0) {
      throw invalid("spec.max_leases", maxLeases + ": must be between 1 and 10000 (0 means 1)");
    }
    consistd.v1.Reconcile.QueueSpec.Builder spec = consistd.v1.Reconcile.QueueSpec.newBuilder()
        .setName(name)
        .setPrimary(query(resource, namespace, labelSelector, fieldSelector, view, changes))
        .setMaxLeases(leases());
    for (Related r : related) {
      spec.addRelated(r.toProto());
    }
    if (retry != null && !retry.equals(Retry.DEFAULTS)) {
      if (retry.burst() < 0) {
        throw invalid("spec.retry.burst", retry.burst() + ": must be 0 (the default, 100) or more");
      }
      RetryPolicy.Builder policy = RetryPolicy.newBuilder().setRate(retry.rate()).setBurst(retry.burst());
      if (isSet(retry.baseDelay())) {
        policy.setBaseDelay(duration(retry.baseDelay()));
      }
      if (isSet(retry.maxDelay())) {
        policy.setMaxDelay(duration(retry.maxDelay()));
      }
      spec.setRetry(policy);
    }
    if (isSet(leaseTimeout)) {
      spec.setLeaseTimeout(duration(leaseTimeout));
    }
    if (election != null) {
      spec.setElection(ElectionRef.newBuilder().setElection(election.election()).setNamespace(election.namespace()));
    }
    // Sharded without an election goes to the daemon as is: it refuses it naming spec.sharded.
    spec.setSharded(sharded);
    // So does a shardBy without sharded (or one the primary cannot be sharded by), naming spec.shard_by; null is
    // SHARD_BY_UNSPECIFIED, by key.
    if (shardBy != null) {
      spec.setShardBy(switch (shardBy) {
        case KEY -> consistd.v1.Reconcile.ShardBy.SHARD_BY_KEY;
        case NAMESPACE -> consistd.v1.Reconcile.ShardBy.SHARD_BY_NAMESPACE;
      });
    }
    // Empty is none; a name that is not qualified goes as is, for the daemon to refuse naming spec.finalizer.
    spec.setFinalizer(finalizer);
    return ReconcileRequest.newBuilder().setSpec(spec).build();
  }

  private static ObjectQuery query(
      String resource,
      String namespace,
      String labelSelector,
      String fieldSelector,
      ObjectView view,
      Set<Changed> changes) {
    ObjectQuery.Builder q = ObjectQuery.newBuilder()
        .setResource(resource).setNamespace(namespace).setLabelSelector(labelSelector).setFieldSelector(fieldSelector);
    if (!view.isDefault()) {
      q.setView(view.toProto());
    }
    // None named is unset (every change): the daemon refuses a filter naming nothing.
    if (!changes.isEmpty()) {
      q.setChanges(ChangeFilter.newBuilder()
          .setGeneration(changes.contains(Changed.GENERATION))
          .setLabels(changes.contains(Changed.LABELS))
          .setAnnotations(changes.contains(Changed.ANNOTATIONS)));
    }
    return q.build();
  }

  /** An unmodifiable copy of {@code parts} in declaration order; null is none. */
  private static Set<Changed> parts(Collection<Changed> parts) {
    EnumSet<Changed> copy = EnumSet.noneOf(Changed.class);
    if (parts != null) {
      for (Changed part : parts) {
        copy.add(Objects.requireNonNull(part, "changes"));
      }
    }
    return Collections.unmodifiableSet(copy);
  }

  /** {@code named} and {@code more}. */
  private static Set<Changed> union(Set<Changed> named, Changed... more) {
    List<Changed> all = new ArrayList<>(named);
    all.addAll(Arrays.asList(more));
    return parts(all);
  }

  /** Unset (the daemon's default) for null and zero; a negative one is sent, for the daemon to refuse by name. */
  private static boolean isSet(java.time.Duration d) {
    return d != null && !d.isZero();
  }

  /** As protobuf's Duration, whose seconds and nanos share the sign. */
  static Duration duration(java.time.Duration d) {
    long seconds = d.getSeconds();
    int nanos = d.getNano();
    if (seconds < 0 && nanos > 0) {
      seconds += 1;
      nanos -= 1_000_000_000;
    }
    return Duration.newBuilder().setSeconds(seconds).setNanos(nanos).build();
  }

  private static StatusRuntimeException invalid(String field, String why) {
    return Status.INVALID_ARGUMENT.withDescription(field + ": " + why).asRuntimeException();
  }
}
