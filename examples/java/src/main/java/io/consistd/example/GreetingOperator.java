// The Java SDK's example: the Greeting operator on the sidecar's reconcile queue, and the peer app it notifies.
package io.consistd.example;

import io.consistd.client.ConsistdClient;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.concurrent.ExecutionException;
import sun.misc.Signal;

/**
 * The command line: {@code controller} (see {@link Controller}) or {@code receive} (see {@link Receiver}).
 *
 * <pre>
 * java -jar greeting-operator.jar controller   campaign, and reconcile the Greetings the queue hands out (only while
 *                                              LEADER): publish each message in the Greeting's ConfigMap, record an
 *                                              event, notify EXAMPLE_PEER, set the Ready condition
 * java -jar greeting-operator.jar receive      print each notification peers send, and ACK it
 * </pre>
 *
 * <p>Environment: CONSISTD_SOCKET (the SDK's default), EXAMPLE_NAMESPACE (default "default"), EXAMPLE_ELECTION
 * ("greeting-operator"; it also names the queue), EXAMPLE_PEER (whom to notify: a peer sidecar's "host:port", or
 * "service/NAME" for every ready endpoint of the Service NAME in the sidecar's namespace; unset: nobody) and, for
 * {@code receive} only, EXAMPLE_EXIT_AFTER (exit 0 after this many received). Either command runs until SIGTERM or
 * SIGINT, then leaves the campaign (the sidecar resigns) and exits 0. Every line is printed through System.out,
 * which flushes at each line's end, so a file holds it at once.
 */
public final class GreetingOperator {
  private GreetingOperator() {}

  /** The signal that stopped the app ("SIGTERM" or "SIGINT"); null while none came. */
  private static volatile String stoppedBy;

  public static void main(String[] args) {
    if (args.length != 1 || !(args[0].equals("controller") || args[0].equals("receive"))) {
      System.err.println("usage: greeting-operator controller|receive");
      System.exit(2);
    }
    Settings settings;
    try {
      settings = Settings.from(System.getenv());
    } catch (IllegalArgumentException e) {
      System.err.println("greeting-operator: " + e.getMessage());
      System.exit(1);
      return;
    }
    stopOnSignals(Thread.currentThread());
    int status = 0;
    try (ConsistdClient client = new ConsistdClient()) {
      client.waitReady(Duration.ofSeconds(30));
      if (args[0].equals("controller")) {
        new Controller(client, settings).run();
      } else {
        new Receiver(client, settings).run();
      }
    } catch (InterruptedException | ExecutionException | RuntimeException e) {
      // Once stopping, what the stop cut short (an interrupted wait, a cancelled call) is no failure.
      if (stoppedBy == null) {
        System.err.println("greeting-operator: " + describe(e));
        status = 1;
      }
    }
    if (stoppedBy != null) {
      // Closing the reconciler, the campaign (the sidecar resigns) and the client above has stopped everything.
      System.out.println("stopped");
    }
    System.exit(status);
  }

  /**
   * At the first SIGTERM or SIGINT, prints which one came and interrupts {@code main}: whatever it waits in (the
   * reconciler, the inbox, waitReady) stops, and main returns through its try-with-resources. The JDK tells which
   * signal came only through sun.misc.Signal (in the jdk.unsupported module, kept for this by JEP 260; javac warns
   * that it is internal, which cannot be suppressed); a shutdown hook cannot tell them apart, and would make the exit
   * status 143.
   */
  private static void stopOnSignals(Thread main) {
    for (String name : new String[] {"TERM", "INT"}) {
      Signal.handle(new Signal(name), signal -> {
        synchronized (GreetingOperator.class) {
          if (stoppedBy != null) {
            return;
          }
          stoppedBy = "SIG" + signal.getName();
        }
        System.out.println("stopping on " + stoppedBy);
        main.interrupt();
      });
    }
  }

  private static String describe(Throwable e) {
    Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
    if (cause instanceof StatusRuntimeException s) {
      return s.getStatus().getCode() + ": " + s.getStatus().getDescription();
    }
    return cause.getMessage() == null ? cause.toString() : cause.getMessage();
  }
}
