// A test fixture that breaks connections: a Unix-socket proxy to a daemon that can cut every connection.
package io.consistd.client;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/** Forwards connections from its own socket to a daemon's; it can cut them all and refuse new ones for a while. */
final class UnixProxy implements AutoCloseable {
  private final Path dir;
  private final Path socket;
  private final UnixDomainSocketAddress target;
  private final ServerSocketChannel server;
  private final List<SocketChannel> connections = new ArrayList<>();
  /** Closes new connections at once (between down and up). */
  private volatile boolean refusing;

  UnixProxy(String target) throws IOException {
    this.dir = Files.createTempDirectory("consistd-proxy");
    this.socket = dir.resolve("proxy.sock");
    this.target = UnixDomainSocketAddress.of(target);
    this.server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
    server.bind(UnixDomainSocketAddress.of(socket));
    thread("consistd-proxy-accept", this::serve);
  }

  /** The proxy's socket, to connect to instead of the daemon's. */
  String socket() {
    return socket.toString();
  }

  private static void thread(String name, Runnable run) {
    Thread thread = new Thread(run, name);
    thread.setDaemon(true);
    thread.start();
  }

  private void serve() {
    while (true) {
      SocketChannel in;
      try {
        in = server.accept();
      } catch (IOException e) {
        return; // closed
      }
      if (refusing) {
        closeQuietly(in);
        continue;
      }
      SocketChannel out;
      try {
        out = SocketChannel.open(target);
      } catch (IOException e) {
        closeQuietly(in);
        continue;
      }
      synchronized (connections) {
        connections.add(in);
        connections.add(out);
      }
      thread("consistd-proxy-up", () -> pipe(in, out));
      thread("consistd-proxy-down", () -> pipe(out, in));
    }
  }

  /** Copies one direction and closes both ends when it ends. */
  private static void pipe(SocketChannel from, SocketChannel to) {
    ByteBuffer buffer = ByteBuffer.allocate(64 * 1024);
    try {
      while (from.read(buffer) >= 0) {
        buffer.flip();
        while (buffer.hasRemaining()) {
          to.write(buffer);
        }
        buffer.clear();
      }
    } catch (IOException e) {
      // cut, or the other side closed
    } finally {
      closeQuietly(from);
      closeQuietly(to);
    }
  }

  private static void closeQuietly(SocketChannel channel) {
    try {
      channel.close();
    } catch (IOException e) {
      // already broken
    }
  }

  /** Closes every connection through the proxy; new ones are still accepted. */
  void cut() {
    synchronized (connections) {
      connections.forEach(UnixProxy::closeQuietly);
      connections.clear();
    }
  }

  /** Cuts every connection and refuses new ones until {@link #up}. */
  void down() {
    refusing = true;
    cut();
  }

  /** Accepts connections again. */
  void up() {
    refusing = false;
  }

  @Override
  public void close() throws IOException {
    server.close();
    cut();
    Files.deleteIfExists(socket);
    Files.deleteIfExists(dir);
  }
}
