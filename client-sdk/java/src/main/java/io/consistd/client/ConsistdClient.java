// The client: one connection to the consistd sidecar over its Unix socket.
package io.consistd.client;

import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.netty.NettyChannelBuilder;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.epoll.EpollDomainSocketChannel;
import io.netty.channel.epoll.EpollIoHandler;
import io.netty.channel.unix.DomainSocketAddress;
import java.time.Duration;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;

/**
 * A connection to one consistd sidecar: watch objects, read and write them (optionally fenced by a leadership
 * term), lead elections, send messages with an awaitable outcome and handle those peers send, work on a reconcile
 * queue, follow rollouts, and, through {@link #channel()}, call any service of {@code proto/consistd/v1} with the
 * generated stubs. Safe for concurrent use; close it when done.
 *
 * <pre>{@code
 * try (ConsistdClient client = new ConsistdClient()) { // $CONSISTD_SOCKET, else /var/run/consistd/consistd.sock
 *   client.waitReady(Duration.ofSeconds(30));
 *   try (Watch watch = client.watch(WatchRequest.of("configmaps").namespace("default"))) {
 *     for (WatchEvent event : watch) {
 *       System.out.println(event.type() + " " + event.object()); // SYNCED and RESYNC_REQUIRED have no object
 *     }
 *   }
 * }
 * }</pre>
 *
 * <p>Errors from the daemon are grpc-java's {@link StatusRuntimeException}, unchanged: {@code e.getStatus()} gives
 * the code and the message it sent (INVALID_ARGUMENT names the field). A lost connection is UNAVAILABLE.
 */
public final class ConsistdClient implements AutoCloseable {
  /** Where the sidecar listens unless CONSISTD_SOCKET (or the constructor's argument) says otherwise. */
  public static final String DEFAULT_SOCKET = "/var/run/consistd/consistd.sock";

  private static final Duration READY_POLL = Duration.ofMillis(50);

  private final String socket;
  private final EventLoopGroup group;
  private final ManagedChannel channel;
  private final OwnWrites writes = new OwnWrites();
  private final ObjectsClient objects;
  private final Leadership leadership;
  private final Outbox outbox;
  private final Inbox inbox;
  private final Rollout rollout;

  /** A client for the socket named by CONSISTD_SOCKET, else {@link #DEFAULT_SOCKET}. Nothing connects yet. */
  public ConsistdClient() {
    this(socketFromEnvironment());
  }

  /** A client for the sidecar's socket at {@code socket}. Nothing connects until the first call. */
  public ConsistdClient(String socket) {
    this.socket = socket;
    this.group = new MultiThreadIoEventLoopGroup(1, daemonThreads(), EpollIoHandler.newFactory());
    this.channel = NettyChannelBuilder.forAddress(new DomainSocketAddress(socket))
        .eventLoopGroup(group)
        .channelType(EpollDomainSocketChannel.class)
        .usePlaintext()
        // grpc-netty sets SO_KEEPALIVE on every connection; a Unix socket has none, and Netty would log a warning
        // per connection (grpc-java#10408). null removes the option.
        .withOption(ChannelOption.SO_KEEPALIVE, null)
        // Answers of any size: a List (or a watch event) of big objects passes gRPC's default 4 MiB limit, and
        // the sidecar is the app's own, over a local socket.
        .maxInboundMessageSize(Integer.MAX_VALUE)
        .intercept(new LostConnection())
        .build();
    this.objects = new ObjectsClient(channel, writes);
    this.leadership = new Leadership(this);
    this.outbox = new Outbox(this);
    this.inbox = new Inbox(this);
    this.rollout = new Rollout(this);
  }

  private static String socketFromEnvironment() {
    String socket = System.getenv("CONSISTD_SOCKET");
    return socket == null || socket.isEmpty() ? DEFAULT_SOCKET : socket;
  }

  private static ThreadFactory daemonThreads() {
    return runnable -> {
      Thread thread = new Thread(runnable, "consistd-client-io");
      thread.setDaemon(true);
      return thread;
    };
  }

  /** The path of the sidecar's socket this client talks to. */
  public String socket() {
    return socket;
  }

  /**
   * The gRPC channel, for the generated stubs of the services this client does not wrap (e.g. {@code
   * consistd.v1.RolloutServiceGrpc.newBlockingStub(client.channel())}).
   */
  public ManagedChannel channel() {
    return channel;
  }

  /** Reads and writes objects; its writes count for the own-write rule of this client's watches. */
  public ObjectsClient objects() {
    return objects;
  }

  /** Campaigns in, observes, or asks about the Lease-based elections the sidecar runs for the app. */
  public Leadership leadership() {
    return leadership;
  }

  /** Sends messages to peer pods' apps, each with an awaitable outcome; every send shares one SendStream. */
  public Outbox outbox() {
    return outbox;
  }

  /** The messages peers sent to this pod: {@link Inbox#handle} ACKs each when its handler returns. */
  public Inbox inbox() {
    return inbox;
  }

  /** Works on a reconcile queue (the sidecar's work queue): call {@link Reconciler#run} on the result. */
  public Reconciler reconciler(QueueSpec spec, Reconciler.Handler handler) {
    return new Reconciler(this, spec, handler);
  }

  /** Rollout channels: publish versions, follow them, report and wait until every replica applied one. */
  public Rollout rollout() {
    return rollout;
  }

  /**
   * Watches objects: the initial state (ADDED events, then SYNCED), then changes, resumed from the last event taken
   * after a lost connection. Close the watch when done.
   */
  public Watch watch(WatchRequest request) {
    return new Watch(this, request);
  }

  /**
   * The newest state of each object {@code request} names (always in CONSISTENT mode, from a fresh snapshot), handed
   * to workers as they ask: see {@link Latest}. The way to consume a CONSISTENT watch when the handler is slow: a
   * worker never handles a state older than this client's own write to the object, and never an object another
   * worker holds. Nor is a worker handed back the state this client's own write made directly on top of the state
   * the workers last had of the object (the state's {@link WatchEvent#previousResourceVersion} is that state, and its
   * resourceVersion is the one the client's latest write to it returned): the worker has it, and nothing else
   * happened in between. Handed out as any other: a state whose previous state is another writer's, a state with no
   * previous state known (from a list or a resync), and a state made by more than one write since the last hand-out.
   * Its reader thread runs until it is closed (or this client is).
   *
   * <pre>{@code
   * try (Latest latest = client.watchLatest(WatchRequest.of("configmaps").namespace("default"));
   *     Latest.Taken taken = latest.take()) {
   *   handle(taken.event()); // ADDED, MODIFIED or DELETED: the object's newest state
   * }
   * }</pre>
   */
  public Latest watchLatest(WatchRequest request) {
    Watch watch = new Watch(this, request.mode(WatchRequest.Mode.CONSISTENT).resumeCursor(""), false);
    return new Latest(watch, watch, writes);
  }

  /**
   * Whether a write through this client returned a larger resourceVersion of {@code object}'s object than it has:
   * it is older than what the app itself already wrote. {@link Watch} applies this when the app takes each event;
   * an app that keeps events in a queue of its own asks again when its worker takes one ({@link #watchLatest} is that
   * queue, with this check where its worker takes a state). False for null and for a resourceVersion that is not a
   * decimal integer (those are never compared).
   */
  public boolean predatesOwnWrite(KubeObject object) {
    return writes.predates(object);
  }

  OwnWrites writes() {
    return writes;
  }

  /**
   * Polls the sidecar's standard gRPC health service until it reports SERVING, retrying while the socket is missing
   * or the daemon is starting.
   *
   * @throws NotReadyException after {@code timeout}, naming the socket and the last answer seen
   * @throws InterruptedException if the thread is interrupted while waiting
   */
  public void waitReady(Duration timeout) throws InterruptedException {
    long deadline = System.nanoTime() + timeout.toNanos();
    HealthGrpc.HealthBlockingStub health = HealthGrpc.newBlockingStub(channel);
    String last = "no answer yet";
    StatusRuntimeException lastError = null;
    while (true) {
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        throw new NotReadyException(socket, timeout, last, lastError);
      }
      try {
        HealthCheckResponse response = health.withDeadlineAfter(left, TimeUnit.NANOSECONDS)
            .check(HealthCheckRequest.getDefaultInstance());
        if (response.getStatus() == HealthCheckResponse.ServingStatus.SERVING) {
          return;
        }
        last = "health is " + response.getStatus();
        lastError = null;
      } catch (StatusRuntimeException e) {
        if (System.nanoTime() < deadline) {
          // A check cut short by the deadline says nothing new about the sidecar.
          // Code and description: the status's cause (a Netty exception with its stack) stays in getCause().
          last = e.getStatus().getCode() + ": " + e.getStatus().getDescription();
          lastError = e;
        }
        // The sidecar may be back: connect at once rather than after gRPC's reconnect backoff (up to 2 minutes).
        channel.resetConnectBackoff();
      }
      Thread.sleep(Math.min(READY_POLL.toMillis(), Math.max(1, (deadline - System.nanoTime()) / 1_000_000)));
    }
  }

  /** Closes the connection: open watches and calls end with CANCELLED. */
  @Override
  public void close() {
    outbox.close();
    inbox.close();
    channel.shutdownNow();
    try {
      channel.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
    }
  }
}
