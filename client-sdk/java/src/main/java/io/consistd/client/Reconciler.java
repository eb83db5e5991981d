// A reconciler on the sidecar's work queue (ReconcileService.Reconcile): each work item goes to the app's handler,
// and how the handler ends is the lease's completion.
package io.consistd.client;

import consistd.v1.Reconcile.Completion;
import consistd.v1.Reconcile.CompletionRefused;
import consistd.v1.Reconcile.Outcome;
import consistd.v1.Reconcile.ReconcileRequest;
import consistd.v1.Reconcile.ReconcileResponse;
import consistd.v1.ReconcileServiceGrpc;
import io.grpc.Context;
import io.grpc.Deadline;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.lang.System.Logger.Level;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.HashMap;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.Semaphore;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Works on one reconcile queue, shaped like controller-runtime's Reconciler: the sidecar hands out keys that need
 * work, and {@link Handler#reconcile} is called with each, on threads of the reconciler's own, at most {@link
 * QueueSpec#maxLeases()} at once and never two for one key. {@link #run()} blocks until {@link #close()} (from any
 * thread) or until the sidecar refuses the spec.
 *
 * <pre>{@code
 * QueueSpec spec = QueueSpec.of("web", "configmaps").namespace("default").labelSelector("app=web");
 * try (Reconciler reconciler = new Reconciler(client, spec, item -> {
 *   if (item.deleted() || item.object() == null) {
 *     return Reconciler.Result.done();
 *   }
 *   item.objects().patch("configmaps", item.namespace(), item.name(), ObjectsClient.PatchType.MERGE,
 *       "{\"metadata\":{\"annotations\":{\"seen\":\"yes\"}}}"); // names the item's lease
 *   return Reconciler.Result.done(); // throwing instead comes back after a backoff, with attempt + 1
 * })) {
 *   reconciler.run(); // until closed from another thread, or the spec is refused
 * }
 * }</pre>
 *
 * <p>How the handler ends is the lease's completion: returning {@link Result#done()} (or null) is DONE; returning
 * {@link Result#requeue(Duration)} is REQUEUE; throwing is RETRY with the exception's message (the key comes again
 * after its backoff, with {@link WorkItem#attempt()} one higher and {@link WorkItem#lastError()} set); throwing a
 * {@link TerminalException}, or an exception caused by one, is TERMINAL (the key waits for a change).
 *
 * <p>A pass is cancelled when its lease times out ({@link WorkItem#expiresAt()}), when the connection to the sidecar
 * is lost (the sidecar has put its lease back in the queue), and when the reconciler is closed: its thread is
 * interrupted, gRPC calls it makes on that thread end CANCELLED (or DEADLINE_EXCEEDED), {@link WorkItem#cancelled()}
 * turns true, and its outcome is dropped.
 *
 * <p>When the connection is lost (UNAVAILABLE, or the stream ends unasked) the reconciler opens the stream again
 * with the same spec, with backoff from 100 ms to 5 s. A key handed out again meanwhile waits in this process until
 * its old pass has returned, and new passes wait for free slots among maxLeases. A completion the sidecar refuses is
 * logged ({@link System.Logger} {@code io.consistd.client.Reconciler}), never fatal: the lease then times out and
 * the key comes again.
 */
public final class Reconciler implements AutoCloseable {
  /** The app's work: one pass over one key. */
  @FunctionalInterface
  public interface Handler {
    /**
     * Reconciles the item's key.
     *
     * @return {@link Result#done()} (or null) when the key is reconciled; {@link Result#requeue(Duration)} to have
     *     it handed out again after a delay
     * @throws TerminalException when it failed and retrying cannot help (TERMINAL)
     * @throws Exception when it failed: it is handed out again after a backoff (RETRY)
     */
    Result reconcile(WorkItem item) throws Exception;
  }

  /**
   * What a pass that did not fail asks for, as controller-runtime's {@code reconcile.Result}.
   *
   * @param requeueAfter when more than zero, hand the key out again after this long (sooner if its object changes);
   *     sent as at least 1 ms and at most 24 h, the daemon's bounds. Null or zero: done
   * @param priority the priority of the pass this queues (the requeue, or one for a change during the pass): a
   *     higher one is handed out first, as controller-runtime 0.23's {@code Result.Priority}; default 0
   */
  public record Result(Duration requeueAfter, int priority) {
    private static final Result DONE = new Result(null, 0);

    /** The key is reconciled: it comes again when its object (or a related one) changes. */
    public static Result done() {
      return DONE;
    }

    /** Hand the key out again after {@code after} (sooner if its object changes). */
    public static Result requeue(Duration after) {
      Objects.requireNonNull(after, "after");
      return new Result(after, 0);
    }

    /** This result, the pass it queues at {@code priority}. */
    public Result withPriority(int priority) {
      return new Result(requeueAfter, priority);
    }
  }

  /** The longest error text a completion may carry, in bytes (the daemon's limit). */
  static final int MAX_COMPLETION_ERROR = 4096;

  static final Duration MIN_REQUEUE_AFTER = Duration.ofMillis(1);
  static final Duration MAX_REQUEUE_AFTER = Duration.ofHours(24);

  private static final System.Logger LOG = System.getLogger(Reconciler.class.getName());
  private static final AtomicInteger RECONCILERS = new AtomicInteger();

  private final ConsistdClient client;
  private final QueueSpec spec;
  private final Handler handler;
  /** A permit per pass running: one stream never has more leases, but passes of a lost stream may still run. */
  private final Semaphore slots;
  /** Per key, completed when the key's latest pass ends; a pass of the key waits for the one before it. */
  private final Map<String, CompletableFuture<Void>> running = new HashMap<>();
  private final ExecutorService passes;
  /** Ends passes at their lease's expiry. */
  private final ScheduledExecutorService deadlines;
  private final AtomicBoolean ran = new AtomicBoolean();
  private final CountDownLatch closing = new CountDownLatch(1);
  private volatile boolean closed;
  private volatile Stream current;

  /**
   * A reconciler of {@code spec}'s queue through {@code client}, calling {@code handler} for each item. Nothing
   * happens until {@link #run()}.
   */
  public Reconciler(ConsistdClient client, QueueSpec spec, Handler handler) {
    this.client = Objects.requireNonNull(client, "client");
    this.spec = Objects.requireNonNull(spec, "spec");
    this.handler = Objects.requireNonNull(handler, "handler");
    this.slots = new Semaphore(Math.max(spec.leases(), 1));
    String prefix = "consistd-reconcile-" + spec.name() + "-" + RECONCILERS.incrementAndGet();
    this.passes = Executors.newCachedThreadPool(threads(prefix + "-pass-"));
    this.deadlines = Executors.newSingleThreadScheduledExecutor(threads(prefix + "-deadlines-"));
  }

  private static ThreadFactory threads(String prefix) {
    AtomicInteger n = new AtomicInteger();
    return runnable -> {
      Thread thread = new Thread(runnable, prefix + n.incrementAndGet());
      thread.setDaemon(true);
      return thread;
    };
  }

  /**
   * Works on the queue until {@link #close()} is called (then it returns) or the sidecar refuses the spec (then it
   * throws that status, unchanged: INVALID_ARGUMENT naming the field, FAILED_PRECONDITION when the queue runs with
   * another spec, NOT_FOUND for an unknown resource, PERMISSION_DENIED). Before it returns, every pass still running
   * has returned. A reconciler runs once.
   *
   * @throws StatusRuntimeException the sidecar's refusal (anything but a lost connection)
   * @throws InterruptedException if the calling thread is interrupted: the reconciler is then closed
   */
  public void run() throws InterruptedException {
    if (!ran.compareAndSet(false, true)) {
      throw new IllegalStateException("a reconciler runs once; make another to run again");
    }
    try {
      ReconcileRequest request = spec.toProto();
      Backoff backoff = new Backoff();
      while (!closed) {
        StatusRuntimeException failure = stream(request, backoff);
        if (closed) {
          return;
        }
        if (!Backoff.retryable(failure)) {
          throw failure;
        }
        LOG.log(Level.WARNING, "consistd: reconcile queue {0} lost the connection to the sidecar ({1}); opening "
            + "the stream again", spec.name(), failure.getStatus());
        if (closing.await(backoff.step().toMillis(), TimeUnit.MILLISECONDS)) {
          return;
        }
        // The sidecar may be back: connect at once rather than after gRPC's reconnect backoff.
        client.channel().resetConnectBackoff();
      }
    } finally {
      close();
      passes.shutdown();
      boolean interrupted = false;
      while (true) {
        try {
          if (passes.awaitTermination(1, TimeUnit.HOURS)) {
            break;
          }
        } catch (InterruptedException e) {
          interrupted = true;
        }
      }
      deadlines.shutdownNow();
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /**
   * Stops the reconciler: the stream ends (the sidecar puts its leases back in the queue), running passes are
   * cancelled, and {@link #run()} returns once they have. May be called from any thread, more than once.
   */
  @Override
  public void close() {
    closed = true;
    closing.countDown();
    Stream s = current;
    if (s != null) {
      s.context.cancel(null);
    }
  }

  /**
   * One stream: opens it, sends the spec, starts a pass for each item, until the stream fails; returns why (null
   * once closed). The passes it started are cancelled with it.
   */
  private StatusRuntimeException stream(ReconcileRequest request, Backoff backoff) throws InterruptedException {
    Stream s = new Stream(Context.current().withCancellation());
    current = s;
    if (closed) {
      s.context.cancel(null);
      return null;
    }
    try {
      s.context.run(() -> ReconcileServiceGrpc.newStub(client.channel()).reconcile(s));
      s.send(request);
      Object first = s.responses.take();
      if (!(first instanceof ReconcileResponse started)) {
        return s.failure(first);
      }
      if (!started.hasStarted()) {
        return Status.INTERNAL.withDescription(
            "reconcile: the sidecar answered the spec with " + started + " instead of STARTED").asRuntimeException();
      }
      backoff.reset();
      while (true) {
        Object next = s.responses.take();
        if (!(next instanceof ReconcileResponse response)) {
          return s.failure(next);
        }
        if (response.hasItem()) {
          start(s, WorkItem.from(response.getItem(), client, spec));
        } else if (response.hasRefused()) {
          CompletionRefused refused = response.getRefused();
          LOG.log(Level.WARNING, "consistd: the sidecar refused the completion of lease {0} of reconcile queue {1}: "
              + "{2} {3}", refused.getLeaseId(), spec.name(),
              Status.fromCodeValue(refused.getRefusal().getCode()).getCode(), refused.getRefusal().getMessage());
        }
      }
    } finally {
      s.context.cancel(null);
    }
  }

  /** One pass of {@code item}, on a thread of its own, after the key's previous pass and once a slot is free. */
  private void start(Stream s, WorkItem item) {
    Context.CancellableContext context = item.expiresAt() == null
        ? s.context.withCancellation()
        : s.context.withDeadline(
            Deadline.after(Duration.between(Instant.now(), item.expiresAt()).toNanos(), TimeUnit.NANOSECONDS),
            deadlines);
    item.bind(context);
    CompletableFuture<Void> done = new CompletableFuture<>();
    CompletableFuture<Void> previous;
    synchronized (running) {
      previous = running.put(item.key(), done);
    }
    Pass pass = new Pass(s, item, context, previous, done);
    context.addListener(c -> pass.interrupt(), Runnable::run);
    passes.execute(pass);
  }

  /** A pass: waits its turn, runs the handler in the lease's context, sends the completion. */
  private final class Pass implements Runnable {
    private final Stream stream;
    private final WorkItem item;
    private final Context.CancellableContext context;
    private final CompletableFuture<Void> previous;
    private final CompletableFuture<Void> done;
    /** The thread running the pass while it runs; guarded by this. */
    private Thread thread;
    private boolean finished;

    Pass(Stream stream, WorkItem item, Context.CancellableContext context, CompletableFuture<Void> previous,
        CompletableFuture<Void> done) {
      this.stream = stream;
      this.item = item;
      this.context = context;
      this.previous = previous;
      this.done = done;
    }

    /** Interrupts the pass's thread, if it still runs the pass. */
    synchronized void interrupt() {
      if (thread != null && !finished) {
        thread.interrupt();
      }
    }

    @Override
    public void run() {
      synchronized (this) {
        thread = Thread.currentThread();
      }
      try {
        runPass();
      } finally {
        synchronized (this) {
          finished = true;
          thread = null;
        }
        Thread.interrupted(); // a cancellation that came late is not the next task's
        synchronized (running) {
          running.remove(item.key(), done);
        }
        done.complete(null);
        context.cancel(null);
      }
    }

    private void runPass() {
      try {
        if (context.isCancelled()) {
          dropped("before its pass started");
          return;
        }
        if (previous != null) {
          previous.get();
        }
        slots.acquire();
      } catch (InterruptedException e) {
        dropped("before its pass started: the key's previous pass still ran, or no slot of maxLeases was free");
        return;
      } catch (ExecutionException e) {
        throw new IllegalStateException(e); // never: a pass's future is only completed normally
      }
      Result result = null;
      Throwable error = null;
      try {
        result = context.call(() -> handler.reconcile(item));
      } catch (Throwable t) {
        error = t;
        if (t instanceof Error && !(t instanceof AssertionError)) {
          LOG.log(Level.ERROR, "consistd: a pass of " + item + " of reconcile queue " + spec.name() + " threw", t);
        }
        if (t instanceof VirtualMachineError vm) {
          slots.release();
          throw vm;
        }
      }
      slots.release();
      if (context.isCancelled()) {
        dropped("while its pass ran");
        return;
      }
      stream.send(ReconcileRequest.newBuilder().setComplete(completion(item.leaseId(), result, error)).build());
    }

    /** Logs a pass whose lease ran out; one whose stream ended needs no word, its loss is logged once. */
    private void dropped(String when) {
      if (stream.context.isCancelled() || !(context.cancellationCause() instanceof TimeoutException)) {
        return;
      }
      LOG.log(Level.WARNING, "consistd: the lease of {0} of reconcile queue {1} timed out {2}; the key goes back to "
          + "the queue and the pass''s outcome is dropped", item, spec.name(), when);
    }
  }

  /** The completion a pass's end asks for. */
  static Completion completion(String leaseId, Result result, Throwable error) {
    Completion.Builder c = Completion.newBuilder().setLeaseId(leaseId).setPriority(result == null ? 0 : result.priority());
    if (error != null) {
      return c.setOutcome(terminal(error) ? Outcome.OUTCOME_TERMINAL : Outcome.OUTCOME_RETRY)
          .setError(truncate(describe(error), MAX_COMPLETION_ERROR))
          .build();
    }
    Duration after = result == null ? null : result.requeueAfter();
    if (after == null || after.isZero() || after.isNegative()) {
      return c.setOutcome(Outcome.OUTCOME_DONE).build();
    }
    if (after.compareTo(MIN_REQUEUE_AFTER) < 0) {
      after = MIN_REQUEUE_AFTER;
    } else if (after.compareTo(MAX_REQUEUE_AFTER) > 0) {
      after = MAX_REQUEUE_AFTER;
    }
    return c.setOutcome(Outcome.OUTCOME_REQUEUE).setRequeueAfter(QueueSpec.duration(after)).build();
  }

  /** Whether {@code error} is, or was caused by, a {@link TerminalException}. */
  static boolean terminal(Throwable error) {
    for (Throwable t = error; t != null; t = t.getCause() == t ? null : t.getCause()) {
      if (t instanceof TerminalException) {
        return true;
      }
    }
    return false;
  }

  /** An exception's text for the daemon: its message, or what it is when it has none. */
  static String describe(Throwable error) {
    String message = error.getMessage();
    return message == null || message.isEmpty() ? error.toString() : message;
  }

  /** {@code text} cut to at most {@code bytes} bytes of UTF-8, at a character's boundary. */
  static String truncate(String text, int bytes) {
    if (text.getBytes(StandardCharsets.UTF_8).length <= bytes) {
      return text;
    }
    int used = 0;
    int end = 0;
    while (end < text.length()) {
      int cp = text.codePointAt(end);
      int size = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      if (used + size > bytes) {
        break;
      }
      used += size;
      end += Character.charCount(cp);
    }
    return text.substring(0, end);
  }

  /** One Reconcile stream: what the daemon sends, queued for run's thread; completions sent one at a time. */
  private static final class Stream implements ClientResponseObserver<ReconcileRequest, ReconcileResponse> {
    /** The stream ended without an error. */
    private static final Object END = new Object();

    final Context.CancellableContext context;
    /** ReconcileResponse, the Throwable the stream ended with, or END. */
    final BlockingQueue<Object> responses = new LinkedBlockingQueue<>();
    private ClientCallStreamObserver<ReconcileRequest> requests;

    Stream(Context.CancellableContext context) {
      this.context = context;
    }

    @Override
    public void beforeStart(ClientCallStreamObserver<ReconcileRequest> requests) {
      this.requests = requests;
    }

    @Override
    public void onNext(ReconcileResponse response) {
      responses.add(response);
    }

    @Override
    public void onError(Throwable t) {
      responses.add(t);
    }

    @Override
    public void onCompleted() {
      responses.add(END);
    }

    /** Sends a message, unless the stream has ended (the daemon has put its leases back in the queue). */
    synchronized void send(ReconcileRequest request) {
      if (context.isCancelled()) {
        return;
      }
      try {
        requests.onNext(request);
      } catch (RuntimeException e) {
        // The call has ended; the reader sees why and opens another.
      }
    }

    /** Why the stream ended: its status, or UNAVAILABLE when it ended unasked. */
    StatusRuntimeException failure(Object ended) {
      if (ended instanceof StatusRuntimeException e) {
        return e;
      }
      if (ended instanceof Throwable t) {
        return Status.fromThrowable(t).asRuntimeException(Status.trailersFromThrowable(t));
      }
      return Backoff.ended("reconcile");
    }
  }
}
