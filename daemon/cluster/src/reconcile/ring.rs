//! A sharded queue's ring as state without I/O: the key space cut into [`SLOTS`] fixed slots (ranges of a
//! 64-bit hash of the key), each owned by one member's holding in an epoch
//! that grows with every change of owner; the coordinator's plan that balances slots over the live
//! members moving only what must move, and the owner's release of a slot to its next owner.

use std::collections::{BTreeMap, BTreeSet};

use consistd_core::names::fnv1a64;
use serde::{Deserialize, Serialize};

use crate::watch::{
    object::ObjKey,
    shard::{ShardField, ShardSelector},
};

/// How many slots the key space is cut into: at 100 members, about 10 each.
pub const SLOTS: u16 = 1024;
/// The hash bits below a slot's: slot `s` is the hashes `[s << SHIFT, (s + 1) << SHIFT)`.
const SHIFT: u32 = 64 - SLOTS.trailing_zeros();

/// SplitMix64's finalizer: FNV-1a's high bits barely depend on a name's last characters ("cm-1" to
/// "cm-20000" fill 279 of 1024 slots), so the hash is mixed before its high bits pick the slot.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The slot of a key: of its "namespace/name" (a cluster-scoped key's "/name"), fixed for the key's whole
/// life, whatever objects come and go under it (a key by uid would move when its object is made again,
/// and its deletion and its creation could then be leased to two pods at once).
pub fn slot_of(key: &ObjKey) -> u16 {
    let hash = mix(fnv1a64(&format!("{}/{}", key.namespace, key.name)));
    u16::try_from(hash >> SHIFT).unwrap_or(u16::MAX)
}

/// What a sharded queue's keys are hashed by to find their slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ShardBy {
    /// The key, namespace and name ([`slot_of`]): keys spread evenly over the slots, and every member
    /// watches every object (no apiserver field hashes a name).
    #[default]
    Key,
    /// The key's namespace, hashed as KEP-5866 hashes `object.metadata.namespace` (FNV-1a 64, its high bits
    /// the slot, unmixed): a namespace's keys share one slot, so a slot's objects are a range of the
    /// apiserver's hash and a member lists and watches only its slots' namespaces. Namespaces named alike
    /// but for their last character land in one slot (FNV-1a's high bits hardly depend on it).
    Namespace,
}

impl ShardBy {
    /// The slot of `key`.
    pub fn slot(self, key: &ObjKey) -> u16 {
        match self {
            Self::Key => slot_of(key),
            Self::Namespace => u16::try_from(fnv1a64(&key.namespace) >> SHIFT).unwrap_or(u16::MAX),
        }
    }

    /// The objects whose keys fall in `slots`, as a shard selector the apiserver can apply; None when keys
    /// are hashed by key. No slot at all is the single hash 0, which (one in 2^64) holds nothing: a selector
    /// cannot be empty.
    pub fn share(self, slots: impl IntoIterator<Item = u16>) -> Option<ShardSelector> {
        let Self::Namespace = self else { return None };
        let mut ranges: Vec<(u64, u128)> =
            slots.into_iter().map(|s| (u64::from(s) << SHIFT, (u128::from(s) + 1) << SHIFT)).collect();
        if ranges.is_empty() {
            ranges.push((0, 1));
        }
        ShardSelector::new(ShardField::Namespace, ranges).ok()
    }
}

/// One member's holding: its identity and the id of this holding (a new one each time a member's hold
/// lapsed, so an old record of its slots never becomes its own again).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Holder {
    /// The member's identity.
    pub identity: String,
    /// Its holding.
    pub holding: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.identity, self.holding)
    }
}

/// One slot of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingSlot {
    /// Its epoch: grows by one each time an owner is given it, so a claim names one owner's tenure.
    pub epoch: u64,
    /// Who owns it; None while nobody does.
    pub owner: Option<Holder>,
    /// Whom it moves to: the owner stops granting, and gives it there once its leases ended.
    pub next: Option<Holder>,
}

/// The ring: every slot's owner and epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// Indexed by slot.
    pub slots: Vec<RingSlot>,
}

/// The ring as its Lease annotation holds it: a table of holders, and per slot (epoch, owner, next) as
/// indexes into it (-1 for none).
#[derive(Serialize, Deserialize)]
struct Encoded {
    holders: Vec<Holder>,
    slots: Vec<(u64, i32, i32)>,
}

impl Ring {
    /// A ring nobody owns yet, every epoch at `base`. A new ring starts its epochs at the time it is made
    /// (in milliseconds), so a ring deleted and made again never hands out an epoch an earlier ring did.
    pub fn new(base: u64) -> Self {
        Self { slots: (0..SLOTS).map(|_| RingSlot { epoch: base, owner: None, next: None }).collect() }
    }

    /// Reads the ring from its written form.
    pub fn decode(text: &str) -> Result<Self, String> {
        let encoded: Encoded = serde_json::from_str(text).map_err(|e| format!("the ring does not decode: {e}"))?;
        if encoded.slots.len() != usize::from(SLOTS) {
            return Err(format!("the ring has {} slots, not {SLOTS}", encoded.slots.len()));
        }
        let holder = |index: i32| -> Result<Option<Holder>, String> {
            match usize::try_from(index) {
                Err(_) => Ok(None),
                Ok(i) => encoded.holders.get(i).cloned().map(Some).ok_or_else(|| format!("no holder {i}")),
            }
        };
        let slots = encoded
            .slots
            .iter()
            .map(|&(epoch, owner, next)| Ok(RingSlot { epoch, owner: holder(owner)?, next: holder(next)? }))
            .collect::<Result<_, String>>()?;
        Ok(Self { slots })
    }

    /// The ring's written form.
    pub fn encode(&self) -> String {
        let mut index: BTreeMap<&Holder, i32> = BTreeMap::new();
        for h in self.slots.iter().flat_map(|s| s.owner.iter().chain(s.next.iter())) {
            let next = i32::try_from(index.len()).unwrap_or(i32::MAX);
            index.entry(h).or_insert(next);
        }
        let at = |h: &Option<Holder>| h.as_ref().and_then(|h| index.get(h).copied()).unwrap_or(-1);
        let slots = self.slots.iter().map(|s| (s.epoch, at(&s.owner), at(&s.next))).collect();
        let mut holders: Vec<(&Holder, i32)> = index.iter().map(|(h, i)| (*h, *i)).collect();
        holders.sort_by_key(|(_, i)| *i);
        let encoded = Encoded { holders: holders.into_iter().map(|(h, _)| h.clone()).collect(), slots };
        serde_json::to_string(&encoded).unwrap_or_default()
    }

    /// The slots `holder` owns, with their epochs and whether each is moving away.
    pub fn owned_by(&self, holder: &Holder) -> BTreeMap<u16, (u64, bool)> {
        self.slots
            .iter()
            .zip(0u16..)
            .filter(|(s, _)| s.owner.as_ref() == Some(holder))
            .map(|(s, i)| (i, (s.epoch, s.next.is_some())))
            .collect()
    }

    /// Every holder the ring names as an owner.
    pub fn owners(&self) -> BTreeSet<&Holder> {
        self.slots.iter().filter_map(|s| s.owner.as_ref()).collect()
    }

    /// How many slots nobody owns.
    pub fn unowned(&self) -> usize {
        self.slots.iter().filter(|s| s.owner.is_none()).count()
    }

    /// The coordinator's plan: owners that are `gone` (their hold has surely ended) lose their slots;
    /// moves to a holder that is not live are called off; then every slot nobody owns goes to a live member
    /// under its share (in the next epoch), and members over their share mark the excess to move to
    /// members under it. A member's share is `SLOTS / live` or one more, the extra going to those holding
    /// most already, so a member joining or leaving moves only its share. None when nothing changes.
    pub fn plan(&self, live: &BTreeSet<Holder>, gone: &dyn Fn(&Holder) -> bool) -> Option<Self> {
        let mut next = self.clone();
        for slot in &mut next.slots {
            if slot.owner.as_ref().is_some_and(gone) {
                slot.owner = None;
                slot.next = None;
            }
            if slot.next.as_ref().is_some_and(|n| !live.contains(n)) {
                slot.next = None;
            }
        }
        if !live.is_empty() {
            next.balance(live);
        }
        (next != *self).then_some(next)
    }

    /// Gives unowned slots to members under their share and marks moves from members over it.
    fn balance(&mut self, live: &BTreeSet<Holder>) {
        // What each live member will own once the moves marked are done.
        let mut count: BTreeMap<&Holder, usize> = live.iter().map(|h| (h, 0)).collect();
        for slot in &self.slots {
            if let Some(h) = slot.next.as_ref().or(slot.owner.as_ref())
                && let Some(c) = count.get_mut(h)
            {
                *c += 1;
            }
        }
        let members = live.len();
        let (base, extra) = (usize::from(SLOTS) / members, usize::from(SLOTS) % members);
        let mut by_count: Vec<&Holder> = live.iter().collect();
        by_count.sort_by(|a, b| count[b].cmp(&count[a]).then_with(|| a.cmp(b)));
        let share: BTreeMap<Holder, usize> =
            by_count.iter().enumerate().map(|(i, h)| ((*h).clone(), base + usize::from(i < extra))).collect();
        let mut count: BTreeMap<Holder, usize> = count.into_iter().map(|(h, c)| (h.clone(), c)).collect();
        let under = |count: &BTreeMap<Holder, usize>| -> Option<Holder> {
            live.iter().filter(|h| count[*h] < share[*h]).min_by_key(|h| (count[*h], (*h).clone())).cloned()
        };
        // Members over their share mark their highest slots to move.
        for i in (0..self.slots.len()).rev() {
            let slot = &self.slots[i];
            let Some(owner) = slot.owner.clone() else { continue };
            if slot.next.is_some() || !live.contains(&owner) || count[&owner] <= share[&owner] {
                continue;
            }
            let Some(to) = under(&count) else { break };
            *count.entry(owner).or_default() -= 1;
            *count.entry(to.clone()).or_default() += 1;
            self.slots[i].next = Some(to);
        }
        // Slots nobody owns go straight to members under their share, in the next epoch.
        for i in 0..self.slots.len() {
            if self.slots[i].owner.is_some() {
                continue;
            }
            let Some(to) = under(&count) else { break };
            *count.entry(to.clone()).or_default() += 1;
            let slot = &mut self.slots[i];
            slot.owner = Some(to);
            slot.epoch += 1;
        }
    }

    /// The owner gives `slots` (whose leases have all ended) to their next owners, each in the next epoch.
    /// Returns whether anything changed: a slot that is no longer this owner's, or not moving, stays.
    pub fn release(&mut self, owner: &Holder, slots: &BTreeSet<u16>) -> bool {
        let mut changed = false;
        for &i in slots {
            let Some(slot) = self.slots.get_mut(usize::from(i)) else { continue };
            if slot.owner.as_ref() != Some(owner) {
                continue;
            }
            if let Some(to) = slot.next.take() {
                slot.owner = Some(to);
                slot.epoch += 1;
                changed = true;
            }
        }
        changed
    }

    /// The owner leaves (its leases have all ended): each of its slots goes to where it was moving, else
    /// to the live member of `others` owning fewest, in the next epoch; with no other member, to nobody.
    pub fn leave(&mut self, owner: &Holder, others: &BTreeSet<Holder>) -> bool {
        let mut count: BTreeMap<&Holder, usize> = others.iter().map(|h| (h, 0)).collect();
        for s in &self.slots {
            if let Some(c) = s.next.as_ref().or(s.owner.as_ref()).and_then(|h| count.get_mut(h)) {
                *c += 1;
            }
        }
        let mut changed = false;
        for slot in &mut self.slots {
            if slot.owner.as_ref() != Some(owner) {
                if slot.next.as_ref() == Some(owner) {
                    slot.next = None;
                    changed = true;
                }
                continue;
            }
            changed = true;
            let to = slot
                .next
                .take()
                .filter(|n| others.contains(n))
                .or_else(|| count.iter().min_by_key(|(h, c)| (**c, (**h).clone())).map(|(h, _)| (*h).clone()));
            match to {
                Some(to) => {
                    if let Some(c) = count.get_mut(&to) {
                        *c += 1;
                    }
                    slot.owner = Some(to);
                    slot.epoch += 1;
                }
                None => slot.owner = None,
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(identity: &str) -> Holder {
        Holder { identity: identity.into(), holding: "h1".into() }
    }

    fn live(names: &[&str]) -> BTreeSet<Holder> {
        names.iter().map(|n| holder(n)).collect()
    }

    fn counts(ring: &Ring) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for s in &ring.slots {
            if let Some(o) = &s.owner {
                *out.entry(o.identity.clone()).or_default() += 1;
            }
        }
        out
    }

    /// Plans, then lets every owner release what it was asked to move, until the plan changes nothing.
    fn settle(mut ring: Ring, members: &BTreeSet<Holder>) -> Ring {
        while let Some(next) = ring.plan(members, &|h| !members.contains(h)) {
            ring = next;
            for h in members {
                let moving: BTreeSet<u16> =
                    ring.owned_by(h).into_iter().filter(|(_, (_, m))| *m).map(|(i, _)| i).collect();
                ring.release(h, &moving);
            }
        }
        ring
    }

    #[test]
    fn fnv1a_is_the_64_bit_one_kep_5866_hashes_with_and_a_slot_is_a_range_of_the_mixed_hash() {
        // The FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
        let key = ObjKey { namespace: "ns".into(), name: "a".into() };
        let slot = slot_of(&key);
        assert_eq!(u64::from(slot), mix(fnv1a64("ns/a")) >> 54);
        assert!(slot < SLOTS);
    }

    #[test]
    fn a_slot_by_namespace_is_the_range_of_the_apiservers_hash_its_share_selects() {
        let key = |ns: &str, name: &str| ObjKey { namespace: ns.into(), name: name.into() };
        let by = ShardBy::Namespace;
        assert_eq!(u64::from(by.slot(&key("team-a", "x"))), fnv1a64("team-a") >> 54, "FNV-1a 64 unmixed");
        assert_eq!(by.slot(&key("team-a", "x")), by.slot(&key("team-a", "y")), "a namespace's keys share a slot");
        let slot = by.slot(&key("team-a", "x"));
        let share = by.share([slot]).expect("a share");
        assert!(share.holds("team-a"));
        let others: Vec<String> =
            (0..200).map(|i| format!("ns-{i}")).filter(|ns| by.slot(&key(ns, "x")) != slot).collect();
        assert!(others.len() > 150 && others.iter().all(|ns| !share.holds(ns)), "only its slot's namespaces");
        let all = by.share(0..SLOTS).expect("a share");
        assert_eq!(all.ranges(), &[(0, crate::watch::shard::HASH_END)], "every slot: the whole space, merged");
        assert_eq!(by.share([]).expect("a share").ranges(), &[(0, 1)], "no slot: one hash");
        assert_eq!(ShardBy::Key.share([slot]), None, "no apiserver field hashes a key");
        assert_eq!(ShardBy::Key.slot(&key("ns", "a")), slot_of(&key("ns", "a")));
    }

    #[test]
    fn keys_named_alike_spread_evenly_over_the_slots() {
        let mut per_slot = vec![0u32; usize::from(SLOTS)];
        for i in 0..20_000 {
            per_slot[usize::from(slot_of(&ObjKey { namespace: "ns".into(), name: format!("cm-{i}") }))] += 1;
        }
        // About 19.5 each: a Poisson spread, none empty, none more than three times the mean.
        let (least, most) = (per_slot.iter().min().copied(), per_slot.iter().max().copied());
        assert!(least >= Some(3) && most <= Some(60), "{least:?}..{most:?}");
    }

    #[test]
    fn the_plan_balances_and_a_member_joining_or_leaving_moves_only_its_share() {
        let two = live(&["a", "b"]);
        let ring = settle(Ring::new(100), &two);
        assert_eq!(counts(&ring), BTreeMap::from([("a".into(), 512), ("b".into(), 512)]));
        assert!(ring.slots.iter().all(|s| s.epoch == 101), "each slot given once, in the next epoch");
        let three = live(&["a", "b", "c"]);
        let grown = settle(ring.clone(), &three);
        let moved = ring.slots.iter().zip(&grown.slots).filter(|(a, b)| a.owner != b.owner).count();
        assert_eq!(moved, 341, "only the newcomer's share moves");
        assert!(
            grown
                .slots
                .iter()
                .zip(&ring.slots)
                .all(|(g, r)| g.owner.as_ref().expect("owned").identity == "c" || g.owner == r.owner)
        );
        let c = counts(&grown);
        assert!(c.values().all(|n| (341..=342).contains(n)), "{c:?}");
        // b leaves: only its slots move, each in a later epoch.
        let shrunk = settle(grown.clone(), &live(&["a", "c"]));
        for (before, after) in grown.slots.iter().zip(&shrunk.slots) {
            if before.owner.as_ref().expect("owned").identity == "b" {
                assert!(after.epoch > before.epoch);
            } else {
                assert_eq!(before, after);
            }
        }
        assert_eq!(counts(&shrunk), BTreeMap::from([("a".into(), 512), ("c".into(), 512)]));
    }

    #[test]
    fn an_owner_not_live_but_not_gone_keeps_its_slots_and_a_move_to_a_member_gone_is_called_off() {
        let ring = settle(Ring::new(1), &live(&["a", "b"]));
        // b stops renewing but its hold has not surely ended: nobody is given its slots yet.
        let a_only = live(&["a"]);
        let planned = ring.plan(&a_only, &|_| false);
        assert!(planned.is_none(), "a owns its share already, b's slots wait");
        // a is asked to move slots to c, then c goes before a released them.
        let three = live(&["a", "b", "c"]);
        let moving = ring.plan(&three, &|_| false).expect("moves to c");
        assert!(moving.slots.iter().any(|s| s.next == Some(holder("c"))));
        let called_off = moving.plan(&live(&["a", "b"]), &|h| h.identity == "c").expect("moves called off");
        assert!(called_off.slots.iter().all(|s| s.next.is_none()));
    }

    #[test]
    fn a_release_gives_only_moving_slots_of_their_owner_in_the_next_epoch() {
        let mut ring = Ring::new(7);
        ring.slots[0] = RingSlot { epoch: 8, owner: Some(holder("a")), next: Some(holder("b")) };
        ring.slots[1] = RingSlot { epoch: 8, owner: Some(holder("a")), next: None };
        ring.slots[2] = RingSlot { epoch: 8, owner: Some(holder("c")), next: Some(holder("b")) };
        assert!(ring.release(&holder("a"), &BTreeSet::from([0, 1, 2])));
        assert_eq!(ring.slots[0], RingSlot { epoch: 9, owner: Some(holder("b")), next: None });
        assert_eq!(ring.slots[1].owner, Some(holder("a")), "not moving");
        assert_eq!(ring.slots[2].owner, Some(holder("c")), "not a's");
        assert!(!ring.release(&holder("a"), &BTreeSet::from([0])), "no longer a's");
    }

    #[test]
    fn a_member_leaving_gives_its_slots_to_the_others_or_to_nobody() {
        let ring = settle(Ring::new(1), &live(&["a", "b"]));
        let mut left = ring.clone();
        assert!(left.leave(&holder("a"), &live(&["b"])));
        assert_eq!(counts(&left), BTreeMap::from([("b".into(), 1024)]));
        assert!(
            left.slots
                .iter()
                .zip(&ring.slots)
                .all(|(l, r)| l.epoch == r.epoch + u64::from(r.owner == Some(holder("a"))))
        );
        let mut alone = left.clone();
        assert!(alone.leave(&holder("b"), &BTreeSet::new()));
        assert_eq!(alone.unowned(), 1024);
    }

    #[test]
    fn the_ring_reads_back_as_written_and_a_bad_one_is_refused() {
        let ring = settle(Ring::new(1_700_000_000_000), &live(&["a", "b", "c"]));
        let text = ring.encode();
        assert_eq!(Ring::decode(&text), Ok(ring));
        assert!(text.len() < 30_000, "{} bytes", text.len());
        assert!(Ring::decode("{}").is_err());
        assert!(Ring::decode(r#"{"holders":[],"slots":[[1,0,-1]]}"#).is_err());
    }
}
