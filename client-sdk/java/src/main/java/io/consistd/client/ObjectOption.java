// Options of object reads and writes: a guard, a reconcile lease, a field manager, a subresource, ...
package io.consistd.client;

import java.util.Objects;
import java.util.function.Consumer;

/**
 * One option of an {@link ObjectsClient} call, e.g. {@code ObjectOption.guard(new Guard("controller", "", term))}.
 * An option a call does not use is ignored; of two of the same kind, the later wins.
 */
public final class ObjectOption {
  /**
   * Names an election and the term in which a write, a send ({@link SendRequest#guard}) or a publish ({@link
   * Rollout#publish(String, byte[], String, Guard)}) must be made (the fencing token): the election's name, its
   * Lease's namespace (empty: the sidecar's own) and the {@link LeadershipStatus#term} this sidecar was told it leads
   * in.
   */
  public record Guard(String election, String namespace, long term) {
    public Guard {
      Objects.requireNonNull(election, "election");
      Objects.requireNonNull(namespace, "namespace");
    }

    consistd.v1.Object.WriteGuard toProto() {
      return consistd.v1.Object.WriteGuard.newBuilder()
          .setElection(election).setNamespace(namespace).setTerm(term).build();
    }

    /** The guard a received message was sent under. */
    static Guard from(consistd.v1.Object.WriteGuard g) {
      return new Guard(g.getElection(), g.getNamespace(), g.getTerm());
    }
  }

  /** How dependents are handled on delete. */
  public enum Propagation {
    ORPHAN,
    BACKGROUND,
    FOREGROUND
  }

  /** Every option of one call. */
  static final class Settings {
    Guard guard;
    String reconcileLease = "";
    boolean sendUnchanged;
    String fieldManager = "";
    String subresource = "";
    boolean force;
    boolean readYourWrites;
    String preconditionUid = "";
    String preconditionResourceVersion = "";
    Propagation propagation;

    static Settings of(ObjectOption... options) {
      Settings settings = new Settings();
      for (ObjectOption option : options) {
        option.apply.accept(settings);
      }
      return settings;
    }

    consistd.v1.Object.WriteGuard guardProto() {
      return guard.toProto();
    }
  }

  private final Consumer<Settings> apply;

  private ObjectOption(Consumer<Settings> apply) {
    this.apply = apply;
  }

  /**
   * A write accepted only while this daemon leads {@code guard}'s election in exactly that term; otherwise
   * FAILED_PRECONDITION.
   */
  public static ObjectOption guard(Guard guard) {
    Objects.requireNonNull(guard, "guard");
    return new ObjectOption(s -> s.guard = guard);
  }

  /**
   * A write made for a reconcile work item's lease: the key's next pass waits until the watch of the written object
   * has caught up with it.
   */
  public static ObjectOption reconcileLease(String leaseId) {
    Objects.requireNonNull(leaseId, "leaseId");
    return new ObjectOption(s -> s.reconcileLease = leaseId);
  }

  /**
   * An update or patch sent to the apiserver even when the sidecar's watch cache shows it would change nothing, for
   * an app that wants the apiserver's own answer (its admission, its resourceVersion check) every time. Without it,
   * such a write is answered from the cache: the cached object, {@link KubeObject#unchanged()} true.
   */
  public static ObjectOption sendUnchanged() {
    return new ObjectOption(s -> s.sendUnchanged = true);
  }

  /** The field manager of a write (required for an APPLY patch; "consistd" otherwise). */
  public static ObjectOption fieldManager(String name) {
    Objects.requireNonNull(name, "name");
    return new ObjectOption(s -> s.fieldManager = name);
  }

  /** Writes a subresource ("status") instead of the object itself. */
  public static ObjectOption subresource(String name) {
    Objects.requireNonNull(name, "name");
    return new ObjectOption(s -> s.subresource = name);
  }

  /** APPLY only: take ownership of conflicting fields. */
  public static ObjectOption force() {
    return new ObjectOption(s -> s.force = true);
  }

  /** A read that waits until the daemon's cache holds this pod's own writes. */
  public static ObjectOption readYourWrites() {
    return new ObjectOption(s -> s.readYourWrites = true);
  }

  /** Deletes only if the object still has this uid and resourceVersion (either may be empty). */
  public static ObjectOption preconditions(String uid, String resourceVersion) {
    Objects.requireNonNull(uid, "uid");
    Objects.requireNonNull(resourceVersion, "resourceVersion");
    return new ObjectOption(s -> {
      s.preconditionUid = uid;
      s.preconditionResourceVersion = resourceVersion;
    });
  }

  /** How a delete treats the object's dependents. */
  public static ObjectOption propagation(Propagation propagation) {
    Objects.requireNonNull(propagation, "propagation");
    return new ObjectOption(s -> s.propagation = propagation);
  }
}
