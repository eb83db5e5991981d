//! A watch's current objects by namespace and name, found through the objects' own strings: a
//! `HashMap<ObjKey, _>` would hold both again for every object (about 110 bytes each, a tenth of a small
//! object's whole cost).

use std::{hash::BuildHasher, sync::Arc};

use hashbrown::{HashTable, hash_table::Entry};

use super::object::{Obj, ObjKey};

/// ObjectCache, at most one per namespace and name.
#[derive(Debug, Default)]
pub(crate) struct ObjectCache {
    table: HashTable<Arc<Obj>>,
    hasher: std::collections::hash_map::RandomState,
}

/// The hash of a namespace and name, the same for a key and for the object it names.
fn hash(hasher: &impl BuildHasher, namespace: &str, name: &str) -> u64 {
    hasher.hash_one((namespace, name))
}

impl ObjectCache {
    /// The object at `namespace`/`name`.
    pub(crate) fn find(&self, namespace: &str, name: &str) -> Option<&Arc<Obj>> {
        self.table.find(hash(&self.hasher, namespace, name), |o| o.namespace() == namespace && o.name() == name)
    }

    /// The object at `key`.
    pub(crate) fn get(&self, key: &ObjKey) -> Option<&Arc<Obj>> {
        self.find(&key.namespace, &key.name)
    }

    /// The object at the place of `obj` (its namespace and name), whatever its version.
    pub(crate) fn at(&self, obj: &Obj) -> Option<&Arc<Obj>> {
        self.find(obj.namespace(), obj.name())
    }

    /// Puts `obj` in its place; returns the object that was there.
    pub(crate) fn insert(&mut self, obj: Arc<Obj>) -> Option<Arc<Obj>> {
        let Self { table, hasher } = self;
        let at = hash(hasher, obj.namespace(), obj.name());
        let entry = table.entry(
            at,
            |o| o.namespace() == obj.namespace() && o.name() == obj.name(),
            |o| hash(hasher, o.namespace(), o.name()),
        );
        match entry {
            Entry::Occupied(mut e) => Some(std::mem::replace(e.get_mut(), obj)),
            Entry::Vacant(e) => {
                e.insert(obj);
                None
            }
        }
    }

    /// Takes out the object at the place of `obj`.
    pub(crate) fn remove(&mut self, obj: &Obj) -> Option<Arc<Obj>> {
        let at = hash(&self.hasher, obj.namespace(), obj.name());
        let found = self.table.find_entry(at, |o| o.namespace() == obj.namespace() && o.name() == obj.name());
        found.ok().map(|e| e.remove().0)
    }

    /// Every object, in no order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<Obj>> {
        self.table.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(namespace: &str, name: &str, rv: &str) -> Arc<Obj> {
        Arc::new(Obj::new(&format!("{namespace}/{name}"), namespace, name, rv, Vec::new()))
    }

    #[test]
    fn one_object_per_namespace_and_name() {
        let mut objects = ObjectCache::default();
        assert!(objects.insert(obj("a", "x", "1")).is_none());
        assert!(objects.insert(obj("b", "x", "1")).is_none(), "another namespace, another place");
        let old = objects.insert(obj("a", "x", "2")).expect("replaced");
        assert_eq!(old.resource_version(), "1");
        assert_eq!(objects.values().count(), 2);
        let key = ObjKey { namespace: "a".into(), name: "x".into() };
        assert_eq!(objects.get(&key).map(|o| o.resource_version()), Some("2"));
        assert!(objects.find("a", "y").is_none());
        assert_eq!(objects.remove(&obj("a", "x", "9")).map(|o| o.resource_version().to_owned()), Some("2".into()));
        assert!(objects.get(&key).is_none());
        for i in 0..1000 {
            objects.insert(obj("c", &i.to_string(), "1"));
        }
        assert_eq!(objects.values().count(), 1001);
        assert!((0..1000).all(|i| objects.find("c", &i.to_string()).is_some()), "found after the table grew");
    }
}
