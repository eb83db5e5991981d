//! ObjectsService: validates each request, naming the field that is wrong, and calls the objects module.

use std::sync::Arc;

use consistd_cluster::{
    fencing::{Claim, FencedBy},
    leadership::Leadership,
    objects::{
        ObjectRef, Objects, PatchKind, Source, Updated,
        condition::{self, Condition},
    },
    reconcile::Reconciler,
    watch::object::Obj,
};
use consistd_core::config::Service;
use consistd_proto::v1::{self as pb, objects_service_server::ObjectsService};
use kube::{
    api::{Preconditions, PropagationPolicy},
    runtime::events::{Event, EventType},
};
use tonic::{Request, Response, Status};

use super::{
    access::{Access, Ask, Resource},
    caller::Caller,
    guard, status,
};

/// The resource RecordEvent writes, as access rules name it.
const EVENTS: &str = "events.events.k8s.io";
/// The reporting controller of an event that names none.
const DEFAULT_REPORTING_CONTROLLER: &str = "consistd";

/// The ObjectsService implementation.
#[derive(Debug, Clone)]
pub(crate) struct ObjectsApi {
    objects: Objects,
    leadership: Arc<Leadership>,
    reconciler: Arc<Reconciler>,
    access: Access,
}

impl ObjectsApi {
    pub(crate) fn new(
        objects: Objects,
        leadership: Arc<Leadership>,
        reconciler: Arc<Reconciler>,
        access: Access,
    ) -> Self {
        Self { objects, leadership, reconciler, access }
    }

    /// Tells the reconcile queue of `lease` (a write request's `reconcile_lease`) that a write for it
    /// produced `obj`, so the key's next lease waits for the watch to show it.
    async fn made_for(&self, lease: &str, target: &ObjectRef, obj: &Arc<Obj>) {
        if !lease.is_empty() {
            self.reconciler.wrote(lease, &target.resource, obj).await;
        }
    }

    /// As [`Self::made_for`], for every state an update or patch left its object in: a fencing stamp
    /// written first is the lease's doing too, and its watch event queues no pass either.
    async fn updated_for(&self, lease: &str, target: &ObjectRef, updated: &Updated) {
        for state in updated.states() {
            self.made_for(lease, target, state).await;
        }
    }

    /// Refuses `verb` on `target` unless access.rules grant it to `caller`.
    async fn allowed(&self, caller: &Caller, verb: &'static str, target: &ObjectRef) -> Result<(), Status> {
        let namespace = (!target.namespace.is_empty()).then_some(target.namespace.as_str());
        let ask = Ask { service: Service::Objects, verb, resource: Resource::Kube(&target.resource), namespace };
        self.access.check(caller, ask).await
    }

    /// The claim a write carries: its guard's, checked as [`guard::claim`] does; else, for a write
    /// naming a lease of a queue that follows an election, the lease's term, checked the same way: the
    /// daemon guards a work item's writes itself, whatever the SDK sent. A sharded queue's lease carries
    /// its slot's claim, and a guard naming the queue's election in the lease's epoch is the item's guard
    /// (what the SDKs send), which that claim stands for. A write naming a lease that is not held is
    /// refused, naming `reconcile_lease`.
    async fn claim(&self, guard: Option<&pb::WriteGuard>, lease: &str) -> Result<Option<Claim>, Status> {
        if lease.is_empty() {
            return guard::claim(&self.leadership, guard);
        }
        let leased = self.reconciler.lease_claim(lease).await.map_err(status::reconcile_error)?;
        let item_guard = |g: &pb::WriteGuard| {
            leased.item_guard.as_ref().is_some_and(|(election, epoch)| {
                self.leadership.key(&g.election, &g.namespace).is_ok_and(|k| k == *election) && g.term == *epoch
            })
        };
        if guard.is_some_and(item_guard) {
            return Ok(leased.claim);
        }
        let guarded = guard::claim(&self.leadership, guard)?;
        Ok(guarded.or(leased.claim))
    }
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl ObjectsService for ObjectsApi {
    async fn get(&self, request: Request<pb::GetRequest>) -> Answer<pb::GetResponse> {
        let caller = Caller::from_request(&request);
        let r = request.into_inner();
        let target = target(&r.resource, &r.namespace, Some(&r.name), "")?;
        self.allowed(&caller, "get", &target).await?;
        let (obj, source) = self.objects.get(&target, r.read_your_writes).await.map_err(status::objects_error)?;
        Ok(Response::new(pb::GetResponse { object: Some(obj.into_proto()), source: read_source(source).into() }))
    }

    async fn list(&self, request: Request<pb::ListRequest>) -> Answer<pb::ListResponse> {
        let caller = Caller::from_request(&request);
        let r = request.into_inner();
        let target = target(&r.resource, &r.namespace, None, "")?;
        self.allowed(&caller, "list", &target).await?;
        let (objects, resource_version, source) = self
            .objects
            .list(&target, &r.label_selector, &r.field_selector, r.read_your_writes)
            .await
            .map_err(status::objects_error)?;
        Ok(Response::new(pb::ListResponse {
            objects: objects.into_iter().map(Obj::into_proto).collect(),
            resource_version,
            source: read_source(source).into(),
        }))
    }

    async fn create(&self, request: Request<pb::CreateRequest>) -> Answer<pb::CreateResponse> {
        let caller = Caller::from_request(&request);
        let r = request.into_inner();
        let target = target(&r.resource, &r.namespace, None, "")?;
        self.allowed(&caller, "create", &target).await?;
        let fence = self.claim(r.guard.as_ref(), &r.reconcile_lease).await?;
        json_object("object", &r.object)?;
        let (obj, fenced) = self
            .objects
            .create(&target, r.object, &r.field_manager, fence.as_ref())
            .await
            .map_err(status::objects_error)?;
        self.made_for(&r.reconcile_lease, &target, &obj).await;
        Ok(Response::new(pb::CreateResponse { object: Some(obj.into_proto()), fence: fence_of(fenced).into() }))
    }

    async fn update(&self, request: Request<pb::UpdateRequest>) -> Answer<pb::UpdateResponse> {
        let caller = Caller::from_request(&request);
        let r = request.into_inner();
        let target = target(&r.resource, &r.namespace, Some(&r.name), &r.subresource)?;
        self.allowed(&caller, "update", &target).await?;
        let fence = self.claim(r.guard.as_ref(), &r.reconcile_lease).await?;
        json_object("object", &r.object)?;
        let updated = self
            .objects
            .update(&target, r.object, &r.field_manager, fence.as_ref(), r.send_unchanged)
            .await
            .map_err(status::objects_error)?;
        if !updated.unchanged {
            self.updated_for(&r.reconcile_lease, &target, &updated).await;
        }
        Ok(Response::new(pb::UpdateResponse {
            object: Some(updated.object.into_proto()),
            fence: fence_of(updated.fenced).into(),
            unchanged: updated.unchanged,
        }))
    }

    async fn patch(&self, request: Request<pb::PatchRequest>) -> Answer<pb::PatchResponse> {
        let caller = Caller::from_request(&request);
        let r = request.into_inner();
        let target = target(&r.resource, &r.namespace, Some(&r.name), &r.subresource)?;
        self.allowed(&caller, "patch", &target).await?;
        let fence = self.claim(r.guard.as_ref(), &r.reconcile_lease).await?;
        let kind = match pb::PatchType::try_from(r.patch_type) {
            Ok(pb::PatchType::Json) => PatchKind::Json,
            Ok(pb::PatchType::Merge) => PatchKind::Merge,
            Ok(pb::PatchType::Strategic) => PatchKind::Strategic,
            Ok(pb::PatchType::Apply) => PatchKind::Apply { force: r.force },
            Ok(pb::PatchType::Unspecified) => {
                return Err(status::invalid_argument("patch_type", "must be JSON, MERGE, STRATEGIC or APPLY"));
            }
            Err(_) => return Err(status::invalid_argument("patch_type", format!("unknown value {}", r.patch_type))),
        };
        if r.force && !matches!(kind, PatchKind::Apply { .. }) {
            return Err(status::invalid_argument("force", "only applies to PATCH_TYPE_APPLY"));
        }
        let patch: serde_json::Value = serde_json::from_slice(&r.patch)
            .map_err(|e| status::invalid_argument("patch", format!("not JSON: {e}")))?;
        let shape_ok = match kind {
            PatchKind::Json => patch.is_array(),
            _ => patch.is_object(),
        };
        if !shape_ok {
            let want = if kind == PatchKind::Json { "a JSON array of operations" } else { "a JSON object" };
            return Err(status::invalid_argument("patch", format!("must be {want}")));
        }
        let patched = self
            .objects
            .patch(&target, kind, patch, &r.field_manager, fence.as_ref(), r.send_unchanged)
            .await
            .map_err(status::objects_error)?;
        if !patched.unchanged {
            self.updated_for(&r.reconcile_lease, &target, &patched).await;
        }
        Ok(Response::new(pb::PatchResponse {
            object: Some(patched.object.into_proto()),
            fence: fence_of(patched.fenced).into(),
            unchanged: patched.unchanged,
        }))
    }

    async fn delete(&self, request: Request<pb::DeleteRequest>) -> Answer<pb::DeleteResponse> {
        let caller = Caller::from_request(&request);
        let r = request.into_inner();
        let target = target(&r.resource, &r.namespace, Some(&r.name), "")?;
        self.allowed(&caller, "delete", &target).await?;
        let fence = self.claim(r.guard.as_ref(), &r.reconcile_lease).await?;
        let propagation = match pb::PropagationPolicy::try_from(r.propagation_policy) {
            Ok(pb::PropagationPolicy::Unspecified) => None,
            Ok(pb::PropagationPolicy::Orphan) => Some(PropagationPolicy::Orphan),
            Ok(pb::PropagationPolicy::Background) => Some(PropagationPolicy::Background),
            Ok(pb::PropagationPolicy::Foreground) => Some(PropagationPolicy::Foreground),
            Err(_) => {
                return Err(status::invalid_argument(
                    "propagation_policy",
                    format!("unknown value {}", r.propagation_policy),
                ));
            }
        };
        let preconditions = Preconditions {
            uid: non_empty(r.precondition_uid),
            resource_version: non_empty(r.precondition_resource_version),
        };
        let (obj, fenced) = self
            .objects
            .delete(&target, preconditions, propagation, fence.as_ref())
            .await
            .map_err(status::objects_error)?;
        if let Some(obj) = &obj {
            self.made_for(&r.reconcile_lease, &target, obj).await;
        }
        Ok(Response::new(pb::DeleteResponse { object: obj.map(Obj::into_proto), fence: fence_of(fenced).into() }))
    }

    async fn record_event(&self, request: Request<pb::RecordEventRequest>) -> Answer<pb::RecordEventResponse> {
        let caller = Caller::from_request(&request);
        let r = request.into_inner();
        let target = target(&r.resource, &r.namespace, Some(&r.name), "")?;
        let (event, controller) = event(&r)?;
        // The app writes an Event, in the object's namespace ("default" for a cluster-scoped one): access rules
        // for creating events there apply.
        let namespace = Some(if r.namespace.is_empty() { "default" } else { r.namespace.as_str() });
        let ask = Ask { service: Service::Objects, verb: "create", resource: Resource::Kube(EVENTS), namespace };
        self.access.check(&caller, ask).await?;
        let recorded =
            self.objects.record_event(&target, &r.uid, &controller, &event).await.map_err(status::objects_error)?;
        Ok(Response::new(pb::RecordEventResponse { recorded }))
    }

    async fn set_condition(&self, request: Request<pb::SetConditionRequest>) -> Answer<pb::SetConditionResponse> {
        let caller = Caller::from_request(&request);
        let r = request.into_inner();
        let target = target(&r.resource, &r.namespace, Some(&r.name), "status")?;
        self.allowed(&caller, "patch", &target).await?;
        let wanted = condition(r.condition)?;
        let fence = self.claim(r.guard.as_ref(), &r.reconcile_lease).await?;
        let (set, last_transition_time) = self
            .objects
            .set_condition(&target, &wanted, &r.field_manager, fence.as_ref())
            .await
            .map_err(status::objects_error)?;
        if !set.unchanged {
            self.updated_for(&r.reconcile_lease, &target, &set).await;
        }
        Ok(Response::new(pb::SetConditionResponse {
            object: Some(set.object.into_proto()),
            changed: !set.unchanged,
            last_transition_time,
            fence: fence_of(set.fenced).into(),
        }))
    }
}

/// Checks a SetCondition's condition, naming the field that is wrong.
fn condition(c: Option<pb::Condition>) -> Result<Condition, Status> {
    let c = c.ok_or_else(|| status::invalid_argument("condition", "must be set"))?;
    if !condition::is_condition_type(&c.r#type) {
        return Err(status::invalid_argument(
            "condition.type",
            format!(
                "{:?} is not a condition type: an optional DNS subdomain and '/', then at most 316 letters, digits, '-', '_' and '.' that start and end alphanumeric (\"Ready\")",
                c.r#type
            ),
        ));
    }
    let status = match pb::ConditionStatus::try_from(c.status) {
        Ok(pb::ConditionStatus::True) => "True",
        Ok(pb::ConditionStatus::False) => "False",
        Ok(pb::ConditionStatus::Unknown) => "Unknown",
        Ok(pb::ConditionStatus::Unspecified) => {
            return Err(status::invalid_argument("condition.status", "must be TRUE, FALSE or UNKNOWN"));
        }
        Err(_) => return Err(status::invalid_argument("condition.status", format!("unknown value {}", c.status))),
    };
    if !condition::is_condition_reason(&c.reason) {
        return Err(status::invalid_argument(
            "condition.reason",
            format!(
                "{:?} is not a condition reason: CamelCase, a letter then letters, digits, '_', ',' or ':', at most 1024 (\"Available\")",
                c.reason
            ),
        ));
    }
    if c.message.len() > 32_768 {
        return Err(status::invalid_argument("condition.message", "at most 32768 bytes"));
    }
    if c.observed_generation < 0 {
        return Err(status::invalid_argument("condition.observed_generation", "must not be negative"));
    }
    Ok(Condition {
        kind: c.r#type,
        status,
        reason: c.reason,
        message: c.message,
        observed_generation: c.observed_generation,
    })
}

/// The longest reason, action and reporting controller of an event (events.k8s.io's limits).
const EVENT_NAME_CHARS: usize = 128;
/// The longest note of an event, in bytes.
const EVENT_NOTE_BYTES: usize = 1024;

/// Checks a RecordEvent's event, naming the field that is wrong; returns it and its reporting controller.
fn event(r: &pb::RecordEventRequest) -> Result<(Event, String), Status> {
    let type_ = match pb::EventSeverity::try_from(r.severity) {
        Ok(pb::EventSeverity::Normal) => EventType::Normal,
        Ok(pb::EventSeverity::Warning) => EventType::Warning,
        Ok(pb::EventSeverity::Unspecified) => {
            return Err(status::invalid_argument("severity", "must be NORMAL or WARNING"));
        }
        Err(_) => return Err(status::invalid_argument("severity", format!("unknown value {}", r.severity))),
    };
    let name = |field: &str, value: &str| {
        if value.is_empty() || value.chars().count() > EVENT_NAME_CHARS {
            return Err(status::invalid_argument(field, format!("must be 1 to {EVENT_NAME_CHARS} characters")));
        }
        Ok(value.to_owned())
    };
    let reason = name("reason", &r.reason)?;
    let action = name("action", &r.action)?;
    let controller = match r.reporting_controller.as_str() {
        "" => DEFAULT_REPORTING_CONTROLLER.to_owned(),
        c => name("reporting_controller", c)?,
    };
    if r.note.len() > EVENT_NOTE_BYTES {
        return Err(status::invalid_argument("note", format!("at most {EVENT_NOTE_BYTES} bytes")));
    }
    let note = (!r.note.is_empty()).then(|| r.note.clone());
    Ok((Event { type_, reason, note, action, secondary: None }, controller))
}

/// A write's answer says which fence its guard went out with.
fn fence_of(fenced: Option<FencedBy>) -> pb::Fence {
    match fenced {
        None => pb::Fence::Unspecified,
        Some(FencedBy::Apiserver) => pb::Fence::Apiserver,
        Some(FencedBy::Daemon) => pb::Fence::Daemon,
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// Checks the fields every request shares.
fn target(resource: &str, namespace: &str, name: Option<&str>, subresource: &str) -> Result<ObjectRef, Status> {
    if resource.is_empty() {
        return Err(status::invalid_argument("resource", "must not be empty"));
    }
    if !namespace.is_empty() && !super::watch::is_dns_label(namespace) {
        return Err(status::invalid_argument("namespace", format!("{namespace:?} is not a valid namespace name")));
    }
    if let Some(name) = name {
        if name.is_empty() {
            return Err(status::invalid_argument("name", "must not be empty"));
        }
        if name.contains('/') || name == "." || name == ".." {
            return Err(status::invalid_argument("name", format!("{name:?} is not a valid object name")));
        }
    }
    if !matches!(subresource, "" | "status") {
        return Err(status::invalid_argument("subresource", format!("{subresource:?}: only \"\" or \"status\"")));
    }
    Ok(ObjectRef {
        resource: resource.to_owned(),
        namespace: namespace.to_owned(),
        name: name.unwrap_or_default().to_owned(),
        subresource: subresource.to_owned(),
    })
}

/// A write's object must be a JSON object.
fn json_object(field: &'static str, bytes: &[u8]) -> Result<(), Status> {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) if v.is_object() => Ok(()),
        Ok(_) => Err(status::invalid_argument(field, "must be a JSON object")),
        Err(e) => Err(status::invalid_argument(field, format!("not JSON: {e}"))),
    }
}

fn read_source(source: Source) -> pb::ReadSource {
    match source {
        Source::Cache => pb::ReadSource::Cache,
        Source::Apiserver => pb::ReadSource::Apiserver,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_fields_are_checked_and_named() {
        let field = |r: Result<ObjectRef, Status>| {
            r.expect_err("refused").message().split(':').next().unwrap_or_default().to_owned()
        };
        assert_eq!(field(target("", "ns", Some("a"), "")), "resource");
        assert_eq!(field(target("configmaps", "Bad_NS", Some("a"), "")), "namespace");
        assert_eq!(field(target("configmaps", "ns", Some(""), "")), "name");
        assert_eq!(field(target("configmaps", "ns", Some("a/b"), "")), "name");
        assert_eq!(field(target("configmaps", "ns", Some("a"), "scale")), "subresource");
        assert!(target("configmaps", "ns", Some("a"), "status").is_ok());
    }

    #[test]
    fn objects_must_be_json_objects() {
        assert!(json_object("object", br#"{"a":1}"#).is_ok());
        assert!(json_object("object", b"[1]").expect_err("array").message().starts_with("object:"));
        assert!(json_object("object", b"{nope").expect_err("garbage").message().contains("not JSON"));
    }
}
