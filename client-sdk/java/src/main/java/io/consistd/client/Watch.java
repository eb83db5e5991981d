// A watch of objects through the sidecar, resumed after a lost connection, with the own-write rule at the take.
package io.consistd.client;

import consistd.v1.Watch.SubscribeRequest;
import consistd.v1.Watch.SubscribeResponse;
import consistd.v1.WatchServiceGrpc;
import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;

/**
 * The events of one watch, taken one at a time: a blocking {@link Iterator}, and an {@link Iterable} whose single
 * iterator is the watch itself, for a for-each loop. Close it to stop; {@link #close} may be called from any thread
 * and ends a blocked {@code hasNext} with false.
 *
 * <p>Why an iterator and not a {@link java.util.concurrent.Flow.Publisher}: the own-write rule is applied when the
 * app <em>takes</em> an event, and {@link #next} is exactly that moment, on the app's thread, however long the event
 * waited before (the SDK reads up to 64 events ahead of the app; gRPC's flow control holds the rest in the sidecar).
 * A check made on arrival would go stale while the app's handler writes. A publisher pushing into {@code onNext}
 * would need the same pull ({@code request(1)}) to keep that promise.
 *
 * <p>When the connection is lost (UNAVAILABLE, or the stream ends without the app closing it) the watch subscribes
 * again with the last cursor it received, with backoff (100 ms doubling to 5 s, reset after an event), so the app
 * sees each event once; if the daemon cannot resume from it, the app sees RESYNC_REQUIRED followed by a fresh
 * snapshot and SYNCED. Every other error is thrown from {@code hasNext} or {@code next} as the daemon sent it, and
 * ends the watch.
 */
public final class Watch implements Iterator<WatchEvent>, Iterable<WatchEvent>, AutoCloseable {
  private final ConsistdClient client;
  private final boolean consistent;
  private final Backoff backoff = new Backoff();
  private SubscribeRequest request;
  private Incoming stream;
  private SubscribeResponse pending;
  private boolean iterated;
  /** The current stream's context: cancelling it ends the stream (close, or before opening another). */
  private volatile Context.CancellableContext call;
  private volatile boolean closed;

  Watch(ConsistdClient client, WatchRequest request) {
    this.client = client;
    this.request = request.toProto();
    this.consistent = request.mode() == WatchRequest.Mode.CONSISTENT;
  }

  /** This watch, once: a watch is taken from one loop. */
  @Override
  public Iterator<WatchEvent> iterator() {
    if (iterated) {
      throw new IllegalStateException("a watch is iterated once; start another watch to read again");
    }
    iterated = true;
    return this;
  }

  /**
   * Waits until an event has arrived; false once the watch is closed. A true answer may still be followed by a
   * {@link #next} that waits on: the event that arrived can be one the own-write rule drops when it is taken.
   */
  @Override
  public boolean hasNext() {
    if (pending == null) {
      pending = receive();
    }
    return pending != null;
  }

  /**
   * Takes the next event, waiting for it. In CONSISTENT mode an ADDED or MODIFIED state older than what a write
   * through this client returned is dropped here; in RAW mode it is marked {@code predatesOwnWrite}.
   *
   * @throws NoSuchElementException once the watch is closed
   * @throws StatusRuntimeException the daemon's refusal of the watch (anything but a lost connection)
   */
  @Override
  public WatchEvent next() {
    while (true) {
      if (!hasNext()) {
        throw new NoSuchElementException("the watch is closed");
      }
      WatchEvent event = WatchEvent.from(pending);
      pending = null;
      // The take: nothing runs between this check and the app's use of the event but the app's own thread.
      boolean state = event.type() == WatchEvent.Type.ADDED || event.type() == WatchEvent.Type.MODIFIED;
      if (state && client.writes().predates(event.object())) {
        if (consistent) {
          continue; // dropped; the cursor has moved past it already
        }
        event = event.markedPredatesOwnWrite();
      }
      return event;
    }
  }

  /** Ends the watch; a {@code hasNext} blocked in another thread returns false. */
  @Override
  public void close() {
    closed = true;
    Context.CancellableContext current = call;
    if (current != null) {
      current.cancel(null);
    }
  }

  /** The next response of the stream, opening it (again) as needed; null once closed. */
  private SubscribeResponse receive() {
    while (!closed) {
      StatusRuntimeException failure;
      try {
        if (stream == null) {
          open();
        }
        SubscribeResponse response = stream.take();
        if (response != null) {
          backoff.reset();
          if (!response.getCursor().isEmpty()) {
            request = request.toBuilder().setResumeCursor(response.getCursor()).build();
          }
          return response;
        }
        failure = Backoff.ended("watch");
      } catch (StatusRuntimeException e) {
        failure = e;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        closed = true;
        endStream();
        throw Status.CANCELLED.withDescription("interrupted while waiting for the watch").asRuntimeException();
      }
      endStream();
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
        throw Status.CANCELLED.withDescription("interrupted while reconnecting the watch").asRuntimeException();
      }
      // The sidecar may be back: connect at once rather than after gRPC's reconnect backoff.
      client.channel().resetConnectBackoff();
    }
    return null;
  }

  private void open() {
    Context.CancellableContext context = Context.current().withCancellation();
    call = context;
    if (closed) {
      context.cancel(null);
    }
    Context previous = context.attach();
    try {
      Incoming incoming = new Incoming();
      // Callbacks on the transport's thread: they only queue.
      WatchServiceGrpc.newStub(client.channel()).withExecutor(Runnable::run).subscribe(request, incoming);
      stream = incoming;
    } finally {
      context.detach(previous);
    }
  }

  private void endStream() {
    Context.CancellableContext current = call;
    if (current != null) {
      current.cancel(null);
    }
    stream = null;
  }

  /**
   * One Subscribe call's responses, read ahead of the app by up to {@link #READ_AHEAD}: gRPC's flow control asks the
   * sidecar for more as the app takes them, so the socket is never idle while the app loops, and a slow app holds
   * the rest in the sidecar. Reading ahead changes nothing for the own-write rule, which is applied at the take.
   */
  private static final class Incoming implements ClientResponseObserver<SubscribeRequest, SubscribeResponse> {
    private static final int READ_AHEAD = 64;
    private static final Object COMPLETED = new Object();

    /** Responses, then the end: {@link #COMPLETED} or the call's error. */
    private final BlockingQueue<Object> queue = new LinkedBlockingQueue<>();
    private ClientCallStreamObserver<SubscribeRequest> call;
    private int taken;

    @Override
    public void beforeStart(ClientCallStreamObserver<SubscribeRequest> call) {
      this.call = call;
      call.disableAutoRequestWithInitial(READ_AHEAD);
    }

    @Override
    public void onNext(SubscribeResponse response) {
      queue.add(response);
    }

    @Override
    public void onError(Throwable error) {
      queue.add(error);
    }

    @Override
    public void onCompleted() {
      queue.add(COMPLETED);
    }

    /** The next response, waiting for it; null once the stream ended; throws the error it ended with. */
    SubscribeResponse take() throws InterruptedException {
      Object next = queue.take();
      if (next instanceof SubscribeResponse response) {
        if (++taken == READ_AHEAD / 2) {
          taken = 0;
          call.request(READ_AHEAD / 2);
        }
        return response;
      }
      queue.add(next); // the end stays the end
      if (next == COMPLETED) {
        return null;
      }
      throw next instanceof StatusRuntimeException e ? e : Status.fromThrowable((Throwable) next).asRuntimeException();
    }
  }
}
