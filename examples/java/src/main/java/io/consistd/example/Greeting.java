// A Greeting (examples/crd.yaml) as the operator reads it, and the JSON of the ConfigMap that publishes it.
package io.consistd.example;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonParseException;
import io.consistd.client.KubeObject;
import io.consistd.client.TerminalException;
import java.util.List;
import java.util.Map;

/**
 * What the operator needs of one Greeting. Its ConfigMap has the Greeting's name and namespace, carries the label
 * {@code app.kubernetes.io/managed-by=greeting-operator}, names the Greeting as its controller owner and holds the
 * message in {@code data.message}.
 *
 * @param namespace metadata.namespace
 * @param name metadata.name, also its ConfigMap's
 * @param uid metadata.uid, which the ConfigMap's owner reference names
 * @param generation metadata.generation: which spec the pass works on
 * @param message spec.message
 */
record Greeting(String namespace, String name, String uid, long generation, String message) {
  private static final String API_VERSION = "example.consistd.io/v1";
  private static final String KIND = "Greeting";
  /** The label that marks the operator's ConfigMaps, and its value: also the field manager of its applies. */
  static final String MANAGED_BY = "app.kubernetes.io/managed-by";
  static final String OPERATOR = "greeting-operator";

  private static final Gson GSON = new GsonBuilder().disableHtmlEscaping().create();

  /** The fields of a Greeting's or a ConfigMap's JSON the operator reads; Gson leaves the others out. */
  private record Resource(Metadata metadata, Spec spec, Map<String, String> data) {}

  private record Metadata(long generation, List<OwnerReference> ownerReferences) {}

  private record OwnerReference(String uid, boolean controller) {}

  private record Spec(String message) {}

  /** What the peer is told about a published Greeting. */
  private record Notification(String namespace, String name, String message) {}

  /**
   * Decodes the Greeting a work item carries.
   *
   * @throws TerminalException when it has no spec.message: the same object will not decode better
   */
  static Greeting parse(KubeObject object) throws TerminalException {
    Resource greeting = decode(object);
    if (greeting == null || greeting.spec() == null || greeting.spec().message() == null) {
      throw new TerminalException("decoding greeting " + object + ": it has no spec.message");
    }
    long generation = greeting.metadata() == null ? 0 : greeting.metadata().generation();
    return new Greeting(object.namespace(), object.name(), object.uid(), generation, greeting.spec().message());
  }

  /** Whether {@code configMap} holds this Greeting's message and names it as its controller owner. */
  boolean isPublishedIn(KubeObject configMap) throws TerminalException {
    Resource cm = decode(configMap);
    boolean holdsMessage = cm != null && cm.data() != null && message.equals(cm.data().get("message"));
    List<OwnerReference> owners = holdsMessage && cm.metadata() != null ? cm.metadata().ownerReferences() : null;
    return owners != null && owners.stream().anyMatch(o -> o.controller() && uid.equals(o.uid()));
  }

  /** The ConfigMap to apply (server-side): the Greeting's message, owned by the Greeting as its controller. */
  String configMap() {
    Map<String, Object> owner =
        Map.of("apiVersion", API_VERSION, "kind", KIND, "name", name, "uid", uid, "controller", true);
    Map<String, Object> metadata = Map.of(
        "name", name, "namespace", namespace, "labels", Map.of(MANAGED_BY, OPERATOR), "ownerReferences", List.of(owner));
    return GSON.toJson(Map.of("apiVersion", "v1", "kind", "ConfigMap", "metadata", metadata,
        "data", Map.of("message", message)));
  }

  /** The notification's payload: {"namespace", "name", "message"}. */
  String notification() {
    return GSON.toJson(new Notification(namespace, name, message));
  }

  /** The Ready condition's message and the Published event's note. */
  String publishedNote() {
    return "ConfigMap " + name + " holds the message";
  }

  /** The key, "namespace/name". */
  @Override
  public String toString() {
    return namespace + "/" + name;
  }

  private static Resource decode(KubeObject object) throws TerminalException {
    try {
      return GSON.fromJson(object.json(), Resource.class);
    } catch (JsonParseException e) {
      throw new TerminalException("decoding " + object + ": " + e.getMessage(), e);
    }
  }
}
