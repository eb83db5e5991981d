// A campaign or an observation of one election: its newest status, told to a listener and/or pulled, kept through
// lost connections, with the leader's deadline kept by the SDK.
package io.consistd.client;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.time.Instant;
import java.util.NoSuchElementException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * One election this client campaigns in ({@link Leadership#campaign}) or observes ({@link Leadership#observe}), until
 * it is closed. Closing a campaign resigns: the stream ends and the sidecar releases the Lease at once.
 *
 * <pre>{@code
 * try (Election election = client.leadership().campaign("controller", "", status -> {
 *       if (status.state() == LeadershipStatus.State.LEADER) startLeading(status.term()); else stopLeading();
 *     })) {
 *   ... // until the app shuts down
 * }
 * }</pre>
 *
 * <p><b>Why a listener and a pull, both of the newest status.</b> Leadership is a state, not a stream of events:
 * what matters is the newest status, and an app acting on an old one is wrong. So nothing queues. A {@link
 * LeadershipListener} is called on a thread of the SDK's (one per election), coalesced: a listener still busy when
 * statuses come is next called with the newest only. It suits apps that start and stop leader work as the state
 * changes. The pull suits an app's own loop and tests: {@link #next} waits for the newest status not yet taken,
 * {@link #current} answers at once, {@link #awaitLeader} waits until this sidecar leads, {@link #isLeader} asks
 * whether it leads now. Both shapes read the same state and may be used together; neither ever holds up the SDK's
 * reading of the stream, so renewals and the leader's deadline are kept while the app is busy. A {@link
 * java.util.concurrent.Flow.Publisher} would have to buffer or drop for a slow subscriber, and drop-to-newest is
 * exactly the listener; an iterator that reads the stream only when the app pulls (as {@link Watch} does, for the
 * own-write rule) would leave renewals unread and the deadline unkept while the app is busy.
 *
 * <p><b>The leader's deadline.</b> While this sidecar leads, each renewal of the Lease moves {@link #leaderUntil} on
 * without a new status. If it passes with no renewal (the sidecar is stopped or cut off from the apiserver), the SDK
 * reports UNKNOWN (no holder, same term) at that moment: stop acting as leader.
 *
 * <p><b>Lost connections.</b> If the connection to the sidecar is lost (UNAVAILABLE, or the stream ends without the
 * app closing it), UNKNOWN is reported at once (unless it was the last status already), then the election is opened
 * again with backoff (100 ms doubling to 5 s, back to 100 ms after a status). Every other error is the daemon's
 * refusal of the election: it ends the election, goes to {@link LeadershipListener#onError} and is thrown by the pull
 * as the daemon sent it (a {@link StatusRuntimeException}, INVALID_ARGUMENT naming the field). An election still
 * open when its {@link ConsistdClient} is closed ends with CANCELLED.
 */
public final class Election implements AutoCloseable {
  private static final System.Logger LOG = System.getLogger(Election.class.getName());

  /** Opens one stream of the election's statuses into {@code statuses}; the answer cancels it. */
  @FunctionalInterface
  interface Opener {
    Runnable open(StreamObserver<consistd.v1.Leadership.LeadershipStatus> statuses);
  }

  private final Opener opener;
  private final Runnable reconnect;
  private final String what;
  private final Backoff backoff = new Backoff();
  /** Reopens streams after their pause and reports UNKNOWN at the leader's deadline: never runs app code. */
  private final ScheduledThreadPoolExecutor timer;

  private final Object lock = new Object();
  // Everything below is guarded by lock.
  /** The newest status; renewals move its leaderUntil without making it news. */
  private LeadershipStatus latest;
  /** Counts the statuses that were news; 0 while the daemon has told nothing. */
  private long version;
  /** The version the pull took last. */
  private long taken;
  /** The daemon's refusal: the election is over. */
  private StatusRuntimeException failure;
  private boolean closed;
  /** Of the current stream; what an older stream reports is ignored. */
  private long generation;
  private Runnable cancelStream;
  private ScheduledFuture<?> expiry;

  Election(String election, String namespace, String identity, String what, Opener opener, Runnable reconnect,
      LeadershipListener listener) {
    this.opener = opener;
    this.reconnect = reconnect;
    this.what = what;
    this.latest = LeadershipStatus.unknown(election, namespace, identity);
    this.timer = new ScheduledThreadPoolExecutor(1, runnable -> {
      Thread thread = new Thread(runnable, "consistd-election-" + election);
      thread.setDaemon(true);
      return thread;
    });
    timer.setRemoveOnCancelPolicy(true);
    if (listener != null) {
      Thread dispatcher = new Thread(() -> dispatch(listener), "consistd-election-listener-" + election);
      dispatcher.setDaemon(true);
      dispatcher.start();
    }
    open();
  }

  /**
   * The newest status not taken yet, waiting for one. A status that comes while none waits replaces the one not
   * taken: the pull never sees a backlog. The first is the daemon's first (the current state).
   *
   * @throws StatusRuntimeException the daemon's refusal of the election, each time once it came
   * @throws NoSuchElementException once the election is closed
   * @throws InterruptedException if the thread is interrupted while waiting
   */
  public LeadershipStatus next() throws InterruptedException {
    synchronized (lock) {
      while (true) {
        LeadershipStatus status = takeLocked();
        if (status != null) {
          return status;
        }
        lock.wait();
      }
    }
  }

  /**
   * {@link #next}, waiting at most {@code timeout}; null if no new status came within it.
   *
   * @throws StatusRuntimeException the daemon's refusal of the election
   * @throws NoSuchElementException once the election is closed
   * @throws InterruptedException if the thread is interrupted while waiting
   */
  public LeadershipStatus poll(Duration timeout) throws InterruptedException {
    long deadline = System.nanoTime() + timeout.toNanos();
    synchronized (lock) {
      while (true) {
        LeadershipStatus status = takeLocked();
        if (status != null) {
          return status;
        }
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          return null;
        }
        TimeUnit.NANOSECONDS.timedWait(lock, left);
      }
    }
  }

  /**
   * Waits until this sidecar leads and returns that LEADER status (whose term is the fencing token); it counts as
   * taken for {@link #next}.
   *
   * @throws TimeoutException if it did not lead within {@code timeout}
   * @throws StatusRuntimeException the daemon's refusal of the election
   * @throws NoSuchElementException once the election is closed
   * @throws InterruptedException if the thread is interrupted while waiting
   */
  public LeadershipStatus awaitLeader(Duration timeout) throws InterruptedException, TimeoutException {
    long deadline = System.nanoTime() + timeout.toNanos();
    synchronized (lock) {
      while (true) {
        endedLocked();
        if (leadsLocked(Instant.now())) {
          taken = version;
          return latest;
        }
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          throw new TimeoutException(
              "not leader of " + latest.namespace() + "/" + latest.election() + " within " + timeout + ": " + latest);
        }
        TimeUnit.NANOSECONDS.timedWait(lock, left);
      }
    }
  }

  /**
   * The newest status, at once: UNKNOWN with term 0 before the daemon told anything, UNKNOWN once the election ended
   * with the daemon's refusal. Its leaderUntil is the latest renewal's.
   */
  public LeadershipStatus current() {
    synchronized (lock) {
      return latest;
    }
  }

  /**
   * Whether this sidecar leads now: the newest status is LEADER and its deadline ({@link #leaderUntil}) has not
   * passed. False once the election is closed or refused. The only time to act as leader.
   */
  public boolean isLeader() {
    synchronized (lock) {
      return !closed && failure == null && leadsLocked(Instant.now());
    }
  }

  /**
   * While the newest status is LEADER, the moment until which the sidecar says so without renewing again, moved on
   * by each renewal; null in other states (and from daemons that do not send it).
   */
  public Instant leaderUntil() {
    synchronized (lock) {
      return latest.leaderUntil();
    }
  }

  /**
   * Ends the election: a campaign resigns (the sidecar releases the Lease at once). A {@link #next} waiting in
   * another thread throws {@link NoSuchElementException}; the listener is not called again (a call under way runs
   * to its end; close does not wait for it, so a listener may close its own election).
   */
  @Override
  public void close() {
    Runnable cancel;
    synchronized (lock) {
      if (closed) {
        return;
      }
      closed = true;
      generation++;
      cancel = cancelStream;
      cancelStream = null;
      cancelExpiryLocked();
      lock.notifyAll();
    }
    if (cancel != null) {
      cancel.run();
    }
    timer.shutdownNow();
  }

  /** The newest status not taken, null if there is none; throws once the election ended. */
  private LeadershipStatus takeLocked() {
    endedLocked();
    if (version > taken) {
      taken = version;
      return latest;
    }
    return null;
  }

  private void endedLocked() {
    if (closed) {
      throw new NoSuchElementException("the election is closed");
    }
    if (failure != null) {
      throw failure;
    }
  }

  private boolean leadsLocked(Instant now) {
    return latest.state() == LeadershipStatus.State.LEADER && !latest.lapsedAt(now);
  }

  /** Opens a stream (again), unless the election ended meanwhile. */
  private void open() {
    long stream;
    synchronized (lock) {
      if (closed || failure != null) {
        return;
      }
      stream = ++generation;
    }
    Runnable cancel;
    try {
      cancel = opener.open(new Receiver(stream));
    } catch (RuntimeException e) {
      ended(stream, e);
      return;
    }
    synchronized (lock) {
      if (stream == generation) {
        cancelStream = cancel;
        return;
      }
    }
    cancel.run(); // closed (or already ended) while it opened
  }

  /** Takes what one stream tells; reports of a stream that is not the current one are ignored. */
  private final class Receiver implements StreamObserver<consistd.v1.Leadership.LeadershipStatus> {
    private final long stream;

    Receiver(long stream) {
      this.stream = stream;
    }

    @Override
    public void onNext(consistd.v1.Leadership.LeadershipStatus status) {
      synchronized (lock) {
        if (stream != generation) {
          return;
        }
        backoff.reset();
        statusLocked(LeadershipStatus.from(status, Instant.now()));
      }
    }

    @Override
    public void onError(Throwable t) {
      ended(stream, t);
    }

    @Override
    public void onCompleted() {
      ended(stream, Backoff.ended(what));
    }
  }

  /**
   * A status from the daemon. One with the newest's state, holder and term is a renewal (or a reopened stream's
   * first): it only moves the newest's deadline.
   */
  private void statusLocked(LeadershipStatus status) {
    if (version > 0 && status.sameAs(latest)) {
      if (latest.state() == LeadershipStatus.State.LEADER) {
        latest = latest.renewedUntil(status.leaderUntil());
        scheduleExpiryLocked();
        lock.notifyAll(); // an awaitLeader that saw the old deadline pass looks again
      }
      return;
    }
    publishLocked(status);
  }

  private void publishLocked(LeadershipStatus status) {
    latest = status;
    version++;
    scheduleExpiryLocked();
    lock.notifyAll();
  }

  /** Reports UNKNOWN at the newest LEADER's deadline unless a renewal moves it first. */
  private void scheduleExpiryLocked() {
    cancelExpiryLocked();
    Instant until = latest.leaderUntil();
    if (latest.state() != LeadershipStatus.State.LEADER || until == null || timer.isShutdown()) {
      return;
    }
    long delay = Math.max(0, Duration.between(Instant.now(), until).toNanos());
    expiry = timer.schedule(this::expire, delay, TimeUnit.NANOSECONDS);
  }

  private void cancelExpiryLocked() {
    if (expiry != null) {
      expiry.cancel(false);
      expiry = null;
    }
  }

  private void expire() {
    synchronized (lock) {
      if (closed || failure != null) {
        return;
      }
      if (latest.lapsedAt(Instant.now())) {
        publishLocked(latest.unknownAfter());
      } else {
        scheduleExpiryLocked(); // woken early
      }
    }
  }

  /** The stream ended with {@code t}: open it again after a pause if the connection was lost, else end. */
  private void ended(long stream, Throwable t) {
    StatusRuntimeException error =
        t instanceof StatusRuntimeException e ? e : Status.fromThrowable(t).asRuntimeException();
    boolean refused = !Backoff.retryable(error);
    Runnable cancel;
    synchronized (lock) {
      if (stream != generation || closed) {
        return;
      }
      generation++;
      cancel = cancelStream;
      cancelStream = null;
      if (refused) {
        failure = error;
        latest = latest.unknownAfter();
        cancelExpiryLocked();
        lock.notifyAll();
      } else {
        // Tell the app at once that it may no longer lead, then try again.
        if (version == 0 || latest.state() != LeadershipStatus.State.UNKNOWN) {
          publishLocked(latest.unknownAfter());
        }
        timer.schedule(() -> {
          // The sidecar may be back: connect at once rather than after gRPC's reconnect backoff.
          reconnect.run();
          open();
        }, backoff.step().toNanos(), TimeUnit.NANOSECONDS);
      }
    }
    if (cancel != null) {
      cancel.run();
    }
    if (refused) {
      timer.shutdown();
    }
  }

  /** The listener's thread: calls it with the newest status not told yet, or the refusal, until the end. */
  private void dispatch(LeadershipListener listener) {
    long told = 0;
    while (true) {
      LeadershipStatus status;
      StatusRuntimeException error = null;
      synchronized (lock) {
        try {
          while (!closed && failure == null && version == told) {
            lock.wait();
          }
        } catch (InterruptedException e) {
          return;
        }
        if (closed) {
          return;
        }
        error = failure;
        status = latest;
        told = version;
      }
      try {
        if (error != null) {
          listener.onError(error);
          return;
        }
        listener.onStatus(status);
      } catch (RuntimeException e) {
        LOG.log(System.Logger.Level.WARNING, "the listener of " + what + " " + status.election() + " threw", e);
      }
    }
  }
}
