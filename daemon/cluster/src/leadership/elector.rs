//! One election's runner, after client-go's leader election: take the Lease when it is free or expired
//! (judged on the local monotonic clock since its record last changed), renew it every retry period
//! while holding it, every write with a resourceVersion precondition so a race gives a conflict, never
//! two holders. A leader that cannot renew for the renew deadline stops reporting LEADER, before the
//! lease can expire for others; resigning releases the Lease at once. Unlike client-go, a follower
//! judges the Lease from the namespace's Lease watch (shared through the hub by every election of the
//! pod) and reads it only when the watch has not shown its view current within the renew deadline; it
//! says UNKNOWN while it cannot show that. A handover on request: a Lease whose `spec.preferredHolder`
//! (coordinated leader election, Kubernetes 1.33+, kept only with its feature gate) or annotation
//! [`PREFERRED_HOLDER_ANNOTATION`] (`kubectl consistd handover`) names another candidate makes its holder
//! step down at once (its app is told first, then the Lease is released), and only the
//! preferred candidate takes it until a lease duration has passed (it may be gone); whoever takes the
//! Lease clears the request.

use std::{
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use consistd_core::{
    config::Timing,
    lease::{HOLDER_RUN_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, MEMBER_OF_LABEL, PREFERRED_HOLDER_ANNOTATION},
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

use super::{Key, Leadership, Observation, Progress, Role, membership::Membership};
use crate::watch::{
    Query, Subscription,
    object::Obj,
    shared::{Change, Item},
};

/// An election in this daemon: its published status and its campaigners.
#[derive(Debug)]
pub(super) struct Election {
    pub(super) key: Key,
    pub(super) identity: String,
    /// This daemon run's id: a holding is ours only when the Lease names our identity and this run.
    run: String,
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
    /// This daemon's member Leases: told when the holder or term changes (see `Membership::leader_changed`).
    membership: Arc<Membership>,
}

impl Election {
    /// The election of `key` for `holder`: this daemon's identity and run.
    pub(super) fn new(key: Key, holder: (String, String), leader: Gauge, membership: Arc<Membership>) -> Arc<Self> {
        let (identity, run) = holder;
        let status = watch::channel(Observation::unknown(&identity)).0;
        Arc::new(Self {
            key,
            identity,
            run,
            status,
            leader,
            membership,
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
        {
            let current = self.status.borrow();
            if current.holder != status.holder || current.term != status.term {
                self.membership.leader_changed(&self.key);
            }
        }
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

/// The Lease record as last seen, and when (monotonic) it was first seen in this form.
#[derive(Debug, Clone)]
struct Observed {
    resource_version: String,
    holder: String,
    /// The holder's run ([`HOLDER_RUN_ANNOTATION`]); empty on a Lease no consistd run holds.
    run: String,
    /// The candidate asked to hold the Lease next: `spec.preferredHolder`, else the annotation
    /// [`PREFERRED_HOLDER_ANNOTATION`] (for apiservers that drop the field); empty for none.
    preferred: String,
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
        let annotation = |name: &str| lease.metadata.annotations.as_ref().and_then(|a| a.get(name)).cloned();
        let run = annotation(HOLDER_RUN_ANNOTATION);
        let preferred =
            spec.preferred_holder.clone().filter(|p| !p.is_empty()).or_else(|| annotation(PREFERRED_HOLDER_ANNOTATION));
        Self {
            resource_version,
            holder: spec.holder_identity.unwrap_or_default(),
            run: run.unwrap_or_default(),
            preferred: preferred.unwrap_or_default(),
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

    /// Whether `election`'s own run holds the Lease: its identity and its run (another run of the same
    /// identity is another holder).
    fn held_by(&self, election: &Election) -> bool {
        self.holder == election.identity && self.run == election.run
    }

    /// Whether the Lease asks for another holder than `me`: its holder, when it is `me`, steps down.
    fn prefers_other_than(&self, me: &str) -> bool {
        !self.preferred.is_empty() && self.preferred != me
    }

    /// Until when a Lease free now is kept for the candidate it prefers, when that is not `me`: a `grace`
    /// (the candidate's lease duration) after it was first seen in this state, since the preferred
    /// candidate may be gone. None when `me` may take it as soon as it is free.
    fn kept_for_another(&self, me: &str, grace: Duration) -> Option<Instant> {
        self.prefers_other_than(me).then_some(self.since + grace)
    }

    /// The fencing term of this holding: the Lease's leaseTransitions + 1, so the first holder of a new
    /// Lease is in term 1 and 0 never names a term (it is what an unset proto3 field reads as).
    fn term(&self) -> u64 {
        self.transitions.saturating_add(1)
    }

    /// When the holding expires unless renewed; None when nobody holds it or it is malformed.
    fn expires_at(&self) -> Option<Instant> {
        if self.holder.is_empty() { None } else { self.duration.map(|d| self.since + d) }
    }

    fn expired(&self) -> bool {
        self.expires_at().is_none_or(|at| at <= Instant::now())
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

/// What a runner knows of its Lease: the newest state it saw (in a read, its own write's answer or the
/// namespace's Lease watch) and when that view was last shown to be current.
#[derive(Debug, Default)]
struct View {
    /// The Lease and what it says; None when it does not exist (or nothing was seen yet).
    lease: Option<(Lease, Observed)>,
    /// When the view was last shown current: a read or write was answered, or the watch delivered an
    /// event. A watch delivers events in order, so an event of any Lease it covers vouches for every
    /// change before it. None until one of those happened.
    current_at: Option<Instant>,
    /// The highest term this view has seen: a Lease deleted and created again starts above it, so a
    /// term is not reused while a write claiming it may still be on its way.
    highest_term: u64,
    /// When the last holding seen before the Lease was deleted expires: its holder may not know of the
    /// delete and still lead until then, so nobody creates the Lease again before.
    deleted_until: Option<Instant>,
}

impl View {
    /// Takes in the Lease as the apiserver showed it (None: it does not exist). A state older than the
    /// one held (a watch event queued before a write's answer was taken in) changes nothing.
    fn see(&mut self, lease: Option<Lease>) {
        let previous = self.lease.as_ref().map(|(_, o)| o);
        let older = match (&lease, previous) {
            (Some(l), Some(p)) => is_older(l.metadata.resource_version.as_deref(), &p.resource_version),
            _ => false,
        };
        if !older {
            if lease.is_none()
                && let Some(p) = previous
            {
                self.deleted_until = p.expires_at();
            }
            self.lease = lease.map(|l| {
                let observed = Observed::from_lease(&l, previous);
                (l, observed)
            });
            if let Some(o) = self.observed() {
                self.highest_term = self.highest_term.max(o.term());
            }
        }
        self.vouch();
    }

    /// Takes in a deletion the watch showed, unless the view holds a newer state (the Lease was created
    /// again since).
    fn gone(&mut self, resource_version: &str) {
        match self.observed() {
            Some(o) if is_older(Some(resource_version), &o.resource_version) => self.vouch(),
            _ => self.see(None),
        }
    }

    /// Records that the view was just shown current.
    fn vouch(&mut self) {
        self.current_at = Some(Instant::now());
    }

    fn observed(&self) -> Option<&Observed> {
        self.lease.as_ref().map(|(_, o)| o)
    }

    /// When the view stops counting as current unless news arrives: `freshness` after it was last
    /// shown current; None when it never was.
    fn stale_at(&self, freshness: Duration) -> Option<Instant> {
        self.current_at.map(|at| at + freshness)
    }

    fn is_current(&self, freshness: Duration) -> bool {
        self.stale_at(freshness).is_some_and(|at| Instant::now() < at)
    }

    /// Whether a candidate may take the Lease: it does not exist (and the holding seen before it was
    /// deleted expired), nobody holds it, or the holding expired.
    fn free(&self) -> bool {
        match self.observed() {
            Some(o) => o.expired(),
            None => self.deleted_until.is_none_or(|at| at <= Instant::now()),
        }
    }

    /// Whether `me` may take the Lease now: it is free, and not kept for another preferred candidate.
    fn may_take(&self, me: &str, grace: Duration) -> bool {
        self.free() && self.kept_until(me, grace).is_none_or(|at| at <= Instant::now())
    }

    /// Until when the Lease is kept for a candidate it prefers over `me` (see [`Observed::kept_for_another`]).
    fn kept_until(&self, me: &str, grace: Duration) -> Option<Instant> {
        self.observed().and_then(|o| o.kept_for_another(me, grace))
    }

    /// The state a follower reports: from the view while it is current, else UNKNOWN.
    fn status(&self, me: &str, freshness: Duration) -> Observation {
        match self.observed() {
            Some(o) if self.is_current(freshness) => o.status(me, false),
            _ => Observation::unknown(me),
        }
    }
}

/// Whether resourceVersion `new` is older than `held`. They are etcd revisions for one resource, compared
/// as numbers when both are numbers (as the watch hub does); otherwise `new` is taken as newer.
fn is_older(new: Option<&str>, held: &str) -> bool {
    match (new.and_then(|n| n.parse::<u64>().ok()), held.parse::<u64>().ok()) {
        (Some(new), Some(held)) => new < held,
        _ => false,
    }
}

/// The watch every election runner of a namespace shares through the hub: its Leases except member
/// Leases, which renew every few seconds per member and concern only the groups' readers.
fn lease_watch(namespace: &str) -> Query {
    Query {
        resource: "coordination.k8s.io/v1/leases".to_owned(),
        namespace: namespace.to_owned(),
        label_selector: format!("!{MEMBER_OF_LABEL}"),
        own: true,
        ..Query::default()
    }
}

/// The namespace's Lease watch, as one runner follows it.
#[derive(Debug)]
struct Watching {
    subscription: Subscription,
    follow: Follow,
}

/// How far the watch has shown the runner its Lease.
#[derive(Debug)]
struct Follow {
    /// While a (re)listing is under way: whether it held the Lease. When it completes without it, the
    /// Lease does not exist.
    listing: Option<bool>,
}

impl Default for Follow {
    /// A new subscription starts with a listing.
    fn default() -> Self {
        Self { listing: Some(false) }
    }
}

impl Follow {
    /// Takes one item of the watch into `view`; returns whether the view is now shown current.
    fn take(&mut self, item: Item, name: &str, view: &mut View) -> bool {
        let ours = |obj: &Obj| obj.name() == name;
        match item {
            Item::ResyncRequired => {
                self.listing = Some(false);
                false
            }
            Item::Snapshot(obj, _) => {
                if ours(&obj) {
                    self.listing = Some(true);
                    see_object(view, &obj);
                }
                false
            }
            Item::Synced(_) => self.listed(view),
            Item::Entry(entry) => match &entry.change {
                Change::Synced => self.listed(view),
                Change::Relisted => false,
                Change::Added(obj) | Change::Modified(obj) => {
                    if ours(obj) {
                        self.listing = self.listing.map(|_| true);
                        see_object(view, obj);
                    } else if self.listing.is_none() {
                        view.vouch();
                    }
                    self.listing.is_none()
                }
                Change::Deleted(obj) => {
                    if ours(obj) {
                        view.gone(obj.resource_version());
                    } else if self.listing.is_none() {
                        view.vouch();
                    }
                    self.listing.is_none()
                }
            },
        }
    }

    /// A listing completed: without the Lease in it, the Lease does not exist.
    fn listed(&mut self, view: &mut View) -> bool {
        match self.listing.take() {
            Some(false) => view.see(None),
            _ => view.vouch(),
        }
        true
    }
}

/// Takes a watched Lease into the view; one that cannot be read leaves the view as it was (it then goes
/// stale, and a read reports the error).
fn see_object(view: &mut View, obj: &Obj) {
    match serde_json::from_slice::<Lease>(obj.json()) {
        Ok(lease) => view.see(Some(lease)),
        Err(error) => tracing::warn!(%error, lease = %obj.name(), "unreadable Lease in the watch; reading it instead"),
    }
}

/// Whether this daemon holds the Lease after one [`step`].
enum Step {
    /// This daemon holds the Lease, renewed just now.
    Leader,
    /// This daemon does not hold it: another holder's Lease is live, a write lost a race (409), or it
    /// is not campaigning.
    NotLeader,
}

/// What a runner does next with the apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Nothing: the view is current and nothing is due.
    Wait,
    /// Read the Lease (the view is not current), then take it if it is free and this daemon campaigns.
    Read,
    /// Renew the Lease (leading) or take it (it is free): written from the view, read again on a conflict.
    Write,
}

/// How long a follower's view counts as current without news (the renew deadline: a live holder renews
/// well within it), and after how long without news it reads the Lease: with the namespace's Lease watch,
/// a retry period before the view would go stale (but never sooner than one and a half retry periods,
/// so a holder's renewals every retry period keep it from reading); without the watch, every retry
/// period, as client-go does.
fn freshness(timing: Timing, watching: bool) -> (Duration, Duration) {
    let read_after = if watching {
        timing
            .renew_deadline
            .saturating_sub(timing.retry_period)
            .max(timing.retry_period * 3 / 2)
            .min(timing.renew_deadline)
    } else {
        timing.retry_period
    };
    (timing.renew_deadline, read_after)
}

/// Decides what a runner does now: a leader renews every retry period; anyone else reads only when the
/// view is not current, and writes only to take a free Lease.
fn next_act(
    renewed: Option<Instant>,
    campaigning: Option<&str>,
    view: &View,
    timing: Timing,
    read_after: Duration,
) -> Act {
    match renewed {
        Some(at) if at.elapsed() >= timing.retry_period => Act::Write,
        Some(_) => Act::Wait,
        None if !view.is_current(read_after) => Act::Read,
        None if campaigning.is_some_and(|me| view.may_take(me, timing.lease_duration)) => Act::Write,
        None => Act::Wait,
    }
}

/// When a runner next has something to do unless news arrives: a leader's next renewal; a follower's
/// next read, the holding expiring (a candidate may take it, an observer stops saying FOLLOWER) or, for
/// candidate `me`, the end of the time a free Lease is kept for the candidate it prefers.
fn next_due(renewed: Option<Instant>, me: Option<&str>, view: &View, timing: Timing, read_after: Duration) -> Instant {
    match renewed {
        Some(at) => (at + timing.retry_period).min(at + timing.renew_deadline),
        None => {
            let kept = me.filter(|_| view.free()).and_then(|me| view.kept_until(me, timing.lease_duration));
            let expiry = view.observed().and_then(Observed::expires_at).or(view.deleted_until).or(kept);
            let expiry = expiry.filter(|at| *at > Instant::now());
            let stale = view.stale_at(read_after).unwrap_or_else(Instant::now);
            expiry.map_or(stale, |e| e.min(stale))
        }
    }
}

/// Runs `election` until it is idle or the daemon stops; releases the Lease if it holds it then.
pub(super) async fn run(election: Arc<Election>, client: Client, registry: Arc<Leadership>, stop: CancellationToken) {
    let api: Api<Lease> = Api::namespaced(client, &election.key.namespace);
    let mut watching = match registry.hub.subscribe(lease_watch(&election.key.namespace)).await {
        Ok(subscription) => Some(Watching { subscription, follow: Follow::default() }),
        Err(error) => {
            tracing::warn!(error = %consistd_core::error::chain(&error), election = %election.key.name, "cannot watch the namespace's Leases; reading the Lease every retry period");
            None
        }
    };
    let mut view = View::default();
    // Some(last successful renewal) while this daemon leads.
    let mut renewed: Option<Instant> = None;
    // After a failed step, no new one before this.
    let mut retry_at: Option<Instant> = None;
    loop {
        let campaign = election.campaigning();
        let timing = campaign.unwrap_or_default();
        if campaign.is_none() {
            if renewed.take().is_some() {
                release(&api, &election, &mut view).await;
            }
            if election.idle() && registry.retire(&election) {
                return;
            }
        }
        if renewed.is_some()
            && let Some(preferred) = view.observed().filter(|o| o.prefers_other_than(&election.identity))
        {
            // A handover on request: the app is told first, then the Lease is released for the candidate
            // the Lease prefers (who alone may take it for a lease duration).
            tracing::info!(election = %election.key.name, preferred = %preferred.preferred, term = preferred.term(), "stepping down: the Lease prefers another holder");
            renewed = None;
            election.publish(Observation::unknown(&election.identity));
            release(&api, &election, &mut view).await;
        }
        let me = campaign.map(|_| election.identity.as_str());
        let (freshness, read_after) = freshness(timing, watching.is_some());
        let act = if retry_at.is_some_and(|at| Instant::now() < at) {
            Act::Wait
        } else {
            next_act(renewed, me, &view, timing, read_after)
        };
        if act != Act::Wait {
            retry_at = None;
            // Every call is bounded so the renew deadline is kept even when the apiserver hangs.
            let budget = until_next_attempt(renewed, timing);
            // A renewal counts from when it was sent: the Lease cannot have been renewed earlier than that.
            let began = Instant::now();
            let outcome = tokio::time::timeout(
                budget,
                step(&api, &election, campaign, &mut view, act == Act::Read, watching.is_some(), renewed.is_some()),
            )
            .await;
            election.record_step(match &outcome {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(consistd_core::error::chain(error)),
                Err(_) => Err(format!("no answer within {budget:?}")),
            });
            match outcome {
                Ok(Ok(Step::Leader)) => {
                    renewed = Some(began);
                    if let Some(o) = view.observed() {
                        let mut status = o.status(&election.identity, true);
                        status.until = Some(began + timing.renew_deadline);
                        election.publish(status);
                    }
                }
                Ok(Ok(Step::NotLeader)) => {
                    if renewed.take().is_some() {
                        tracing::warn!(election = %election.key.name, "lost leadership: the Lease was taken");
                    }
                    if campaign.is_some() && view.free() {
                        // A lost race on a Lease that still looks free: the watch shows the winner; no
                        // new try before a retry period.
                        retry_at = Some(Instant::now() + timing.retry_period);
                    }
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, election = %election.key.name, "election step failed; retrying");
                    retry_at = Some(Instant::now() + timing.retry_period);
                }
                Err(_) => {
                    tracing::warn!(election = %election.key.name, budget = ?budget, "election step timed out; retrying");
                    retry_at = Some(Instant::now() + timing.retry_period);
                }
            }
        }
        if renewed.is_none() {
            // UNKNOWN unless the view is current: after a failed read it is not.
            election.publish(view.status(&election.identity, freshness));
        }

        let mut due = retry_at.unwrap_or_else(|| next_due(renewed, me, &view, timing, read_after));
        if renewed.is_none()
            && let Some(stale) = view.stale_at(freshness).filter(|at| *at > Instant::now())
        {
            // A follower whose read hangs or fails still says UNKNOWN on time.
            due = due.min(stale);
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = election.wake.notified() => {}
            () = tokio::time::sleep_until(due) => {}
            item = next_item(&mut watching) => match (item, watching.as_mut()) {
                (Some(item), Some(w)) => {
                    let judged_on = view.observed().map(|o| o.resource_version.clone());
                    if w.follow.take(item, &election.key.name, &mut view) && renewed.is_none() {
                        // A follower's view shown current by the watch is a step that succeeded.
                        election.record_step(Ok(()));
                    }
                    if view.observed().map(|o| &o.resource_version) != judged_on.as_ref() {
                        // A newer state of the Lease than the one a lost race or a failed step was judged
                        // on: decide again now. Waiting out the retry period cost a handover 2 s when the
                        // new leader released within it.
                        retry_at = None;
                    }
                }
                _ => {
                    tracing::warn!(election = %election.key.name, "the namespace's Lease watch ended; reading the Lease every retry period");
                    watching = None;
                }
            },
        }
        if let Some(at) = renewed
            && at.elapsed() >= timing.renew_deadline
        {
            // Could not renew in time: stop saying LEADER before the lease can expire for others.
            tracing::warn!(election = %election.key.name, term = view.observed().map_or(0, Observed::term), "renew deadline passed; no longer leader");
            renewed = None;
            election.publish(Observation::unknown(&election.identity));
        }
    }
    if renewed.is_some() {
        release(&api, &election, &mut view).await;
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

/// Reads the Lease when `read` and, when campaigning, takes or renews it as the view shows it. After a
/// conflict (someone wrote since the view) a leader (`leading`, or the view says it holds the Lease) reads
/// and decides once more; a candidate whose take lost a race does not, when it watches: the watch shows it
/// the winner (so a release followed by every candidate's take costs one read, not one per candidate).
async fn step(
    api: &Api<Lease>,
    election: &Election,
    campaign: Option<Timing>,
    view: &mut View,
    read: bool,
    watching: bool,
    leading: bool,
) -> Result<Step, kube::Error> {
    let name = &election.key.name;
    if read {
        view.see(api.get_opt(name).await?);
    }
    let Some(timing) = campaign else { return Ok(Step::NotLeader) };
    for _ in 0..2 {
        let renewing = view.observed().is_some_and(|o| o.held_by(election));
        match write(api, election, timing, view).await? {
            Some(step) => return Ok(step),
            None if watching && !renewing && !leading => return Ok(Step::NotLeader),
            None => view.see(api.get_opt(name).await?),
        }
    }
    Ok(Step::NotLeader)
}

/// Takes or renews the Lease as `view` shows it, with its resourceVersion as precondition (or creates it
/// when the view says it does not exist), so a write on a stale view fails rather than overwrite someone.
/// None: the write lost a race (409).
async fn write(
    api: &Api<Lease>,
    election: &Election,
    timing: Timing,
    view: &mut View,
) -> Result<Option<Step>, kube::Error> {
    let name = &election.key.name;
    let now = MicroTime(jiff::Timestamp::now());
    let Some((lease, current)) = &view.lease else {
        if !view.free() {
            return Ok(Some(Step::NotLeader));
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())].into()),
                annotations: Some([(HOLDER_RUN_ANNOTATION.to_owned(), election.run.clone())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(election.identity.clone()),
                lease_duration_seconds: Some(seconds(timing.lease_duration)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                // Above every term seen, so a Lease deleted and created again does not restart at term 1.
                lease_transitions: Some(i32::try_from(view.highest_term).unwrap_or(i32::MAX)),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                view.see(Some(created));
                tracing::info!(election = %name, term = view.observed().map_or(0, Observed::term), "became leader (created the Lease)");
                Ok(Some(Step::Leader))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(e),
        };
    };
    let ours = current.held_by(election);
    if !ours && !view.may_take(&election.identity, timing.lease_duration) {
        return Ok(Some(Step::NotLeader));
    }
    let previous = current.holder.clone();
    let mut spec = lease.spec.clone().unwrap_or_default();
    // A handover asked for is done when anyone takes the Lease (its candidate, or another once it did not
    // come within a lease duration), and when it names the holder.
    let handed_over = !ours || current.preferred == election.identity;
    if !ours {
        spec.lease_transitions = Some(i32::try_from(current.transitions + 1).unwrap_or(i32::MAX));
        spec.acquire_time = Some(now.clone());
    }
    if handed_over {
        spec.preferred_holder = None;
    }
    spec.holder_identity = Some(election.identity.clone());
    spec.lease_duration_seconds = Some(seconds(timing.lease_duration));
    spec.renew_time = Some(now);
    // The view's resourceVersion stays in metadata: the apiserver refuses the write if anyone wrote since.
    // A Lease written before consistd labelled its Leases gets the label here.
    let mut metadata = lease.metadata.clone();
    metadata.labels.get_or_insert_default().entry(MANAGED_BY_LABEL.to_owned()).or_insert_with(|| MANAGED_BY.to_owned());
    let annotations = metadata.annotations.get_or_insert_default();
    annotations.insert(HOLDER_RUN_ANNOTATION.to_owned(), election.run.clone());
    if handed_over {
        annotations.remove(PREFERRED_HOLDER_ANNOTATION);
    }
    let updated = Lease { metadata, spec: Some(spec) };
    match api.replace(name, &PostParams::default(), &updated).await {
        Ok(written) => {
            view.see(Some(written));
            if !ours {
                let term = view.observed().map_or(0, Observed::term);
                tracing::info!(election = %name, term, %previous, "became leader");
            }
            Ok(Some(Step::Leader))
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up so a follower takes over at once (client-go's release: no holder, a 1-second
/// duration), written from the view as client-go does; after a conflict it reads and tries once more. A
/// Lease someone else holds by then is not released.
async fn release(api: &Api<Lease>, election: &Election, view: &mut View) {
    let name = &election.key.name;
    for _ in 0..2 {
        let Some((lease, current)) = &view.lease else { return };
        if current.holder != election.identity {
            return;
        }
        let mut spec = lease.spec.clone().unwrap_or_default();
        let now = MicroTime(jiff::Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        let released = Lease { spec: Some(spec), metadata: lease.metadata.clone() };
        match bounded(api.replace(name, &PostParams::default(), &released)).await {
            Ok(written) => {
                view.see(Some(written));
                tracing::info!(election = %name, "released leadership");
                return;
            }
            Err(Failed::Conflict) => match bounded(api.get_opt(name)).await {
                Ok(lease) => view.see(lease),
                Err(failed) => {
                    tracing::warn!(error = %failed, election = %name, "could not read the Lease to release it");
                    return;
                }
            },
            Err(failed) => {
                tracing::warn!(error = %failed, election = %name, "could not release the Lease");
                return;
            }
        }
    }
}

/// How long each of [`release`]'s calls may take: shutdown waits for it.
const RELEASE_BOUND: Duration = Duration::from_secs(2);

/// Why one of [`release`]'s calls failed.
#[derive(Debug)]
enum Failed {
    /// Someone wrote the Lease since the view (409).
    Conflict,
    /// Any other error from the apiserver.
    Error(kube::Error),
    /// No answer within [`RELEASE_BOUND`].
    TimedOut,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Conflict => f.write_str("conflict: the Lease was written since it was seen"),
            Self::Error(error) => write!(f, "{error}"),
            Self::TimedOut => write!(f, "no answer within {RELEASE_BOUND:?}"),
        }
    }
}

/// One of [`release`]'s calls, bounded by [`RELEASE_BOUND`].
async fn bounded<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, Failed> {
    match tokio::time::timeout(RELEASE_BOUND, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => Err(Failed::Conflict),
        Ok(Err(error)) => Err(Failed::Error(error)),
        Err(_) => Err(Failed::TimedOut),
    }
}

/// The next item of the namespace's Lease watch: None when it ended; never, without a watch.
async fn next_item(watching: &mut Option<Watching>) -> Option<Item> {
    match watching {
        Some(w) => w.subscription.next().await,
        None => std::future::pending().await,
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::watch::shared::Entry;

    fn lease(rv: &str, holder: &str) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "e", "resourceVersion": rv },
            "spec": { "holderIdentity": holder, "leaseDurationSeconds": 15 },
        }))
        .expect("lease")
    }

    fn obj(name: &str, rv: &str, holder: &str) -> Arc<Obj> {
        let mut l = lease(rv, holder);
        l.metadata.name = Some(name.to_owned());
        Arc::new(Obj::new(&format!("uid-{name}"), "ns", name, rv, serde_json::to_vec(&l).expect("json")))
    }

    fn entry(change: Change) -> Item {
        Item::Entry(Arc::new(Entry { seq: 1, change, received: Instant::now(), listed: false, previous: None }))
    }

    fn holder(view: &View) -> Option<&str> {
        view.observed().map(|o| o.holder.as_str())
    }

    const FRESH: Duration = Duration::from_secs(10);

    #[test]
    fn a_state_older_than_the_view_changes_nothing_but_still_vouches() {
        let mut view = View::default();
        view.see(Some(lease("105", "me")));
        let since = view.observed().expect("seen").since;
        view.see(Some(lease("104", "other")));
        assert_eq!(holder(&view), Some("me"));
        view.see(Some(lease("105", "me")));
        assert_eq!(view.observed().expect("seen").since, since, "the same record keeps when it was first seen");
        view.see(Some(lease("106", "other")));
        assert_eq!(holder(&view), Some("other"));
        view.gone("105");
        assert_eq!(holder(&view), Some("other"), "a deletion older than the view changes nothing");
        view.gone("107");
        assert!(view.observed().is_none() && view.is_current(FRESH));
        assert!(!view.free(), "deleted while other's holding runs: nobody creates it before that expires");
        view.deleted_until = Some(Instant::now());
        assert!(view.free());
        assert!(is_older(Some("9"), "10") && !is_older(Some("10"), "9") && !is_older(Some("x"), "10"));
    }

    #[test]
    fn the_watch_shows_the_lease_and_vouches_with_any_event_once_listed() {
        let (mut view, mut follow) = (View::default(), Follow::default());
        assert!(!follow.take(Item::Snapshot(obj("other", "3", "x"), 3), "e", &mut view));
        assert!(view.current_at.is_none(), "a listing in progress shows nothing yet");
        assert!(follow.take(Item::Synced(3), "e", &mut view));
        assert!(view.observed().is_none() && view.is_current(FRESH), "listed without it: it does not exist");

        assert!(follow.take(entry(Change::Added(obj("e", "4", "leader"))), "e", &mut view));
        assert_eq!(holder(&view), Some("leader"));
        assert_eq!(view.status("me", FRESH).role, Role::Follower);
        view.current_at = Some(Instant::now() - FRESH);
        assert_eq!(view.status("me", FRESH).role, Role::Unknown, "a view not shown current is UNKNOWN");
        assert!(follow.take(entry(Change::Modified(obj("other", "5", "x"))), "e", &mut view));
        assert_eq!(view.status("me", FRESH).role, Role::Follower, "another Lease's event vouches for the view");

        // A resync: the listing replaces the view; without the Lease in it, the Lease is gone.
        assert!(!follow.take(Item::ResyncRequired, "e", &mut view));
        assert!(!follow.take(entry(Change::Added(obj("other", "6", "x"))), "e", &mut view));
        assert!(follow.take(entry(Change::Synced), "e", &mut view));
        assert!(view.observed().is_none());
        assert!(follow.take(entry(Change::Added(obj("e", "7", "leader"))), "e", &mut view));
        assert!(follow.take(entry(Change::Deleted(obj("e", "8", "leader"))), "e", &mut view));
        assert!(view.observed().is_none() && !view.free(), "the deleted Lease's holding has not expired");
    }

    #[test]
    fn a_lease_deleted_and_created_again_starts_above_every_term_seen() {
        let mut view = View::default();
        let mut held = lease("10", "old");
        held.spec.as_mut().expect("spec").lease_transitions = Some(6);
        view.see(Some(held));
        assert_eq!(view.highest_term, 7);
        view.gone("11");
        let until = view.deleted_until.expect("the deleted holding's expiry");
        assert!(until > Instant::now() + Duration::from_secs(14), "15 s from when it was seen");
        assert!(!view.free());
        assert_eq!(view.highest_term, 7, "a deletion forgets the Lease, not its term");
        view.see(Some(lease("12", "new")));
        assert_eq!(view.highest_term, 7, "a Lease created at transitions 0 does not lower it");
    }

    #[test]
    fn followers_read_only_when_the_view_is_stale_and_write_only_to_take_a_free_lease() {
        let timing = Timing::default();
        let mut view = View::default();
        assert_eq!(next_act(None, Some("me"), &view, timing, FRESH), Act::Read, "nothing seen yet");
        view.see(Some(lease("1", "other")));
        assert_eq!(next_act(None, Some("me"), &view, timing, FRESH), Act::Wait, "a live holder, shown current");
        assert_eq!(next_act(None, None, &view, timing, FRESH), Act::Wait);
        let expiry = next_due(None, Some("me"), &view, timing, FRESH);
        assert!(expiry <= Instant::now() + FRESH, "wakes when the view goes stale or the Lease expires");
        view.see(Some(lease("2", "")));
        assert_eq!(next_act(None, Some("me"), &view, timing, FRESH), Act::Write, "released: a candidate takes it");
        assert_eq!(next_act(None, None, &view, timing, FRESH), Act::Wait, "an observer does not");
        view.current_at = Some(Instant::now() - FRESH);
        assert_eq!(next_act(None, None, &view, timing, FRESH), Act::Read);

        let just = Instant::now();
        assert_eq!(
            next_act(Some(just), Some("me"), &view, timing, FRESH),
            Act::Wait,
            "a leader renews per retry period"
        );
        let before = just - timing.retry_period;
        assert_eq!(next_act(Some(before), Some("me"), &view, timing, FRESH), Act::Write);
        assert_eq!(next_due(Some(just), Some("me"), &view, timing, FRESH), just + timing.retry_period);
    }

    /// A released Lease that prefers another candidate is kept for it a lease duration (it may be gone), then
    /// any candidate may take it; the preferred one takes it at once. A Lease that prefers `me` is no reason
    /// for `me` to step down, one that prefers another is.
    #[test]
    fn a_free_lease_is_kept_a_lease_duration_for_the_candidate_it_prefers() {
        let timing = Timing::default();
        let preferring = |rv: &str, holder: &str, preferred: &str| {
            let mut l = lease(rv, holder);
            l.spec.as_mut().expect("spec").preferred_holder = Some(preferred.to_owned());
            l
        };
        let mut view = View::default();
        view.see(Some(preferring("1", "me", "you")));
        let held = view.observed().expect("seen");
        assert!(held.prefers_other_than("me") && !held.prefers_other_than("you"), "its holder steps down, not you");
        view.see(Some(preferring("2", "", "you")));
        assert_eq!(next_act(None, Some("you"), &view, timing, FRESH), Act::Write, "the preferred takes it at once");
        assert_eq!(next_act(None, Some("me"), &view, timing, FRESH), Act::Wait, "another waits");
        let kept = view.kept_until("me", timing.lease_duration).expect("kept for you");
        assert_eq!(next_due(None, Some("me"), &view, timing, FRESH), kept.min(view.stale_at(FRESH).expect("seen")));
        view.lease.as_mut().expect("seen").1.since -= timing.lease_duration;
        assert_eq!(next_act(None, Some("me"), &view, timing, FRESH), Act::Write, "you did not come: anyone may");
        view.see(Some(lease("3", "")));
        assert_eq!(next_act(None, Some("me"), &view, timing, FRESH), Act::Write, "no preference: anyone at once");

        // Where the apiserver drops spec.preferredHolder, the annotation asks the same; the field wins.
        let mut annotated = lease("4", "me");
        annotated.metadata.annotations = Some([(PREFERRED_HOLDER_ANNOTATION.to_owned(), "you".to_owned())].into());
        view.see(Some(annotated.clone()));
        assert!(view.observed().expect("seen").prefers_other_than("me"));
        annotated.metadata.resource_version = Some("5".into());
        annotated.spec.as_mut().expect("spec").preferred_holder = Some("me".into());
        view.see(Some(annotated));
        assert!(!view.observed().expect("seen").prefers_other_than("me"), "spec.preferredHolder first");
    }

    #[test]
    fn with_the_watch_a_follower_reads_a_retry_period_before_its_view_goes_stale() {
        let t = |renew, retry| Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
        };
        let s = Duration::from_secs;
        assert_eq!(freshness(Timing::default(), true), (s(10), s(8)));
        assert_eq!(freshness(Timing::default(), false), (s(10), s(2)), "without the watch: client-go's polling");
        assert_eq!(freshness(t(4, 1), true), (s(4), s(3)));
        assert_eq!(freshness(t(3, 2), true), (s(3), s(3)), "never before a holder's next renewal is due");
    }
}
