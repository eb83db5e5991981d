//! One election's runner, following client-go's leader election: read the Lease every retry period;
//! take it when it is free or expired (judged on the local monotonic clock since its record last
//! changed), renew it while holding it, every write with a resourceVersion precondition so a race gives
//! a conflict, never two holders. A leader that cannot renew for the renew deadline stops reporting
//! LEADER, before the lease can expire for others. Resigning releases the Lease at once.

use std::{
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use consistd_core::{
    config::Timing,
    lease::{MANAGED_BY, MANAGED_BY_LABEL},
};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use prometheus_client::metrics::gauge::Gauge;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::{Key, Leadership, Observation, Progress, Role};
use crate::watch::{Query, Subscription};

/// An election in this daemon: its published status and its campaigners.
#[derive(Debug)]
pub(super) struct Election {
    pub(super) key: Key,
    pub(super) identity: String,
    status: watch::Sender<Observation>,
    /// Campaign streams open, and the timing of the latest.
    campaign: Mutex<(usize, Timing)>,
    /// Woken when campaigners come or go.
    wake: Notify,
    observed: AtomicBool,
    /// How the runner's steps have gone, for readiness.
    progress: Mutex<Progress>,
    /// `consistd_leader_election_master_status` of this election: 1 while this daemon leads.
    leader: Gauge,
}

impl Election {
    pub(super) fn new(key: Key, identity: String, leader: Gauge) -> Arc<Self> {
        let status = watch::channel(Observation::unknown(&identity)).0;
        Arc::new(Self {
            key,
            identity,
            status,
            leader,
            campaign: Mutex::new((0, Timing::default())),
            wake: Notify::new(),
            observed: AtomicBool::new(false),
            progress: Mutex::new(Progress {
                campaigning: false,
                since: Instant::now(),
                succeeded: false,
                lease_duration: Timing::default().lease_duration,
                error: None,
            }),
        })
    }

    pub(super) fn progress(&self) -> Progress {
        let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let campaign = self.campaigning();
        progress.campaigning = campaign.is_some();
        progress.lease_duration = campaign.unwrap_or_default().lease_duration;
        progress
    }

    /// Records a step's outcome: a success moves `since` on, a failure keeps it and says why.
    fn record_step(&self, outcome: Result<(), String>) {
        let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(()) => {
                progress.since = Instant::now();
                progress.succeeded = true;
                progress.error = None;
            }
            Err(why) => progress.error = Some(why),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (usize, Timing)> {
        self.campaign.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Observation> {
        self.status.subscribe()
    }

    pub(super) fn current(&self) -> Observation {
        self.status.borrow().clone()
    }

    pub(super) fn observed(&self) -> bool {
        self.observed.load(Ordering::Acquire)
    }

    pub(super) fn join_campaign(&self, timing: Timing) {
        {
            let mut c = self.lock();
            c.0 += 1;
            c.1 = timing;
        }
        self.wake.notify_one();
    }

    pub(super) fn leave_campaign(&self) {
        {
            let mut c = self.lock();
            c.0 = c.0.saturating_sub(1);
        }
        self.wake.notify_one();
    }

    fn campaigning(&self) -> Option<Timing> {
        let c = self.lock();
        (c.0 > 0).then_some(c.1)
    }

    /// No campaigner and no subscriber: the runner may stop.
    pub(super) fn idle(&self) -> bool {
        self.lock().0 == 0 && self.status.receiver_count() == 0
    }

    /// Publishes a state: subscribers are woken only when role, holder or term changed (and for the
    /// first observation); the value is always current before anyone is woken.
    fn publish(&self, status: Observation) {
        self.leader.set(i64::from(status.role == Role::Leader));
        if !self.observed.swap(true, Ordering::AcqRel) {
            self.status.send_replace(status);
            return;
        }
        self.status.send_if_modified(|current| {
            let news = current.differs(&status);
            *current = status;
            news
        });
    }
}

/// The Lease record as last read, and when (monotonic) it was first seen in this form.
#[derive(Debug, Clone)]
struct Observed {
    resource_version: String,
    holder: String,
    transitions: u64,
    duration: Option<Duration>,
    acquired_at: Option<SystemTime>,
    renewed_at: Option<SystemTime>,
    since: Instant,
}

impl Observed {
    fn from_lease(lease: &Lease, previous: Option<&Observed>) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        let resource_version = lease.metadata.resource_version.clone().unwrap_or_default();
        let since = match previous {
            Some(p) if p.resource_version == resource_version => p.since,
            _ => Instant::now(),
        };
        Self {
            resource_version,
            holder: spec.holder_identity.unwrap_or_default(),
            transitions: spec.lease_transitions.and_then(|t| u64::try_from(t).ok()).unwrap_or(0),
            // A missing or non-positive duration is malformed: treated as already expired.
            duration: spec
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s.unsigned_abs().into())),
            acquired_at: spec.acquire_time.map(|t| t.0.into()),
            renewed_at: spec.renew_time.map(|t| t.0.into()),
            since,
        }
    }

    /// The fencing term of this holding: the Lease's leaseTransitions + 1, so the first holder of a new
    /// Lease is in term 1 and 0 never names a term (it is what an unset proto3 field reads as).
    fn term(&self) -> u64 {
        self.transitions.saturating_add(1)
    }

    fn expired(&self) -> bool {
        match self.duration {
            _ if self.holder.is_empty() => true,
            Some(d) => self.since + d <= Instant::now(),
            None => true,
        }
    }

    fn status(&self, me: &str, leader: bool) -> Observation {
        let role = if leader {
            Role::Leader
        } else if self.expired() {
            Role::Unknown
        } else {
            Role::Follower
        };
        Observation {
            role,
            holder: if self.expired() && !leader { String::new() } else { self.holder.clone() },
            term: self.term(),
            lease_duration: self.duration,
            acquired_at: self.acquired_at,
            renewed_at: self.renewed_at,
            observed_at: SystemTime::now(),
            identity: me.to_owned(),
            until: None,
        }
    }
}

/// Whether this daemon holds the Lease after one [`step`] (a read and, when campaigning, a write).
enum Step {
    /// This daemon holds the Lease, renewed just now.
    Leader,
    /// This daemon does not hold it: another holder's Lease is live, a write lost a race (409), or it
    /// is not campaigning.
    NotLeader,
}

/// Runs `election` until it is idle or the daemon stops; releases the Lease if it holds it then.
pub(super) async fn run(election: Arc<Election>, client: Client, registry: Arc<Leadership>, stop: CancellationToken) {
    let api: Api<Lease> = Api::namespaced(client, &election.key.namespace);
    let query = Query {
        resource: "coordination.k8s.io/v1/leases".to_owned(),
        namespace: election.key.namespace.clone(),
        field_selector: format!("metadata.name={}", election.key.name),
        ..Query::default()
    };
    let mut lease_changes = match registry.hub.subscribe(query).await {
        Ok(sub) => Some(sub),
        Err(error) => {
            tracing::warn!(error = %consistd_core::error::chain(&error), election = %election.key.name, "cannot watch the Lease; noticing changes at the retry period only");
            None
        }
    };
    let mut observed: Option<Observed> = None;
    // Some(last successful renewal) while this daemon leads.
    let mut renewed: Option<Instant> = None;
    loop {
        let campaign = election.campaigning();
        let timing = campaign.unwrap_or_default();
        if campaign.is_none() {
            if renewed.take().is_some() {
                release(&api, &election, &mut observed).await;
            }
            if election.idle() && registry.retire(&election) {
                return;
            }
        }

        // Every call is bounded so the renew deadline is kept even when the apiserver hangs.
        let budget = until_next_attempt(renewed, timing);
        // A renewal counts from when it was sent: the Lease cannot have been renewed earlier than that.
        let began = Instant::now();
        let outcome = tokio::time::timeout(budget, step(&api, &election, campaign, &mut observed)).await;
        election.record_step(match &outcome {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(consistd_core::error::chain(error)),
            Err(_) => Err(format!("no answer within {budget:?}")),
        });
        match outcome {
            Ok(Ok(Step::Leader)) => {
                renewed = Some(began);
                if let Some(o) = &observed {
                    let mut status = o.status(&election.identity, true);
                    status.until = Some(began + timing.renew_deadline);
                    election.publish(status);
                }
            }
            Ok(Ok(Step::NotLeader)) => {
                if renewed.take().is_some() {
                    tracing::warn!(election = %election.key.name, "lost leadership: the Lease was taken");
                }
                let status = observed
                    .as_ref()
                    .map_or_else(|| Observation::unknown(&election.identity), |o| o.status(&election.identity, false));
                election.publish(status);
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, election = %election.key.name, "election step failed; retrying");
                if renewed.is_none() {
                    election.publish(Observation::unknown(&election.identity));
                }
            }
            Err(_) => {
                tracing::warn!(election = %election.key.name, budget = ?budget, "election step timed out; retrying");
                if renewed.is_none() {
                    election.publish(Observation::unknown(&election.identity));
                }
            }
        }

        let pause = until_next_attempt(renewed, timing);
        tokio::select! {
            () = stop.cancelled() => break,
            () = election.wake.notified() => {}
            () = tokio::time::sleep(pause) => {}
            // Not leading: any change of the Lease (a release, a new holder) is worth a look now. A leader
            // ignores them: they are its own renewals.
            changed = next_change(&mut lease_changes), if renewed.is_none() => {
                if !changed {
                    lease_changes = None;
                }
            }
        }
        if let Some(at) = renewed
            && at.elapsed() >= timing.renew_deadline
        {
            // Could not renew in time: stop saying LEADER before the lease can expire for others.
            tracing::warn!(election = %election.key.name, term = observed.as_ref().map_or(0, Observed::term), "renew deadline passed; no longer leader");
            renewed = None;
            election.publish(Observation::unknown(&election.identity));
        }
    }
    if renewed.is_some() {
        release(&api, &election, &mut observed).await;
    }
    election.publish(Observation::unknown(&election.identity));
}

/// A retry period, or less for a leader: what is left until its renew deadline.
fn until_next_attempt(renewed: Option<Instant>, timing: Timing) -> Duration {
    match renewed {
        Some(at) => (at + timing.renew_deadline).saturating_duration_since(Instant::now()).min(timing.retry_period),
        None => timing.retry_period,
    }
}

/// Reads the Lease and, when campaigning, takes or renews it.
async fn step(
    api: &Api<Lease>,
    election: &Election,
    campaign: Option<Timing>,
    observed: &mut Option<Observed>,
) -> Result<Step, kube::Error> {
    let name = &election.key.name;
    let Some(lease) = api.get_opt(name).await? else {
        *observed = None;
        let Some(timing) = campaign else { return Ok(Step::NotLeader) };
        let now = MicroTime(jiff::Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(election.identity.clone()),
                lease_duration_seconds: Some(seconds(timing.lease_duration)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                let created = Observed::from_lease(&created, None);
                tracing::info!(election = %name, term = created.term(), "became leader (created the Lease)");
                *observed = Some(created);
                Ok(Step::Leader)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Step::NotLeader),
            Err(e) => Err(e),
        };
    };
    let current = Observed::from_lease(&lease, observed.as_ref());
    *observed = Some(current.clone());
    let Some(timing) = campaign else { return Ok(Step::NotLeader) };
    let ours = current.holder == election.identity;
    if !ours && !current.expired() {
        return Ok(Step::NotLeader);
    }
    let now = MicroTime(jiff::Timestamp::now());
    let mut spec = lease.spec.clone().unwrap_or_default();
    if !ours {
        spec.lease_transitions = Some(i32::try_from(current.transitions + 1).unwrap_or(i32::MAX));
        spec.acquire_time = Some(now.clone());
    }
    spec.holder_identity = Some(election.identity.clone());
    spec.lease_duration_seconds = Some(seconds(timing.lease_duration));
    spec.renew_time = Some(now);
    // The read's resourceVersion stays in metadata: the apiserver refuses the write if anyone wrote since.
    // A Lease written before consistd labelled its Leases gets the label here.
    let mut metadata = lease.metadata;
    metadata.labels.get_or_insert_default().entry(MANAGED_BY_LABEL.to_owned()).or_insert_with(|| MANAGED_BY.to_owned());
    let updated = Lease { metadata, spec: Some(spec) };
    match api.replace(name, &PostParams::default(), &updated).await {
        Ok(written) => {
            let next = Observed::from_lease(&written, None);
            if !ours {
                tracing::info!(election = %name, term = next.term(), previous = %current.holder, "became leader");
            }
            *observed = Some(next);
            Ok(Step::Leader)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Step::NotLeader),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up so a follower takes over within one retry period (client-go's release: no
/// holder, a 1-second duration). A conflict means someone else wrote it already: nothing to release.
async fn release(api: &Api<Lease>, election: &Election, observed: &mut Option<Observed>) {
    let name = &election.key.name;
    let lease = match api.get_opt(name).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%error, election = %name, "could not read the Lease to release it");
            return;
        }
    };
    let mut spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(election.identity.as_str()) {
        return;
    }
    let now = MicroTime(jiff::Timestamp::now());
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    let released = Lease { spec: Some(spec), ..lease };
    match tokio::time::timeout(Duration::from_secs(2), api.replace(name, &PostParams::default(), &released)).await {
        Ok(Ok(written)) => {
            *observed = Some(Observed::from_lease(&written, None));
            tracing::info!(election = %name, "released leadership");
        }
        Ok(Err(error)) => tracing::warn!(%error, election = %name, "could not release the Lease"),
        Err(_) => tracing::warn!(election = %name, "releasing the Lease timed out"),
    }
}

/// Waits for the next event of the Lease's watch: false when the watch ended; never, without a watch.
async fn next_change(changes: &mut Option<Subscription>) -> bool {
    match changes {
        Some(sub) => sub.next().await.is_some(),
        None => std::future::pending().await,
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}
