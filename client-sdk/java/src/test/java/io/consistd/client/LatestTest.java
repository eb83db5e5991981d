// The newest state per object: one pending state per object, handed to workers as they ask, the own-write rule at
// the hand-out, a worker's own write not handed back, one worker per object at a time. The first tests run on the
// daemons (a third party writing through daemon b); the rest feed a fake watch.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.consistd.client.ObjectsClient.PatchType;
import io.consistd.client.WatchEvent.Consistency;
import io.consistd.client.WatchEvent.Type;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.Iterator;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 60, unit = TimeUnit.SECONDS)
class LatestTest {
  private static final Duration WAIT = Duration.ofSeconds(15);
  private static final Daemons daemons = new Daemons();

  @AfterAll
  static void cleanUp() throws InterruptedException {
    daemons.close();
  }

  private static Latest.Taken handed(Latest latest) throws InterruptedException {
    Latest.Taken taken = latest.poll(WAIT);
    assertNotNull(taken, "nothing handed out within " + WAIT);
    return taken;
  }

  private static String seen(Latest.Taken taken) {
    return taken.event().type() + " " + taken.name() + "@" + taken.event().object().resourceVersion();
  }

  private static void nothingReady(Latest latest, Duration within) throws InterruptedException {
    Latest.Taken taken = latest.poll(within);
    assertNull(taken, () -> "handed out " + seen(taken));
  }

  @Test
  void aWorkerIsHandedTheNewestStateAndNeverOneOlderThanItsOwnWrite() throws InterruptedException {
    ConsistdClient app = daemons.app();
    ConsistdClient other = daemons.other();
    String ns = daemons.namespace(app);
    KubeObject created = app.objects().create("configmaps", ns, Daemons.configMap("slow", "0"));
    try (Latest latest = app.watchLatest(WatchRequest.of("configmaps").namespace(ns))) {
      Latest.Taken first = handed(latest);
      assertEquals("ADDED slow@" + created.resourceVersion(), seen(first));
      assertEquals(ns, first.namespace());
      // Another writer changes it twice while the worker works: both states reach the client and wait there.
      other.objects().patch("configmaps", ns, "slow", PatchType.MERGE, "{\"data\":{\"k\":\"1\"}}");
      KubeObject theirs = other.objects().patch("configmaps", ns, "slow", PatchType.MERGE, "{\"data\":{\"k\":\"2\"}}");
      Thread.sleep(1000);
      nothingReady(latest, Duration.ofMillis(200));
      assertEquals(1, latest.pending(), "one pending state: the newest");
      KubeObject mine = app.objects().patch("configmaps", ns, "slow", PatchType.MERGE, "{\"data\":{\"k\":\"mine\"}}");
      first.done();
      try (Latest.Taken second = handed(latest)) {
        assertNotEquals(theirs.resourceVersion(), second.event().object().resourceVersion(), "older than the own write");
        assertEquals("MODIFIED slow@" + mine.resourceVersion(), seen(second));
      }
      other.objects().delete("configmaps", ns, "slow");
      try (Latest.Taken gone = handed(latest)) {
        assertEquals(Type.DELETED, gone.event().type());
        assertEquals("slow", gone.name());
      }
    }
  }

  @Test
  void theErrorThatEndsTheWatchReachesTheWorker() throws InterruptedException {
    try (Latest latest = daemons.app().watchLatest(WatchRequest.of("nosuchthings").namespace("default"))) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> latest.poll(WAIT));
      assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode(), e.toString());
    }
  }

  // Without a daemon.

  /** A watch the test feeds: events, then END, or a RuntimeException it throws. */
  private static final class Fed implements Iterator<WatchEvent>, AutoCloseable {
    private static final Object END = new Object();
    private final BlockingQueue<Object> queue = new LinkedBlockingQueue<>();
    private Object next;

    void feed(Object... items) {
      for (Object item : items) {
        queue.add(item);
      }
    }

    /** Waits until the reader took everything fed. */
    void settle() throws InterruptedException {
      while (!queue.isEmpty()) {
        Thread.sleep(1);
      }
      Thread.sleep(20);
    }

    @Override
    public boolean hasNext() {
      if (next == null) {
        try {
          next = queue.take();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          return false;
        }
      }
      if (next instanceof RuntimeException e) {
        throw e;
      }
      return next != END;
    }

    @Override
    public WatchEvent next() {
      hasNext();
      WatchEvent event = (WatchEvent) next;
      next = null;
      return event;
    }

    @Override
    public void close() {
      queue.add(END);
    }
  }

  private static WatchEvent state(Type type, String name, String rv) {
    KubeObject o = new KubeObject("uid-" + name, "ns", name, rv, "{}");
    return new WatchEvent(type, o, "c" + rv, Consistency.CONSISTENT, false);
  }

  /** A MODIFIED of {@code name} at {@code rv} that directly follows its state at {@code previous}. */
  private static WatchEvent following(String name, String rv, String previous) {
    KubeObject o = new KubeObject("uid-" + name, "ns", name, rv, "{}");
    return new WatchEvent(Type.MODIFIED, o, "c" + rv, Consistency.CONSISTENT, false, previous);
  }

  private static WatchEvent marker(Type type) {
    return new WatchEvent(type, null, "", Consistency.UNSPECIFIED, false);
  }

  private static void written(OwnWrites writes, String name, String rv) {
    writes.record(new KubeObject("uid-" + name, "ns", name, rv, "{}"));
  }

  @Test
  void onlyTheNewestStateOfEachObjectIsHandedOutInTheOrderObjectsBecameReady() throws InterruptedException {
    Fed fed = new Fed();
    try (Latest latest = new Latest(fed, fed, new OwnWrites())) {
      fed.feed(state(Type.ADDED, "a", "1"), state(Type.ADDED, "b", "2"), marker(Type.SYNCED));
      fed.feed(state(Type.MODIFIED, "a", "3"), state(Type.MODIFIED, "a", "4"));
      fed.settle();
      assertEquals(2, latest.pending());
      assertEquals("MODIFIED a@4", seen(handed(latest)));
      assertEquals("ADDED b@2", seen(handed(latest)));
      nothingReady(latest, Duration.ofMillis(50));
    }
  }

  @Test
  void anObjectAWorkerHoldsIsHandedToNoOtherUntilItIsDoneThenItsNewestStateIs() throws Exception {
    Fed fed = new Fed();
    try (Latest latest = new Latest(fed, fed, new OwnWrites())) {
      fed.feed(state(Type.ADDED, "a", "1"));
      Latest.Taken held = handed(latest);
      fed.feed(state(Type.MODIFIED, "a", "2"), state(Type.MODIFIED, "a", "3"));
      fed.settle();
      nothingReady(latest, Duration.ofMillis(50));
      fed.feed(state(Type.ADDED, "b", "4"));
      assertEquals("b", handed(latest).name(), "another object is handed out meanwhile");
      CompletableFuture<String> after = CompletableFuture.supplyAsync(() -> {
        try {
          return seen(handed(latest));
        } catch (InterruptedException e) {
          throw new IllegalStateException(e);
        }
      });
      Thread.sleep(50);
      assertFalse(after.isDone(), "a was handed out while held");
      held.done();
      held.done(); // again: nothing more
      assertEquals("MODIFIED a@3", after.get(15, TimeUnit.SECONDS));
    }
  }

  @Test
  void aStateOlderThanAnOwnWriteThatReturnedWhileItWaitedIsDroppedWhenHandedOut() throws InterruptedException {
    Fed fed = new Fed();
    OwnWrites writes = new OwnWrites();
    try (Latest latest = new Latest(fed, fed, writes)) {
      fed.feed(state(Type.ADDED, "a", "1"));
      Latest.Taken held = handed(latest);
      // Another writer's state arrives while the worker writes; the worker's write returns version 3.
      fed.feed(state(Type.MODIFIED, "a", "2"));
      fed.settle();
      written(writes, "a", "3");
      held.done();
      nothingReady(latest, Duration.ofMillis(50));
      assertEquals(0, latest.pending(), "the older state was dropped");
      fed.feed(state(Type.MODIFIED, "a", "3"));
      assertEquals("MODIFIED a@3", seen(handed(latest)), "the write's own state is handed out");
    }
  }

  @Test
  void theStateAWorkersOwnWriteMadeOnTheStateItHadIsNotHandedBackButTheNextWritersIs() throws InterruptedException {
    Fed fed = new Fed();
    OwnWrites writes = new OwnWrites();
    try (Latest latest = new Latest(fed, fed, writes)) {
      fed.feed(state(Type.ADDED, "a", "1"));
      Latest.Taken held = handed(latest);
      // The worker writes on the state it holds: version 2, directly after 1.
      written(writes, "a", "2");
      fed.feed(following("a", "2", "1"));
      fed.settle();
      held.done();
      nothingReady(latest, Duration.ofMillis(50));
      assertEquals(0, latest.pending(), "the worker's own write was dropped");
      // Another writer's change on it is handed out.
      fed.feed(following("a", "3", "2"));
      held = handed(latest);
      assertEquals("MODIFIED a@3", seen(held));
      // A worker's write on that one again is not.
      written(writes, "a", "4");
      held.done();
      fed.feed(following("a", "4", "3"));
      fed.settle();
      nothingReady(latest, Duration.ofMillis(50));
      assertEquals(0, latest.pending());
    }
  }

  @Test
  void aStatePassedOverAsTheWorkersOwnWriteCountsAsHad() throws InterruptedException {
    Fed fed = new Fed();
    OwnWrites writes = new OwnWrites();
    try (Latest latest = new Latest(fed, fed, writes)) {
      fed.feed(state(Type.ADDED, "a", "1"));
      ownWriteNotHandedBack(fed, writes, latest, handed(latest), "2");
      // The app writes again on 2, the state passed over: nothing else happened since the worker's state.
      written(writes, "a", "3");
      fed.feed(following("a", "3", "2"));
      fed.settle();
      nothingReady(latest, Duration.ofMillis(50));
      fed.feed(following("a", "4", "3"));
      assertEquals("MODIFIED a@4", seen(handed(latest)), "another writer's change on it");
    }
  }

  /**
   * The worker that {@code held} was handed to writes {@code rv} directly on it and is done: that state is not handed
   * back.
   */
  private static void ownWriteNotHandedBack(Fed fed, OwnWrites writes, Latest latest, Latest.Taken held, String rv)
      throws InterruptedException {
    String name = held.name();
    String previous = held.event().object().resourceVersion();
    written(writes, name, rv);
    held.done();
    fed.feed(following(name, rv, previous));
    fed.settle();
    nothingReady(latest, Duration.ofMillis(50));
    assertEquals(0, latest.pending(), "the worker's own write was dropped");
  }

  @Test
  void anOwnWriteOnAStateNoWorkerHadIsHandedOut() throws InterruptedException {
    Fed fed = new Fed();
    OwnWrites writes = new OwnWrites();
    try (Latest latest = new Latest(fed, fed, writes)) {
      fed.feed(state(Type.ADDED, "a", "1"));
      Latest.Taken held = handed(latest);
      // Another writer's state (2) comes between the state the worker holds and its write (3).
      fed.feed(following("a", "2", "1"));
      fed.settle();
      written(writes, "a", "3");
      fed.feed(following("a", "3", "2"));
      fed.settle();
      held.done();
      held = handed(latest);
      assertEquals("MODIFIED a@3", seen(held), "it holds a change no worker saw");
      // A worker had 3 now: its write on it is not handed back.
      ownWriteNotHandedBack(fed, writes, latest, held, "4");
    }
  }

  @Test
  void anOwnWriteWithNoPreviousStateIsHandedOut() throws InterruptedException {
    Fed fed = new Fed();
    OwnWrites writes = new OwnWrites();
    try (Latest latest = new Latest(fed, fed, writes)) {
      fed.feed(state(Type.ADDED, "a", "1"));
      Latest.Taken held = handed(latest);
      // The worker's write comes back as a state from a list or a resync: no previous state, what came between is
      // unknown.
      written(writes, "a", "2");
      held.done();
      fed.feed(state(Type.MODIFIED, "a", "2"));
      held = handed(latest);
      assertEquals("MODIFIED a@2", seen(held));
      ownWriteNotHandedBack(fed, writes, latest, held, "3");
    }
  }

  @Test
  void aDeletionForgetsTheStateHandedOut() throws InterruptedException {
    Fed fed = new Fed();
    OwnWrites writes = new OwnWrites();
    try (Latest latest = new Latest(fed, fed, writes)) {
      fed.feed(state(Type.ADDED, "a", "1"));
      handed(latest).done();
      fed.feed(state(Type.DELETED, "a", "1"));
      Latest.Taken gone = handed(latest);
      assertEquals("DELETED a@1", seen(gone));
      gone.done();
      // A state of the same uid (as the fake names every "a") following the one handed out before the deletion, at
      // the version of the client's write: after the deletion no worker had it, so it is handed out.
      written(writes, "a", "2");
      fed.feed(following("a", "2", "1"));
      Latest.Taken held = handed(latest);
      assertEquals("MODIFIED a@2", seen(held), "the rule carried over the deletion");
      ownWriteNotHandedBack(fed, writes, latest, held, "3");
    }
  }

  @Test
  void aDeletionReplacesTheWaitingStateAndIsHandedOutWhateverTheOwnWrites() throws InterruptedException {
    Fed fed = new Fed();
    OwnWrites writes = new OwnWrites();
    try (Latest latest = new Latest(fed, fed, writes)) {
      fed.feed(state(Type.ADDED, "a", "1"));
      Latest.Taken held = handed(latest);
      fed.feed(state(Type.MODIFIED, "a", "2"), state(Type.DELETED, "a", "2"));
      fed.settle();
      written(writes, "a", "9");
      held.close();
      assertEquals("DELETED a@2", seen(handed(latest)));
    }
  }

  @Test
  void afterAResyncObjectsMissingFromTheSnapshotAreHandedOutDeleted() throws InterruptedException {
    Fed fed = new Fed();
    try (Latest latest = new Latest(fed, fed, new OwnWrites())) {
      fed.feed(state(Type.ADDED, "a", "1"), state(Type.ADDED, "b", "2"), state(Type.ADDED, "c", "3"));
      fed.feed(marker(Type.SYNCED));
      for (int i = 0; i < 3; i++) {
        handed(latest).done();
      }
      fed.feed(state(Type.DELETED, "c", "4"));
      handed(latest).done();
      // The watch could not resume: a fresh snapshot without b.
      fed.feed(marker(Type.RESYNC_REQUIRED), state(Type.ADDED, "a", "1"));
      fed.settle();
      assertEquals("ADDED a@1", seen(handed(latest)), "a is handed out again");
      nothingReady(latest, Duration.ofMillis(50));
      fed.feed(marker(Type.SYNCED));
      Latest.Taken gone = handed(latest);
      assertEquals("DELETED b@2", seen(gone));
      assertEquals(
          "{\"metadata\":{\"name\":\"b\",\"namespace\":\"ns\",\"uid\":\"uid-b\",\"resourceVersion\":\"2\"}}",
          gone.event().object().json());
      nothingReady(latest, Duration.ofMillis(50));
    }
  }

  @Test
  void theErrorThatEndsTheWatchReachesEveryWorkerThatAsksAndCloseEndsTheWaits() throws Exception {
    Fed fed = new Fed();
    try (Latest latest = new Latest(fed, fed, new OwnWrites())) {
      fed.feed(state(Type.ADDED, "a", "1"));
      handed(latest);
      CompletableFuture<Latest.Taken> waiting = CompletableFuture.supplyAsync(() -> {
        try {
          return latest.take();
        } catch (InterruptedException e) {
          throw new IllegalStateException(e);
        }
      });
      Thread.sleep(20);
      fed.feed(Status.NOT_FOUND.withDescription("no such resource").asRuntimeException());
      ExecutionException failed = assertThrows(ExecutionException.class, () -> waiting.get(15, TimeUnit.SECONDS));
      StatusRuntimeException cause = (StatusRuntimeException) failed.getCause();
      assertEquals(Status.Code.NOT_FOUND, cause.getStatus().getCode());
      StatusRuntimeException again = assertThrows(StatusRuntimeException.class, latest::take);
      assertEquals("no such resource", again.getStatus().getDescription());
    }

    Fed quiet = new Fed();
    Latest closed = new Latest(quiet, quiet, new OwnWrites());
    CompletableFuture<Latest.Taken> waiting = CompletableFuture.supplyAsync(() -> {
      try {
        return closed.take();
      } catch (InterruptedException e) {
        throw new IllegalStateException(e);
      }
    });
    Thread.sleep(20);
    closed.close();
    ExecutionException ended = assertThrows(ExecutionException.class, () -> waiting.get(15, TimeUnit.SECONDS));
    assertTrue(ended.getCause() instanceof StatusRuntimeException e
        && e.getStatus().getCode() == Status.Code.CANCELLED, ended.toString());
  }
}
