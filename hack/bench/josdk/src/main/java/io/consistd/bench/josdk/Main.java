// The Java sides of the Kopf comparison (daemon/benches/kopf.rs): the same job on the Java Operator SDK or on the
// consistd Java SDK's reconcile queue, chosen by the first argument.
package io.consistd.bench.josdk;

import java.time.Duration;

/**
 * The job of hack/bench/kopf: for each ConfigMap labelled {@code bench.consistd.io/kopf=true} in BENCH_NAMESPACE whose
 * {@code data.value} differs from its annotation {@code bench.consistd.io/handled}, record an execution, work
 * BENCH_HANDLER_MS, then write the value into that annotation.
 *
 * <pre>
 * java -jar kopf-bench-java.jar josdk      # a Java Operator SDK operator; KUBECONFIG
 * java -jar kopf-bench-java.jar consistd   # the consistd Java SDK's reconciler; CONSISTD_SOCKET
 * java -jar kopf-bench-java.jar version    # prints the Java Operator SDK's version, for the bench's table
 * </pre>
 *
 * <p>Environment: BENCH_NAMESPACE, BENCH_HANDLER_MS (default 0), BENCH_EXECUTIONS (one JSON line per execution,
 * {name, value, at, consistency}), BENCH_PASSES (one JSON line per pass, {name, value, at, executed}); at is
 * wall-clock seconds. Runs until killed.
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws Exception {
    if (args.length == 1 && args[0].equals("version")) {
      System.out.println(io.javaoperatorsdk.operator.api.config.Utils.VERSION.getSdkVersion());
      return;
    }
    if (args.length != 1 || !(args[0].equals("josdk") || args[0].equals("consistd"))) {
      System.err.println("usage: kopf-bench-java josdk|consistd|version");
      System.exit(64);
    }
    String namespace = required("BENCH_NAMESPACE");
    Duration work = Duration.ofMillis(Long.parseLong(System.getenv().getOrDefault("BENCH_HANDLER_MS", "0")));
    Record record = new Record(required("BENCH_EXECUTIONS"), required("BENCH_PASSES"));
    if (args[0].equals("josdk")) {
      JosdkOperator.run(namespace, work, record);
    } else {
      ConsistdQueue.run(namespace, work, record);
    }
  }

  private static String required(String name) {
    String value = System.getenv(name);
    if (value == null || value.isEmpty()) {
      System.err.println("kopf-bench-java: " + name + " is not set");
      System.exit(64);
    }
    return value;
  }
}
