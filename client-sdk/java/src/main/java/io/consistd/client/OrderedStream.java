// One long-lived bidirectional stream shared by many calls (SendStream, AckStream), answered in request order.
package io.consistd.client;

import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Queue;
import java.util.concurrent.CompletableFuture;
import java.util.function.Function;

/**
 * A streaming call every call of one kind shares: each call's request goes out on it and its answer comes back in
 * request order, so calls made together share the sidecar's disk flush instead of each paying for a unary call.
 * Opened by the first call, and again by the first call after it broke; a broken stream fails the calls waiting on
 * it with UNAVAILABLE ("lost the connection to the sidecar"), so the same retries apply as to a unary call that
 * could not reach the sidecar. The stream runs in a context of its own, so it outlives the context of the call that
 * happened to open it.
 *
 * @param <Req> the stream's request message
 * @param <Resp> the stream's response message
 */
final class OrderedStream<Req, Resp> {
  /** Names the operation in errors: "send", "ack". */
  private final String what;
  /** Starts the streaming call with the observer of its answers; returns where its requests go. */
  private final Function<StreamObserver<Resp>, StreamObserver<Req>> open;
  /** Guards {@link #current} and {@link #closed}; held while a request is written, so requests keep their order. */
  private final Object lock = new Object();
  private Call current;
  private boolean closed;

  OrderedStream(String what, Function<StreamObserver<Resp>, StreamObserver<Req>> open) {
    this.what = what;
    this.open = open;
  }

  /**
   * Sends {@code request} on the stream, opening one if none is open or the open one broke; the future completes
   * with its answer, or with the UNAVAILABLE {@link StatusRuntimeException} of a stream that broke first (CANCELLED
   * once {@link #close}d). Cancelling the future does not take the request back: its answer, when it comes, is
   * dropped, and later calls still get their own.
   */
  CompletableFuture<Resp> call(Req request) {
    CompletableFuture<Resp> answer = new CompletableFuture<>();
    synchronized (lock) {
      if (closed) {
        answer.completeExceptionally(closedError());
        return answer;
      }
      if (current == null || current.await(answer) != null) {
        current = new Call();
        current.start();
        StatusRuntimeException failed = current.await(answer);
        if (failed != null) {
          // The stream failed while it was being opened (gRPC may say so at once): the call fails with it.
          answer.completeExceptionally(failed);
          return answer;
        }
      }
      try {
        current.requests.onNext(request);
      } catch (RuntimeException e) {
        // The call is over already (its end is on its way to the reader), or this request cannot be sent.
        current.fail(lost(e));
      }
    }
    return answer;
  }

  /** Ends the stream; the calls waiting on it, and every later call, fail with CANCELLED. */
  void close() {
    Call call;
    synchronized (lock) {
      closed = true;
      call = current;
      current = null;
    }
    if (call != null) {
      call.fail(closedError());
    }
  }

  private StatusRuntimeException closedError() {
    return Status.CANCELLED.withDescription(what + ": the client is closed").asRuntimeException();
  }

  /** The error of the calls a broken stream leaves waiting. */
  private StatusRuntimeException lost(Throwable cause) {
    String why = cause == null ? "the sidecar ended the stream" : Status.fromThrowable(cause).getDescription();
    if (why == null) {
      why = Status.fromThrowable(cause).getCode().toString();
    }
    return Status.UNAVAILABLE.withDescription(what + ": lost the connection to the sidecar: " + why)
        .withCause(cause).asRuntimeException();
  }

  /** One streaming call and the answers waiting for it, oldest first. */
  private final class Call implements StreamObserver<Resp> {
    private final Context.CancellableContext context = Context.ROOT.withCancellation();
    private final Queue<CompletableFuture<Resp>> waiting = new ArrayDeque<>();
    /** Why the call ended; then nothing waits on it any more. Guarded by {@code waiting}. */
    private StatusRuntimeException broken;
    StreamObserver<Req> requests;

    void start() {
      Context previous = context.attach();
      try {
        requests = open.apply(this);
      } finally {
        context.detach(previous);
      }
    }

    /** Queues an answer, unless the call broke: then it returns why (and null once queued). */
    StatusRuntimeException await(CompletableFuture<Resp> answer) {
      synchronized (waiting) {
        if (broken == null) {
          waiting.add(answer);
        }
        return broken;
      }
    }

    @Override
    public void onNext(Resp response) {
      CompletableFuture<Resp> next;
      synchronized (waiting) {
        next = waiting.poll();
      }
      if (next != null) {
        next.complete(response);
      }
    }

    @Override
    public void onError(Throwable t) {
      fail(lost(t));
    }

    @Override
    public void onCompleted() {
      fail(lost(null));
    }

    /** Marks the call broken with {@code why} (unless it is already) and fails every waiting answer with it. */
    void fail(StatusRuntimeException why) {
      List<CompletableFuture<Resp>> failed;
      synchronized (waiting) {
        if (broken != null) {
          return;
        }
        broken = why;
        failed = new ArrayList<>(waiting);
        waiting.clear();
      }
      context.cancel(null);
      for (CompletableFuture<Resp> answer : failed) {
        answer.completeExceptionally(why);
      }
    }
  }
}
