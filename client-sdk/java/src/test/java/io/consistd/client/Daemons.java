// What the tests share: the daemons hack/with-daemons.sh started, ready clients, fresh namespaces.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertNotNull;

import java.time.Duration;
import java.util.ArrayList;
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
