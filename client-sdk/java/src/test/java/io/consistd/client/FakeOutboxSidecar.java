// A sidecar of the tests' own on a Unix socket, serving OutboxService as each test scripts it: lost connections and
// answers the real daemons do not give on demand.
package io.consistd.client;

import consistd.v1.Outbox.SendStreamRequest;
import consistd.v1.Outbox.SendStreamResponse;
import consistd.v1.Outbox.WaitOutcomeRequest;
import consistd.v1.Outbox.WaitOutcomeResponse;
import consistd.v1.OutboxServiceGrpc;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BiConsumer;
import java.util.function.Function;

/** An OutboxService whose WaitOutcome and SendStream do what the test says, counting the calls. */
final class FakeOutboxSidecar extends OutboxServiceGrpc.OutboxServiceImplBase implements AutoCloseable {
  /** Answers the n-th WaitOutcome call (from 1). */
  volatile BiConsumer<Integer, StreamObserver<WaitOutcomeResponse>> waitOutcome = (n, out) -> {};
  /** Answers the requests of the n-th SendStream call (from 1): its request observer, given the answer observer. */
  volatile Function<Integer, Function<StreamObserver<SendStreamResponse>, StreamObserver<SendStreamRequest>>>
      sendStream = n -> out -> null;

  final AtomicInteger waitOutcomeCalls = new AtomicInteger();
  final AtomicInteger sendStreamCalls = new AtomicInteger();
  final String socket;
  private final FakeSidecarServer server;

  FakeOutboxSidecar() throws IOException {
    server = new FakeSidecarServer(this);
    socket = server.socket;
  }

  @Override
  public void waitOutcome(WaitOutcomeRequest request, StreamObserver<WaitOutcomeResponse> out) {
    waitOutcome.accept(waitOutcomeCalls.incrementAndGet(), out);
  }

  @Override
  public StreamObserver<SendStreamRequest> sendStream(StreamObserver<SendStreamResponse> out) {
    return sendStream.apply(sendStreamCalls.incrementAndGet()).apply(out);
  }

  @Override
  public void close() {
    server.close();
  }
}
