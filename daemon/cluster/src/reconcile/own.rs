//! Writes made under a queue's leases, kept until their watch events come: such an event is the lease's own
//! doing, and queues no pass of the lease's key (a write made by anyone else still does).

use std::collections::{HashMap, VecDeque};

use tokio::time::Instant;

use crate::watch::object::{Obj, ObjKey};

/// An object's state as a write left it: its uid and resourceVersion, which name one write in etcd.
pub(super) type WriteResult = (String, String);

/// The writes made under a queue's leases whose events may still come.
#[derive(Debug, Default)]
pub(super) struct OwnWrites {
    /// Each write's resulting state, and the key whose lease made it.
    made: HashMap<WriteResult, ObjKey>,
    /// The same, oldest first, with when each is forgotten: an event later than that queues a pass, as a
    /// change by anyone else would (never a pass lost, at worst one more).
    until: VecDeque<(Instant, WriteResult)>,
}

impl OwnWrites {
    /// A lease of `key` wrote the state `version`; its event is expected until `until`.
    pub(super) fn insert(&mut self, key: &ObjKey, version: WriteResult, until: Instant) {
        self.made.insert(version.clone(), key.clone());
        self.until.push_back((until, version));
    }

    /// Whether `obj`, as a watch event showed it, is the state a write under a lease of `key` left.
    pub(super) fn made(&self, key: &ObjKey, obj: &Obj) -> bool {
        self.made.get(&version_of(obj)).is_some_and(|k| k == key)
    }

    /// Forgets the writes whose events were due by `now` (seen or not: each watch of the queue that
    /// selects the object may show it, so none is forgotten when one did).
    pub(super) fn forget_due(&mut self, now: Instant) {
        while let Some((until, _)) = self.until.front()
            && *until <= now
        {
            if let Some((_, version)) = self.until.pop_front() {
                self.made.remove(&version);
            }
        }
    }
}

/// The version `obj` names.
pub(super) fn version_of(obj: &Obj) -> WriteResult {
    (obj.uid().to_owned(), obj.resource_version().to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::watch::object::RawObject;

    fn obj(name: &str, rv: u64) -> Obj {
        let json = format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","uid":"uid-{name}","resourceVersion":"{rv}"}}}}"#
        );
        Obj::from(serde_json::from_str::<RawObject>(&json).expect("test object decodes"))
    }

    fn key(name: &str) -> ObjKey {
        ObjKey { namespace: "ns".into(), name: name.into() }
    }

    #[test]
    fn a_write_is_its_leases_own_at_its_version_only_and_until_its_time() {
        let now = Instant::now();
        let mut own = OwnWrites::default();
        own.insert(&key("a"), version_of(&obj("a", 7)), now + Duration::from_secs(5));
        assert!(own.made(&key("a"), &obj("a", 7)));
        assert!(!own.made(&key("a"), &obj("a", 8)), "another version is someone else's change");
        assert!(!own.made(&key("b"), &obj("a", 7)), "a write under a's lease is no write of b's");
        own.forget_due(now + Duration::from_secs(4));
        assert!(own.made(&key("a"), &obj("a", 7)), "still expected");
        own.forget_due(now + Duration::from_secs(5));
        assert!(!own.made(&key("a"), &obj("a", 7)), "forgotten once due");
    }
}
