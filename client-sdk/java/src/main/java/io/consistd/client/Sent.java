// A message the sidecar stored, whose outcome the app may await (OutboxService.WaitOutcome, retried when lost).
package io.consistd.client;

import consistd.v1.Outbox.WaitOutcomeRequest;
import consistd.v1.Outbox.WaitOutcomeResponse;
import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * A message the sidecar has stored. Its outcome is the message's first (ACKED, SUPERSEDED or FAILED; for a Service
 * or election destination, the first member's): as a {@link CompletableFuture} from {@link #outcome()}, or blocking
 * from {@link #await()}. Nothing is asked until then: the SDK keeps no outcome stream and no table of outcomes.
 *
 * <p>Each wait calls {@code OutboxService.WaitOutcome}, which the sidecar answers when the outcome comes, or at once
 * if it came already; once a wait obtained the outcome, it is kept here and given again without asking. A lost
 * connection (UNAVAILABLE) is retried with the reconnect backoff (100 ms doubling to 5 s), so an outcome that came
 * while the connection was down is still seen. Every other status completes the wait as the sidecar sent it:
 * NOT_FOUND when it no longer knows the outcome (it restarted since the message settled, or keeps only the last
 * 10,000). A timeout bounds one wait; waiting again goes on waiting and misses nothing. Safe for concurrent use.
 */
public final class Sent {
  private final String messageId;
  private final Outbox outbox;
  /** The outcome once a wait obtained it; null before. */
  private volatile Outcome outcome;

  Sent(String messageId, Outbox outbox) {
    this.messageId = messageId;
    this.outbox = outbox;
  }

  /** The sidecar's id for the message. */
  public String messageId() {
    return messageId;
  }

  /**
   * Waits for the outcome without blocking: the future completes with it, or exceptionally with the sidecar's
   * {@link StatusRuntimeException} (never UNAVAILABLE, which is retried; CANCELLED once the client is closed).
   * Each call is a wait of its own; cancelling the future ends that wait (and its call to the sidecar) and nothing
   * else. Completed at once when an earlier wait obtained the outcome.
   */
  public CompletableFuture<Outcome> outcome() {
    Outcome known = outcome;
    if (known != null) {
      return CompletableFuture.completedFuture(known);
    }
    CompletableFuture<Outcome> result = new CompletableFuture<>();
    Waiting waiting = new Waiting(result);
    result.whenComplete((o, e) -> waiting.stop());
    waiting.attempt();
    return result;
  }

  /**
   * {@link #outcome()} bounded by {@code timeout}: past it, the future completes exceptionally with a
   * {@link TimeoutException} and the wait ends; a later wait goes on waiting.
   */
  public CompletableFuture<Outcome> outcome(Duration timeout) {
    CompletableFuture<Outcome> result = outcome();
    if (!result.isDone()) {
      ScheduledFuture<?> timer = Outbox.TIMER.schedule(
          () -> result.completeExceptionally(timedOut(timeout)), timeout.toNanos(), TimeUnit.NANOSECONDS);
      result.whenComplete((o, e) -> timer.cancel(false));
    }
    return result;
  }

  /**
   * Blocks until the outcome is known and returns it.
   *
   * @throws StatusRuntimeException the sidecar's answer, as it sent it (NOT_FOUND: it no longer knows the outcome);
   *     a lost connection is retried, not thrown
   * @throws InterruptedException if the thread is interrupted while waiting (the wait ends)
   */
  public Outcome await() throws InterruptedException {
    CompletableFuture<Outcome> result = outcome();
    try {
      return result.get();
    } catch (ExecutionException e) {
      throw Outbox.rethrown(e.getCause());
    } finally {
      result.cancel(false);
    }
  }

  /**
   * Blocks until the outcome is known, at most {@code timeout}, and returns it.
   *
   * @throws TimeoutException when {@code timeout} passed first; waiting again goes on waiting
   * @throws StatusRuntimeException the sidecar's answer, as it sent it (NOT_FOUND: it no longer knows the outcome);
   *     a lost connection is retried, not thrown
   * @throws InterruptedException if the thread is interrupted while waiting (the wait ends)
   */
  public Outcome await(Duration timeout) throws InterruptedException, TimeoutException {
    CompletableFuture<Outcome> result = outcome();
    try {
      return result.get(timeout.toNanos(), TimeUnit.NANOSECONDS);
    } catch (ExecutionException e) {
      throw Outbox.rethrown(e.getCause());
    } catch (TimeoutException e) {
      throw timedOut(timeout);
    } finally {
      result.cancel(false);
    }
  }

  @Override
  public String toString() {
    Outcome known = outcome;
    return "Sent[" + messageId + (known == null ? "" : ", " + known.kind()) + "]";
  }

  private TimeoutException timedOut(Duration timeout) {
    return new TimeoutException("message " + messageId + ": no outcome within " + timeout.toMillis() + " ms");
  }

  /** One wait: WaitOutcome calls, made again after a lost connection, until {@code result} is complete. */
  private final class Waiting implements StreamObserver<WaitOutcomeResponse> {
    private final CompletableFuture<Outcome> result;
    private final Backoff backoff = new Backoff();
    /** The call in flight; cancelled when the wait ends. */
    private volatile Context.CancellableContext call;
    /** The pause before the next call, if one is pending. */
    private volatile ScheduledFuture<?> retry;

    Waiting(CompletableFuture<Outcome> result) {
      this.result = result;
    }

    void attempt() {
      if (result.isDone()) {
        return;
      }
      Context.CancellableContext context = Context.ROOT.withCancellation();
      call = context;
      if (result.isDone()) { // stop() ran before this call was visible to it
        context.cancel(null);
        return;
      }
      WaitOutcomeRequest request = WaitOutcomeRequest.newBuilder().setMessageId(messageId).build();
      context.run(() -> outbox.stub().waitOutcome(request, this));
    }

    void stop() {
      Context.CancellableContext current = call;
      if (current != null) {
        current.cancel(null);
      }
      ScheduledFuture<?> pending = retry;
      if (pending != null) {
        pending.cancel(false);
      }
    }

    @Override
    public void onNext(WaitOutcomeResponse response) {
      Outcome got;
      try {
        got = Outcome.from(response.getOutcome());
      } catch (StatusRuntimeException e) {
        result.completeExceptionally(e);
        return;
      }
      // Every answer is the same first outcome; the first one kept is as good as any.
      if (outcome == null) {
        outcome = got;
      }
      result.complete(got);
    }

    @Override
    public void onError(Throwable t) {
      if (result.isDone()) {
        return;
      }
      StatusRuntimeException e =
          t instanceof StatusRuntimeException s ? s : Status.fromThrowable(t).asRuntimeException();
      if (outbox.channel().isShutdown()) {
        result.completeExceptionally(Status.CANCELLED
            .withDescription("message " + messageId + ": the client is closed").withCause(t).asRuntimeException());
      } else if (!Backoff.retryable(e)) {
        result.completeExceptionally(e);
      } else {
        retry = Outbox.TIMER.schedule(() -> {
          // The sidecar may be back: connect at once rather than after gRPC's reconnect backoff.
          outbox.channel().resetConnectBackoff();
          attempt();
        }, backoff.step().toNanos(), TimeUnit.NANOSECONDS);
        if (result.isDone()) {
          retry.cancel(false);
        }
      }
    }

    @Override
    public void onCompleted() {}
  }
}
