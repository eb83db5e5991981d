// The client against real daemons: waiting until ready, reads and writes, writes that would change nothing answered
// unchanged, errors as the daemon sent them.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.consistd.client.ObjectOption.Guard;
import io.consistd.client.ObjectsClient.PatchType;
import io.consistd.client.WatchEvent.Consistency;
import io.consistd.client.WatchEvent.Type;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

class ClientTest {
  private static final Daemons daemons = new Daemons();

  @AfterAll
  static void cleanUp() throws InterruptedException {
    daemons.close();
  }

  @Test
  void waitReadyGivesUpNamingTheSocketAndTheLastAnswer() throws Exception {
    Path missing = Files.createTempDirectory("consistd-java").resolve("absent.sock");
    try (ConsistdClient client = new ConsistdClient(missing.toString())) {
      long started = System.nanoTime();
      NotReadyException e = assertThrows(NotReadyException.class, () -> client.waitReady(Duration.ofMillis(500)));
      long waited = (System.nanoTime() - started) / 1_000_000;
      assertTrue(waited >= 450 && waited < 5_000, "waited " + waited + " ms for a 500 ms timeout");
      assertEquals(missing.toString(), e.socket());
      assertTrue(e.getMessage().contains(missing.toString()) && e.getMessage().contains("UNAVAILABLE"), e.getMessage());
    }
  }

  @Test
  void theNoArgumentClientUsesConsistdSocket() {
    try (ConsistdClient client = new ConsistdClient()) {
      assertEquals(Daemons.env("CONSISTD_SOCKET"), client.socket());
    }
  }

  @Test
  void objectsAreCreatedReadPatchedListedAndDeleted() throws InterruptedException {
    ConsistdClient client = daemons.app();
    String ns = daemons.namespace(client);
    ObjectsClient objects = client.objects();
    KubeObject created = objects.create("configmaps", ns, Daemons.configMap("settings", "one"));
    assertEquals(ns + "/settings", created.toString());
    assertTrue(created.json().contains("\"one\""), created.json());

    KubeObject read = objects.get("configmaps", ns, "settings", ObjectOption.readYourWrites());
    assertEquals(created.uid(), read.uid());

    KubeObject patched = objects.patch(
        "configmaps", ns, "settings", PatchType.MERGE, "{\"data\":{\"k\":\"two\"}}");
    assertTrue(Long.parseLong(patched.resourceVersion()) > Long.parseLong(created.resourceVersion()));
    assertTrue(patched.json().contains("\"two\""), patched.json());

    ObjectsClient.ObjectList list = objects.list("configmaps", ns, Daemons.LABEL, ObjectOption.readYourWrites());
    assertEquals(1, list.objects().size(), list.toString());
    assertEquals(patched.resourceVersion(), list.objects().get(0).resourceVersion());

    Optional<KubeObject> deleted = objects.delete(
        "configmaps", ns, "settings", ObjectOption.preconditions(created.uid(), ""));
    assertTrue(deleted.isEmpty() || deleted.get().uid().equals(created.uid()), deleted.toString());
    StatusRuntimeException gone = assertThrows(
        StatusRuntimeException.class, () -> objects.get("configmaps", ns, "settings", ObjectOption.readYourWrites()));
    assertEquals(Status.Code.NOT_FOUND, gone.getStatus().getCode(), gone.toString());
  }

  // The sidecar answers a write that would change nothing from a synced watch's cache only, so a watch of the namespace
  // is open and synced first. Each answer is recorded as an own write: the change's state still reaches the watch.
  @Test
  @Timeout(value = 60, unit = TimeUnit.SECONDS)
  void aWriteThatWouldChangeNothingComesBackUnchangedUnlessSentAnyway() throws InterruptedException {
    ConsistdClient client = daemons.app();
    String ns = daemons.namespace(client);
    ObjectsClient objects = client.objects();
    KubeObject created = objects.create("configmaps", ns, Daemons.configMap("cfg", "one"));
    assertFalse(created.unchanged(), "a create");
    String same = "{\"data\":{\"k\":\"one\"}}";
    try (Watch watch = client.watch(WatchRequest.of("configmaps").namespace(ns).labelSelector(Daemons.LABEL))) {
      while (watch.next().type() != Type.SYNCED) {
        // the snapshot
      }
      KubeObject patched = objects.patch("configmaps", ns, "cfg", PatchType.MERGE, same);
      assertTrue(patched.unchanged(), "a merge patch that changes nothing is answered from the cache");
      assertEquals(created.resourceVersion(), patched.resourceVersion(), "the cached object");
      KubeObject updated = objects.update("configmaps", ns, "cfg", created.json());
      assertTrue(updated.unchanged(), "the object as created, written back, changes nothing");
      assertFalse(client.predatesOwnWrite(updated), "the cached object predates no own write");

      KubeObject sentPatch =
          objects.patch("configmaps", ns, "cfg", PatchType.MERGE, same, ObjectOption.sendUnchanged());
      assertFalse(sentPatch.unchanged(), "sendUnchanged: the apiserver answered the patch");
      KubeObject sentUpdate = objects.update("configmaps", ns, "cfg", created.json(), ObjectOption.sendUnchanged());
      assertFalse(sentUpdate.unchanged(), "sendUnchanged: the apiserver answered the update");

      KubeObject changed = objects.patch("configmaps", ns, "cfg", PatchType.MERGE, "{\"data\":{\"k\":\"two\"}}");
      assertFalse(changed.unchanged(), "a patch that changes the object");
      assertTrue(Long.parseLong(changed.resourceVersion()) > Long.parseLong(created.resourceVersion()));
      WatchEvent own;
      do {
        own = watch.next();
      } while (own.object() == null || !own.object().resourceVersion().equals(changed.resourceVersion()));
      assertEquals(Type.MODIFIED, own.type(), own.toString());
      assertEquals(Consistency.OWN_WRITE, own.consistency(), own.toString());
      assertFalse(own.object().unchanged(), "only a write's answer is ever unchanged");
    }
    assertFalse(objects.get("configmaps", ns, "cfg").unchanged(), "a read");
  }

  @Test
  void badInputIsRefusedWithTheCodeAndTheFieldTheDaemonNamed() throws InterruptedException {
    ObjectsClient objects = daemons.app().objects();
    StatusRuntimeException noResource = assertThrows(
        StatusRuntimeException.class, () -> objects.get("", "default", "x"));
    assertEquals(Status.Code.INVALID_ARGUMENT, noResource.getStatus().getCode());
    assertTrue(noResource.getStatus().getDescription().contains("resource"), noResource.toString());

    StatusRuntimeException termZero = assertThrows(StatusRuntimeException.class, () -> objects.patch(
        "configmaps", "default", "x", PatchType.MERGE, "{}", ObjectOption.guard(new Guard("e", "", 0))));
    assertEquals(Status.Code.INVALID_ARGUMENT, termZero.getStatus().getCode());
    assertTrue(termZero.getStatus().getDescription().contains("guard.term"), termZero.toString());
  }

  @Test
  void aGuardedWriteOfATermThisDaemonDoesNotLeadIsRefused() throws InterruptedException {
    ConsistdClient client = daemons.app();
    String ns = daemons.namespace(client);
    client.objects().create("configmaps", ns, Daemons.configMap("fenced", "one"));
    StatusRuntimeException refused = assertThrows(StatusRuntimeException.class, () -> client.objects().patch(
        "configmaps", ns, "fenced", PatchType.MERGE, "{\"data\":{\"k\":\"two\"}}",
        ObjectOption.guard(new Guard("java-sdk-nobody-leads", ns, 7))));
    assertEquals(Status.Code.FAILED_PRECONDITION, refused.getStatus().getCode(), refused.toString());
  }

  @Test
  void theOwnWriteRecordKeepsTheLargestVersionAndComparesIntegersOnly() {
    OwnWrites writes = new OwnWrites();
    writes.record(new KubeObject("u", "ns", "a", "20", "{}"));
    writes.record(new KubeObject("u", "ns", "a", "10", "{}"));
    assertTrue(writes.predates(new KubeObject("u", "ns", "a", "19", "{}")));
    assertTrue(!writes.predates(new KubeObject("u", "ns", "a", "20", "{}")));
    assertTrue(!writes.predates(new KubeObject("u", "ns", "a", "abc", "{}")), "opaque versions are never compared");
    assertTrue(!writes.predates(new KubeObject("v", "ns", "b", "1", "{}")), "another object");
    // It keeps at least the last GENERATION objects written, forgetting the oldest first.
    for (int i = 0; i < OwnWrites.GENERATION; i++) {
      writes.record(new KubeObject("x" + i, "ns", "x", "5", "{}"));
    }
    assertTrue(writes.predates(new KubeObject("x0", "ns", "x", "4", "{}")));
    for (int i = 0; i < OwnWrites.GENERATION; i++) {
      writes.record(new KubeObject("y" + i, "ns", "y", "5", "{}"));
    }
    assertTrue(!writes.predates(new KubeObject("u", "ns", "a", "19", "{}")), "two generations later, forgotten");
  }
}
