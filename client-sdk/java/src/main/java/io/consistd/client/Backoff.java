// When a stream to the sidecar is opened again, and how long to wait first: the values
// proto/consistd/v1/watch.proto states for every client.
package io.consistd.client;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;

/** Doubling pauses from 100 ms up to 5 s, back to the start after the stream delivered something. */
final class Backoff {
  static final Duration INITIAL = Duration.ofMillis(100);
  static final Duration CAP = Duration.ofSeconds(5);

  private Duration next = INITIAL;

  /** The current pause; doubles the next one. */
  Duration step() {
    Duration pause = next;
    Duration doubled = next.multipliedBy(2);
    next = doubled.compareTo(CAP) > 0 ? CAP : doubled;
    return pause;
  }

  /** Starts again from the shortest pause. */
  void reset() {
    next = INITIAL;
  }

  /** Sleeps the current pause and doubles the next one. */
  void pause() throws InterruptedException {
    Thread.sleep(step().toMillis());
  }

  /**
   * Whether a failed call is worth making again: the sidecar could not be reached or the connection broke
   * (UNAVAILABLE). Every other status is the daemon's answer to the request and goes to the app as it is.
   */
  static boolean retryable(StatusRuntimeException e) {
    return e.getStatus().getCode() == Status.Code.UNAVAILABLE;
  }

  /** The error a stream the caller did not stop ends with, so that it is opened again. */
  static StatusRuntimeException ended(String what) {
    return Status.UNAVAILABLE.withDescription("the sidecar ended the " + what + " stream").asRuntimeException();
  }
}
