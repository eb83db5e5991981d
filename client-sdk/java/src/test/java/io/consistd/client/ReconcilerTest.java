// The reconciler against real daemons: each key once, done, requeue, retry with the error, terminal, the
// maxLeases bound, a pass seeing what the pass before wrote under its lease, a change filter, a finalizer, refused
// specs; and, without a daemon, how a pass's end becomes its completion, how a sharded spec, change filters and a
// finalizer are sent, and how an item's finalize pass is read.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import consistd.v1.Reconcile.ChangeFilter;
import consistd.v1.Reconcile.Completion;
import consistd.v1.Reconcile.Outcome;
import io.consistd.client.ObjectsClient.PatchType;
import io.consistd.client.WatchEvent.Consistency;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 90, unit = TimeUnit.SECONDS)
class ReconcilerTest {
  private static final Duration WAIT_FOR = Duration.ofSeconds(20);

  private static final Daemons daemons = new Daemons();

  private final List<Running> reconcilers = new ArrayList<>();

  @AfterAll
  static void cleanUp() throws InterruptedException {
    daemons.close();
  }

  @AfterEach
  void stopReconcilers() throws Exception {
    for (Running r : reconcilers) {
      r.close();
    }
  }

  /** One call of a test's handler. */
  record Pass(WorkItem item, Instant start) {}

  /** Records a handler's passes as they start, and every time two passes of one key ran at once. */
  static final class Passes implements Reconciler.Handler {
    private final Reconciler.Handler handle;
    private final Map<String, Integer> running = new HashMap<>();
    private final List<String> overlaps = new ArrayList<>();
    private final BlockingQueue<Pass> started = new LinkedBlockingQueue<>();
    private final AtomicInteger now = new AtomicInteger();
    private final AtomicInteger most = new AtomicInteger();

    Passes(Reconciler.Handler handle) {
      this.handle = handle;
    }

    @Override
    public Reconciler.Result reconcile(WorkItem item) throws Exception {
      synchronized (this) {
        int n = running.merge(item.key(), 1, Integer::sum);
        if (n > 1) {
          overlaps.add(item.toString());
        }
      }
      most.accumulateAndGet(now.incrementAndGet(), Math::max);
      try {
        started.add(new Pass(item, Instant.now()));
        return handle.reconcile(item);
      } finally {
        now.decrementAndGet();
        synchronized (this) {
          running.merge(item.key(), -1, Integer::sum);
        }
      }
    }

    /** The next pass to start, failing the test after WAIT_FOR. */
    Pass next() throws InterruptedException {
      Pass p = started.poll(WAIT_FOR.toMillis(), TimeUnit.MILLISECONDS);
      if (p == null) {
        fail("no reconcile pass within " + WAIT_FOR);
      }
      return p;
    }

    /** Fails the test if a pass starts within {@code d}. */
    void quiet(Duration d) throws InterruptedException {
      Pass p = started.poll(d.toMillis(), TimeUnit.MILLISECONDS);
      if (p != null) {
        fail("unexpected pass of " + p.item());
      }
    }

    synchronized void noOverlaps() {
      assertTrue(overlaps.isEmpty(), "passes started while another pass of their key ran: " + overlaps);
    }

    /** The most passes that ran at once. */
    int most() {
      return most.get();
    }
  }

  /** A reconciler running on a thread of the test's; closing it waits for run to return. */
  static final class Running implements AutoCloseable {
    final Reconciler reconciler;
    /** What run ended with: null when it returned. */
    final CompletableFuture<Throwable> result = new CompletableFuture<>();

    Running(ConsistdClient client, QueueSpec spec, Reconciler.Handler handler) {
      reconciler = new Reconciler(client, spec, handler);
      Thread thread = new Thread(() -> {
        try {
          reconciler.run();
          result.complete(null);
        } catch (Throwable t) {
          result.complete(t);
        }
      }, "test-reconciler");
      thread.setDaemon(true);
      thread.start();
    }

    /** Closes the reconciler; what run ended with. */
    Throwable stop() throws Exception {
      reconciler.close();
      return result.get(WAIT_FOR.toMillis(), TimeUnit.MILLISECONDS);
    }

    @Override
    public void close() throws Exception {
      stop();
    }
  }

  private Running reconciling(ConsistdClient client, QueueSpec spec, Reconciler.Handler handler) {
    Running r = new Running(client, spec, handler);
    reconcilers.add(r);
    return r;
  }

  /** A queue of the test's ConfigMaps in {@code ns}, under a name of its own. */
  private static QueueSpec queueSpec(String prefix, String ns) {
    return QueueSpec.of(prefix + "-" + UUID.randomUUID().toString().substring(0, 8), "configmaps")
        .namespace(ns).labelSelector(Daemons.LABEL);
  }

  private static boolean hasData(WorkItem item, String value) {
    return item.object() != null && item.object().json().contains("\"k\":\"" + value + "\"");
  }

  private static void patchData(ConsistdClient client, String ns, String name, String value) {
    client.objects().patch("configmaps", ns, name, PatchType.MERGE, "{\"data\":{\"k\":\"" + value + "\"}}");
  }

  @Test
  void eachLabelledConfigMapIsHandedOutOnceAndDoneEndsIt() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    for (String name : List.of("a", "b", "c")) {
      app.objects().create("configmaps", ns, Daemons.configMap(name, "v"));
    }
    app.objects().create("configmaps", ns, "{\"metadata\":{\"name\":\"unlabelled\"}}");
    Passes rec = new Passes(item -> Reconciler.Result.done());
    Running running = reconciling(app, queueSpec("java-once", ns).maxLeases(3), rec);

    Set<String> first = new HashSet<>();
    for (int i = 0; i < 3; i++) {
      WorkItem item = rec.next().item();
      assertEquals(ns, item.namespace(), item.toString());
      assertEquals(1, item.attempt(), item.toString());
      assertEquals(Consistency.CONSISTENT, item.consistency(), item.toString());
      assertFalse(item.leaseId().isEmpty(), item.toString());
      assertNotNull(item.object(), item.toString());
      assertEquals(item.name(), item.object().name());
      assertFalse(item.deleted());
      assertEquals(0, item.term(), "no election, no term");
      assertEquals("", item.lastError());
      assertTrue(item.expiresAt().isAfter(Instant.now()), "the lease expires later: " + item.expiresAt());
      first.add(item.name());
    }
    assertEquals(Set.of("a", "b", "c"), first);
    rec.quiet(Duration.ofMillis(1500)); // DONE: nothing comes again without a change

    // A change comes once, with the new state; a deletion comes once, marked.
    patchData(daemons.other(), ns, "b", "changed");
    WorkItem changed = rec.next().item();
    assertEquals("b", changed.name());
    assertTrue(hasData(changed, "changed"), changed.object().json());
    daemons.other().objects().delete("configmaps", ns, "c");
    WorkItem deleted = rec.next().item();
    assertEquals("c", deleted.name());
    assertTrue(deleted.deleted(), deleted.toString());
    rec.quiet(Duration.ofSeconds(1));
    rec.noOverlaps();
    assertNull(running.stop(), "run returns when closed");
  }

  @Test
  void aRequeueComesBackAfterItsDelay() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("a", "v"));
    AtomicLong returned = new AtomicLong();
    Passes rec = new Passes(item -> {
      if (returned.get() == 0) {
        returned.set(System.nanoTime());
        return Reconciler.Result.requeue(Duration.ofMillis(300));
      }
      return Reconciler.Result.done();
    });
    reconciling(app, queueSpec("java-requeue", ns), rec);
    rec.next();
    WorkItem again = rec.next().item();
    long waited = System.nanoTime() - returned.get();
    assertTrue(waited >= Duration.ofMillis(300).toNanos(), "requeued after 300 ms but came after " + waited + " ns");
    assertEquals("a", again.name());
    assertEquals(1, again.attempt(), "a requeue is no failure");
    assertEquals("", again.lastError());
    rec.quiet(Duration.ofSeconds(1));
  }

  @Test
  void anExceptionComesBackWithTheNextAttemptAndItsMessage() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("a", "v"));
    AtomicLong failed = new AtomicLong();
    Passes rec = new Passes(item -> {
      if (item.attempt() < 3) {
        failed.set(System.nanoTime());
        throw new IllegalStateException("the backend said no " + item.attempt());
      }
      return Reconciler.Result.done();
    });
    reconciling(app, queueSpec("java-retry", ns).retry(QueueSpec.Retry.DEFAULTS.baseDelay(Duration.ofMillis(200))),
        rec);
    assertEquals(1, rec.next().item().attempt());
    Pass second = rec.next();
    assertEquals(2, second.item().attempt(), second.item().toString());
    assertEquals("the backend said no 1", second.item().lastError());
    Pass third = rec.next();
    long waited = System.nanoTime() - failed.get();
    assertEquals(3, third.item().attempt());
    assertEquals("the backend said no 2", third.item().lastError());
    assertTrue(waited >= Duration.ofMillis(400).toNanos(),
        "the second retry came " + waited + " ns after the error, before its 400 ms backoff");
    rec.quiet(Duration.ofSeconds(1));
  }

  @Test
  void aTerminalExceptionWaitsForAChange() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("a", "v"));
    Passes rec = new Passes(item -> {
      if (hasData(item, "v")) {
        // Wrapped: what counts is a TerminalException among the causes.
        throw new RuntimeException("checking", new TerminalException("the spec cannot work"));
      }
      return Reconciler.Result.done();
    });
    reconciling(app, queueSpec("java-terminal", ns).retry(QueueSpec.Retry.DEFAULTS.baseDelay(Duration.ofMillis(10))),
        rec);
    rec.next();
    rec.quiet(Duration.ofMillis(1500)); // a retry would have come after 10 ms
    patchData(daemons.other(), ns, "a", "fixed");
    WorkItem again = rec.next().item();
    assertTrue(hasData(again, "fixed"), again.object().json());
    assertEquals(1, again.attempt(), "a change after TERMINAL is a first attempt");
    rec.quiet(Duration.ofSeconds(1));
  }

  @Test
  void noMoreThanMaxLeasesPassesRunAtOnce() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    for (int i = 0; i < 6; i++) {
      app.objects().create("configmaps", ns, Daemons.configMap("cm-" + i, "v"));
    }
    Passes rec = new Passes(item -> {
      Thread.sleep(400);
      return Reconciler.Result.done();
    });
    reconciling(app, queueSpec("java-leases", ns).maxLeases(2), rec);
    Set<String> seen = new HashSet<>();
    for (int i = 0; i < 6; i++) {
      seen.add(rec.next().item().name());
    }
    assertEquals(6, seen.size(), "every key once: " + seen);
    rec.quiet(Duration.ofSeconds(1));
    assertEquals(2, rec.most(), "passes at once, with maxLeases 2");
    rec.noOverlaps();
  }

  @Test
  void closingCancelsARunningPassAndRunReturnsAfterIt() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("a", "v"));
    CountDownLatch interrupted = new CountDownLatch(1);
    AtomicInteger cancelledSeen = new AtomicInteger();
    Passes rec = new Passes(item -> {
      try {
        Thread.sleep(60_000);
      } catch (InterruptedException e) {
        if (item.cancelled()) {
          cancelledSeen.incrementAndGet();
        }
        interrupted.countDown();
        throw e;
      }
      return Reconciler.Result.done();
    });
    Running running = reconciling(app, queueSpec("java-close", ns), rec);
    rec.next();
    assertNull(running.stop());
    assertEquals(0, interrupted.getCount(), "run returned before the pass it cancelled");
    assertEquals(1, cancelledSeen.get(), "the item said it was cancelled");
  }

  @Test
  void aPassPastItsLeaseIsCancelledAndTheKeyComesAgain() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("a", "v"));
    CompletableFuture<Duration> cancelledAfter = new CompletableFuture<>();
    AtomicInteger calls = new AtomicInteger();
    Passes rec = new Passes(item -> {
      if (calls.incrementAndGet() == 1) {
        Instant start = Instant.now();
        try {
          Thread.sleep(30_000);
        } catch (InterruptedException e) {
          cancelledAfter.complete(item.cancelled() ? Duration.between(start, Instant.now()) : null);
        }
      }
      return Reconciler.Result.done();
    });
    reconciling(app, queueSpec("java-expiry", ns).leaseTimeout(Duration.ofSeconds(1)), rec);
    WorkItem first = rec.next().item();
    Duration after = cancelledAfter.get(WAIT_FOR.toSeconds(), TimeUnit.SECONDS);
    assertNotNull(after, "the pass was interrupted but its item did not say it was cancelled");
    assertTrue(after.compareTo(Duration.ofSeconds(3)) < 0, "cancelled " + after + " into a 1 s lease");
    WorkItem again = rec.next().item();
    assertEquals("a", again.name());
    assertFalse(again.leaseId().equals(first.leaseId()), "a new lease");
    rec.noOverlaps();
  }

  // The promise of item.objects(): a write a pass makes to a related object names its lease, so the key's next pass
  // (asked for at once, RequeueAfter 1 ms) comes only once the daemon's cache shows it. The primary is a Secret: the
  // daemon waits for a lease's write on every watch of the queue on the written resource and namespace, and a
  // ConfigMap primary watch that never sees the child would hold each pass until the consistency timeout. (The Go
  // test also slows the daemon's watches down, which makes a missing lease fail every time; here the race is the
  // daemon's own.)
  @Test
  void aPassSeesWhatThePassBeforeWroteThroughTheItemsObjects() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("secrets", ns, "{\"metadata\":{\"name\":\"p\"}}");
    app.objects().create("configmaps", ns,
        "{\"metadata\":{\"name\":\"p-child\",\"labels\":{\"sdk.consistd.io/test\":\"java\",\"parent\":\"p\"}},"
            + "\"data\":{\"round\":\"0\"}}");
    // The queue's ConfigMap watch is the daemon's shared one for this query: once it has synced, Get reads from its
    // cache.
    try (Watch watch = app.watch(WatchRequest.of("configmaps").namespace(ns))) {
      while (watch.next().type() != WatchEvent.Type.SYNCED) {
        // the initial state
      }
      int rounds = 8;
      AtomicInteger round = new AtomicInteger();
      AtomicLong written = new AtomicLong();
      List<String> violations = new ArrayList<>();
      CountDownLatch finished = new CountDownLatch(1);
      List<String> leases = new ArrayList<>();
      Passes rec = new Passes(item -> {
        synchronized (violations) {
          if (round.get() > rounds) {
            return Reconciler.Result.done();
          }
          if (written.get() != 0) {
            KubeObject seen = app.objects().get("configmaps", ns, "p-child");
            long rv = Long.parseLong(seen.resourceVersion());
            if (rv < written.get()) {
              violations.add("pass " + (round.get() + 1) + " (" + item.consistency() + "): the child at " + rv
                  + ", but the pass before wrote " + written.get());
            }
          }
          if (round.incrementAndGet() > rounds) {
            finished.countDown();
            return Reconciler.Result.done();
          }
          leases.add(item.leaseId());
          KubeObject patched = item.objects().patch("configmaps", ns, "p-child", PatchType.MERGE,
              "{\"data\":{\"round\":\"" + round.get() + "\"}}");
          written.set(Long.parseLong(patched.resourceVersion()));
          return Reconciler.Result.requeue(Duration.ofMillis(1));
        }
      });
      QueueSpec spec = QueueSpec.of("java-lease-" + UUID.randomUUID().toString().substring(0, 8), "secrets")
          .namespace(ns)
          .related(QueueSpec.Related.byLabel("configmaps", ns, "parent"));
      reconciling(app, spec, rec);
      assertTrue(finished.await(WAIT_FOR.toSeconds() * 2, TimeUnit.SECONDS), rounds + " rounds not done in time");
      synchronized (violations) {
        assertTrue(violations.isEmpty(),
            "a pass read a state older than the write of the pass before it:\n" + String.join("\n", violations));
        assertEquals(rounds, new HashSet<>(leases).size(), "each round under a lease of its own: " + leases);
      }
      rec.noOverlaps();
    }
  }

  // The queue's related watch of Secrets has a field selector on `type`, which the daemon cannot judge, so a write
  // naming a lease of the key into that resource is waited for on that watch; the written Secret is not of that type,
  // so the watch never shows it. Named by the lease, the key's next pass is held, and the daemon counts the hold in the
  // queue's consistd_workqueue_consistency_holds_total; a write without the lease is not waited for, and the count
  // stays 0. How long the hold lasts is the apiserver's to say: until a bookmark moves that watch past the write, or
  // the daemon's consistency timeout (5 s), whichever comes first. A new watch gets a bookmark about every second
  // until one at or past its list's version went out, then about once a minute (Kubernetes' watch cache); so the write
  // waits until the watch has listed and 2 s more, and the pass then comes TIMED_OUT after the whole timeout, or
  // CONSISTENT when a minutely bookmark happens to come first. (One in the milliseconds between the write and the
  // requeued key's grant would leave the pass not held at all.)
  @Test
  void theKeysNextPassWaitsForAWriteThroughTheItemsObjects() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("p", "v"));
    AtomicLong wrote = new AtomicLong();
    Passes rec = new Passes(item -> {
      if (wrote.get() == 0) {
        Instant deadline = Instant.now().plus(WAIT_FOR);
        while (Daemons.watchPosition("v1/secrets", ns) == 0) {
          if (Instant.now().isAfter(deadline)) {
            throw new IllegalStateException("the queue's watch of Secrets did not list within " + WAIT_FOR);
          }
          Thread.sleep(50);
        }
        Thread.sleep(2_000);
        item.objects().create("secrets", ns,
            "{\"metadata\":{\"name\":\"p-child\",\"labels\":{\"parent\":\"p\"}},\"type\":\"Opaque\"}");
        wrote.set(System.nanoTime());
        return Reconciler.Result.requeue(Duration.ofMillis(1));
      }
      return Reconciler.Result.done();
    });
    QueueSpec spec = queueSpec("java-held", ns)
        .related(QueueSpec.Related.byLabel("secrets", ns, "parent").fieldSelector("type=example.com/never"));
    reconciling(app, spec, rec);
    assertEquals(Consistency.CONSISTENT, rec.next().item().consistency());
    WorkItem again = rec.next().item();
    long held = System.nanoTime() - wrote.get();
    assertEquals("", again.lastError(), "the first pass ended without an error");
    // Read while the queue runs: the daemon drops a queue's series when it stops.
    long holds = Daemons.consistencyHolds(spec.name());
    assertTrue(holds >= 1, "the next pass was not held for the lease's write (" + holds + " holds; it came after "
        + Duration.ofNanos(held).toMillis() + " ms, " + again.consistency() + ")");
    if (again.consistency() == Consistency.TIMED_OUT) {
      assertTrue(held >= Duration.ofSeconds(4).toNanos(), "held " + held + " ns, not the consistency timeout");
    } else {
      // A bookmark moved the watch past the write before the timeout.
      assertEquals(Consistency.CONSISTENT, again.consistency(), "held " + held + " ns");
    }
  }

  @Test
  void aWriteThroughTheItemsObjectsNamesItsLease() throws Exception {
    // The daemon checks a write's reconcile_lease is a lease id a WorkItem gave: an option the call gives overrides
    // the item's, so a made-up one is refused naming the field, which shows the field is what the item sets.
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("a", "v"));
    CompletableFuture<StatusRuntimeException> refused = new CompletableFuture<>();
    CompletableFuture<String> written = new CompletableFuture<>();
    Passes rec = new Passes(item -> {
      try {
        item.objects().patch("configmaps", ns, "a", PatchType.MERGE, "{\"data\":{\"x\":\"1\"}}",
            ObjectOption.reconcileLease("not-a-lease"));
        refused.complete(null);
      } catch (StatusRuntimeException e) {
        refused.complete(e);
      }
      KubeObject patched = item.objects().patch("configmaps", ns, "a", PatchType.MERGE, "{\"data\":{\"x\":\"2\"}}");
      written.complete(patched.resourceVersion());
      return Reconciler.Result.done();
    });
    reconciling(app, queueSpec("java-names", ns), rec);
    rec.next();
    StatusRuntimeException e = refused.get(WAIT_FOR.toSeconds(), TimeUnit.SECONDS);
    assertNotNull(e, "a made-up lease id was accepted");
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode(), e.toString());
    assertTrue(e.getStatus().getDescription().startsWith("reconcile_lease: "), e.toString());
    // The write under the item's own lease went through and, being the lease's own, brings no pass; a change by
    // anyone else does, and that pass shows the own write.
    String rv = written.get(WAIT_FOR.toSeconds(), TimeUnit.SECONDS);
    rec.quiet(Duration.ofMillis(1500));
    app.objects().patch("configmaps", ns, "a", PatchType.MERGE, "{\"data\":{\"y\":\"3\"}}");
    WorkItem again = rec.next().item();
    assertTrue(Long.parseLong(again.object().resourceVersion()) > Long.parseLong(rv),
        "the next pass shows the pass's own write " + rv + ": " + again.object().resourceVersion());
    assertEquals(Consistency.CONSISTENT, again.consistency());
  }

  @Test
  void aQueueFilteringOnLabelsHandsOutTheFirstStateAndALabelChangeButNotADataChange() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("a", "v"));
    Passes rec = new Passes(item -> Reconciler.Result.done());
    reconciling(app, queueSpec("java-changes", ns).onlyChangesOf(QueueSpec.Changed.LABELS), rec);
    WorkItem first = rec.next().item();
    assertEquals("a", first.name(), "an object's first state is handed out");
    assertTrue(hasData(first, "v"), first.object().json());

    patchData(daemons.other(), ns, "a", "changed");
    rec.quiet(Duration.ofSeconds(2)); // a change of nothing the filter names
    daemons.other().objects().patch("configmaps", ns, "a", PatchType.MERGE,
        "{\"metadata\":{\"labels\":{\"tier\":\"web\"}}}");
    WorkItem labelled = rec.next().item();
    assertEquals("a", labelled.name());
    assertTrue(labelled.object().json().contains("\"tier\":\"web\""), labelled.object().json());
    assertTrue(hasData(labelled, "changed"), "the pass sees the newest state: " + labelled.object().json());
    rec.quiet(Duration.ofSeconds(1));
  }

  @Test
  void aQueueWithAFinalizerHoldsADeletedObjectUntilItsFinalizePassIsDone() throws Exception {
    String finalizer = "sdk.consistd.io/java-cleanup";
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    app.objects().create("configmaps", ns, Daemons.configMap("a", "v"));
    AtomicInteger finalizePasses = new AtomicInteger();
    Passes rec = new Passes(item -> {
      if (item.finalizing() && finalizePasses.incrementAndGet() == 1) {
        throw new IllegalStateException("the cleanup failed");
      }
      return Reconciler.Result.done();
    });
    reconciling(app, queueSpec("java-finalizer", ns).finalizer(finalizer), rec);
    WorkItem first = rec.next().item();
    assertFalse(first.finalizing(), first.toString());
    assertTrue(first.object().json().contains("\"finalizers\":[\"" + finalizer + "\"]"),
        "the first pass comes once the object carries the finalizer: " + first.object().json());

    // Deleted, the object stays and comes as a finalize pass; a failed one keeps the finalizer and comes again.
    daemons.other().objects().delete("configmaps", ns, "a");
    WorkItem failed = rec.next().item();
    assertTrue(failed.finalizing(), failed.toString());
    assertFalse(failed.deleted(), "the object is still there: " + failed);
    assertTrue(failed.object().json().contains("deletionTimestamp"), failed.object().json());
    WorkItem again = rec.next().item();
    assertTrue(again.finalizing(), again.toString());
    assertEquals(2, again.attempt());
    assertEquals("the cleanup failed", again.lastError());
    assertTrue(again.object().json().contains(finalizer), "a RETRY keeps the finalizer: " + again.object().json());

    // Done removes it: the object goes, and nothing more is handed out for it.
    Instant deadline = Instant.now().plus(WAIT_FOR);
    while (true) {
      try {
        app.objects().get("configmaps", ns, "a");
      } catch (StatusRuntimeException e) {
        assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode(), e.toString());
        break;
      }
      assertTrue(Instant.now().isBefore(deadline), "the finalizer was not removed after the finalize pass");
      Thread.sleep(50);
    }
    rec.quiet(Duration.ofSeconds(2));
    assertEquals(2, finalizePasses.get());
    rec.noOverlaps();
  }

  @Test
  void aRefusedSpecEndsRunWithTheDaemonsStatusNamingTheField() throws Exception {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    record Bad(QueueSpec spec, Status.Code code, String field) {}
    QueueSpec good = queueSpec("java-bad", ns);
    List<Bad> bad = List.of(
        new Bad(QueueSpec.of("", "configmaps").namespace(ns), Status.Code.INVALID_ARGUMENT, "spec.name"),
        new Bad(good.maxLeases(10001), Status.Code.INVALID_ARGUMENT, "spec.max_leases"),
        new Bad(good.maxLeases(-1), Status.Code.INVALID_ARGUMENT, "spec.max_leases"),
        new Bad(good.leaseTimeout(Duration.ofMillis(1)), Status.Code.INVALID_ARGUMENT, "spec.lease_timeout"),
        new Bad(good.related(new QueueSpec.Related("configmaps", "", "", "", null, "")),
            Status.Code.INVALID_ARGUMENT, "spec.related[0].maps_by"),
        new Bad(good.finalizer("cleanup"), Status.Code.INVALID_ARGUMENT, "spec.finalizer"),
        new Bad(QueueSpec.of(good.name(), "nosuchthings").namespace(ns), Status.Code.NOT_FOUND, "spec.primary"));
    for (Bad b : bad) {
      Reconciler reconciler = new Reconciler(app, b.spec(), item -> {
        fail(b.field() + ": a pass ran under a refused spec");
        return null;
      });
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class, reconciler::run, b.field());
      assertEquals(b.code(), e.getStatus().getCode(), e.toString());
      assertTrue(e.getStatus().getDescription().startsWith(b.field() + ": "), e.toString());
    }
  }

  @Test
  void itKeepsGoingWhenTheDaemonIsKilledAndStartedAgain() throws Exception {
    try (OwnDaemon d = new OwnDaemon("sdk-java-reconcile")) {
      ConsistdClient c = daemons.ready(d.socket());
      ConsistdClient shared = daemons.app();
      String ns = daemons.namespace(shared);
      shared.objects().create("configmaps", ns, Daemons.configMap("before", "v"));
      Passes rec = new Passes(item -> Reconciler.Result.done());
      Running running = reconciling(c, queueSpec("java-restart", ns), rec);
      assertEquals("before", rec.next().item().name());

      d.kill();
      d.start();
      shared.objects().create("configmaps", ns, Daemons.configMap("after", "v"));
      while (!rec.next().item().name().equals("after")) {
        // the restarted daemon lists every key again: "before" may come first
      }
      assertFalse(running.result.isDone(), "run ended across the restart: " + running.result.getNow(null));
      rec.noOverlaps();
    }
  }

  @Test
  void aShardedSpecIsSentWithItsElectionAndAQueueIsNotShardedUnlessAsked() {
    QueueSpec spec = QueueSpec.of("web", "configmaps").election("web", "leases").sharded(true).namespace("ns");
    assertTrue(spec.sharded(), "the other options keep it");
    consistd.v1.Reconcile.QueueSpec sent = spec.toProto().getSpec();
    assertTrue(sent.getSharded());
    assertEquals("web", sent.getElection().getElection());
    assertEquals("leases", sent.getElection().getNamespace());
    assertFalse(QueueSpec.of("web", "configmaps").election("web", "").toProto().getSpec().getSharded());
    assertFalse(spec.sharded(false).toProto().getSpec().getSharded());
    assertFalse(new QueueSpec("web", "configmaps", "", "", "", List.of(), 0, null, null, null).sharded(),
        "the constructors without it make a spec that is not sharded");
    // Without an election it goes as it is: the daemon refuses it, naming spec.sharded.
    consistd.v1.Reconcile.QueueSpec alone = QueueSpec.of("web", "configmaps").sharded(true).toProto().getSpec();
    assertTrue(alone.getSharded());
    assertFalse(alone.hasElection());
  }

  @Test
  void aShardedSpecIsSentWithItsShardByAndByKeyUnlessAsked() {
    QueueSpec spec = QueueSpec.of("web", "configmaps").election("web", "leases").sharded(true)
        .shardBy(QueueSpec.ShardBy.NAMESPACE).maxLeases(4).labelSelector("app=web");
    assertEquals(QueueSpec.ShardBy.NAMESPACE, spec.shardBy());
    assertEquals(QueueSpec.ShardBy.NAMESPACE, spec.leaseTimeout(Duration.ofMinutes(1)).view(ObjectView.onlyMetadata())
        .related(QueueSpec.Related.controllerOwner("pods", "")).retry(QueueSpec.Retry.DEFAULTS.burst(5)).namespace("")
        .fieldSelector("").election("web", "other").sharded(true).shardBy(), "the other options keep it");
    consistd.v1.Reconcile.QueueSpec sent = spec.toProto().getSpec();
    assertEquals(consistd.v1.Reconcile.ShardBy.SHARD_BY_NAMESPACE, sent.getShardBy());
    assertTrue(sent.getSharded(), "it keeps the other options");
    assertEquals("web", sent.getElection().getElection());
    assertEquals("leases", sent.getElection().getNamespace());
    assertEquals(4, sent.getMaxLeases());
    assertEquals("app=web", sent.getPrimary().getLabelSelector());
    assertEquals(consistd.v1.Reconcile.ShardBy.SHARD_BY_KEY,
        spec.shardBy(QueueSpec.ShardBy.KEY).toProto().getSpec().getShardBy());
    // By default, and with null, none is sent (SHARD_BY_UNSPECIFIED: by key), and the spec is otherwise the same.
    QueueSpec byDefault = QueueSpec.of("web", "configmaps").election("web", "leases").sharded(true).maxLeases(4)
        .labelSelector("app=web");
    assertNull(byDefault.shardBy());
    assertEquals(consistd.v1.Reconcile.ShardBy.SHARD_BY_UNSPECIFIED, byDefault.toProto().getSpec().getShardBy());
    assertEquals(sent.toBuilder().clearShardBy().build(), byDefault.toProto().getSpec());
    assertEquals(byDefault, spec.shardBy(null));
    assertNull(new QueueSpec("web", "configmaps", "", "", "", List.of(), 0, null, null, null).shardBy(),
        "the constructors without it hash by key");
    assertNull(new QueueSpec("web", "configmaps", "", "", "", ObjectView.DEFAULT, List.of(), 0, null, null, null, true)
        .shardBy());
    // Without sharded it goes as it is: the daemon refuses it, naming spec.shard_by.
    consistd.v1.Reconcile.QueueSpec alone =
        QueueSpec.of("web", "configmaps").shardBy(QueueSpec.ShardBy.NAMESPACE).toProto().getSpec();
    assertEquals(consistd.v1.Reconcile.ShardBy.SHARD_BY_NAMESPACE, alone.getShardBy());
    assertFalse(alone.getSharded());
  }

  @Test
  void theChangesNamedGoOnTheQueryTheyAreAskedOfAndNoneNamedSendsNoFilter() {
    QueueSpec spec = QueueSpec.of("web", "deployments.apps")
        .onlyChangesOf(QueueSpec.Changed.GENERATION)
        .onlyChangesOf(QueueSpec.Changed.LABELS, QueueSpec.Changed.GENERATION)
        .related(QueueSpec.Related.controllerOwner("pods", "").onlyChangesOf(QueueSpec.Changed.ANNOTATIONS),
            QueueSpec.Related.byLabel("configmaps", "", "app"));
    consistd.v1.Reconcile.QueueSpec sent = spec.toProto().getSpec();
    assertEquals(ChangeFilter.newBuilder().setGeneration(true).setLabels(true).build(), sent.getPrimary().getChanges(),
        "the primary's: both parts named, one call after the other");
    assertEquals(ChangeFilter.newBuilder().setAnnotations(true).build(), sent.getRelated(0).getQuery().getChanges(),
        "a related query's: its own");
    assertFalse(sent.getRelated(1).getQuery().hasChanges(), "a related query naming none sends no filter");

    // None named, by default or with an empty call, sends no filter (every change): one naming nothing is refused.
    assertFalse(QueueSpec.of("web", "configmaps").toProto().getSpec().getPrimary().hasChanges());
    assertFalse(QueueSpec.of("web", "configmaps").onlyChangesOf().toProto().getSpec().getPrimary().hasChanges());
    assertFalse(QueueSpec.of("web", "configmaps").related(QueueSpec.Related.byField("secrets", "", "spec.x")
        .onlyChangesOf()).toProto().getSpec().getRelated(0).getQuery().hasChanges());
    assertFalse(QueueSpec.of("web", "configmaps").related(QueueSpec.Related.byLabel("pods", "", "app")
        .onlyChangesOf(QueueSpec.Changed.LABELS)).toProto().getSpec().getPrimary().hasChanges(),
        "a related query's filter is not the primary's");
    assertFalse(QueueSpec.of("web", "configmaps").onlyChangesOf(QueueSpec.Changed.LABELS)
        .related(QueueSpec.Related.byLabel("pods", "", "app")).toProto().getSpec().getRelated(0).getQuery()
        .hasChanges(), "the primary's filter is not a related query's");

    // The other options keep the parts, and the constructors without them name none.
    Set<QueueSpec.Changed> named = Set.of(QueueSpec.Changed.GENERATION, QueueSpec.Changed.LABELS);
    assertEquals(named, spec.namespace("ns").labelSelector("a=b").fieldSelector("c=d").view(ObjectView.onlyMetadata())
        .related(QueueSpec.Related.byLabel("secrets", "", "app")).maxLeases(3).retry(QueueSpec.Retry.DEFAULTS)
        .leaseTimeout(Duration.ofMinutes(1)).election("web", "").sharded(true).shardBy(QueueSpec.ShardBy.KEY)
        .changes());
    assertEquals(Set.of(QueueSpec.Changed.ANNOTATIONS), QueueSpec.Related.controllerOwner("pods", "")
        .onlyChangesOf(QueueSpec.Changed.ANNOTATIONS).labelSelector("a=b").fieldSelector("c=d")
        .view(ObjectView.onlyMetadata()).priority(2).changes());
    assertEquals(Set.of(), new QueueSpec("web", "configmaps", "", "", "", ObjectView.DEFAULT, List.of(), 0, null, null,
        null, false, null).changes());
    assertEquals(Set.of(), new QueueSpec("web", "configmaps", "", "", "", ObjectView.DEFAULT, List.of(), 0, null, null,
        null, false, null, null).changes(), "null is none");
    assertEquals(Set.of(), new QueueSpec.Related("pods", "", "", "", ObjectView.DEFAULT,
        QueueSpec.Related.MapsBy.CONTROLLER_OWNER, "", 0).changes());
    assertThrows(NullPointerException.class, () -> spec.onlyChangesOf((QueueSpec.Changed) null));
  }

  @Test
  void theFinalizerNamedGoesOnTheSpecSentAndNoneSendsItEmpty() {
    QueueSpec spec = QueueSpec.of("web", "configmaps").finalizer("example.com/cleanup");
    assertEquals("example.com/cleanup", spec.toProto().getSpec().getFinalizer());
    assertEquals("example.com/other", spec.finalizer("example.com/other").toProto().getSpec().getFinalizer(),
        "the last one named");
    // A name the daemon refuses goes as is, for it to refuse naming spec.finalizer.
    assertEquals("cleanup", spec.finalizer("cleanup").toProto().getSpec().getFinalizer());

    // None by default, with null and with empty: the field is empty.
    assertEquals("", QueueSpec.of("web", "configmaps").toProto().getSpec().getFinalizer());
    assertEquals("", spec.finalizer(null).toProto().getSpec().getFinalizer());
    assertEquals("", spec.finalizer("").toProto().getSpec().getFinalizer());
    assertEquals(QueueSpec.of("web", "configmaps"), spec.finalizer(null), "null is none");

    // The other options keep it, and the constructors without it name none.
    QueueSpec all = spec.namespace("ns").labelSelector("a=b").fieldSelector("c=d").view(ObjectView.onlyMetadata())
        .onlyChangesOf(QueueSpec.Changed.GENERATION).related(QueueSpec.Related.byLabel("secrets", "", "app"))
        .maxLeases(3).retry(QueueSpec.Retry.DEFAULTS).leaseTimeout(Duration.ofMinutes(1)).election("web", "")
        .sharded(true).shardBy(QueueSpec.ShardBy.KEY);
    assertEquals("example.com/cleanup", all.finalizer());
    assertEquals("example.com/cleanup", all.toProto().getSpec().getFinalizer());
    assertEquals("", new QueueSpec("web", "configmaps", "", "", "", ObjectView.DEFAULT, List.of(), 0, null, null,
        null, false, null, Set.of()).finalizer());
    assertEquals("", new QueueSpec("web", "configmaps", "", "", "", List.of(), 0, null, null, null).finalizer());
  }

  @Test
  void anItemIsAFinalizePassWhenTheDaemonSaysSo() {
    try (ConsistdClient client = new ConsistdClient("/nonexistent/consistd.sock")) {
      consistd.v1.Reconcile.WorkItem sent = consistd.v1.Reconcile.WorkItem.newBuilder()
          .setLeaseId("l").setNamespace("ns").setName("a").setAttempt(2).setLastError("no").setFinalizing(true)
          .build();
      QueueSpec spec = QueueSpec.of("q", "configmaps");
      WorkItem finalize = WorkItem.from(sent, client, spec);
      assertTrue(finalize.finalizing(), finalize.toString());
      assertEquals(2, finalize.attempt());
      assertEquals("no", finalize.lastError());
      assertFalse(WorkItem.from(sent.toBuilder().setFinalizing(false).build(), client, spec).finalizing());
      assertFalse(WorkItem.from(sent.toBuilder().clearFinalizing().setDeleted(true).build(), client, spec)
          .finalizing(), "a deletion is no finalize pass");
    }
  }

  @Test
  void aPassesEndIsItsCompletion() {
    Completion done = Reconciler.completion("l", Reconciler.Result.done(), null);
    assertEquals(Outcome.OUTCOME_DONE, done.getOutcome());
    assertEquals("l", done.getLeaseId());
    assertEquals(Outcome.OUTCOME_DONE, Reconciler.completion("l", null, null).getOutcome());
    Completion requeue = Reconciler.completion("l", Reconciler.Result.requeue(Duration.ofSeconds(2)), null);
    assertEquals(Outcome.OUTCOME_REQUEUE, requeue.getOutcome());
    assertEquals(2, requeue.getRequeueAfter().getSeconds());
    Completion tiny = Reconciler.completion("l", Reconciler.Result.requeue(Duration.ofNanos(1)), null);
    assertEquals(1_000_000, tiny.getRequeueAfter().getNanos(), "at least 1 ms");
    Completion huge = Reconciler.completion("l", Reconciler.Result.requeue(Duration.ofDays(3)), null);
    assertEquals(Duration.ofHours(24).getSeconds(), huge.getRequeueAfter().getSeconds(), "at most 24 h");
    assertEquals(0, huge.getPriority(), "priority 0 unless asked");
    Completion urgent =
        Reconciler.completion("l", Reconciler.Result.requeue(Duration.ofSeconds(1)).withPriority(7), null);
    assertEquals(7, urgent.getPriority());
    assertEquals(-2, Reconciler.completion("l", Reconciler.Result.done().withPriority(-2), null).getPriority());
    assertEquals(5, QueueSpec.Related.byLabel("secrets", "ns", "owner").priority(5).toProto().getPriority());
    Completion retry = Reconciler.completion("l", Reconciler.Result.requeue(Duration.ofHours(1)),
        new IllegalStateException("no"));
    assertEquals(Outcome.OUTCOME_RETRY, retry.getOutcome(), "an exception wins");
    assertEquals("no", retry.getError());
    assertEquals("java.lang.NullPointerException",
        Reconciler.completion("l", null, new NullPointerException()).getError(), "no message: what it is");
    Completion terminal = Reconciler.completion("l", null,
        new RuntimeException("wrapped", new TerminalException("cannot")));
    assertEquals(Outcome.OUTCOME_TERMINAL, terminal.getOutcome());
    assertEquals("wrapped", terminal.getError());
    String big = "é".repeat(3000);
    String cut = Reconciler.completion("l", null, new RuntimeException(big)).getError();
    assertEquals(Reconciler.MAX_COMPLETION_ERROR, cut.getBytes(java.nio.charset.StandardCharsets.UTF_8).length);
  }
}
