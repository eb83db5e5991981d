// What the send and inbox tests share: handlers on the peer daemon's inbox, sends to it, calls counted per method.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.MethodDescriptor;
import java.time.Duration;
import java.util.UUID;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/** Helpers for tests of sends from daemon a to daemon b and of daemon b's inbox. */
final class Messaging {
  /** How long a test waits for a delivery or an outcome. */
  static final Duration WAIT = Duration.ofSeconds(20);

  private Messaging() {}

  /** A resource id no other test uses. */
  static String unique(String prefix) {
    return prefix + "-" + UUID.randomUUID().toString().substring(0, 8);
  }

  /** A message to daemon b's peer address about {@code resource}. */
  static SendRequest toPeer(String resource, String event, String payload) {
    return SendRequest.to(Destination.peer(Daemons.env("CONSISTD_TEST_PEER_ADDRESS")))
        .resourceId(resource).eventId(event).payload(payload).contentType("text/plain");
  }

  /** The next message from {@code queue}, failing the test after {@link #WAIT}. */
  static InboxMessage receive(BlockingQueue<InboxMessage> queue, String what) throws InterruptedException {
    InboxMessage m = queue.poll(WAIT.toMillis(), TimeUnit.MILLISECONDS);
    assertNotNull(m, what + " was not delivered within " + WAIT);
    return m;
  }

  /**
   * A handler that ACKs every message, but holds the one about {@code resource} with {@code event} (putting it on
   * {@link #held} first) until {@link #release} or an interrupt.
   */
  static final class Holder implements Inbox.Handler {
    final BlockingQueue<InboxMessage> held = new java.util.concurrent.LinkedBlockingQueue<>();
    private final CountDownLatch released = new CountDownLatch(1);
    private final String resource;
    private final String event;

    Holder(String resource, String event) {
      this.resource = resource;
      this.event = event;
    }

    @Override
    public void handle(InboxMessage m) throws InterruptedException {
      if (m.resourceId().equals(resource) && m.eventId().equals(event)) {
        held.add(m);
        released.await();
      }
    }

    void release() {
      released.countDown();
    }
  }

  /** Counts the calls started through a channel, per full method name ("consistd.v1.OutboxService/SendStream"). */
  static final class CallCounter implements ClientInterceptor {
    private final ConcurrentHashMap<String, AtomicInteger> started = new ConcurrentHashMap<>();

    @Override
    public <Q, A> ClientCall<Q, A> interceptCall(MethodDescriptor<Q, A> method, CallOptions options, Channel next) {
      started.computeIfAbsent(method.getFullMethodName(), m -> new AtomicInteger()).incrementAndGet();
      return next.newCall(method, options);
    }

    int started(String fullMethodName) {
      AtomicInteger n = started.get(fullMethodName);
      return n == null ? 0 : n.get();
    }

    Channel around(Channel channel) {
      return ClientInterceptors.intercept(channel, this);
    }
  }

  /** Closes {@code handling} and fails the test if it had ended with an error. */
  static void stop(Inbox.Handling handling) {
    handling.close();
    assertFalse(handling.done().isCompletedExceptionally(), () -> "the handling ended with " + error(handling));
  }

  private static String error(Inbox.Handling handling) {
    try {
      handling.done().join();
      return "nothing";
    } catch (RuntimeException e) {
      return e.toString();
    }
  }
}
