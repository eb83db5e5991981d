// Sends with an awaitable outcome, over one SendStream the client's sends share.
package io.consistd.client;

import consistd.v1.Outbox.SendStreamRequest;
import consistd.v1.Outbox.SendStreamResponse;
import consistd.v1.OutboxServiceGrpc;
import consistd.v1.RefusalOuterClass.Refusal;
import io.grpc.Channel;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;

/**
 * Sends messages to peer pods' apps through the sidecar's outbox, which stores each durably and resends it with
 * backoff until the receiving app ACKs it (or a newer event of the same resource supersedes it).
 *
 * <pre>{@code
 * Outbox outbox = client.outbox();
 * Sent sent = outbox.send(SendRequest.to(Destination.peer("10.0.0.7:7443"))
 *     .resourceId("orders/42").eventId("7").payload("{\"state\":\"paid\"}").contentType("application/json"));
 * Outcome outcome = sent.await(Duration.ofSeconds(30)); // ACKED, SUPERSEDED or FAILED; or sent.outcome()
 * }</pre>
 *
 * <p>A send made as an election's leader can be guarded by its term, as a write is: {@code
 * SendRequest.to(...).guard(led.guard())} (an {@link ObjectOption.Guard}) is stored only while this sidecar leads that
 * election in that term (else FAILED_PRECONDITION, {@code "guard: ..."}), and a receiving sidecar that has stored a
 * message of a later term refuses it (its outcome is FAILED naming both terms). See {@link SendRequest#guard}.
 *
 * <p>Every send of one client goes out on one {@code OutboxService.SendStream} call, opened by the first send and
 * kept open; its answers come back in request order, so sends made together (from any threads) share the
 * sidecar's disk flush. A message the sidecar refuses fails only its own send, with the status a unary Send would
 * have had (INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED for a payload over {@code
 * outbox.maxPayloadBytes}, ...). When the connection to the sidecar is lost, the sends waiting on the stream fail
 * with UNAVAILABLE, and the next send opens a new stream; such a message may or may not have been stored. Safe for
 * concurrent use.
 */
public final class Outbox {
  /** Runs the pauses before a lost WaitOutcome is made again, and the timeouts of {@link Sent#outcome}. */
  static final ScheduledExecutorService TIMER = timer();

  private final ManagedChannel channel;
  private final OutboxServiceGrpc.OutboxServiceStub stub;
  private final OrderedStream<SendStreamRequest, SendStreamResponse> sends;

  Outbox(ConsistdClient client) {
    this(client.channel(), client.channel());
  }

  /** An outbox whose calls go through {@code calls} (the client's channel, or the tests' intercepted view of it). */
  Outbox(ManagedChannel channel, Channel calls) {
    this.channel = channel;
    this.stub = OutboxServiceGrpc.newStub(calls);
    this.sends = new OrderedStream<>("send", stub::sendStream);
  }

  private static ScheduledExecutorService timer() {
    ScheduledThreadPoolExecutor timer = new ScheduledThreadPoolExecutor(1, runnable -> {
      Thread thread = new Thread(runnable, "consistd-outcome-timer");
      thread.setDaemon(true);
      return thread;
    });
    timer.setRemoveOnCancelPolicy(true);
    return Executors.unconfigurableScheduledExecutorService(timer);
  }

  /**
   * Stores the message in the sidecar's outbox and returns once it is durable; the sidecar then delivers it and
   * resends it until the receiving app ACKs it. {@link Sent#outcome()} or {@link Sent#await} gives its outcome; a
   * {@code Sent} never asked costs nothing more.
   *
   * @throws StatusRuntimeException the sidecar's refusal of this message as a unary Send would have answered it
   *     (FAILED_PRECONDITION for a {@link SendRequest#guard} whose term this sidecar does not lead); UNAVAILABLE
   *     when the connection to the sidecar was lost first (the message may or may not be stored); CANCELLED if the
   *     thread is interrupted while waiting (the message may still be stored; the interrupt flag stays set)
   */
  public Sent send(SendRequest request) {
    CompletableFuture<Sent> sent = sendAsync(request);
    try {
      return sent.get();
    } catch (ExecutionException e) {
      throw rethrown(e.getCause());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw Status.CANCELLED
          .withDescription("send: interrupted while waiting for the sidecar (the message may still be stored)")
          .withCause(e).asRuntimeException();
    }
  }

  /**
   * {@link #send} without blocking: the future completes with the {@link Sent} once the sidecar stored the message,
   * or exceptionally with the {@link StatusRuntimeException} {@code send} would throw. Cancelling the future (or
   * {@code orTimeout}) does not take the message back; it may still be stored.
   */
  public CompletableFuture<Sent> sendAsync(SendRequest request) {
    CompletableFuture<Sent> sent = new CompletableFuture<>();
    sends.call(SendStreamRequest.newBuilder().setMessage(request.toProto()).build()).whenComplete((answer, failure) -> {
      if (failure != null) {
        sent.completeExceptionally(failure);
      } else if (answer.hasRefusal()) {
        sent.completeExceptionally(refused(answer.getRefusal()));
      } else {
        sent.complete(new Sent(answer.getMessageId(), this));
      }
    });
    return sent;
  }

  /** Ends the send stream: sends waiting on it, and later ones, fail with CANCELLED. */
  void close() {
    sends.close();
  }

  OutboxServiceGrpc.OutboxServiceStub stub() {
    return stub;
  }

  ManagedChannel channel() {
    return channel;
  }

  /** The error of a request a streaming call refused: the status the unary call would have answered. */
  static StatusRuntimeException refused(Refusal refusal) {
    return Status.fromCodeValue(refusal.getCode()).withDescription(refusal.getMessage()).asRuntimeException();
  }

  /** A failure another thread completed a future with, thrown again here with this thread's stack. */
  static RuntimeException rethrown(Throwable cause) {
    if (cause instanceof StatusRuntimeException e) {
      return new StatusRuntimeException(e.getStatus(), e.getTrailers());
    }
    if (cause instanceof RuntimeException e) {
      return e;
    }
    return Status.fromThrowable(cause).asRuntimeException();
  }
}
