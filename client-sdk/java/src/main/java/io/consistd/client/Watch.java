// A watch of objects through the sidecar, resumed after a lost connection, with the own-write rule at the take.
package io.consistd.client;

import consistd.v1.Watch.SubscribeRequest;
import consistd.v1.Watch.SubscribeResponse;
import consistd.v1.WatchServiceGrpc;
import io.grpc.StatusRuntimeException;
import java.util.Iterator;
import java.util.NoSuchElementException;

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
  /**
   * Whether the own-write rule is applied here; not for the reader of a {@link Latest}, which applies it where its
   * worker takes a state and must see every state the daemon sent to keep its books.
   */
  private final boolean judged;
  /** The next subscription's request: after each response, its cursor is the one to resume from. */
  private SubscribeRequest request;
  private final ResumingStream<SubscribeRequest, SubscribeResponse> stream;
  private SubscribeResponse pending;
  private boolean iterated;

  Watch(ConsistdClient client, WatchRequest request) {
    this(client, request, true);
  }

  Watch(ConsistdClient client, WatchRequest request, boolean judged) {
    this.client = client;
    this.judged = judged;
    this.request = request.toProto();
    this.consistent = request.mode() == WatchRequest.Mode.CONSISTENT;
    // Callbacks on the transport's thread: they only queue.
    WatchServiceGrpc.WatchServiceStub stub = WatchServiceGrpc.newStub(client.channel()).withExecutor(Runnable::run);
    this.stream = new ResumingStream<>(client, "watch", stub::subscribe, () -> this.request);
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
      if (judged && state && client.writes().predates(event.object())) {
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
    stream.close();
  }

  /** The next response, the request moved on to its cursor; null once closed. */
  private SubscribeResponse receive() {
    SubscribeResponse response = stream.receive();
    if (response != null && !response.getCursor().isEmpty()) {
      request = request.toBuilder().setResumeCursor(response.getCursor()).build();
    }
    return response;
  }
}
