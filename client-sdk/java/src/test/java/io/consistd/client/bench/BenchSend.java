// Send -> ACKED latency through the Java SDK at a steady rate, between hack/with-daemons.sh's two daemons.
package io.consistd.client.bench;

import io.consistd.client.ConsistdClient;
import io.consistd.client.Destination;
import io.consistd.client.Inbox;
import io.consistd.client.Outcome;
import io.consistd.client.SendRequest;
import io.consistd.client.Sent;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;

/**
 * Sends MESSAGES messages of 1 KiB (each about a resource of its own) from daemon a (CONSISTD_SOCKET) to daemon b's
 * peer address (CONSISTD_TEST_PEER_ADDRESS), paced at RATE per second, while RECEIVERS {@link Inbox} handlers on a
 * client of daemon b (CONSISTD_TEST_PEER_SOCKET) ACK each. One handler takes one message at a time and waits for
 * its ACK to be stored before the next, so one alone falls behind 1,000/s on a slow disk; several share the
 * messages, as the daemon's own bench ACKs with many in flight.
 *
 * <p>A message's latency runs from the {@code sendAsync} call to the completion of its {@link Sent#outcome()} with
 * ACKED: the whole round trip an app sees through the SDK (store at a, deliver to b, b's app, its ACK stored at b,
 * back to a, the WaitOutcome answer). A warm-up of WARMUP messages at the same rate goes first and is reported on
 * its own line. One JSON line per phase on stdout:
 *
 * <pre>{"language":"java","phase":"measured","messages":10000,"rate":1000,"acked":10000,"p50_ms":1.1,...}</pre>
 *
 * <p>Run by {@code hack/sdk/java.sh bench-send [MESSAGES [RATE [WARMUP [RECEIVERS]]]]} (defaults 10000, 1000,
 * 2000, 16) under hack/with-daemons.sh.
 */
public final class BenchSend {
  private static final byte[] PAYLOAD = new byte[1024];

  static {
    Arrays.fill(PAYLOAD, (byte) 'x');
  }

  private BenchSend() {}

  public static void main(String[] args) throws Exception {
    int messages = args.length > 0 ? Integer.parseInt(args[0]) : 10_000;
    int rate = args.length > 1 ? Integer.parseInt(args[1]) : 1_000;
    int warmup = args.length > 2 ? Integer.parseInt(args[2]) : 2_000;
    int receivers = args.length > 3 ? Integer.parseInt(args[3]) : 16;
    String peer = env("CONSISTD_TEST_PEER_ADDRESS");
    // Resource ids of this run's own, so a second run against the same daemons supersedes nothing.
    String run = Long.toString(System.currentTimeMillis(), 36);
    try (ConsistdClient a = new ConsistdClient();
        ConsistdClient b = new ConsistdClient(env("CONSISTD_TEST_PEER_SOCKET"))) {
      a.waitReady(Duration.ofSeconds(30));
      b.waitReady(Duration.ofSeconds(30));
      List<Inbox.Handling> handlings = new ArrayList<>();
      try {
        for (int i = 0; i < receivers; i++) {
          handlings.add(b.inbox().handle(message -> {}));
        }
        Thread.sleep(200); // the Receive calls open before the first send
        if (warmup > 0) {
          System.out.println(phase(a, peer, "java-" + run + "-warmup", "warm-up", warmup, rate, receivers));
        }
        System.out.println(phase(a, peer, "java-" + run, "measured", messages, rate, receivers));
        System.out.flush();
        for (Inbox.Handling handling : handlings) {
          if (handling.done().isDone()) {
            handling.done().join(); // ended by an error: throw it
          }
        }
      } finally {
        handlings.forEach(Inbox.Handling::close);
      }
    }
  }

  private static String env(String name) {
    String value = System.getenv(name);
    if (value == null || value.isEmpty()) {
      throw new IllegalStateException(name + " is not set: run under hack/with-daemons.sh");
    }
    return value;
  }

  /** Sends {@code n} messages at {@code rate} per second and waits for every outcome; one JSON line. */
  private static String phase(ConsistdClient a, String peer, String prefix, String phase, int n, int rate,
      int receivers) throws InterruptedException {
    long[] started = new long[n];
    long[] ended = new long[n];
    AtomicInteger acked = new AtomicInteger();
    CountDownLatch outcomes = new CountDownLatch(n);
    long period = TimeUnit.SECONDS.toNanos(1) / rate;
    long start = System.nanoTime();
    for (int i = 0; i < n; i++) {
      // Paced by absolute deadlines: a late tick is made up at once (a burst), as the daemon's bench does.
      long due = start + i * period;
      for (long wait = due - System.nanoTime(); wait > 0; wait = due - System.nanoTime()) {
        LockSupport.parkNanos(wait);
      }
      SendRequest request = SendRequest.to(Destination.peer(peer))
          .resourceId(prefix + "-" + i).eventId("1").payload(PAYLOAD).contentType("application/octet-stream");
      int k = i;
      started[k] = System.nanoTime();
      a.outbox().sendAsync(request).thenCompose(Sent::outcome).whenComplete((outcome, failure) -> {
        ended[k] = System.nanoTime();
        if (failure == null && outcome.kind() == Outcome.Kind.ACKED) {
          acked.incrementAndGet();
        } else {
          System.err.println("message " + k + ": " + (failure != null ? failure : outcome));
        }
        outcomes.countDown();
      });
    }
    double sendSeconds = (System.nanoTime() - start) / 1e9;
    if (!outcomes.await(60, TimeUnit.SECONDS)) {
      throw new IllegalStateException(phase + ": " + outcomes.getCount() + " outcomes still missing after 60 s");
    }
    double[] ms = new double[n];
    for (int i = 0; i < n; i++) {
      ms[i] = (ended[i] - started[i]) / 1e6;
    }
    Arrays.sort(ms);
    return String.format(Locale.ROOT,
        "{\"language\":\"java\",\"phase\":\"%s\",\"messages\":%d,\"rate\":%d,\"receivers\":%d,"
            + "\"send_seconds\":%.3f,\"acked\":%d,\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f}",
        phase, n, rate, receivers, sendSeconds, acked.get(), quantile(ms, 0.5), quantile(ms, 0.9), quantile(ms, 0.99),
        quantile(ms, 1.0));
  }

  /** Nearest rank of sorted samples, as testkit's figures::quantile. */
  private static double quantile(double[] sorted, double q) {
    return sorted[(int) Math.round((sorted.length - 1) * q)];
  }
}
