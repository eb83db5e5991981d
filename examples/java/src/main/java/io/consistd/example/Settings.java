// The example's settings, from the environment (EXAMPLE_NAMESPACE, EXAMPLE_ELECTION, EXAMPLE_PEER, ...).
package io.consistd.example;

import java.util.Map;

/**
 * What the environment asks for.
 *
 * @param namespace where the Greetings and the election's Lease live
 * @param election the election; it also names the reconcile queue
 * @param peer whom to notify, as given: a peer sidecar's "host:port", or "service/NAME"; empty: nobody
 * @param exitAfter how many messages {@code receive} handles before exiting; 0: no limit
 */
record Settings(String namespace, String election, String peer, int exitAfter) {
  /**
   * The settings {@code env} gives.
   *
   * @throws IllegalArgumentException when EXAMPLE_EXIT_AFTER is not a positive number
   */
  static Settings from(Map<String, String> env) {
    String exitAfter = env.getOrDefault("EXAMPLE_EXIT_AFTER", "");
    int n = 0;
    if (!exitAfter.isEmpty()) {
      try {
        n = Integer.parseInt(exitAfter);
      } catch (NumberFormatException e) {
        n = 0;
      }
      if (n < 1) {
        throw new IllegalArgumentException("EXAMPLE_EXIT_AFTER=\"" + exitAfter + "\" is not a positive number");
      }
    }
    return new Settings(
        get(env, "EXAMPLE_NAMESPACE", "default"),
        get(env, "EXAMPLE_ELECTION", "greeting-operator"),
        get(env, "EXAMPLE_PEER", ""),
        n);
  }

  /** Whether {@code handled} messages are all EXAMPLE_EXIT_AFTER asks for. */
  boolean enough(int handled) {
    return exitAfter > 0 && handled >= exitAfter;
  }

  private static String get(Map<String, String> env, String name, String otherwise) {
    String value = env.get(name);
    return value == null || value.isEmpty() ? otherwise : value;
  }
}
