// Watches against real daemons: the snapshot and its changes, the own-write rule at the take, closing, refusals.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.consistd.client.ObjectsClient.PatchType;
import io.consistd.client.WatchEvent.Consistency;
import io.consistd.client.WatchEvent.Type;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 60, unit = TimeUnit.SECONDS)
class WatchTest {
  /** How long a third party's change is left to reach the app's side of a watch it is not reading. */
  private static final Duration ARRIVED = Duration.ofSeconds(1);

  private static final Daemons daemons = new Daemons();

  @AfterAll
  static void cleanUp() throws InterruptedException {
    daemons.close();
  }

  private static WatchEvent expect(Watch watch, Type type, String resourceVersion) {
    WatchEvent event = watch.next();
    assertEquals(type, event.type(), event.toString());
    if (!resourceVersion.isEmpty()) {
      assertEquals(resourceVersion, event.object().resourceVersion(), event.toString());
    }
    return event;
  }

  @Test
  void aWatchDeliversTheSnapshotThenSyncedThenEachChange() throws InterruptedException {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    KubeObject a = app.objects().create("configmaps", ns, Daemons.configMap("a", "one"));
    try (Watch watch = app.watch(WatchRequest.of("configmaps").namespace(ns).labelSelector(Daemons.LABEL)
        .mode(WatchRequest.Mode.RAW))) {
      WatchEvent added = expect(watch, Type.ADDED, a.resourceVersion());
      assertEquals(a.uid(), added.object().uid());
      WatchEvent synced = expect(watch, Type.SYNCED, "");
      assertNull(synced.object());
      // The ADDED has a cursor only when the watch was new (a snapshot's objects have none): SYNCED always.
      assertFalse(synced.cursor().isEmpty(), "SYNCED carries its cursor");

      KubeObject b = daemons.other().objects().create("configmaps", ns, Daemons.configMap("b", "two"));
      expect(watch, Type.ADDED, b.resourceVersion());
      KubeObject changed =
          daemons.other().objects().patch("configmaps", ns, "b", PatchType.MERGE, "{\"data\":{\"k\":\"2\"}}");
      WatchEvent modified = expect(watch, Type.MODIFIED, changed.resourceVersion());
      assertFalse(modified.cursor().isEmpty(), "a live event carries its cursor");
      assertEquals(b.resourceVersion(), modified.previousResourceVersion(), "a change names the state before it");
      daemons.other().objects().delete("configmaps", ns, "a");
      WatchEvent deleted = expect(watch, Type.DELETED, "");
      assertEquals("a", deleted.object().name());
      assertEquals("", added.previousResourceVersion(), "a listed state names none");
      assertEquals("", deleted.previousResourceVersion(), "a deletion names none");
    }
  }

  @Test
  void aConsistentWatchNeverHandsTheAppAStateOlderThanItsOwnWrite() throws InterruptedException {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    ConsistdClient other = daemons.other();
    KubeObject first = other.objects().create("configmaps", ns, Daemons.configMap("shared", "one"));
    try (Watch watch = app.watch(WatchRequest.of("configmaps").namespace(ns).labelSelector(Daemons.LABEL))) {
      expect(watch, Type.ADDED, first.resourceVersion());
      expect(watch, Type.SYNCED, "");
      String[] versions = changedBehindTheAppsBack(app, other, ns);
      WatchEvent taken = watch.next();
      assertNotEquals(versions[0], taken.object().resourceVersion(),
          "the app took the third party's state after its own write returned " + versions[1]);
      assertEquals(Type.MODIFIED, taken.type(), taken.toString());
      assertEquals(versions[1], taken.object().resourceVersion(), taken.toString());
      assertEquals(Consistency.OWN_WRITE, taken.consistency(), taken.toString());
      assertFalse(taken.predatesOwnWrite());
    }
  }

  @Test
  void aRawWatchMarksTheStateOlderThanTheAppsOwnWrite() throws InterruptedException {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    ConsistdClient other = daemons.other();
    KubeObject first = other.objects().create("configmaps", ns, Daemons.configMap("shared", "one"));
    try (Watch watch = app.watch(WatchRequest.of("configmaps").namespace(ns).labelSelector(Daemons.LABEL)
        .mode(WatchRequest.Mode.RAW))) {
      expect(watch, Type.ADDED, first.resourceVersion());
      expect(watch, Type.SYNCED, "");
      String[] versions = changedBehindTheAppsBack(app, other, ns);
      assertTrue(expect(watch, Type.MODIFIED, versions[0]).predatesOwnWrite(),
          "the third party's state, taken after the app's write returned, is not marked as older");
      assertFalse(expect(watch, Type.MODIFIED, versions[1]).predatesOwnWrite(), "the app's own state is marked");
      assertTrue(app.predatesOwnWrite(new KubeObject(first.uid(), ns, "shared", versions[0], "{}")));
    }
  }

  /**
   * The third party changes the object, the change is left time to reach the app's side of the watch, then the app
   * patches the object itself, taking nothing meanwhile, as if busy. The two resourceVersions.
   */
  private static String[] changedBehindTheAppsBack(ConsistdClient app, ConsistdClient other, String ns)
      throws InterruptedException {
    KubeObject theirs = other.objects().patch(
        "configmaps", ns, "shared", PatchType.MERGE, "{\"data\":{\"k\":\"third party\"}}");
    Thread.sleep(ARRIVED.toMillis());
    KubeObject mine = app.objects().patch("configmaps", ns, "shared", PatchType.MERGE, "{\"data\":{\"k\":\"app\"}}");
    return new String[] {theirs.resourceVersion(), mine.resourceVersion()};
  }

  @Test
  void closingAWatchFromAnotherThreadEndsAWaitingLoop() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    Watch watch = app.watch(WatchRequest.of("configmaps").namespace(ns));
    CompletableFuture<Integer> loop = CompletableFuture.supplyAsync(() -> {
      int events = 0;
      for (WatchEvent ignored : watch) {
        events++;
      }
      return events;
    });
    Thread.sleep(500);
    assertFalse(loop.isDone(), "the loop waits for events");
    watch.close();
    assertEquals(1, loop.get(10, TimeUnit.SECONDS), "SYNCED of the empty namespace, then the end");
    assertThrows(IllegalStateException.class, watch::iterator, "a watch is iterated once");
  }

  @Test
  void aWatchTheDaemonRefusesThrowsItsStatus() throws InterruptedException {
    ConsistdClient app = daemons.app();
    try (Watch watch = app.watch(WatchRequest.of("nosuchthings.example.com"))) {
      StatusRuntimeException refused = assertThrows(StatusRuntimeException.class, watch::hasNext);
      assertNotEquals(Status.Code.UNAVAILABLE, refused.getStatus().getCode(), refused.toString());
      assertTrue(refused.getStatus().getDescription().contains("nosuchthings"), refused.toString());
      assertFalse(watch.hasNext(), "a refused watch is over");
    }
  }
}
