// A daemon a test starts (and restarts) itself from CONSISTD_BIN, with a config of its own.
package io.consistd.client;

import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.TimeUnit;

/** A consistd of the test's own, on the control plane of CONSISTD_TEST_KUBECONFIG; its log is printed on failure. */
final class OwnDaemon implements AutoCloseable {
  private static final Duration READY = Duration.ofSeconds(30);

  private final Path dir;
  private Process process;

  /** Starts a daemon named {@code identity} with {@code config} lines after its identity. */
  OwnDaemon(String identity, String... config) throws IOException, InterruptedException {
    this.dir = Files.createTempDirectory("consistd-java-" + identity + "-");
    Files.writeString(dir.resolve("consistd.yaml"), "identity: " + identity + "\n" + String.join("\n", config) + "\n");
    start();
  }

  /** A free TCP port on loopback, for a peer address. */
  static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0)) {
      return socket.getLocalPort();
    }
  }

  String socket() {
    return dir.resolve("consistd.sock").toString();
  }

  private String admin() {
    return dir.resolve("admin.sock").toString();
  }

  /** Runs the daemon and waits until `consistd status` answers. */
  void start() throws IOException, InterruptedException {
    String bin = Daemons.env("CONSISTD_BIN");
    ProcessBuilder builder = new ProcessBuilder(bin, "run", "--config", dir.resolve("consistd.yaml").toString(),
        "--socket", socket(), "--admin-socket", admin(), "--store-dir", dir.resolve("store").toString())
        .redirectErrorStream(true)
        .redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve("consistd.log").toFile()));
    builder.environment().put("KUBECONFIG", Daemons.env("CONSISTD_TEST_KUBECONFIG"));
    process = builder.start();
    long deadline = System.nanoTime() + READY.toNanos();
    while (System.nanoTime() < deadline) {
      Process status = new ProcessBuilder(bin, "status", "--admin-socket", admin())
          .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
      if (status.waitFor(5, TimeUnit.SECONDS) && status.exitValue() == 0) {
        return;
      }
      status.destroyForcibly();
      if (!process.isAlive()) {
        fail("the test's daemon exited while starting:\n" + log());
      }
      Thread.sleep(100);
    }
    fail("the test's daemon was not ready within " + READY + ":\n" + log());
  }

  /** SIGTERM, then SIGKILL after 20 s; waits for the exit. */
  void stop() throws InterruptedException {
    if (process == null) {
      return;
    }
    process.destroy();
    if (!process.waitFor(20, TimeUnit.SECONDS)) {
      process.destroyForcibly().waitFor();
    }
    process = null;
  }

  /** SIGKILL; waits for the exit. */
  void kill() throws InterruptedException {
    process.destroyForcibly().waitFor();
    process = null;
  }

  String log() {
    try {
      return Files.readString(dir.resolve("consistd.log"));
    } catch (IOException e) {
      return "(no log: " + e + ")";
    }
  }

  @Override
  public void close() throws InterruptedException {
    stop();
  }
}
