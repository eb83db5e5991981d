// Leadership: against real daemons (leading, following, handover on close, observing, refusals, a lost connection)
// and, without a daemon, an Election driven by fake streams (coalescing, the leader's deadline, reconnecting).
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.protobuf.Timestamp;
import io.consistd.client.LeadershipStatus.State;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.UUID;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Predicate;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 60, unit = TimeUnit.SECONDS)
class LeadershipTest {
  private static final Duration WAIT = Duration.ofSeconds(30);

  private static final Daemons daemons = new Daemons();

  @AfterAll
  static void cleanUp() throws InterruptedException {
    daemons.close();
  }

  private static String unique() {
    return "java-lead-" + UUID.randomUUID().toString().substring(0, 8);
  }

  /** The first status {@code election} gives that matches, failing with the last one seen after {@code timeout}. */
  private static LeadershipStatus until(Election election, Predicate<LeadershipStatus> wanted, Duration timeout)
      throws InterruptedException {
    long deadline = System.nanoTime() + timeout.toNanos();
    LeadershipStatus last = election.current();
    while (!wanted.test(last)) {
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        fail("no status as wanted within " + timeout + "; the last was " + last);
      }
      LeadershipStatus next = election.poll(Duration.ofNanos(left));
      if (next != null) {
        last = next;
      }
    }
    return last;
  }

  // ---- Against the daemons: a (identity sdk-a) and b (sdk-b).

  @Test
  void aCampaignLeadsAnotherFollowsAndClosingItHandsOver() throws Exception {
    ConsistdClient a = daemons.app();
    ConsistdClient b = daemons.other();
    String ns = daemons.namespace(a);
    String name = unique();
    Election leading = new Leadership(a).campaign(name, ns);
    try {
      LeadershipStatus led = leading.awaitLeader(WAIT);
      assertEquals("sdk-a", led.holder(), led.toString());
      assertEquals("sdk-a", led.identity(), led.toString());
      assertEquals(name, led.election(), led.toString());
      assertEquals(ns, led.namespace(), led.toString());
      assertTrue(led.term() > 0, "a leader's term is the fencing token, from 1: " + led);
      assertNotNull(led.leaderUntil(), "a LEADER carries its deadline: " + led);
      assertTrue(leading.isLeader());

      try (Election following = new Leadership(b).campaign(name, ns)) {
        LeadershipStatus follower = until(following, s -> s.state() == State.FOLLOWER, WAIT);
        assertEquals("sdk-a", follower.holder(), follower.toString());
        assertEquals(led.term(), follower.term(), follower.toString());
        assertEquals("sdk-b", follower.identity(), follower.toString());
        assertFalse(following.isLeader());

        leading.close(); // resigns: the Lease is released at once, well before it would expire (15 s)
        assertFalse(leading.isLeader(), "a closed campaign does not lead");
        LeadershipStatus took = following.awaitLeader(Duration.ofSeconds(10));
        assertEquals("sdk-b", took.holder(), took.toString());
        assertTrue(took.term() > led.term(), "the next leader's term " + took + " is above " + led.term());

        LeadershipStatus got = new Leadership(b).get(name, ns);
        assertEquals(State.LEADER, got.state(), got.toString());
        assertEquals(took.term(), got.term(), got.toString());
        assertEquals("sdk-b", got.holder(), got.toString());
      }
    } finally {
      leading.close();
    }
  }

  @Test
  void observingTellsTheListenerWhoLeads() throws Exception {
    ConsistdClient a = daemons.app();
    String ns = daemons.namespace(a);
    String name = unique();
    try (Election leading = new Leadership(a).campaign(name, ns)) {
      LeadershipStatus led = leading.awaitLeader(WAIT);
      BlockingQueue<LeadershipStatus> told = new LinkedBlockingQueue<>();
      try (Election observing = new Leadership(daemons.other()).observe(name, ns, told::add)) {
        long deadline = System.nanoTime() + WAIT.toNanos();
        LeadershipStatus last = null;
        while (last == null || !(last.state() == State.FOLLOWER && last.holder().equals("sdk-a"))) {
          last = told.poll(deadline - System.nanoTime(), TimeUnit.NANOSECONDS);
          assertNotNull(last, "the observer was not told sdk-a leads within " + WAIT);
        }
        assertEquals(led.term(), last.term(), last.toString());
        assertEquals(name, last.election(), last.toString());
        assertEquals(last, observing.current());
      }
    }
  }

  @Test
  void anEmptyElectionIsRefusedNamingTheField() throws Exception {
    Leadership leadership = new Leadership(daemons.app());
    try (Election campaign = leadership.campaign("", "")) {
      StatusRuntimeException refused = assertThrows(StatusRuntimeException.class, campaign::next);
      assertEquals(Status.Code.INVALID_ARGUMENT, refused.getStatus().getCode(), refused.toString());
      assertTrue(refused.getStatus().getDescription().contains("election"), refused.toString());
      assertSame(refused, assertThrows(StatusRuntimeException.class, campaign::next), "the refusal is the end");
      assertFalse(campaign.isLeader());
    }
    BlockingQueue<StatusRuntimeException> errors = new LinkedBlockingQueue<>();
    LeadershipListener listener = new LeadershipListener() {
      @Override
      public void onStatus(LeadershipStatus status) {}

      @Override
      public void onError(StatusRuntimeException error) {
        errors.add(error);
      }
    };
    try (Election observing = leadership.observe("", "", listener)) {
      StatusRuntimeException refused = errors.poll(10, TimeUnit.SECONDS);
      assertNotNull(refused, "the listener was not told the refusal");
      assertEquals(Status.Code.INVALID_ARGUMENT, refused.getStatus().getCode(), refused.toString());
      assertSame(refused, assertThrows(StatusRuntimeException.class, observing::next), "the pull says the same");
    }
    StatusRuntimeException got = assertThrows(StatusRuntimeException.class, () -> leadership.get("", ""));
    assertEquals(Status.Code.INVALID_ARGUMENT, got.getStatus().getCode(), got.toString());
    assertTrue(got.getStatus().getDescription().contains("election"), got.toString());
  }

  @Test
  void aLostConnectionSaysUnknownAtOnceThenLeadsAgain() throws Exception {
    ConsistdClient a = daemons.app();
    String ns = daemons.namespace(a);
    try (UnixProxy proxy = new UnixProxy(Daemons.env("CONSISTD_SOCKET"))) {
      ConsistdClient client = daemons.ready(proxy.socket());
      try (Election campaign = new Leadership(client).campaign(unique(), ns)) {
        LeadershipStatus led = campaign.awaitLeader(WAIT);
        proxy.down();
        LeadershipStatus lost = campaign.poll(Duration.ofSeconds(2));
        assertNotNull(lost, "no status within 2 s of losing the daemon");
        assertEquals(State.UNKNOWN, lost.state(), lost.toString());
        assertFalse(campaign.isLeader());
        proxy.up();
        LeadershipStatus again = campaign.awaitLeader(WAIT);
        assertEquals("sdk-a", again.holder(), again.toString());
        assertTrue(again.term() >= led.term(), again + " after " + led);
      }
    }
  }

  // ---- Without a daemon: an Election over streams the test drives.

  /** Election streams the test drives: each one opened is handed to the test; cancels and reconnects are counted. */
  private static final class FakeStreams implements Election.Opener {
    final BlockingQueue<StreamObserver<consistd.v1.Leadership.LeadershipStatus>> opened = new LinkedBlockingQueue<>();
    final AtomicInteger cancelled = new AtomicInteger();
    final AtomicInteger reconnects = new AtomicInteger();

    @Override
    public Runnable open(StreamObserver<consistd.v1.Leadership.LeadershipStatus> statuses) {
      opened.add(statuses);
      return cancelled::incrementAndGet;
    }

    Election election(LeadershipListener listener) {
      return new Election("e", "ns", "me", "campaign", this, reconnects::incrementAndGet, listener);
    }

    /** The next stream the election opens. */
    StreamObserver<consistd.v1.Leadership.LeadershipStatus> stream() throws InterruptedException {
      StreamObserver<consistd.v1.Leadership.LeadershipStatus> stream = opened.poll(2, TimeUnit.SECONDS);
      assertNotNull(stream, "no stream opened within 2 s");
      return stream;
    }
  }

  private static consistd.v1.Leadership.LeadershipStatus.Builder status(
      consistd.v1.Leadership.LeadershipState state, String holder, long term) {
    return consistd.v1.Leadership.LeadershipStatus.newBuilder()
        .setElection("e").setNamespace("ns").setState(state).setHolder(holder).setTerm(term).setIdentity("me");
  }

  /** A LEADER status of "me" in {@code term} until {@code until}. */
  private static consistd.v1.Leadership.LeadershipStatus leader(long term, Instant until) {
    Timestamp at = Timestamp.newBuilder().setSeconds(until.getEpochSecond()).setNanos(until.getNano()).build();
    return status(consistd.v1.Leadership.LeadershipState.LEADERSHIP_STATE_LEADER, "me", term)
        .setLeaderUntil(at).build();
  }

  private static consistd.v1.Leadership.LeadershipStatus follower(long term) {
    return status(consistd.v1.Leadership.LeadershipState.LEADERSHIP_STATE_FOLLOWER, "other", term).build();
  }

  private static final StatusRuntimeException CUT = Status.UNAVAILABLE.withDescription("cut").asRuntimeException();

  @Test
  void aSlowListenerIsToldTheNewestStatusNotABacklog() throws Exception {
    FakeStreams fake = new FakeStreams();
    CountDownLatch busy = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    List<Long> told = new CopyOnWriteArrayList<>();
    LeadershipListener slow = status -> {
      told.add(status.term());
      busy.countDown();
      try {
        release.await();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    };
    try (Election election = fake.election(slow)) {
      StreamObserver<consistd.v1.Leadership.LeadershipStatus> stream = fake.stream();
      stream.onNext(follower(1));
      assertTrue(busy.await(2, TimeUnit.SECONDS), "the listener was not called");
      // The listener is busy: the stream is still read (these calls return), and nothing queues.
      for (long term = 2; term <= 20; term++) {
        stream.onNext(follower(term));
      }
      assertEquals(20, election.current().term());
      release.countDown();
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(2);
      while (!told.contains(20L) && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
      Thread.sleep(100); // nothing else comes
      assertEquals(List.of(1L, 20L), told, "the listener is told the first status, then only the newest");
      // The pull is coalesced the same way, apart from the listener.
      assertEquals(20, election.next().term());
      assertNull(election.poll(Duration.ofMillis(50)));
    }
  }

  @Test
  void renewalsMoveTheDeadlineAndTheSdkSaysUnknownWhenItPasses() throws Exception {
    FakeStreams fake = new FakeStreams();
    Duration renewDeadline = Duration.ofMillis(300);
    try (Election election = fake.election(null)) {
      StreamObserver<consistd.v1.Leadership.LeadershipStatus> stream = fake.stream();
      Instant first = Instant.now().plus(renewDeadline);
      stream.onNext(leader(3, first));
      LeadershipStatus led = election.next();
      assertEquals(new LeadershipStatus("e", "ns", State.LEADER, "me", 3, "me", first), led);
      assertTrue(election.isLeader());

      // Renewals for over twice the renew deadline: no new status, still leading, the deadline moved on.
      Instant until = first;
      for (int i = 0; i < 8; i++) {
        Thread.sleep(100);
        until = Instant.now().plus(renewDeadline);
        stream.onNext(leader(3, until));
      }
      assertNull(election.poll(Duration.ZERO), "a renewal is no news");
      assertTrue(election.isLeader(), "leading past the first deadline, since the sidecar renewed");
      assertEquals(until, election.leaderUntil());

      // The sidecar falls silent: UNKNOWN at the last renewal's deadline.
      LeadershipStatus lapsed = election.poll(Duration.ofSeconds(2));
      Instant at = Instant.now();
      assertEquals(new LeadershipStatus("e", "ns", State.UNKNOWN, "", 3, "me", null), lapsed);
      Duration late = Duration.between(until, at);
      assertFalse(late.isNegative() || late.compareTo(Duration.ofMillis(250)) > 0, "UNKNOWN came " + late + " late");
      assertFalse(election.isLeader());

      // A LEADER already past on arrival is the UNKNOWN the app was told; a later renewal leads again.
      stream.onNext(leader(3, Instant.now().minusSeconds(1)));
      assertNull(election.poll(Duration.ofMillis(100)));
      stream.onNext(leader(3, Instant.now().plusSeconds(3600)));
      assertEquals(State.LEADER, election.poll(Duration.ofSeconds(1)).state());
      assertTrue(election.isLeader());
    }
  }

  @Test
  void aLostStreamSaysUnknownAtOnceThenOpensAgainWithBackoff() throws Exception {
    FakeStreams fake = new FakeStreams();
    try (Election election = fake.election(null)) {
      StreamObserver<consistd.v1.Leadership.LeadershipStatus> first = fake.stream();
      first.onNext(leader(1, Instant.now().plusSeconds(3600)));
      assertEquals(State.LEADER, election.next().state());

      long lost = System.nanoTime();
      first.onError(CUT);
      LeadershipStatus unknown = election.poll(Duration.ZERO);
      assertEquals(new LeadershipStatus("e", "ns", State.UNKNOWN, "", 1, "me", null), unknown, "UNKNOWN at once");
      assertFalse(election.isLeader());
      StreamObserver<consistd.v1.Leadership.LeadershipStatus> second = fake.stream();
      long paused = System.nanoTime() - lost;
      assertTrue(paused >= TimeUnit.MILLISECONDS.toNanos(90), "opened again after " + paused / 1_000_000 + " ms");
      assertEquals(1, fake.reconnects.get(), "the channel's connect backoff is reset before the retry");

      first.onNext(leader(1, Instant.now().plusSeconds(3600)));
      assertNull(election.poll(Duration.ofMillis(50)), "a stream that ended is not heard");
      second.onNext(leader(2, Instant.now().plusSeconds(3600)));
      assertEquals(2, election.next().term());

      // The stream ends without the app closing it: the same; the pause is back at 100 ms after a status.
      second.onCompleted();
      assertEquals(State.UNKNOWN, election.poll(Duration.ZERO).state());
      fake.stream().onError(CUT); // a third stream fails at once, with nothing said: no second UNKNOWN
      long failed = System.nanoTime();
      fake.stream();
      long doubled = System.nanoTime() - failed;
      assertTrue(doubled >= TimeUnit.MILLISECONDS.toNanos(190), "the pause doubles: " + doubled / 1_000_000 + " ms");
      assertNull(election.poll(Duration.ZERO));
      assertEquals(3, fake.reconnects.get());
    }
  }

  @Test
  void aRefusalEndsTheElectionWithTheDaemonsError() throws Exception {
    FakeStreams fake = new FakeStreams();
    BlockingQueue<StatusRuntimeException> errors = new LinkedBlockingQueue<>();
    LeadershipListener listener = new LeadershipListener() {
      @Override
      public void onStatus(LeadershipStatus status) {}

      @Override
      public void onError(StatusRuntimeException error) {
        errors.add(error);
      }
    };
    try (Election election = fake.election(listener)) {
      StreamObserver<consistd.v1.Leadership.LeadershipStatus> stream = fake.stream();
      stream.onNext(leader(1, Instant.now().plusSeconds(3600)));
      StatusRuntimeException refusal =
          Status.INVALID_ARGUMENT.withDescription("election: not a valid name").asRuntimeException();
      stream.onError(refusal);
      assertSame(refusal, assertThrows(StatusRuntimeException.class, election::next));
      assertSame(refusal, assertThrows(StatusRuntimeException.class, election::next));
      assertSame(refusal, errors.poll(2, TimeUnit.SECONDS), "the listener is told the refusal");
      assertFalse(election.isLeader());
      assertEquals(State.UNKNOWN, election.current().state());
      assertNull(fake.opened.poll(300, TimeUnit.MILLISECONDS), "a refused election is not opened again");
    }
  }

  @Test
  void closingEndsTheStreamAndAWaitingNext() throws Exception {
    FakeStreams fake = new FakeStreams();
    AtomicInteger told = new AtomicInteger();
    Election election = fake.election(status -> told.incrementAndGet());
    StreamObserver<consistd.v1.Leadership.LeadershipStatus> stream = fake.stream();
    CompletableFuture<Throwable> waiting = CompletableFuture.supplyAsync(() -> {
      try {
        return new AssertionError("next returned " + election.next());
      } catch (NoSuchElementException | InterruptedException e) {
        return e;
      }
    });
    Thread.sleep(100);
    assertFalse(waiting.isDone(), "next waits for a status");
    election.close();
    assertTrue(waiting.get(2, TimeUnit.SECONDS) instanceof NoSuchElementException, waiting.get().toString());
    assertEquals(1, fake.cancelled.get(), "closing cancels the stream (a campaign resigns)");
    stream.onNext(follower(1));
    stream.onError(CUT);
    Thread.sleep(200);
    assertEquals(0, told.get(), "the listener is not called after close");
    assertNull(fake.opened.poll(200, TimeUnit.MILLISECONDS), "a closed election is not opened again");
    assertThrows(NoSuchElementException.class, () -> election.poll(Duration.ZERO));
  }
}
