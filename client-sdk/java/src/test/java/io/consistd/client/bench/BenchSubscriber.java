// How fast one Java SDK subscriber takes a namespace's ConfigMaps: the Java side of
// client-sdk/rust/benches/subscriber.rs.
package io.consistd.client.bench;

import io.consistd.client.ConsistdClient;
import io.consistd.client.Watch;
import io.consistd.client.WatchEvent;
import io.consistd.client.WatchRequest;
import java.time.Duration;
import java.util.Locale;

/**
 * Per round, watches NAMESPACE's ConfigMaps in RAW mode from a fresh snapshot and counts events until SYNCED,
 * printing
 *
 * <pre>{"language":"java","events":5000,"seconds":0.842}</pre>
 *
 * <p>on stdout (seconds from just before subscribing to SYNCED), the format of the Go SDK's benchsubscriber. Run by
 * {@code hack/sdk/java.sh bench-subscriber NAMESPACE ROUNDS} against CONSISTD_SOCKET; anything else goes to stderr.
 * Every round runs in the same JVM, one after another, so later rounds run on code the JIT has compiled.
 */
public final class BenchSubscriber {
  private BenchSubscriber() {}

  public static void main(String[] args) throws Exception {
    int rounds = args.length == 2 ? parse(args[1]) : 0;
    if (rounds < 1) {
      System.err.println("usage: BenchSubscriber NAMESPACE ROUNDS");
      System.exit(2);
    }
    try (ConsistdClient client = new ConsistdClient()) {
      client.waitReady(Duration.ofSeconds(30));
      for (int i = 0; i < rounds; i++) {
        System.out.println(measure(client, args[0]));
        System.out.flush();
      }
    }
  }

  private static int parse(String s) {
    try {
      return Integer.parseInt(s);
    } catch (NumberFormatException e) {
      return 0;
    }
  }

  /** Subscribes once and counts the events of the initial state up to SYNCED; one JSON line. */
  private static String measure(ConsistdClient client, String namespace) {
    long start = System.nanoTime();
    int events = 0;
    WatchRequest request = WatchRequest.of("configmaps").namespace(namespace).mode(WatchRequest.Mode.RAW);
    try (Watch watch = client.watch(request)) {
      for (WatchEvent event : watch) {
        if (event.type() == WatchEvent.Type.SYNCED) {
          double seconds = Math.round((System.nanoTime() - start) / 1e6) / 1000.0;
          return String.format(Locale.ROOT, "{\"language\":\"java\",\"events\":%d,\"seconds\":%.3f}", events, seconds);
        }
        events++;
      }
    }
    throw new IllegalStateException("the watch of " + namespace + " ended before SYNCED");
  }
}
