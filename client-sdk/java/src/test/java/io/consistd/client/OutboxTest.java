// Sends from daemon a to daemon b against real daemons: outcomes ACKED and SUPERSEDED, a timeout that ends one
// wait, refusals naming the field, a guarded send, and every send of a client on one ordered SendStream.
package io.consistd.client;

import static io.consistd.client.Messaging.WAIT;
import static io.consistd.client.Messaging.receive;
import static io.consistd.client.Messaging.toPeer;
import static io.consistd.client.Messaging.unique;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import consistd.v1.Object.WriteGuard;
import consistd.v1.Outbox.AckOutcome;
import consistd.v1.Outbox.SendStreamRequest;
import consistd.v1.Outbox.SendStreamResponse;
import consistd.v1.Outbox.WaitOutcomeResponse;
import consistd.v1.Outbox.WatchAcksResponse;
import consistd.v1.OutboxServiceGrpc;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 90, unit = TimeUnit.SECONDS)
class OutboxTest {
  private static final Daemons daemons = new Daemons();

  @AfterAll
  static void cleanUp() throws InterruptedException {
    daemons.close();
  }

  private static Outbox outbox() throws InterruptedException {
    return new Outbox(daemons.app());
  }

  /** Daemon b's inbox, for the test's handlers. */
  private static Inbox peerInbox() throws InterruptedException {
    return new Inbox(daemons.other());
  }

  @Test
  void aSendToAPeerIsAckedWhenItsInboxHandlerReturns() throws Exception {
    Outbox outbox = outbox();
    String resource = unique("java-send");
    BlockingQueue<InboxMessage> received = new LinkedBlockingQueue<>();
    try (Inbox.Handling handling = peerInbox().handle(m -> {
      if (m.resourceId().equals(resource)) {
        received.add(m);
      }
    })) {
      Sent sent = outbox.send(toPeer(resource, "1", "hello"));
      assertFalse(sent.messageId().isEmpty(), "send returned no message id");
      Outcome outcome = sent.await(WAIT);
      assertEquals(Outcome.Kind.ACKED, outcome.kind(), outcome.toString());
      assertTrue(outcome.isAcked());
      assertFalse(outcome.peer().isEmpty(), "the outcome names no peer");
      InboxMessage m = receive(received, "the message");
      assertEquals("1", m.eventId());
      assertEquals("hello", m.text());
      assertEquals("text/plain", m.contentType());
      assertEquals("sdk-a", m.sender());
      assertEquals(1, m.deliveryAttempt());

      // Outcomes of further sends on the same client are matched to their own message, awaited in any order.
      Sent second = outbox.send(toPeer(resource + "-b", "1", "x"));
      Sent third = outbox.send(toPeer(resource + "-c", "1", "y"));
      assertEquals(Outcome.Kind.ACKED, third.outcome().get(WAIT.toMillis(), TimeUnit.MILLISECONDS).kind());
      assertEquals(Outcome.Kind.ACKED, second.await(WAIT).kind());
      // Once obtained, the outcome is given again at once.
      assertTrue(second.outcome().isDone());
      Messaging.stop(handling);
    }
  }

  @Test
  void anOlderEventNotYetAckedIsSupersededByANewerOne() throws Exception {
    Outbox outbox = outbox();
    String resource = unique("java-superseded");
    Messaging.Holder holder = new Messaging.Holder(resource, "1");
    try (Inbox.Handling handling = peerInbox().handle(holder)) {
      Sent older = outbox.send(toPeer(resource, "1", "older"));
      receive(holder.held, "the older event");
      // Before the receiver ACKs it, a newer event of the same resource replaces it.
      Sent newer = outbox.send(toPeer(resource, "2", "newer"));
      Outcome outcome = older.await(WAIT);
      assertEquals(Outcome.Kind.SUPERSEDED, outcome.kind(), outcome.toString());
      holder.release();
      outcome = newer.await(WAIT);
      assertEquals(Outcome.Kind.ACKED, outcome.kind(), outcome.toString());
      Messaging.stop(handling);
    } finally {
      holder.release();
    }
  }

  @Test
  void aTimeoutEndsOneWaitAndWaitingAgainGetsTheOutcome() throws Exception {
    Outbox outbox = outbox();
    String resource = unique("java-timeout");
    Messaging.Holder holder = new Messaging.Holder(resource, "1");
    try (Inbox.Handling handling = peerInbox().handle(holder)) {
      Sent sent = outbox.send(toPeer(resource, "1", "x"));
      receive(holder.held, "the message");

      long started = System.nanoTime();
      TimeoutException timedOut = assertThrows(TimeoutException.class, () -> sent.await(Duration.ofMillis(300)));
      long waited = (System.nanoTime() - started) / 1_000_000;
      assertTrue(waited >= 300 && waited < 5_000, "waited " + waited + " ms for a 300 ms timeout");
      assertTrue(timedOut.getMessage().contains(sent.messageId()), timedOut.getMessage());

      // So does the future's.
      CompletableFuture<Outcome> bounded = sent.outcome(Duration.ofMillis(200));
      ExecutionException e = assertThrows(ExecutionException.class, () -> bounded.get(5, TimeUnit.SECONDS));
      assertTrue(e.getCause() instanceof TimeoutException, e.toString());

      // A wait the app gives up on (cancel) ends too; the next wait is not affected.
      CompletableFuture<Outcome> abandoned = sent.outcome();
      Thread.sleep(100);
      abandoned.cancel(false);

      holder.release();
      Outcome outcome = sent.await(WAIT);
      assertEquals(Outcome.Kind.ACKED, outcome.kind(), outcome.toString());
      Messaging.stop(handling);
    } finally {
      holder.release();
    }
  }

  @Test
  void aMessageTheSidecarRefusesFailsItsSendNamingTheFieldAndTheStreamGoesOn() throws Exception {
    Messaging.CallCounter counter = new Messaging.CallCounter();
    ConsistdClient app = daemons.app();
    Outbox outbox = new Outbox(app.channel(), counter.around(app.channel()));

    StatusRuntimeException noResource = assertThrows(StatusRuntimeException.class,
        () -> outbox.send(toPeer("", "1", "x")));
    assertEquals(Status.Code.INVALID_ARGUMENT, noResource.getStatus().getCode(), noResource.toString());
    assertTrue(noResource.getStatus().getDescription().startsWith("resource_id"), noResource.toString());

    StatusRuntimeException noDestination = assertThrows(StatusRuntimeException.class,
        () -> outbox.send(SendRequest.to(null).resourceId(unique("java-refused")).eventId("1")));
    assertEquals(Status.Code.INVALID_ARGUMENT, noDestination.getStatus().getCode(), noDestination.toString());
    assertTrue(noDestination.getStatus().getDescription().startsWith("destination"), noDestination.toString());

    StatusRuntimeException noEvent = assertThrows(StatusRuntimeException.class,
        () -> outbox.send(toPeer(unique("java-refused"), "", "x")));
    assertEquals(Status.Code.INVALID_ARGUMENT, noEvent.getStatus().getCode(), noEvent.toString());
    assertTrue(noEvent.getStatus().getDescription().startsWith("event_id"), noEvent.toString());

    // A refusal fails only its own send: the stream goes on.
    assertFalse(outbox.send(toPeer(unique("java-refused"), "1", "x")).messageId().isEmpty());
    assertEquals(1, counter.started(OutboxServiceGrpc.getSendStreamMethod().getFullMethodName()));
  }

  @Test
  void aGuardedSendGoesOnlyInTheTermItsSidecarLeadsAndTheReceiverSeesItsGuard() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    String election = unique("java-guarded");
    String resource = unique("java-guarded");
    BlockingQueue<InboxMessage> received = new LinkedBlockingQueue<>();
    try (Election leading = new Leadership(app).campaign(election, ns);
        Inbox.Handling handling = peerInbox().handle(m -> {
          if (m.resourceId().equals(resource)) {
            received.add(m);
          }
        })) {
      LeadershipStatus led = leading.awaitLeader(WAIT);
      ObjectOption.Guard guard = led.guard();
      assertEquals(new ObjectOption.Guard(election, ns, led.term()), guard, "the guard of the leader's term");
      Outbox outbox = outbox();

      Outcome outcome = outbox.send(toPeer(resource, "1", "in its term").guard(guard)).await(WAIT);
      assertEquals(Outcome.Kind.ACKED, outcome.kind(), outcome.toString());
      InboxMessage m = receive(received, "the guarded message");
      assertEquals(guard, m.guard(), "the claim rode along to the receiver: " + m);

      long notHeld = led.term() + 1;
      ObjectOption.Guard later = new ObjectOption.Guard(election, ns, notHeld);
      StatusRuntimeException refused = assertThrows(StatusRuntimeException.class,
          () -> outbox.send(toPeer(resource, "2", "not its term").guard(later)));
      assertEquals(Status.Code.FAILED_PRECONDITION, refused.getStatus().getCode(), refused.toString());
      String why = refused.getStatus().getDescription();
      assertTrue(why.startsWith("guard: ") && why.contains(ns + "/" + election) && why.contains("term " + notHeld),
          refused.toString());

      assertEquals(Outcome.Kind.ACKED, outbox.send(toPeer(resource, "3", "unguarded")).await(WAIT).kind());
      InboxMessage unguarded = receive(received, "the unguarded message");
      assertEquals("3", unguarded.eventId(), "the refused send was not stored: " + unguarded);
      assertNull(unguarded.guard(), unguarded.toString());
      Messaging.stop(handling);
    }
  }

  @Test
  void sendsShareOneOrderedStreamAndSendsNeverAwaitedCostNothingMore() throws Exception {
    Messaging.CallCounter counter = new Messaging.CallCounter();
    ConsistdClient app = daemons.app();
    Outbox outbox = new Outbox(app.channel(), counter.around(app.channel()));
    String prefix = unique("java-ordered");
    BlockingQueue<InboxMessage> received = new LinkedBlockingQueue<>();
    try (Inbox.Handling handling = peerInbox().handle(m -> {
      if (m.resourceId().startsWith(prefix)) {
        received.add(m);
      }
    })) {
      // One after another: answered in order, so the sidecar's ids (its sequence numbers) grow.
      List<Sent> sent = new ArrayList<>();
      for (int i = 0; i < 5; i++) {
        sent.add(outbox.send(toPeer(prefix + "-" + i, "1", "x")));
      }
      for (int i = 1; i < sent.size(); i++) {
        assertTrue(Long.parseLong(sent.get(i).messageId()) > Long.parseLong(sent.get(i - 1).messageId()),
            "ids " + sent + " out of order");
      }
      // Together, from many threads.
      List<CompletableFuture<Sent>> together = new ArrayList<>();
      for (int i = 5; i < 20; i++) {
        String resource = prefix + "-" + i;
        together.add(CompletableFuture.supplyAsync(() -> outbox.send(toPeer(resource, "1", "x"))));
      }
      for (CompletableFuture<Sent> s : together) {
        sent.add(s.get(WAIT.toMillis(), TimeUnit.MILLISECONDS));
      }
      assertEquals(20, sent.stream().map(Sent::messageId).distinct().count(), "ids " + sent);
      for (int i = 0; i < 20; i++) {
        receive(received, "message " + i);
      }

      assertEquals(1, counter.started(OutboxServiceGrpc.getSendStreamMethod().getFullMethodName()),
          "SendStream calls");
      assertEquals(0, counter.started(OutboxServiceGrpc.getSendMethod().getFullMethodName()), "unary Send calls");
      assertEquals(0, counter.started(OutboxServiceGrpc.getWaitOutcomeMethod().getFullMethodName()),
          "WaitOutcome calls for sends never awaited");
      assertEquals(0, counter.started(OutboxServiceGrpc.getWatchAcksMethod().getFullMethodName()), "WatchAcks calls");

      // The outcomes are there for a wait that comes later.
      assertEquals(Outcome.Kind.ACKED, sent.get(19).await(WAIT).kind());
      assertEquals(1, counter.started(OutboxServiceGrpc.getWaitOutcomeMethod().getFullMethodName()));
      Messaging.stop(handling);
    }
  }

  @Test
  void anIdTheSidecarDoesNotKnowIsNotFoundAsItSaidIt() throws InterruptedException {
    Sent unknown = new Sent("999999999", outbox());
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> unknown.await(WAIT));
    assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode(), e.toString());
    assertTrue(e.getStatus().getDescription().contains("999999999"), e.toString());
    ExecutionException async = assertThrows(ExecutionException.class, () -> unknown.outcome().get());
    assertTrue(async.getCause() instanceof StatusRuntimeException s
        && s.getStatus().getCode() == Status.Code.NOT_FOUND, async.toString());
  }

  // Against a sidecar of the test's own, scripted: what the real daemons do not do on demand.

  /** Message 7, ACKED by peer p. */
  private static WaitOutcomeResponse acked() {
    return WaitOutcomeResponse.newBuilder().setOutcome(WatchAcksResponse.newBuilder()
        .setMessageId("7").setPeer("p").setOutcome(AckOutcome.ACK_OUTCOME_ACKED)).build();
  }

  @Test
  void aLostConnectionWhileWaitingIsRetriedWithBackoffAndTheOutcomeThenKept() throws Exception {
    try (FakeOutboxSidecar sidecar = new FakeOutboxSidecar();
        ConsistdClient client = new ConsistdClient(sidecar.socket)) {
      sidecar.waitOutcome = (n, out) -> {
        if (n <= 2) {
          out.onError(Status.UNAVAILABLE.withDescription("connection refused").asRuntimeException());
        } else {
          out.onNext(acked());
          out.onCompleted();
        }
      };
      Sent sent = new Sent("7", new Outbox(client));
      long started = System.nanoTime();
      Outcome outcome = sent.await(WAIT);
      long took = (System.nanoTime() - started) / 1_000_000;
      assertEquals(new Outcome(Outcome.Kind.ACKED, "p", "", java.time.Instant.EPOCH), outcome);
      assertEquals(3, sidecar.waitOutcomeCalls.get(), "two lost, one answered");
      assertTrue(took >= 300, "answered after " + took + " ms: the retries did not wait 100 ms then 200 ms");
      // Asked again, the outcome comes without a call.
      assertEquals(outcome, sent.await());
      assertEquals(outcome, sent.outcome().getNow(null));
      assertEquals(3, sidecar.waitOutcomeCalls.get());
    }
  }

  @Test
  void everyOtherStatusIsTheWaitsAnswerAsTheSidecarSentIt() throws Exception {
    try (FakeOutboxSidecar sidecar = new FakeOutboxSidecar();
        ConsistdClient client = new ConsistdClient(sidecar.socket)) {
      for (Status.Code code : List.of(Status.Code.NOT_FOUND, Status.Code.PERMISSION_DENIED, Status.Code.INTERNAL)) {
        int before = sidecar.waitOutcomeCalls.get();
        sidecar.waitOutcome = (n, out) -> out.onError(
            Status.fromCode(code).withDescription("message 7: its outcome is not known").asRuntimeException());
        Sent sent = new Sent("7", new Outbox(client));
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> sent.await(WAIT));
        assertEquals(code, e.getStatus().getCode(), e.toString());
        assertEquals("message 7: its outcome is not known", e.getStatus().getDescription());
        assertEquals(before + 1, sidecar.waitOutcomeCalls.get(), code + ": retried");
      }
    }
  }

  @Test
  void aBrokenSendStreamFailsTheWaitingSendsUnavailableAndTheNextSendOpensAnother() throws Exception {
    try (FakeOutboxSidecar sidecar = new FakeOutboxSidecar();
        ConsistdClient client = new ConsistdClient(sidecar.socket)) {
      AtomicInteger ids = new AtomicInteger();
      sidecar.sendStream = n -> out -> new StreamObserver<>() {
        @Override
        public void onNext(SendStreamRequest request) {
          // The first stream answers its first request, then breaks on its second.
          if (n == 1 && request.getMessage().getResourceId().equals("breaks")) {
            out.onError(Status.UNAVAILABLE.withDescription("the sidecar went away").asRuntimeException());
          } else {
            out.onNext(SendStreamResponse.newBuilder().setMessageId(String.valueOf(ids.incrementAndGet())).build());
          }
        }

        @Override
        public void onError(Throwable t) {}

        @Override
        public void onCompleted() {
          out.onCompleted();
        }
      };
      Outbox outbox = new Outbox(client);
      SendRequest request = SendRequest.to(Destination.peer("p:1")).eventId("1");
      assertEquals("1", outbox.send(request.resourceId("first")).messageId());
      StatusRuntimeException lost = assertThrows(StatusRuntimeException.class,
          () -> outbox.send(request.resourceId("breaks")));
      assertEquals(Status.Code.UNAVAILABLE, lost.getStatus().getCode(), lost.toString());
      assertTrue(lost.getStatus().getDescription().startsWith("send: lost the connection to the sidecar"),
          lost.toString());
      assertEquals("2", outbox.send(request.resourceId("after")).messageId());
      assertEquals(2, sidecar.sendStreamCalls.get(), "SendStream calls");
      outbox.close();
      StatusRuntimeException closed = assertThrows(StatusRuntimeException.class,
          () -> outbox.send(request.resourceId("closed")));
      assertEquals(Status.Code.CANCELLED, closed.getStatus().getCode(), closed.toString());
    }
  }

  @Test
  void aSendPutsItsGuardInTheMessageItStreamsAndAnUnguardedOneNone() throws Exception {
    try (FakeOutboxSidecar sidecar = new FakeOutboxSidecar();
        ConsistdClient client = new ConsistdClient(sidecar.socket)) {
      BlockingQueue<SendStreamRequest> streamed = new LinkedBlockingQueue<>();
      AtomicInteger ids = new AtomicInteger();
      sidecar.sendStream = n -> out -> new StreamObserver<>() {
        @Override
        public void onNext(SendStreamRequest request) {
          streamed.add(request);
          out.onNext(SendStreamResponse.newBuilder().setMessageId(String.valueOf(ids.incrementAndGet())).build());
        }

        @Override
        public void onError(Throwable t) {}

        @Override
        public void onCompleted() {
          out.onCompleted();
        }
      };
      Outbox outbox = new Outbox(client);
      SendRequest request = SendRequest.to(Destination.peer("p:1")).resourceId("r").eventId("1");
      outbox.send(request.guard(new ObjectOption.Guard("controller", "ns", 7)));
      assertEquals(WriteGuard.newBuilder().setElection("controller").setNamespace("ns").setTerm(7).build(),
          streamed.take().getMessage().getGuard());
      outbox.send(request);
      assertFalse(streamed.take().getMessage().hasGuard(), "a send without a guard carries none");
      outbox.close();
    }
  }
}
