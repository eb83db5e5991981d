// The connection to the sidecar closed under a call: the app is told UNAVAILABLE, not grpc-netty's UNKNOWN.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;

import consistd.v1.ObjectsServiceGrpc;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import java.nio.channels.ClosedChannelException;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

class LostConnectionTest {
  /** The status the app's listener sees when the call underneath closes with {@code status}. */
  private static Status seen(Status status) {
    Channel closing = new Channel() {
      @Override
      public <Q, A> ClientCall<Q, A> newCall(MethodDescriptor<Q, A> method, CallOptions options) {
        return new ClientCall<>() {
          @Override
          public void start(Listener<A> listener, Metadata headers) {
            listener.onClose(status, new Metadata());
          }

          @Override
          public void request(int n) {}

          @Override
          public void cancel(String message, Throwable cause) {}

          @Override
          public void halfClose() {}

          @Override
          public void sendMessage(Q message) {}
        };
      }

      @Override
      public String authority() {
        return "localhost";
      }
    };
    AtomicReference<Status> closed = new AtomicReference<>();
    new LostConnection()
        .interceptCall(ObjectsServiceGrpc.getGetMethod(), CallOptions.DEFAULT, closing)
        .start(new ClientCall.Listener<>() {
          @Override
          public void onClose(Status status, Metadata trailers) {
            closed.set(status);
          }
        }, new Metadata());
    return closed.get();
  }

  @Test
  void aConnectionClosedUnderTheCallIsUnavailable() {
    ClosedChannelException cause = new ClosedChannelException();
    Status lost = seen(Status.UNKNOWN.withDescription("channel closed").withCause(cause));
    assertEquals(Status.Code.UNAVAILABLE, lost.getCode());
    assertSame(cause, lost.getCause());
  }

  @Test
  void everyOtherStatusPassesAsItIs() {
    Status unknown = Status.UNKNOWN.withDescription("the handler threw");
    assertSame(unknown, seen(unknown));
    Status notFound = Status.NOT_FOUND.withDescription("no such object");
    assertSame(notFound, seen(notFound));
  }
}
