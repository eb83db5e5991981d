// How much of each object a watch, or a reconcile queue's query, keeps and delivers.
package io.consistd.client;

import java.util.Arrays;
import java.util.List;
import java.util.Objects;

/**
 * How much of each object a watch ({@link WatchRequest#view(ObjectView)}) or a queue's query ({@link
 * QueueSpec#view(ObjectView)}, {@link QueueSpec.Related#view(ObjectView)}) keeps and delivers: less held is less
 * memory in the sidecar. {@link #DEFAULT} is the whole object without {@code metadata.managedFields}; {@code
 * ObjectView.onlyMetadata()} each object's metadata only; {@code ObjectView.onlyFields("spec.replicas",
 * "status.conditions")} a projection. Immutable; each method returns a changed copy. Queries with different views
 * are different upstream watches, each with its own cache; queries with the same view share one.
 *
 * <p>The daemon checks a view, not the SDK: one it cannot keep (metadata-only with fields, more than 32 paths, a
 * path that is not dot-separated) is refused with INVALID_ARGUMENT naming the field, e.g. {@code view.fields[1]}.
 *
 * @param metadataOnly only each object's metadata, read with the apiserver's metadata-only requests
 *     (PartialObjectMetadata, as client-go's metadata informer and controller-runtime's OnlyMetadata): no spec,
 *     status or data; apiVersion and kind still name the resource. Not with {@code fields}
 * @param fields only these fields, as dot-separated paths ("spec.replicas", "status.conditions", "metadata.labels";
 *     a leading "." is allowed), beside apiVersion, kind and metadata's name, namespace, uid, resourceVersion,
 *     generation and deletionTimestamp, which every view keeps. An array is kept whole; a path the object does not
 *     have keeps nothing. Empty for no projection; at most 32 paths; not with {@code metadataOnly}
 * @param managedFields keep {@code metadata.managedFields} (server-side apply's bookkeeping), dropped otherwise
 */
public record ObjectView(boolean metadataOnly, List<String> fields, boolean managedFields) {
  /** The whole object without {@code metadata.managedFields}: what a query without a view gets. */
  public static final ObjectView DEFAULT = new ObjectView(false, List.of(), false);

  public ObjectView {
    fields = List.copyOf(Objects.requireNonNull(fields, "fields"));
  }

  /** Only each object's metadata (apiVersion and kind beside it), read with metadata-only requests. */
  public static ObjectView onlyMetadata() {
    return new ObjectView(true, List.of(), false);
  }

  /** Only these dot-separated paths ("spec.replicas", "status.conditions") beside the identity every view keeps. */
  public static ObjectView onlyFields(String... paths) {
    return new ObjectView(false, Arrays.asList(paths), false);
  }

  /** With {@code metadata.managedFields} kept ({@code true}) or dropped (the default). */
  public ObjectView managedFields(boolean managedFields) {
    return new ObjectView(metadataOnly, fields, managedFields);
  }

  /** Whether this is {@link #DEFAULT}, which a request sends as no view. */
  boolean isDefault() {
    return equals(DEFAULT);
  }

  /** The view as the protocol says it. */
  consistd.v1.Object.ObjectView toProto() {
    return consistd.v1.Object.ObjectView.newBuilder()
        .setMetadataOnly(metadataOnly)
        .addAllFields(fields)
        .setManagedFields(managedFields)
        .build();
  }
}
