// A sidecar of the tests' own on a Unix socket, serving OutboxService as each test scripts it: lost connections and
// answers the real daemons do not give on demand.
package io.consistd.client;

import consistd.v1.Outbox.SendStreamRequest;
import consistd.v1.Outbox.SendStreamResponse;
import consistd.v1.Outbox.WaitOutcomeRequest;
import consistd.v1.Outbox.WaitOutcomeResponse;
import consistd.v1.OutboxServiceGrpc;
import io.grpc.Server;
import io.grpc.netty.NettyServerBuilder;
import io.netty.channel.ChannelOption;
import io.grpc.stub.StreamObserver;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.epoll.EpollIoHandler;
import io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.netty.channel.unix.DomainSocketAddress;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
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
  private final EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, EpollIoHandler.newFactory());
  private final Server server;

  FakeOutboxSidecar() throws IOException {
    socket = Files.createTempDirectory("consistd-java-fake").resolve("consistd.sock").toString();
    server = NettyServerBuilder.forAddress(new DomainSocketAddress(socket))
        .channelType(EpollServerDomainSocketChannel.class)
        // As the client does: a Unix socket has no SO_KEEPALIVE, which grpc-netty sets on every connection.
        .withChildOption(ChannelOption.SO_KEEPALIVE, null)
        .bossEventLoopGroup(group)
        .workerEventLoopGroup(group)
        .addService(this)
        .build()
        .start();
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
    server.shutdownNow();
    try {
      server.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
    }
  }
}
