//! A sharded queue's member in this daemon: its shard Lease, the ring read from the group's ring Lease,
//! the coordinator's plan (written by the live member with the first identity), and the hand-off of
//! slots the driver has drained. The member's hold on its slots lasts from a renewal's sending until a
//! tenth of the TTL before the TTL has passed, and only a renewal answered within the hold extends it; the
//! coordinator takes a member's slots only once a consistent read shows the member's last renewal a TTL
//! old on the coordinator's clock, or a newer holding of it. So the old owner has stopped before anyone
//! is given its slots, whatever the network did (docs/ARCHITECTURE.md, "The sharded queue"). A slot
//! handed on carries its keys' state in a hand-off Lease written before the ring gives the slot on.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, PoisonError, atomic::AtomicU64},
    time::{Duration, SystemTime},
};

use consistd_core::{
    claim::Claim,
    config::Live,
    lease::{
        HOLDING_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, MEMBER_OF_LABEL, QUEUE_SPEC_ANNOTATION, RING_ANNOTATION,
        RING_HANDOFF_ANNOTATION, RING_SLOTS_ANNOTATION,
    },
    names,
    report::RingState,
};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::{
    ReconcileError,
    queue::Carried,
    ring::{Holder, Ring, SLOTS},
};
use crate::{
    leadership::{
        Key,
        member_lease::{LeaseJson, age_of, group_label},
    },
    watch::{Hub, Mirror, Query, object::Obj, sleep_until},
};

/// How long one write or read of the ring's Leases may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// The most a hand-off Lease carries (the apiserver takes 256 KiB of annotations per object); the keys
/// beyond it are handed out once by the next owner instead.
const HANDOFF_BYTES: usize = 200 * 1024;

/// The names of a sharded queue's group: its ring Lease, its members' shard Leases, and its claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingNames {
    /// Namespace of the election, where the ring's Leases live.
    pub namespace: String,
    /// `<election>.ring.<queue>`: the ring Lease's name and the prefix of each slot's claim.
    pub ring: String,
    /// The member-of label value every Lease of the ring carries.
    label: String,
}

impl RingNames {
    /// The names of `queue`'s ring in `election`'s group.
    pub fn new(election: &Key, queue: &str) -> Self {
        let readable = format!("{}.ring.{queue}", election.name);
        let ring = if names::is_dns_subdomain(&readable) && readable.len() <= 200 {
            readable
        } else {
            format!("consistd-ring-{:016x}", names::fnv1a64(&format!("{election}/{queue}")))
        };
        Self { namespace: election.namespace.clone(), label: group_label(&ring), ring }
    }

    /// A Lease carrying slots' keys to their next owners.
    fn handoff(&self, id: &str) -> String {
        format!("{}.handoff-{id}", self.ring)
    }

    /// A member's shard Lease.
    fn member(&self, identity: &str) -> String {
        let readable = format!("{}.{identity}", self.ring);
        if names::is_dns_subdomain(&readable) {
            readable
        } else {
            format!("consistd-shard-{:016x}", names::fnv1a64(&format!("{}/{identity}", self.ring)))
        }
    }

    /// The claim of an action taken while owning `slot` in `epoch`: one "election" per slot, so the
    /// per-object token compares the epochs of a key's slot, which never changes for the key.
    pub fn claim(&self, slot: u16, epoch: u64) -> Claim {
        Claim { namespace: self.namespace.clone(), lease: format!("{}.slot-{slot}", self.ring), term: epoch }
    }
}

/// What a slot's last owner handed on with it: its keys' state, as of when each of that owner's watches
/// had brought it every change up to its `cut`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    /// The slot.
    pub slot: u16,
    /// The epoch the next owner holds it in: the hand-off is for that owner's tenure only.
    pub epoch: u64,
    /// Per watch of the queue (the primary first, then the related ones, as the spec lists them): the
    /// resourceVersion up to which its changes had reached the giver; a later change may not have. None
    /// where resourceVersions do not compare: then every key counts as changed.
    pub cut: Option<Vec<u64>>,
    /// More keys carried state than a Lease holds: those left out count as changed.
    pub overflow: bool,
    /// Keys that carry something (idle keys without failures carry nothing).
    pub keys: Vec<Carried>,
}

/// What the driver may grant under, as the member's hold and the ring say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ownership {
    /// Until when this member's hold counts; None: it may grant nothing.
    pub until: Option<Instant>,
    /// The holding it counts for: a driver that took in an earlier holding's slots grants nothing under
    /// a later one until it takes that in.
    pub holding: String,
    /// The slots it owns: epoch, and whether the slot is moving away (no new grants; given on once its
    /// leases ended).
    pub slots: BTreeMap<u16, (u64, bool)>,
    /// What the last owner of an owned slot handed on with it, for this epoch.
    pub handoffs: BTreeMap<u16, Arc<Handoff>>,
}

impl Ownership {
    /// The epoch this member owns `slot` in at `now`, and whether it is moving away; None when it
    /// does not own it (or its hold lapsed).
    pub fn of(&self, slot: u16, now: Instant) -> Option<(u16, u64, bool)> {
        self.until.filter(|until| now < *until)?;
        self.slots.get(&slot).map(|(epoch, moving)| (slot, *epoch, *moving))
    }
}

/// This daemon's membership of one sharded queue; dropping it leaves (its slots go to the others).
#[derive(Debug)]
pub struct ShardMember {
    /// What may be granted.
    pub ownership: watch::Receiver<Ownership>,
    /// The ring's names.
    pub names: Arc<RingNames>,
    /// Slots the driver drained (moving, no lease out), and at its end every slot, with their keys' state.
    drained: mpsc::UnboundedSender<ToMember>,
    /// What status shows.
    pub report: Arc<Mutex<RingState>>,
    stop: CancellationToken,
}

impl Drop for ShardMember {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ShardMember {
    /// A member fed by hand, for the driver's unit tests: they publish its ownership themselves.
    #[cfg(test)]
    pub(crate) fn by_hand(names: RingNames) -> (Self, watch::Sender<Ownership>) {
        let (publish, ownership) = watch::channel(Ownership::default());
        let (drained, _) = mpsc::unbounded_channel();
        let report = Arc::new(Mutex::new(RingState::default()));
        (Self { ownership, names: Arc::new(names), drained, report, stop: CancellationToken::new() }, publish)
    }

    /// Tells the member that `slots`, moving away, have no lease out: it gives them on, with their keys'
    /// state.
    pub fn drained(&self, slots: Vec<Handoff>) {
        let _ = self.drained.send(ToMember::Drained(slots));
    }

    /// Tells the member that its queue ends with no lease out: it leaves, every slot carrying its keys'
    /// state to its next owner.
    pub fn leaving(&self, slots: Vec<Handoff>) {
        let _ = self.drained.send(ToMember::Leaving(slots));
    }

    /// Joins `names`' ring as `identity`, running `spec` (field to value): refused naming the field when
    /// a live member runs another spec, and naming `spec.election` when the apiserver refuses this
    /// daemon's shard Lease. The member's task runs in `tasks` until dropped or the daemon stops.
    pub async fn join(
        hub: &Arc<Hub>,
        names: RingNames,
        identity: String,
        ttl: Live<Duration>,
        spec: BTreeMap<String, String>,
        (ownerless, tasks): (Counter<f64, AtomicU64>, &consistd_core::tasks::Tasks),
    ) -> Result<Self, ReconcileError> {
        let refused = |message: String| ReconcileError::FailedPrecondition { field: "spec.election".into(), message };
        let query = Query {
            resource: "coordination.k8s.io/v1/leases".to_owned(),
            namespace: names.namespace.clone(),
            label_selector: format!("{MEMBER_OF_LABEL}={}", names.label),
            own: true,
            ..Query::default()
        };
        let mut mirror = Mirror::open(hub, query)
            .await
            .map_err(|e| ReconcileError::Query { field: "spec.election".into(), source: e })?;
        let ring = names.ring.clone();
        let read = |obj: &Obj, before: Option<&Seen>| Seen::read(obj, &ring, before);
        let synced = tokio::time::timeout(CALL_TIMEOUT * 5, async {
            while !mirror.synced() {
                if !mirror.next(&read).await {
                    return false;
                }
            }
            true
        })
        .await;
        if synced != Ok(true) {
            return Err(refused(format!("could not read the Leases of ring {}/{}", names.namespace, names.ring)));
        }
        let encoded = serde_json::to_string(&spec).unwrap_or_default();
        let now = Instant::now();
        for seen in mirror.values().values() {
            if let Seen::Member(m) = seen
                && m.holder.identity != identity
                && m.live_until.is_some_and(|until| until > now)
                && let Some((field, theirs)) = differs(&spec, &m.spec)
            {
                return Err(ReconcileError::FailedPrecondition {
                    field,
                    message: format!(
                        "member {} runs sharded queue {} with {theirs}; every member of a sharded queue must send the same spec (or use another queue name)",
                        m.holder.identity, names.ring
                    ),
                });
            }
        }
        let names = Arc::new(names);
        let (ownership_tx, ownership) = watch::channel(Ownership::default());
        let (drained, drained_rx) = mpsc::unbounded_channel();
        let ring = format!("{}/{}", names.namespace, names.ring);
        let report = Arc::new(Mutex::new(RingState { ring, slots: usize::from(SLOTS), ..RingState::default() }));
        // Cancelled when the queue's driver drops this membership, after telling it what every slot carries;
        // the daemon's stop signal alone makes the member wait a moment for that.
        let stop = CancellationToken::new();
        let mut member = Member {
            api: Api::namespaced(hub.client(), &names.namespace),
            names: names.clone(),
            identity,
            ttl,
            spec: encoded,
            holding: new_holding(),
            lease_version: None,
            until: None,
            renew_at: Instant::now(),
            mirror,
            last_renewal: HashMap::new(),
            ownership: ownership_tx,
            drained: drained_rx,
            unreleased: (Vec::new(), Instant::now()),
            carried: BTreeMap::new(),
            planned_over: None,
            ownerless: (ownerless, Instant::now()),
            report: report.clone(),
        };
        // The first renewal, here, so a refusal (RBAC) reaches the app; a Lease an earlier run of this
        // daemon left is read and written over.
        let mut first = member.renew().await;
        if first.as_ref().is_err_and(|e| matches!(e.code(), Some(404 | 409))) {
            first = member.renew().await;
        }
        if let Err(error) = first {
            return Err(refused(format!(
                "this daemon cannot join the group of sharded queue {}/{}: {error}",
                names.namespace, names.ring
            )));
        }
        tasks.spawn(member.run(stop.clone(), tasks.signal().clone()));
        Ok(Self { ownership, names, drained, report, stop })
    }
}

/// The first field of `ours` whose value in `theirs` (written) differs: the field and their value.
fn differs(ours: &BTreeMap<String, String>, theirs: &str) -> Option<(String, String)> {
    let theirs: BTreeMap<String, String> = serde_json::from_str(theirs).unwrap_or_default();
    let fields: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    fields.into_iter().find_map(|field| {
        let (a, b) = (ours.get(field), theirs.get(field));
        (a != b).then(|| (field.clone(), b.map_or_else(|| "no value".to_owned(), |v| format!("{v:?}"))))
    })
}

fn new_holding() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// One Lease of the ring, as this daemon saw it.
#[derive(Debug, Clone)]
enum Seen {
    /// A member's shard Lease.
    Member(SeenShard),
    /// The ring Lease: the ring (or why it does not read) and the Lease's resourceVersion.
    Ring(Result<Ring, String>, String),
    /// A hand-off Lease: the slots it carries, and when it was made.
    Handoff(Arc<Vec<Handoff>>, SystemTime),
}

/// A member's shard Lease.
#[derive(Debug, Clone)]
struct SeenShard {
    holder: Holder,
    renew_time: String,
    spec: String,
    ttl: Duration,
    /// When this daemon first saw this renewal: what the coordinator counts a TTL from.
    observed: Instant,
    /// Until when the member counts as live; None when it was already lapsed at first sight.
    live_until: Option<Instant>,
}

impl Seen {
    fn read(obj: &Obj, ring: &str, before: Option<&Seen>) -> Option<Self> {
        let lease: LeaseJson = serde_json::from_slice(obj.json()).ok()?;
        let annotations = &lease.metadata.annotations;
        if annotations.get(RING_ANNOTATION).map(String::as_str) != Some(ring) {
            return None;
        }
        if let Some(slots) = annotations.get(RING_SLOTS_ANNOTATION) {
            return Some(Self::Ring(Ring::decode(slots), obj.resource_version().to_owned()));
        }
        if let Some(handoffs) = annotations.get(RING_HANDOFF_ANNOTATION) {
            let handoffs: Vec<Handoff> = serde_json::from_str(handoffs).ok()?;
            let made = lease
                .metadata
                .creation_timestamp
                .as_deref()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
            let made = made.map_or_else(SystemTime::now, SystemTime::from);
            return Some(Self::Handoff(Arc::new(handoffs), made));
        }
        let holder = Holder {
            identity: lease.spec.holder_identity?,
            holding: annotations.get(HOLDING_ANNOTATION).cloned().unwrap_or_default(),
        };
        let renew_time = lease.spec.renew_time.unwrap_or_default();
        let ttl = Duration::from_secs(lease.spec.lease_duration_seconds.unwrap_or(30));
        let now = Instant::now();
        let (observed, live_until) = match before {
            Some(Self::Member(b)) if b.renew_time == renew_time && b.holder == holder => (b.observed, b.live_until),
            Some(_) => (now, Some(now + ttl)),
            None => {
                // At first sight, the renewal's age by this machine's wall clock says whether it is live; the
                // coordinator still counts a whole TTL from now before it takes the member's slots.
                let age = renew_time.parse::<k8s_openapi::jiff::Timestamp>().ok().map(age_of);
                (now, age.filter(|age| *age < ttl).map(|age| now + (ttl - age)))
            }
        };
        let spec = annotations.get(QUEUE_SPEC_ANNOTATION).cloned().unwrap_or_default();
        Some(Self::Member(SeenShard { holder, renew_time, spec, ttl, observed, live_until }))
    }
}

/// The member's task.
struct Member {
    api: Api<Lease>,
    names: Arc<RingNames>,
    identity: String,
    ttl: Live<Duration>,
    /// The spec, as written on the shard Lease.
    spec: String,
    holding: String,
    /// The shard Lease's resourceVersion after this member's last write; None before its first.
    lease_version: Option<String>,
    /// Until when this member's hold counts.
    until: Option<Instant>,
    renew_at: Instant,
    mirror: Mirror<Seen>,
    /// Each holder's last renewal this daemon saw (its renewTime, when first seen, and its TTL), kept after
    /// its Lease is gone: the coordinator counts a TTL from it.
    last_renewal: HashMap<Holder, (String, Instant, Duration)>,
    ownership: watch::Sender<Ownership>,
    drained: mpsc::UnboundedReceiver<ToMember>,
    /// Drained slots not given on yet (a write failed), and when to try again.
    unreleased: (Vec<Handoff>, Instant),
    /// What the last owners of owned slots handed on, kept while the slot is owned in that epoch (the
    /// hand-off Lease is deleted once read).
    carried: BTreeMap<u16, Arc<Handoff>>,
    /// The ring version (empty: none) the coordinator's last plan was written over: it plans again once
    /// the watch shows another.
    planned_over: Option<String>,
    /// Slot-seconds no member granted from, counted while this member coordinates, and when it last counted.
    ownerless: (Counter<f64, AtomicU64>, Instant),
    report: Arc<Mutex<RingState>>,
}

/// What the queue's driver tells its member.
#[derive(Debug)]
enum ToMember {
    /// Slots moving away have no lease out: give them on.
    Drained(Vec<Handoff>),
    /// The queue ends with no lease out: leave, each slot carrying this.
    Leaving(Vec<Handoff>),
}

/// How long a member whose daemon stops waits for its queue's last word before it leaves without it.
const LAST_WORD: Duration = Duration::from_secs(2);

/// Why a write of the ring's Leases did not land.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl WriteError {
    fn code(&self) -> Option<u16> {
        match self {
            Self::Api(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }
}

impl Member {
    fn holder(&self) -> Holder {
        Holder { identity: self.identity.clone(), holding: self.holding.clone() }
    }

    fn ring(&self) -> Option<(&Ring, &str)> {
        self.mirror.values().values().find_map(|seen| match seen {
            Seen::Ring(Ok(ring), version) => Some((ring, version.as_str())),
            _ => None,
        })
    }

    async fn run(mut self, stop: CancellationToken, signal: CancellationToken) {
        loop {
            let now = Instant::now();
            if self.until.is_some_and(|until| until <= now) {
                self.lapse("its hold lapsed: no renewal was answered in time");
            }
            if now >= self.renew_at {
                let _ = self.renew().await;
            }
            self.note_renewals();
            self.coordinate().await;
            if !self.unreleased.0.is_empty() && now >= self.unreleased.1 {
                let slots = std::mem::take(&mut self.unreleased.0);
                self.release(slots).await;
            }
            self.publish();
            let retry = (!self.unreleased.0.is_empty()).then_some(self.unreleased.1);
            let wake = [Some(self.renew_at), self.until, self.next_expiry(), retry].into_iter().flatten().min();
            let ring = self.names.ring.clone();
            tokio::select! {
                more = self.mirror.next(|obj, before| Seen::read(obj, &ring, before)) => if !more { break },
                Some(told) = self.drained.recv() => match told {
                    ToMember::Drained(mut slots) => match self.drained_meanwhile(&mut slots) {
                        None => self.release(slots).await,
                        Some(last) => {
                            self.leave(last).await;
                            return;
                        }
                    },
                    ToMember::Leaving(slots) => {
                        self.leave(slots).await;
                        return;
                    }
                },
                () = sleep_until(wake) => {}
                () = stop.cancelled() => break,
                () = signal.cancelled() => break,
            }
        }
        // The driver's last word comes before `stop` (the driver dropping this membership). The daemon's
        // stop signal (which also ends the mirror) gives the driver a moment to say it: leaving first would
        // end the hold the driver reads its slots under, and hand nothing on.
        if !stop.is_cancelled() {
            let _ = tokio::time::timeout(LAST_WORD, stop.cancelled()).await;
        }
        let mut last = Vec::new();
        while let Ok(told) = self.drained.try_recv() {
            if let ToMember::Leaving(slots) = told {
                last = slots;
            }
        }
        self.leave(last).await;
    }

    /// Adds to `slots` the slots the driver drained since (under load they drain one by one, and a ring
    /// write each made the members' compare-and-swaps collide); its last word, if it came meanwhile.
    fn drained_meanwhile(&mut self, slots: &mut Vec<Handoff>) -> Option<Vec<Handoff>> {
        while let Ok(more) = self.drained.try_recv() {
            match more {
                ToMember::Drained(more) => slots.extend(more),
                ToMember::Leaving(last) => return Some(last),
            }
        }
        None
    }

    /// The hold ended (lapsed, or the Lease was written by someone else): nothing may be granted, and the
    /// next renewal starts a new holding, so the coordinator may give the old one's slots away at once.
    fn lapse(&mut self, why: &str) {
        if self.until.take().is_some() {
            tracing::warn!(ring = %self.names.ring, holding = %self.holding, why, "sharded queue: this member holds no slot until it renews");
        }
        self.holding = new_holding();
        self.publish();
    }

    /// Renews the shard Lease; the hold runs from the sending until a tenth of the TTL before the TTL,
    /// extended only by a renewal answered while the hold lasts.
    async fn renew(&mut self) -> Result<(), WriteError> {
        let ttl = self.ttl.get();
        let sent = Instant::now();
        let limit = self.until.map_or(ttl / 3, |until| until.saturating_duration_since(sent)).min(CALL_TIMEOUT * 2);
        let lease = self.shard_lease(ttl);
        let write = async {
            match &self.lease_version {
                Some(_) => self.api.replace(&self.names.member(&self.identity), &PostParams::default(), &lease).await,
                None => self.api.create(&PostParams::default(), &lease).await,
            }
        };
        let answer = match tokio::time::timeout(limit, write).await {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(error)) => Err(WriteError::Api(error)),
            Err(_) => Err(WriteError::Timeout(limit)),
        };
        match answer {
            Ok(written) => {
                self.lease_version = written.metadata.resource_version;
                if self.until.is_none_or(|until| Instant::now() < until) {
                    self.until = Some(sent + ttl - ttl / 10);
                }
                self.renew_at = sent + ttl / 3;
                Ok(())
            }
            Err(error) => {
                match error.code() {
                    // Written by someone else (another run of this identity), gone, or there already (this
                    // identity's earlier run): read it, and hold anew.
                    Some(404 | 409) => {
                        self.lapse("its shard Lease was written or deleted by someone else");
                        self.lease_version = match self.api.get_opt(&self.names.member(&self.identity)).await {
                            Ok(Some(lease)) => lease.metadata.resource_version,
                            _ => None,
                        };
                        self.renew_at = Instant::now();
                    }
                    _ => {
                        tracing::warn!(ring = %self.names.ring, %error, "sharded queue: could not renew this member's shard Lease; retrying");
                        self.renew_at = Instant::now() + (ttl / 15).max(Duration::from_millis(200));
                    }
                }
                Err(error)
            }
        }
    }

    fn shard_lease(&self, ttl: Duration) -> Lease {
        let annotations = BTreeMap::from([
            (RING_ANNOTATION.to_owned(), self.names.ring.clone()),
            (HOLDING_ANNOTATION.to_owned(), self.holding.clone()),
            (QUEUE_SPEC_ANNOTATION.to_owned(), self.spec.clone()),
        ]);
        Lease {
            metadata: ObjectMeta {
                name: Some(self.names.member(&self.identity)),
                resource_version: self.lease_version.clone(),
                labels: Some(ring_labels(&self.names)),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(i32::try_from(ttl.as_secs().max(1)).unwrap_or(i32::MAX)),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                ..LeaseSpec::default()
            }),
        }
    }

    /// Remembers every member's newest renewal, so a Lease deleted still has a time its TTL runs from.
    fn note_renewals(&mut self) {
        for seen in self.mirror.values().values() {
            if let Seen::Member(m) = seen {
                let newer = self.last_renewal.get(&m.holder).is_none_or(|(renewed, _, _)| *renewed != m.renew_time);
                if newer {
                    self.last_renewal.insert(m.holder.clone(), (m.renew_time.clone(), m.observed, m.ttl));
                }
            }
        }
    }

    /// Live members by holder: their renewal within its TTL, and this member while it holds.
    fn live(&self, now: Instant) -> BTreeSet<Holder> {
        let mut live: BTreeSet<Holder> = self
            .mirror
            .values()
            .values()
            .filter_map(|seen| match seen {
                Seen::Member(m) if m.live_until.is_some_and(|u| u > now) && m.holder.identity != self.identity => {
                    Some(m.holder.clone())
                }
                _ => None,
            })
            .collect();
        if self.until.is_some_and(|u| u > now) {
            live.insert(self.holder());
        }
        live
    }

    /// When the next member stops being live.
    fn next_expiry(&self) -> Option<Instant> {
        let now = Instant::now();
        let lapses = self.mirror.values().values().filter_map(|seen| match seen {
            Seen::Member(m) => m.live_until.filter(|u| *u > now),
            Seen::Ring(..) | Seen::Handoff(..) => None,
        });
        let takeable = self.last_renewal.values().map(|(_, observed, ttl)| *observed + *ttl).filter(|at| *at > now);
        lapses.chain(takeable).min()
    }

    /// Whether `holder`'s hold has surely ended: its identity's Lease names a newer holding, or a
    /// consistent read shows no renewal newer than one this daemon saw a TTL ago.
    async fn gone(&self, holder: &Holder, now: Instant) -> bool {
        let current = self.mirror.values().values().find_map(|seen| match seen {
            Seen::Member(m) if m.holder.identity == holder.identity => Some(m.holder.holding.clone()),
            _ => None,
        });
        if current.as_ref().is_some_and(|h| *h != holder.holding) {
            return true;
        }
        let Some((renewed, observed, ttl)) = self.last_renewal.get(holder) else { return false };
        if now < *observed + *ttl {
            return false;
        }
        let read = tokio::time::timeout(CALL_TIMEOUT, self.api.get_opt(&self.names.member(&holder.identity))).await;
        match read {
            Ok(Ok(None)) => true,
            Ok(Ok(Some(lease))) => {
                let annotations = lease.metadata.annotations.unwrap_or_default();
                let holding = annotations.get(HOLDING_ANNOTATION).cloned().unwrap_or_default();
                let renew_time = lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
                holding != holder.holding || renew_time == renewed.parse().ok()
            }
            // No answer proves nothing: the slots wait.
            _ => false,
        }
    }

    /// As the coordinator (the live member with the first identity, while it holds): takes the slots of
    /// members whose hold surely ended, balances, and writes the ring when that changes it.
    async fn coordinate(&mut self) {
        if !self.mirror.synced() {
            return;
        }
        let now = Instant::now();
        let live = self.live(now);
        let first = live.iter().next().map(|h| h.identity.clone());
        let coordinator = self.until.is_some_and(|u| u > now) && first.as_deref() == Some(self.identity.as_str());
        self.report.lock().unwrap_or_else(PoisonError::into_inner).coordinator = coordinator;
        let since = std::mem::replace(&mut self.ownerless.1, now);
        if !coordinator {
            return;
        }
        if let Some((ring, _)) = self.ring() {
            // Unowned, moving, or owned by a member no longer live.
            let without = ring
                .slots
                .iter()
                .filter(|s| s.next.is_some() || s.owner.as_ref().is_none_or(|o| !live.contains(o)))
                .count();
            self.ownerless.0.inc_by(now.saturating_duration_since(since).as_secs_f64() * without as f64);
        }
        let seen = self.ring().map(|(_, version)| version.to_owned()).unwrap_or_default();
        if self.planned_over.as_ref() == Some(&seen) {
            return;
        }
        self.collect_handoffs().await;
        let (ring, version) = match self.ring() {
            Some((ring, version)) => (ring.clone(), Some(version.to_owned())),
            None => {
                let base = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(1, |d| d.as_millis());
                (Ring::new(u64::try_from(base).unwrap_or(1)), None)
            }
        };
        // An owner this daemon never saw a renewal of (its Lease deleted before this daemon started): its TTL
        // counts from now.
        let ttl = self.ttl.get();
        for owner in ring.owners() {
            if !live.contains(owner) {
                self.last_renewal.entry(owner.clone()).or_insert_with(|| (String::new(), now, ttl));
            }
        }
        let mut gone = BTreeSet::new();
        for owner in ring.owners() {
            if !live.contains(owner) && self.gone(owner, now).await {
                gone.insert(owner.clone());
            }
        }
        let Some(planned) = ring.plan(&live, &|h| gone.contains(h)) else { return };
        match self.write_ring(&planned, version.clone()).await {
            Ok(()) if !gone.is_empty() => {
                let gone: Vec<String> = gone.iter().map(ToString::to_string).collect();
                tracing::info!(ring = %self.names.ring, ?gone, "sharded queue: the slots of members whose hold ended went to the others");
            }
            Ok(()) => {}
            Err(error) if error.code() == Some(409) => {}
            Err(error) => {
                tracing::warn!(ring = %self.names.ring, %error, "sharded queue: could not write the ring");
                return;
            }
        }
        // Written, or someone wrote first: the next plan waits for the watch to show a newer ring.
        self.planned_over = Some(version.unwrap_or_default());
    }

    /// Writes the ring Lease as `ring`, over `version` (None: creates it).
    async fn write_ring(&self, ring: &Ring, version: Option<String>) -> Result<(), WriteError> {
        let annotations = BTreeMap::from([
            (RING_ANNOTATION.to_owned(), self.names.ring.clone()),
            (RING_SLOTS_ANNOTATION.to_owned(), ring.encode()),
        ]);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.names.ring.clone()),
                resource_version: version.clone(),
                labels: Some(ring_labels(&self.names)),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        };
        let write = async {
            match version {
                Some(_) => self.api.replace(&self.names.ring, &PostParams::default(), &lease).await,
                None => self.api.create(&PostParams::default(), &lease).await,
            }
        };
        match tokio::time::timeout(CALL_TIMEOUT, write).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(WriteError::Api(error)),
            Err(_) => Err(WriteError::Timeout(CALL_TIMEOUT)),
        }
    }

    /// Reads the ring Lease as it is now.
    async fn read_ring(&self) -> Option<(Ring, String)> {
        let lease = tokio::time::timeout(CALL_TIMEOUT, self.api.get_opt(&self.names.ring)).await.ok()?.ok()??;
        let text = lease.metadata.annotations.as_ref()?.get(RING_SLOTS_ANNOTATION)?.clone();
        Some((Ring::decode(&text).ok()?, lease.metadata.resource_version?))
    }

    /// Changes the ring as `change` does, over the newest version (read again after a conflict, a few
    /// times): Some(true) once written, Some(false) when it changes nothing, None when it could not be written.
    async fn change_ring(&self, what: &str, change: impl Fn(&mut Ring) -> bool) -> Option<bool> {
        let mut current = self.ring().map(|(r, v)| (r.clone(), v.to_owned()));
        for _ in 0..5 {
            let (mut ring, version) = current.take()?;
            if !change(&mut ring) {
                return Some(false);
            }
            match self.write_ring(&ring, Some(version)).await {
                Ok(()) => return Some(true),
                Err(error) if error.code() == Some(409) => current = self.read_ring().await,
                Err(error) => {
                    tracing::warn!(ring = %self.names.ring, %error, what, "sharded queue: could not write the ring");
                    return None;
                }
            }
        }
        None
    }

    /// Gives drained slots (moving, no lease out) to their next owners: first each slot's keys' state in
    /// its hand-off Lease (for the epoch the next owner will hold it in), then the ring. What a write did
    /// not give on (and is still this member's, moving) is tried again a second later.
    async fn release(&mut self, fresh: Vec<Handoff>) {
        // A slot drained again since an earlier try carries what the driver said last.
        let mut handoffs = std::mem::take(&mut self.unreleased.0);
        handoffs.extend(fresh);
        if self.until.is_none_or(|u| u <= Instant::now()) {
            return;
        }
        let me = self.holder();
        let Some(ring) = self.ring().map(|(r, _)| r.clone()) else { return };
        // Only what is still this member's and moving, each for the epoch its next owner will hold.
        let mut giving: BTreeMap<u16, Handoff> = BTreeMap::new();
        for mut h in handoffs {
            let Some(slot) = ring.slots.get(usize::from(h.slot)) else { continue };
            if slot.owner.as_ref() == Some(&me) && slot.next.is_some() {
                h.epoch = slot.epoch + 1;
                giving.insert(h.slot, h);
            }
        }
        if giving.is_empty() {
            return;
        }
        let carried: Vec<Handoff> = giving.values().cloned().collect();
        if let Err(error) = self.write_handoffs(&carried).await {
            tracing::warn!(ring = %self.names.ring, %error, "sharded queue: could not write the slots' hand-off; trying again");
            self.unreleased = (giving.into_values().collect(), Instant::now() + Duration::from_secs(1));
            return;
        }
        let slots: BTreeSet<u16> = giving.keys().copied().collect();
        let moved = slots.len();
        match self.change_ring("hand-off", |r| r.release(&me, &slots)).await {
            Some(true) => {
                tracing::debug!(ring = %self.names.ring, slots = moved, "sharded queue: slots handed on");
                self.report.lock().unwrap_or_else(PoisonError::into_inner).handoffs +=
                    u64::try_from(moved).unwrap_or(0);
            }
            Some(false) => {}
            None => self.unreleased = (giving.into_values().collect(), Instant::now() + Duration::from_secs(1)),
        }
    }

    /// Writes `handoffs` (every slot of one release, those whose keys carry nothing too: their next owner
    /// learns that every key it knows of them was idle) in hand-off Leases of their own, as many as their
    /// size needs. A slot's keys beyond a Lease's size are left out and count as changed.
    async fn write_handoffs(&self, handoffs: &[Handoff]) -> Result<(), WriteError> {
        let mut batches: Vec<Vec<Handoff>> = vec![Vec::new()];
        let mut size = 0;
        for h in handoffs {
            let mut h = h.clone();
            let mut len = serde_json::to_string(&h).map_or(0, |t| t.len());
            while len > HANDOFF_BYTES && !h.keys.is_empty() {
                // Keep what waits (a backoff, a requeue) and what failed; the rest is handed out once anyway.
                h.overflow = true;
                h.keys.sort_by_key(|c| c.failures == 0 && c.last_error.is_none());
                h.keys.truncate(h.keys.len() / 2);
                len = serde_json::to_string(&h).map_or(0, |t| t.len());
            }
            if size + len > HANDOFF_BYTES {
                batches.push(Vec::new());
                size = 0;
            }
            size += len;
            if let Some(batch) = batches.last_mut() {
                batch.push(h);
            }
        }
        for batch in batches.into_iter().filter(|b| !b.is_empty()) {
            let annotations = BTreeMap::from([
                (RING_ANNOTATION.to_owned(), self.names.ring.clone()),
                (RING_HANDOFF_ANNOTATION.to_owned(), serde_json::to_string(&batch).unwrap_or_default()),
            ]);
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.names.handoff(&new_holding())),
                    labels: Some(ring_labels(&self.names)),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec::default()),
            };
            match tokio::time::timeout(CALL_TIMEOUT, self.api.create(&PostParams::default(), &lease)).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => return Err(WriteError::Api(error)),
                Err(_) => return Err(WriteError::Timeout(CALL_TIMEOUT)),
            }
        }
        Ok(())
    }

    /// As the coordinator, deletes hand-off Leases two TTLs old: their next owners read them when the ring
    /// gave them the slots (the Lease comes first, on the same watch); one that reads the ring later than
    /// that hands each key of the slot out once instead. A hand-off for a slot its last member left to
    /// nobody is kept until the slot has an owner again.
    async fn collect_handoffs(&self) {
        let old = SystemTime::now().checked_sub(self.ttl.get() * 2);
        let ring = self.ring().map(|(r, _)| r);
        let waiting = |batch: &[Handoff]| {
            batch.iter().any(|h| {
                ring.and_then(|r| r.slots.get(usize::from(h.slot)))
                    .is_some_and(|s| s.owner.is_none() && s.epoch + 1 == h.epoch)
            })
        };
        let stale: Vec<String> = self
            .mirror
            .values()
            .iter()
            .filter_map(|(key, seen)| match seen {
                Seen::Handoff(batch, made) if old.is_some_and(|old| *made < old) && !waiting(batch) => {
                    Some(key.name.clone())
                }
                _ => None,
            })
            .collect();
        for name in stale {
            let _ = tokio::time::timeout(CALL_TIMEOUT, self.api.delete(&name, &DeleteParams::default())).await;
        }
    }

    /// Leaves: grants stop at once, every slot goes to the others (each carrying its keys' state from
    /// `handoffs`, written in its hand-off Lease for the epoch its next owner holds it in before the ring
    /// gives it on), and the shard Lease is deleted.
    async fn leave(&mut self, handoffs: Vec<Handoff>) {
        let me = self.holder();
        self.until = None;
        self.publish();
        // The driver returns its leases as it sees the hold end; a write already sent is refused by the
        // token its successor's first write leaves.
        tokio::task::yield_now().await;
        let mut others = self.live(Instant::now());
        others.remove(&me);
        let handoffs: BTreeMap<u16, Handoff> = handoffs.into_iter().map(|h| (h.slot, h)).collect();
        let mut current = self.ring().map(|(r, v)| (r.clone(), v.to_owned()));
        tracing::debug!(ring = %self.names.ring, handoffs = handoffs.len(), owned = current.as_ref().map(|(r, _)| r.owned_by(&me).len()), others = others.len(), holding = %me.holding, "sharded queue: leaving");
        for _ in 0..5 {
            let Some((before, version)) = current.take() else { break };
            let mut after = before.clone();
            if !after.leave(&me, &others) {
                break;
            }
            let carried: Vec<Handoff> = before
                .owned_by(&me)
                .into_keys()
                .filter_map(|slot| {
                    let h = handoffs.get(&slot)?;
                    let next = after.slots.get(usize::from(slot))?;
                    // A slot left to nobody (no other member seen live) goes in the next epoch to whoever
                    // the coordinator gives it to: the hand-off waits for it there (the coordinator keeps
                    // it while the slot has no owner).
                    let epoch = if next.owner.is_some() { next.epoch } else { next.epoch + 1 };
                    Some(Handoff { epoch, ..h.clone() })
                })
                .collect();
            if let Err(error) = self.write_handoffs(&carried).await {
                tracing::warn!(ring = %self.names.ring, %error, "sharded queue: leaving without handing on the slots' keys; their next owners hand each key out once");
            }
            match self.write_ring(&after, Some(version)).await {
                Ok(()) => {
                    let unowned = after.unowned();
                    tracing::info!(ring = %self.names.ring, carried = carried.len(), unowned, "sharded queue: left; this member's slots went to the others (or, unowned, wait for the next member)");
                    break;
                }
                Err(error) if error.code() == Some(409) => current = self.read_ring().await,
                Err(error) => {
                    tracing::warn!(ring = %self.names.ring, %error, "sharded queue: could not give this member's slots on as it left; they go once its hold has surely ended");
                    break;
                }
            }
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions { resource_version: self.lease_version.clone(), uid: None }),
            ..DeleteParams::default()
        };
        let name = self.names.member(&self.identity);
        if let Ok(Err(error)) = tokio::time::timeout(CALL_TIMEOUT, self.api.delete(&name, &params)).await {
            tracing::info!(ring = %self.names.ring, %error, "sharded queue: shard Lease not deleted; it lapses");
        }
    }

    /// Tells the driver what it may grant under, and status what the ring looks like.
    /// A slot and what its last owner handed on with it go out together: a driver that saw the slot
    /// without it would hand each of its keys out at once, as a new queue's.
    fn publish(&mut self) {
        let now = Instant::now();
        let until = self.until.filter(|u| *u > now);
        let slots = match (until, self.ring()) {
            (Some(_), Some((ring, _))) => ring.owned_by(&self.holder()),
            _ => BTreeMap::new(),
        };
        // What the last owners of owned slots handed on, kept while the slot is owned in that epoch (a
        // hand-off is for one tenure only).
        self.carried.retain(|slot, h| slots.get(slot).is_some_and(|(epoch, _)| *epoch == h.epoch));
        let mut found = Vec::new();
        for seen in self.mirror.values().values() {
            let Seen::Handoff(batch, _) = seen else { continue };
            for h in batch.iter() {
                if slots.get(&h.slot).is_some_and(|(epoch, _)| *epoch == h.epoch) && !self.carried.contains_key(&h.slot)
                {
                    found.push(Arc::new(h.clone()));
                }
            }
        }
        self.carried.extend(found.into_iter().map(|h| (h.slot, h)));
        let ring = self.ring().map(|(r, _)| r);
        let handoffs = self
            .carried
            .iter()
            .filter(|(slot, h)| slots.get(slot).is_some_and(|(epoch, _)| *epoch == h.epoch))
            .map(|(slot, h)| (*slot, h.clone()))
            .collect();
        let ownership = Ownership { until, holding: self.holding.clone(), slots, handoffs };
        self.ownership.send_if_modified(|o| {
            let changed = *o != ownership;
            *o = ownership.clone();
            changed
        });
        let live = self.live(now);
        let mut report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        report.owned = ownership.slots.len();
        if let Some(ring) = ring {
            report.members = live
                .iter()
                .map(|h| (h.identity.clone(), ring.slots.iter().filter(|s| s.owner.as_ref() == Some(h)).count()))
                .collect();
            report.unowned = ring.unowned();
            report.moving = ring.slots.iter().filter(|s| s.next.is_some()).count();
            report.epoch = ring.slots.iter().map(|s| s.epoch).max().unwrap_or(0);
        }
    }
}

/// The labels on every Lease of a ring: managed by consistd, and grouped (so neither the fencing policy's
/// parameters nor the elections' Lease watch take them for election Leases).
fn ring_labels(names: &RingNames) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MEMBER_OF_LABEL.to_owned(), names.label.clone()),
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_readable_when_they_fit_and_claims_name_the_slot() {
        let key = Key { namespace: "ns".into(), name: "web".into() };
        let names = RingNames::new(&key, "q");
        assert_eq!(names.ring, "web.ring.q");
        assert_eq!(names.member("pod-0"), "web.ring.q.pod-0");
        assert!(names.member("Pod_0").starts_with("consistd-shard-"));
        assert_eq!(names.claim(17, 9).to_string(), "ns/web.ring.q.slot-17/9");
        let long = RingNames::new(&Key { namespace: "ns".into(), name: "e".repeat(240) }, "q");
        assert!(long.ring.starts_with("consistd-ring-") && names::is_dns_subdomain(&long.ring));
    }

    #[test]
    fn a_spec_that_differs_is_named_by_its_first_differing_field() {
        let ours = BTreeMap::from([
            ("spec.primary.resource".to_owned(), "configmaps".to_owned()),
            ("spec.primary.label_selector".to_owned(), "app=a".to_owned()),
        ]);
        let same = serde_json::to_string(&ours).expect("encodes");
        assert_eq!(differs(&ours, &same), None);
        let mut other = ours.clone();
        other.insert("spec.primary.label_selector".into(), "app=b".into());
        let theirs = serde_json::to_string(&other).expect("encodes");
        assert_eq!(differs(&ours, &theirs), Some(("spec.primary.label_selector".into(), "\"app=b\"".into())));
    }

    #[test]
    fn ownership_counts_only_while_the_hold_lasts() {
        let now = Instant::now();
        let slot = 7;
        let mut ownership = Ownership {
            until: Some(now + Duration::from_secs(1)),
            slots: BTreeMap::from([(slot, (4, false))]),
            ..Ownership::default()
        };
        assert_eq!(ownership.of(slot, now), Some((slot, 4, false)));
        assert_eq!(ownership.of(slot, now + Duration::from_secs(1)), None, "lapsed");
        ownership.slots.clear();
        assert_eq!(ownership.of(slot, now), None, "not owned");
    }
}
