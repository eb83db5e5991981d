// The `controller` mode: campaigns, and runs the Greeting operator on the reconcile queue handed out while it leads.
package io.consistd.example;

import io.consistd.client.ConditionStatus;
import io.consistd.client.ConsistdClient;
import io.consistd.client.Destination;
import io.consistd.client.Election;
import io.consistd.client.EventSeverity;
import io.consistd.client.KubeObject;
import io.consistd.client.LeadershipListener;
import io.consistd.client.LeadershipStatus;
import io.consistd.client.ObjectOption;
import io.consistd.client.ObjectsClient.PatchType;
import io.consistd.client.Outcome;
import io.consistd.client.QueueSpec;
import io.consistd.client.Reconciler;
import io.consistd.client.SendRequest;
import io.consistd.client.Sent;
import io.consistd.client.WorkItem;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;

/**
 * Campaigns in the election and meanwhile works on the reconcile queue of the Greetings in the namespace, named after
 * the election and handed out only while this sidecar leads it, each item with the term it was granted in. The queue
 * passes a Greeting on only when its spec changes (the generation filter) or someone else changes or deletes the
 * ConfigMap it owns (the related query), and keeps the finalizer on it, so a Greeting being deleted comes as a
 * finalize pass. A pass publishes the message in the Greeting's ConfigMap, records the Published event, notifies the
 * peer and sets the Ready condition; a finalize pass deletes the ConfigMap. Every write is made for the item: it names
 * the lease (so it queues no pass of its own) and is guarded by the item's term.
 */
final class Controller {
  static final String GREETINGS = "greetings.example.consistd.io";
  static final String CONFIGMAPS = "configmaps";
  static final String FINALIZER = "example.consistd.io/cleanup";
  /** How many Greetings are reconciled at once. */
  static final int MAX_LEASES = 4;

  private final ConsistdClient client;
  private final Settings settings;
  /** Completed when the sidecar refused the election: the controller stops. */
  private final CompletableFuture<Void> refused = new CompletableFuture<>();
  private volatile StatusRuntimeException refusal;

  Controller(ConsistdClient client, Settings settings) {
    this.client = client;
    this.settings = settings;
  }

  /**
   * Runs until the thread is interrupted (then throws InterruptedException). The queue's passes have returned and the
   * campaign is left (the sidecar resigns: it releases the Lease at once) before it does.
   *
   * @throws StatusRuntimeException the sidecar's refusal of the queue's spec or of the election
   */
  void run() throws InterruptedException {
    try (Reconciler reconciler = client.reconciler(queue(), this::reconcile)) {
      Election election = client.leadership().campaign(settings.election(), settings.namespace(), listener());
      try {
        refused.thenRun(reconciler::close);
        reconciler.run(); // until closed; interrupted, it closes itself and throws
      } finally {
        election.close(); // resigns, once every pass has returned
      }
    }
    if (refusal != null) {
      throw refusal;
    }
  }

  /** The queue: the namespace's Greetings, by generation, queued by their ConfigMaps, finalized, while leading. */
  private QueueSpec queue() {
    QueueSpec.Related configMaps = QueueSpec.Related.controllerOwner(CONFIGMAPS, settings.namespace())
        .labelSelector(Greeting.MANAGED_BY + "=" + Greeting.OPERATOR);
    return QueueSpec.of(settings.election(), GREETINGS)
        .namespace(settings.namespace())
        .onlyChangesOf(QueueSpec.Changed.GENERATION)
        .related(configMaps)
        .finalizer(FINALIZER)
        .maxLeases(MAX_LEASES)
        .election(settings.election(), settings.namespace());
  }

  /** Prints each leadership state; a refused election stops the controller. */
  private LeadershipListener listener() {
    return new LeadershipListener() {
      @Override
      public void onStatus(LeadershipStatus s) {
        String holder = s.holder().isEmpty() ? "-" : s.holder();
        System.out.printf("leadership %s holder=%s term=%d%n", s.state(), holder, s.term());
      }

      @Override
      public void onError(StatusRuntimeException error) {
        refusal = error;
        refused.complete(null);
      }
    };
  }

  /**
   * One pass over one Greeting. A failure is printed on stderr and thrown back to the queue, which hands the Greeting
   * out again after a backoff (a TerminalException: not until it changes).
   */
  private Reconciler.Result reconcile(WorkItem item) throws Exception {
    try {
      if (item.finalizing()) {
        cleanUp(item);
      } else if (!item.deleted() && item.object() != null) {
        publish(item);
      }
      return Reconciler.Result.done(); // after a finalize pass, the sidecar removes the finalizer
    } catch (Exception e) {
      if (!item.cancelled()) { // a pass cut short by a lost lease or by stopping is no failure
        System.err.printf("greeting-operator: %s%n", e.getMessage());
      }
      throw e;
    }
  }

  /**
   * Applies the Greeting's ConfigMap unless it holds the message already (and then records the event and notifies
   * the peer), and sets Ready, which the daemon writes only when it changes.
   */
  private void publish(WorkItem item) throws Exception {
    System.out.printf("reconciling %s attempt=%d term=%d %s%n",
        item.key(), item.attempt(), item.term(), item.consistency());
    Greeting greeting = Greeting.parse(item.object());
    Optional<KubeObject> current = configMap(item);
    if (current.isEmpty() || !greeting.isPublishedIn(current.get())) {
      KubeObject applied = apply(item, greeting);
      System.out.printf("published %s generation=%d configmap=%s resourceVersion=%s%n",
          item.key(), greeting.generation(), applied.name(), applied.resourceVersion());
      recordPublished(item, greeting);
      if (!settings.peer().isEmpty()) {
        notifyPeer(greeting, applied);
      }
    }
    try {
      item.setCondition("Ready", ConditionStatus.TRUE, "Published", greeting.publishedNote());
    } catch (StatusRuntimeException e) {
      throw new PassFailed("setting the Ready condition of greeting " + item.key(), e);
    }
  }

  /** The Greeting's ConfigMap as the sidecar reads it; empty when there is none. */
  private static Optional<KubeObject> configMap(WorkItem item) throws PassFailed {
    try {
      return Optional.of(item.objects().get(CONFIGMAPS, item.namespace(), item.name()));
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() == Status.Code.NOT_FOUND) {
        return Optional.empty();
      }
      throw new PassFailed("reading configmap " + item.key(), e);
    }
  }

  /** Applies the ConfigMap server-side, forced, as the item's write (its lease, its term's guard). */
  private static KubeObject apply(WorkItem item, Greeting greeting) throws PassFailed {
    try {
      return item.objects().patch(CONFIGMAPS, item.namespace(), item.name(), PatchType.APPLY, greeting.configMap(),
          ObjectOption.fieldManager(Greeting.OPERATOR), ObjectOption.force());
    } catch (StatusRuntimeException e) {
      throw new PassFailed("applying configmap " + item.key(), e);
    }
  }

  /** Records the Normal event Published about the Greeting, reported by the queue. */
  private static void recordPublished(WorkItem item, Greeting greeting) throws PassFailed {
    try {
      item.recordEvent(EventSeverity.NORMAL, "Published", "Publish", greeting.publishedNote());
    } catch (StatusRuntimeException e) {
      throw new PassFailed("recording the Published event of greeting " + item.key(), e);
    }
  }

  /** Tells the peer about the published Greeting and waits for its receiver's ACK. */
  private void notifyPeer(Greeting greeting, KubeObject configMap) throws InterruptedException, PassFailed {
    try {
      Sent sent = client.outbox().send(SendRequest.to(destination(settings.peer()))
          .resourceId("greetings/" + greeting)
          .eventId(configMap.resourceVersion())
          .payload(greeting.notification())
          .contentType("application/json"));
      Outcome outcome = sent.await(); // interrupted when the lease is lost; the sidecar goes on delivering
      System.out.printf("notified %s %s %s%n", settings.peer(), outcome.kind(), sent.messageId());
    } catch (StatusRuntimeException e) {
      throw new PassFailed("notifying " + settings.peer() + " of greeting " + greeting, e);
    }
  }

  /** The finalize pass: deletes the Greeting's ConfigMap as the item's write; one already gone is fine. */
  private static void cleanUp(WorkItem item) throws PassFailed {
    System.out.printf("finalizing %s term=%d%n", item.key(), item.term());
    try {
      item.objects().delete(CONFIGMAPS, item.namespace(), item.name());
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() != Status.Code.NOT_FOUND) {
        throw new PassFailed("deleting configmap " + item.key(), e);
      }
    }
    System.out.printf("finalized %s%n", item.key());
  }

  /**
   * EXAMPLE_PEER as a destination: "service/NAME" is every ready endpoint of the Service NAME in the sidecar's
   * namespace (the sidecar follows its EndpointSlices), anything else one peer's "host:port".
   */
  static Destination destination(String peer) {
    return peer.startsWith("service/")
        ? Destination.service("", peer.substring("service/".length()))
        : Destination.peer(peer);
  }

  /** A step of a pass failed: the message names the step, then the sidecar's answer ("CODE: description"). */
  static final class PassFailed extends Exception {
    private static final long serialVersionUID = 1L;

    PassFailed(String step, StatusRuntimeException cause) {
      super(step + ": " + cause.getStatus().getCode() + ": " + cause.getStatus().getDescription(), cause);
    }
  }
}
