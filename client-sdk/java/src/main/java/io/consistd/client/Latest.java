// The newest state per object of a CONSISTENT watch, handed to workers as they ask, the own-write rule at the hand-out
// and a worker's own write not handed back.
package io.consistd.client;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The newest state of each object of a CONSISTENT watch, for workers that ask for the next one when they are ready
 * ({@link ConsistdClient#watchLatest}): the way to consume a CONSISTENT watch when the handler is slow. Safe for use by
 * any number of worker threads; close it when done.
 *
 * <pre>{@code
 * try (Latest latest = client.watchLatest(WatchRequest.of("configmaps").namespace("default"))) {
 *   Runnable worker = () -> {
 *     while (true) {
 *       try (Latest.Taken taken = latest.take()) { // the object's newest state; no other worker has it meanwhile
 *         handle(taken.event());
 *       } catch (InterruptedException e) {
 *         return;
 *       }
 *     }
 *   };
 *   ...
 * }
 * }</pre>
 *
 * <p>Why it exists: an app that reads a watch into a buffer of its own (the newest state per object) while a worker
 * per object handles one state at a time takes each state twice, when its reader takes it from the watch and when its
 * worker takes it from the buffer. {@link Watch} applies the own-write rule at the first take; a state taken while the
 * worker was still writing then waits in the buffer, and the worker, once its write returned, handles a state older
 * than it (issue 46, item 5: a Kopf-shaped app executed one value twice in 56). Here the buffer is the SDK's, and the
 * rule is applied when a worker is handed a state.
 *
 * <ul>
 *   <li><b>One pending state per object.</b> A thread of the SDK's reads the watch continuously and keeps, per object
 *       (namespace and name), only the newest state not yet handed out: a DELETED replaces whatever waited, and so
 *       does a later state (a re-created object's ADDED replaces its deletion). That is the bound: one event per
 *       object, plus the identity (namespace, name, uid, resourceVersion) of each object the watch says exists, to
 *       tell deletions after a resync.
 *   <li><b>Pulled, never pushed.</b> A worker asks for the next object's newest state ({@link #take}, {@link #poll});
 *       a slow worker never holds up the reader, and is never handed a state that waited in a queue while a newer
 *       one came.
 *   <li><b>The own-write rule where the worker takes it.</b> An ADDED or MODIFIED state older than a write through
 *       {@link ConsistdClient#objects} that returned is dropped when it would be handed out, however long it waited: a
 *       worker is never handed a state that predates its own write (the write's own state follows).
 *   <li><b>A worker's own write is not handed back.</b> A MODIFIED state that a write through
 *       {@link ConsistdClient#objects} made directly on top of the state the workers last had of the object is not
 *       handed out: its {@link WatchEvent#previousResourceVersion} is the resourceVersion of the last state of that
 *       object handed out (same uid), and its own resourceVersion is the one the client's latest write to the object
 *       returned. The worker that wrote it already has it, and nothing else happened in between; it counts as had for
 *       the next state. Still handed out: a state whose previous state is another writer's (it holds a change no worker
 *       saw), a state with no previous state known (an ADDED, a state from a list or a resync), and a state made by
 *       more than one write since the last hand-out (its previous state is one no worker had). The bound: per object
 *       the uid and resourceVersion of the last state handed out, forgotten at the object's deletion.
 *   <li><b>One worker per object at a time.</b> An object handed out is in progress until its {@link Taken} is done
 *       ({@link Taken#done}, or {@link Taken#close} at the end of a try-with-resources); newer states wait meanwhile
 *       and are handed out after. So N workers can share one {@code Latest}, each on a different object.
 *   <li><b>Markers.</b> SYNCED and RESYNC_REQUIRED are not handed out. After RESYNC_REQUIRED (the watch could not
 *       resume), every object of the fresh snapshot is handed out again, and at its SYNCED each object the watch said
 *       existed but the snapshot does not hold is handed out as DELETED, its object carrying only its identity (JSON
 *       {@code {"metadata": {name, namespace, uid, resourceVersion}}}).
 *   <li><b>Errors.</b> An error that ends the watch (anything but a lost connection, which the watch resumes from) is
 *       thrown by every {@link #take} and {@link #poll} from then on, at once, as the daemon sent it
 *       ({@link StatusRuntimeException}); states still pending are dropped. After {@link #close} they throw
 *       CANCELLED.
 * </ul>
 */
public final class Latest implements AutoCloseable {
  /** An object's key: its namespace (empty when cluster-scoped) and name. */
  private record Key(String namespace, String name) {
    static Key of(KubeObject o) {
      return new Key(o.namespace(), o.name());
    }
  }

  /** Which state of an object the workers last had: its uid and resourceVersion. */
  private record Seen(String uid, String resourceVersion) {}

  private final OwnWrites writes;
  /** Ends the watch the reader reads. */
  private final AutoCloseable source;
  private final Thread reader;

  /** The newest state of each object not handed out yet. */
  private final Map<Key, WatchEvent> pending = new HashMap<>();
  /** Keys with a pending state and no worker, oldest first: the order they are handed out in. */
  private final ArrayDeque<Key> ready = new ArrayDeque<>();
  /** Keys a worker holds. */
  private final Set<Key> taken = new HashSet<>();
  /**
   * Per key, the uid and resourceVersion of the last state handed out, or passed over as the workers' own write: what
   * the state of a write through this client must directly follow to be passed over. Forgotten when the object is
   * deleted, so bounded by the live objects.
   */
  private final Map<Key, Seen> seen = new HashMap<>();
  /** The identity of each object the watch says exists: what a resync's snapshot is checked against. */
  private final Map<Key, KubeObject> live = new HashMap<>();
  /** Since RESYNC_REQUIRED and until its SYNCED, the keys the fresh snapshot held; null otherwise. */
  private Set<Key> resync;
  /** What ended the watch. */
  private StatusRuntimeException failed;

  /**
   * Reads {@code events} (a watch without the own-write rule) on a thread of its own; {@code source} ends them.
   * Package-private: {@link ConsistdClient#watchLatest} makes one.
   */
  Latest(Iterator<WatchEvent> events, AutoCloseable source, OwnWrites writes) {
    this.writes = writes;
    this.source = source;
    this.reader = new Thread(() -> read(events), "consistd-latest");
    reader.setDaemon(true);
    reader.start();
  }

  /**
   * Waits for the next object with a pending state that no worker holds, and hands its newest state out (dropping, at
   * this moment, a state older than the client's own write to it, and the state the client's own write made directly
   * on the last state handed out). Close what it returns when the work is over.
   *
   * @throws StatusRuntimeException the error that ended the watch (CANCELLED once closed)
   * @throws InterruptedException if the thread is interrupted while waiting
   */
  public Taken take() throws InterruptedException {
    return poll(null); // never null without a timeout
  }

  /**
   * As {@link #take}, waiting at most {@code timeout} (null: no limit); null if nothing was handed out in that time.
   *
   * @throws StatusRuntimeException the error that ended the watch (CANCELLED once closed)
   * @throws InterruptedException if the thread is interrupted while waiting
   */
  public synchronized Taken poll(Duration timeout) throws InterruptedException {
    long deadline = timeout == null ? 0 : System.nanoTime() + timeout.toNanos();
    while (true) {
      if (failed != null) {
        throw failed.getStatus().asRuntimeException();
      }
      Taken next = handOut();
      if (next != null) {
        return next;
      }
      if (timeout == null) {
        wait();
      } else {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          return null;
        }
        wait(Math.max(1, left / 1_000_000));
      }
    }
  }

  /** How many objects have a state waiting (held by a worker or not). */
  public synchronized int pending() {
    return pending.size();
  }

  /** Ends the watch; workers waiting in {@link #take} throw CANCELLED. */
  @Override
  public void close() {
    synchronized (this) {
      fail(Status.CANCELLED.withDescription("the newest-state watch was closed").asRuntimeException());
    }
    try {
      source.close();
    } catch (Exception e) {
      // Closing a watch throws nothing; anything else closing may throw changes nothing here.
    }
    reader.interrupt();
  }

  /** Every event of the watch into the books, until the watch fails or is closed. */
  private void read(Iterator<WatchEvent> events) {
    try {
      while (events.hasNext()) {
        WatchEvent event = events.next();
        synchronized (this) {
          if (failed != null) {
            return;
          }
          arrived(event);
          notifyAll();
        }
      }
    } catch (StatusRuntimeException e) {
      synchronized (this) {
        fail(e);
      }
      return;
    } catch (RuntimeException e) {
      synchronized (this) {
        fail(Status.UNKNOWN.withDescription("the newest-state reader failed: " + e).withCause(e).asRuntimeException());
      }
      return;
    }
    synchronized (this) {
      fail(Status.CANCELLED.withDescription("the newest-state watch was closed").asRuntimeException());
    }
  }

  /** Takes in one event of the watch. Holds the lock. */
  private void arrived(WatchEvent event) {
    switch (event.type()) {
      case RESYNC_REQUIRED -> resync = new HashSet<>();
      case SYNCED -> {
        Set<Key> seen = resync;
        resync = null;
        if (seen == null) {
          return;
        }
        List<Key> gone = new ArrayList<>();
        for (Key key : live.keySet()) {
          if (!seen.contains(key)) {
            gone.add(key);
          }
        }
        for (Key key : gone) {
          seen.remove(key);
          put(key, deleted(live.remove(key), event.cursor()));
        }
      }
      case ADDED, MODIFIED, DELETED -> {
        KubeObject o = event.object();
        if (o == null) {
          return;
        }
        Key key = Key.of(o);
        if (event.type() == WatchEvent.Type.DELETED) {
          live.remove(key);
          seen.remove(key);
        } else {
          live.put(key, new KubeObject(o.uid(), o.namespace(), o.name(), o.resourceVersion(), ""));
          if (resync != null) {
            resync.add(key);
          }
        }
        put(key, event);
      }
    }
  }

  /**
   * Makes {@code event} the key's pending state, replacing an older one; the key becomes ready unless it already was
   * or a worker holds it. Holds the lock.
   */
  private void put(Key key, WatchEvent event) {
    if (!pending.containsKey(key) && !taken.contains(key)) {
      ready.addLast(key);
    }
    pending.put(key, event);
  }

  /**
   * The next ready key's state, the key now taken. Dropped here: a state older than the client's own write (the
   * own-write rule at the take), and the state the client's own write made directly on the last state handed out (see
   * {@link Latest}). Holds the lock.
   */
  private Taken handOut() {
    Key key;
    while ((key = ready.pollFirst()) != null) {
      WatchEvent event = pending.remove(key);
      if (event == null) {
        continue;
      }
      boolean state = event.type() == WatchEvent.Type.ADDED || event.type() == WatchEvent.Type.MODIFIED;
      if (state && writes.predates(event.object())) {
        continue; // its own write's state follows on the watch
      }
      if (state) {
        boolean own = ownWriteOnSeen(key, event);
        seen.put(key, new Seen(event.object().uid(), event.object().resourceVersion()));
        if (own) {
          continue; // the worker that wrote it has it
        }
      } else {
        seen.remove(key);
      }
      taken.add(key);
      return new Taken(this, key, event);
    }
    return null;
  }

  /**
   * Whether {@code event} is the state the client's own write made directly on the last state of {@code key} the
   * workers had: the same object (uid), following that state, at the resourceVersion the client's latest write to it
   * returned. Holds the lock.
   */
  private boolean ownWriteOnSeen(Key key, WatchEvent event) {
    Seen had = seen.get(key);
    KubeObject o = event.object();
    return had != null
        && had.uid().equals(o.uid())
        && !event.previousResourceVersion().isEmpty()
        && event.previousResourceVersion().equals(had.resourceVersion())
        && writes.wrote(o);
  }

  private synchronized void release(Key key) {
    taken.remove(key);
    if (pending.containsKey(key)) {
      ready.addLast(key);
    }
    notifyAll();
  }

  /** Ends the books with {@code error} (the first error stays). Holds the lock. */
  private void fail(StatusRuntimeException error) {
    if (failed != null) {
      return;
    }
    failed = error;
    pending.clear();
    ready.clear();
    seen.clear();
    notifyAll();
  }

  /** The DELETED event of an object a resync's snapshot no longer holds: its identity, and as JSON its metadata. */
  private static WatchEvent deleted(KubeObject identity, String cursor) {
    StringBuilder json = new StringBuilder("{\"metadata\":{\"name\":").append(quoted(identity.name()));
    if (!identity.namespace().isEmpty()) {
      json.append(",\"namespace\":").append(quoted(identity.namespace()));
    }
    json.append(",\"uid\":").append(quoted(identity.uid()))
        .append(",\"resourceVersion\":").append(quoted(identity.resourceVersion()))
        .append("}}");
    KubeObject object = new KubeObject(
        identity.uid(), identity.namespace(), identity.name(), identity.resourceVersion(), json.toString());
    return new WatchEvent(WatchEvent.Type.DELETED, object, cursor, WatchEvent.Consistency.UNSPECIFIED, false);
  }

  /** {@code text} as a JSON string. */
  private static String quoted(String text) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : text.toCharArray()) {
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.append('"').toString();
  }

  /**
   * The state handed to a worker: the object's newest event when it was handed out. The object stays in progress,
   * handed to no other worker, until {@link #done} (or {@link #close}).
   */
  public static final class Taken implements AutoCloseable {
    private final Latest latest;
    private final Key key;
    private final WatchEvent event;
    private boolean finished;

    private Taken(Latest latest, Key key, WatchEvent event) {
      this.latest = latest;
      this.key = key;
      this.event = event;
    }

    /** The event: ADDED, MODIFIED or DELETED. */
    public WatchEvent event() {
      return event;
    }

    /** The object's namespace; empty when cluster-scoped. */
    public String namespace() {
      return key.namespace();
    }

    /** The object's name. */
    public String name() {
      return key.name();
    }

    /** Ends the work on this object: a state that came meanwhile is handed out next. Calling it again does nothing. */
    public void done() {
      synchronized (this) {
        if (finished) {
          return;
        }
        finished = true;
      }
      latest.release(key);
    }

    /** {@link #done}, for try-with-resources. */
    @Override
    public void close() {
      done();
    }

    @Override
    public String toString() {
      return "Taken[" + event + "]";
    }
  }
}
