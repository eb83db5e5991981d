// The Java SDK's agent for the SDK conformance suite (client-sdk/conformance): JSON commands in, JSON lines out.
package io.consistd.client.conformance;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import io.consistd.client.ConditionStatus;
import io.consistd.client.ConsistdClient;
import io.consistd.client.Destination;
import io.consistd.client.Election;
import io.consistd.client.EventSeverity;
import io.consistd.client.KubeObject;
import io.consistd.client.Latest;
import io.consistd.client.LeadershipListener;
import io.consistd.client.LeadershipStatus;
import io.consistd.client.ObjectOption.Guard;
import io.consistd.client.ObjectsClient;
import io.consistd.client.ObjectsClient.PatchType;
import io.consistd.client.Outcome;
import io.consistd.client.QueueSpec;
import io.consistd.client.Reconciler;
import io.consistd.client.SendRequest;
import io.consistd.client.Sent;
import io.consistd.client.Watch;
import io.consistd.client.WatchEvent;
import io.consistd.client.WatchRequest;
import io.consistd.client.WorkItem;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeoutException;

/**
 * Serves the suite's commands (one JSON object per line on stdin, each handled concurrently) with one client made
 * by the SDK's no-argument constructor, and answers each with one line on stdout; exits 0 when stdin closes. The
 * protocol is client-sdk/conformance/README.md's.
 */
public final class Agent {
  /** An op's failure the agent reports as INVALID_ARGUMENT (an unknown op, a field of the wrong type). */
  private static final class BadCommand extends RuntimeException {
    private static final long serialVersionUID = 1L;

    BadCommand(String message) {
      super(message);
    }
  }

  /**
   * What a handle op tells the reconcile handler waiting for it: the status condition to set first (null: none), the
   * event to record next (null: none), the merge patch to write (null: none), whether to end DONE (else RETRY), and
   * where to answer with the writes' result.
   */
  private record Handle(
      Condition condition, Event event, JsonElement patch, boolean done, CompletableFuture<JsonObject> answer) {}

  /** A handle op's condition: type, status, reason, message. */
  private record Condition(String type, ConditionStatus status, String reason, String message) {}

  /** A handle op's event: severity, reason, action, note. */
  private record Event(EventSeverity severity, String reason, String action, String note) {}

  private final ConsistdClient client = new ConsistdClient();
  private final Map<String, Watch> pulled = new ConcurrentHashMap<>();
  /** What each send returned, by message id, for the outcome op. */
  private final Map<String, Sent> sent = new ConcurrentHashMap<>();
  /** Open campaigns, kept until stdin closes (closing one resigns). */
  private final Map<String, Election> elections = new ConcurrentHashMap<>();
  /** Running reconcilers, by stream name, closed when stdin closes. */
  private final Map<String, Reconciler> reconcilers = new ConcurrentHashMap<>();
  /**
   * Reconcile handlers waiting for their handle op, by stream and item name; completed with null by a handler that
   * stopped waiting (its pass was cancelled).
   */
  private final Map<String, CompletableFuture<Handle>> handlers = new ConcurrentHashMap<>();
  /** The newest-state watches, by stream name, closed when stdin closes. */
  private final Map<String, Latest> latest = new ConcurrentHashMap<>();
  /** What each worker of a newest-state watch holds, by stream and worker. */
  private final Map<String, Latest.Taken> held = new ConcurrentHashMap<>();
  private final ExecutorService commands = Executors.newCachedThreadPool(runnable -> {
    Thread thread = new Thread(runnable, "agent-command");
    thread.setDaemon(true);
    return thread;
  });

  public static void main(String[] args) throws Exception {
    Agent agent = new Agent();
    try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      String line;
      while ((line = in.readLine()) != null) {
        if (!line.isBlank()) {
          String command = line;
          agent.commands.execute(() -> agent.serve(command));
        }
      }
    }
    agent.reconcilers.values().forEach(Reconciler::close);
    agent.latest.values().forEach(Latest::close);
    agent.client.close();
    System.exit(0);
  }

  private static synchronized void print(JsonObject line) {
    System.out.println(line);
    System.out.flush();
  }

  private void serve(String line) {
    JsonObject answer = new JsonObject();
    JsonObject command;
    try {
      command = JsonParser.parseString(line).getAsJsonObject();
    } catch (RuntimeException e) {
      System.err.println("agent: not a command: " + line);
      return;
    }
    answer.add("id", command.get("id"));
    try {
      answer.add("ok", run(command));
    } catch (StatusRuntimeException e) {
      answer.add("error", error(e.getStatus().getCode().name(), e.getStatus().getDescription()));
    } catch (TimeoutException e) {
      // The SDK's own timeout (Sent.await with a Duration).
      answer.add("error", error("DEADLINE_EXCEEDED", e.getMessage()));
    } catch (BadCommand | IllegalStateException | UnsupportedOperationException | ClassCastException e) {
      answer.add("error", error("INVALID_ARGUMENT", e.getMessage()));
    } catch (Exception e) {
      answer.add("error", error("UNKNOWN", e.toString()));
    }
    print(answer);
  }

  private static JsonObject error(String code, String message) {
    JsonObject error = new JsonObject();
    error.addProperty("code", code);
    error.addProperty("message", message == null ? "" : message);
    return error;
  }

  private static String text(JsonObject command, String field) {
    JsonElement value = command.get(field);
    if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isString()) {
      throw new BadCommand("field " + field + " must be a string");
    }
    return value.getAsString();
  }

  private static long number(JsonObject command, String field) {
    JsonElement value = command.get(field);
    if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isNumber()) {
      throw new BadCommand("field " + field + " must be a number");
    }
    return value.getAsLong();
  }

  private static boolean bool(JsonObject command, String field) {
    JsonElement value = command.get(field);
    if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isBoolean()) {
      throw new BadCommand("field " + field + " must be a boolean");
    }
    return value.getAsBoolean();
  }

  /** A string field that may be absent or null: empty then. */
  private static String optionalText(JsonObject command, String field) {
    JsonElement value = command.get(field);
    return value == null || value.isJsonNull() ? "" : text(command, field);
  }

  /**
   * The parts the {@code changes} field of a reconcile command names ({@code {"generation", "labels", "annotations"}}
   * booleans, each absent or null meaning false): none when it is absent or null.
   */
  private static QueueSpec.Changed[] changes(JsonObject command) {
    JsonElement value = command.get("changes");
    if (value == null || value.isJsonNull()) {
      return new QueueSpec.Changed[0];
    }
    if (!value.isJsonObject()) {
      throw new BadCommand("field changes must be an object or null");
    }
    JsonObject c = value.getAsJsonObject();
    List<QueueSpec.Changed> parts = new ArrayList<>();
    for (QueueSpec.Changed part : QueueSpec.Changed.values()) {
      String name = part.name().toLowerCase(Locale.ROOT);
      JsonElement named = c.get(name);
      if (named != null && !named.isJsonNull() && bool(c, name)) {
        parts.add(part);
      }
    }
    return parts.toArray(QueueSpec.Changed[]::new);
  }

  /** The {@code guard} field of a command: null when absent or null. */
  private static Guard guard(JsonObject command) {
    JsonElement value = command.get("guard");
    if (value == null || value.isJsonNull()) {
      return null;
    }
    if (!value.isJsonObject()) {
      throw new BadCommand("field guard must be an object or null");
    }
    JsonObject g = value.getAsJsonObject();
    return new Guard(text(g, "election"), text(g, "namespace"), number(g, "term"));
  }

  private JsonObject run(JsonObject command) throws Exception {
    String op = text(command, "op");
    JsonObject ok = new JsonObject();
    switch (op) {
      case "get" -> {
        KubeObject o = client.objects().get(
            text(command, "resource"), text(command, "namespace"), text(command, "name"));
        ok.addProperty("resourceVersion", o.resourceVersion());
      }
      case "patch" -> {
        JsonElement patch = command.get("patch");
        if (patch == null) {
          throw new BadCommand("field patch is missing");
        }
        KubeObject o = client.objects().patch(
            text(command, "resource"), text(command, "namespace"), text(command, "name"), PatchType.MERGE,
            patch.toString());
        ok.addProperty("resourceVersion", o.resourceVersion());
        ok.addProperty("uid", o.uid());
      }
      case "watch" -> {
        String stream = text(command, "stream");
        String mode = text(command, "mode");
        WatchRequest request = WatchRequest.of(text(command, "resource")).namespace(text(command, "namespace"))
            .mode(switch (mode) {
              case "RAW" -> WatchRequest.Mode.RAW;
              case "CONSISTENT" -> WatchRequest.Mode.CONSISTENT;
              default -> throw new BadCommand("mode must be RAW or CONSISTENT, not " + mode);
            });
        Watch watch = client.watch(request);
        if (bool(command, "take")) {
          commands.execute(() -> takeAll(stream, watch));
        } else {
          pulled.put(stream, watch);
        }
      }
      case "take" -> {
        String stream = text(command, "stream");
        Watch watch = pulled.get(stream);
        if (watch == null) {
          throw new BadCommand("no watch " + stream + " started with take false");
        }
        long count = number(command, "count");
        for (long i = 0; i < count; i++) {
          try {
            printEvent(stream, watch.next());
          } catch (StatusRuntimeException e) {
            printError(stream, e);
            throw e;
          }
        }
      }
      case "send" -> {
        SendRequest request = SendRequest.to(Destination.peer(text(command, "peer")))
            .resourceId(text(command, "resourceId")).eventId(text(command, "eventId"))
            .payload(text(command, "payload"));
        Guard guard = guard(command);
        Sent s = client.outbox().send(guard == null ? request : request.guard(guard));
        sent.put(s.messageId(), s);
        ok.addProperty("messageId", s.messageId());
      }
      case "outcome" -> {
        String id = text(command, "messageId");
        long timeoutMs = command.has("timeoutMs") ? number(command, "timeoutMs") : 0;
        Sent s = sent.get(id);
        if (s == null) {
          throw new BadCommand("messageId: this agent sent no message \"" + id + "\"");
        }
        Outcome o = timeoutMs > 0 ? s.await(Duration.ofMillis(timeoutMs)) : s.await();
        ok.addProperty("outcome", o.kind().name());
        ok.addProperty("peer", o.peer());
        ok.addProperty("reason", o.reason());
      }
      case "campaign" -> {
        String stream = text(command, "stream");
        LeadershipListener printing = new LeadershipListener() {
          @Override
          public void onStatus(LeadershipStatus status) {
            JsonObject item = new JsonObject();
            item.addProperty("state", status.state().name());
            item.addProperty("holder", status.holder());
            item.addProperty("term", status.term());
            printItem(stream, item);
          }

          @Override
          public void onError(StatusRuntimeException e) {
            printError(stream, e);
          }
        };
        elections.put(stream, client.leadership().campaign(
            text(command, "election"), text(command, "namespace"), printing));
      }
      case "reconcile" -> {
        String stream = text(command, "stream");
        QueueSpec spec = QueueSpec.of(text(command, "queue"), text(command, "resource"))
            .namespace(text(command, "namespace"))
            .onlyChangesOf(changes(command))
            .finalizer(optionalText(command, "finalizer"));
        String election = optionalText(command, "election");
        if (!election.isEmpty()) {
          spec = spec.election(election, text(command, "electionNamespace"));
        }
        Reconciler reconciler = client.reconciler(spec, item -> pass(stream, item));
        reconcilers.put(stream, reconciler);
        commands.execute(() -> {
          try {
            reconciler.run();
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
          } catch (RuntimeException e) {
            System.err.println("agent: the reconciler of stream " + stream + " ended: " + e);
          }
        });
      }
      case "handle" -> {
        String stream = text(command, "stream");
        String name = text(command, "name");
        String outcome = text(command, "outcome");
        boolean done = switch (outcome) {
          case "DONE" -> true;
          case "RETRY" -> false;
          default -> throw new BadCommand("outcome must be DONE or RETRY, not " + outcome);
        };
        JsonElement patch = command.get("patch");
        if (patch != null && patch.isJsonNull()) {
          patch = null;
        }
        Condition condition = condition(command);
        Event event = event(command);
        CompletableFuture<Handle> waiting = handlers.remove(stream + "\0" + name);
        if (waiting == null) {
          throw new BadCommand("name: no handler of stream " + stream + " waits with item " + name);
        }
        Handle handle = new Handle(condition, event, patch, done, new CompletableFuture<>());
        if (!waiting.complete(handle)) {
          throw new BadCommand("name: the handler of item " + name + " is gone");
        }
        JsonObject written;
        try {
          written = handle.answer().get();
        } catch (ExecutionException e) {
          throw e.getCause() instanceof Exception cause ? cause : e;
        }
        written.entrySet().forEach(field -> ok.add(field.getKey(), field.getValue()));
      }
      case "latest" -> latest.put(text(command, "stream"), client.watchLatest(
          WatchRequest.of(text(command, "resource")).namespace(text(command, "namespace"))));
      case "next" -> {
        String stream = text(command, "stream");
        String worker = text(command, "worker");
        Latest consumer = latest.get(stream);
        if (consumer == null) {
          throw new BadCommand("no newest-state watch " + stream);
        }
        String key = stream + "\0" + worker;
        if (held.containsKey(key)) {
          throw new BadCommand("worker " + worker + " holds an object already");
        }
        Latest.Taken taken = consumer.take();
        held.put(key, taken);
        return eventItem(taken.event());
      }
      case "done" -> {
        String worker = text(command, "worker");
        Latest.Taken taken = held.remove(text(command, "stream") + "\0" + worker);
        if (taken == null) {
          throw new BadCommand("worker " + worker + " holds nothing");
        }
        taken.done();
      }
      default -> throw new BadCommand("unknown op " + op);
    }
    return ok;
  }

  /** A handle op's {@code condition}: absent or null is none. */
  private static Condition condition(JsonObject command) {
    JsonElement value = command.get("condition");
    if (value == null || value.isJsonNull()) {
      return null;
    }
    if (!value.isJsonObject()) {
      throw new BadCommand("field condition must be an object");
    }
    JsonObject c = value.getAsJsonObject();
    String status = text(c, "status");
    return new Condition(text(c, "type"), switch (status) {
      case "True" -> ConditionStatus.TRUE;
      case "False" -> ConditionStatus.FALSE;
      case "Unknown" -> ConditionStatus.UNKNOWN;
      default -> throw new BadCommand("condition.status must be True, False or Unknown, not " + status);
    }, text(c, "reason"), text(c, "message"));
  }

  /** A handle op's {@code event}: absent or null is none. */
  private static Event event(JsonObject command) {
    JsonElement value = command.get("event");
    if (value == null || value.isJsonNull()) {
      return null;
    }
    if (!value.isJsonObject()) {
      throw new BadCommand("field event must be an object");
    }
    JsonObject e = value.getAsJsonObject();
    String severity = text(e, "severity");
    return new Event(switch (severity) {
      case "Normal" -> EventSeverity.NORMAL;
      case "Warning" -> EventSeverity.WARNING;
      default -> throw new BadCommand("event.severity must be Normal or Warning, not " + severity);
    }, text(e, "reason"), text(e, "action"), text(e, "note"));
  }

  /**
   * The reconcile handler: prints the item, waits for its handle op, sets the condition and records the event
   * through the item's helpers and patches the item's primary through the item's own objects client as told, answers
   * the handle op with the writes' result and ends as told; a condition that was not set or an event that was not
   * recorded answers its error and ends with a retry.
   */
  private Reconciler.Result pass(String stream, WorkItem item) throws Exception {
    String key = stream + "\0" + item.name();
    CompletableFuture<Handle> told = new CompletableFuture<>();
    handlers.put(key, told);
    JsonObject printed = new JsonObject();
    printed.addProperty("namespace", item.namespace());
    printed.addProperty("name", item.name());
    printed.addProperty("term", item.term());
    printed.addProperty("attempt", item.attempt());
    printed.addProperty("leaseId", item.leaseId());
    printed.addProperty("finalizing", item.finalizing());
    printItem(stream, printed);
    Handle handle;
    try {
      handle = told.get();
    } catch (InterruptedException e) {
      // The pass is cancelled: a handle op that took it meanwhile gets CANCELLED, a later one finds none.
      handlers.remove(key, told);
      if (!told.complete(null)) {
        Handle taken = told.getNow(null);
        if (taken != null) {
          taken.answer().completeExceptionally(
              Status.CANCELLED.withDescription("the pass of " + item + " was cancelled").asRuntimeException());
        }
      }
      throw e;
    }
    JsonObject written = new JsonObject();
    if (handle.condition() != null) {
      Condition c = handle.condition();
      try {
        ObjectsClient.ConditionSet set = item.setCondition(c.type(), c.status(), c.reason(), c.message());
        JsonObject answer = new JsonObject();
        answer.addProperty("changed", set.changed());
        answer.addProperty("lastTransitionTime", set.lastTransitionTime());
        written.add("condition", answer);
      } catch (RuntimeException e) {
        handle.answer().completeExceptionally(e);
        throw new Exception("the condition was not set", e);
      }
    }
    if (handle.event() != null) {
      Event e = handle.event();
      try {
        JsonObject answer = new JsonObject();
        answer.addProperty("recorded", item.recordEvent(e.severity(), e.reason(), e.action(), e.note()));
        written.add("event", answer);
      } catch (RuntimeException failure) {
        handle.answer().completeExceptionally(failure);
        throw new Exception("the event was not recorded", failure);
      }
    }
    try {
      if (handle.patch() != null) {
        KubeObject o = item.objects().patch(
            "configmaps", item.namespace(), item.name(), PatchType.MERGE, handle.patch().toString());
        written.addProperty("resourceVersion", o.resourceVersion());
      }
      handle.answer().complete(written);
    } catch (Exception e) {
      handle.answer().completeExceptionally(e);
    }
    if (!handle.done()) {
      throw new Exception("the suite asked for a retry");
    }
    return Reconciler.Result.done();
  }

  private static void takeAll(String stream, Watch watch) {
    try {
      for (WatchEvent event : watch) {
        printEvent(stream, event);
      }
    } catch (StatusRuntimeException e) {
      printError(stream, e);
    }
  }

  /** Prints one item of the stream named {@code stream}: a leadership state, a watch event or a work item. */
  private static void printItem(String stream, JsonObject item) {
    JsonObject line = new JsonObject();
    line.addProperty("stream", stream);
    line.add("item", item);
    print(line);
  }

  private static void printEvent(String stream, WatchEvent event) {
    printItem(stream, eventItem(event));
  }

  /** A watch event as the protocol prints it. */
  private static JsonObject eventItem(WatchEvent event) {
    JsonObject item = new JsonObject();
    item.addProperty("type", event.type().name());
    item.addProperty("name", event.object() == null ? "" : event.object().name());
    item.addProperty("resourceVersion", event.object() == null ? "" : event.object().resourceVersion());
    item.addProperty("predatesOwnWrite", event.predatesOwnWrite());
    item.addProperty("previousResourceVersion", event.previousResourceVersion());
    return item;
  }

  private static void printError(String stream, StatusRuntimeException e) {
    Status status = e.getStatus();
    JsonObject line = new JsonObject();
    line.addProperty("stream", stream);
    line.add("error", error(status.getCode().name(), status.getDescription()));
    print(line);
  }
}
