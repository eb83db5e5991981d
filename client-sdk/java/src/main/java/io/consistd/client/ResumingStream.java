// A server-streaming call kept open across lost connections: read ahead, reopened with backoff, closable anywhere.
package io.consistd.client;

import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.grpc.stub.StreamObserver;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.function.BiConsumer;
import java.util.function.Supplier;

/**
 * The responses of one server-streaming call, as {@link Watch} and {@link Rollout.Versions} take them. When the
 * connection is lost (UNAVAILABLE, or the stream ends without {@link #close}) the call is made again with the request
 * its owner gives then (a watch's latest cursor), after a pause of the {@link Backoff} (reset by each response);
 * every other status is the daemon's refusal, thrown once and ending it. Responses are read up to {@link #READ_AHEAD}
 * ahead of the owner: gRPC's flow control asks the sidecar for more as the owner takes them, so the socket is never
 * idle while the app loops, and a slow app holds the rest in the sidecar. One thread takes; {@link #close} may be
 * called from any.
 *
 * @param <Q> the request
 * @param <R> the response
 */
final class ResumingStream<Q, R> {
  private static final int READ_AHEAD = 64;

  private final ConsistdClient client;
  /** Names the stream in the error of one the sidecar ended: "watch", "version". */
  private final String what;
  /** Starts the call with its observer (an async stub's method). */
  private final BiConsumer<Q, StreamObserver<R>> call;
  /** The request of the next call made. */
  private final Supplier<Q> request;
  private final Backoff backoff = new Backoff();
  private Incoming<Q, R> stream;
  /** The current call's context: cancelling it ends the call (close, or before making another). */
  private volatile Context.CancellableContext context;
  private volatile boolean closed;

  ResumingStream(ConsistdClient client, String what, BiConsumer<Q, StreamObserver<R>> call, Supplier<Q> request) {
    this.client = client;
    this.what = what;
    this.call = call;
    this.request = request;
  }

  /**
   * The next response, making the call (again) as needed; null once closed.
   *
   * @throws StatusRuntimeException the daemon's refusal (anything but a lost connection), once; CANCELLED if the
   *     thread is interrupted (the interrupt flag stays set). Either ends the stream.
   */
  R receive() {
    while (!closed) {
      StatusRuntimeException failure;
      try {
        if (stream == null) {
          open();
        }
        R response = stream.take();
        if (response != null) {
          backoff.reset();
          return response;
        }
        failure = Backoff.ended(what);
      } catch (StatusRuntimeException e) {
        failure = e;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        closed = true;
        endCall();
        throw Status.CANCELLED.withDescription("interrupted while waiting for the " + what + " stream")
            .asRuntimeException();
      }
      endCall();
      if (closed) {
        return null;
      }
      if (!Backoff.retryable(failure)) {
        closed = true;
        throw failure;
      }
      try {
        backoff.pause();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        closed = true;
        throw Status.CANCELLED.withDescription("interrupted while opening the " + what + " stream again")
            .asRuntimeException();
      }
      // The sidecar may be back: connect at once rather than after gRPC's reconnect backoff.
      client.channel().resetConnectBackoff();
    }
    return null;
  }

  /** Ends the stream; a {@link #receive} waiting in another thread returns null. */
  void close() {
    closed = true;
    Context.CancellableContext current = context;
    if (current != null) {
      current.cancel(null);
    }
  }

  private void open() {
    Context.CancellableContext made = Context.current().withCancellation();
    context = made;
    if (closed) {
      made.cancel(null);
    }
    Incoming<Q, R> incoming = new Incoming<>();
    Context previous = made.attach();
    try {
      call.accept(request.get(), incoming);
    } finally {
      made.detach(previous);
    }
    stream = incoming;
  }

  private void endCall() {
    Context.CancellableContext current = context;
    if (current != null) {
      current.cancel(null);
    }
    stream = null;
  }

  /** One call's responses, queued on the transport's thread ahead of the taker. */
  private static final class Incoming<Q, R> implements ClientResponseObserver<Q, R> {
    /** How the call ended: null error when completed. */
    private record End(Throwable error) {}

    /** Responses, then the {@link End}. */
    private final BlockingQueue<Object> queue = new LinkedBlockingQueue<>();
    private ClientCallStreamObserver<Q> call;
    private int taken;

    @Override
    public void beforeStart(ClientCallStreamObserver<Q> call) {
      this.call = call;
      call.disableAutoRequestWithInitial(READ_AHEAD);
    }

    @Override
    public void onNext(R response) {
      queue.add(response);
    }

    @Override
    public void onError(Throwable error) {
      queue.add(new End(error));
    }

    @Override
    public void onCompleted() {
      queue.add(new End(null));
    }

    /** The next response, waiting for it; null once the call completed; throws the error it ended with. */
    @SuppressWarnings("unchecked") // everything queued but an End is a response
    R take() throws InterruptedException {
      Object next = queue.take();
      if (!(next instanceof End end)) {
        if (++taken == READ_AHEAD / 2) {
          taken = 0;
          call.request(READ_AHEAD / 2);
        }
        return (R) next;
      }
      queue.add(next); // the end stays the end
      if (end.error() == null) {
        return null;
      }
      throw end.error() instanceof StatusRuntimeException e ? e : Status.fromThrowable(end.error()).asRuntimeException();
    }
  }
}
