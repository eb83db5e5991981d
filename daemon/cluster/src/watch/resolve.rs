//! Turns what an app names ("configmaps", "deployments.apps", "apps/v1/deployments", "Deployment") into
//! the apiserver resource it means: built-in resources from a static table, anything else from aggregated
//! discovery (two requests), cached and fetched again on a miss, when old, or when the apiserver says a
//! resolved resource is not served.

mod builtin;
mod catalog;

use std::{sync::Arc, time::Duration};

use kube::{Client, discovery::ApiResource};
use tokio::{sync::Mutex, time::Instant};

use self::{
    builtin::BUILTIN,
    catalog::{Catalog, Served},
};

/// Discovery is fetched again at most this often, so a stream of typos cannot hammer the apiserver.
const REDISCOVER_AFTER: Duration = Duration::from_secs(2);

/// A catalog this old is fetched again before it answers, so a custom resource whose preferred version
/// changed is followed without a miss to say so (no CRD watch: the daemon's RBAC is namespaced).
const CATALOG_MAX_AGE: Duration = Duration::from_secs(5 * 60);

/// An apiserver resource an app may list and watch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resolved {
    /// Group, version, kind and plural.
    pub api: ResourceId,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

/// The identity of a resource (a hashable subset of kube's `ApiResource`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceId {
    /// API group; empty for the core group.
    pub group: String,
    /// API version within the group, e.g. "v1".
    pub version: String,
    /// The kind its objects carry, e.g. "Deployment"; apps may name the resource by it.
    pub kind: String,
    /// The lowercase plural used in URLs, e.g. "deployments"; errors and locators name it.
    pub plural: String,
}

impl ResourceId {
    /// Its objects' apiVersion: "group/version", or "version" in the core group.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// kube's form of the same resource.
    pub(crate) fn api_resource(&self) -> ApiResource {
        let api_version = self.api_version();
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version,
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }
}

/// Why a resource name could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Nothing the apiserver serves has that name.
    #[error("the apiserver serves no resource named {0:?}")]
    NotFound(String),
    /// The name matches a resource that cannot be listed and watched.
    #[error("resource {0:?} does not support list and watch")]
    NotWatchable(String),
    /// The name is not of any accepted form.
    #[error("{0:?} is not a resource name: use plural, plural.group, group/version/plural or Kind")]
    Malformed(String),
    /// Discovery could not be fetched (the apiserver refused or was unreachable), so no name was looked up.
    #[error("discover apiserver resources")]
    Discovery(#[source] kube::Error),
}

/// The last catalog fetched, and whether it is known to be out of date.
#[derive(Debug)]
struct Fetched {
    at: Instant,
    catalog: Arc<Catalog>,
    /// The apiserver refused a resource this catalog resolved as not served: fetch again at the next
    /// lookup (still at most every `REDISCOVER_AFTER`).
    stale: bool,
}

/// Resolves resource names: built-ins at once, the rest against the apiserver's discovery, cached.
#[derive(Clone)]
pub(crate) struct Resolver {
    client: Client,
    cache: Arc<Mutex<Option<Fetched>>>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver").finish_non_exhaustive()
    }
}

/// What an app's name asks for.
#[derive(Debug, PartialEq)]
enum NameForm<'a> {
    /// "apps/v1/deployments", "v1/configmaps".
    Exact { group: &'a str, version: &'a str, plural: &'a str },
    /// "configmaps", "deployments.apps", "Deployment", "Deployment.apps".
    Name { name: &'a str, group: Option<&'a str> },
}

fn parse(name: &str) -> Result<NameForm<'_>, ResolveError> {
    let malformed = || ResolveError::Malformed(name.to_owned());
    if name.is_empty() || name.chars().any(|c| c.is_whitespace()) {
        return Err(malformed());
    }
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [version, plural] if !version.is_empty() && !plural.is_empty() => {
            Ok(NameForm::Exact { group: "", version, plural })
        }
        [group, version, plural] if [group, version, plural].iter().all(|p| !p.is_empty()) => {
            Ok(NameForm::Exact { group, version, plural })
        }
        [single] => Ok(match single.split_once('.') {
            Some((name, group)) if !name.is_empty() && !group.is_empty() => NameForm::Name { name, group: Some(group) },
            Some(_) => return Err(malformed()),
            None => NameForm::Name { name: single, group: None },
        }),
        _ => Err(malformed()),
    }
}

impl Resolver {
    /// A resolver using `client` for discovery.
    pub(crate) fn new(client: Client) -> Self {
        Self { client, cache: Arc::new(Mutex::new(None)) }
    }

    /// Resolves `name` to a resource that supports list and watch. A built-in resource costs no request;
    /// anything else at most one discovery fetch (two requests, sent together).
    pub(crate) async fn resolve(&self, name: &str) -> Result<Resolved, ResolveError> {
        let query = parse(name)?;
        if let Some(served) = BUILTIN.find(&query) {
            return resolved(name, served);
        }
        let catalog = self.catalog(false).await?;
        let served = match catalog.find(&query) {
            Some(served) => served.clone(),
            None => self
                .catalog(true)
                .await?
                .find(&query)
                .cloned()
                .ok_or_else(|| ResolveError::NotFound(name.to_owned()))?,
        };
        resolved(name, &served)
    }

    /// Marks the cached catalog out of date: the apiserver answered a resource it resolved with "not
    /// served" (a custom resource deleted, or its version no longer served).
    pub(crate) async fn invalidate(&self) {
        if let Some(fetched) = self.cache.lock().await.as_mut() {
            fetched.stale = true;
        }
    }

    /// The cached catalog, fetched first when there is none, or when it is stale, older than
    /// `CATALOG_MAX_AGE` or (`after_miss`) lacked a name; but never again within `REDISCOVER_AFTER`.
    async fn catalog(&self, after_miss: bool) -> Result<Arc<Catalog>, ResolveError> {
        let mut cache = self.cache.lock().await;
        if let Some(fetched) = cache.as_ref() {
            let age = fetched.at.elapsed();
            let outdated = after_miss || fetched.stale || age >= CATALOG_MAX_AGE;
            if !outdated || age < REDISCOVER_AFTER {
                return Ok(fetched.catalog.clone());
            }
        }
        let catalog = Arc::new(catalog::fetch(&self.client).await.map_err(ResolveError::Discovery)?);
        tracing::debug!("fetched the apiserver's discovery");
        *cache = Some(Fetched { at: Instant::now(), catalog: catalog.clone(), stale: false });
        Ok(catalog)
    }
}

/// What `name` resolved to, if it can be listed and watched.
fn resolved(name: &str, served: &Served) -> Result<Resolved, ResolveError> {
    if !served.watchable {
        return Err(ResolveError::NotWatchable(name.to_owned()));
    }
    Ok(Resolved { api: served.id.clone(), namespaced: served.namespaced })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::watch::resolve::catalog::tests::{APIS, CORE, apiserver};

    #[tokio::test(start_paused = true)]
    async fn built_ins_cost_no_request_and_the_rest_one_fetch_of_two() {
        let (client, requests) = apiserver(CORE, APIS);
        let resolver = Resolver::new(client);
        for name in ["configmaps", "v1/configmaps", "ConfigMap", "configmap", "leases.coordination.k8s.io"] {
            let resolved = resolver.resolve(name).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(resolved.namespaced, "{name}");
        }
        assert_eq!(requests.load(Ordering::SeqCst), 0, "built-ins are known without asking");

        let widgets = resolver.resolve("widgets.example.com").await.expect("widgets");
        assert_eq!((widgets.api.version.as_str(), widgets.namespaced), ("v2", false));
        assert_eq!(requests.load(Ordering::SeqCst), 2, "/api and /apis");
        resolver.resolve("example.com/v1/gadgets").await.expect("gadgets");
        assert_eq!(requests.load(Ordering::SeqCst), 2, "cached");

        assert!(matches!(resolver.resolve("sprockets").await, Err(ResolveError::NotFound(_))));
        assert_eq!(requests.load(Ordering::SeqCst), 2, "a miss right after a fetch waits for the rate limit");
        tokio::time::advance(REDISCOVER_AFTER).await;
        assert!(matches!(resolver.resolve("sprockets").await, Err(ResolveError::NotFound(_))));
        assert_eq!(requests.load(Ordering::SeqCst), 4, "a later miss fetches again, once");
        assert!(matches!(resolver.resolve("bindings").await, Err(ResolveError::NotWatchable(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_catalog_is_fetched_again_when_stale_or_old() {
        let (client, requests) = apiserver(CORE, APIS);
        let resolver = Resolver::new(client);
        resolver.resolve("widgets").await.expect("widgets");
        resolver.invalidate().await;
        resolver.resolve("widgets").await.expect("widgets");
        assert_eq!(requests.load(Ordering::SeqCst), 2, "not within the rate limit, even when stale");
        tokio::time::advance(REDISCOVER_AFTER).await;
        resolver.resolve("widgets").await.expect("widgets");
        assert_eq!(requests.load(Ordering::SeqCst), 4, "stale: fetched again");
        resolver.resolve("widgets").await.expect("widgets");
        tokio::time::advance(CATALOG_MAX_AGE).await;
        resolver.resolve("widgets").await.expect("widgets");
        assert_eq!(requests.load(Ordering::SeqCst), 6, "old: fetched again");
    }

    #[test]
    fn names_parse_into_queries() {
        assert_eq!(parse("configmaps").ok(), Some(NameForm::Name { name: "configmaps", group: None }));
        assert_eq!(parse("Deployment").ok(), Some(NameForm::Name { name: "Deployment", group: None }));
        assert_eq!(parse("deployments.apps").ok(), Some(NameForm::Name { name: "deployments", group: Some("apps") }));
        assert_eq!(
            parse("widgets.example.com").ok(),
            Some(NameForm::Name { name: "widgets", group: Some("example.com") })
        );
        assert_eq!(
            parse("v1/configmaps").ok(),
            Some(NameForm::Exact { group: "", version: "v1", plural: "configmaps" })
        );
        assert_eq!(
            parse("apps/v1/deployments").ok(),
            Some(NameForm::Exact { group: "apps", version: "v1", plural: "deployments" })
        );
    }

    #[test]
    fn malformed_names_are_refused() {
        for bad in ["", "a/b/c/d", "/v1/x", "v1/", ".apps", "config maps", "x."] {
            assert!(matches!(parse(bad), Err(ResolveError::Malformed(_))), "{bad:?}");
        }
    }
}
