// What to watch: a query and how its events are delivered.
package io.consistd.client;

import java.util.Objects;

/**
 * What to watch, built from the resource: {@code WatchRequest.of("configmaps").namespace("default")
 * .labelSelector("app=web").mode(WatchRequest.Mode.RAW)}. Immutable; each method returns a changed copy.
 *
 * @param resource a plural ("configmaps"), plural.group ("deployments.apps"), group/version/plural
 *     ("apps/v1/deployments") or a kind ("Deployment")
 * @param namespace the namespace to watch; empty watches every namespace (or a cluster-scoped resource)
 * @param labelSelector a Kubernetes label selector, e.g. "app=web,tier!=db"
 * @param fieldSelector a Kubernetes field selector, e.g. "metadata.name=cfg"
 * @param mode CONSISTENT (the default) or RAW
 * @param resumeCursor start after the event with this cursor instead of from a fresh snapshot
 */
public record WatchRequest(
    String resource, String namespace, String labelSelector, String fieldSelector, Mode mode, String resumeCursor) {
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
  }

  /** Every object of {@code resource} in every namespace, CONSISTENT, from a fresh snapshot. */
  public static WatchRequest of(String resource) {
    return new WatchRequest(resource, "", "", "", Mode.CONSISTENT, "");
  }

  public WatchRequest namespace(String namespace) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor);
  }

  public WatchRequest labelSelector(String labelSelector) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor);
  }

  public WatchRequest fieldSelector(String fieldSelector) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor);
  }

  public WatchRequest mode(Mode mode) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor);
  }

  public WatchRequest resumeCursor(String resumeCursor) {
    return new WatchRequest(resource, namespace, labelSelector, fieldSelector, mode, resumeCursor);
  }

  consistd.v1.Watch.SubscribeRequest toProto() {
    return consistd.v1.Watch.SubscribeRequest.newBuilder()
        .setResource(resource)
        .setNamespace(namespace)
        .setLabelSelector(labelSelector)
        .setFieldSelector(fieldSelector)
        .setMode(mode == Mode.RAW
            ? consistd.v1.Watch.DeliveryMode.DELIVERY_MODE_RAW
            : consistd.v1.Watch.DeliveryMode.DELIVERY_MODE_CONSISTENT)
        .setResumeCursor(resumeCursor)
        .build();
  }
}
