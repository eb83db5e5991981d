// Views without a daemon: how a watch's and a queue's ObjectView goes out as the protocol's, and that a watch resumed
// after a lost connection asks for the same view (a sidecar of the test's own on a Unix socket).
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import consistd.v1.Reconcile.ObjectQuery;
import consistd.v1.Reconcile.RelatedQuery;
import consistd.v1.Watch.EventType;
import consistd.v1.Watch.SubscribeRequest;
import consistd.v1.Watch.SubscribeResponse;
import consistd.v1.WatchServiceGrpc;
import io.grpc.stub.StreamObserver;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 30, unit = TimeUnit.SECONDS)
class ObjectViewTest {
  private static consistd.v1.Object.ObjectView proto(boolean metadataOnly, List<String> fields, boolean managed) {
    return consistd.v1.Object.ObjectView.newBuilder()
        .setMetadataOnly(metadataOnly).addAllFields(fields).setManagedFields(managed).build();
  }

  @Test
  void theFactoriesMakeTheViewsTheProtocolNames() {
    assertEquals(new ObjectView(false, List.of(), false), ObjectView.DEFAULT);
    assertEquals(new ObjectView(true, List.of(), false), ObjectView.onlyMetadata());
    assertEquals(new ObjectView(false, List.of("spec.replicas", "status.conditions"), false),
        ObjectView.onlyFields("spec.replicas", "status.conditions"));
    assertEquals(new ObjectView(false, List.of(), true), ObjectView.DEFAULT.managedFields(true));
    assertEquals(ObjectView.onlyMetadata(), ObjectView.onlyMetadata().managedFields(true).managedFields(false));
    assertEquals(proto(true, List.of(), true), ObjectView.onlyMetadata().managedFields(true).toProto());
    assertEquals(proto(false, List.of("metadata.labels"), false), ObjectView.onlyFields("metadata.labels").toProto());
  }

  @Test
  void aViewIsImmutable() {
    String[] paths = {"spec.replicas"};
    ObjectView view = ObjectView.onlyFields(paths);
    paths[0] = "status";
    assertEquals(List.of("spec.replicas"), view.fields(), "the paths were copied");
    assertThrows(UnsupportedOperationException.class, () -> view.fields().add("status"));
    assertThrows(NullPointerException.class, () -> new ObjectView(false, null, false));
    assertThrows(NullPointerException.class, () -> ObjectView.onlyFields("spec", null));
  }

  @Test
  void aWatchOfTheDefaultViewSendsNone() {
    assertSame(ObjectView.DEFAULT, WatchRequest.of("pods").view());
    assertFalse(WatchRequest.of("pods").toProto().hasView(), "no view: the whole object without managedFields");
    assertFalse(WatchRequest.of("pods").view(ObjectView.DEFAULT).toProto().hasView());
    WatchRequest old = new WatchRequest("pods", "ns", "", "", WatchRequest.Mode.RAW, "");
    assertEquals(ObjectView.DEFAULT, old.view(), "the constructor without a view takes the default");
    assertThrows(NullPointerException.class, () -> WatchRequest.of("pods").view(null));
  }

  @Test
  void aWatchSendsItsViewAndEveryOtherMethodKeepsIt() {
    SubscribeRequest metadata = WatchRequest.of("pods").view(ObjectView.onlyMetadata()).toProto();
    assertTrue(metadata.hasView());
    assertEquals(proto(true, List.of(), false), metadata.getView());

    WatchRequest projection = WatchRequest.of("deployments.apps")
        .view(ObjectView.onlyFields("spec.replicas", "status.conditions").managedFields(true))
        .namespace("ns").labelSelector("app=web").fieldSelector("metadata.name=web").mode(WatchRequest.Mode.RAW)
        .resumeCursor("c7");
    SubscribeRequest sent = projection.toProto();
    assertEquals(proto(false, List.of("spec.replicas", "status.conditions"), true), sent.getView());
    assertEquals("ns", sent.getNamespace());
    assertEquals("c7", sent.getResumeCursor());
  }

  @Test
  void aViewTheDaemonRefusesIsSentAsItIsForTheDaemonToNameTheField() {
    ObjectView both = new ObjectView(true, List.of("spec", "a..b"), false);
    assertEquals(proto(true, List.of("spec", "a..b"), false), WatchRequest.of("pods").view(both).toProto().getView());
    List<String> many = new ArrayList<>();
    for (int i = 0; i < 33; i++) {
      many.add("spec.f" + i);
    }
    assertEquals(many, WatchRequest.of("pods").view(new ObjectView(false, many, false)).toProto().getView()
        .getFieldsList());
  }

  @Test
  void aQueueSendsItsPrimarysViewAndEachRelatedQuerysOwn() {
    QueueSpec spec = QueueSpec.of("web", "deployments.apps")
        .view(ObjectView.onlyFields("spec.replicas", "status.conditions"))
        .namespace("ns").labelSelector("app=web").fieldSelector("metadata.name=web").maxLeases(2)
        .retry(QueueSpec.Retry.DEFAULTS.burst(5)).leaseTimeout(java.time.Duration.ofSeconds(30))
        .election("web", "")
        .related(
            QueueSpec.Related.controllerOwner("pods", "ns").view(ObjectView.onlyMetadata()).labelSelector("app=web"),
            QueueSpec.Related.byLabel("configmaps", "ns", "app").view(ObjectView.onlyMetadata().managedFields(true)),
            QueueSpec.Related.byField("secrets", "ns", "metadata.name"));
    consistd.v1.Reconcile.QueueSpec sent = spec.toProto().getSpec();

    ObjectQuery primary = sent.getPrimary();
    assertEquals(proto(false, List.of("spec.replicas", "status.conditions"), false), primary.getView());
    assertEquals("ns", primary.getNamespace());
    assertEquals("metadata.name=web", primary.getFieldSelector());

    List<RelatedQuery> related = sent.getRelatedList();
    assertEquals(3, related.size());
    assertEquals(proto(true, List.of(), false), related.get(0).getQuery().getView());
    assertEquals("app=web", related.get(0).getQuery().getLabelSelector());
    assertTrue(related.get(0).getControllerOwner());
    assertEquals(proto(true, List.of(), true), related.get(1).getQuery().getView());
    assertEquals("app", related.get(1).getLabel());
    assertFalse(related.get(2).getQuery().hasView(), "a related query without a view sends none");
    assertEquals("metadata.name", related.get(2).getField());
  }

  @Test
  void aQueueOfTheDefaultViewsSendsNone() {
    QueueSpec spec = QueueSpec.of("web", "configmaps").related(QueueSpec.Related.byAnnotation("secrets", "", "a"));
    assertSame(ObjectView.DEFAULT, spec.view());
    assertSame(ObjectView.DEFAULT, spec.related().get(0).view());
    consistd.v1.Reconcile.QueueSpec sent = spec.toProto().getSpec();
    assertFalse(sent.getPrimary().hasView());
    assertFalse(sent.getRelated(0).getQuery().hasView());

    QueueSpec.Related old = new QueueSpec.Related("configmaps", "", "", "", QueueSpec.Related.MapsBy.LABEL, "app");
    assertEquals(ObjectView.DEFAULT, old.view(), "the constructor without a view takes the default");
    QueueSpec oldSpec = new QueueSpec("web", "configmaps", "", "", "", List.of(old), 0, null, null, null);
    assertEquals(ObjectView.DEFAULT, oldSpec.view());
    assertThrows(NullPointerException.class, () -> QueueSpec.of("web", "configmaps").view(null));
    assertThrows(NullPointerException.class, () -> QueueSpec.Related.byLabel("pods", "", "app").view(null));
  }

  @Test
  void aWatchResumedAfterTheStreamEndedAsksForTheSameView() throws Exception {
    ObjectView view = ObjectView.onlyFields("metadata.labels").managedFields(true);
    FakeWatchSidecar sidecar = new FakeWatchSidecar();
    try (FakeSidecarServer server = new FakeSidecarServer(sidecar);
        ConsistdClient client = new ConsistdClient(server.socket);
        Watch watch = client.watch(WatchRequest.of("configmaps").namespace("ns").view(view))) {
      assertEquals(WatchEvent.Type.SYNCED, watch.next().type());
      // The first stream sent SYNCED at c1 and ended: the watch subscribed again, from c1, with the same view.
      assertEquals(WatchEvent.Type.SYNCED, watch.next().type());
      SubscribeRequest first = sidecar.requests.poll(10, TimeUnit.SECONDS);
      SubscribeRequest second = sidecar.requests.poll(10, TimeUnit.SECONDS);
      assertNotNull(first);
      assertNotNull(second);
      assertEquals("", first.getResumeCursor());
      assertEquals("c1", second.getResumeCursor());
      assertEquals(proto(false, List.of("metadata.labels"), true), first.getView());
      assertEquals(first.getView(), second.getView());
    }
  }

  /** A WatchService whose every subscription gets SYNCED (cursor c1, then c2, ...) and then ends. */
  private static final class FakeWatchSidecar extends WatchServiceGrpc.WatchServiceImplBase {
    final BlockingQueue<SubscribeRequest> requests = new LinkedBlockingQueue<>();
    private final AtomicInteger calls = new AtomicInteger();

    @Override
    public void subscribe(SubscribeRequest request, StreamObserver<SubscribeResponse> out) {
      requests.add(request);
      out.onNext(SubscribeResponse.newBuilder()
          .setType(EventType.EVENT_TYPE_SYNCED).setCursor("c" + calls.incrementAndGet()).build());
      out.onCompleted();
    }
  }
}
