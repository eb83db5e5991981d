// A call whose connection to the sidecar closed under it fails UNAVAILABLE, as in every SDK.
package io.consistd.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import java.nio.channels.ClosedChannelException;

/**
 * Reports a call that failed because the connection to the sidecar closed under it as UNAVAILABLE, as every SDK
 * does. grpc-netty gives UNKNOWN "channel closed" when a call starts on a connection the sidecar's end just closed
 * (the sidecar killed a moment before): the same lost sidecar, and retryable, but an app that retries on
 * UNAVAILABLE would not retry it.
 */
final class LostConnection implements ClientInterceptor {
  @Override
  public <Q, A> ClientCall<Q, A> interceptCall(MethodDescriptor<Q, A> method, CallOptions options, Channel next) {
    return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
      @Override
      public void start(Listener<A> listener, Metadata headers) {
        super.start(new ForwardingClientCallListener.SimpleForwardingClientCallListener<>(listener) {
          @Override
          public void onClose(Status status, Metadata trailers) {
            super.onClose(lost(status) ? unavailable(status) : status, trailers);
          }
        }, headers);
      }
    };
  }

  /** Whether {@code status} is grpc-netty's UNKNOWN for a connection closed under the call. */
  static boolean lost(Status status) {
    return status.getCode() == Status.Code.UNKNOWN && status.getCause() instanceof ClosedChannelException;
  }

  private static Status unavailable(Status status) {
    return Status.UNAVAILABLE
        .withDescription("the connection to the sidecar closed (" + status.getDescription() + ")")
        .withCause(status.getCause());
  }
}
