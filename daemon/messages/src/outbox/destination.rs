//! Where a message goes: one peer address, every ready endpoint of a Service, or every member of an
//! election group; parsed from the request, checked, and named the same way in logs and errors.

use std::fmt;

use consistd_core::names::{check_peer_address, is_dns_subdomain, is_namespace_name};
use consistd_proto::v1 as pb;

/// A destination of the outbox; each `(Destination, resource_id)` holds at most one message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    /// One consistd's peer address, "host:port".
    Peer(String),
    /// Every ready endpoint of a Service.
    Service {
        /// The Service's namespace; the daemon's when the request names none.
        namespace: String,
        /// The Service's name.
        name: String,
    },
    /// Every member of an election group.
    Election {
        /// The Lease's namespace: always the daemon's, since a request names only the election.
        namespace: String,
        /// The election (Lease) name.
        name: String,
    },
}

/// A destination that cannot be used: the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadDestination {
    /// The request field, e.g. `destination.peer`.
    pub field: &'static str,
    /// Why the field's value is refused; after the field it makes the INVALID_ARGUMENT message.
    pub message: String,
}

impl Destination {
    /// Reads a request's destination; unset namespaces are `namespace`.
    pub fn from_pb(d: Option<&pb::Destination>, namespace: &str) -> Result<Self, BadDestination> {
        let bad = |field, message: String| BadDestination { field, message };
        match d.and_then(|d| d.target.as_ref()) {
            None => Err(bad("destination", "must name a peer, a service or an election".to_owned())),
            Some(pb::destination::Target::Peer(p)) => {
                check_peer_address(p).map(|()| Self::Peer(p.clone())).map_err(|m| bad("destination.peer", m))
            }
            Some(pb::destination::Target::Service(s)) => {
                if !is_dns_subdomain(&s.name) {
                    return Err(bad("destination.service.name", format!("{:?} is not a valid Service name", s.name)));
                }
                let namespace = if s.namespace.is_empty() { namespace.to_owned() } else { s.namespace.clone() };
                if !is_namespace_name(&namespace) {
                    return Err(bad(
                        "destination.service.namespace",
                        format!("{namespace:?} is not a valid namespace"),
                    ));
                }
                Ok(Self::Service { namespace, name: s.name.clone() })
            }
            Some(pb::destination::Target::Election(e)) => {
                if !is_dns_subdomain(e) {
                    return Err(bad("destination.election", format!("{e:?} is not a valid election (Lease) name")));
                }
                Ok(Self::Election { namespace: namespace.to_owned(), name: e.clone() })
            }
        }
    }

    /// The destination as the API names it.
    pub fn to_pb(&self) -> pb::Destination {
        let target = match self {
            Self::Peer(p) => pb::destination::Target::Peer(p.clone()),
            Self::Service { namespace, name } => pb::destination::Target::Service(pb::ServiceDestination {
                namespace: namespace.clone(),
                name: name.clone(),
            }),
            Self::Election { name, .. } => pb::destination::Target::Election(name.clone()),
        };
        pb::Destination { target: Some(target) }
    }

    /// Whether every copy goes to a changing set of peers (Service endpoints, election members).
    pub(crate) fn is_group(&self) -> bool {
        !matches!(self, Self::Peer(_))
    }
}

/// A peer as the outbox keys it: "identity@host:port" for a group member whose daemon's identity is known
/// (an EndpointSlice endpoint's Pod, an election member's holder), else "host:port". A link dials the
/// address and names the identity in its Hello, so a new pod on an old pod's address is a different peer
/// and is never taken for the old one.
pub(crate) fn member_key(identity: Option<&str>, address: &str) -> String {
    match identity {
        Some(identity) if !identity.is_empty() => format!("{identity}@{address}"),
        _ => address.to_owned(),
    }
}

/// The identity, if the key names one, and the address of a peer key ([`member_key`]).
pub(crate) fn split_member(peer: &str) -> (Option<&str>, &str) {
    match peer.split_once('@') {
        Some((identity, address)) => (Some(identity), address),
        None => (None, peer),
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Peer(p) => write!(f, "peer {p}"),
            Self::Service { namespace, name } => write!(f, "service {namespace}/{name}"),
            Self::Election { namespace, name } => write!(f, "election {namespace}/{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_member_key_carries_the_identity_when_known_and_splits_back() {
        assert_eq!(super::member_key(Some("web-0"), "10.0.0.5:7070"), "web-0@10.0.0.5:7070");
        assert_eq!(super::member_key(None, "10.0.0.5:7070"), "10.0.0.5:7070");
        assert_eq!(super::member_key(Some(""), "[fd00::1]:7070"), "[fd00::1]:7070");
        assert_eq!(super::split_member("web-0@10.0.0.5:7070"), (Some("web-0"), "10.0.0.5:7070"));
        assert_eq!(super::split_member("[fd00::1]:7070"), (None, "[fd00::1]:7070"));
    }

    use super::*;

    fn peer(p: &str) -> pb::Destination {
        pb::Destination { target: Some(pb::destination::Target::Peer(p.to_owned())) }
    }

    #[test]
    fn peers_are_host_port() {
        for ok in ["10.0.0.1:7070", "[::1]:7070", "consistd-0.consistd.ns.svc:7070"] {
            assert_eq!(Destination::from_pb(Some(&peer(ok)), "ns"), Ok(Destination::Peer(ok.to_owned())), "{ok}");
        }
        for bad in ["", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:99999", ":7070", "a b:1"] {
            let e = Destination::from_pb(Some(&peer(bad)), "ns").expect_err(bad);
            assert_eq!(e.field, "destination.peer", "{bad}");
        }
    }

    #[test]
    fn services_and_elections_default_to_the_daemons_namespace() {
        let svc = pb::Destination {
            target: Some(pb::destination::Target::Service(pb::ServiceDestination {
                namespace: String::new(),
                name: "web".to_owned(),
            })),
        };
        let t = Destination::from_pb(Some(&svc), "apps").expect("valid");
        assert_eq!(t, Destination::Service { namespace: "apps".to_owned(), name: "web".to_owned() });
        assert_eq!(t.to_string(), "service apps/web");
        assert!(t.is_group());
        let bad = pb::Destination { target: Some(pb::destination::Target::Election("Bad_Name".to_owned())) };
        assert_eq!(Destination::from_pb(Some(&bad), "apps").expect_err("bad").field, "destination.election");
        assert_eq!(Destination::from_pb(None, "apps").expect_err("unset").field, "destination");
    }
}
