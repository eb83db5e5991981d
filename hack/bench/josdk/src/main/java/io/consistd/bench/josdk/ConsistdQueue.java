// The consistd Java SDK side of the Kopf comparison: its reconciler on the sidecar's work queue.
package io.consistd.bench.josdk;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.consistd.client.ConsistdClient;
import io.consistd.client.ObjectsClient;
import io.consistd.client.QueueSpec;
import io.consistd.client.Reconciler;
import java.time.Duration;

/**
 * The same job as hack/bench/kopf/consistd_app.py's {@code queue}, on the Java SDK: the sidecar (CONSISTD_SOCKET)
 * hands out each ConfigMap's key, one pass at a time per key and at most 64 at once, with the object as its cache
 * held it when the lease was granted, consistent with the app's writes under the key's earlier leases. The patch
 * goes through {@code item.objects()}, which names the item's lease.
 */
final class ConsistdQueue {
  private static final ObjectMapper JSON = new ObjectMapper();

  private ConsistdQueue() {}

  static void run(String namespace, Duration work, Record record) throws Exception {
    QueueSpec spec = QueueSpec.of("kopf-bench", "configmaps")
        .namespace(namespace)
        .labelSelector(Record.LABEL + "=true")
        .maxLeases(64);
    try (ConsistdClient client = new ConsistdClient()) { // CONSISTD_SOCKET
      client.waitReady(Duration.ofSeconds(30));
      try (Reconciler reconciler = new Reconciler(client, spec, item -> {
        if (item.deleted() || item.object() == null) {
          record.pass(item.name(), null, false);
          return Reconciler.Result.done();
        }
        JsonNode cm = JSON.readTree(item.object().json());
        String value = cm.path("data").path("value").textValue();
        String handle = Record.unhandled(value, cm.path("metadata").path("annotations").path(Record.HANDLED)
            .textValue());
        record.pass(item.name(), value, handle != null);
        if (handle == null) {
          return Reconciler.Result.done();
        }
        record.execution(item.name(), handle, item.consistency().name());
        Thread.sleep(work.toMillis());
        ObjectNode patch = JSON.createObjectNode();
        patch.putObject("metadata").putObject("annotations").put(Record.HANDLED, handle);
        item.objects().patch("configmaps", item.namespace(), item.name(), ObjectsClient.PatchType.MERGE,
            JSON.writeValueAsString(patch));
        return Reconciler.Result.done();
      })) {
        reconciler.run(); // until killed, or the sidecar refuses the spec
      }
    }
  }
}
