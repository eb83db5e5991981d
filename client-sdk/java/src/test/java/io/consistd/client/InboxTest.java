// The inbox handler against real daemons: a return ACKs, an exception NACKs and the message comes again, ACKs share
// one AckStream, and closing interrupts the handler and stops receiving.
package io.consistd.client;

import static io.consistd.client.Messaging.WAIT;
import static io.consistd.client.Messaging.receive;
import static io.consistd.client.Messaging.toPeer;
import static io.consistd.client.Messaging.unique;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import consistd.v1.InboxServiceGrpc;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 90, unit = TimeUnit.SECONDS)
class InboxTest {
  private static final Daemons daemons = new Daemons();

  @AfterAll
  static void cleanUp() throws InterruptedException {
    daemons.close();
  }

  private static Outbox outbox() throws InterruptedException {
    return new Outbox(daemons.app());
  }

  private static Inbox peerInbox() throws InterruptedException {
    return new Inbox(daemons.other());
  }

  @Test
  void aHandlerThatThrowsRetryNacksTheMessageWhichComesAgainAfterItsDelayThenIsAcked() throws Exception {
    String resource = unique("java-nack");
    List<Integer> attempts = Collections.synchronizedList(new ArrayList<>());
    try (Inbox.Handling handling = peerInbox().handle(m -> {
      if (m.resourceId().equals(resource)) {
        attempts.add(m.deliveryAttempt());
        if (attempts.size() == 1) {
          throw new Inbox.Retry("not ready for it yet", Duration.ofMillis(200));
        }
      }
    })) {
      long started = System.nanoTime();
      Outcome outcome = outbox().send(toPeer(resource, "1", "again")).await(WAIT);
      long took = (System.nanoTime() - started) / 1_000_000;
      assertEquals(Outcome.Kind.ACKED, outcome.kind(), outcome.toString());
      assertEquals(List.of(1, 2), attempts);
      assertTrue(took >= 200, "redelivered after " + took + " ms, before the 200 ms the handler asked for");
      Messaging.stop(handling);
    }
  }

  @Test
  void anyExceptionNacksWithTheInboxsDelay() throws Exception {
    String resource = unique("java-throws");
    List<Integer> attempts = Collections.synchronizedList(new ArrayList<>());
    try (Inbox.Handling handling = peerInbox().handle(Duration.ofMillis(100), m -> {
      if (m.resourceId().equals(resource)) {
        attempts.add(m.deliveryAttempt());
        if (attempts.size() < 3) {
          throw new IllegalStateException("attempt " + m.deliveryAttempt() + " failed");
        }
      }
    })) {
      Outcome outcome = outbox().send(toPeer(resource, "1", "x")).await(WAIT);
      assertEquals(Outcome.Kind.ACKED, outcome.kind(), outcome.toString());
      assertEquals(List.of(1, 2, 3), attempts);
      Messaging.stop(handling);
    }
  }

  @Test
  void theAcksOfAnInboxShareOneAckStream() throws Exception {
    Messaging.CallCounter counter = new Messaging.CallCounter();
    ConsistdClient b = daemons.other();
    Inbox inbox = new Inbox(b.channel(), counter.around(b.channel()));
    String prefix = unique("java-acks");
    Outbox outbox = outbox();
    // Two receivers of one inbox: their ACKs go out on the same stream.
    try (Inbox.Handling first = inbox.handle(m -> {});
        Inbox.Handling second = inbox.handle(m -> {})) {
      List<Sent> sent = new ArrayList<>();
      for (int i = 0; i < 6; i++) {
        sent.add(outbox.send(toPeer(prefix + "-" + i, "1", "x")));
      }
      for (Sent s : sent) {
        assertEquals(Outcome.Kind.ACKED, s.await(WAIT).kind(), s.toString());
      }
      assertEquals(2, counter.started(InboxServiceGrpc.getReceiveMethod().getFullMethodName()), "Receive calls");
      assertEquals(1, counter.started(InboxServiceGrpc.getAckStreamMethod().getFullMethodName()), "AckStream calls");
      assertEquals(0, counter.started(InboxServiceGrpc.getAckMethod().getFullMethodName()), "unary Ack calls");
      Messaging.stop(first);
      Messaging.stop(second);
    }
  }

  @Test
  void closingInterruptsTheHandlerWhoseMessageComesAgainToTheNextReceiver() throws Exception {
    String resource = unique("java-close");
    Messaging.Holder holder = new Messaging.Holder(resource, "1");
    Inbox inbox = peerInbox();
    Inbox.Handling handling = inbox.handle(Duration.ofMillis(100), holder);
    Sent sent = outbox().send(toPeer(resource, "1", "x"));
    receive(holder.held, "the message");
    handling.close(); // the holder's await is interrupted: it throws, so the message is NACKed
    assertTrue(handling.done().isDone() && !handling.done().isCompletedExceptionally(), handling.done().toString());
    assertThrows(TimeoutException.class, () -> sent.await(Duration.ofMillis(300)), "a closed handler settled it");

    BlockingQueue<InboxMessage> again = new LinkedBlockingQueue<>();
    try (Inbox.Handling next = inbox.handle(m -> {
      if (m.resourceId().equals(resource)) {
        again.add(m);
      }
    })) {
      InboxMessage m = receive(again, "the message again");
      assertEquals(2, m.deliveryAttempt(), m.toString());
      assertEquals(Outcome.Kind.ACKED, sent.await(WAIT).kind());
      Messaging.stop(next);
    }
  }

  @Test
  void anErrorFromTheHandlerNacksTheMessageAndEndsTheHandlingWithIt() throws Exception {
    String resource = unique("java-error");
    AtomicBoolean thrown = new AtomicBoolean();
    AssertionError error = new AssertionError("the handler's own check failed");
    Inbox inbox = peerInbox();
    Inbox.Handling handling = inbox.handle(Duration.ofMillis(100), m -> {
      if (m.resourceId().equals(resource) && !thrown.getAndSet(true)) {
        throw error;
      }
    });
    Sent sent = outbox().send(toPeer(resource, "1", "x"));
    CompletionException ended = assertThrows(CompletionException.class,
        () -> handling.done().orTimeout(WAIT.toMillis(), TimeUnit.MILLISECONDS).join());
    assertSame(error, ended.getCause());
    handling.close();

    try (Inbox.Handling next = inbox.handle(m -> {})) {
      assertEquals(Outcome.Kind.ACKED, sent.await(WAIT).kind(), "the NACKed message came again and was ACKed");
      Messaging.stop(next);
    }
  }

  @Test
  void aNackReasonIsCutToTheSidecarsLimitWithoutSplittingACharacter() {
    String reason = Inbox.truncate("é".repeat(3000), Inbox.MAX_REASON);
    assertEquals(2048, reason.length());
    assertTrue(reason.getBytes(StandardCharsets.UTF_8).length <= Inbox.MAX_REASON);
    assertEquals("short", Inbox.truncate("short", Inbox.MAX_REASON));
    String ascii = Inbox.truncate("x".repeat(5000), Inbox.MAX_REASON);
    assertEquals(Inbox.MAX_REASON, ascii.length());
  }
}
