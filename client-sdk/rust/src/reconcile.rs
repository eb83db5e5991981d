//! A reconciler on `ReconcileService`: the daemon's work queue hands out leases on keys, a handler works
//! on each, and how the handler ends completes the lease (see `proto/consistd/v1/reconcile.proto`).

use std::{
    any::Any,
    collections::HashMap,
    error::Error as StdError,
    fmt,
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::FutureExt as _;
use tokio::{
    sync::{Mutex, Semaphore, mpsc},
    task::JoinSet,
};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::{
    Client, Error, Objects,
    proto::{
        ChangeFilter, Completion, CompletionRefused, Condition, ConditionStatus, Consistency, ElectionRef,
        EventSeverity, KubeObject, ObjectQuery, ObjectView, Outcome, QueueSpec, ReconcileRequest, RecordEventRequest,
        RelatedQuery, RetryPolicy, SetConditionRequest, SetConditionResponse, WriteGuard, reconcile_request,
        reconcile_response, reconcile_service_client::ReconcileServiceClient, related_query::MapsBy,
    },
    retry::{Backoff, is_retryable},
};

/// The longest error text a completion carries, in bytes; longer ones are cut at a character boundary.
const MAX_ERROR_BYTES: usize = 4096;

/// How long a reconciler that shuts down gracefully waits for the daemon to end the stream after its
/// last completions went out.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What a [`Reconciler`] works on: the daemon's queue spec (`QueueSpec`), built up from a name and the
/// primary resource. Every stream that opens the same queue name shares the queue, and must give the
/// same spec.
///
/// ```
/// use std::time::Duration;
/// use consistd_client::{ReconcileSpec, Related};
///
/// let spec = ReconcileSpec::new("web", "apps/v1/deployments")
///     .namespace("default")
///     .labels("app=web")
///     .related(Related::owned("configmaps").namespace("default"))
///     .max_leases(4)
///     .retry_backoff(Duration::from_millis(100), Duration::from_secs(60))
///     .lease_timeout(Duration::from_secs(120));
/// assert_eq!(spec.as_proto().max_leases, 4);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ReconcileSpec {
    spec: QueueSpec,
}

impl ReconcileSpec {
    /// A queue named `name` (a DNS label: the name of its metrics and of `consistd status`) whose keys are
    /// the objects of `resource` (in any form a watch takes) in every namespace, one lease at a time.
    pub fn new(name: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            spec: QueueSpec {
                name: name.into(),
                primary: Some(ObjectQuery { resource: resource.into(), ..Default::default() }),
                max_leases: 1,
                ..Default::default()
            },
        }
    }

    fn primary(&mut self) -> &mut ObjectQuery {
        self.spec.primary.get_or_insert_with(ObjectQuery::default)
    }

    /// Only primary objects in this namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.primary().namespace = namespace.into();
        self
    }

    /// Only primary objects matching this label selector.
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.primary().label_selector = selector.into();
        self
    }

    /// Only primary objects matching this field selector.
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.primary().field_selector = selector.into();
        self
    }

    /// Hands out only each primary's metadata (see [`Watch::metadata_only`](crate::Watch::metadata_only)).
    pub fn metadata_only(mut self) -> Self {
        self.primary().view.get_or_insert_with(ObjectView::default).metadata_only = true;
        self
    }

    /// Hands out only these fields of each primary (see [`Watch::project`](crate::Watch::project)).
    pub fn project<P: Into<String>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        self.primary().view.get_or_insert_with(ObjectView::default).fields.extend(paths.into_iter().map(Into::into));
        self
    }

    /// Only a change of this part of a primary queues a pass (call again to name more; any of them will do),
    /// as controller-runtime's `GenerationChangedPredicate` and kube-rs's `predicates::generation` filter:
    /// with [`Changed::Generation`] a write of status or metadata alone hands out nothing. An object's first
    /// state, its deletion and its deletionTimestamp being set always do. Unnamed: every change.
    pub fn only_changes_of(mut self, part: Changed) -> Self {
        part.name(self.primary());
        self
    }

    /// Objects whose changes queue the primary they name.
    pub fn related(mut self, related: Related) -> Self {
        self.spec.related.push(related.query);
        self
    }

    /// How many items this reconciler works on at once (default 1, as controller-runtime's
    /// `MaxConcurrentReconciles`; the daemon takes 1 to 10000).
    pub fn max_leases(mut self, max_leases: u32) -> Self {
        self.spec.max_leases = max_leases;
        self
    }

    /// A failed key waits `base * 2^(failures-1)`, at most `max` (client-go's defaults: 5 ms, 1000 s).
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        let retry = self.spec.retry.get_or_insert_with(RetryPolicy::default);
        retry.base_delay = Some(duration(base));
        retry.max_delay = Some(duration(max));
        self
    }

    /// Retries across the queue also wait for a token of a bucket of `rate` per second holding `burst`
    /// (client-go's defaults: 10 per second, 100).
    pub fn retry_rate(mut self, rate: f64, burst: u32) -> Self {
        let retry = self.spec.retry.get_or_insert_with(RetryPolicy::default);
        retry.rate = rate;
        retry.burst = burst;
        self
    }

    /// An item not completed in this time goes back to the queue and its completion is refused
    /// (default 10 minutes, at least 1 second).
    pub fn lease_timeout(mut self, timeout: Duration) -> Self {
        self.spec.lease_timeout = Some(duration(timeout));
        self
    }

    /// Work is handed out only while this pod leads `election` (a Lease in `namespace`, empty for the
    /// daemon's own), and each item carries the term it was granted in and the guard of that term for
    /// its writes ([`WorkItem::guard`]). The app campaigns in the election itself ([`Client::campaign`]).
    /// With [`sharded`](Self::sharded), the election names the group whose members share the keys instead.
    pub fn election(mut self, election: impl Into<String>, namespace: impl Into<String>) -> Self {
        self.spec.election = Some(ElectionRef { election: election.into(), namespace: namespace.into() });
        self
    }

    /// Spreads the keys over every pod whose daemon runs this queue (the same name and spec) under its
    /// [`election`](Self::election): a key is leased to one pod at a time across the whole group. Needs the
    /// election (without one the daemon refuses the spec, INVALID_ARGUMENT naming `spec.sharded`). Each
    /// item's [`WorkItem::term`] is then the epoch of the key's slot, and [`WorkItem::guard`] works unchanged.
    pub fn sharded(mut self) -> Self {
        self.spec.sharded = true;
        self
    }

    /// What a [`sharded`](Self::sharded) queue hashes a key by to find its slot: [`ShardBy::Key`] (the
    /// default) spreads keys evenly; [`ShardBy::Namespace`] keeps a namespace's keys together, and each pod's
    /// daemon then lists and watches only its share of the namespaces (on an apiserver with Kubernetes'
    /// sharded watches, KEP-5866). Needs `sharded` and a primary of every namespace (else the daemon refuses
    /// the spec, INVALID_ARGUMENT naming `spec.shard_by`).
    ///
    /// [`ShardBy::Key`]: crate::proto::ShardBy::Key
    /// [`ShardBy::Namespace`]: crate::proto::ShardBy::Namespace
    pub fn shard_by(mut self, by: crate::proto::ShardBy) -> Self {
        self.spec.shard_by = by.into();
        self
    }

    /// A finalizer the daemon keeps on every primary (a prefixed name, "example.com/cleanup"), as
    /// controller-runtime's `controllerutil` and kube-rs's `finalizer()` do: it is added before an object's
    /// first pass, a deleted object is handed out as a finalize pass ([`WorkItem::finalizing`]), and
    /// [`Action::done`] on that pass removes it (any other end keeps it). A deposed leader's removal is refused.
    pub fn finalizer(mut self, finalizer: impl Into<String>) -> Self {
        self.spec.finalizer = finalizer.into();
        self
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The spec as the daemon gets it.
    pub fn as_proto(&self) -> &QueueSpec {
        &self.spec
    }
}

impl From<QueueSpec> for ReconcileSpec {
    /// A spec written out in full, as the protocol has it.
    fn from(spec: QueueSpec) -> Self {
        Self { spec }
    }
}

impl From<ReconcileSpec> for QueueSpec {
    fn from(spec: ReconcileSpec) -> Self {
        spec.spec
    }
}

/// A part of an object whose change queues a pass ([`ReconcileSpec::only_changes_of`],
/// [`Related::only_changes_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    /// `metadata.generation`, which the apiserver moves on a change of the spec (not of status or metadata);
    /// an object without one (a ConfigMap) counts every change.
    Generation,
    /// `metadata.labels`.
    Labels,
    /// `metadata.annotations`.
    Annotations,
}

impl Changed {
    /// Names this part in `query`'s change filter.
    fn name(self, query: &mut ObjectQuery) {
        let filter = query.changes.get_or_insert_with(ChangeFilter::default);
        match self {
            Self::Generation => filter.generation = true,
            Self::Labels => filter.labels = true,
            Self::Annotations => filter.annotations = true,
        }
    }
}

/// Objects whose changes queue a primary key of a [`ReconcileSpec`], and how each names its primary: by
/// its controller ownerReference, or by a label, annotation or field whose value is "name" (in the
/// related object's namespace) or "namespace/name".
#[derive(Debug, Clone, PartialEq)]
pub struct Related {
    query: RelatedQuery,
}

impl Related {
    fn new(resource: impl Into<String>, maps_by: MapsBy) -> Self {
        let query = ObjectQuery { resource: resource.into(), ..Default::default() };
        Self { query: RelatedQuery { query: Some(query), maps_by: Some(maps_by), priority: 0 } }
    }

    /// Objects of `resource` name their primary by their controller ownerReference (`controller: true`)
    /// of the primary's kind: the objects a controller creates and owns.
    pub fn owned(resource: impl Into<String>) -> Self {
        Self::new(resource, MapsBy::ControllerOwner(true))
    }

    /// Objects of `resource` name their primary in the value of the label `key`.
    pub fn by_label(resource: impl Into<String>, key: impl Into<String>) -> Self {
        Self::new(resource, MapsBy::Label(key.into()))
    }

    /// Objects of `resource` name their primary in the value of the annotation `key`.
    pub fn by_annotation(resource: impl Into<String>, key: impl Into<String>) -> Self {
        Self::new(resource, MapsBy::Annotation(key.into()))
    }

    /// Objects of `resource` name their primary in the string at this dot-separated path, e.g.
    /// "spec.configMapName".
    pub fn by_field(resource: impl Into<String>, path: impl Into<String>) -> Self {
        Self::new(resource, MapsBy::Field(path.into()))
    }

    fn query(&mut self) -> &mut ObjectQuery {
        self.query.query.get_or_insert_with(ObjectQuery::default)
    }

    /// Only related objects in this namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.query().namespace = namespace.into();
        self
    }

    /// Only related objects matching this label selector.
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.query().label_selector = selector.into();
        self
    }

    /// Only related objects matching this field selector.
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.query().field_selector = selector.into();
        self
    }

    /// The priority of the passes this query's changes queue (the primary's changes: 0): a higher one is
    /// handed out first, and a key already queued rises to it.
    pub fn priority(mut self, priority: i32) -> Self {
        self.query.priority = priority;
        self
    }

    /// Only a change of this part of a related object queues its primary (call again to name more), as
    /// [`ReconcileSpec::only_changes_of`]; a related object's move to another primary always does.
    pub fn only_changes_of(mut self, part: Changed) -> Self {
        part.name(self.query());
        self
    }

    /// Keeps only each related object's metadata: enough to map by owner, label or annotation.
    pub fn metadata_only(mut self) -> Self {
        self.query().view.get_or_insert_with(ObjectView::default).metadata_only = true;
        self
    }

    /// Keeps only these fields of each related object; the daemon adds what the mapping reads.
    pub fn project<P: Into<String>>(mut self, paths: impl IntoIterator<Item = P>) -> Self {
        self.query().view.get_or_insert_with(ObjectView::default).fields.extend(paths.into_iter().map(Into::into));
        self
    }
}

/// A lease on one key (the namespace and name of a primary object), handed to the handler. Until the
/// handler ends, no other lease on the key is handed out to anyone.
///
/// Writes for the item go through [`WorkItem::objects`] (they name the lease); in a queue with an
/// election, a write only the leader may make passes [`WorkItem::guard`] in its request, so the daemon
/// refuses it (FAILED_PRECONDITION) once this pod no longer leads in the term the lease was granted in
/// (see the example of [`Client::reconcile`]).
#[derive(Debug, Clone)]
pub struct WorkItem {
    /// The key: the primary's namespace (empty when cluster-scoped) ...
    pub namespace: String,
    /// ... and name.
    pub name: String,
    /// The primary as the daemon's cache held it when the lease was granted; `None` when a related
    /// object queued the key but no such primary exists.
    pub object: Option<KubeObject>,
    /// The primary was deleted: `object` is its last known state. Handed out once.
    pub deleted: bool,
    /// A finalize pass: the primary is being deleted and still carries the spec's
    /// [finalizer](ReconcileSpec::finalizer); clean up and return [`Action::done`] to remove it.
    pub finalizing: bool,
    /// CONSISTENT: the state is at least as new as every write this pod made to it and, naming a lease
    /// of this key, to its related objects. TIMED_OUT: a write was not seen in time and this is the
    /// latest state known.
    pub consistency: Consistency,
    /// 1 for the first pass after a change; n for the nth pass in a row after a failure.
    pub attempt: u32,
    /// The election's term the lease was granted in; 0 without an election. In a
    /// [sharded](ReconcileSpec::sharded) queue, the epoch of the key's slot.
    pub term: u64,
    /// In a queue with an election ([`ReconcileSpec::election`]), the guard of the term the lease was
    /// granted in: the spec's election and namespace (empty, as in the spec, for the daemon's own) and
    /// [`WorkItem::term`]. A write passing it succeeds only while this pod still leads in that term; in a
    /// [sharded](ReconcileSpec::sharded) queue, a write naming the lease ([`WorkItem::objects`]) that
    /// passes it carries the slot's claim. `None` without an election.
    pub guard: Option<WriteGuard>,
    /// The lease: what writes made for this item name ([`WorkItem::objects`] does that).
    pub lease_id: String,
    /// The error of the previous attempt, when this pass follows a failure.
    pub last_error: Option<String>,
    /// When the lease times out and the key goes back to the queue.
    pub expires_at: Option<SystemTime>,
    /// The queue's primary resource, as the spec names it.
    resource: String,
    /// The queue's name: the reporting controller of the item's events.
    queue: String,
    objects: Objects,
}

impl WorkItem {
    fn from_proto(item: crate::proto::WorkItem, spec: &QueueSpec, objects: &Objects) -> Self {
        let election = spec.election.as_ref();
        let resource = spec.primary.as_ref().map_or("", |p| p.resource.as_str());
        let consistency = item.consistency();
        let objects = objects.clone().for_lease(&item.lease_id);
        let guard = election.filter(|e| !e.election.is_empty()).map(|e| WriteGuard {
            election: e.election.clone(),
            namespace: e.namespace.clone(),
            term: item.term,
        });
        Self {
            namespace: item.namespace,
            name: item.name,
            object: item.object,
            deleted: item.deleted,
            finalizing: item.finalizing,
            consistency,
            attempt: item.attempt,
            term: item.term,
            guard,
            last_error: (!item.last_error.is_empty()).then_some(item.last_error),
            expires_at: item.expires_at.and_then(|t| SystemTime::try_from(t).ok()),
            lease_id: item.lease_id,
            resource: resource.to_owned(),
            queue: spec.name.clone(),
            objects,
        }
    }

    /// The objects client for writes made for this item: each write names the item's lease
    /// (`reconcile_lease`, unless the request names one), so the key's next pass waits until the watch of
    /// the written object has caught up with it; and, as every write of the client, it is recorded for
    /// the own-write rule of the client's watches. It adds no guard itself: when the queue follows an
    /// election the daemon guards every write naming the lease with the lease's term (and refuses one
    /// naming a lease no longer held), so a write that outlives its term is refused where it lands.
    pub fn objects(&self) -> Objects {
        self.objects.clone()
    }

    /// The primary's JSON, parsed; `None` when there is no object.
    pub fn json(&self) -> Option<Result<serde_json::Value, serde_json::Error>> {
        self.object.as_ref().map(|o| serde_json::from_slice(&o.json))
    }

    /// Whether a write of this pod was not seen in time, so the state may not show it yet.
    pub fn timed_out(&self) -> bool {
        self.consistency == Consistency::TimedOut
    }

    /// Sets the status condition `kind` of this item's primary, as apimachinery's `meta.SetStatusCondition`
    /// does, in the daemon: its observedGeneration the generation of the object this pass was handed, its
    /// lastTransitionTime kept while its status stays, written through the status subresource with
    /// server-side apply (a field manager per type, so one condition never drops another) only when
    /// something changed, and made for this item's lease like every write of [`WorkItem::objects`] (guarded
    /// by the lease's term when the queue follows an election). The answer says whether it wrote
    /// (`changed`) and the lastTransitionTime. The primary's `status.conditions` must be a list map keyed
    /// by type, as Go's `[]metav1.Condition` with `+listType=map` generates it.
    pub async fn set_condition(
        &self,
        kind: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> Result<SetConditionResponse, tonic::Status> {
        let generation = self
            .json()
            .and_then(Result::ok)
            .and_then(|o| o.pointer("/metadata/generation").and_then(serde_json::Value::as_i64))
            .unwrap_or(0);
        let request = SetConditionRequest {
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            condition: Some(Condition {
                r#type: kind.to_owned(),
                status: status.into(),
                reason: reason.to_owned(),
                message: message.to_owned(),
                observed_generation: generation,
            }),
            ..SetConditionRequest::default()
        };
        Ok(self.objects().set_condition(request).await?.into_inner())
    }

    /// Records an event (events.k8s.io/v1) about this item's primary, reported by the queue (its name is
    /// the reporting controller), as kube-rs's `Recorder` and controller-runtime's event recorder do, once in
    /// the daemon for every app of the pod: a repeat within 6 minutes (the same severity, reason, action,
    /// controller and object) is counted on the first one's series, and the queue's events about one object
    /// pass client-go's rate limit (a burst of 25, then one per 5 minutes). `Ok(false)`: the rate limit
    /// dropped it. [`Objects::record_event`] records one about any object.
    pub async fn record_event(
        &self,
        severity: EventSeverity,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<bool, tonic::Status> {
        let request = RecordEventRequest {
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.object.as_ref().map(|o| o.uid.clone()).unwrap_or_default(),
            severity: severity.into(),
            reason: reason.to_owned(),
            action: action.to_owned(),
            note: note.to_owned(),
            reporting_controller: self.queue.clone(),
        };
        Ok(self.objects().record_event(request).await?.into_inner().recorded)
    }
}

/// The shortest REQUEUE delay the daemon takes; a shorter one is sent as this.
pub const MIN_REQUEUE: Duration = Duration::from_millis(1);
/// The longest REQUEUE delay the daemon takes (a day); a longer one is sent as this.
pub const MAX_REQUEUE: Duration = Duration::from_secs(86_400);

/// How a handler's pass over an item ended well: the key is reconciled ([`Action::done`]), or should
/// be handed out again after a while ([`Action::requeue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
    priority: i32,
}

impl Action {
    /// The key is reconciled (DONE): its failures are forgotten, and it comes again when it changes (once
    /// more if it changed during the pass).
    pub fn done() -> Self {
        Self { requeue_after: None, priority: 0 }
    }

    /// Hand the key out again after `after` (REQUEUE), sooner if it changes meanwhile. The daemon takes
    /// [`MIN_REQUEUE`] to [`MAX_REQUEUE`]: a shorter delay (zero included) is sent as the first, a longer
    /// one as the second.
    pub fn requeue(after: Duration) -> Self {
        Self { requeue_after: Some(after), priority: 0 }
    }

    /// The pass this queues (the requeue, or one for a change during this pass) goes at `priority`: a
    /// higher one is handed out first (controller-runtime's `Result.Priority`); default 0.
    #[must_use]
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The requeue delay, `None` for done.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }

    /// The priority of the pass this queues.
    pub fn priority(&self) -> i32 {
        self.priority
    }
}

/// How a handler's pass over an item failed: retry the key after its backoff (RETRY), the default for
/// any error `?` converts; or, made by [`ReconcileError::terminal`], give up until the object or a
/// related one changes (TERMINAL). The text goes to the daemon, which logs it, shows it in
/// `consistd status` and hands it to the next attempt as [`WorkItem::last_error`]: the error and each of
/// its sources joined by ": " ("outer: cause: root cause", as `anyhow` prints `{:#}`, and as `{:#}`
/// prints this error; `{}` is the outermost message only), cut to 4096 bytes.
///
/// Like `anyhow::Error`, it is not a `std::error::Error` itself, and converts (so `?` works in a handler)
/// from whatever converts into a `Box<dyn Error + Send + Sync>`: every `std::error::Error + Send + Sync`,
/// a `String` or `&str`, and an `anyhow::Error` (whose causes become the sources).
/// [`ReconcileError::retry`] and [`ReconcileError::terminal`] take the same.
pub struct ReconcileError {
    terminal: bool,
    error: Box<dyn StdError + Send + Sync>,
}

impl ReconcileError {
    /// A failure worth retrying (RETRY).
    pub fn retry(error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self { terminal: false, error: error.into() }
    }

    /// A failure retrying cannot mend (TERMINAL): the key waits until its object or a related one changes.
    pub fn terminal(error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self { terminal: true, error: error.into() }
    }

    /// Whether this is a terminal failure.
    pub fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// The error itself.
    pub fn into_inner(self) -> Box<dyn StdError + Send + Sync> {
        self.error
    }
}

impl<E: Into<Box<dyn StdError + Send + Sync>>> From<E> for ReconcileError {
    /// A RETRY failure: a `std::error::Error`, a string, or an `anyhow::Error` through `?`.
    fn from(error: E) -> Self {
        Self::retry(error)
    }
}

impl fmt::Display for ReconcileError {
    /// The error's message; with `{:#}`, followed by each of its sources after ": ", the text a
    /// completion carries.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return fmt::Display::fmt(&self.error, f);
        }
        write!(f, "{}", self.error)?;
        let mut source = self.error.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileError").field("terminal", &self.terminal).field("error", &self.error).finish()
    }
}

/// What is called with a refused completion: its lease and the daemon's refusal as a status.
type OnRefused = Arc<dyn Fn(&str, &tonic::Status) + Send + Sync>;

/// Runs a handler on the items of a queue ([`Client::reconcile`] with options): a graceful shutdown
/// and what to do with a completion the daemon refuses.
pub struct Reconciler {
    client: Client,
    spec: QueueSpec,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    on_refused: OnRefused,
}

impl fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler").field("client", &self.client).field("spec", &self.spec).finish_non_exhaustive()
    }
}

impl Reconciler {
    /// A reconciler of `spec`'s queue through `client`.
    pub fn new(client: &Client, spec: ReconcileSpec) -> Self {
        Self {
            client: client.clone(),
            spec: spec.spec,
            shutdown: Box::pin(std::future::pending()),
            on_refused: Arc::new(log_refusal),
        }
    }

    /// When `signal` resolves (e.g. a `CancellationToken`'s `cancelled_owned()`, or Ctrl-C), stop: take no
    /// new items, let the handlers running finish and complete their leases, close the stream and
    /// return `Ok(())`. Dropping the reconciler's future instead stops at once: running handlers are
    /// dropped at their next `.await` and their leases go back to the queue.
    pub fn graceful_shutdown_on(mut self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        self.shutdown = Box::pin(signal);
        self
    }

    /// Calls `f` with the lease and the daemon's refusal when a completion is refused (the lease timed
    /// out, or was granted in a term this pod no longer leads); by default such a refusal is written to
    /// standard error. A refusal never stops the reconciler.
    pub fn on_refused(mut self, f: impl Fn(&str, &tonic::Status) + Send + Sync + 'static) -> Self {
        self.on_refused = Arc::new(f);
        self
    }

    /// Runs `handler` on each item the queue hands out until the daemon refuses the spec (the error it
    /// returns), a graceful shutdown completes (`Ok(())`), or the future is dropped. See
    /// [`Client::reconcile`].
    pub async fn run<F, Fut>(self, mut handler: F) -> Result<(), Error>
    where
        F: FnMut(WorkItem) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    {
        let Self { client, spec, mut shutdown, on_refused } = self;
        let objects = client.objects();
        let mut service = ReconcileServiceClient::new(client.channel()).max_decoding_message_size(crate::MAX_ANSWER);
        let mut running = Running::new(spec.max_leases);
        let mut backoff = Backoff::new();
        let mut stopping = false;
        let mut generation = 0_u64;
        loop {
            generation += 1;
            let (completions, requests) = mpsc::unbounded_channel();
            let _ =
                completions.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec.clone())) });
            let opened = tokio::select! {
                opened = service.reconcile(UnboundedReceiverStream::new(requests)) => Some(opened),
                () = &mut shutdown, if !stopping => None,
            };
            let failure = match opened {
                None => {
                    stopping = true;
                    tonic::Status::cancelled("shutting down")
                }
                Some(Err(status)) => status,
                Some(Ok(response)) => {
                    let mut responses = response.into_inner();
                    loop {
                        tokio::select! {
                            () = &mut shutdown, if !stopping => stopping = true,
                            Some(finished) = running.tasks.join_next(), if !running.tasks.is_empty() => {
                                if let Some(done) = running.finished(finished)
                                    && done.generation == generation
                                {
                                    let _ = completions.send(done.completion());
                                }
                            }
                            message = responses.message() => match message {
                                Ok(Some(message)) => {
                                    backoff.reset();
                                    match message.response {
                                        Some(reconcile_response::Response::Item(item)) if !stopping => {
                                            let item = WorkItem::from_proto(item, &spec, &objects);
                                            running.start(generation, item, &mut handler);
                                        }
                                        Some(reconcile_response::Response::Refused(refused)) => {
                                            let (lease, status) = refusal(refused);
                                            on_refused(&lease, &status);
                                        }
                                        // STARTED, and items that arrive while stopping: those go back to
                                        // the queue when the stream ends.
                                        _ => {}
                                    }
                                }
                                Ok(None) => break tonic::Status::unavailable("the sidecar ended the reconcile stream"),
                                Err(status) => break status,
                            },
                        }
                        if stopping && running.tasks.is_empty() {
                            // Every completion went out: end the stream and let the daemon close it,
                            // reading any refusal of the last ones.
                            drop(completions);
                            let closed = tokio::time::timeout(CLOSE_WAIT, async {
                                while let Ok(Some(message)) = responses.message().await {
                                    if let Some(reconcile_response::Response::Refused(refused)) = message.response {
                                        let (lease, status) = refusal(refused);
                                        on_refused(&lease, &status);
                                    }
                                }
                            });
                            let _ = closed.await;
                            return Ok(());
                        }
                    }
                }
            };
            if stopping {
                // The stream is gone: the handlers still running can complete nothing; let them finish.
                running.drain().await;
                return Ok(());
            }
            if !is_retryable(&failure) {
                return Err(Error::Status(failure));
            }
            // The daemon has returned this stream's leases to the queue: completions of handlers still
            // running for it are dropped (their generation is over).
            tokio::select! {
                () = backoff.wait() => {}
                () = &mut shutdown => stopping = true,
            }
            if stopping {
                running.drain().await;
                return Ok(());
            }
        }
    }
}

impl Client {
    /// Works on the queue `spec` names: runs `handler` on each item the daemon hands out, at most
    /// `max_leases` at once and never two for one key, and completes each item's lease when its
    /// handler ends: `Ok(Action::done())` is DONE, `Ok(Action::requeue(d))` REQUEUE after `d`, an `Err`
    /// RETRY after the key's backoff with the error's text and its sources', and an `Err` made by
    /// [`ReconcileError::terminal`] TERMINAL (the key waits until its object or a related one changes).
    /// A handler that panics is taken as RETRY with the panic's message.
    ///
    /// Runs until the future is dropped (handlers still running are dropped too, and their leases go
    /// back to the queue), or returns the daemon's refusal of the spec (INVALID_ARGUMENT or NOT_FOUND
    /// naming the field, FAILED_PRECONDITION when the queue runs with another spec) or any other error
    /// that is not a lost connection. When the connection to the sidecar is lost it opens the stream
    /// again with the same spec, with backoff; the daemon has returned the old stream's leases to the
    /// queue, so completions of handlers still running for the old stream are dropped, and an item of
    /// the new stream for a key whose old handler still runs waits until it ends. A completion the
    /// daemon refuses is written to standard error and never ends the reconciler
    /// ([`Reconciler::on_refused`] to handle it otherwise; [`Reconciler::graceful_shutdown_on`] to stop
    /// after the running handlers end).
    ///
    /// `handler` is called with each item as it arrives; the future it returns runs in a task of its
    /// own (so handlers run in parallel on a multi-threaded runtime), started once its key is free.
    /// Writes made for the item through [`WorkItem::objects`] name its lease, so the key's next pass
    /// waits until they are seen. In a queue with an election, a write passes [`WorkItem::guard`] to be
    /// made only while this pod still leads in the term the lease was granted in.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use consistd_client::{Action, Client, ReconcileError, ReconcileSpec, proto::{PatchRequest, PatchType}};
    /// # async fn demo() -> Result<(), consistd_client::Error> {
    /// let client = Client::from_env();
    /// // Items are handed out only while this pod leads "greeter" (it campaigns with `client.campaign`).
    /// let spec = ReconcileSpec::new("greeter", "configmaps").namespace("default").max_leases(4).election("greeter", "");
    /// client
    ///     .reconcile(spec, |item| async move {
    ///         if item.deleted {
    ///             return Ok(Action::done());
    ///         }
    ///         let object = item.json().ok_or_else(|| ReconcileError::terminal("no such object"))??;
    ///         if object["data"]["greeting"].is_null() {
    ///             return Err(ReconcileError::terminal("data.greeting is missing"));
    ///         }
    ///         let patch = PatchRequest {
    ///             resource: "configmaps".into(),
    ///             namespace: item.namespace.clone(),
    ///             name: item.name.clone(),
    ///             patch_type: PatchType::Merge.into(),
    ///             patch: br#"{"metadata":{"annotations":{"greeted":"yes"}}}"#.to_vec(),
    ///             // Refused (FAILED_PRECONDITION) once this pod no longer leads in the item's term.
    ///             guard: item.guard.clone(),
    ///             ..Default::default()
    ///         };
    ///         item.objects().patch(patch).await?;
    ///         Ok(Action::requeue(Duration::from_secs(300)))
    ///     })
    ///     .await
    /// # }
    /// ```
    pub fn reconcile<F, Fut>(
        &self,
        spec: ReconcileSpec,
        handler: F,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'static
    where
        F: FnMut(WorkItem) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    {
        Reconciler::new(self, spec).run(handler)
    }
}

/// The handlers running, of this stream and of streams before it.
struct Running {
    tasks: JoinSet<Finished>,
    /// One lock per key with a handler running or waiting: a key's next handler starts after the last.
    keys: HashMap<(String, String), Arc<Mutex<()>>>,
    /// Handlers of every stream together run at most max_leases at once.
    permits: Arc<Semaphore>,
}

/// How one handler ended.
struct Finished {
    generation: u64,
    lease_id: String,
    key: (String, String),
    ended: Result<Result<Action, ReconcileError>, Box<dyn Any + Send>>,
}

impl Running {
    fn new(max_leases: u32) -> Self {
        let permits = usize::try_from(max_leases).unwrap_or(usize::MAX).clamp(1, Semaphore::MAX_PERMITS);
        Self { tasks: JoinSet::new(), keys: HashMap::new(), permits: Arc::new(Semaphore::new(permits)) }
    }

    /// Starts `handler` on `item` in a task once no other handler runs for its key and fewer than
    /// max_leases run.
    fn start<F, Fut>(&mut self, generation: u64, item: WorkItem, handler: &mut F)
    where
        F: FnMut(WorkItem) -> Fut,
        Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    {
        let key = (item.namespace.clone(), item.name.clone());
        let lease_id = item.lease_id.clone();
        let lock = self.keys.entry(key.clone()).or_default().clone();
        let permits = self.permits.clone();
        let work = handler(item);
        self.tasks.spawn(async move {
            let _key = lock.lock_owned().await;
            let _permit = permits.acquire_owned().await;
            let ended = AssertUnwindSafe(work).catch_unwind().await;
            Finished { generation, lease_id, key, ended }
        });
    }

    /// Waits until every handler has ended.
    async fn drain(&mut self) {
        while let Some(finished) = self.tasks.join_next().await {
            self.finished(finished);
        }
    }

    /// Forgets the key lock of a handler that ended, unless another waits on it.
    fn finished(&mut self, joined: Result<Finished, tokio::task::JoinError>) -> Option<Finished> {
        let finished = joined.ok()?;
        if self.keys.get(&finished.key).is_some_and(|lock| Arc::strong_count(lock) == 1) {
            self.keys.remove(&finished.key);
        }
        Some(finished)
    }
}

impl Finished {
    /// The completion of the lease, from how its handler ended.
    fn completion(self) -> ReconcileRequest {
        let priority = self.ended.as_ref().ok().and_then(|e| e.as_ref().ok()).map_or(0, Action::priority);
        let (outcome, requeue_after, error) = match self.ended {
            Ok(Ok(action)) => match action.requeue_after {
                None => (Outcome::Done, None, String::new()),
                Some(after) => (Outcome::Requeue, Some(duration(after.clamp(MIN_REQUEUE, MAX_REQUEUE))), String::new()),
            },
            Ok(Err(e)) if e.is_terminal() => (Outcome::Terminal, None, cut(format!("{e:#}"))),
            Ok(Err(e)) => (Outcome::Retry, None, cut(format!("{e:#}"))),
            Err(panic) => (Outcome::Retry, None, cut(format!("the handler panicked: {}", panic_message(&*panic)))),
        };
        let completion =
            Completion { lease_id: self.lease_id, outcome: outcome.into(), requeue_after, error, priority };
        ReconcileRequest { request: Some(reconcile_request::Request::Complete(completion)) }
    }
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

/// The lease a refusal names and the refusal as the status the daemon would have answered.
fn refusal(refused: CompletionRefused) -> (String, tonic::Status) {
    let refusal = refused.refusal.unwrap_or_default();
    (refused.lease_id, tonic::Status::new(tonic::Code::from(refusal.code), refusal.message))
}

/// The default for a refused completion: a line on standard error (the SDK has no logger of its own).
fn log_refusal(lease: &str, status: &tonic::Status) {
    eprintln!("consistd: the completion of lease {lease} was refused: {}: {}", status.code(), status.message());
}

/// `d` as a protobuf Duration, at most the largest one.
fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or(prost_types::Duration { seconds: i64::MAX, nanos: 999_999_999 })
}

/// `error` cut to [`MAX_ERROR_BYTES`] without splitting a character.
fn cut(error: String) -> String {
    crate::inbox::cut(error, MAX_ERROR_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(ended: Result<Result<Action, ReconcileError>, Box<dyn Any + Send>>) -> Completion {
        let finished = Finished { generation: 1, lease_id: "q.1.1".into(), key: Default::default(), ended };
        match finished.completion().request {
            Some(reconcile_request::Request::Complete(c)) => c,
            other => panic!("not a completion: {other:?}"),
        }
    }

    #[test]
    fn how_the_handler_ends_is_the_completion() {
        let done = ended(Ok(Ok(Action::done())));
        assert_eq!((done.lease_id.as_str(), done.outcome(), done.requeue_after), ("q.1.1", Outcome::Done, None));
        let requeue = ended(Ok(Ok(Action::requeue(Duration::from_millis(300)))));
        assert_eq!(requeue.outcome(), Outcome::Requeue);
        assert_eq!(requeue.requeue_after, Some(prost_types::Duration { seconds: 0, nanos: 300_000_000 }));
        let now = ended(Ok(Ok(Action::requeue(Duration::ZERO))));
        assert_eq!(now.requeue_after, Some(prost_types::Duration { seconds: 0, nanos: 1_000_000 }), "at least 1 ms");
        let long = ended(Ok(Ok(Action::requeue(Duration::from_secs(3 * 86_400)))));
        assert_eq!(long.requeue_after, Some(prost_types::Duration { seconds: 86_400, nanos: 0 }), "at most a day");
        assert_eq!((done.priority, long.priority), (0, 0), "priority 0 unless asked");
        let urgent = ended(Ok(Ok(Action::requeue(Duration::from_secs(1)).with_priority(7))));
        assert_eq!((urgent.outcome(), urgent.priority), (Outcome::Requeue, 7));
        assert_eq!(ended(Ok(Ok(Action::done().with_priority(-2)))).priority, -2);
        let io = std::io::Error::other("the backend said no");
        let retry = ended(Ok(Err(io.into())));
        assert_eq!((retry.outcome(), retry.error.as_str()), (Outcome::Retry, "the backend said no"));
        let terminal = ended(Ok(Err(ReconcileError::terminal("spec.replicas: negative"))));
        assert_eq!((terminal.outcome(), terminal.error.as_str()), (Outcome::Terminal, "spec.replicas: negative"));
        let long = ended(Ok(Err(ReconcileError::retry("€".repeat(2000)))));
        assert_eq!(long.error.len(), MAX_ERROR_BYTES - 1, "cut at a character boundary");
        let panicked = ended(Err(Box::new("index out of bounds")));
        assert_eq!(
            (panicked.outcome(), panicked.error.as_str()),
            (Outcome::Retry, "the handler panicked: index out of bounds")
        );
    }

    /// An error with a message and what caused it.
    #[derive(Debug)]
    struct Caused(String, Option<Box<dyn StdError + Send + Sync>>);

    impl fmt::Display for Caused {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl StdError for Caused {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn StdError + 'static))
        }
    }

    fn caused(message: &str, cause: impl StdError + Send + Sync + 'static) -> Caused {
        Caused(message.into(), Some(Box::new(cause)))
    }

    /// Like `anyhow::Error`: not a `std::error::Error`, but converts into a boxed one.
    struct Report(Caused);

    impl From<Report> for Box<dyn StdError + Send + Sync> {
        fn from(report: Report) -> Self {
            Box::new(report.0)
        }
    }

    #[test]
    fn a_completion_carries_the_error_with_its_sources() {
        let chain = || {
            let root = std::io::Error::other("connection reset by peer");
            caused("patch configmap ns/a", caused("the sidecar is unavailable", root))
        };
        let text = "patch configmap ns/a: the sidecar is unavailable: connection reset by peer";
        let failed = |error: Caused| -> Result<Action, ReconcileError> { Err(error)? };
        let retry = ended(Ok(failed(chain())));
        assert_eq!((retry.outcome(), retry.error.as_str()), (Outcome::Retry, text));
        let terminal = ended(Ok(Err(ReconcileError::terminal(chain()))));
        assert_eq!((terminal.outcome(), terminal.error.as_str()), (Outcome::Terminal, text));
        let error = failed(chain()).expect_err("failed");
        assert_eq!(error.to_string(), "patch configmap ns/a", "{{}} is the outermost message");
        assert_eq!(format!("{error:#}"), text);
        // A type that only converts into a boxed error, as anyhow::Error does, works with `?` too and
        // keeps its sources.
        let reported = || -> Result<Action, ReconcileError> { Err(Report(chain()))? };
        assert_eq!(ended(Ok(reported())).error, text);
        // The whole chain is cut to the limit, at a character boundary.
        let long = caused(&"€".repeat(1000), Caused("€".repeat(1000), None));
        let cut = ended(Ok(Err(long.into()))).error;
        assert_eq!(cut.len(), MAX_ERROR_BYTES - 2, "cut at a character boundary");
        assert!(cut.starts_with(&format!("{}: €", "€".repeat(1000))), "the source is in the cut text");
    }

    #[tokio::test]
    async fn an_item_of_a_queue_with_an_election_carries_the_guard_of_its_term() {
        let objects = crate::Client::new("/nonexistent/consistd.sock").objects();
        let granted =
            crate::proto::WorkItem { namespace: "ns".into(), name: "a".into(), term: 7, ..Default::default() };
        let spec = |election: Option<ElectionRef>| QueueSpec { election, ..QueueSpec::default() };
        let own = ElectionRef { election: "leader".into(), namespace: String::new() };
        let item = WorkItem::from_proto(granted.clone(), &spec(Some(own)), &objects);
        assert_eq!(
            item.guard,
            Some(WriteGuard { election: "leader".into(), namespace: String::new(), term: 7 }),
            "the spec's election, its empty namespace (the daemon's own) and the item's term"
        );
        let elsewhere = ElectionRef { election: "leader".into(), namespace: "leases".into() };
        let item = WorkItem::from_proto(granted.clone(), &spec(Some(elsewhere)), &objects);
        assert_eq!(item.guard.map(|g| (g.namespace, g.term)), Some(("leases".into(), 7)));
        assert_eq!(WorkItem::from_proto(granted, &spec(None), &objects).guard, None, "no election, no guard");
    }

    #[test]
    fn the_spec_defaults_to_one_lease_and_builds_the_queue_spec() {
        let spec = ReconcileSpec::new("web", "configmaps")
            .namespace("ns")
            .labels("app=web")
            .fields("metadata.name=a")
            .related(Related::by_label("secrets", "owner").namespace("ns"))
            .retry_backoff(Duration::from_millis(200), Duration::from_secs(10))
            .election("leader", "");
        assert_eq!(ReconcileSpec::new("q", "pods").as_proto().max_leases, 1);
        let proto = QueueSpec::from(spec);
        let primary = proto.primary.expect("primary");
        assert_eq!((primary.resource.as_str(), primary.namespace.as_str()), ("configmaps", "ns"));
        assert_eq!((primary.label_selector.as_str(), primary.field_selector.as_str()), ("app=web", "metadata.name=a"));
        assert_eq!(proto.related[0].maps_by, Some(MapsBy::Label("owner".into())));
        let retry = proto.retry.expect("retry");
        assert_eq!(retry.base_delay, Some(prost_types::Duration { seconds: 0, nanos: 200_000_000 }));
        assert_eq!(proto.election.map(|e| e.election), Some("leader".into()));
        assert!(!proto.sharded, "not sharded unless asked");
        assert_eq!(proto.finalizer, "", "no finalizer unless asked");
    }

    #[tokio::test]
    async fn a_finalizer_goes_on_the_spec_and_a_finalize_pass_shows_on_its_item() {
        let proto = QueueSpec::from(ReconcileSpec::new("web", "configmaps").finalizer("example.com/cleanup"));
        assert_eq!(proto.finalizer, "example.com/cleanup");
        let objects = crate::Client::new("/nonexistent/consistd.sock").objects();
        let finalize = crate::proto::WorkItem { finalizing: true, ..Default::default() };
        let spec = QueueSpec::default();
        assert!(WorkItem::from_proto(finalize, &spec, &objects).finalizing);
        assert!(!WorkItem::from_proto(crate::proto::WorkItem::default(), &spec, &objects).finalizing);
    }

    #[test]
    fn the_parts_whose_changes_queue_a_pass_go_on_the_query_they_are_asked_of() {
        let proto = QueueSpec::from(
            ReconcileSpec::new("web", "deployments.apps")
                .only_changes_of(Changed::Generation)
                .only_changes_of(Changed::Labels)
                .related(Related::owned("pods").only_changes_of(Changed::Annotations))
                .related(Related::by_label("secrets", "owner")),
        );
        let filter =
            |q: Option<&ObjectQuery>| q.and_then(|q| q.changes).map(|c| (c.generation, c.labels, c.annotations));
        assert_eq!(filter(proto.primary.as_ref()), Some((true, true, false)));
        assert_eq!(filter(proto.related[0].query.as_ref()), Some((false, false, true)));
        assert_eq!(filter(proto.related[1].query.as_ref()), None, "unnamed: every change");
    }

    #[test]
    fn a_sharded_queue_sends_sharded_with_its_election() {
        let proto = QueueSpec::from(ReconcileSpec::new("web", "configmaps").election("leader", "leases").sharded());
        assert!(proto.sharded);
        assert_eq!(proto.election, Some(ElectionRef { election: "leader".into(), namespace: "leases".into() }));
        // Without an election the spec goes as it is: the daemon refuses it, naming spec.sharded.
        let alone = QueueSpec::from(ReconcileSpec::new("web", "configmaps").sharded());
        assert!(alone.sharded && alone.election.is_none());
        assert_eq!(alone.shard_by(), crate::proto::ShardBy::Unspecified, "by key unless asked");
        let by_namespace = QueueSpec::from(
            ReconcileSpec::new("web", "configmaps")
                .election("leader", "")
                .sharded()
                .shard_by(crate::proto::ShardBy::Namespace),
        );
        assert_eq!(by_namespace.shard_by(), crate::proto::ShardBy::Namespace);
        assert!(by_namespace.sharded, "the other options kept");
    }

    #[test]
    fn views_go_on_the_query_they_are_asked_of() {
        let spec = ReconcileSpec::new("web", "configmaps")
            .project(["data.field", "metadata.labels"])
            .related(Related::by_label("secrets", "owner").metadata_only())
            .related(Related::by_field("pods", "spec.configMapName").project(["status.phase"]));
        let proto = QueueSpec::from(spec);
        let view = |q: Option<&ObjectQuery>| q.and_then(|q| q.view.clone()).expect("a view");
        assert_eq!(view(proto.primary.as_ref()).fields, ["data.field", "metadata.labels"]);
        assert!(view(proto.related[0].query.as_ref()).metadata_only);
        assert_eq!(view(proto.related[1].query.as_ref()).fields, ["status.phase"]);
        assert_eq!(QueueSpec::from(ReconcileSpec::new("q", "pods")).primary.and_then(|p| p.view), None, "unset: whole");
    }
}
