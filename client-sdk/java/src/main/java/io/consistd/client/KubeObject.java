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
 */
public record KubeObject(String uid, String namespace, String name, String resourceVersion, String json) {
  static KubeObject from(consistd.v1.Object.KubeObject o) {
    return new KubeObject(
        o.getUid(), o.getNamespace(), o.getName(), o.getResourceVersion(),
        o.getJson().toString(StandardCharsets.UTF_8));
  }

  /** "namespace/name", or "name" when cluster-scoped. */
  @Override
  public String toString() {
    return namespace.isEmpty() ? name : namespace + "/" + name;
  }
}
