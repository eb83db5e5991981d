// The `receive` mode: the peer app, which prints each notification and ACKs it.
package io.consistd.example;

import io.consistd.client.ConsistdClient;
import io.consistd.client.Inbox;
import io.consistd.client.InboxMessage;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicInteger;

/** Prints each message peers send; the SDK ACKs it when the handler returns. */
final class Receiver {
  private final ConsistdClient client;
  private final Settings settings;
  private final AtomicInteger received = new AtomicInteger();
  /** Completed once EXAMPLE_EXIT_AFTER messages were handled. */
  private final CompletableFuture<Void> enough = new CompletableFuture<>();

  Receiver(ConsistdClient client, Settings settings) {
    this.client = client;
    this.settings = settings;
  }

  /**
   * Runs until EXAMPLE_EXIT_AFTER messages were handled (then returns) or the thread is interrupted (then throws
   * InterruptedException). Either way the last message's ACK (or NACK) is settled before it does.
   *
   * @throws ExecutionException with the sidecar's refusal that ended the handling
   */
  void run() throws InterruptedException, ExecutionException {
    try (Inbox.Handling handling = client.inbox().handle(this::handle)) {
      CompletableFuture.anyOf(handling.done(), enough).get();
    } // closing waits until the handler's last message is ACKed
  }

  private void handle(InboxMessage m) {
    System.out.printf("received %s %s %s%n", m.resourceId(), m.eventId(), m.text());
    if (settings.enough(received.incrementAndGet())) {
      enough.complete(null);
    }
  }
}
