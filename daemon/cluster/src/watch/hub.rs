//! The registry of shared watches: finds or starts the one upstream watch for a query, counts its
//! subscribers, and stops it `linger` after the last one leaves (so a reconnecting app can still resume).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use consistd_core::{config::WatchConfig, tasks::Tasks};
use consistd_observe::metrics::Metrics;
use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Client,
    api::{ListParams, WatchParams},
    runtime::watcher,
};

use super::{
    Cursor, ResourceError, Subscription, WatchKey,
    bookmarks::{bookmarking_client, is_marker},
    budget::{Budget, gauge},
    expectations::Expectations,
    object::{Obj, ObjKey, RawMetadata, RawObject},
    resolve::{ResolveError, Resolved, Resolver, ResourceId},
    shard::{ShardSelector, sharded_client},
    shared::{Budgeted, Limits, SharedWatch, Upstream},
    staleness,
    view::ObjectView,
};

/// What an app asks to watch.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// The resource name, in any form [`Resolver`] accepts.
    pub resource: String,
    /// Namespace; empty for all.
    pub namespace: String,
    /// Label selector, passed to the apiserver as given; empty for none.
    pub label_selector: String,
    /// Field selector, passed to the apiserver as given; empty for none.
    pub field_selector: String,
    /// Resume after this cursor from the watch's history. None starts with a snapshot; a cursor the
    /// history no longer covers gets RESYNC_REQUIRED and a snapshot.
    pub cursor: Option<Cursor>,
    /// The daemon's own work asks (an election's Leases, a group's members, a Service's endpoints), not
    /// an app: the watch's objects are counted in the memory budget but never refused.
    pub own: bool,
    /// What of each object the watch keeps; queries with different views are different watches.
    pub view: ObjectView,
    /// Only the objects of this share (KEP-5866): asked of the apiserver, and applied here when it does not
    /// honour it. None for every object.
    pub shard: Option<ShardSelector>,
}

/// Every shared watch of this daemon.
pub struct Hub {
    client: Client,
    resolver: Resolver,
    config: WatchConfig,
    /// The bytes every watch's objects are charged to.
    budget: Arc<Budget>,
    metrics: Metrics,
    /// Runs the upstream watches and their linger timers; its stop signal ends every watch.
    tasks: Tasks,
    watches: Mutex<HashMap<WatchKey, Running>>,
    expectations: Expectations,
    /// Per resource: whether the apiserver serves it streaming lists (WatchList needs the resource's
    /// watch cache, which can be disabled per resource); asked once each.
    streaming_lists: Mutex<HashMap<ResourceId, bool>>,
    /// Whether the apiserver guarantees comparable resourceVersions; asked once (its /version).
    comparable: tokio::sync::OnceCell<bool>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("upstream_watches", &self.upstream_watches()).finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Running {
    watch: Arc<SharedWatch>,
    subscribers: usize,
}

/// One subscriber's claim on a shared watch; released on drop.
#[derive(Debug)]
pub(super) struct WatchClaim {
    hub: Arc<Hub>,
    watch: Arc<SharedWatch>,
}

impl WatchClaim {
    pub(super) fn watch(&self) -> &Arc<SharedWatch> {
        &self.watch
    }
}

impl Drop for WatchClaim {
    fn drop(&mut self) {
        self.hub.release(&self.watch);
    }
}

impl Hub {
    /// A hub that watches through `client` and may hold `budget` bytes of objects, its watches run as tasks
    /// of `tasks` until it stops.
    pub fn new(client: Client, config: WatchConfig, budget: u64, metrics: Metrics, tasks: &Tasks) -> Arc<Self> {
        metrics.watch_budget_bytes.set(gauge(budget));
        Arc::new(Self {
            resolver: Resolver::new(client.clone()),
            client,
            config,
            budget: Budget::reporting(budget, metrics.watch_budget_used_bytes.clone()),
            metrics,
            tasks: tasks.clone(),
            watches: Mutex::new(HashMap::new()),
            expectations: Expectations::default(),
            streaming_lists: Mutex::new(HashMap::new()),
            comparable: tokio::sync::OnceCell::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<WatchKey, Running>> {
        self.watches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Upstream watches running now: one per distinct query, kept `watch.linger` after its last subscriber.
    pub fn upstream_watches(&self) -> usize {
        self.lock().len()
    }

    /// The memory budget every watch's objects are charged to.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Watches ended or refused because they would pass the budget, since the daemon started.
    pub fn exhausted(&self) -> u64 {
        self.metrics.watch_exhausted.get()
    }

    /// What each watch running now holds, in bytes, largest first.
    pub fn watch_bytes(&self) -> Vec<(consistd_observe::metrics::WatchLabel, u64)> {
        let mut sizes: Vec<_> = self.lock().values().map(|h| (h.watch.label().clone(), h.watch.bytes())).collect();
        sizes.sort_by_key(|(_, bytes)| std::cmp::Reverse(*bytes));
        sizes
    }

    /// Resolves a resource name: built-ins from a static table, the rest through discovery.
    pub async fn resolve(&self, name: &str) -> Result<Resolved, ResolveError> {
        self.resolver.resolve(name).await
    }

    /// Whether the apiserver guarantees that resourceVersions are integers that grow with every change
    /// (Kubernetes 1.35+, KEP-5504), so a watch that delivered version N has delivered every change up to
    /// N. Asked once; an apiserver that cannot be asked now counts as not guaranteeing it, and is asked
    /// again next time.
    pub(crate) async fn comparable_resource_versions(&self) -> bool {
        let asked = self
            .comparable
            .get_or_try_init(|| async {
                let info = self.client.apiserver_version().await?;
                Ok::<_, kube::Error>(guarantees_comparable_versions(&info.major, &info.minor))
            })
            .await;
        match asked {
            Ok(comparable) => *comparable,
            Err(error) => {
                tracing::warn!(%error, "could not read the apiserver's version; comparing resourceVersions for equality only");
                false
            }
        }
    }

    /// The apiserver client its watches use, for the daemon's own writes beside them.
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// The daemon's own-write expectations.
    pub fn expectations(&self) -> &Expectations {
        &self.expectations
    }

    /// The daemon's metrics.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Records a write of this pod that produced `obj`, so CONSISTENT subscribers wait for it.
    pub(crate) fn record_write(&self, resource: &super::resolve::ResourceId, obj: &Obj, timeout: std::time::Duration) {
        if obj.uid().is_empty() || obj.resource_version().is_empty() {
            return;
        }
        let locator = super::expectations::Locator::new(&resource.plural, obj.namespace(), obj.name());
        self.expectations.expect(obj.uid(), obj.resource_version(), locator, timeout);
        let watches: Vec<Arc<SharedWatch>> =
            self.lock().values().filter(|h| &h.watch.key.resource == resource).map(|h| h.watch.clone()).collect();
        for watch in watches {
            watch.note_write(obj);
        }
    }

    /// A running, synced watch with no selectors that covers `namespace` of `resource`: its cache can
    /// answer reads.
    pub(crate) fn covering(&self, resource: &super::resolve::ResourceId, namespace: &str) -> Option<Arc<SharedWatch>> {
        self.lock()
            .values()
            .map(|h| &h.watch)
            .filter(|w| {
                &w.key.resource == resource
                    && w.key.label_selector.is_empty()
                    && w.key.field_selector.is_empty()
                    && w.key.view.whole()
                    && w.key.shard.is_none()
            })
            .find(|w| w.key.namespace.is_empty() || w.key.namespace == namespace)
            .filter(|w| w.is_synced())
            .cloned()
    }

    /// The object at `key` of `resource` as the freshest running, synced watch of it that keeps objects whole
    /// shows it, among those that show every write of this pod within `scope`; None when none holds it.
    /// Selectors do not matter here: an object a watch holds is as fresh as that watch.
    pub(crate) fn cached(
        &self,
        resource: &super::resolve::ResourceId,
        key: &ObjKey,
        scope: &super::expectations::Scope<'_>,
    ) -> Option<Arc<Obj>> {
        let watches: Vec<Arc<SharedWatch>> = self
            .lock()
            .values()
            .map(|h| &h.watch)
            .filter(|w| {
                &w.key.resource == resource
                    && w.key.view.whole()
                    && (w.key.namespace.is_empty() || w.key.namespace == key.namespace)
            })
            .cloned()
            .collect();
        watches
            .iter()
            .filter(|w| !self.expectations.any_unseen(scope, w.incarnation))
            .filter_map(|w| w.get(key).flatten())
            .max_by_key(|o| o.resource_version().parse::<u64>().unwrap_or(0))
    }

    /// Subscribes to `query`, sharing the upstream watch of an identical query.
    pub async fn subscribe(self: &Arc<Self>, query: Query) -> Result<Subscription, ResourceError> {
        let resolved = self.resolver.resolve(&query.resource).await?;
        if !resolved.namespaced && !query.namespace.is_empty() {
            return Err(ResourceError::InvalidArgument {
                field: "namespace",
                message: format!("{} is cluster-scoped; leave namespace empty", resolved.api.plural),
            });
        }
        let key = WatchKey {
            resource: resolved.api,
            namespace: query.namespace,
            label_selector: query.label_selector,
            field_selector: query.field_selector,
            view: query.view,
            shard: query.shard,
        };
        let own = query.own;
        let watch = match self.acquire(&key, own) {
            Some(watch) => watch,
            None => {
                // The checks ask as the watch will: a metadata-only watch's never bring an object's data.
                let (config, honoured) = if key.view.metadata_only() {
                    self.checked_config(&self.api::<RawMetadata>(&key, false), &key).await?
                } else {
                    self.checked_config(&self.api::<RawObject>(&key, false), &key).await?
                };
                let upstream = self.upstream(&key, config, honoured);
                self.acquire_or_start(key, upstream, own)
            }
        };
        let joined = watch.join(query.cursor);
        Ok(Subscription::new(WatchClaim { hub: self.clone(), watch }, joined))
    }

    /// The API of `key`'s resource and namespace, through its shard's client; with `bookmarks`, one whose watch
    /// responses hand on their bookmarks (see [`super::bookmarks`]).
    fn api<K>(&self, key: &WatchKey, bookmarks: bool) -> Api<K>
    where
        K: kube::Resource<DynamicType = kube::discovery::ApiResource, Scope = kube::core::DynamicResourceScope>,
    {
        let ar = key.resource.api_resource();
        let client = match &key.shard {
            Some(shard) => sharded_client(self.client.clone(), shard),
            None => self.client.clone(),
        };
        let client = if bookmarks { bookmarking_client(client) } else { client };
        if key.namespace.is_empty() {
            Api::all_with(client, &ar)
        } else {
            Api::namespaced_with(client, &key.namespace, &ar)
        }
    }

    /// The watcher configuration of `key` once the apiserver accepted its query through `api`, and
    /// whether the apiserver honours the key's shard selector (true without one).
    async fn checked_config<K: Checkable>(
        &self,
        api: &Api<K>,
        key: &WatchKey,
    ) -> Result<(watcher::Config, bool), ResourceError> {
        let honoured = match check_query(api, key).await {
            Ok(honoured) => honoured,
            Err(error) => {
                if not_served(&error) {
                    // Resolved from a catalog that is out of date: the next resolve fetches it again.
                    self.resolver.invalidate().await;
                }
                return Err(error);
            }
        };
        Ok((self.watcher_config(api, key).await?, honoured))
    }

    /// The upstream watch of `key` with `config`: whole objects, or metadata only with the apiserver's
    /// metadata requests; each object shaped by the key's view before the watch holds it. A shard the
    /// apiserver does not honour is applied here: an object's uid and namespace never change, so an
    /// object outside the share is dropped from every event and never enters the watch.
    fn upstream(&self, key: &WatchKey, config: watcher::Config, honoured: bool) -> Upstream {
        let events = if key.view.metadata_only() {
            watcher(self.api::<RawMetadata>(key, true), config).map_ok(unwrap_metadata).boxed()
        } else {
            watcher(self.api::<RawObject>(key, true), config).boxed()
        };
        let filter = key.shard.clone().filter(|_| !honoured);
        if let Some(shard) = &key.shard {
            self.metrics.watch_shard_honoured.get_or_create(&key.label()).set(i64::from(honoured));
            tracing::info!(resource = %key.resource.plural, shard = %shard.label(), ranges = shard.ranges().len(), honoured, "shard selector {}", if honoured { "honoured by the apiserver" } else { "not honoured by the apiserver (no shardInfo on its list): applied here" });
        }
        let events = match filter {
            None => events,
            Some(shard) => {
                let dropped = self.metrics.watch_shard_dropped.get_or_create(&key.label()).clone();
                events
                    .try_filter_map(move |event| {
                        let outside = |o: &RawObject| {
                            let meta = kube::Resource::meta(o);
                            !shard.holds_object(
                                meta.uid.as_deref().unwrap_or(""),
                                meta.namespace.as_deref().unwrap_or(""),
                            )
                        };
                        let kept = match &event {
                            watcher::Event::Apply(o) if is_marker(kube::Resource::meta(o)) => true,
                            watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
                                !outside(o)
                            }
                            watcher::Event::Init | watcher::Event::InitDone => true,
                        };
                        if !kept {
                            dropped.inc();
                        }
                        futures::future::ready(Ok(kept.then_some(event)))
                    })
                    .boxed()
            }
        };
        let (view, api_version, kind) =
            (key.view.clone(), key.resource.api_resource().api_version, key.resource.kind.clone());
        events
            .map_ok(move |event| event.modify(|raw| raw.reshape(|json| view.shape(json, &api_version, &kind))))
            .boxed()
    }

    /// Joins a running watch of `key`, if any (the daemon's `own` work marks it so).
    fn acquire(&self, key: &WatchKey, own: bool) -> Option<Arc<SharedWatch>> {
        let mut watches = self.lock();
        let held = watches.get_mut(key)?;
        if own {
            if held.watch.refused() {
                // An app's watch the budget ended (or is ending): the daemon's own work starts it again,
                // never refused.
                watches.remove(key);
                self.metrics.watch_upstreams.dec();
                return None;
            }
            held.watch.mark_own();
        }
        held.subscribers += 1;
        self.metrics.watch_subscribers.inc();
        Some(held.watch.clone())
    }

    /// Joins the watch of `key`, starting it unless another subscriber started it meanwhile.
    fn acquire_or_start(&self, key: WatchKey, upstream: Upstream, own: bool) -> Arc<SharedWatch> {
        let mut watches = self.lock();
        self.metrics.watch_subscribers.inc();
        let held = watches.entry(key.clone()).or_insert_with(|| {
            let limits = Limits { queue: self.config.subscriber_queue, history: self.config.history };
            let budgeted = Budgeted { budget: self.budget.clone(), own };
            let watch =
                SharedWatch::new(key.clone(), limits, budgeted, self.expectations.clone(), self.tasks.signal());
            tracing::info!(resource = %key.resource.plural, namespace = %key.namespace, label_selector = %key.label_selector, field_selector = %key.field_selector, "starting upstream watch");
            self.metrics.watch_upstreams.inc();
            self.tasks.spawn(watch.clone().run(upstream, self.metrics.clone()));
            if !self.config.staleness_check.is_zero() {
                let api = self.api::<RawObject>(&key, false);
                self.tasks.spawn(staleness::run(watch.clone(), api, self.config.staleness_check, self.metrics.clone()));
            }
            Running { watch, subscribers: 0 }
        });
        if own {
            held.watch.mark_own();
        }
        held.subscribers += 1;
        held.watch.clone()
    }

    /// A subscriber left; the last one starts the linger timer.
    fn release(self: &Arc<Self>, watch: &Arc<SharedWatch>) {
        self.metrics.watch_subscribers.dec();
        let mut watches = self.lock();
        let Some(held) = watches.get_mut(&watch.key) else { return };
        if !Arc::ptr_eq(&held.watch, watch) {
            return;
        }
        held.subscribers -= 1;
        if held.subscribers > 0 {
            return;
        }
        let (hub, watch) = (self.clone(), watch.clone());
        self.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(hub.config.linger) => {}
                // The watch itself stops with the hub's tasks.
                () = hub.tasks.stopping() => return,
            }
            let mut watches = hub.lock();
            let idle = watches.get(&watch.key).is_some_and(|h| h.subscribers == 0 && Arc::ptr_eq(&h.watch, &watch));
            if idle {
                watches.remove(&watch.key);
                watch.stop();
                hub.metrics.watch_upstreams.dec();
                if watch.key.shard.is_some() {
                    hub.metrics.watch_shard_honoured.remove(&watch.key.label());
                }
                tracing::info!(resource = %watch.key.resource.plural, namespace = %watch.key.namespace, "stopped idle upstream watch");
            }
        });
    }

    /// kube-runtime's watcher configuration for `key`: bookmarks on, selectors, and streaming lists
    /// when the apiserver serves them.
    async fn watcher_config<K: Checkable>(
        &self,
        api: &Api<K>,
        key: &WatchKey,
    ) -> Result<watcher::Config, ResourceError> {
        let known = self.streaming_lists.lock().unwrap_or_else(PoisonError::into_inner).get(&key.resource).copied();
        let streaming = match known {
            Some(streaming) => streaming,
            None => {
                let streaming = supports_streaming_lists(api).await?;
                self.streaming_lists
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key.resource.clone(), streaming);
                streaming
            }
        };
        let mut config = watcher::Config::default();
        if streaming {
            config = config.streaming_lists();
        }
        if !key.label_selector.is_empty() {
            config = config.labels(&key.label_selector);
        }
        if !key.field_selector.is_empty() {
            config = config.fields(&key.field_selector);
        }
        Ok(config)
    }
}

/// Whether Kubernetes `major`.`minor` guarantees comparable resourceVersions: 1.35 and later (a minor
/// may carry a provider's "+").
fn guarantees_comparable_versions(major: &str, minor: &str) -> bool {
    let number = |s: &str| s.trim_end_matches('+').parse::<u32>().ok();
    match (number(major), number(minor)) {
        (Some(major), Some(minor)) => major > 1 || (major == 1 && minor >= 35),
        _ => false,
    }
}

/// What a query is checked as before its watch starts: whole objects or metadata only.
trait Checkable:
    kube::Resource<DynamicType = kube::discovery::ApiResource>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + 'static
{
}
impl Checkable for RawObject {}
impl Checkable for RawMetadata {}

/// A metadata-only watch's event, its objects as any other watch's.
fn unwrap_metadata(event: watcher::Event<RawMetadata>) -> watcher::Event<RawObject> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(o.0),
        watcher::Event::Delete(o) => watcher::Event::Delete(o.0),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(o.0),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Asks the apiserver for one object with each selector, so a bad selector, a forbidden resource or a
/// missing namespace is refused now, naming the field, instead of failing inside the upstream watch.
/// Answers whether the apiserver honours the key's shard selector: its list says so in `shardInfo`
/// (true for a key without one).
async fn check_query<K: Checkable>(api: &Api<K>, key: &WatchKey) -> Result<bool, ResourceError> {
    // The field is named when the apiserver refused the request as invalid (400, 422): a refusal of the
    // list itself (403 from RBAC, 404) is not about the selector.
    let refused = |field: &str, source: kube::Error| {
        let plural = &key.resource.plural;
        let op = match &source {
            kube::Error::Api(status) if matches!(status.code, 400 | 422) => format!("list {plural} ({field})"),
            _ => format!("list {plural}"),
        };
        ResourceError::Apiserver { op, source }
    };
    let listed = api
        .list(&ListParams::default().limit(1).labels(&key.label_selector))
        .await
        .map_err(|e| refused(if key.shard.is_some() { "label_selector or shard" } else { "label_selector" }, e))?;
    if !key.field_selector.is_empty() {
        api.list(&ListParams::default().limit(1).fields(&key.field_selector))
            .await
            .map_err(|e| refused("field_selector", e))?;
    }
    Ok(key.shard.is_none() || listed.metadata.shard_info.is_some())
}

/// Whether `error` says the apiserver does not serve the resource at all: a list (a collection, never
/// one object) answered 404.
fn not_served(error: &ResourceError) -> bool {
    matches!(error, ResourceError::Apiserver { source: kube::Error::Api(status), .. } if status.code == 404)
}

/// Whether the apiserver answers a streaming-list watch (sendInitialEvents); older or restricted ones
/// refuse it with 4xx, and the hub then lists and watches.
async fn supports_streaming_lists<K: Checkable>(api: &Api<K>) -> Result<bool, ResourceError> {
    let params = WatchParams::streaming_lists().timeout(1);
    let first = match api.watch(&params, "0").await {
        Ok(stream) => std::pin::pin!(stream).next().await.transpose().map(|_| ()),
        Err(error) => Err(error),
    };
    match first {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(status)) if (400..500).contains(&status.code) && status.code != 403 => {
            tracing::info!(code = status.code, message = %status.message, resource = %api.resource_url(), "apiserver refuses streaming lists for this resource; using list and watch");
            Ok(false)
        }
        Err(source) => Err(ResourceError::Apiserver { op: "probe streaming-list support".to_owned(), source }),
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use http_body_util::Full;
    use kube::client::Body;

    use super::*;

    /// A client whose "apiserver" answers every request with `status` and `body` (unit tests only).
    fn client_answering(status: u16, body: &'static str) -> Client {
        let service = tower::service_fn(move |_: Request<Body>| async move {
            Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
        });
        Client::new(service, "default")
    }

    fn leases(client: Client) -> Api<RawObject> {
        let ar = kube::discovery::ApiResource {
            group: "coordination.k8s.io".into(),
            version: "v1".into(),
            api_version: "coordination.k8s.io/v1".into(),
            kind: "Lease".into(),
            plural: "leases".into(),
        };
        Api::namespaced_with(client, "default", &ar)
    }

    #[test]
    fn resource_versions_are_comparable_from_kubernetes_1_35() {
        assert!(guarantees_comparable_versions("1", "35"));
        assert!(guarantees_comparable_versions("1", "36+"));
        assert!(guarantees_comparable_versions("2", "0"));
        assert!(!guarantees_comparable_versions("1", "34"));
        assert!(!guarantees_comparable_versions("", ""));
    }

    #[tokio::test]
    async fn streaming_lists_are_used_when_the_apiserver_answers_them() {
        let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"resourceVersion":"7","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
        let supported = supports_streaming_lists(&leases(client_answering(200, bookmark))).await;
        assert!(supported.expect("probe answers"), "an answered streaming watch means supported");
    }

    #[tokio::test]
    async fn list_and_watch_is_used_when_the_apiserver_refuses_streaming_lists() {
        let refusal = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"sendInitialEvents is forbidden","reason":"Invalid","code":422}"#;
        let supported = supports_streaming_lists(&leases(client_answering(422, refusal))).await;
        assert!(!supported.expect("a refusal is an answer"));
    }

    #[tokio::test]
    async fn a_forbidden_probe_is_an_error_not_a_decision() {
        let forbidden = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden","reason":"Forbidden","code":403}"#;
        assert!(supports_streaming_lists(&leases(client_answering(403, forbidden))).await.is_err());
    }

    #[tokio::test]
    async fn the_daemons_own_work_never_joins_an_apps_watch_the_budget_ended() {
        let tasks = Tasks::new();
        let hub = Hub::new(client_answering(200, "{}"), WatchConfig::default(), 100, Metrics::new(), &tasks);
        let key = WatchKey {
            resource: ResourceId {
                group: "coordination.k8s.io".into(),
                version: "v1".into(),
                kind: "Lease".into(),
                plural: "leases".into(),
            },
            namespace: "ns".into(),
            label_selector: String::new(),
            field_selector: String::new(),
            view: ObjectView::default(),
            shard: None,
        };
        let ended = || {
            let budgeted = Budgeted { budget: hub.budget.clone(), own: false };
            let watch = SharedWatch::new(
                key.clone(),
                Limits { queue: 4, history: 4 },
                budgeted,
                Expectations::default(),
                tasks.signal(),
            );
            let lease = r#"{"metadata":{"name":"l","namespace":"ns","uid":"u","resourceVersion":"1"}}"#;
            watch.apply(watcher::Event::Init, &hub.metrics);
            watch.apply(watcher::Event::InitApply(serde_json::from_str(lease).expect("lease")), &hub.metrics);
            watch.apply(watcher::Event::InitDone, &hub.metrics);
            assert!(watch.ended().is_some(), "past a budget of 100 bytes");
            hub.lock().insert(key.clone(), Running { watch, subscribers: 1 });
        };
        ended();
        assert!(hub.acquire(&key, false).is_some(), "an app joins it, and is told it ended at once");
        assert!(hub.acquire(&key, true).is_none(), "the daemon's own work starts a watch of its own");
        assert_eq!(hub.upstream_watches(), 0, "the ended one is let go");
    }

    /// A running watch of ConfigMaps in "ns" in `hub`, with `selector`, its cache listed with `objects`.
    fn cm_watch(hub: &Hub, tasks: &Tasks, selector: &str, view: ObjectView, objects: &[&str]) -> Arc<SharedWatch> {
        let key = WatchKey {
            resource: ResourceId {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
            },
            namespace: "ns".into(),
            label_selector: selector.into(),
            field_selector: String::new(),
            view,
            shard: None,
        };
        let budgeted = Budgeted { budget: hub.budget.clone(), own: false };
        let watch = SharedWatch::new(
            key.clone(),
            Limits { queue: 16, history: 16 },
            budgeted,
            hub.expectations.clone(),
            tasks.signal(),
        );
        watch.apply(watcher::Event::Init, &hub.metrics);
        for object in objects {
            watch.apply(watcher::Event::InitApply(serde_json::from_str(object).expect("object")), &hub.metrics);
        }
        watch.apply(watcher::Event::InitDone, &hub.metrics);
        hub.lock().insert(key, Running { watch: watch.clone(), subscribers: 1 });
        watch
    }

    fn cm(rv: u64) -> String {
        format!(
            r#"{{"metadata":{{"name":"a","namespace":"ns","uid":"u","resourceVersion":"{rv}"}},"data":{{"k":"{rv}"}}}}"#
        )
    }

    #[tokio::test]
    async fn a_write_is_judged_on_the_freshest_whole_cache_that_shows_the_pods_own_writes() {
        let tasks = Tasks::new();
        let hub = Hub::new(client_answering(200, "{}"), WatchConfig::default(), u64::MAX, Metrics::new(), &tasks);
        let resource = ResourceId {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
        };
        let key = ObjKey { namespace: "ns".into(), name: "a".into() };
        let locator = super::super::expectations::Locator::new("configmaps", "ns", "a");
        let scope = super::super::expectations::Scope::Object(&locator);
        let version = |hub: &Hub| hub.cached(&resource, &key, &scope).map(|o| o.resource_version().to_owned());
        assert_eq!(version(&hub), None, "no watch holds it");

        let whole = cm_watch(&hub, &tasks, "", ObjectView::default(), &[&cm(5)]);
        let metadata_only = ObjectView::new(true, &[], false).expect("a metadata view");
        cm_watch(&hub, &tasks, "app=other", metadata_only, &[&cm(9)]);
        assert_eq!(
            version(&hub).as_deref(),
            Some("5"),
            "a view that does not keep objects whole is no cache to judge on"
        );

        hub.expectations.expect("u", "6", locator.clone(), std::time::Duration::from_secs(30));
        assert_eq!(version(&hub), None, "the pod wrote version 6, which the cache does not show yet");
        whole.apply(watcher::Event::Apply(serde_json::from_str(&cm(6)).expect("object")), &hub.metrics);
        assert_eq!(version(&hub).as_deref(), Some("6"), "shown: the cache answers");

        let selected = cm_watch(&hub, &tasks, "app=x", ObjectView::default(), &[&cm(6)]);
        selected.apply(watcher::Event::Apply(serde_json::from_str(&cm(7)).expect("object")), &hub.metrics);
        assert_eq!(version(&hub).as_deref(), Some("7"), "the freshest watch holding it, selectors or not");
    }
}
