// A Kubernetes object as the sidecar served it.
package io.consistd.client;

import java.nio.charset.StandardCharsets;

/**
 * A Kubernetes object as the apiserver served it, with the fields apps need most lifted out so they can route or
 * deduplicate without parsing the JSON.
 *
 * @param uid metadata.uid: stable for the object's life; a re-created object has a new one
 * @param namespace metadata.namespace; empty for cluster-scoped objects
 * @param name metadata.name
 * @param resourceVersion metadata.resourceVersion. Kubernetes 1.35+ makes it a decimal integer that grows with
 *     every change (KEP-5504), so two versions of one object compare as numbers; before 1.35, compare for equality
 *     only
 * @param json the object (apiVersion, kind, metadata, spec, status, ...) as JSON, for the app's JSON library: from a
 *     watch or a queue as its {@link ObjectView} keeps it (by default whole but for metadata.managedFields); from
 *     {@link ObjectsClient} whole (one read from a watch's cache has managedFields only if that watch keeps them)
 * @param unchanged true when {@link ObjectsClient#update} or {@link ObjectsClient#patch} would have changed nothing
 *     and was not sent: a synced watch's cache in the sidecar already showed the object as the write would leave it,
 *     and this is that cached object (its resourceVersion unchanged). False on every other object, and on a write sent
 *     with {@link ObjectOption#sendUnchanged()}
 */
public record KubeObject(
    String uid, String namespace, String name, String resourceVersion, String json, boolean unchanged) {
  /** An object that no write answered unchanged: {@code unchanged} false. */
  public KubeObject(String uid, String namespace, String name, String resourceVersion, String json) {
    this(uid, namespace, name, resourceVersion, json, false);
  }

  static KubeObject from(consistd.v1.Object.KubeObject o) {
    return from(o, false);
  }

  /** The object a message carries; {@code unchanged}: the write's answer said it was not sent. */
  static KubeObject from(consistd.v1.Object.KubeObject o, boolean unchanged) {
    return new KubeObject(
        o.getUid(), o.getNamespace(), o.getName(), o.getResourceVersion(),
        o.getJson().toString(StandardCharsets.UTF_8), unchanged);
  }

  /** "namespace/name", or "name" when cluster-scoped. */
  @Override
  public String toString() {
    return namespace.isEmpty() ? name : namespace + "/" + name;
  }
}
