// The bench's two record files, appended to as the Python sides do.
package io.consistd.bench.josdk;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * BENCH_EXECUTIONS and BENCH_PASSES: one JSON line per execution and per pass, each written whole (and flushed) under
 * a lock, so lines from concurrent reconciles never interleave and a killed process loses none it wrote.
 */
final class Record {
  /** The job's label and annotation (hack/bench/kopf). */
  static final String LABEL = "bench.consistd.io/kopf";

  static final String HANDLED = "bench.consistd.io/handled";

  private static final ObjectMapper JSON = new ObjectMapper();

  private final OutputStream executions;
  private final OutputStream passes;

  Record(String executions, String passes) throws IOException {
    this.executions = new FileOutputStream(executions, true);
    this.passes = new FileOutputStream(passes, true);
  }

  /** The value the handler has to handle: data.value when it differs from the handled annotation, else null. */
  static String unhandled(String value, String handled) {
    return value == null || value.equals(handled) ? null : value;
  }

  /**
   * One pass: the reconciler was called (JOSDK) or handed a work item (consistd) with {@code value} (empty when
   * the ConfigMap had none), and executed the handler or not.
   */
  void pass(String name, String value, boolean executed) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("name", name);
    line.put("value", value == null ? "" : value);
    line.put("at", now());
    line.put("executed", executed);
    write(passes, line);
  }

  /** One execution of {@code value}; {@code consistency} as the sidecar judged the state ("" for JOSDK). */
  void execution(String name, String value, String consistency) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("name", name);
    line.put("value", value);
    line.put("at", now());
    line.put("consistency", consistency);
    write(executions, line);
  }

  /** Wall-clock seconds, as Python's time.time(). */
  private static double now() {
    java.time.Instant t = java.time.Instant.now();
    return t.getEpochSecond() + t.getNano() / 1e9;
  }

  private static void write(OutputStream out, Map<String, Object> line) {
    try {
      byte[] bytes = (JSON.writeValueAsString(line) + "\n").getBytes(StandardCharsets.UTF_8);
      synchronized (out) {
        out.write(bytes);
        out.flush();
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
