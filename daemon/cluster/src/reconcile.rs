//! The reconcile queue: work, not events. Apps name a queue (primary objects, related objects mapped to
//! primary keys) and are handed leases on keys, one at a time per key, each read from the cache when it
//! is granted and only once the watch has caught up with the pod's writes made under the key's earlier
//! leases. Streams that name the same queue share it; a queue lingers after its last stream like a watch.
//! A sharded queue spreads its keys over every pod of an election group that runs it (`ring`, `shards`).

mod authority;
mod driver;
pub mod durable;
pub mod filter;
mod finalizer;
mod gate;
pub mod keys;
pub mod limiter;
mod own;
pub mod queue;
pub mod ring;
pub mod shards;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use consistd_core::{config::Live, report::QueueReport, tasks::Tasks};
use consistd_observe::metrics::Metrics;
use tokio::sync::{mpsc, oneshot};

use self::{
    authority::Authority,
    driver::Driver,
    filter::ChangeFilter,
    keys::MapsBy,
    limiter::RetryPolicy,
    queue::Completion,
    ring::ShardBy,
    shards::{RingNames, ShardMember},
};
use crate::{
    fencing::Claim,
    leadership::{self, Leadership},
    objects::Objects,
    watch::{Hub, Query, ResourceError, object::Obj, resolve::ResourceId, view::ObjectView},
};

/// A lease not completed in this long goes back to the queue, unless the spec says otherwise.
pub const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_secs(600);

/// One watch of a queue: what it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectQuery {
    /// The resource, in any form the hub resolves.
    pub resource: String,
    /// Namespace; empty for all (or a cluster-scoped resource).
    pub namespace: String,
    /// Label selector, as given.
    pub label_selector: String,
    /// Field selector, as given.
    pub field_selector: String,
    /// What of each object the watch keeps.
    pub view: ObjectView,
    /// Which changes of its objects queue a pass; `None`: every change.
    pub changes: Option<ChangeFilter>,
}

impl ObjectQuery {
    fn to_query(&self) -> Query {
        Query {
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            cursor: None,
            own: false,
            view: self.view.clone(),
            shard: None,
        }
    }
}

/// A queue as an app asks for it; streams that share a queue must ask for the same.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSpec {
    /// The queue's name (a DNS label): metrics, status, and what streams share.
    pub name: String,
    /// The primary objects: one key each.
    pub primary: ObjectQuery,
    /// Watches whose objects name a primary key.
    pub related: Vec<Relation>,
    /// Retry delays.
    pub retry: RetryPolicy,
    /// How long a lease may be held before it goes back to the queue.
    pub lease_timeout: Duration,
    /// Hand out work only while this daemon leads this election; sharded, the group whose members share
    /// the keys.
    pub election: Option<leadership::Key>,
    /// Spread the keys over every member of the election's group that runs this queue, each key's slot
    /// owned by one member at a time (needs `election`).
    pub sharded: bool,
    /// What a sharded queue's keys are hashed by: by namespace, each member watches only its share.
    pub shard_by: ShardBy,
    /// A finalizer the queue adds to each primary before its first pass and removes when the object's
    /// finalize pass (it is being deleted) is done.
    pub finalizer: Option<String>,
}

/// A related query of a queue: watches whose objects name a primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The related objects.
    pub query: ObjectQuery,
    /// How each names its primary.
    pub maps_by: MapsBy,
    /// The priority of the passes its changes queue (the primary's changes: 0); higher first.
    pub priority: i32,
}

impl QueueSpec {
    /// The spec as every member of a sharded queue must run it, field by field (the request's field
    /// names), so one that differs is named.
    pub fn fields(&self) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        let mut query = |prefix: &str, q: &ObjectQuery| {
            out.insert(format!("{prefix}.resource"), q.resource.clone());
            out.insert(format!("{prefix}.namespace"), q.namespace.clone());
            out.insert(format!("{prefix}.label_selector"), q.label_selector.clone());
            out.insert(format!("{prefix}.field_selector"), q.field_selector.clone());
            out.insert(format!("{prefix}.view"), format!("{:?}", q.view));
            out.insert(format!("{prefix}.changes"), format!("{:?}", q.changes));
        };
        query("spec.primary", &self.primary);
        for (i, r) in self.related.iter().enumerate() {
            query(&format!("spec.related[{i}].query"), &r.query);
        }
        for (i, r) in self.related.iter().enumerate() {
            out.insert(format!("spec.related[{i}].maps_by"), format!("{:?}", r.maps_by));
            out.insert(format!("spec.related[{i}].priority"), r.priority.to_string());
        }
        out.insert("spec.retry".into(), format!("{:?}", self.retry));
        out.insert("spec.lease_timeout".into(), format!("{:?}", self.lease_timeout));
        out.insert("spec.election".into(), self.election.as_ref().map(ToString::to_string).unwrap_or_default());
        out.insert("spec.shard_by".into(), format!("{:?}", self.shard_by));
        out.insert("spec.finalizer".into(), self.finalizer.clone().unwrap_or_default());
        out
    }
}

/// What a write naming a lease carries.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseClaim {
    /// The claim: the lease's slot in its epoch (a sharded queue), its election's term (checked now), or
    /// none (a queue without election).
    pub claim: Option<Claim>,
    /// A sharded queue's item guard as the SDKs build it (the queue's election, the lease's epoch): the
    /// lease's claim stands for it.
    pub item_guard: Option<(leadership::Key, u64)>,
}

/// One lease handed to a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Work {
    /// "queue.stream.n": names the lease in its completion and in writes made for it.
    pub lease_id: String,
    /// The key's namespace and name.
    pub key: crate::watch::object::ObjKey,
    /// The primary as cached when the lease was granted (its last state when `deleted`).
    pub object: Option<Arc<Obj>>,
    /// Whether the primary was deleted.
    pub deleted: bool,
    /// Whether a write of the pod was not seen within `consistency.timeout`.
    pub timed_out: bool,
    /// 1, or n for the nth pass in a row after a RETRY.
    pub attempt: u32,
    /// The election term the lease was granted in; 0 without an election.
    pub term: u64,
    /// When the lease times out.
    pub expires_at: std::time::SystemTime,
    /// The previous pass's error, after a RETRY.
    pub last_error: Option<String>,
    /// A finalize pass: the primary is being deleted and carries the queue's finalizer.
    pub finalizing: bool,
}

/// Why a queue could not be opened or a completion was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A spec or completion field is wrong.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// The request field, e.g. `spec.max_leases`.
        field: String,
        /// Why.
        message: String,
    },
    /// One of the queue's watches was refused (an unknown resource, a bad selector, RBAC).
    #[error("{field}")]
    Query {
        /// The query's field, e.g. `spec.related[0].query`.
        field: String,
        /// The hub's refusal.
        #[source]
        source: ResourceError,
    },
    /// The request is valid but does not fit the queue's state: `field: why`.
    #[error("{field}: {message}")]
    FailedPrecondition {
        /// The field it is about.
        field: String,
        /// Why.
        message: String,
    },
    /// One of the queue's watches would pass the memory budget: refused at its first list, or ended as it
    /// grew. The queue ends for its streams.
    #[error("{field}")]
    Exhausted {
        /// The query's field, e.g. `spec.related[0].query`.
        field: String,
        /// How far past the budget.
        #[source]
        source: crate::watch::budget::Exhausted,
    },
    /// The daemon is shutting down.
    #[error("the reconcile queue {0} stopped: consistd is shutting down")]
    Stopped(String),
}

/// What a stream is handed: work, or why its queue ended.
pub type Handed = Result<Work, ReconcileError>;

/// A running queue, as the registry holds it.
#[derive(Debug)]
struct RunningQueue {
    spec: QueueSpec,
    commands: mpsc::UnboundedSender<DriverCall>,
    report: Arc<Mutex<QueueReport>>,
}

/// What a stream asks of its queue's driver.
#[derive(Debug)]
enum DriverCall {
    /// A stream joins, holding at most `capacity` leases, its items sent to `items`.
    Attach { stream: u64, capacity: usize, items: mpsc::UnboundedSender<Handed> },
    /// A stream left: its leases go back to the queue.
    Detach { stream: u64 },
    /// A stream completes a lease.
    Complete {
        stream: u64,
        lease_id: String,
        outcome: Completion,
        priority: i32,
        reply: oneshot::Sender<Result<(), ReconcileError>>,
    },
    /// A write made for a lease of this queue: the key's next lease waits for its watch.
    Wrote { lease_id: String, resource: ResourceId, obj: Arc<Obj> },
    /// Whether a lease is held now: the term it was granted in, and a sharded queue's claim for it.
    Held { lease_id: String, reply: oneshot::Sender<Option<(u64, Option<Claim>)>> },
}

/// Every reconcile queue of this daemon.
#[derive(Debug)]
pub struct Reconciler {
    hub: Arc<Hub>,
    /// Writes the queues' finalizers, as ObjectsService writes an app's.
    objects: Objects,
    leadership: Arc<Leadership>,
    metrics: Metrics,
    /// `consistency.timeout`: how long a grant waits for the watch to show the pod's writes.
    consistency_timeout: Live<Duration>,
    /// `membership.ttl`: how long a sharded queue's member holds its slots after a renewal.
    membership_ttl: Live<Duration>,
    /// How long a queue outlives its last stream, so a reconnecting app keeps its backoffs and passes.
    linger: Duration,
    queues: Mutex<HashMap<String, RunningQueue>>,
    /// The next stream's id, part of its lease ids.
    next_stream: AtomicU64,
    /// Runs the queues' drivers; each ends once its watches stop with the daemon.
    tasks: Tasks,
    /// Where queues keep their REQUEUE times and TERMINAL marks past a restart of the daemon.
    timers: Arc<dyn durable::Timers>,
}

/// One stream's membership of a queue; dropping it returns its leases to the queue.
#[derive(Debug)]
pub struct Worker {
    stream: u64,
    name: String,
    commands: mpsc::UnboundedSender<DriverCall>,
    /// Whether this apiserver guarantees comparable resourceVersions.
    pub comparable: bool,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.commands.send(DriverCall::Detach { stream: self.stream });
    }
}

impl Worker {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Ends a lease of this stream with `outcome`; the pass it queues goes at `priority`.
    pub async fn complete(&self, lease_id: String, outcome: Completion, priority: i32) -> Result<(), ReconcileError> {
        let (reply, answer) = oneshot::channel();
        let command = DriverCall::Complete { stream: self.stream, lease_id, outcome, priority, reply };
        self.commands.send(command).map_err(|_| ReconcileError::Stopped(self.name.clone()))?;
        answer.await.map_err(|_| ReconcileError::Stopped(self.name.clone()))?
    }
}

impl Reconciler {
    /// No queues yet; each queue's driver will run as a task of `tasks`, reading from `hub` and writing
    /// finalizers through `objects`. `timing` is `consistency.timeout` and `membership.ttl`.
    pub fn new(
        (hub, objects): (Arc<Hub>, Objects),
        leadership: Arc<Leadership>,
        metrics: Metrics,
        (consistency_timeout, membership_ttl): (Live<Duration>, Live<Duration>),
        linger: Duration,
        timers: Arc<dyn durable::Timers>,
        tasks: &Tasks,
    ) -> Arc<Self> {
        Arc::new(Self {
            timers,
            hub,
            objects,
            leadership,
            metrics,
            consistency_timeout,
            membership_ttl,
            linger,
            queues: Mutex::new(HashMap::new()),
            // Random per daemon run, so a lease id of an earlier run (a completion or a write an app sends
            // after its sidecar restarted) never names a lease of this one.
            next_stream: AtomicU64::new(u64::from(rand::random::<u32>()) << 16),
            tasks: tasks.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, RunningQueue>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the queue `spec` names, starting it unless it runs: the stream is handed items on the
    /// returned receiver, at most `capacity` leases at once.
    pub async fn open(
        self: &Arc<Self>,
        spec: QueueSpec,
        capacity: usize,
    ) -> Result<(Worker, mpsc::UnboundedReceiver<Handed>), ReconcileError> {
        let stream = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (items_tx, items) = mpsc::unbounded_channel();
        let comparable = self.hub.comparable_resource_versions().await;
        if let Some(commands) = self.attach(&spec, stream, capacity, &items_tx)? {
            return Ok((Worker { stream, name: spec.name, commands, comparable }, items));
        }
        // Not running: join its ring (sharded), start its watches (each refusal names its query), then
        // register it unless another stream started it meanwhile.
        let authority = match (&spec.election, spec.sharded) {
            (Some(election), true) => {
                let names = RingNames::new(election, &spec.name);
                let identity = self.leadership.identity().to_owned();
                let ttl = self.membership_ttl.clone();
                let ownerless = self.metrics.queue(&spec.name).shard_ownerless;
                let joined =
                    ShardMember::join(&self.hub, names, identity, ttl, spec.fields(), (ownerless, &self.tasks));
                Authority::sharded(joined.await?, spec.shard_by)
            }
            (None, true) => {
                return Err(ReconcileError::InvalidArgument {
                    field: "spec.sharded".into(),
                    message: "a sharded queue needs spec.election: the election group whose members share its keys"
                        .into(),
                });
            }
            (election, false) => Authority::follow(&self.leadership, election.as_ref()),
        };
        let driver = Driver::start(self.clone(), spec.clone(), comparable, authority).await?;
        let mut queues = self.lock();
        if let Some(running) = queues.get(&spec.name).filter(|r| !r.commands.is_closed()) {
            same_spec(&running.spec, &spec)?;
            let commands = running.commands.clone();
            drop(queues);
            commands
                .send(DriverCall::Attach { stream, capacity, items: items_tx })
                .map_err(|_| ReconcileError::Stopped(spec.name.clone()))?;
            return Ok((Worker { stream, name: spec.name, commands, comparable }, items));
        }
        let (commands, receiver) = mpsc::unbounded_channel();
        let _ = commands.send(DriverCall::Attach { stream, capacity, items: items_tx });
        let report = Arc::new(Mutex::new(QueueReport { name: spec.name.clone(), ..QueueReport::default() }));
        queues.insert(
            spec.name.clone(),
            RunningQueue { spec: spec.clone(), commands: commands.clone(), report: report.clone() },
        );
        drop(queues);
        tracing::info!(queue = %spec.name, resource = %spec.primary.resource, namespace = %spec.primary.namespace, related = spec.related.len(), "reconcile queue started");
        self.tasks.spawn(driver.run(receiver, report));
        Ok((Worker { stream, name: spec.name, commands, comparable }, items))
    }

    /// Attaches to a running queue of the same name, if one runs.
    fn attach(
        &self,
        spec: &QueueSpec,
        stream: u64,
        capacity: usize,
        items: &mpsc::UnboundedSender<Handed>,
    ) -> Result<Option<mpsc::UnboundedSender<DriverCall>>, ReconcileError> {
        let queues = self.lock();
        let Some(running) = queues.get(&spec.name).filter(|r| !r.commands.is_closed()) else { return Ok(None) };
        same_spec(&running.spec, spec)?;
        let attach = DriverCall::Attach { stream, capacity, items: items.clone() };
        Ok(running.commands.send(attach).is_ok().then(|| running.commands.clone()))
    }

    /// A write that names `lease_id` may go only while the lease is held; when its queue follows an
    /// election it is guarded by the lease's term whatever the app sent: the claim, checked as a guard is
    /// (this daemon leads that election in that term now); a sharded queue's by the lease's slot in its
    /// epoch (this member owns that slot in that epoch now). A lease that is not held (completed, timed
    /// out, gone back when its term or its slot's epoch ended here, or of an earlier run) is refused, naming
    /// `reconcile_lease`.
    pub async fn lease_claim(&self, lease_id: &str) -> Result<LeaseClaim, ReconcileError> {
        let not_held = |why: &str| ReconcileError::FailedPrecondition {
            field: "reconcile_lease".to_owned(),
            message: format!("lease {lease_id:?} is not held: {why}"),
        };
        let Some((name, _)) = driver::parse_lease_id(lease_id) else {
            return Err(ReconcileError::InvalidArgument {
                field: "reconcile_lease".to_owned(),
                message: format!("{lease_id:?} is not a lease id a WorkItem gave"),
            });
        };
        let (reply, held) = oneshot::channel();
        let election = {
            let queues = self.lock();
            let Some(running) = queues.get(name) else { return Err(not_held("its queue does not run")) };
            let command = DriverCall::Held { lease_id: lease_id.to_owned(), reply };
            if running.commands.send(command).is_err() {
                return Err(not_held("its queue stopped"));
            }
            running.spec.election.clone()
        };
        let why = "it was completed already, timed out, or went back to the queue when the election's term (or its slot's epoch) ended here";
        let (term, shard_claim) = held.await.ok().flatten().ok_or_else(|| not_held(why))?;
        if let Some(claim) = shard_claim {
            return Ok(LeaseClaim { claim: Some(claim), item_guard: election.map(|e| (e, term)) });
        }
        let Some(election) = election else { return Ok(LeaseClaim { claim: None, item_guard: None }) };
        // Held by the queue, and the term still this daemon's: a lease is returned only once the driver
        // has seen the term end.
        let claim = self.leadership.claim(&election, term);
        claim
            .map(|claim| LeaseClaim { claim: Some(claim), item_guard: None })
            .map_err(|message| ReconcileError::FailedPrecondition { field: "reconcile_lease".into(), message })
    }

    /// A write made for `lease_id` produced `obj` of `resource` (as the app named it): the key's next
    /// lease waits until the queue's watch of that resource has caught up with it. A lease of no running
    /// queue, or one no longer held, is ignored: the write itself went through.
    pub async fn wrote(&self, lease_id: &str, resource: &str, obj: &Arc<Obj>) {
        let Some((name, _)) = driver::parse_lease_id(lease_id) else { return };
        let Ok(resolved) = self.hub.resolve(resource).await else { return };
        if let Some(running) = self.lock().get(name) {
            let _ = running.commands.send(DriverCall::Wrote {
                lease_id: lease_id.to_owned(),
                resource: resolved.api,
                obj: obj.clone(),
            });
        }
    }

    /// Every running queue's state, sorted by name.
    pub fn snapshot(&self) -> Vec<QueueReport> {
        let mut out: Vec<QueueReport> =
            self.lock().values().map(|r| r.report.lock().unwrap_or_else(PoisonError::into_inner).clone()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Removes the queue `name`, called by its driver after it lingered with no stream attached. Under
    /// the registry's lock, so no stream attaches meanwhile: calls that arrived since are handed back
    /// (and the queue stays) when one of them attaches a stream; otherwise the channel is closed.
    fn retire(&self, name: &str, calls: &mut mpsc::UnboundedReceiver<DriverCall>) -> Result<(), Vec<DriverCall>> {
        let mut queues = self.lock();
        let mut pending = Vec::new();
        while let Ok(call) = calls.try_recv() {
            pending.push(call);
        }
        if pending.iter().any(|c| matches!(c, DriverCall::Attach { .. })) {
            return Err(pending);
        }
        queues.remove(name);
        calls.close();
        tracing::info!(queue = %name, "reconcile queue stopped: no stream attached");
        Ok(())
    }
}

/// Whether `id` has the form of a lease id ("queue.stream.n").
pub fn is_lease_id(id: &str) -> bool {
    driver::parse_lease_id(id).is_some()
}

/// Refuses a second stream whose spec differs from the running queue's.
fn same_spec(running: &QueueSpec, asked: &QueueSpec) -> Result<(), ReconcileError> {
    if running == asked {
        return Ok(());
    }
    Err(ReconcileError::FailedPrecondition {
        field: "spec".into(),
        message: format!(
            "the reconcile queue {:?} already runs with another spec; streams that share a queue must send the same spec (or use another name)",
            running.name
        ),
    })
}
