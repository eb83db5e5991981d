// What to watch: a query and how its events are delivered.
package io.consistd.client;

import java.util.Objects;

/**
 * What to watch, built from the resource: {@code WatchRequest.of("configmaps").namespace("default")
 * .labelSelector("app=web").mode(WatchRequest.Mode.RAW)}, or only the metadata of every pod: {@code
 * WatchRequest.of("pods").view(ObjectView.onlyMetadata())}. Immutable; each method returns a changed copy.
 *
 * @param resource a plural ("configmaps"), plural.group ("deployments.apps"), group/version/plural
 *     ("apps/v1/deployments") or a kind ("Deployment")
 * @param namespace the namespace to watch; empty watches every namespace (or a cluster-scoped resource)
 * @param labelSelector a Kubernetes label selector, e.g. "app=web,tier!=db"
 * @param fieldSelector a Kubernetes field selector, e.g. "metadata.name=cfg"
 * @param mode CONSISTENT (the default) or RAW
 * @param resumeCursor start after the event with this cursor instead of from a fresh snapshot; it resumes only a
 *     watch of the same view
 * @param view how much of each object to keep and deliver; {@link ObjectView#DEFAULT} is the whole object without
 *     managedFields
 */
public record WatchRequest(
    String resource,
    String namespace,
    String labelSelector,
    String fieldSelector,
    Mode mode,
    String resumeCursor,
    ObjectView view) {
  /** How a watch wants its events. */
  public enum Mode {
    /**
     * Per object, only states consistent with this pod's own writes; each (uid, resourceVersion) at most once; a
     * slow watcher gets the latest state per object.
     */
    CONSISTENT,
    /** Every watch event, in apiserver order, none skipped; events older than the app's own write are marked. */
    RAW
  }

  public WatchRequest {
    Objects.requireNonNull(resource, "resource");
    Objects.requireNonNull(namespace, "namespace");
    Objects.requireNonNull(labelSelector, "labelSelector");
    Objects.requireNonNull(fieldSelector, "fieldSelector");
    Objects.requireNonNull(mode, "mode");
    Objects.requireNonNull(resumeCursor, "resumeCursor");
    Objects.requireNonNull(view, "view");
  }

  /** A request of the default view: the whole object without managedFields. */
  public WatchRequest(
      String resource, String namespace, String labelSelector, String fieldSelector, Mode mode, String resumeCursor) {
    this(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor, ObjectView.DEFAULT);
  }

  /** Every object of {@code resource} in every namespace, whole, CONSISTENT, from a fresh snapshot. */
  public static WatchRequest of(String resource) {
    return new WatchRequest(resource, "", "", "", Mode.CONSISTENT, "", ObjectView.DEFAULT);
  }

  public WatchRequest namespace(String namespace) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor, view);
  }

  public WatchRequest labelSelector(String labelSelector) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor, view);
  }

  public WatchRequest fieldSelector(String fieldSelector) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor, view);
  }

  public WatchRequest mode(Mode mode) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor, view);
  }

  public WatchRequest resumeCursor(String resumeCursor) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor, view);
  }

  /**
   * How much of each object to keep and deliver: {@code ObjectView.onlyMetadata()}, {@code
   * ObjectView.onlyFields("spec.replicas")}, or {@link ObjectView#DEFAULT}.
   */
  public WatchRequest view(ObjectView view) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor, view);
  }

  consistd.v1.Watch.SubscribeRequest toProto() {
    consistd.v1.Watch.SubscribeRequest.Builder request = consistd.v1.Watch.SubscribeRequest.newBuilder()
        .setResource(resource)
        .setNamespace(namespace)
        .setLabelSelector(labelSelector)
        .setFieldSelector(fieldSelector)
        .setMode(mode == Mode.RAW
            ? consistd.v1.Watch.DeliveryMode.DELIVERY_MODE_RAW
            : consistd.v1.Watch.DeliveryMode.DELIVERY_MODE_CONSISTENT)
        .setResumeCursor(resumeCursor);
    if (!view.isDefault()) {
      request.setView(view.toProto());
    }
    return request.build();
  }
}
