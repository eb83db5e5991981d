//! A watch's share of its objects as KEP-5866 defines it: ranges of the FNV-1a 64 hash of each object's
//! uid or namespace, sent as `shardSelector` to an apiserver that honours it (Kubernetes 1.36+ with the
//! ShardedListAndWatch gate), and applied here to the objects of one that does not.

use std::fmt;

use consistd_core::names::fnv1a64;
use http::Request;
use kube::{Client, client::Body};
use tower::BoxError;

use super::object::Obj;

/// The hash space's end, 2^64: a range's end is exclusive, so the last one needs a 65th bit.
pub const HASH_END: u128 = 1 << 64;

/// The field of an object whose hash places it in a shard: the two KEP-5866 accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardField {
    /// `object.metadata.uid`: spreads objects evenly; a deleted object made again may land elsewhere.
    Uid,
    /// `object.metadata.namespace`: a namespace's objects stay together.
    Namespace,
}

impl ShardField {
    /// The field path as the selector names it.
    fn path(self) -> &'static str {
        match self {
            Self::Uid => "object.metadata.uid",
            Self::Namespace => "object.metadata.namespace",
        }
    }
}

/// A share of the hash space of one field: the union of half-open ranges `[start, end)`, kept sorted,
/// merged where they touch, never empty.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardSelector {
    field: ShardField,
    ranges: Vec<(u64, u128)>,
}

impl ShardSelector {
    /// The share of `field` made of `ranges`; refused when it selects nothing (no range, or one whose
    /// start is not below its end or whose end passes 2^64).
    pub fn new(field: ShardField, ranges: impl IntoIterator<Item = (u64, u128)>) -> Result<Self, String> {
        let mut sorted: Vec<(u64, u128)> = Vec::new();
        let mut given: Vec<(u64, u128)> = ranges.into_iter().collect();
        given.sort_unstable();
        for (start, end) in given {
            if u128::from(start) >= end || end > HASH_END {
                return Err(format!("shard range [{start:#x}, {end:#x}) is empty or passes 2^64"));
            }
            match sorted.last_mut() {
                Some(last) if u128::from(start) <= last.1 => last.1 = last.1.max(end),
                _ => sorted.push((start, end)),
            }
        }
        if sorted.is_empty() {
            return Err("a shard selector needs at least one range".to_owned());
        }
        Ok(Self { field, ranges: sorted })
    }

    /// The field hashed.
    pub fn field(&self) -> ShardField {
        self.field
    }

    /// The ranges, sorted and merged.
    pub fn ranges(&self) -> &[(u64, u128)] {
        &self.ranges
    }

    /// Whether the share holds an object whose field is `value`, hashed as the apiserver hashes it.
    pub fn holds(&self, value: &str) -> bool {
        let hash = u128::from(fnv1a64(value));
        self.ranges.iter().any(|&(start, end)| u128::from(start) <= hash && hash < end)
    }

    /// Whether the share holds `obj`.
    pub fn selects(&self, obj: &Obj) -> bool {
        self.holds_object(obj.uid(), obj.namespace())
    }

    /// Whether the share holds an object with `uid` in `namespace` (the hashed field's value is one of them).
    pub fn holds_object(&self, uid: &str, namespace: &str) -> bool {
        self.holds(match self.field {
            ShardField::Uid => uid,
            ShardField::Namespace => namespace,
        })
    }

    /// A short name of the share for logs and metric labels (a selector of many ranges is long):
    /// "namespace:3:1f2e3d4c5b6a7988", the field, the number of ranges and a digest of the selector.
    pub fn label(&self) -> String {
        let field = match self.field {
            ShardField::Uid => "uid",
            ShardField::Namespace => "namespace",
        };
        format!("{field}:{}:{:016x}", self.ranges.len(), fnv1a64(&self.to_string()))
    }
}

/// The selector as the apiserver reads it: `shardRange(field, '0x…', '0x…') || …`, each bound 16 hex
/// digits (2^64 as 17), the only form its comparison of bounds as strings orders rightly.
impl fmt::Display for ShardSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(start, end)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(" || ")?;
            }
            write!(f, "shardRange({}, '0x{start:016x}', '0x{end:016x}')", self.field.path())?;
        }
        Ok(())
    }
}

/// A client that sends each request of `base` with `shardSelector` added to its query: kube's list and
/// watch parameters have no field for it, and kube-runtime's watcher builds its requests itself.
pub(crate) fn sharded_client(base: Client, selector: &ShardSelector) -> Client {
    let param = format!(
        "shardSelector={}",
        form_urlencoded::byte_serialize(selector.to_string().as_bytes()).collect::<String>()
    );
    let namespace = base.default_namespace().to_owned();
    let service = tower::service_fn(move |mut request: Request<Body>| {
        let (base, param) = (base.clone(), param.clone());
        async move {
            let with_param = {
                let uri = request.uri();
                let path = uri.path_and_query().map_or("/", |pq| pq.as_str());
                let joiner = if uri.query().is_some() { '&' } else { '?' };
                format!("{path}{joiner}{param}")
            };
            *request.uri_mut() = with_param.parse::<http::Uri>().map_err(BoxError::from)?;
            base.send(request).await.map_err(BoxError::from)
        }
    });
    Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_sorted_merged_and_written_as_the_apiserver_compares_them() {
        let s =
            ShardSelector::new(ShardField::Namespace, [(0x8000, 0x9000), (0, 0x10), (0x10, 0x20), (0xff, HASH_END)])
                .expect("valid");
        assert_eq!(s.ranges(), &[(0, 0x20), (0xff, HASH_END)]);
        assert_eq!(
            s.to_string(),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x0000000000000020') || \
             shardRange(object.metadata.namespace, '0x00000000000000ff', '0x10000000000000000')"
        );
    }

    #[test]
    fn an_empty_share_is_refused() {
        assert!(ShardSelector::new(ShardField::Uid, []).is_err());
        assert!(ShardSelector::new(ShardField::Uid, [(5, 5)]).is_err());
        assert!(ShardSelector::new(ShardField::Uid, [(0, HASH_END + 1)]).is_err());
    }

    #[test]
    fn an_object_is_held_by_the_range_of_its_fields_hash() {
        // KEP-5866 hashes with FNV-1a 64 (k8s.io/apimachinery/pkg/sharding.HashField): its test vectors.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
        let hash = fnv1a64("default");
        let s = ShardSelector::new(ShardField::Namespace, [(hash, u128::from(hash) + 1)]).expect("valid");
        assert!(s.holds("default"));
        assert!(!s.holds("kube-system"));
        let halves =
            [(0, 1 << 63), (1 << 63, HASH_END)].map(|r| ShardSelector::new(ShardField::Uid, [r]).expect("valid"));
        for uid in ["0b6f0c8e-1d9a-4c1e-9a53-1b2d3c4e5f60", "a", ""] {
            assert_eq!(halves.iter().filter(|s| s.holds(uid)).count(), 1, "{uid:?} is in exactly one half");
        }
    }
}
