// Messages from peer pods: a handler whose return ACKs the message and whose exception NACKs it.
package io.consistd.client;

import consistd.v1.Inbox.AckStreamRequest;
import consistd.v1.Inbox.AckStreamResponse;
import consistd.v1.Inbox.NackRequest;
import consistd.v1.Inbox.NackResponse;
import consistd.v1.Inbox.ReceiveRequest;
import consistd.v1.Inbox.ReceiveResponse;
import consistd.v1.InboxServiceGrpc;
import io.grpc.Channel;
import io.grpc.Context;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharsetEncoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Iterator;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The messages peers sent to this pod. {@link #handle} runs a handler for each: when it returns, the message is
 * ACKed (the ACK travels back to the sender, whose outcome is then ACKED); when it throws, the message is NACKed
 * with the exception's message as the reason and comes again later.
 *
 * <pre>{@code
 * try (Inbox.Handling handling = client.inbox().handle(message -> {
 *   apply(message.resourceId(), message.text()); // throw to have it delivered again
 * })) {
 *   handling.done().join(); // until closed elsewhere, or ended by an error reconnecting cannot mend
 * }
 * }</pre>
 *
 * <p><b>Concurrency.</b> One {@code handle} call is one receiver: its handler runs on a thread of its own, one
 * message at a time, oldest first; the next message is handled once this one's ACK or NACK is settled. For
 * messages handled in parallel, call {@code handle} several times: the sidecar hands each message to one of its
 * receivers (and a message a closed receiver held un-ACKed to another), so order across receivers is not kept. The
 * ACKs of every receiver of one inbox share one {@code AckStream} call to the sidecar. Safe for concurrent use.
 */
public final class Inbox {
  /** How long a NACKed message waits before it comes again, unless told otherwise. */
  public static final Duration DEFAULT_RETRY_AFTER = Duration.ofSeconds(1);
  /** Bounds an ACK or NACK, which is sent even while the handling is being closed. */
  static final Duration SETTLE_TIMEOUT = Duration.ofSeconds(10);
  /** The longest NACK reason the sidecar accepts, in bytes of UTF-8. */
  static final int MAX_REASON = 4096;

  /** Processes one message: returning ACKs it, throwing NACKs it (throw {@link Retry} to choose the delay). */
  @FunctionalInterface
  public interface Handler {
    void handle(InboxMessage message) throws Exception;
  }

  /** Thrown by a handler to NACK its message with a delay of its own choosing instead of the inbox's. */
  public static final class Retry extends Exception {
    private static final long serialVersionUID = 1L;

    private final transient Duration after;

    /** NACK with {@code reason}; the message comes again after {@code after}. */
    public Retry(String reason, Duration after) {
      this(reason, null, after);
    }

    /** NACK with {@code reason}, caused by {@code cause}; the message comes again after {@code after}. */
    public Retry(String reason, Throwable cause, Duration after) {
      super(reason, cause);
      this.after = Objects.requireNonNull(after, "after");
    }

    /** When the message comes again. */
    public Duration after() {
      return after;
    }
  }

  private final ManagedChannel channel;
  private final InboxServiceGrpc.InboxServiceBlockingStub blocking;
  private final InboxServiceGrpc.InboxServiceStub async;
  private final OrderedStream<AckStreamRequest, AckStreamResponse> acks;

  Inbox(ConsistdClient client) {
    this(client.channel(), client.channel());
  }

  /** An inbox whose calls go through {@code calls} (the client's channel, or the tests' intercepted view of it). */
  Inbox(ManagedChannel channel, Channel calls) {
    this.channel = channel;
    this.blocking = InboxServiceGrpc.newBlockingStub(calls);
    this.async = InboxServiceGrpc.newStub(calls);
    this.acks = new OrderedStream<>("ack", async::ackStream);
  }

  /** {@link #handle(Duration, Handler)} with NACKed messages coming again after {@link #DEFAULT_RETRY_AFTER}. */
  public Handling handle(Handler handler) {
    return handle(DEFAULT_RETRY_AFTER, handler);
  }

  /**
   * Starts calling {@code handler} with each message, on a thread of the SDK's (a daemon thread named {@code
   * consistd-inbox}), one at a time, oldest first, until the returned handling is closed. When the handler returns,
   * the message is ACKed; when it throws, it is NACKed with the exception's message (its class name if it has none;
   * at most 4096 bytes) and comes again after {@code retryAfter} (or the {@link Retry}'s delay). An {@link Error}
   * from the handler NACKs the message too, then ends the handling with that error.
   *
   * <p>When the connection to the sidecar is lost (UNAVAILABLE, or the stream ends unasked) the handling receives
   * again with backoff (100 ms doubling to 5 s, reset after a message); a message not yet ACKed then comes again. An
   * ACK or NACK lost that way is not an error, for the same reason. Any other status (a refused Receive, ACK or
   * NACK) ends the handling: {@link Handling#done()} completes with it.
   */
  public Handling handle(Duration retryAfter, Handler handler) {
    Handling handling = new Handling(Objects.requireNonNull(retryAfter, "retryAfter"),
        Objects.requireNonNull(handler, "handler"));
    handling.thread.start();
    return handling;
  }

  /** Ends the ACK stream: ACKs waiting on it, and later ones, fail with CANCELLED. */
  void close() {
    acks.close();
  }

  /**
   * One running {@link #handle}: close it to stop. {@link #done()} tells when it ended, and with what error if
   * it was not closed.
   */
  public final class Handling implements AutoCloseable {
    private final Duration retryAfter;
    private final Handler handler;
    private final Thread thread;
    private final CompletableFuture<Void> done = new CompletableFuture<>();
    private final Backoff backoff = new Backoff();
    /** The current Receive call's context: cancelling it ends the stream. */
    private volatile Context.CancellableContext call;
    private volatile boolean closed;

    private Handling(Duration retryAfter, Handler handler) {
      this.retryAfter = retryAfter;
      this.handler = handler;
      this.thread = new Thread(this::run, "consistd-inbox");
      this.thread.setDaemon(true);
    }

    /**
     * Completes normally once the handling is closed and its last message settled, or exceptionally with the
     * {@link StatusRuntimeException} (or the handler's {@link Error}) that ended it.
     */
    public CompletableFuture<Void> done() {
      return done;
    }

    /**
     * Stops receiving. A handler still running is interrupted (a handler that then throws NACKs its message,
     * which comes again); close waits until it returned and its message is ACKed or NACKed, unless called from
     * the handler itself. Idempotent.
     */
    @Override
    public void close() {
      closed = true;
      Context.CancellableContext current = call;
      if (current != null) {
        current.cancel(null);
      }
      if (Thread.currentThread() == thread) {
        return;
      }
      // Ends a handler that waits, and the pause before receiving again; an ACK or NACK is not interrupted.
      thread.interrupt();
      boolean interrupted = false;
      while (true) {
        try {
          thread.join();
          break;
        } catch (InterruptedException e) {
          interrupted = true;
        }
      }
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }

    private void run() {
      try {
        while (!closed) {
          StatusRuntimeException failure = receive();
          if (closed) {
            break;
          }
          if (!Backoff.retryable(failure)) {
            done.completeExceptionally(failure);
            return;
          }
          try {
            backoff.pause();
          } catch (InterruptedException e) {
            continue; // closed meanwhile
          }
          // The sidecar may be back: connect at once rather than after gRPC's reconnect backoff.
          channel.resetConnectBackoff();
        }
        done.complete(null);
      } catch (Error e) {
        done.completeExceptionally(e);
      } finally {
        Context.CancellableContext current = call;
        if (current != null) {
          current.cancel(null);
        }
      }
    }

    /** Handles the messages of one Receive call until it ends; returns why it ended. */
    private StatusRuntimeException receive() {
      Context.CancellableContext context = Context.ROOT.withCancellation();
      call = context;
      try {
        if (closed) {
          return Status.CANCELLED.withDescription("inbox: closed").asRuntimeException();
        }
        Iterator<ReceiveResponse> stream;
        Context previous = context.attach();
        try {
          stream = blocking.receive(ReceiveRequest.getDefaultInstance());
        } finally {
          context.detach(previous);
        }
        while (!closed) {
          if (!stream.hasNext()) {
            return Backoff.ended("inbox");
          }
          ReceiveResponse response = stream.next();
          backoff.reset();
          if (response.hasMessage()) {
            settle(response.getMessage().getMessageId(), run(InboxMessage.from(response.getMessage())));
          }
        }
        return Status.CANCELLED.withDescription("inbox: closed").asRuntimeException();
      } catch (StatusRuntimeException e) {
        return e;
      } finally {
        context.cancel(null);
      }
    }

    /** Runs the handler on one message; what it threw, or null. */
    private Throwable run(InboxMessage message) {
      try {
        handler.handle(message);
        return null;
      } catch (Exception | Error e) {
        return e;
      }
    }

    /**
     * ACKs the message if the handler returned, NACKs it if it threw. A lost connection is not an error (the
     * message comes again); any other refusal is thrown. An Error from the handler is thrown after the NACK.
     */
    private void settle(String id, Throwable failure) {
      try {
        if (failure == null) {
          AckStreamResponse answer = uninterruptibly(acks.call(AckStreamRequest.newBuilder().setMessageId(id).build()));
          if (answer.hasRefusal()) {
            throw Outbox.refused(answer.getRefusal());
          }
        } else {
          Duration after = failure instanceof Retry r ? r.after() : retryAfter;
          NackRequest nack = NackRequest.newBuilder()
              .setMessageId(id)
              .setRetryAfter(com.google.protobuf.Duration.newBuilder()
                  .setSeconds(after.getSeconds()).setNanos(after.getNano()))
              .setReason(truncate(reason(failure), MAX_REASON))
              .build();
          CompletableFuture<NackResponse> answer = new CompletableFuture<>();
          Context.ROOT.run(() -> async.withDeadlineAfter(SETTLE_TIMEOUT.toNanos(), TimeUnit.NANOSECONDS)
              .nack(nack, completing(answer)));
          uninterruptibly(answer);
        }
      } catch (StatusRuntimeException e) {
        if (!Backoff.retryable(e) && !closed) {
          throw e;
        }
      }
      if (failure instanceof Error e) {
        throw e;
      }
    }
  }

  /** Waits for {@code answer} at most {@link #SETTLE_TIMEOUT}, through interrupts; a timeout counts as lost. */
  private static <T> T uninterruptibly(CompletableFuture<T> answer) {
    long deadline = System.nanoTime() + SETTLE_TIMEOUT.toNanos();
    boolean interrupted = false;
    try {
      while (true) {
        try {
          return answer.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
          interrupted = true;
        } catch (ExecutionException e) {
          throw Outbox.rethrown(e.getCause());
        } catch (TimeoutException e) {
          answer.cancel(false);
          throw Status.UNAVAILABLE
              .withDescription("no answer from the sidecar within " + SETTLE_TIMEOUT.toSeconds() + " s")
              .asRuntimeException();
        }
      }
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  private static <T> StreamObserver<T> completing(CompletableFuture<T> future) {
    return new StreamObserver<>() {
      @Override
      public void onNext(T value) {
        future.complete(value);
      }

      @Override
      public void onError(Throwable t) {
        future.completeExceptionally(t);
      }

      @Override
      public void onCompleted() {}
    };
  }

  /** The NACK reason for what a handler threw: its message, or its class name if it has none. */
  private static String reason(Throwable failure) {
    String message = failure.getMessage();
    return message == null || message.isEmpty() ? failure.getClass().getName() : message;
  }

  /** {@code s} shortened to at most {@code max} bytes of UTF-8, without splitting a character. */
  static String truncate(String s, int max) {
    if (s.length() * 3 <= max) {
      return s;
    }
    CharsetEncoder encoder = StandardCharsets.UTF_8.newEncoder()
        .onMalformedInput(CodingErrorAction.REPLACE).onUnmappableCharacter(CodingErrorAction.REPLACE);
    ByteBuffer out = ByteBuffer.allocate(max);
    CharBuffer in = CharBuffer.wrap(s);
    encoder.encode(in, out, true);
    // The encoder stops before a character that does not fit whole; what it consumed is the prefix that fits.
    return s.substring(0, in.position());
  }
}
