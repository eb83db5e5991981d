// The `controller` mode: campaigns, and reconciles the watched ConfigMaps a work queue hands out while it leads.
package io.consistd.example;

import com.google.gson.Gson;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import io.consistd.client.ConsistdClient;
import io.consistd.client.Destination;
import io.consistd.client.Election;
import io.consistd.client.KubeObject;
import io.consistd.client.LeadershipListener;
import io.consistd.client.LeadershipStatus;
import io.consistd.client.ObjectsClient;
import io.consistd.client.Outcome;
import io.consistd.client.QueueSpec;
import io.consistd.client.Reconciler;
import io.consistd.client.SendRequest;
import io.consistd.client.Sent;
import io.consistd.client.TerminalException;
import io.consistd.client.WorkItem;
import io.grpc.StatusRuntimeException;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Campaigns in the election and meanwhile works on the reconcile queue of the ConfigMaps in the namespace that match
 * the selector. The queue is named after the election (so controllers of other elections on one sidecar keep apart)
 * and hands a ConfigMap out only while this sidecar leads, each with the term it was granted in. For each one the
 * handler records the data keys in an annotation, with a merge patch made for the item (it names the lease and is
 * refused once this sidecar no longer leads in the item's term), and notifies the peer, waiting for its ACK.
 */
final class Controller {
  static final String OBSERVED_KEYS = "example.consistd.io/observed-keys";
  static final String HANDLED_BY = "example.consistd.io/handled-by";
  /** How many ConfigMaps are reconciled at once. */
  static final int MAX_LEASES = 4;

  private static final Gson GSON = new Gson();

  private final ConsistdClient client;
  private final Settings settings;
  private final AtomicInteger handled = new AtomicInteger();
  /** Completed when the controller should stop on its own: EXAMPLE_EXIT_AFTER reached, or the election refused. */
  private final CompletableFuture<Void> finished = new CompletableFuture<>();
  private volatile StatusRuntimeException refusal;

  Controller(ConsistdClient client, Settings settings) {
    this.client = client;
    this.settings = settings;
  }

  /**
   * Runs until EXAMPLE_EXIT_AFTER ConfigMaps were handled (then returns) or the thread is interrupted (then throws
   * InterruptedException). Either way the queue's passes have returned and the campaign is left (the sidecar
   * resigns: it releases the Lease at once) before it does.
   *
   * @throws StatusRuntimeException the sidecar's refusal of the queue's spec or of the election
   */
  void run() throws InterruptedException {
    QueueSpec spec = QueueSpec.of(settings.election(), "configmaps")
        .namespace(settings.namespace())
        .labelSelector(settings.selector())
        .maxLeases(MAX_LEASES)
        .election(settings.election(), settings.namespace());
    try (Reconciler reconciler = client.reconciler(spec, this::reconcile)) {
      Election election = client.leadership().campaign(settings.election(), settings.namespace(), listener());
      try {
        finished.thenRun(reconciler::close); // EXAMPLE_EXIT_AFTER reached, or no election to lead for
        reconciler.run(); // until closed; interrupted, it closes itself and throws
      } finally {
        election.close(); // resigns, once every pass has returned
      }
    }
    if (refusal != null) {
      throw refusal;
    }
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
        finished.complete(null);
      }
    };
  }

  /**
   * One pass over one ConfigMap: records its data keys unless they are recorded already (the pass after the
   * controller's own patch sees it, and goes idle), then notifies the peer. What it throws goes back to the queue,
   * which hands the ConfigMap out again after a backoff (a TerminalException: not until it changes).
   */
  private Reconciler.Result reconcile(WorkItem item) throws Exception {
    if (item.deleted() || item.object() == null) {
      return Reconciler.Result.done();
    }
    System.out.printf("reconciling %s attempt=%d term=%d %s%n",
        item.key(), item.attempt(), item.term(), item.consistency());
    ConfigMap cm = ConfigMap.parse(item.object());
    String keys = String.join(",", cm.keys());
    if (keys.equals(cm.annotations().get(OBSERVED_KEYS))) {
      return Reconciler.Result.done();
    }
    KubeObject patched = annotate(item, keys);
    System.out.printf("patched %s keys=%s resourceVersion=%s%n", item.key(), keys, patched.resourceVersion());
    if (!settings.peer().isEmpty()) {
      notifyPeer(patched, cm.keys());
    }
    if (settings.enough(handled.incrementAndGet())) {
      // Closing the reconciler cancels this pass (its completion is dropped; the next controller's pass finds the
      // annotation and goes idle) and ends run().
      finished.complete(null);
    }
    return Reconciler.Result.done();
  }

  /**
   * Merge-patches the ConfigMap's annotations through the item's objects: the write names the item's lease (so the
   * key's next pass waits until the queue's cache shows it) and is guarded by the item's term.
   */
  private static KubeObject annotate(WorkItem item, String keys) {
    Map<String, Object> patch =
        Map.of("metadata", Map.of("annotations", Map.of(OBSERVED_KEYS, keys, HANDLED_BY, "java-example")));
    return item.objects().patch(
        "configmaps", item.namespace(), item.name(), ObjectsClient.PatchType.MERGE, GSON.toJson(patch));
  }

  /** What the peer is told about a patched ConfigMap. */
  private record Notification(String namespace, String name, List<String> keys) {}

  /** Tells the peer about a patched ConfigMap and waits for its receiver's ACK. */
  private void notifyPeer(KubeObject cm, List<String> keys) throws InterruptedException {
    Sent sent = client.outbox().send(SendRequest.to(destination(settings.peer()))
        .resourceId("configmaps/" + cm.namespace() + "/" + cm.name())
        .eventId(cm.resourceVersion())
        .payload(GSON.toJson(new Notification(cm.namespace(), cm.name(), keys)))
        .contentType("application/json"));
    Outcome outcome = sent.await(); // interrupted when the lease is lost; the sidecar goes on delivering
    System.out.printf("notified %s %s %s%n", settings.peer(), outcome.kind(), sent.messageId());
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

  /**
   * What the controller reads of a ConfigMap.
   *
   * @param keys its data keys, sorted
   * @param annotations its annotations whose values are strings
   */
  record ConfigMap(List<String> keys, Map<String, String> annotations) {
    /**
     * Decodes the object's JSON.
     *
     * @throws TerminalException when it is no ConfigMap: the same object will not decode better
     */
    static ConfigMap parse(KubeObject object) throws TerminalException {
      try {
        JsonObject cm = JsonParser.parseString(object.json()).getAsJsonObject();
        List<String> keys = member(cm, "data").keySet().stream().sorted().toList();
        Map<String, String> annotations = new HashMap<>();
        for (Map.Entry<String, JsonElement> a : member(member(cm, "metadata"), "annotations").entrySet()) {
          if (a.getValue().isJsonPrimitive()) {
            annotations.put(a.getKey(), a.getValue().getAsString());
          }
        }
        return new ConfigMap(keys, Map.copyOf(annotations));
      } catch (JsonParseException | IllegalStateException e) {
        throw new TerminalException("decoding configmap " + object + ": " + e.getMessage(), e);
      }
    }

    /** The object {@code name} in {@code o}; empty when it is missing or null. */
    private static JsonObject member(JsonObject o, String name) {
      JsonElement e = o.get(name);
      return e == null || e.isJsonNull() ? new JsonObject() : e.getAsJsonObject();
    }
  }
}
