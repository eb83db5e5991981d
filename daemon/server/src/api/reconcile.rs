//! ReconcileService: checks the queue's spec (naming the field that is wrong), joins the queue, streams
//! its work items, and takes completions, refusing a bad one in the stream while the stream goes on.

use std::{sync::Arc, time::Duration};

use consistd_cluster::{
    leadership::Leadership,
    reconcile::{
        DEFAULT_LEASE_TIMEOUT, ObjectQuery, QueueSpec, Reconciler, Relation, Work, filter::ChangeFilter, keys::MapsBy,
        limiter::RetryPolicy, queue::Completion, ring::ShardBy,
    },
    watch::{object::Obj, view::dot_path},
};
use consistd_core::{config::Service, names, tasks::Tasks};
use consistd_proto::v1::{self as pb, reconcile_service_server::ReconcileService};
use futures::StreamExt as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use super::{
    ResponseStream,
    access::{Access, Ask, Resource},
    caller::Caller,
    status,
};

/// The most leases one stream may hold.
const MAX_LEASES: u32 = 10_000;
/// The longest REQUEUE delay, lease timeout or retry delay accepted.
const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest error text a completion may carry.
const MAX_ERROR_BYTES: usize = 4096;
/// Refusals buffered for the app; reading its completions waits while they are unread.
const REFUSALS: usize = 64;

/// The ReconcileService implementation.
#[derive(Debug, Clone)]
pub(crate) struct ReconcileApi {
    reconciler: Arc<Reconciler>,
    leadership: Arc<Leadership>,
    access: Access,
    /// The serving group: per-call tasks run in it; its stop signal ends open streams.
    tasks: Tasks,
}

impl ReconcileApi {
    pub(crate) fn new(reconciler: Arc<Reconciler>, leadership: Arc<Leadership>, access: Access, tasks: Tasks) -> Self {
        Self { reconciler, leadership, access, tasks }
    }

    /// A queue's queries are watches: access rules for WatchService's `watch` apply to each.
    async fn allowed(&self, caller: &Caller, spec: &QueueSpec) -> Result<(), Status> {
        let queries = std::iter::once(&spec.primary).chain(spec.related.iter().map(|r| &r.query));
        for q in queries {
            let namespace = (!q.namespace.is_empty()).then_some(q.namespace.as_str());
            let ask = Ask { service: Service::Watch, verb: "watch", resource: Resource::Kube(&q.resource), namespace };
            self.access.check(caller, ask).await?;
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl ReconcileService for ReconcileApi {
    type ReconcileStream = ResponseStream<pb::ReconcileResponse>;

    async fn reconcile(
        &self,
        request: Request<Streaming<pb::ReconcileRequest>>,
    ) -> Result<Response<Self::ReconcileStream>, Status> {
        let caller = Caller::from_request(&request);
        let mut requests = request.into_inner();
        let first = requests
            .message()
            .await?
            .ok_or_else(|| status::invalid_argument("spec", "the stream ended before its first message, the spec"))?;
        let Some(pb::reconcile_request::Request::Spec(spec)) = first.request else {
            return Err(status::invalid_argument("spec", "the first message must be the queue's spec"));
        };
        let (spec, capacity) = self.spec(spec)?;
        self.allowed(&caller, &spec).await?;
        let (worker, items) = self.reconciler.open(spec, capacity).await.map_err(status::reconcile_error)?;
        let started = pb::ReconcileResponse {
            response: Some(pb::reconcile_response::Response::Started(pb::QueueStarted {
                name: worker.name().to_owned(),
                comparable_resource_versions: worker.comparable,
            })),
        };
        let (refusals, refused) = mpsc::channel(REFUSALS);
        self.tasks.spawn(async move {
            // The worker lives as long as the app sends: when its stream ends, its leases go back.
            while let Ok(Some(request)) = requests.message().await {
                let answer = match request.request {
                    Some(pb::reconcile_request::Request::Complete(c)) => {
                        let lease_id = c.lease_id.clone();
                        let priority = c.priority;
                        let done = match completion(c) {
                            Ok(outcome) => worker
                                .complete(lease_id.clone(), outcome, priority)
                                .await
                                .map_err(status::reconcile_error),
                            Err(refused) => Err(refused),
                        };
                        done.err().map(|refused| (lease_id, refused))
                    }
                    Some(pb::reconcile_request::Request::Spec(_)) => Some((
                        String::new(),
                        status::failed_precondition(
                            "spec",
                            "this stream already has its queue; send the spec once, first",
                        ),
                    )),
                    None => {
                        Some((String::new(), status::invalid_argument("request", "must be a spec or a completion")))
                    }
                };
                if let Some((lease_id, refusal)) = answer {
                    let refused = pb::CompletionRefused { lease_id, refusal: Some(status::refusal(&refusal)) };
                    let response =
                        pb::ReconcileResponse { response: Some(pb::reconcile_response::Response::Refused(refused)) };
                    if refusals.send(response).await.is_err() {
                        break;
                    }
                }
            }
            drop(worker);
        });
        // Work, until the queue ends with a status (one of its watches past the memory budget): tonic ends
        // the stream with the first error.
        let items = UnboundedReceiverStream::new(items).map(|handed| {
            handed
                .map(|work| pb::ReconcileResponse {
                    response: Some(pb::reconcile_response::Response::Item(work_item(work))),
                })
                .map_err(status::reconcile_error)
        });
        let answers = futures::stream::once(async move { Ok(started) })
            .chain(futures::stream::select(items, ReceiverStream::new(refused).map(Ok)));
        Ok(Response::new(super::answers_until_shutdown(answers, self.tasks.signal(), "ReconcileService.Reconcile")))
    }
}

impl ReconcileApi {
    /// Checks a spec, naming the field that is wrong; returns it and the stream's lease capacity.
    fn spec(&self, s: pb::QueueSpec) -> Result<(QueueSpec, usize), Status> {
        if !names::is_namespace_name(&s.name) {
            return Err(status::invalid_argument(
                "spec.name",
                format!("{:?} is not a DNS label (lowercase letters, digits and '-', at most 63)", s.name),
            ));
        }
        let mut primary = query("spec.primary", s.primary)?;
        let finalizer = match s.finalizer {
            f if f.is_empty() => None,
            f if names::is_prefixed_qualified_name(&f) => Some(f),
            f => {
                return Err(status::invalid_argument(
                    "spec.finalizer",
                    format!(
                        "{f:?} is not a finalizer name: a DNS subdomain prefix, '/', and a name of at most 63 letters, digits, '-', '_' and '.' (\"example.com/cleanup\")"
                    ),
                ));
            }
        };
        if finalizer.is_some() {
            // The queue reads the primary's finalizers to know which pass an object calls for.
            primary.view.keep(&["metadata".to_owned(), "finalizers".to_owned()]);
        }
        let related = s
            .related
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let field = format!("spec.related[{i}]");
                let maps_by = maps_by(&field, r.maps_by)?;
                let mut query = query(&format!("{field}.query"), r.query)?;
                // A projection keeps what the mapping reads; metadata alone may not have it.
                let reads = maps_by.reads();
                if !query.view.keeps(&reads) {
                    if query.view.metadata_only() {
                        return Err(status::invalid_argument(
                            &format!("{field}.query.view.metadata_only"),
                            format!("maps_by reads {}, which metadata alone does not have", reads.join(".")),
                        ));
                    }
                    query.view.keep(&reads);
                }
                Ok(Relation { query, maps_by, priority: r.priority })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        if s.max_leases == 0 || s.max_leases > MAX_LEASES {
            return Err(status::invalid_argument(
                "spec.max_leases",
                format!("must be between 1 and {MAX_LEASES}: how many keys this stream may work on at once"),
            ));
        }
        let retry = retry_policy(s.retry)?;
        let lease_timeout = match s.lease_timeout {
            None => DEFAULT_LEASE_TIMEOUT,
            Some(d) => duration("spec.lease_timeout", d, Duration::from_secs(1))?,
        };
        let election = match s.election {
            None => None,
            Some(e) if e.election.is_empty() => {
                return Err(status::invalid_argument("spec.election.election", "must not be empty"));
            }
            Some(e) => Some(self.leadership.key(&e.election, &e.namespace).map_err(status::leadership_error)?),
        };
        if s.sharded && election.is_none() {
            return Err(status::invalid_argument(
                "spec.sharded",
                "a sharded queue needs spec.election: the election group whose members share its keys",
            ));
        }
        let shard_by = match pb::ShardBy::try_from(s.shard_by) {
            Err(_) => {
                return Err(status::invalid_argument("spec.shard_by", format!("{} is not a ShardBy", s.shard_by)));
            }
            Ok(pb::ShardBy::Unspecified | pb::ShardBy::Key) => ShardBy::Key,
            Ok(pb::ShardBy::Namespace) if !s.sharded => {
                return Err(status::invalid_argument(
                    "spec.shard_by",
                    "only a sharded queue (spec.sharded) is sharded by anything",
                ));
            }
            Ok(pb::ShardBy::Namespace) if !primary.namespace.is_empty() => {
                return Err(status::invalid_argument(
                    "spec.shard_by",
                    format!(
                        "spec.primary.namespace names one namespace ({}): sharded by namespace, all its keys would be one member's",
                        primary.namespace
                    ),
                ));
            }
            Ok(pb::ShardBy::Namespace) => ShardBy::Namespace,
        };
        let spec = QueueSpec {
            name: s.name,
            primary,
            related,
            retry,
            lease_timeout,
            election,
            sharded: s.sharded,
            shard_by,
            finalizer,
        };
        Ok((spec, usize::try_from(s.max_leases).unwrap_or(usize::MAX)))
    }
}

/// Checks one query of a spec.
fn query(field: &str, q: Option<pb::ObjectQuery>) -> Result<ObjectQuery, Status> {
    let q = q.ok_or_else(|| status::invalid_argument(field, "must be set"))?;
    if q.resource.is_empty() {
        return Err(status::invalid_argument(&format!("{field}.resource"), "must not be empty"));
    }
    if !q.namespace.is_empty() && !names::is_namespace_name(&q.namespace) {
        return Err(status::invalid_argument(
            &format!("{field}.namespace"),
            format!("{:?} is not a valid namespace name", q.namespace),
        ));
    }
    let mut view = super::watch::view(&format!("{field}.view"), q.view.as_ref())?;
    let changes =
        q.changes.map(|c| ChangeFilter { generation: c.generation, labels: c.labels, annotations: c.annotations });
    if let Some(changes) = &changes {
        if !changes.any() {
            return Err(status::invalid_argument(
                &format!("{field}.changes"),
                "names no part: set generation, labels or annotations (unset queues every change)",
            ));
        }
        // A projection keeps what the filter compares (all of it is metadata, which every other view keeps).
        for path in changes.reads() {
            view.keep(&path);
        }
    }
    Ok(ObjectQuery {
        resource: q.resource,
        namespace: q.namespace,
        label_selector: q.label_selector,
        field_selector: q.field_selector,
        view,
        changes,
    })
}

/// How a related query names its primary.
fn maps_by(field: &str, m: Option<pb::related_query::MapsBy>) -> Result<MapsBy, Status> {
    use pb::related_query::MapsBy as M;
    let named = |what: &str, value: String| {
        if value.is_empty() {
            Err(status::invalid_argument(&format!("{field}.{what}"), "must not be empty"))
        } else {
            Ok(value)
        }
    };
    match m {
        Some(M::ControllerOwner(true)) => Ok(MapsBy::ControllerOwner),
        Some(M::Label(label)) => Ok(MapsBy::Label(named("label", label)?)),
        Some(M::Annotation(annotation)) => Ok(MapsBy::Annotation(named("annotation", annotation)?)),
        Some(M::Field(path)) => {
            let path = named("field", path)?;
            let parts = dot_path(&path).ok_or_else(|| {
                status::invalid_argument(&format!("{field}.field"), format!("{path:?} has an empty part"))
            })?;
            Ok(MapsBy::Field(parts))
        }
        Some(M::ControllerOwner(false)) | None => Err(status::invalid_argument(
            &format!("{field}.maps_by"),
            "must say how a related object names its primary: controller_owner, label, annotation or field",
        )),
    }
}

/// A retry policy with client-go's defaults for what is unset.
fn retry_policy(r: Option<pb::RetryPolicy>) -> Result<RetryPolicy, Status> {
    let defaults = RetryPolicy::default();
    let Some(r) = r else { return Ok(defaults) };
    let base_delay = match r.base_delay {
        None => defaults.base_delay,
        Some(d) => duration("spec.retry.base_delay", d, Duration::from_millis(1))?,
    };
    let max_delay = match r.max_delay {
        None => defaults.max_delay.max(base_delay),
        Some(d) => duration("spec.retry.max_delay", d, base_delay)?,
    };
    if !(r.rate >= 0.0 && r.rate.is_finite()) {
        return Err(status::invalid_argument("spec.retry.rate", "must be a number of retries per second, 0 or more"));
    }
    let rate = if r.rate == 0.0 { defaults.rate } else { r.rate };
    let burst = if r.burst == 0 { defaults.burst } else { r.burst };
    Ok(RetryPolicy { base_delay, max_delay, rate, burst })
}

/// A duration between `min` and a day.
fn duration(field: &str, d: prost_types::Duration, min: Duration) -> Result<Duration, Status> {
    Duration::try_from(d).ok().filter(|d| *d >= min && *d <= MAX_DELAY).ok_or_else(|| {
        status::invalid_argument(field, format!("must be between {} and 24h", humantime::format_duration(min)))
    })
}

/// Checks a completion, naming the field that is wrong.
fn completion(c: pb::Completion) -> Result<Completion, Status> {
    if c.lease_id.is_empty() {
        return Err(status::invalid_argument("complete.lease_id", "must not be empty"));
    }
    if c.error.len() > MAX_ERROR_BYTES {
        return Err(status::invalid_argument("complete.error", format!("is longer than {MAX_ERROR_BYTES} bytes")));
    }
    if c.requeue_after.is_some() && c.outcome != pb::Outcome::Requeue as i32 {
        return Err(status::invalid_argument("complete.requeue_after", "only goes with OUTCOME_REQUEUE"));
    }
    match pb::Outcome::try_from(c.outcome) {
        Ok(pb::Outcome::Done) => Ok(Completion::Done),
        Ok(pb::Outcome::Requeue) => {
            let after = c
                .requeue_after
                .ok_or_else(|| status::invalid_argument("complete.requeue_after", "must be set for OUTCOME_REQUEUE"))?;
            Ok(Completion::Requeue(duration("complete.requeue_after", after, Duration::from_millis(1))?))
        }
        Ok(pb::Outcome::Retry) => Ok(Completion::Retry(c.error)),
        Ok(pb::Outcome::Terminal) => Ok(Completion::Terminal(c.error)),
        Ok(pb::Outcome::Unspecified) => Err(status::invalid_argument(
            "complete.outcome",
            "must be OUTCOME_DONE, OUTCOME_REQUEUE, OUTCOME_RETRY or OUTCOME_TERMINAL",
        )),
        Err(_) => Err(status::invalid_argument("complete.outcome", format!("unknown value {}", c.outcome))),
    }
}

/// A lease as the protocol says it.
fn work_item(w: Work) -> pb::WorkItem {
    let consistency = if w.timed_out { pb::Consistency::TimedOut } else { pb::Consistency::Consistent };
    pb::WorkItem {
        lease_id: w.lease_id,
        namespace: w.key.namespace,
        name: w.key.name,
        object: w.object.map(Obj::into_proto),
        deleted: w.deleted,
        consistency: consistency.into(),
        attempt: w.attempt,
        term: w.term,
        expires_at: Some(w.expires_at.into()),
        last_error: w.last_error.unwrap_or_default(),
        finalizing: w.finalizing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(s: Status) -> String {
        s.message().split(':').next().unwrap_or_default().to_owned()
    }

    #[test]
    fn completions_are_checked_and_their_fields_named() {
        let c = |outcome: pb::Outcome| pb::Completion {
            lease_id: "q.1.1".into(),
            outcome: outcome.into(),
            ..Default::default()
        };
        assert_eq!(completion(c(pb::Outcome::Done)).expect("valid"), Completion::Done);
        assert_eq!(field(completion(c(pb::Outcome::Unspecified)).expect_err("refused")), "complete.outcome");
        assert_eq!(field(completion(c(pb::Outcome::Requeue)).expect_err("refused")), "complete.requeue_after");
        let mut no_id = c(pb::Outcome::Done);
        no_id.lease_id.clear();
        assert_eq!(field(completion(no_id).expect_err("refused")), "complete.lease_id");
        let mut long = c(pb::Outcome::Retry);
        long.error = "x".repeat(MAX_ERROR_BYTES + 1);
        assert_eq!(field(completion(long).expect_err("refused")), "complete.error");
        let mut requeue = c(pb::Outcome::Requeue);
        requeue.requeue_after = Some(prost_types::Duration { seconds: 2, nanos: 0 });
        assert_eq!(completion(requeue).expect("valid"), Completion::Requeue(Duration::from_secs(2)));
    }

    #[test]
    fn retry_policies_default_to_client_go_and_refuse_nonsense() {
        assert_eq!(retry_policy(None).expect("default"), RetryPolicy::default());
        let bad_rate = pb::RetryPolicy { rate: -1.0, ..Default::default() };
        assert_eq!(field(retry_policy(Some(bad_rate)).expect_err("refused")), "spec.retry.rate");
        let short_max = pb::RetryPolicy {
            base_delay: Some(prost_types::Duration { seconds: 2, nanos: 0 }),
            max_delay: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
            ..Default::default()
        };
        assert_eq!(field(retry_policy(Some(short_max)).expect_err("refused")), "spec.retry.max_delay");
    }

    #[test]
    fn a_related_query_must_say_how_it_names_its_primary() {
        use pb::related_query::MapsBy as M;
        assert_eq!(field(maps_by("spec.related[0]", None).expect_err("refused")), "spec.related[0].maps_by");
        assert_eq!(field(maps_by("r", Some(M::Label(String::new()))).expect_err("refused")), "r.label");
        assert_eq!(field(maps_by("r", Some(M::Field("spec..x".into()))).expect_err("refused")), "r.field");
        assert_eq!(maps_by("r", Some(M::ControllerOwner(true))).expect("valid"), MapsBy::ControllerOwner);
    }
}
