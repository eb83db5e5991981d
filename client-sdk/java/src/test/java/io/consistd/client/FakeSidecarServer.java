// The server under the tests' own fake sidecars: a gRPC server on a fresh Unix socket, for the fakes that script
// the answers the real daemons do not give on demand.
package io.consistd.client;

import io.grpc.BindableService;
import io.grpc.Server;
import io.grpc.netty.NettyServerBuilder;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.epoll.EpollIoHandler;
import io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.netty.channel.unix.DomainSocketAddress;
import java.io.IOException;
import java.nio.file.Files;
import java.util.concurrent.TimeUnit;

/** Serves one fake service on a Unix socket of a temporary directory of its own until closed. */
final class FakeSidecarServer implements AutoCloseable {
  /** The socket's path, for a {@link ConsistdClient} of the fake. */
  final String socket;
  private final EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, EpollIoHandler.newFactory());
  private final Server server;

  /** Starts serving {@code service}. */
  FakeSidecarServer(BindableService service) throws IOException {
    socket = Files.createTempDirectory("consistd-java-fake").resolve("consistd.sock").toString();
    server = NettyServerBuilder.forAddress(new DomainSocketAddress(socket))
        .channelType(EpollServerDomainSocketChannel.class)
        // As the client does: a Unix socket has no SO_KEEPALIVE, which grpc-netty sets on every connection.
        .withChildOption(ChannelOption.SO_KEEPALIVE, null)
        .bossEventLoopGroup(group)
        .workerEventLoopGroup(group)
        .addService(service)
        .build()
        .start();
  }

  /** Stops the server at once (waiting up to 5 seconds for it) and then its event loop. */
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
