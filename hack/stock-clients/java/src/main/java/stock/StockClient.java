// Proves stock grpc-java (Netty, default options, no authority override) can call consistd over its Unix socket.
package stock;

import consistd.v1.Objects.ListRequest;
import consistd.v1.Objects.ListResponse;
import consistd.v1.ObjectsServiceGrpc;
import consistd.v1.Watch.DeliveryMode;
import consistd.v1.Watch.EventType;
import consistd.v1.Watch.SubscribeRequest;
import consistd.v1.Watch.SubscribeResponse;
import consistd.v1.WatchServiceGrpc;
import io.grpc.Context;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.netty.NettyChannelBuilder;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.epoll.EpollDomainSocketChannel;
import io.netty.channel.epoll.EpollEventLoopGroup;
import io.netty.channel.unix.DomainSocketAddress;
import java.util.Iterator;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;

/** Usage: StockClient netty-epoll|unix-target SOCKET_PATH. */
public final class StockClient {
  private static final long DEADLINE_SECONDS = 30;

  private interface Call {
    String run() throws Exception;
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      System.err.println("usage: StockClient netty-epoll|unix-target SOCKET_PATH");
      System.exit(2);
    }
    String variant = args[0];
    String path = args[1];
    EventLoopGroup group = null;
    ManagedChannel channel;
    String label;
    switch (variant) {
      case "netty-epoll" -> {
        group = new EpollEventLoopGroup(1);
        channel = NettyChannelBuilder.forAddress(new DomainSocketAddress(path))
            .eventLoopGroup(group)
            .channelType(EpollDomainSocketChannel.class)
            .usePlaintext()
            .build();
        label = "grpc-java NettyChannelBuilder(DomainSocketAddress " + path + ")";
      }
      case "unix-target" -> {
        channel = Grpc.newChannelBuilder("unix:" + path, InsecureChannelCredentials.create()).build();
        label = "grpc-java Grpc.newChannelBuilder(unix:" + path + ")";
      }
      default -> throw new IllegalArgumentException("unknown variant " + variant);
    }

    boolean ok = true;
    ok &= call(label, "Health/Check", () -> {
      HealthCheckResponse response = HealthGrpc.newBlockingStub(channel)
          .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
          .check(HealthCheckRequest.newBuilder().setService("").build());
      if (response.getStatus() != HealthCheckResponse.ServingStatus.SERVING) {
        throw new IllegalStateException("status " + response.getStatus() + ", want SERVING");
      }
      return response.getStatus().name();
    });
    ok &= call(label, "ObjectsService/List", () -> {
      ListResponse response = ObjectsServiceGrpc.newBlockingStub(channel)
          .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
          .list(ListRequest.newBuilder().setResource("namespaces").build());
      if (response.getObjectsCount() == 0) {
        throw new IllegalStateException("no namespaces listed");
      }
      return response.getObjectsCount() + " items ("
          + response.getObjectsList().stream().map(o -> o.getName()).collect(Collectors.joining(", ")) + ")";
    });
    ok &= call(label, "WatchService/Subscribe", () -> {
      SubscribeRequest request = SubscribeRequest.newBuilder()
          .setResource("namespaces")
          .setMode(DeliveryMode.DELIVERY_MODE_RAW)
          .build();
      // Cancelling the context the call started in cancels the stream.
      try (Context.CancellableContext context = Context.current().withCancellation()) {
        Iterator<SubscribeResponse> events = context.call(() -> WatchServiceGrpc.newBlockingStub(channel)
            .withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS)
            .subscribe(request));
        int before = 0;
        while (events.hasNext()) {
          SubscribeResponse event = events.next();
          if (event.getType() == EventType.EVENT_TYPE_SYNCED) {
            context.cancel(null);
            return "SYNCED after " + before + " events, then cancelled";
          }
          before++;
        }
        throw new IllegalStateException("stream ended after " + before + " events without SYNCED");
      }
    });

    channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    if (group != null) {
      group.shutdownGracefully(0, 5, TimeUnit.SECONDS).await(5, TimeUnit.SECONDS);
    }
    System.exit(ok ? 0 : 1);
  }

  /** Runs one call, prints one line with what it got (stdout) or why it failed (stderr). */
  private static boolean call(String label, String name, Call call) {
    try {
      System.out.println(label + ": " + name + " " + call.run());
      return true;
    } catch (StatusRuntimeException e) {
      Throwable cause = e.getStatus().getCause();
      String why = e.getMessage() + (cause == null ? "" : " (" + cause + ")");
      System.err.println(label + ": " + name + " FAILED: " + why);
      return false;
    } catch (Exception e) {
      System.err.println(label + ": " + name + " FAILED: " + e);
      return false;
    }
  }
}
