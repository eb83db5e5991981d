// The newest state per object: one pending state per object, handed to workers as they ask, the own-write rule at
// the hand-out, one worker per object at a time. The first tests run on the daemons (a third party writing through
// daemon b); the rest feed a fake watch.
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
