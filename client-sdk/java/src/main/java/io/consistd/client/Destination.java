// Where a sent message goes: a peer sidecar, a Service's endpoints, or an election's members.
package io.consistd.client;

import java.util.Objects;

/**
 * Where a message goes: {@link #peer one peer sidecar}, {@link #service every ready endpoint of a Service}, or
 * {@link #election every member of an election group}. Sealed, so a {@code switch} over it is exhaustive.
 */
public sealed interface Destination permits Destination.Peer, Destination.Service, Destination.Election {
  /** One peer sidecar by its peer address, {@code "host:port"}. */
  static Destination peer(String address) {
    return new Peer(address);
  }

  /**
   * Every ready endpoint of a Kubernetes Service ({@code namespace} empty: the sidecar's own); endpoints that
   * appear later get the message too.
   */
  static Destination service(String namespace, String name) {
    return new Service(namespace, name);
  }

  /** Every member (candidate) of an election group. */
  static Destination election(String name) {
    return new Election(name);
  }

  /** A peer sidecar's address, {@code "host:port"}. */
  record Peer(String address) implements Destination {
    public Peer {
      Objects.requireNonNull(address, "address");
    }
  }

  /** A Service: namespace (empty: the sidecar's own) and name. */
  record Service(String namespace, String name) implements Destination {
    public Service {
      Objects.requireNonNull(namespace, "namespace");
      Objects.requireNonNull(name, "name");
    }
  }

  /** An election group, by name. */
  record Election(String name) implements Destination {
    public Election {
      Objects.requireNonNull(name, "name");
    }
  }
}
