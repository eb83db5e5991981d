// ConsistdClient.waitReady's answer when the sidecar did not report SERVING in time.
package io.consistd.client;

import io.grpc.StatusRuntimeException;
import java.time.Duration;

/** The sidecar did not report SERVING within the time {@link ConsistdClient#waitReady} was given. */
public final class NotReadyException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String socket;
  private final transient Duration timeout;
  private final String last;

  NotReadyException(String socket, Duration timeout, String last, StatusRuntimeException cause) {
    super("consistd at " + socket + " not ready within " + timeout + ": " + last, cause);
    this.socket = socket;
    this.timeout = timeout;
    this.last = last;
  }

  /** The sidecar's socket. */
  public String socket() {
    return socket;
  }

  /** How long waitReady waited. */
  public Duration timeout() {
    return timeout;
  }

  /** The last answer seen: a health status, or the status of the last health check that failed. */
  public String last() {
    return last;
  }
}
