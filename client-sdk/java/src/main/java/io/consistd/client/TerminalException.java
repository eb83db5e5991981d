// The error a reconcile handler throws when retrying cannot help: the lease ends TERMINAL.
package io.consistd.client;

/**
 * Thrown by a {@link Reconciler.Handler} (or found among the causes of what it throws) when the item failed and
 * retrying cannot mend it, as controller-runtime's {@code reconcile.TerminalError}: the lease ends as
 * OUTCOME_TERMINAL with the thrown exception's message, and the key waits until its object (or a related one)
 * changes instead of coming back after a backoff.
 */
public class TerminalException extends Exception {
  private static final long serialVersionUID = 1L;

  /** A terminal failure described by {@code message}. */
  public TerminalException(String message) {
    super(message);
  }

  /** A terminal failure described by {@code message}, caused by {@code cause}. */
  public TerminalException(String message, Throwable cause) {
    super(message, cause);
  }

  /** {@code cause} as a terminal failure, with its message. */
  public TerminalException(Throwable cause) {
    super(cause == null ? null : cause.getMessage(), cause);
  }
}
