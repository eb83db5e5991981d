//! Reads and writes of Kubernetes objects for the pod's apps. Reads come from the watch hub's cache
//! when a synced watch covers them (optionally waiting for the pod's own writes), else from the
//! apiserver. Writes go to the apiserver as the app sent them, a guarded one stamped with its fencing
//! token, and each records an own-write expectation; an update or patch the cache shows would change
//! nothing is answered from it instead.

pub mod condition;
mod events;
mod unchanged;

use std::{sync::Arc, time::Duration};

use consistd_core::config::Live;
use kube::{
    Client, Resource,
    api::{DeleteParams, GetParams, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy},
    core::{ObjectList, Request},
};

use crate::{
    fencing::{
        self, Claim, Fenced, FencedBy, Fencing,
        token::{self, Stamped},
    },
    watch::{
        Hub, ResourceError,
        expectations::{InFlight, Locator, Scope},
        object::{Obj, ObjKey, RawObject},
        resolve::Resolved,
        shared::SharedWatch,
    },
};

/// Field manager recorded for writes that name none.
pub(crate) const DEFAULT_FIELD_MANAGER: &str = "consistd";
/// How often a read-your-writes read looks again while the pod's write is not yet in the cache.
const READ_YOUR_WRITES_POLL: Duration = Duration::from_millis(2);
/// How long a write in flight holds its object's states at most: the apiserver's own request timeout
/// (`--request-timeout`, 60 s), so only a write it will not answer stops holding them. Not
/// `consistency.timeout`, which runs from the write's answer: a write is not slow to be seen before
/// its version is known, and on a slow link its round trip alone may take longer.
const IN_FLIGHT_HOLD: Duration = Duration::from_secs(60);

/// Which object, of which resource.
#[derive(Debug, Clone, Default)]
pub struct ObjectRef {
    /// Resource name, in any form discovery resolves.
    pub resource: String,
    /// Namespace; empty for cluster-scoped resources (or all namespaces, for List).
    pub namespace: String,
    /// Object name (empty for Create and List).
    pub name: String,
    /// "" or "status".
    pub subresource: String,
}

/// How a patch body is read; each is one of the apiserver's patch content types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// RFC 6902.
    Json,
    /// RFC 7386.
    Merge,
    /// Kubernetes strategic merge patch: lists merge by their patch merge key (built-in types only).
    Strategic,
    /// Server-side apply.
    Apply {
        /// Take ownership of conflicting fields.
        force: bool,
    },
}

/// Where a read was answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The cache of a synced watch without selectors that covers the object; no apiserver request.
    Cache,
    /// A request to the apiserver: no such watch runs, or the list has selectors.
    Apiserver,
}

/// An update's or a patch's answer.
#[derive(Debug)]
pub struct Updated {
    /// The object as stored (as cached, when `unchanged`).
    pub object: Arc<Obj>,
    /// The object as the fencing stamp written just before the write left it, when one was (see
    /// [`Objects::stamp_first`]): a state of this write's making too, whose watch event comes first.
    pub stamped: Option<Arc<Obj>>,
    /// How its guard was checked; None for a write without one.
    pub fenced: Option<FencedBy>,
    /// It would change nothing and was not sent: the cache showed the object as it would leave it.
    pub unchanged: bool,
}

impl Updated {
    /// Every state the write left the object in, oldest first: the stamp's, if one was written, then its own.
    pub fn states(&self) -> impl Iterator<Item = &Arc<Obj>> {
        self.stamped.iter().chain(std::iter::once(&self.object))
    }
}

/// Why a read or write failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    /// A request field is wrong, the resource is unknown, or the apiserver refused or failed.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// Not found in a synced cache.
    #[error("{resource} {namespace}/{name} not found")]
    NotFound {
        /// The resource's plural name, as discovery resolved it.
        resource: String,
        /// The namespace asked for; empty for a cluster-scoped resource.
        namespace: String,
        /// The object name the cache does not hold.
        name: String,
    },
    /// The apiserver refused a guarded write: its election is in a later term than the guard's.
    #[error("the apiserver refused the write (ValidatingAdmissionPolicy {policy}): {why}", policy = fencing::POLICY)]
    Fenced {
        /// The policy's message: the election, its term, and the guard's.
        why: String,
    },
    /// `fencing.mode: require`, and the apiserver cannot check this guarded write: it was not sent.
    #[error("fencing.mode is require, and the apiserver cannot check this write: {why}")]
    Unfenced {
        /// Why the apiserver cannot check it.
        why: String,
    },
}

impl ObjectsError {
    /// Whether the object was not found (in the cache, or by the apiserver).
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::NotFound { .. } => true,
            Self::Resource(ResourceError::Apiserver { source: kube::Error::Api(status), .. }) => status.code == 404,
            _ => false,
        }
    }
}

/// Object reads and writes for ObjectsService: reads from a covering watch's cache when there is one,
/// writes that record own-write expectations.
#[derive(Clone)]
pub struct Objects {
    client: Client,
    hub: Arc<Hub>,
    /// `consistency.timeout`, as reloads change it.
    timeout: Live<Duration>,
    /// Whether a guarded write carries its claim to the apiserver.
    fencing: Arc<Fencing>,
    /// The objects this daemon stamped with a claim.
    stamped: Arc<Stamped>,
    /// Records the apps' events.
    events: Arc<events::Recorders>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl Objects {
    /// Objects backed by `client`, caching through `hub`, with `timeout` for own-write expectations, and
    /// guarded writes fenced as `fencing` says; events are reported by `instance` (this daemon's identity).
    pub fn new(client: Client, hub: Arc<Hub>, timeout: Live<Duration>, fencing: Arc<Fencing>, instance: &str) -> Self {
        let events = Arc::new(events::Recorders::new(client.clone(), instance.to_owned()));
        Self { client, hub, timeout, fencing, stamped: Arc::default(), events }
    }

    async fn resolve(&self, t: &ObjectRef, need_namespace: bool) -> Result<Resolved, ObjectsError> {
        let resolved = self.hub.resolve(&t.resource).await.map_err(ResourceError::from)?;
        if !resolved.namespaced && !t.namespace.is_empty() {
            return Err(invalid(
                "namespace",
                format!("{} is cluster-scoped; leave namespace empty", resolved.api.plural),
            ));
        }
        if need_namespace && resolved.namespaced && t.namespace.is_empty() {
            return Err(invalid("namespace", format!("required for namespaced resource {}", resolved.api.plural)));
        }
        Ok(resolved)
    }

    fn request(r: &Resolved, namespace: &str) -> Request {
        let ar = r.api.api_resource();
        let ns = (r.namespaced && !namespace.is_empty()).then_some(namespace);
        Request::new(RawObject::url_path(&ar, ns))
    }

    /// How a write guarded by `claim` to `t` goes out (see [`Fencing::fence`]); none for an unguarded one.
    fn fence(
        &self,
        claim: Option<&Claim>,
        r: &Resolved,
        t: &ObjectRef,
        create: bool,
    ) -> Result<Option<Fenced>, ObjectsError> {
        let Some(claim) = claim else { return Ok(None) };
        let namespace = if r.namespaced { t.namespace.as_str() } else { "" };
        self.fencing.fence(claim, namespace, create).map(Some).map_err(|why| ObjectsError::Unfenced { why })
    }

    /// Stamps `t` with `claim` by a merge patch of its own, before a guarded write whose body cannot carry the
    /// token (see [`token::stamp_alone`]), unless this daemon stamped it with this claim already. The stamp is
    /// guarded too: refused, the write is. When the write's `body` names a resourceVersion (an update of
    /// /status read-modify-write, an apply, a JSON patch's test), the stamp is made on that version only, and
    /// the body then names the stamped version: the write's own precondition holds as the app meant it. An
    /// object that does not exist takes no stamp: the write creates it (an apply) or fails. Returns the object
    /// as the stamp left it, when one was written.
    async fn stamp_first(
        &self,
        r: &Resolved,
        t: &ObjectRef,
        claim: &Claim,
        fence: Option<&Fenced>,
        mut body: Option<&mut serde_json::Value>,
    ) -> Result<Option<Arc<Obj>>, ObjectsError> {
        let key = stamp_key(r, t);
        if self.stamped.has(&key, claim) {
            return Ok(None);
        }
        let mut stamp = token::stamp_alone(claim);
        let version = body.as_deref_mut().and_then(precondition).and_then(|v| v.as_str()).filter(|v| !v.is_empty());
        let version = version.map(str::to_owned);
        if let (Some(version), Some(metadata)) = (&version, stamp.get_mut("metadata").and_then(|m| m.as_object_mut())) {
            metadata.insert("resourceVersion".into(), version.clone().into());
        }
        let pp = PatchParams { field_manager: Some(DEFAULT_FIELD_MANAGER.to_owned()), ..PatchParams::default() };
        let request = Self::request(r, &t.namespace).patch(&t.name, &pp, &Patch::Merge(stamp));
        let op = format!("stamp {} {} with its fencing token", r.api.plural, locate(t));
        match self.send::<RawObject>(op, request, fence.cloned()).await {
            Ok(raw) => {
                let obj = self.written(r, raw);
                if version.is_some()
                    && let Some(v) = body.and_then(precondition)
                {
                    *v = obj.resource_version().to_owned().into();
                }
                self.stamped.record(&key, claim);
                Ok(Some(obj))
            }
            Err(ObjectsError::Resource(ResourceError::Apiserver { source: kube::Error::Api(status), .. }))
                if status.code == 404 =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Sends a built request; `op` names it in errors. A guarded write carries its claim as `fence` says,
    /// and the policy's refusal comes back as [`ObjectsError::Fenced`].
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        op: String,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
        fence: Option<Fenced>,
    ) -> Result<T, ObjectsError> {
        let mut request =
            request.map_err(|e| ResourceError::Apiserver { op: op.clone(), source: kube::Error::BuildRequest(e) })?;
        let guarded = fence.is_some();
        if let Some(fence) = fence {
            request.headers_mut().extend(fence.headers);
        }
        self.client.request::<T>(request).await.map_err(|source| {
            if guarded {
                if let Some(why) = fencing::refusal(&source) {
                    return ObjectsError::Fenced { why };
                }
                if fencing::impersonation_refused(&source) {
                    self.fencing.recheck();
                }
            }
            ResourceError::Apiserver { op, source }.into()
        })
    }

    /// One object: from cache when a synced watch covers it, else from the apiserver.
    pub async fn get(&self, t: &ObjectRef, read_your_writes: bool) -> Result<(Arc<Obj>, Source), ObjectsError> {
        let r = self.resolve(t, true).await?;
        if let Some(watch) = self.hub.covering(&r.api, &t.namespace) {
            if read_your_writes {
                self.wait_for_own_writes(&watch, &Scope::Object(&locator(&r, t))).await;
            }
            let key = ObjKey { namespace: t.namespace.clone(), name: t.name.clone() };
            if let Some(found) = watch.get(&key) {
                let obj = found.ok_or_else(|| ObjectsError::NotFound {
                    resource: r.api.plural.clone(),
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                })?;
                return Ok((obj, Source::Cache));
            }
        }
        let op = format!("get {} {}", r.api.plural, locate(t));
        let raw: RawObject =
            self.send(op, Self::request(&r, &t.namespace).get(&t.name, &GetParams::default()), None).await?;
        Ok((Arc::new(Obj::from(raw)), Source::Apiserver))
    }

    /// Objects matching selectors: from cache when a synced watch without selectors covers them and
    /// none are asked for, else from the apiserver. Returns the list's resourceVersion ("" from cache).
    pub async fn list(
        &self,
        t: &ObjectRef,
        label_selector: &str,
        field_selector: &str,
        read_your_writes: bool,
    ) -> Result<(Vec<Arc<Obj>>, String, Source), ObjectsError> {
        let r = self.resolve(t, false).await?;
        if label_selector.is_empty()
            && field_selector.is_empty()
            && let Some(watch) = self.hub.covering(&r.api, &t.namespace)
        {
            if read_your_writes {
                let scope = Scope::Namespace { plural: &r.api.plural, namespace: &t.namespace };
                self.wait_for_own_writes(&watch, &scope).await;
            }
            if let Some((mut objects, _)) = watch.list(&t.namespace) {
                objects.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
                return Ok((objects, String::new(), Source::Cache));
            }
        }
        let lp = ListParams::default().labels(label_selector).fields(field_selector);
        let list: ObjectList<RawObject> =
            self.send(format!("list {}", r.api.plural), Self::request(&r, &t.namespace).list(&lp), None).await?;
        let version = list.metadata.resource_version.clone().unwrap_or_default();
        Ok((list.items.into_iter().map(|raw| Arc::new(Obj::from(raw))).collect(), version, Source::Apiserver))
    }

    /// Creates an object from its JSON; with a `claim`, also the fence the write went out with (so do the
    /// other writes).
    pub async fn create(
        &self,
        t: &ObjectRef,
        object: Vec<u8>,
        field_manager: &str,
        claim: Option<&Claim>,
    ) -> Result<(Arc<Obj>, Option<FencedBy>), ObjectsError> {
        let r = self.resolve(t, true).await?;
        let fence = self.fence(claim, &r, t, true)?;
        let by = fence.as_ref().map(|f| f.by);
        let stamp = stamping(claim, fence.as_ref());
        let object = stamp_bytes(stamp, object);
        let pp = PostParams { field_manager: Some(manager(field_manager)), ..PostParams::default() };
        let op = format!("create {} in {:?}", r.api.plural, t.namespace);
        let raw: RawObject = self.send(op, Self::request(&r, &t.namespace).create(&pp, object), fence).await?;
        let obj = self.written(&r, raw);
        if let Some(claim) = stamp {
            self.stamped.record(&stamp_key(&r, &ObjectRef { name: obj.name().to_owned(), ..t.clone() }), claim);
        }
        Ok((obj, by))
    }

    /// Replaces an object (or its status); unless `send_unchanged`, one the cache shows would change nothing
    /// is answered from it.
    pub async fn update(
        &self,
        t: &ObjectRef,
        object: Vec<u8>,
        field_manager: &str,
        claim: Option<&Claim>,
        send_unchanged: bool,
    ) -> Result<Updated, ObjectsError> {
        let r = self.resolve(t, true).await?;
        let fence = self.fence(claim, &r, t, false)?;
        let by = fence.as_ref().map(|f| f.by);
        let stamp = stamping(claim, fence.as_ref());
        if !send_unchanged
            && let Some(cached) = self.unchanged(&r, t, claim, stamp, |_| serde_json::from_slice(&object).ok())
        {
            return Ok(cached);
        }
        let _in_flight = self.begin(&r, t);
        let pp = PostParams { field_manager: Some(manager(field_manager)), ..PostParams::default() };
        let request = Self::request(&r, &t.namespace);
        let mut stamped = None;
        let request = if t.subresource.is_empty() {
            request.replace(&t.name, &pp, stamp_bytes(stamp, object))
        } else {
            // Most /status writes keep the metadata as stored (a custom resource's, a Deployment's): the object
            // is stamped first. Some take it from the body (a Namespace's): the body carries the token too.
            let object = match (stamp, serde_json::from_slice::<serde_json::Value>(&object)) {
                (Some(claim), Ok(mut body)) => {
                    stamped = self.stamp_first(&r, t, claim, fence.as_ref(), Some(&mut body)).await?;
                    token::stamp(&mut body, claim);
                    serde_json::to_vec(&body).unwrap_or(object)
                }
                _ => object,
            };
            request.replace_subresource(&t.subresource, &t.name, &pp, object)
        };
        let raw: RawObject = self.send(format!("update {} {}", r.api.plural, locate(t)), request, fence).await?;
        if let Some(claim) = stamp {
            self.stamped.record(&stamp_key(&r, t), claim);
        }
        Ok(Updated { object: self.written(&r, raw), stamped, fenced: by, unchanged: false })
    }

    /// Patches an object (or its status); unless `send_unchanged`, a merge or JSON patch the cache shows
    /// would change nothing is answered from it.
    pub async fn patch(
        &self,
        t: &ObjectRef,
        kind: PatchKind,
        patch: serde_json::Value,
        field_manager: &str,
        claim: Option<&Claim>,
        send_unchanged: bool,
    ) -> Result<Updated, ObjectsError> {
        let r = self.resolve(t, true).await?;
        let fence = self.fence(claim, &r, t, false)?;
        let by = fence.as_ref().map(|f| f.by);
        let stamp = stamping(claim, fence.as_ref());
        if !send_unchanged
            && let Some(cached) = self.unchanged(&r, t, claim, stamp, |cached| unchanged::patched(cached, kind, &patch))
        {
            return Ok(cached);
        }
        let _in_flight = self.begin(&r, t);
        let mut patch = patch;
        let mut stamped = None;
        if let Some(claim) = stamp {
            // A merge patch carries the token itself; a JSON patch cannot add an annotation without knowing
            // whether the object has annotations, an apply's field manager would own it, and most /status
            // writes keep the metadata as stored (some, a Namespace's, take the body's): those stamp the
            // object first.
            let carried = matches!(kind, PatchKind::Merge | PatchKind::Strategic) && token::stamp(&mut patch, claim);
            if !carried || !t.subresource.is_empty() {
                stamped = self.stamp_first(&r, t, claim, fence.as_ref(), Some(&mut patch)).await?;
            }
        }
        let mut pp = PatchParams { field_manager: Some(manager(field_manager)), ..PatchParams::default() };
        let content_type = match kind {
            PatchKind::Json => Some("application/json-patch+json"),
            _ => None,
        };
        let patch = match kind {
            // kube types JSON patches as json_patch::Patch; the body is the same JSON array, so build the
            // request as a merge patch and set the JSON patch media type.
            PatchKind::Json | PatchKind::Merge => Patch::Merge(patch),
            PatchKind::Strategic => Patch::Strategic(patch),
            PatchKind::Apply { force } => {
                pp.force = force;
                Patch::Apply(patch)
            }
        };
        let request = Self::request(&r, &t.namespace);
        let request = if t.subresource.is_empty() {
            request.patch(&t.name, &pp, &patch)
        } else {
            request.patch_subresource(&t.subresource, &t.name, &pp, &patch)
        };
        let request = request.map(|mut req| {
            if let Some(ct) = content_type {
                req.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(ct));
            }
            req
        });
        let raw: RawObject = self.send(format!("patch {} {}", r.api.plural, locate(t)), request, fence).await?;
        if let Some(claim) = stamp {
            self.stamped.record(&stamp_key(&r, t), claim);
        }
        Ok(Updated { object: self.written(&r, raw), stamped, fenced: by, unchanged: false })
    }

    /// Sets `c` in the status.conditions of the object `t` names (its subresource is taken as "status"), as
    /// `meta.SetStatusCondition` does: read with the pod's own writes in it, nothing is written when the
    /// object has the condition already (the answer is `unchanged`, the object as read); else the condition
    /// alone is applied to the status subresource under the field manager "<field_manager>/<type>", its
    /// lastTransitionTime kept while its status stays. Also returns the condition's lastTransitionTime.
    pub async fn set_condition(
        &self,
        t: &ObjectRef,
        c: &condition::Condition,
        field_manager: &str,
        claim: Option<&Claim>,
    ) -> Result<(Updated, String), ObjectsError> {
        let object = ObjectRef { subresource: String::new(), ..t.clone() };
        let r = self.resolve(&object, true).await?;
        let (current, _) = self.get(&object, true).await?;
        let json: serde_json::Value = serde_json::from_slice(current.json()).unwrap_or_default();
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        match condition::plan(&json, (&r.api.api_version(), &r.api.kind), c, &now) {
            condition::Plan::Unchanged { last_transition_time } => {
                Ok((Updated { object: current, stamped: None, fenced: None, unchanged: true }, last_transition_time))
            }
            condition::Plan::Apply { body, last_transition_time } => {
                let status = ObjectRef { subresource: "status".into(), ..object };
                let manager = format!("{}/{}", manager(field_manager), c.kind);
                let kind = PatchKind::Apply { force: true };
                let updated = self.patch(&status, kind, body, &manager, claim, true).await?;
                Ok((updated, last_transition_time))
            }
        }
    }

    /// Records `event` (events.k8s.io/v1) about the object `t` names, reported by `controller`: its uid is
    /// `uid`, or read (an object that is gone is named without one). A repeat within 6 minutes is counted on
    /// the first one's series. Ok(false): the rate limit of `controller`'s events about that object dropped it.
    pub async fn record_event(
        &self,
        t: &ObjectRef,
        uid: &str,
        controller: &str,
        event: &kube::runtime::events::Event,
    ) -> Result<bool, ObjectsError> {
        let r = self.resolve(t, true).await?;
        let uid = match uid {
            "" => match self.get(t, false).await {
                Ok((obj, _)) => obj.uid().to_owned(),
                Err(gone) if gone.is_not_found() => String::new(),
                Err(e) => return Err(e),
            },
            uid => uid.to_owned(),
        };
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(r.api.api_version()),
            kind: Some(r.api.kind.clone()),
            name: Some(t.name.clone()),
            namespace: some(&t.namespace),
            uid: some(&uid),
            ..Default::default()
        };
        self.events.record(controller, event, &regarding).await.map_err(|source| {
            let op = format!("record an event about {} {}", r.api.plural, locate(t));
            ResourceError::Apiserver { op, source }.into()
        })
    }

    /// Deletes an object; returns its last state when the apiserver returns one (it may be kept by
    /// finalizers), or `None` when it answers with a bare status. A guarded delete is checked against the
    /// object's token, never stamps it: it carries no object.
    pub async fn delete(
        &self,
        t: &ObjectRef,
        preconditions: Preconditions,
        propagation: Option<PropagationPolicy>,
        claim: Option<&Claim>,
    ) -> Result<(Option<Arc<Obj>>, Option<FencedBy>), ObjectsError> {
        let r = self.resolve(t, true).await?;
        let fence = self.fence(claim, &r, t, false)?;
        let by = fence.as_ref().map(|f| f.by);
        let _in_flight = self.begin(&r, t);
        let has_preconditions = preconditions.uid.is_some() || preconditions.resource_version.is_some();
        let dp = DeleteParams {
            preconditions: has_preconditions.then_some(preconditions),
            propagation_policy: propagation,
            ..DeleteParams::default()
        };
        let raw: RawObject = self
            .send(
                format!("delete {} {}", r.api.plural, locate(t)),
                Self::request(&r, &t.namespace).delete(&t.name, &dp),
                fence,
            )
            .await?;
        let obj = Obj::from(raw);
        self.stamped.forget(&stamp_key(&r, t));
        Ok(((!obj.uid().is_empty()).then(|| Arc::new(obj)), by))
    }

    /// The answer to a write to `t` that would leave the object as `written(cached)` (None: cannot tell),
    /// stamped with `stamp` when it carries one, when that changes nothing: the freshest cached state showing
    /// every write of this pod to it, while none is in flight. None when the write must go to the apiserver.
    /// A guard (`claim`) was checked by this daemon alone: the apiserver is not asked.
    fn unchanged(
        &self,
        r: &Resolved,
        t: &ObjectRef,
        claim: Option<&Claim>,
        stamp: Option<&Claim>,
        written: impl FnOnce(&serde_json::Value) -> Option<serde_json::Value>,
    ) -> Option<Updated> {
        let locator = locator(r, t);
        if self.hub.expectations().in_flight(&locator).is_some() {
            return None;
        }
        let key = ObjKey { namespace: t.namespace.clone(), name: t.name.clone() };
        let cached = self.hub.cached(&r.api, &key, &Scope::Object(&locator))?;
        let current: serde_json::Value = serde_json::from_slice(cached.json()).ok()?;
        let mut written = written(&current)?;
        if let Some(claim) = stamp
            && !token::stamp(&mut written, claim)
        {
            return None;
        }
        if !unchanged::same(&current, &written) {
            return None;
        }
        tracing::debug!(resource = %r.api.plural, namespace = %t.namespace, name = %t.name, resource_version = cached.resource_version(), "a write that would change nothing: answered from the cache");
        self.hub.metrics().unchanged_writes.inc();
        Some(Updated { object: cached, stamped: None, fenced: claim.map(|_| FencedBy::Daemon), unchanged: true })
    }

    /// Marks a write to `t` as in flight until the returned guard drops (after [`Objects::written`]):
    /// CONSISTENT subscribers hold the object's states meanwhile.
    fn begin(&self, r: &Resolved, t: &ObjectRef) -> InFlight {
        self.hub.expectations().begin(locator(r, t), IN_FLIGHT_HOLD)
    }

    /// Records the write's expectation, waited for `consistency.timeout` from now (its answer), and returns
    /// the object.
    fn written(&self, r: &Resolved, raw: RawObject) -> Arc<Obj> {
        let obj = Arc::new(Obj::from(raw));
        self.hub.record_write(&r.api, &obj, self.timeout.get());
        obj
    }

    /// Waits (at most until their deadlines) until `watch` has delivered every pending own write whose
    /// locator starts with `prefix`.
    async fn wait_for_own_writes(&self, watch: &SharedWatch, scope: &Scope<'_>) {
        while self.hub.expectations().any_unseen(scope, watch.incarnation) {
            tokio::time::sleep(READ_YOUR_WRITES_POLL).await;
        }
    }
}

/// The claim a guarded write stamps on its object: its own, when it goes out claiming it at the apiserver (the
/// policy refuses a token moved by a write that does not claim it); none for an unguarded write, or one only
/// this daemon checks.
fn stamping<'a>(claim: Option<&'a Claim>, fence: Option<&Fenced>) -> Option<&'a Claim> {
    claim.filter(|_| fence.is_some_and(Fenced::claims))
}

/// A create's or an update's object, stamped with `stamp` when there is one and the object is a JSON object
/// with room for the token; else as it came.
fn stamp_bytes(stamp: Option<&Claim>, object: Vec<u8>) -> Vec<u8> {
    let Some(claim) = stamp else { return object };
    let Ok(mut body) = serde_json::from_slice::<serde_json::Value>(&object) else { return object };
    if !token::stamp(&mut body, claim) {
        return object;
    }
    serde_json::to_vec(&body).unwrap_or(object)
}

/// Where a write's `body` names the resourceVersion it was made on: an object's metadata (an update, a merge
/// patch, an apply), or a JSON patch's test of /metadata/resourceVersion.
fn precondition(body: &mut serde_json::Value) -> Option<&mut serde_json::Value> {
    match body {
        serde_json::Value::Array(ops) => ops
            .iter_mut()
            .find(|op| op["op"] == "test" && op["path"] == "/metadata/resourceVersion")
            .and_then(|op| op.get_mut("value")),
        body => body.pointer_mut("/metadata/resourceVersion"),
    }
}

/// How [`Stamped`] names the object `t` of the resolved resource `r`.
fn stamp_key(r: &Resolved, t: &ObjectRef) -> String {
    format!("{}/{}/{}/{}", r.api.group, r.api.plural, t.namespace, t.name)
}

/// Where own-write tracking knows the object `t` of the resolved resource `r`.
fn locator(r: &Resolved, t: &ObjectRef) -> Locator {
    Locator::new(&r.api.plural, &t.namespace, &t.name)
}

fn invalid(field: &'static str, message: String) -> ObjectsError {
    ResourceError::InvalidArgument { field, message }.into()
}

fn manager(field_manager: &str) -> String {
    if field_manager.is_empty() { DEFAULT_FIELD_MANAGER.to_owned() } else { field_manager.to_owned() }
}

fn locate(t: &ObjectRef) -> String {
    let sub = if t.subresource.is_empty() { String::new() } else { format!(" ({})", t.subresource) };
    if t.namespace.is_empty() { format!("{}{sub}", t.name) } else { format!("{}/{}{sub}", t.namespace, t.name) }
}
