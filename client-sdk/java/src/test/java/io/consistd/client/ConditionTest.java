// Status conditions without a daemon: the request a work item's setCondition sends (the queue's primary, the item's
// key and lease, the status mapped, the handed object's generation), the own-write record of a condition set (only
// a write it made), and how the handed object's metadata.generation is read.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import consistd.v1.Object.WriteGuard;
import consistd.v1.Objects.SetConditionRequest;
import consistd.v1.Objects.SetConditionResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.util.OptionalLong;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 30, unit = TimeUnit.SECONDS)
class ConditionTest {
  private static consistd.v1.Object.KubeObject object(String rv, String json) {
    return consistd.v1.Object.KubeObject.newBuilder().setUid("u").setNamespace("ns").setName("w")
        .setResourceVersion(rv).setJson(ByteString.copyFrom(json, StandardCharsets.UTF_8)).build();
  }

  private static SetConditionResponse answer(boolean changed, String rv, String transition) {
    return SetConditionResponse.newBuilder().setChanged(changed).setLastTransitionTime(transition)
        .setObject(object(rv, "{\"metadata\":{\"name\":\"w\"}}")).build();
  }

  /** An item of lease l in term 7, handed a Widget of generation 4 unless {@code json} is null (no object). */
  private static consistd.v1.Reconcile.WorkItem item(String json) {
    consistd.v1.Reconcile.WorkItem.Builder item = consistd.v1.Reconcile.WorkItem.newBuilder()
        .setLeaseId("l").setNamespace("ns").setName("w").setTerm(7).setAttempt(1);
    if (json != null) {
      item.setObject(object("10", json));
    }
    return item.build();
  }

  private static final String WIDGET = "{\"apiVersion\":\"example.com/v1\",\"kind\":\"Widget\",\"metadata\":{"
      + "\"name\":\"w\",\"namespace\":\"ns\",\"labels\":{\"generation\":\"9\"},\"generation\":4,"
      + "\"resourceVersion\":\"10\"},\"spec\":{\"generation\":8}}";

  @Test
  void anItemSetsItsConditionOnTheQueuesPrimaryWithItsGenerationAndLease() throws Exception {
    FakeObjectsSidecar sidecar = new FakeObjectsSidecar();
    try (FakeSidecarServer server = new FakeSidecarServer(sidecar);
        ConsistdClient client = new ConsistdClient(server.socket)) {
      WorkItem item = WorkItem.from(item(WIDGET), client,
          QueueSpec.of("widgets", "widgets.example.com").election("web", "leases"));
      sidecar.setCondition.answers.add(answer(true, "11", "2026-12-07T11:20:22Z"));
      ObjectsClient.ConditionSet set = item.setCondition("Ready", ConditionStatus.FALSE, "Creating", "m");
      assertTrue(set.changed());
      assertEquals("2026-12-07T11:20:22Z", set.lastTransitionTime());
      assertEquals("11", set.object().resourceVersion());

      SetConditionRequest sent = sidecar.setCondition.request();
      assertEquals("widgets.example.com", sent.getResource(), "the queue's primary resource");
      assertEquals("ns", sent.getNamespace());
      assertEquals("w", sent.getName());
      assertEquals("Ready", sent.getCondition().getType());
      assertEquals(consistd.v1.Objects.ConditionStatus.CONDITION_STATUS_FALSE, sent.getCondition().getStatus());
      assertEquals("Creating", sent.getCondition().getReason());
      assertEquals("m", sent.getCondition().getMessage());
      assertEquals(4, sent.getCondition().getObservedGeneration(), "metadata.generation of the handed object");
      assertEquals("l", sent.getReconcileLease(), "made for the item's lease");
      assertEquals(WriteGuard.newBuilder().setElection("web").setNamespace("leases").setTerm(7).build(),
          sent.getGuard(), "guarded by the item's term in the queue's election");
      assertEquals("", sent.getFieldManager(), "the daemon's default prefix");

      // Each status as the daemon names it.
      sidecar.setCondition.answers.add(answer(true, "12", "t"));
      item.setCondition("Ready", ConditionStatus.TRUE, "Available", "");
      assertEquals(consistd.v1.Objects.ConditionStatus.CONDITION_STATUS_TRUE,
          sidecar.setCondition.request().getCondition().getStatus());
      sidecar.setCondition.answers.add(answer(true, "13", "t"));
      item.setCondition("Ready", ConditionStatus.UNKNOWN, "Checking", "");
      assertEquals(consistd.v1.Objects.ConditionStatus.CONDITION_STATUS_UNKNOWN,
          sidecar.setCondition.request().getCondition().getStatus());

      // No object handed out (a related object queued a missing primary), or one without a generation: 0, the
      // generation the daemon reads. Without an election: no guard.
      WorkItem bare = WorkItem.from(item(null), client, QueueSpec.of("widgets", "widgets.example.com"));
      sidecar.setCondition.answers.add(answer(false, "13", "t"));
      bare.setCondition("Ready", ConditionStatus.TRUE, "Available", "");
      SetConditionRequest unguarded = sidecar.setCondition.request();
      assertEquals(0, unguarded.getCondition().getObservedGeneration());
      assertFalse(unguarded.hasGuard());
      assertEquals("l", unguarded.getReconcileLease());
      WorkItem noGeneration = WorkItem.from(item("{\"metadata\":{\"name\":\"w\"}}"), client,
          QueueSpec.of("widgets", "widgets"));
      sidecar.setCondition.answers.add(answer(false, "13", "t"));
      noGeneration.setCondition("Ready", ConditionStatus.TRUE, "Available", "");
      assertEquals(0, sidecar.setCondition.request().getCondition().getObservedGeneration());

      // The daemon's error as it is.
      sidecar.setCondition.answers.add(Status.INVALID_ARGUMENT.withDescription("condition.reason: not CamelCase")
          .asRuntimeException());
      StatusRuntimeException refused = assertThrows(StatusRuntimeException.class,
          () -> item.setCondition("Ready", ConditionStatus.TRUE, "not camel", ""));
      assertEquals(Status.Code.INVALID_ARGUMENT, refused.getStatus().getCode());
      assertEquals("condition.reason: not CamelCase", refused.getStatus().getDescription());
      assertThrows(NullPointerException.class, () -> item.setCondition("Ready", null, "Available", ""));
    }
  }

  @Test
  void aConditionSetIsRecordedForTheOwnWriteRuleOnlyWhenItWrote() throws Exception {
    FakeObjectsSidecar sidecar = new FakeObjectsSidecar();
    try (FakeSidecarServer server = new FakeSidecarServer(sidecar);
        ConsistdClient client = new ConsistdClient(server.socket)) {
      ObjectsClient.Condition ready = new ObjectsClient.Condition("Ready", ConditionStatus.TRUE, "Available", "m");
      assertEquals(0, ready.observedGeneration(), "the generation the daemon reads");

      // Nothing written: the object as read is not this client's write.
      sidecar.setCondition.answers.add(answer(false, "20", "t"));
      ObjectsClient.ConditionSet read = client.objects().setCondition("widgets", "ns", "w", ready,
          ObjectOption.fieldManager("app"), ObjectOption.reconcileLease("l2"));
      assertFalse(read.changed());
      assertFalse(client.predatesOwnWrite(new KubeObject("u", "ns", "w", "19", "{}")), "an unchanged answer");
      SetConditionRequest sent = sidecar.setCondition.request();
      assertEquals("app", sent.getFieldManager(), "the field manager's prefix");
      assertEquals("l2", sent.getReconcileLease());
      assertEquals(0, sent.getCondition().getObservedGeneration());

      // Written: a state older than it predates the client's own write.
      sidecar.setCondition.answers.add(answer(true, "30", "t"));
      assertTrue(client.objects().setCondition("widgets", "ns", "w", ready).changed());
      assertTrue(client.predatesOwnWrite(new KubeObject("u", "ns", "w", "29", "{}")), "a changed answer");
      assertFalse(client.predatesOwnWrite(new KubeObject("u", "ns", "w", "30", "{}")));
    }
  }

  @Test
  void theHandedObjectsGenerationIsReadFromItsMetadataOnly() {
    assertEquals(OptionalLong.of(4), JsonFields.integer(WIDGET, "metadata", "generation"));
    assertEquals(OptionalLong.of(8), JsonFields.integer(WIDGET, "spec", "generation"));
    // Strings holding braces, quotes and escapes are skipped whole; an escaped name is the name.
    String tricky = "{ \"status\" : {\"m\": \"}{\\\"metadata\\\":{\\\"generation\\\":1}\", \"a\": [1, {\"b\": [[]]}]},"
        + " \"metadata\" : { \"annotations\": {\"x\": \"\\u007d\"}, \"gen\\u0065ration\" : 12 } }";
    assertEquals(OptionalLong.of(12), JsonFields.integer(tricky, "metadata", "generation"));
    assertEquals(OptionalLong.of(-3), JsonFields.integer("{\"metadata\":{\"generation\":-3}}", "metadata",
        "generation"));
    // Nothing there, not an integer, or not JSON: nothing.
    assertEquals(OptionalLong.empty(), JsonFields.integer("{\"metadata\":{\"name\":\"w\"}}", "metadata",
        "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("{}", "metadata", "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("{\"metadata\":[]}", "metadata", "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("{\"metadata\":{\"generation\":\"4\"}}", "metadata",
        "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("{\"metadata\":{\"generation\":4.5}}", "metadata",
        "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("{\"metadata\":{\"generation\":99999999999999999999}}",
        "metadata", "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("{\"metadata\":{\"generation\":", "metadata",
        "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("{\"metadata\"", "metadata", "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("not json", "metadata", "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer("", "metadata", "generation"));
    assertEquals(OptionalLong.empty(), JsonFields.integer(null, "metadata", "generation"));
  }
}
