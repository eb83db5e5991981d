//! Prometheus metrics: one registry for the daemon, encoded as text on the admin endpoint's /metrics.

mod exposition;
mod process;

use std::{
    sync::{Arc, atomic::AtomicU64},
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::Registry,
};

/// The daemon's metrics; clones share the same registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// 1 while the apiserver counts as reachable (see `health`), else 0.
    pub apiserver_up: Gauge,
    /// Upstream apiserver watches running (one per distinct query).
    pub watch_upstreams: Gauge,
    /// Local subscribers across all watches.
    pub watch_subscribers: Gauge,
    /// Events received from upstream watches.
    pub watch_events: Counter,
    /// Upstream watch failures (each retried with backoff).
    pub watch_upstream_errors: Counter,
    /// Subscribers cut off for falling behind (each then gets RESYNC_REQUIRED and a snapshot).
    pub watch_resyncs: Counter,
    /// Bytes each watch's cached objects are charged to the memory budget, per watch.
    pub watch_bytes: Family<WatchLabel, Gauge>,
    /// Watches ended (or refused at their first list) because they would pass the memory budget.
    pub watch_exhausted: Counter,
    /// Bookmarks the apiserver sent on running watches, each moving its watch's high-water mark.
    pub watch_bookmarks: Counter,
    /// Per watch: the largest resourceVersion its cache reflects (its high-water mark), raised by its
    /// events and bookmarks: how far it has read the apiserver's history.
    pub watch_resource_version: Family<WatchLabel, Gauge>,
    /// Per watch: the store's resourceVersion at the latest consistent read (`watch.stalenessCheck`).
    pub watch_store_resource_version: Family<WatchLabel, Gauge>,
    /// Per watch: how long its high-water mark has not reached the oldest consistent read's version.
    pub watch_staleness: Family<WatchLabel, Gauge<f64, AtomicU64>>,
    /// Per watch of a shard: 1 when the apiserver honours its shard selector, 0 when the daemon applies it.
    pub watch_shard_honoured: Family<WatchLabel, Gauge>,
    /// Per watch of a shard: objects the apiserver sent from outside the shard (it does not honour the
    /// selector), dropped by the daemon.
    pub watch_shard_dropped: Family<WatchLabel, Counter>,
    /// The memory budget of the watches in bytes (`watch.maxCacheBytes`).
    pub watch_budget_bytes: Gauge,
    /// Bytes charged to the budget now, across watches (the cache, a list in progress, the history and the
    /// subscriber queues).
    pub watch_budget_used_bytes: Gauge,
    /// Messages the app sent that were stored.
    pub outbox_sends: Counter,
    /// ACKs received from peers' apps (one per peer for Service and election destinations).
    pub outbox_acks: Counter,
    /// Deliveries sent again (attempt 2 and later).
    pub outbox_retries: Counter,
    /// Messages replaced by a newer event of the same resource before they were ACKed.
    pub outbox_superseded: Counter,
    /// Deliveries given up (the peer left its group).
    pub outbox_failed: Counter,
    /// Messages the outbox holds (as `consistd status` counts them), updated every second.
    pub outbox_pending: Gauge,
    /// Age of the oldest message some peer has not ACKed, in seconds.
    pub outbox_oldest_pending_seconds: Gauge<f64, AtomicU64>,
    /// Connections to peers that are up.
    pub peer_connections: Gauge,
    /// Messages from peers stored for the app.
    pub inbox_received: Counter,
    /// Messages from peers that were already stored or ACKed (resends).
    pub inbox_duplicates: Counter,
    /// Messages from peers refused for good: their claim is older than one stored for the same election.
    pub inbox_fenced: Counter,
    /// Messages the app ACKed.
    pub inbox_acks: Counter,
    /// Messages the app NACKed.
    pub inbox_nacks: Counter,
    /// Messages waiting for the app's ACK.
    pub inbox_pending: Gauge,
    /// 1 when the newest config file read was applied, 0 when it was refused (the one before stays).
    pub config_last_reload_successful: Gauge,
    /// When a config file was last applied (at start, or by a reload), in seconds since the epoch.
    pub config_last_reload_success_timestamp_seconds: Gauge<f64, AtomicU64>,
    /// Calls on the app socket, per caller uid.
    api_calls: Family<UidLabel, Counter>,
    /// Calls refused because the caller is not in `socket.allowedUids` / `socket.allowedGids` or no
    /// access rule grants them, per caller uid.
    api_calls_refused: Family<UidLabel, Counter>,
    /// Guarded writes by the fence they went out with: "apiserver", "daemon", or "refused" (under
    /// `fencing.mode: require`, one the apiserver could not check).
    guarded_writes: Family<FenceLabel, Counter>,
    /// Updates and patches answered from a watch's cache without the apiserver: they would change nothing.
    pub unchanged_writes: Counter,
    /// 1 while this daemon leads the election, else 0, per election it runs (client-go's
    /// `leader_election_master_status`, the one people alert on).
    leader: Family<ElectionLabel, Gauge>,
    /// Calls started on the app socket, per method (go-grpc-prometheus' `grpc_server_started_total`).
    grpc_started: Family<GrpcCall, Counter>,
    /// Calls handled, per method and status code (`grpc_server_handled_total`).
    grpc_handled: Family<GrpcHandled, Counter>,
    /// How long calls took from their start to their status, per method (`grpc_server_handling_seconds`).
    grpc_handling: Family<GrpcCall, Histogram, fn() -> Histogram>,
    /// How long after the daemon received a change from the apiserver a subscriber's stream was handed it,
    /// per delivery mode.
    watch_delivery: Family<ModeLabel, Histogram, fn() -> Histogram>,
    /// The reconcile queues' metrics, named as client-go's workqueue names them.
    workqueue: WorkqueueFamilies,
}

/// client-go's workqueue metrics (`workqueue_depth`, ...) under the daemon's prefix, per queue `name`,
/// plus the grants held back until the watch showed the pod's writes.
#[derive(Debug, Clone)]
struct WorkqueueFamilies {
    depth: Family<QueueLabel, Gauge>,
    adds: Family<QueueLabel, Counter>,
    queue_duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    work_duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    unfinished_work: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    longest_running: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    retries: Family<QueueLabel, Counter>,
    consistency_holds: Family<QueueLabel, Counter>,
    consistency_timeouts: Family<QueueLabel, Counter>,
    shard_slots: Family<QueueLabel, Gauge>,
    shard_keys: Family<QueueLabel, Gauge>,
    shard_handoffs: Family<QueueLabel, Counter>,
    shard_ownerless: Family<QueueLabel, Counter<f64, AtomicU64>>,
}

/// One reconcile queue's metrics.
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    /// Keys ready (or held for consistency): client-go's `workqueue_depth`.
    pub depth: Gauge,
    /// Keys added to the ready line: `workqueue_adds_total`.
    pub adds: Counter,
    /// Seconds from ready to leased: `workqueue_queue_duration_seconds`.
    pub queue_duration: Histogram,
    /// Seconds from leased to completed: `workqueue_work_duration_seconds`.
    pub work_duration: Histogram,
    /// Seconds of work in progress, summed over leases: `workqueue_unfinished_work_seconds`.
    pub unfinished_work: Gauge<f64, AtomicU64>,
    /// The oldest lease's age: `workqueue_longest_running_processor_seconds`.
    pub longest_running: Gauge<f64, AtomicU64>,
    /// RETRY completions: `workqueue_retries_total`.
    pub retries: Counter,
    /// Grants held back until the watch showed the pod's writes.
    pub consistency_holds: Counter,
    /// Grants made after `consistency.timeout` without the watch showing a write (TIMED_OUT).
    pub consistency_timeouts: Counter,
    /// A sharded queue: slots of its ring this member owns.
    pub shard_slots: Gauge,
    /// A sharded queue: keys in the slots this member owns.
    pub shard_keys: Gauge,
    /// A sharded queue: slots this member handed on to their next owners.
    pub shard_handoffs: Counter,
    /// A sharded queue: slot-seconds no member granted from (unowned, moving, or its owner no longer live),
    /// as the coordinator counts.
    pub shard_ownerless: Counter<f64, AtomicU64>,
}

/// The label of per-queue metrics, as client-go's workqueue names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct QueueLabel {
    name: String,
}

/// client-go's workqueue latency buckets: 10 ns to 1000 s, by tens.
fn workqueue_buckets() -> Histogram {
    Histogram::new(exponential_buckets(10e-9, 10.0, 12))
}

/// The labels of a gRPC method, as go-grpc-prometheus names them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct GrpcCall {
    /// unary, client_stream, server_stream or bidi_stream.
    pub grpc_type: String,
    /// The full service name ("consistd.v1.WatchService").
    pub grpc_service: String,
    /// The method name ("Subscribe").
    pub grpc_method: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GrpcHandled {
    #[prometheus(flatten)]
    call: GrpcCall,
    grpc_code: String,
}

/// The labels of per-watch metrics: what one upstream watch watches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WatchLabel {
    /// group/version/plural, or version/plural for the core group.
    pub resource: String,
    /// The namespace; empty for all namespaces or a cluster-scoped resource.
    pub namespace: String,
    /// The label selector, as given.
    pub label_selector: String,
    /// The field selector, as given.
    pub field_selector: String,
    /// What of each object it keeps: "full", "metadata", "fields:a.b,c", "+managedFields" when kept.
    pub view: String,
    /// Its share of the objects (a KEP-5866 shard selector, named short); empty for all of them.
    pub shard: String,
}

/// The label of watch delivery latency: the subscriber's mode, raw or consistent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModeLabel {
    mode: String,
}

/// Buckets for call times: 0.5 ms to about 16 s, doubling.
fn call_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Buckets for watch deliveries: 50 µs to about 13 s, doubling.
fn delivery_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.00005, 2.0, 19))
}

/// The label of per-election metrics: "namespace/name" of the Lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ElectionLabel {
    election: String,
}

/// The label of guarded writes: the fence they went out with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FenceLabel {
    fence: String,
}

/// The label of per-caller metrics: the caller's uid, or "unknown" without peer credentials.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UidLabel {
    uid: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every consistd metric registered under the `consistd_` prefix, and the standard
    /// `process_*` metrics.
    pub fn new() -> Self {
        let mut root = Registry::default();
        root.register_collector(Box::new(process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("consistd");
        registry.register(
            "build",
            "The consistd version running",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let apiserver_up = Gauge::default();
        registry.register(
            "apiserver_up",
            "1 while the apiserver counts as reachable: heard from recently, no probe unanswered since",
            apiserver_up.clone(),
        );
        let watch_upstreams = Gauge::default();
        registry.register("watch_upstreams", "Upstream apiserver watches running", watch_upstreams.clone());
        let watch_subscribers = Gauge::default();
        registry.register("watch_subscribers", "Local watch subscribers", watch_subscribers.clone());
        let watch_events = Counter::default();
        registry.register("watch_events", "Events received from upstream watches", watch_events.clone());
        let watch_upstream_errors = Counter::default();
        registry.register("watch_upstream_errors", "Upstream watch failures", watch_upstream_errors.clone());
        let watch_resyncs = Counter::default();
        registry.register("watch_resyncs", "Subscribers cut off for falling behind", watch_resyncs.clone());
        let watch_bytes = Family::<WatchLabel, Gauge>::default();
        registry.register(
            "watch_cache_bytes",
            "Bytes a watch's cached objects are charged to the memory budget (watch.maxCacheBytes)",
            watch_bytes.clone(),
        );
        let watch_bookmarks = Counter::default();
        registry.register(
            "watch_bookmarks",
            "Bookmarks the apiserver sent on running watches, each moving its watch's high-water mark",
            watch_bookmarks.clone(),
        );
        let watch_resource_version = Family::<WatchLabel, Gauge>::default();
        registry.register(
            "watch_resource_version",
            "The largest resourceVersion a watch's cache reflects (its high-water mark), raised by events and bookmarks",
            watch_resource_version.clone(),
        );
        let watch_store_resource_version = Family::<WatchLabel, Gauge>::default();
        registry.register(
            "watch_store_resource_version",
            "The store's resourceVersion at a watch's latest consistent read (watch.stalenessCheck)",
            watch_store_resource_version.clone(),
        );
        let watch_staleness = Family::<WatchLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "watch_staleness_seconds",
            "How long a watch's high-water mark has not reached the version of the oldest consistent read it is behind (0: caught up)",
            watch_staleness.clone(),
        );
        let watch_shard_honoured = Family::<WatchLabel, Gauge>::default();
        registry.register(
            "watch_shard_honoured",
            "1 when the apiserver honours a watch's shard selector (KEP-5866), 0 when the daemon applies it",
            watch_shard_honoured.clone(),
        );
        let watch_shard_dropped = Family::<WatchLabel, Counter>::default();
        registry.register(
            "watch_shard_dropped",
            "Objects the apiserver sent a shard's watch from outside the shard, dropped by the daemon",
            watch_shard_dropped.clone(),
        );
        let watch_exhausted = Counter::default();
        registry.register(
            "watch_exhausted",
            "Watches ended or refused RESOURCE_EXHAUSTED because they would pass the memory budget",
            watch_exhausted.clone(),
        );
        let watch_budget_bytes = Gauge::default();
        registry.register(
            "watch_budget_bytes",
            "The memory budget of the watches' objects (watch.maxCacheBytes)",
            watch_budget_bytes.clone(),
        );
        let watch_budget_used_bytes = Gauge::default();
        registry.register(
            "watch_budget_used_bytes",
            "Bytes of watched objects held now: caches, lists in progress, histories and subscriber queues",
            watch_budget_used_bytes.clone(),
        );
        let outbox_sends = Counter::default();
        registry.register("outbox_sends", "Messages the app sent that were stored", outbox_sends.clone());
        let outbox_acks = Counter::default();
        registry.register("outbox_acks", "ACKs received from peers' apps", outbox_acks.clone());
        let outbox_retries = Counter::default();
        registry.register("outbox_retries", "Deliveries sent again (attempt 2 and later)", outbox_retries.clone());
        let outbox_superseded = Counter::default();
        registry.register(
            "outbox_superseded",
            "Messages replaced by a newer event of the same resource before their ACK",
            outbox_superseded.clone(),
        );
        let outbox_failed = Counter::default();
        registry.register("outbox_failed", "Deliveries given up", outbox_failed.clone());
        let outbox_pending = Gauge::default();
        registry.register("outbox_pending", "Messages the outbox holds", outbox_pending.clone());
        let outbox_oldest_pending_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "outbox_oldest_pending_seconds",
            "Age of the oldest message some peer has not ACKed",
            outbox_oldest_pending_seconds.clone(),
        );
        let peer_connections = Gauge::default();
        registry.register("peer_connections", "Connections to peers that are up", peer_connections.clone());
        let inbox_received = Counter::default();
        registry.register("inbox_received", "Messages from peers stored for the app", inbox_received.clone());
        let inbox_duplicates = Counter::default();
        registry.register("inbox_duplicates", "Resent messages already stored or ACKed", inbox_duplicates.clone());
        let inbox_fenced = Counter::default();
        registry.register(
            "inbox_fenced",
            "Messages refused for good: their claim is older than one stored for the same election",
            inbox_fenced.clone(),
        );
        let inbox_acks = Counter::default();
        registry.register("inbox_acks", "Messages the app ACKed", inbox_acks.clone());
        let inbox_nacks = Counter::default();
        registry.register("inbox_nacks", "Messages the app NACKed", inbox_nacks.clone());
        let inbox_pending = Gauge::default();
        registry.register("inbox_pending", "Messages waiting for the app's ACK", inbox_pending.clone());
        let config_last_reload_successful = Gauge::default();
        registry.register(
            "config_last_reload_successful",
            "1 when the newest config file read was applied, 0 when it was refused and the one before stays",
            config_last_reload_successful.clone(),
        );
        let config_last_reload_success_timestamp_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "config_last_reload_success_timestamp_seconds",
            "When a config file was last applied, at start or by a reload",
            config_last_reload_success_timestamp_seconds.clone(),
        );
        let api_calls = Family::<UidLabel, Counter>::default();
        registry.register("api_calls", "Calls on the app socket, per caller uid", api_calls.clone());
        let api_calls_refused = Family::<UidLabel, Counter>::default();
        registry.register(
            "api_calls_refused",
            "Calls refused by socket.allowedUids/allowedGids or access.rules, per caller uid",
            api_calls_refused.clone(),
        );
        let guarded_writes = Family::<FenceLabel, Counter>::default();
        registry.register(
            "guarded_writes",
            "Guarded writes by the fence they went out with: apiserver, daemon, or refused (fencing.mode require)",
            guarded_writes.clone(),
        );
        let unchanged_writes = Counter::default();
        registry.register(
            "unchanged_writes",
            "Updates and patches answered from a watch's cache without the apiserver: they would change nothing",
            unchanged_writes.clone(),
        );
        let leader = Family::<ElectionLabel, Gauge>::default();
        registry.register(
            "leader_election_master_status",
            "1 while this daemon leads the election (namespace/name), else 0",
            leader.clone(),
        );
        let grpc_started = Family::<GrpcCall, Counter>::default();
        registry.register("grpc_server_started", "Calls started on the app socket", grpc_started.clone());
        let grpc_handled = Family::<GrpcHandled, Counter>::default();
        registry.register(
            "grpc_server_handled",
            "Calls finished on the app socket, by status code (Canceled: the client went away first)",
            grpc_handled.clone(),
        );
        let grpc_handling = Family::<GrpcCall, Histogram, fn() -> Histogram>::new_with_constructor(call_buckets);
        registry.register(
            "grpc_server_handling_seconds",
            "Time from a call's start to its status (for streams: until the stream ended)",
            grpc_handling.clone(),
        );
        let watch_delivery = Family::<ModeLabel, Histogram, fn() -> Histogram>::new_with_constructor(delivery_buckets);
        registry.register(
            "watch_delivery_latency_seconds",
            "Time from receiving a change from the apiserver to handing it to a subscriber's stream, by mode \
             (consistent: including holding a state for the pod's own write)",
            watch_delivery.clone(),
        );
        let workqueue = WorkqueueFamilies {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(workqueue_buckets),
            work_duration: Family::new_with_constructor(workqueue_buckets),
            unfinished_work: Family::default(),
            longest_running: Family::default(),
            retries: Family::default(),
            consistency_holds: Family::default(),
            consistency_timeouts: Family::default(),
            shard_slots: Family::default(),
            shard_keys: Family::default(),
            shard_handoffs: Family::default(),
            shard_ownerless: Family::default(),
        };
        registry.register("workqueue_depth", "Keys a reconcile queue holds ready", workqueue.depth.clone());
        registry.register("workqueue_adds", "Keys added to a reconcile queue's ready line", workqueue.adds.clone());
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long a key waited in a reconcile queue before it was leased",
            workqueue.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long an app held a lease before completing it",
            workqueue.work_duration.clone(),
        );
        registry.register(
            "workqueue_unfinished_work_seconds",
            "Seconds of work in progress: the ages of a reconcile queue's leases, summed",
            workqueue.unfinished_work.clone(),
        );
        registry.register(
            "workqueue_longest_running_processor_seconds",
            "The age of a reconcile queue's oldest lease",
            workqueue.longest_running.clone(),
        );
        registry.register("workqueue_retries", "Leases completed with RETRY", workqueue.retries.clone());
        registry.register(
            "workqueue_consistency_holds",
            "Grants held back until the watch showed the pod's writes made under the key's earlier leases",
            workqueue.consistency_holds.clone(),
        );
        registry.register(
            "workqueue_consistency_timeouts",
            "Grants made TIMED_OUT: a write was not seen within consistency.timeout",
            workqueue.consistency_timeouts.clone(),
        );
        registry.register(
            "workqueue_shard_slots",
            "Slots of a sharded queue's ring this member owns",
            workqueue.shard_slots.clone(),
        );
        registry.register(
            "workqueue_shard_keys",
            "Keys in the slots of a sharded queue this member owns",
            workqueue.shard_keys.clone(),
        );
        registry.register(
            "workqueue_shard_handoffs",
            "Slots of a sharded queue this member handed on to their next owners",
            workqueue.shard_handoffs.clone(),
        );
        registry.register(
            "workqueue_shard_ownerless_slot_seconds",
            "Slot-seconds of a sharded queue's ring no member granted from (unowned, moving between owners, or owned by a member no longer live), counted by its coordinator",
            workqueue.shard_ownerless.clone(),
        );
        Self {
            registry: Arc::new(root),
            apiserver_up,
            watch_upstreams,
            watch_subscribers,
            watch_events,
            watch_upstream_errors,
            watch_resyncs,
            watch_bytes,
            watch_shard_honoured,
            watch_shard_dropped,
            watch_exhausted,
            watch_bookmarks,
            watch_resource_version,
            watch_store_resource_version,
            watch_staleness,
            watch_budget_bytes,
            watch_budget_used_bytes,
            outbox_sends,
            outbox_acks,
            outbox_retries,
            outbox_superseded,
            outbox_failed,
            outbox_pending,
            outbox_oldest_pending_seconds,
            peer_connections,
            inbox_received,
            inbox_duplicates,
            inbox_fenced,
            inbox_acks,
            inbox_nacks,
            inbox_pending,
            config_last_reload_successful,
            config_last_reload_success_timestamp_seconds,
            api_calls,
            api_calls_refused,
            guarded_writes,
            unchanged_writes,
            leader,
            grpc_started,
            grpc_handled,
            grpc_handling,
            watch_delivery,
            workqueue,
        }
    }

    /// The metrics of the reconcile queue `name`, created at 0.
    pub fn queue(&self, name: &str) -> QueueMetrics {
        let label = QueueLabel { name: name.to_owned() };
        let w = &self.workqueue;
        QueueMetrics {
            depth: w.depth.get_or_create(&label).clone(),
            adds: w.adds.get_or_create(&label).clone(),
            queue_duration: w.queue_duration.get_or_create(&label).clone(),
            work_duration: w.work_duration.get_or_create(&label).clone(),
            unfinished_work: w.unfinished_work.get_or_create(&label).clone(),
            longest_running: w.longest_running.get_or_create(&label).clone(),
            retries: w.retries.get_or_create(&label).clone(),
            consistency_holds: w.consistency_holds.get_or_create(&label).clone(),
            consistency_timeouts: w.consistency_timeouts.get_or_create(&label).clone(),
            shard_slots: w.shard_slots.get_or_create(&label).clone(),
            shard_keys: w.shard_keys.get_or_create(&label).clone(),
            shard_handoffs: w.shard_handoffs.get_or_create(&label).clone(),
            shard_ownerless: w.shard_ownerless.get_or_create(&label).clone(),
        }
    }

    /// Drops the metrics of the reconcile queue `name`: it stopped.
    pub fn forget_queue(&self, name: &str) {
        let label = QueueLabel { name: name.to_owned() };
        let w = &self.workqueue;
        w.depth.remove(&label);
        w.adds.remove(&label);
        w.queue_duration.remove(&label);
        w.work_duration.remove(&label);
        w.unfinished_work.remove(&label);
        w.longest_running.remove(&label);
        w.retries.remove(&label);
        w.consistency_holds.remove(&label);
        w.consistency_timeouts.remove(&label);
        w.shard_slots.remove(&label);
        w.shard_keys.remove(&label);
        w.shard_handoffs.remove(&label);
        w.shard_ownerless.remove(&label);
    }

    /// Creates the started series of `call` at 0, so a method shows before its first call.
    pub fn grpc_method(&self, call: &GrpcCall) {
        let _created = self.grpc_started.get_or_create(call);
    }

    /// Counts a started `call`.
    pub fn grpc_started(&self, call: &GrpcCall) {
        self.grpc_started.get_or_create(call).inc();
    }

    /// Counts a handled `call` with its status `code` ("OK", "NotFound", ...) and records how long it took.
    pub fn grpc_handled(&self, call: &GrpcCall, code: &str, took: Duration) {
        let handled = GrpcHandled { call: call.clone(), grpc_code: code.to_owned() };
        self.grpc_handled.get_or_create(&handled).inc();
        self.grpc_handling.get_or_create(call).observe(took.as_secs_f64());
    }

    /// Records a watch delivery to a subscriber in `mode` ("raw" or "consistent") `after` its receipt.
    pub fn watch_delivered(&self, mode: &str, after: Duration) {
        self.watch_delivery.get_or_create(&ModeLabel { mode: mode.to_owned() }).observe(after.as_secs_f64());
    }

    /// The leader gauge of `election` ("namespace/name"), created at 0.
    pub fn leader_gauge(&self, election: &str) -> Gauge {
        self.leader.get_or_create(&ElectionLabel { election: election.to_owned() }).clone()
    }

    /// Drops `election`'s leader gauge: this daemon no longer runs it.
    pub fn forget_election(&self, election: &str) {
        self.leader.remove(&ElectionLabel { election: election.to_owned() });
    }

    /// Counts a call on the app socket by the caller `uid`.
    pub fn count_call(&self, uid: &str) {
        self.api_calls.get_or_create(&UidLabel { uid: uid.to_owned() }).inc();
    }

    /// Counts a guarded write that went out with `fence` ("apiserver", "daemon") or was "refused".
    pub fn count_guarded_write(&self, fence: &str) {
        self.guarded_writes.get_or_create(&FenceLabel { fence: fence.to_owned() }).inc();
    }

    /// Counts a refused call by the caller `uid`.
    pub fn count_refused_call(&self, uid: &str) {
        self.api_calls_refused.get_or_create(&UidLabel { uid: uid.to_owned() }).inc();
    }

    /// The metrics as OpenMetrics text, as prometheus-client writes them.
    pub(crate) fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }

    /// The metrics in the format a scraper's `Accept` header asks for, and its `Content-Type`: OpenMetrics
    /// when it prefers `application/openmetrics-text` (Prometheus' scrapes do), else the Prometheus text
    /// format 0.0.4 (curl, promtool), as client_golang's handler negotiates.
    pub fn encode_for(&self, accept: Option<&str>) -> (&'static str, String) {
        use exposition::Exposition;
        let format = Exposition::negotiate(accept);
        let openmetrics = self.encode();
        let body = match format {
            Exposition::OpenMetrics => openmetrics,
            Exposition::PrometheusText => exposition::prometheus_text(&openmetrics),
        };
        (format.content_type(), body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_prefixed_metrics() {
        let metrics = Metrics::new();
        metrics.apiserver_up.set(1);
        let text = metrics.encode();
        assert!(text.contains("consistd_apiserver_up 1"), "{text}");
        assert!(text.contains("consistd_build_info{version=\""), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn serves_openmetrics_to_prometheus_and_the_text_format_to_the_rest() {
        let metrics = Metrics::new();
        metrics.count_call("0");
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.6,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        let (content_type, body) = metrics.encode_for(Some(prometheus));
        assert!(content_type.starts_with("application/openmetrics-text; version=1.0.0"), "{content_type}");
        // The process_* readings change between two scrapes; the rest is the same text.
        let steady = |text: &str| text.lines().filter(|l| !l.contains("process_")).collect::<Vec<_>>().join("\n");
        assert_eq!(steady(&body), steady(&metrics.encode()));
        assert!(body.contains("# TYPE process_resident_memory_bytes gauge"), "{body}");

        let (content_type, text) = metrics.encode_for(None);
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
        assert!(
            text.contains("# TYPE consistd_api_calls_total counter\nconsistd_api_calls_total{uid=\"0\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE consistd_build_info gauge\n"), "{text}");
        assert!(!text.contains("# EOF") && !text.contains(" info\n"), "{text}");
    }
}
