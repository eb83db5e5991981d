// Rollout channels: refusals naming the field or the guard on hack/with-daemons.sh's daemon; and, on two daemons of
// the test's own with peer addresses, publish, subscribe and report on both, the barrier, and a subscription resumed
// across a daemon restart.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.function.Executable;

@Timeout(value = 120, unit = TimeUnit.SECONDS)
class RolloutTest {
  private static final Duration WAIT_FOR = Duration.ofSeconds(20);

  private static final Daemons daemons = new Daemons();

  @AfterAll
  static void cleanUp() throws InterruptedException {
    daemons.close();
  }

  private static void refused(Status.Code code, String prefix, Executable call) {
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, call, prefix);
    assertEquals(code, e.getStatus().getCode(), e.toString());
    assertTrue(e.getStatus().getDescription().startsWith(prefix), e.toString());
  }

  private static byte[] utf8(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void badRequestsNameTheFieldAndASidecarWithoutAPeerAddressCannotSubscribe() throws InterruptedException {
    // Daemon a of hack/with-daemons.sh has no peer address, so it cannot be a channel's member.
    Rollout rollout = new Rollout(daemons.app());
    String channel = "java-" + UUID.randomUUID().toString().substring(0, 8);
    refused(Status.Code.INVALID_ARGUMENT, "channel:", () -> rollout.reportApplied("Bad!", 1));
    refused(Status.Code.INVALID_ARGUMENT, "version:", () -> rollout.reportApplied(channel, 0));
    refused(Status.Code.INVALID_ARGUMENT, "timeout:", () -> rollout.waitApplied(channel, 1, Duration.ofHours(2)));
    refused(Status.Code.INVALID_ARGUMENT, "version:", () -> rollout.waitApplied(channel, 0, Duration.ofSeconds(1)));
    refused(Status.Code.INVALID_ARGUMENT, "channel:", () -> rollout.status("", 0));
    StatusRuntimeException notMember = assertThrows(StatusRuntimeException.class,
        () -> rollout.reportApplied(channel, 1));
    assertEquals(Status.Code.FAILED_PRECONDITION, notMember.getStatus().getCode(), notMember.toString());
    // Nobody subscribes, so nobody leads it: a publish cannot be placed.
    StatusRuntimeException noLeader = assertThrows(StatusRuntimeException.class,
        () -> rollout.publish(channel, utf8("v1"), "text/plain"));
    assertEquals(Status.Code.UNAVAILABLE, noLeader.getStatus().getCode(), noLeader.toString());
    // A channel without members or versions.
    Rollout.RolloutStatus s = rollout.status(channel, 0);
    assertEquals(List.of(), s.members());
    assertEquals(0, s.latestVersion());
    assertFalse(s.allApplied());
    try (Rollout.Versions versions = rollout.subscribeVersions(channel)) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class, versions::hasNext);
      assertEquals(Status.Code.FAILED_PRECONDITION, e.getStatus().getCode(), e.toString());
      assertFalse(versions.hasNext(), "a refused subscription is over");
    }
  }

  @Test
  void aGuardedPublishOfATermThisSidecarDoesNotLeadIsRefusedNamingTheGuard() throws InterruptedException {
    ConsistdClient app = daemons.app();
    String ns = daemons.namespace(app);
    Rollout rollout = new Rollout(app);
    String channel = "java-" + UUID.randomUUID().toString().substring(0, 8);
    // Unguarded, this publish would be UNAVAILABLE (nobody subscribes, so nobody leads the channel): the guard is
    // checked first, against an election this sidecar takes no part in.
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> rollout.publish(
        channel, utf8("v1"), "text/plain", new ObjectOption.Guard("java-sdk-nobody-leads", ns, 7)));
    assertEquals(Status.Code.FAILED_PRECONDITION, e.getStatus().getCode(), e.toString());
    String why = e.getStatus().getDescription();
    assertTrue(why.startsWith("guard: ") && why.contains(ns + "/java-sdk-nobody-leads") && why.contains("term 7"),
        e.toString());
  }

  /** A replica of the test's own in {@code ns}: a peer address of its own, a 3 s membership TTL. */
  private static OwnDaemon replica(String ns, String identity) throws Exception {
    String address = "127.0.0.1:" + OwnDaemon.freePort();
    return new OwnDaemon(identity,
        "namespace: " + ns,
        "peer:",
        "  listen: \"" + address + "\"",
        "  advertise: \"" + address + "\"",
        "  insecure: true",
        "membership:",
        "  ttl: 3s",
        "outbox:",
        "  backoff: {initial: 20ms, factor: 2, cap: 500ms}");
  }

  /** The next version, failing the test after WAIT_FOR. */
  private static Rollout.Version next(Rollout.Versions versions) throws Exception {
    CompletableFuture<Rollout.Version> next = CompletableFuture.supplyAsync(versions::next);
    try {
      return next.get(WAIT_FOR.toSeconds(), TimeUnit.SECONDS);
    } catch (java.util.concurrent.TimeoutException e) {
      versions.close();
      throw new AssertionError("no version within " + WAIT_FOR, e);
    }
  }

  @Test
  void aVersionPublishedOnOneReplicaIsAppliedOnBothAndTheBarrierOpens() throws Exception {
    String ns = daemons.namespace(daemons.app());
    String channel = "config";
    try (OwnDaemon a = replica(ns, "java-a"); OwnDaemon b = replica(ns, "java-b")) {
      ConsistdClient ca = daemons.ready(a.socket());
      ConsistdClient cb = daemons.ready(b.socket());
      Rollout ra = new Rollout(ca);
      Rollout rb = new Rollout(cb);
      try (Rollout.Versions va = ra.subscribeVersions(channel); Rollout.Versions vb = rb.subscribeVersions(channel)) {
        // Subscribing is joining: wait until both are members (and one leads).
        CompletableFuture<Boolean> aHas = CompletableFuture.supplyAsync(va::hasNext);
        CompletableFuture<Boolean> bHas = CompletableFuture.supplyAsync(vb::hasNext);
        long deadline = System.nanoTime() + WAIT_FOR.toNanos();
        while (ra.status(channel, 0).members().size() < 2) {
          if (System.nanoTime() > deadline) {
            fail("the replicas did not both join within " + WAIT_FOR + ": " + ra.status(channel, 0));
          }
          Thread.sleep(50);
        }
        long v1 = publishWhenLed(ra, channel, "v1");
        assertEquals(1, v1);
        assertTrue(aHas.get(WAIT_FOR.toSeconds(), TimeUnit.SECONDS));
        assertTrue(bHas.get(WAIT_FOR.toSeconds(), TimeUnit.SECONDS));
        for (Rollout.Versions versions : List.of(va, vb)) {
          Rollout.Version v = next(versions);
          assertEquals(channel, v.channel());
          assertEquals(1, v.version());
          assertArrayEquals(utf8("v1"), v.payload());
          assertEquals("text/plain", v.contentType());
          assertNotNull(v.publishedAt());
        }
        ra.reportApplied(channel, 1);
        Rollout.Barrier notYet = ra.waitApplied(channel, 1, Duration.ofMillis(500));
        assertFalse(notYet.allApplied(), notYet.toString());
        // a's report may not have reached the barrier yet either; b has not reported.
        assertTrue(notYet.lagging().contains("java-b"), notYet.toString());
        rb.reportApplied(channel, 1);
        Rollout.Barrier opened = ra.waitApplied(channel, 1, WAIT_FOR);
        assertTrue(opened.allApplied(), opened.toString());
        assertEquals(List.of(), opened.lagging());
        // b reads the group from its own watch of the member Leases, which may show a's record a moment after
        // a's barrier opened: b's status says so once its watch has caught up.
        Rollout.RolloutStatus status = rb.status(channel, 0);
        long caughtUp = System.nanoTime() + WAIT_FOR.toNanos();
        while (!status.allApplied() && System.nanoTime() < caughtUp) {
          Thread.sleep(50);
          status = rb.status(channel, 0);
        }
        assertEquals(1, status.latestVersion());
        assertTrue(status.allApplied(), status.toString());
        assertEquals(2, status.members().size());
        assertTrue(status.members().stream().allMatch(m -> m.live() && m.appliedVersion() == 1), status.toString());

        // b's sidecar restarts (SIGTERM: it resigns, so a leads at once): its subscription opens again, the latest
        // (v1) is not handed out twice, and the next version published on b arrives on both.
        b.stop();
        b.start();
        cb.waitReady(WAIT_FOR);
        long v2 = publishWhenLed(rb, channel, "v2");
        assertEquals(2, v2);
        for (Rollout.Versions versions : List.of(va, vb)) {
          Rollout.Version v = next(versions);
          assertEquals(2, v.version(), "after a reconnect, the version after the last one taken");
          assertArrayEquals(utf8("v2"), v.payload());
        }
      }
    }
  }

  /** Publishes once a replica leads the channel (UNAVAILABLE until then), returning the version. */
  private static long publishWhenLed(Rollout rollout, String channel, String payload) throws InterruptedException {
    long deadline = System.nanoTime() + WAIT_FOR.toNanos();
    while (true) {
      try {
        return rollout.publish(channel, utf8(payload), "text/plain");
      } catch (StatusRuntimeException e) {
        if (e.getStatus().getCode() != Status.Code.UNAVAILABLE || System.nanoTime() > deadline) {
          throw e;
        }
        Thread.sleep(100);
      }
    }
  }
}
