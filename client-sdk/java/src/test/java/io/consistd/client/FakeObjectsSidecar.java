// A sidecar of the tests' own (served by FakeSidecarServer), answering ObjectsService's SetCondition and RecordEvent
// as each test scripts them: the requests the SDK sends, and answers or errors the real daemons do not give on demand.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertNotNull;

import consistd.v1.Objects.RecordEventRequest;
import consistd.v1.Objects.RecordEventResponse;
import consistd.v1.Objects.SetConditionRequest;
import consistd.v1.Objects.SetConditionResponse;
import consistd.v1.ObjectsServiceGrpc;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/** An ObjectsService whose SetCondition and RecordEvent each record every request and answer as scripted. */
final class FakeObjectsSidecar extends ObjectsServiceGrpc.ObjectsServiceImplBase {
  /** The SetCondition calls. */
  final Calls<SetConditionRequest, SetConditionResponse> setCondition =
      new Calls<>("SetCondition", SetConditionResponse.class);
  /** The RecordEvent calls. */
  final Calls<RecordEventRequest, RecordEventResponse> recordEvent =
      new Calls<>("RecordEvent", RecordEventResponse.class);

  @Override
  public void setCondition(SetConditionRequest request, StreamObserver<SetConditionResponse> out) {
    setCondition.serve(request, out);
  }

  @Override
  public void recordEvent(RecordEventRequest request, StreamObserver<RecordEventResponse> out) {
    recordEvent.serve(request, out);
  }

  /** One unary method's calls: each request recorded, each answered with the next scripted answer. */
  static final class Calls<Q, A> {
    final BlockingQueue<Q> requests = new LinkedBlockingQueue<>();
    /** An {@code A}, or a StatusRuntimeException to fail with. */
    final BlockingQueue<Object> answers = new LinkedBlockingQueue<>();
    private final String method;
    private final Class<A> answerType;

    private Calls(String method, Class<A> answerType) {
      this.method = method;
      this.answerType = answerType;
    }

    private void serve(Q request, StreamObserver<A> out) {
      requests.add(request);
      Object answer = answers.poll();
      if (answerType.isInstance(answer)) {
        out.onNext(answerType.cast(answer));
        out.onCompleted();
      } else if (answer instanceof StatusRuntimeException e) {
        out.onError(e);
      } else {
        out.onError(Status.INTERNAL.withDescription("the test scripted no answer").asRuntimeException());
      }
    }

    /** The next request sent, waiting up to 10 seconds for it. */
    Q request() throws InterruptedException {
      Q r = requests.poll(10, TimeUnit.SECONDS);
      assertNotNull(r, "no " + method + " request");
      return r;
    }
  }
}
