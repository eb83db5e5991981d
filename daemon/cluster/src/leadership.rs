//! Lease-based leader elections (coordination.k8s.io/v1) for the pod's apps: one runner per election in
//! this daemon, campaigning while any app holds a Campaign stream open, observing otherwise, publishing
//! LEADER / FOLLOWER / UNKNOWN with the holder and a fencing term to any number of subscribers through a
//! coalescing channel that never blocks the runner.

mod elector;
pub mod group;
pub mod member_lease;
pub mod membership;
pub mod rollcall;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, SystemTime},
};

use consistd_core::{claim::Claim, config::Timing, names, tasks::Tasks};
use consistd_observe::metrics::Metrics;
use tokio::{sync::watch, time::Instant};

pub use self::membership::Announce;
use self::{
    elector::Election,
    membership::{Membership, SeatGuard, Written},
};

/// An election: the Lease's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
}

impl Key {
    /// The claim of an action taken while leading this election in `term`.
    pub fn claim(&self, term: u64) -> Claim {
        Claim { namespace: self.namespace.clone(), lease: self.name.clone(), term }
    }
}

/// "namespace/name", as reports, metrics and messages name an election.
impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// This daemon's view of an election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This daemon holds the Lease and renewed it within the renew deadline.
    Leader,
    /// Another candidate holds a live Lease.
    Follower,
    /// The apiserver cannot be reached, or nobody holds the Lease.
    Unknown,
}

/// One observation of an election.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// Whether this daemon leads, follows, or cannot tell (apiserver unreachable, nobody holds the Lease).
    pub role: Role,
    /// The holder's identity; empty when nobody holds the Lease.
    pub holder: String,
    /// Fencing term: the Lease's leaseTransitions + 1, so it starts at 1 and grows on every change of
    /// holder; 0 only while no Lease has been read (UNKNOWN), never a term a guard may name.
    pub term: u64,
    /// The lease duration the holder advertises.
    pub lease_duration: Option<Duration>,
    /// When the holder acquired the Lease.
    pub acquired_at: Option<SystemTime>,
    /// When the holder last renewed it.
    pub renewed_at: Option<SystemTime>,
    /// When this daemon observed this state.
    pub observed_at: SystemTime,
    /// This daemon's identity in the election.
    pub identity: String,
    /// While this daemon leads: when it stops saying LEADER unless it renews first (the start of its last
    /// renewal plus the renew deadline, before the Lease can expire for others). None in other roles.
    pub until: Option<Instant>,
}

impl Observation {
    pub(crate) fn unknown(identity: &str) -> Self {
        Self {
            role: Role::Unknown,
            holder: String::new(),
            term: 0,
            lease_duration: None,
            acquired_at: None,
            renewed_at: None,
            observed_at: SystemTime::now(),
            identity: identity.to_owned(),
            until: None,
        }
    }

    /// Whether a subscriber must be told: role, holder or term changed, or a leader renewed (its `until`
    /// moved on, which an app that demotes itself at `until` must hear); other timestamps alone do not.
    fn differs(&self, other: &Observation) -> bool {
        self.role != other.role || self.holder != other.holder || self.term != other.term || self.until != other.until
    }
}

/// How an election's runner has fared with the apiserver: what readiness judges an election by.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Whether an app (or the config) campaigns in it, so its Lease must be renewed or watched for a
    /// takeover; an election only observed is judged by the apiserver's reachability alone.
    pub campaigning: bool,
    /// When a step (reading the Lease and, when campaigning, taking or renewing it) last succeeded, or
    /// when the runner started if none has.
    pub since: Instant,
    /// Whether any step succeeded (false: `since` is when the runner started).
    pub succeeded: bool,
    /// The Lease duration the steps are held to: the campaign's, else client-go's default.
    pub lease_duration: Duration,
    /// Why the last step failed, while steps fail.
    pub error: Option<String>,
}

/// Why an election request was refused.
#[derive(Debug, thiserror::Error)]
pub enum LeadershipError {
    /// A request field is wrong.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// The request field: `election`, `namespace` or `timing`.
        field: &'static str,
        /// Why its value is refused.
        message: String,
    },
    /// The election already runs here for another identity.
    #[error("election {election}: this daemon already campaigns as {running:?}, not {asked:?}")]
    IdentityConflict {
        /// The election, "namespace/name".
        election: String,
        /// The identity this daemon already runs the election with (campaigning or observing).
        running: String,
        /// The identity the refused Campaign asked for.
        asked: String,
    },
    /// This daemon is not in the election's group (it does not campaign there, or has no peer address).
    #[error(
        "election {election}: this daemon is not a member of its group; campaign in it first (with peer.listen or peer.advertise set)"
    )]
    NotMember {
        /// The election, "namespace/name".
        election: String,
    },
    /// A roll call meant another member than this daemon (a new pod on an old pod's address).
    #[error("election {election}: this daemon is member {identity:?}, not {asked:?}")]
    NotThisMember {
        /// The election, "namespace/name".
        election: String,
        /// This daemon's identity in the group.
        identity: String,
        /// The identity the roll call asked for.
        asked: String,
    },
    /// The apiserver refused or failed the write of the applied version on the member Lease.
    #[error("election {election}: record applied version {version} on the member Lease")]
    NotWritten {
        /// The election, "namespace/name".
        election: String,
        /// The applied version that was to be written on the member Lease.
        version: u64,
        /// The apiserver's answer, e.g. 403 naming the verb when RBAC grants no patch on leases.
        #[source]
        source: Arc<kube::Error>,
    },
    /// The member Lease's write got no answer in time.
    #[error("election {election}: could not record applied version {version} on the member Lease within {waited:?}")]
    NotRecorded {
        /// The election, "namespace/name".
        election: String,
        /// The applied version that was to be written on the member Lease.
        version: u64,
        /// How long it was tried.
        waited: Duration,
    },
}

/// Every election of this daemon.
pub struct Leadership {
    client: kube::Client,
    /// Followers watch their Lease through the hub, so a release is seen at once, not a retry later.
    hub: Arc<crate::watch::Hub>,
    identity: String,
    /// This daemon run's id on the Leases it holds ([`consistd_core::lease::HOLDER_RUN_ANNOTATION`]).
    run: String,
    namespace: String,
    elections: Mutex<HashMap<Key, Arc<Election>>>,
    /// The election runners and member Lease keepers: shutdown stops them and waits for them. A group,
    /// not a list of handles, because it forgets a runner once it retires (each kept JoinHandle would
    /// hold its finished task's memory).
    tasks: Tasks,
    /// Member Leases of the election groups this daemon campaigns in.
    membership: Arc<Membership>,
    /// Where each election's leader gauge lives.
    metrics: Metrics,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership").field("identity", &self.identity).finish_non_exhaustive()
    }
}

/// An app's candidacy; dropping it resigns (the runner releases the Lease when the last one goes) and
/// leaves the election group.
#[derive(Debug)]
pub struct Campaign {
    election: Arc<Election>,
    _member: Option<SeatGuard>,
}

impl Drop for Campaign {
    fn drop(&mut self) {
        self.election.leave_campaign();
    }
}

impl Leadership {
    /// Elections for this daemon's `identity`, with Leases in `namespace` unless a request names one.
    /// With `announce`, campaigning also makes this daemon a member of the election's group. Its tasks
    /// form a group inside `tasks`.
    pub fn new(
        client: kube::Client,
        hub: Arc<crate::watch::Hub>,
        identity: String,
        namespace: String,
        announce: Option<Announce>,
        metrics: Metrics,
        tasks: &Tasks,
    ) -> Arc<Self> {
        let tasks = tasks.child();
        Arc::new(Self {
            metrics,
            membership: Arc::new(Membership::new(
                client.clone(),
                hub.clone(),
                identity.clone(),
                announce,
                tasks.clone(),
            )),
            client,
            hub,
            identity,
            run: format!("{:032x}", rand::random::<u128>()),
            namespace,
            elections: Mutex::new(HashMap::new()),
            tasks,
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Arc<Election>>> {
        self.elections.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This daemon's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The election named by a request: validates the name and defaults the namespace.
    pub fn key(&self, name: &str, namespace: &str) -> Result<Key, LeadershipError> {
        if name.is_empty() {
            return Err(LeadershipError::InvalidArgument {
                field: "election",
                message: "must not be empty".to_owned(),
            });
        }
        if !names::is_dns_subdomain(name) {
            return Err(LeadershipError::InvalidArgument {
                field: "election",
                message: format!(
                    "{name:?} is not a valid Lease name (lowercase letters, digits, '-' and '.', at most 253)"
                ),
            });
        }
        if !namespace.is_empty() && !names::is_namespace_name(namespace) {
            return Err(LeadershipError::InvalidArgument {
                field: "namespace",
                message: format!("{namespace:?} is not a valid namespace name"),
            });
        }
        let namespace = if namespace.is_empty() { self.namespace.clone() } else { namespace.to_owned() };
        Ok(Key { namespace, name: name.to_owned() })
    }

    /// The runner of `key`, started (as an observer) if none runs, and a subscription to its state. Both
    /// are taken under the registry's lock: a runner that finds itself idle retires under that lock too,
    /// so it can never retire between a caller finding it and subscribing (which would leave the caller on
    /// an election nobody runs).
    fn subscribe(self: &Arc<Self>, key: &Key, identity: &str) -> (Arc<Election>, watch::Receiver<Observation>) {
        let mut elections = self.lock();
        if let Some(e) = elections.get(key) {
            return (e.clone(), e.subscribe());
        }
        let leader = self.metrics.leader_gauge(&key.to_string());
        let holder = (identity.to_owned(), self.run.clone());
        let election = Election::new(key.clone(), holder, leader, self.membership.clone());
        elections.insert(key.clone(), election.clone());
        let status = election.subscribe();
        self.tasks.spawn(elector::run(
            election.clone(),
            self.client.clone(),
            self.clone(),
            self.tasks.signal().clone(),
        ));
        (election, status)
    }

    /// Called by a runner with no campaigner and no subscriber: removes it unless one arrived meanwhile.
    fn retire(&self, election: &Arc<Election>) -> bool {
        let mut elections = self.lock();
        if election.idle() && elections.get(&election.key).is_some_and(|e| Arc::ptr_eq(e, election)) {
            elections.remove(&election.key);
            self.metrics.forget_election(&election.key.to_string());
            return true;
        }
        false
    }

    /// Streams `key`'s state: the current one first, then every change (coalesced).
    pub fn observe(self: &Arc<Self>, key: &Key) -> watch::Receiver<Observation> {
        self.subscribe(key, &self.identity).1
    }

    /// Campaigns for `key` as `identity` (empty: this daemon's) until the returned guard drops.
    pub fn campaign(
        self: &Arc<Self>,
        key: &Key,
        identity: &str,
        timing: Timing,
    ) -> Result<(Campaign, watch::Receiver<Observation>), LeadershipError> {
        timing.validate().map_err(|message| LeadershipError::InvalidArgument { field: "timing", message })?;
        let identity = if identity.is_empty() { self.identity.clone() } else { identity.to_owned() };
        // The subscription keeps the runner from retiring until the candidacy has joined.
        let (election, status) = self.subscribe(key, &identity);
        if election.identity != identity {
            return Err(LeadershipError::IdentityConflict {
                election: key.to_string(),
                running: election.identity.clone(),
                asked: identity,
            });
        }
        election.join_campaign(timing);
        let member = self.membership.join(key).map(|(seat, made)| {
            if let Some(stop) = made {
                self.tasks.spawn(rollcall::run(self.clone(), key.clone(), stop));
            }
            seat
        });
        Ok((Campaign { election, _member: member }, status))
    }

    /// The current state of `key`, waiting at most `wait` for a first observation when nothing here
    /// watched that election yet.
    pub async fn get(self: &Arc<Self>, key: &Key, wait: Duration) -> Observation {
        let (election, mut status) = self.subscribe(key, &self.identity);
        if !election.observed() {
            let _ = tokio::time::timeout(wait, status.changed()).await;
        }
        election.current()
    }

    /// Every election this daemon runs now, with its current state and how its runner fares, sorted by key.
    pub fn snapshot(&self) -> Vec<(Key, Observation, Progress)> {
        let mut out: Vec<(Key, Observation, Progress)> =
            self.lock().iter().map(|(k, e)| (k.clone(), e.current(), e.progress())).collect();
        out.sort_by(|a, b| (&a.0.namespace, &a.0.name).cmp(&(&b.0.namespace, &b.0.name)));
        out
    }

    /// Whether this daemon leads `key` in exactly `term` now, what a guarded write, send or publish needs:
    /// the claim it then carries. A refusal names the election, this daemon's view of it, and the guard's
    /// term.
    pub fn claim(&self, key: &Key, term: u64) -> Result<Claim, String> {
        let election = self.lock().get(key).cloned();
        let (namespace, name) = (&key.namespace, &key.name);
        let Some(election) = election else {
            return Err(format!(
                "this daemon takes no part in election {namespace}/{name}; the guard names term {term}"
            ));
        };
        let status = election.current();
        // A daemon that was stopped past its renew deadline may run this before its runner has noticed.
        let lapsed = status.until.is_none_or(|until| until <= Instant::now());
        let now = status.term;
        let why = match status.role {
            Role::Leader if lapsed => format!(
                "this daemon's leadership of election {namespace}/{name} in term {now} lapsed: not renewed within \
                 the renew deadline"
            ),
            Role::Leader if now == term => return Ok(key.claim(term)),
            Role::Leader => format!("this daemon leads election {namespace}/{name} in term {now}"),
            role => format!("this daemon is {role:?} in election {namespace}/{name} (term {now})"),
        };
        Err(format!("{why}; the guard names term {term}"))
    }

    /// Records on this daemon's member Lease of `key` that its app applied `version` of the channel (a
    /// lower version than one reported before changes nothing); returns once the Lease holds it, or with
    /// the apiserver's answer to the first write carrying it that fails.
    pub async fn report_applied(&self, key: &Key, version: u64, wait: Duration) -> Result<(), LeadershipError> {
        let election = key.to_string();
        let (mut written, before) = self
            .membership
            .report_applied(key, version, true)
            .ok_or_else(|| LeadershipError::NotMember { election: election.clone() })?;
        let refused =
            |w: &Written| w.attempts > before && w.failed.as_ref().is_some_and(|(tried, _)| *tried >= version);
        match tokio::time::timeout(wait, written.wait_for(|w| w.recorded >= version || refused(w))).await {
            Ok(Ok(w)) => match &w.failed {
                Some((_, source)) if w.recorded < version => {
                    Err(LeadershipError::NotWritten { election, version, source: source.clone() })
                }
                _ => Ok(()),
            },
            Ok(Err(_)) => Err(LeadershipError::NotMember { election }),
            Err(_) => Err(LeadershipError::NotRecorded { election, version, waited: wait }),
        }
    }

    /// Notes that this member's app applied `version` of `key`'s channel, for its member Lease's next
    /// renewal: for a version whose ACK is on its way to the channel's leader, which records it for the
    /// whole group (see [`Self::record_applied_by`]).
    pub fn note_applied(&self, key: &Key, version: u64) -> Result<(), LeadershipError> {
        self.membership
            .report_applied(key, version, false)
            .map(drop)
            .ok_or_else(|| LeadershipError::NotMember { election: key.to_string() })
    }

    /// As `key`'s channel leader, writes `record` (what every member applied, as their ACKs told it) on
    /// this daemon's member Lease, where every replica's barrier reads it (nothing when not a member).
    pub fn record_applied_by(&self, key: &Key, record: consistd_core::lease::AppliedBy) {
        self.membership.record_applied_by(key, record);
    }

    /// The record of what every member applied this daemon last wrote as `key`'s channel leader.
    pub fn applied_by(&self, key: &Key) -> consistd_core::lease::AppliedBy {
        self.membership.applied_by(key)
    }

    /// Answers `key`'s leader's roll call (see [`rollcall`]): this daemon's incarnation in the group, when
    /// it is member `identity` of it. `recorded` is what the leader's written records hold for
    /// `incarnation`: how long ago their contact was made, and the applied version.
    pub fn reached(
        &self,
        key: &Key,
        identity: &str,
        incarnation: &str,
        recorded: (Option<Duration>, u64),
    ) -> Result<String, LeadershipError> {
        self.membership.reached(key, identity, incarnation, recorded)
    }

    /// Whether campaigning makes this daemon a member of election groups (it has a peer address).
    pub fn announces(&self) -> bool {
        self.membership.announces()
    }

    /// Whether this daemon is in `key`'s election group now.
    pub fn is_member(&self, key: &Key) -> bool {
        self.membership.holds(key)
    }

    /// The newest version of `key`'s channel this daemon's app reported applied (0: none, or not a member).
    pub fn applied(&self, key: &Key) -> u64 {
        self.membership.applied(key)
    }

    /// Resigns every election (releasing held Leases), leaves every group (deleting the member Leases),
    /// and waits for the runners and keepers doing so, at most `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        self.tasks.stop(grace).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_role_holder_and_term_changes_are_news() {
        let a = Observation::unknown("me");
        let mut b = a.clone();
        b.observed_at += Duration::from_secs(5);
        assert!(!a.differs(&b));
        b.term = 1;
        assert!(a.differs(&b));
        let mut renewed = b.clone();
        renewed.until = Some(Instant::now());
        assert!(b.differs(&renewed), "a leader's renewal is news");
    }
}
