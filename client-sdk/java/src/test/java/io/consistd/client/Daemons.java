// What the tests share: the daemons hack/with-daemons.sh started, ready clients, fresh namespaces, daemon a's metrics.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.UUID;

/** Clients of the daemons the test run was given, and namespaces deleted when the test class is done. */
final class Daemons implements AutoCloseable {
  /** The label every object a test creates carries. */
  static final String LABEL = "sdk.consistd.io/test=java";

  private final List<ConsistdClient> clients = new ArrayList<>();
  private final List<String> namespaces = new ArrayList<>();

  static String env(String name) {
    String value = System.getenv(name);
    assertNotNull(value, name + " is not set: run the tests under hack/with-daemons.sh (hack/sdk/java.sh test)");
    return value;
  }

  /** A ready client of daemon a (CONSISTD_SOCKET). */
  ConsistdClient app() throws InterruptedException {
    return ready(env("CONSISTD_SOCKET"));
  }

  /** A ready client of daemon b (CONSISTD_TEST_PEER_SOCKET): its writes are not the app's own. */
  ConsistdClient other() throws InterruptedException {
    return ready(env("CONSISTD_TEST_PEER_SOCKET"));
  }

  ConsistdClient ready(String socket) throws InterruptedException {
    ConsistdClient client = new ConsistdClient(socket);
    clients.add(client);
    client.waitReady(Duration.ofSeconds(20));
    return client;
  }

  /** A namespace of its own for a test. */
  String namespace(ConsistdClient client) {
    String ns = "java-sdk-" + UUID.randomUUID().toString().substring(0, 8);
    client.objects().create("namespaces", "", "{\"metadata\":{\"name\":\"" + ns + "\"}}");
    namespaces.add(ns);
    return ns;
  }

  /**
   * Daemon a's Prometheus text, from GET /metrics on its admin socket (CONSISTD_TEST_ADMIN_SOCKET; HTTP/1.0, so the
   * answer ends with the connection).
   */
  static String metrics() {
    try (SocketChannel channel = SocketChannel.open(StandardProtocolFamily.UNIX)) {
      channel.connect(UnixDomainSocketAddress.of(env("CONSISTD_TEST_ADMIN_SOCKET")));
      String request = "GET /metrics HTTP/1.0\r\nHost: consistd\r\n\r\n";
      channel.write(ByteBuffer.wrap(request.getBytes(StandardCharsets.US_ASCII)));
      ByteArrayOutputStream answer = new ByteArrayOutputStream();
      ByteBuffer buffer = ByteBuffer.allocate(64 * 1024);
      while (channel.read(buffer) >= 0) {
        answer.write(buffer.array(), 0, buffer.position());
        buffer.clear();
      }
      String[] response = answer.toString(StandardCharsets.UTF_8).split("\r\n\r\n", 2);
      assertTrue(response[0].matches("(?s)HTTP/1\\.[01] 200.*"), "/metrics answered " + response[0]);
      return response.length > 1 ? response[1] : "";
    } catch (IOException e) {
      throw new UncheckedIOException("reading daemon a's /metrics", e);
    }
  }

  /** The values of the samples of {@code family} in daemon a's metrics whose labels include all of {@code labels}. */
  static List<Double> samples(String family, String... labels) {
    return metrics().lines()
        .filter(l -> l.startsWith(family + "{") && Arrays.stream(labels).allMatch(l::contains))
        .map(l -> Double.parseDouble(l.substring(l.lastIndexOf(' ') + 1)))
        .toList();
  }

  /**
   * How many grants of the reconcile queue {@code queue} daemon a held back until its watches showed the pod's writes
   * under the key's earlier leases ({@code consistd_workqueue_consistency_holds_total}); 0 when none was. The daemon
   * drops a queue's series when the queue stops: read it while the reconciler runs.
   */
  static long consistencyHolds(String queue) {
    return Math.round(samples("consistd_workqueue_consistency_holds_total", "name=\"" + queue + "\"").stream()
        .mapToDouble(Double::doubleValue).sum());
  }

  /**
   * The highest position ({@code consistd_watch_resource_version}: the resourceVersion its cache reflects) of daemon
   * a's watches of {@code resource} (as the daemon names it, "v1/secrets") in {@code namespace}; 0 while none has
   * listed.
   */
  static long watchPosition(String resource, String namespace) {
    return Math.round(samples("consistd_watch_resource_version",
        "resource=\"" + resource + "\"", "namespace=\"" + namespace + "\"").stream()
        .mapToDouble(Double::doubleValue).max().orElse(0));
  }

  /** A labelled ConfigMap's JSON. */
  static String configMap(String name, String value) {
    return "{\"metadata\":{\"name\":\"" + name + "\",\"labels\":{\"sdk.consistd.io/test\":\"java\"}},"
        + "\"data\":{\"k\":\"" + value + "\"}}";
  }

  @Override
  public void close() throws InterruptedException {
    if (!namespaces.isEmpty()) {
      ConsistdClient client = app();
      for (String ns : namespaces) {
        try {
          client.objects().delete("namespaces", "", ns);
        } catch (RuntimeException e) {
          System.err.println("deleting namespace " + ns + ": " + e);
        }
      }
    }
    for (ConsistdClient client : clients) {
      client.close();
    }
  }
}
