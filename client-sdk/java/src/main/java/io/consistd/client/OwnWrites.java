// The own-write rule where the app takes an event: the resourceVersions this client's writes returned.
package io.consistd.client;

import java.util.HashMap;
import java.util.Map;
import java.util.OptionalInt;
import java.util.OptionalLong;

/**
 * Per object uid, the largest resourceVersion a write through this client returned; shared by all its watches and
 * safe for concurrent use.
 *
 * <p>The daemon applies the own-write rule to a CONSISTENT state when it sends it, so the only states this record
 * has to catch are the ones sent before the write reached the daemon and still on their way to the app when the
 * write returned. Those are taken in order, so an entry stops mattering once the app has taken the events queued
 * before its write: the record forgets the least recently written objects first, by generations of 10,000 (when the
 * current map is full it becomes the previous one and the one before is dropped), as every SDK does.
 */
final class OwnWrites {
  static final int GENERATION = 10_000;

  private Map<String, Long> current = new HashMap<>();
  private Map<String, Long> previous = new HashMap<>();

  /**
   * A resourceVersion as a number. Kubernetes 1.35+ guarantees a decimal integer that grows with every change
   * (KEP-5504); any other form is opaque and never compared.
   */
  static OptionalLong resourceVersion(String rv) {
    if (rv == null || rv.isEmpty() || rv.length() > 19) {
      return OptionalLong.empty();
    }
    for (int i = 0; i < rv.length(); i++) {
      char c = rv.charAt(i);
      if (c < '0' || c > '9') {
        return OptionalLong.empty();
      }
    }
    try {
      return OptionalLong.of(Long.parseLong(rv));
    } catch (NumberFormatException e) {
      return OptionalLong.empty();
    }
  }

  /** Remembers what a write returned; a smaller version than the one remembered never replaces it. */
  synchronized void record(KubeObject o) {
    if (o == null || o.uid().isEmpty()) {
      return;
    }
    OptionalLong rv = resourceVersion(o.resourceVersion());
    if (rv.isEmpty()) {
      return;
    }
    long version = rv.getAsLong();
    Long known = current.get(o.uid());
    if (known != null) {
      current.put(o.uid(), Math.max(known, version));
      return;
    }
    known = previous.remove(o.uid());
    if (known != null) {
      version = Math.max(known, version);
    }
    if (current.size() >= GENERATION) {
      previous = current;
      current = new HashMap<>();
    }
    current.put(o.uid(), version);
  }

  /** Whether a write through this client returned a larger resourceVersion of {@code o}'s object than it has. */
  synchronized boolean predates(KubeObject o) {
    OptionalInt order = writtenAgainst(o);
    return order.isPresent() && order.getAsInt() > 0;
  }

  /**
   * Whether {@code o} is exactly the state of the client's latest write to its object: the largest resourceVersion a
   * write through this client returned for its uid is {@code o}'s (compared as integers, as {@link #predates} does).
   * False for null, an empty uid and a resourceVersion that is not a decimal integer.
   */
  synchronized boolean wrote(KubeObject o) {
    OptionalInt order = writtenAgainst(o);
    return order.isPresent() && order.getAsInt() == 0;
  }

  /**
   * How the largest resourceVersion a write through this client returned for {@code o}'s object compares with
   * {@code o}'s ({@link Long#compare}); empty for null, an empty uid, a resourceVersion that is not a decimal integer
   * and an object the record does not (or no longer) hold.
   */
  private OptionalInt writtenAgainst(KubeObject o) {
    if (o == null || o.uid().isEmpty()) {
      return OptionalInt.empty();
    }
    OptionalLong rv = resourceVersion(o.resourceVersion());
    if (rv.isEmpty()) {
      return OptionalInt.empty();
    }
    Long written = current.get(o.uid());
    if (written == null) {
      written = previous.get(o.uid());
    }
    return written == null ? OptionalInt.empty() : OptionalInt.of(Long.compare(written, rv.getAsLong()));
  }
}
