//! The watch hub: one upstream apiserver watch per distinct query, shared by every local subscriber,
//! with a cache for snapshots, a bounded history for resuming, and queues that never wait on a subscriber,
//! all within one memory budget in bytes.

pub(crate) mod bookmarks;
pub mod budget;
mod cache;
pub mod consistent;
pub mod expectations;
mod hub;
mod mirror;
pub mod object;
pub mod resolve;
pub(crate) mod selector;
pub mod shard;
pub mod shared;
mod staleness;
mod subscription;
pub mod view;

use std::{fmt, str::FromStr};

pub use hub::{Hub, Query};
pub use mirror::Mirror;
pub use subscription::Subscription;

use self::{
    resolve::{ResolveError, ResourceId},
    view::ObjectView,
};

/// What makes two subscriptions share one upstream watch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WatchKey {
    /// The resource as discovery resolved it, so "configmaps" and "v1/configmaps" share a watch.
    pub resource: ResourceId,
    /// The namespace; empty for all namespaces or a cluster-scoped resource.
    pub namespace: String,
    /// Label selector, as given.
    pub label_selector: String,
    /// Field selector, as given.
    pub field_selector: String,
    /// What of each object is kept.
    pub view: ObjectView,
    /// The share of the objects watched; None for all.
    pub shard: Option<shard::ShardSelector>,
}

impl WatchKey {
    /// The watch's metric labels.
    pub(crate) fn label(&self) -> consistd_observe::metrics::WatchLabel {
        consistd_observe::metrics::WatchLabel {
            resource: match &self.resource {
                r if r.group.is_empty() => format!("{}/{}", r.version, r.plural),
                r => format!("{}/{}/{}", r.group, r.version, r.plural),
            },
            namespace: self.namespace.clone(),
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            view: self.view.label(),
            shard: self.shard.as_ref().map(shard::ShardSelector::label).unwrap_or_default(),
        }
    }
}

/// A position in one watch incarnation's history, handed to apps as an opaque string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The shared watch's random incarnation; a cursor of another incarnation cannot be resumed.
    pub incarnation: u64,
    /// The position in that incarnation's history: the last entry the subscriber was given.
    pub seq: u64,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}.{}", self.incarnation, self.seq)
    }
}

impl FromStr for Cursor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a cursor consistd issued");
        let (incarnation, seq) = s.split_once('.').ok_or_else(bad)?;
        Ok(Self {
            incarnation: u64::from_str_radix(incarnation, 16).map_err(|_| bad())?,
            seq: seq.parse().map_err(|_| bad())?,
        })
    }
}

/// Why a request about a resource failed: a subscription, or a read or write of an object.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// A request field is wrong.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// The request field, e.g. `namespace`.
        field: &'static str,
        /// Why its value is refused.
        message: String,
    },
    /// The resource could not be resolved.
    #[error("resource")]
    Resolve(#[from] ResolveError),
    /// The apiserver refused or failed.
    #[error("{op}")]
    Apiserver {
        /// What was asked, e.g. "patch configmaps ns/name", naming the field when the refusal is about one.
        op: String,
        /// kube's error; an apiserver status keeps its code and message in the gRPC status.
        #[source]
        source: kube::Error,
    },
}

/// Sleeps until `deadline`, or forever when there is none: a `select!` branch for a timer that may not
/// be set.
pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let c = Cursor { incarnation: 0xdead_beef, seq: 42 };
        assert_eq!(c.to_string().parse::<Cursor>(), Ok(c));
        for bad in ["", "42", "zz.1", "1.x", "1.-1"] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?}");
        }
    }
}
