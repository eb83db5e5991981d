//! A subscription folded into one value per object, for readers that need a whole set at once (a
//! Service's ready endpoints, an election group's members) rather than each event.

use std::{collections::HashMap, sync::Arc};

use super::{
    Hub, Query, ResourceError, Subscription,
    object::{Obj, ObjKey},
    shared::{Change, Item},
};

/// What each object of a query says, kept current from its subscription.
#[derive(Debug)]
pub struct Mirror<V> {
    subscription: Subscription,
    values: HashMap<ObjKey, V>,
    /// The values hold the whole set: the snapshot (or the first list) is complete.
    synced: bool,
}

impl<V> Mirror<V> {
    /// Subscribes to `query`; the values fill as items arrive through [`Mirror::next`].
    pub async fn open(hub: &Arc<Hub>, query: Query) -> Result<Self, ResourceError> {
        Ok(Self { subscription: hub.subscribe(query).await?, values: HashMap::new(), synced: false })
    }

    /// Takes the next item in: `read` turns an object into its value, given the value it had before
    /// (None drops the object). Returns false once the hub ended the subscription (the daemon stops).
    pub async fn next(&mut self, read: impl Fn(&Obj, Option<&V>) -> Option<V>) -> bool {
        let Some(item) = self.subscription.next().await else { return false };
        let mut note = |obj: &Obj| match read(obj, self.values.get(&obj.key())) {
            Some(v) => {
                self.values.insert(obj.key(), v);
            }
            None => {
                self.values.remove(&obj.key());
            }
        };
        match item {
            Item::ResyncRequired => {
                self.values.clear();
                self.synced = false;
            }
            Item::Snapshot(obj, _) => note(&obj),
            Item::Synced(_) => self.synced = true,
            Item::Entry(entry) => match &entry.change {
                Change::Added(obj) | Change::Modified(obj) => note(obj),
                Change::Deleted(obj) => {
                    self.values.remove(&obj.key());
                }
                Change::Synced => self.synced = true,
                // The difference that follows brings the values up to date.
                Change::Relisted => {}
            },
        }
        true
    }

    /// Whether the values hold the whole set.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The value of every object seen so far.
    pub fn values(&self) -> &HashMap<ObjKey, V> {
        &self.values
    }
}
