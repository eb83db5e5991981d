// Events without a daemon: the request a work item's recordEvent sends (the queue's primary, the item's key, the
// handed object's uid, the severity mapped, the queue's name as reporting controller) and the client's own call.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import consistd.v1.Objects.RecordEventRequest;
import consistd.v1.Objects.RecordEventResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 30, unit = TimeUnit.SECONDS)
class EventTest {
  private static RecordEventResponse answer(boolean recorded) {
    return RecordEventResponse.newBuilder().setRecorded(recorded).build();
  }

  /** An item of lease l in term 7, handed a Widget of uid u-1 unless {@code handed} is false (no object). */
  private static consistd.v1.Reconcile.WorkItem item(boolean handed) {
    consistd.v1.Reconcile.WorkItem.Builder item = consistd.v1.Reconcile.WorkItem.newBuilder()
        .setLeaseId("l").setNamespace("ns").setName("w").setTerm(7).setAttempt(1);
    if (handed) {
      item.setObject(consistd.v1.Object.KubeObject.newBuilder().setUid("u-1").setNamespace("ns").setName("w")
          .setResourceVersion("10")
          .setJson(ByteString.copyFrom("{\"metadata\":{\"name\":\"w\",\"uid\":\"u-1\"}}", StandardCharsets.UTF_8)));
    }
    return item.build();
  }

  @Test
  void anItemRecordsItsEventAboutTheQueuesPrimaryReportedByTheQueue() throws Exception {
    FakeObjectsSidecar sidecar = new FakeObjectsSidecar();
    try (FakeSidecarServer server = new FakeSidecarServer(sidecar);
        ConsistdClient client = new ConsistdClient(server.socket)) {
      QueueSpec spec = QueueSpec.of("widget-operator", "widgets.example.com").election("web", "leases");
      WorkItem item = WorkItem.from(item(true), client, spec);
      sidecar.recordEvent.answers.add(answer(true));
      assertTrue(item.recordEvent(EventSeverity.WARNING, "Drifted", "Reconcile", "data moved"));

      RecordEventRequest sent = sidecar.recordEvent.request();
      assertEquals("widgets.example.com", sent.getResource(), "the queue's primary resource");
      assertEquals("ns", sent.getNamespace());
      assertEquals("w", sent.getName());
      assertEquals("u-1", sent.getUid(), "the uid of the handed object");
      assertEquals(consistd.v1.Objects.EventSeverity.EVENT_SEVERITY_WARNING, sent.getSeverity());
      assertEquals("Drifted", sent.getReason());
      assertEquals("Reconcile", sent.getAction());
      assertEquals("data moved", sent.getNote());
      assertEquals("widget-operator", sent.getReportingController(), "the queue's name");

      // NORMAL as the daemon names it; an answer the rate limit dropped is false.
      sidecar.recordEvent.answers.add(answer(false));
      assertFalse(item.recordEvent(EventSeverity.NORMAL, "Synced", "Reconcile", ""));
      RecordEventRequest normal = sidecar.recordEvent.request();
      assertEquals(consistd.v1.Objects.EventSeverity.EVENT_SEVERITY_NORMAL, normal.getSeverity());
      assertEquals("", normal.getNote());

      // No object handed out (a related object queued a missing primary): no uid, the daemon reads it.
      WorkItem bare = WorkItem.from(item(false), client, QueueSpec.of("widget-operator", "widgets.example.com"));
      sidecar.recordEvent.answers.add(answer(true));
      assertTrue(bare.recordEvent(EventSeverity.NORMAL, "Missing", "Reconcile", "n"));
      RecordEventRequest unowned = sidecar.recordEvent.request();
      assertEquals("", unowned.getUid());
      assertEquals("widget-operator", unowned.getReportingController());

      // The daemon's error as it is; a missing severity is refused before anything is sent.
      sidecar.recordEvent.answers.add(Status.INVALID_ARGUMENT.withDescription("reason: must be 1 to 128 characters")
          .asRuntimeException());
      StatusRuntimeException refused = assertThrows(StatusRuntimeException.class,
          () -> item.recordEvent(EventSeverity.WARNING, "", "Reconcile", ""));
      assertEquals(Status.Code.INVALID_ARGUMENT, refused.getStatus().getCode());
      assertEquals("reason: must be 1 to 128 characters", refused.getStatus().getDescription());
      sidecar.recordEvent.request();
      assertThrows(NullPointerException.class, () -> item.recordEvent(null, "Drifted", "Reconcile", ""));
      assertNull(sidecar.recordEvent.requests.poll(200, TimeUnit.MILLISECONDS), "nothing sent without a severity");
    }
  }

  @Test
  void theClientRecordsAnEventAboutAnyObjectAsGiven() throws Exception {
    FakeObjectsSidecar sidecar = new FakeObjectsSidecar();
    try (FakeSidecarServer server = new FakeSidecarServer(sidecar);
        ConsistdClient client = new ConsistdClient(server.socket)) {
      // Without a uid or a controller: the daemon reads the uid and reports as "consistd".
      sidecar.recordEvent.answers.add(answer(true));
      assertTrue(client.objects().recordEvent("configmaps", "default", "c",
          new ObjectsClient.Event(EventSeverity.NORMAL, "Seen", "Observe", "n")));
      RecordEventRequest plain = sidecar.recordEvent.request();
      assertEquals("configmaps", plain.getResource());
      assertEquals("default", plain.getNamespace());
      assertEquals("c", plain.getName());
      assertEquals("", plain.getUid());
      assertEquals("", plain.getReportingController());
      assertEquals(consistd.v1.Objects.EventSeverity.EVENT_SEVERITY_NORMAL, plain.getSeverity());
      assertEquals("Seen", plain.getReason());
      assertEquals("Observe", plain.getAction());
      assertEquals("n", plain.getNote());

      // Given ones are sent as they are.
      sidecar.recordEvent.answers.add(answer(false));
      assertFalse(client.objects().recordEvent("nodes", "", "n1", new ObjectsClient.Event(EventSeverity.WARNING,
          "Pressure", "Drain", "disk", "u-9", "example.com/node-operator")));
      RecordEventRequest given = sidecar.recordEvent.request();
      assertEquals("", given.getNamespace());
      assertEquals("u-9", given.getUid());
      assertEquals("example.com/node-operator", given.getReportingController());
      assertEquals(consistd.v1.Objects.EventSeverity.EVENT_SEVERITY_WARNING, given.getSeverity());
    }
  }
}
