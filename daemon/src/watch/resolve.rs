//! Turns what an app names ("configmaps", "deployments.apps", "apps/v1/deployments", "Deployment") into
//! the apiserver resource it means, through discovery. Discovery is cached and run again when a name is
//! not found, so custom resources created after start are found too.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use kube::{
    Client,
    discovery::{ApiCapabilities, ApiResource, Discovery, Scope, verbs},
};
use tokio::sync::Mutex;

/// Discovery is run again on a miss at most this often, so a stream of typos cannot hammer the apiserver.
const REDISCOVER_AFTER: Duration = Duration::from_secs(2);

/// An apiserver resource an app may list and watch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Resolved {
    /// Group, version, kind and plural.
    pub api: ResourceId,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

/// The identity of a resource (a hashable subset of kube's `ApiResource`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ResourceId {
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
    /// kube's form of the same resource.
    pub(crate) fn api_resource(&self) -> ApiResource {
        let api_version =
            if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) };
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
pub(crate) enum ResolveError {
    /// Nothing the apiserver serves has that name.
    #[error("the apiserver serves no resource named {0:?}")]
    NotFound(String),
    /// The name matches a resource that cannot be listed and watched.
    #[error("resource {0:?} does not support list and watch")]
    NotWatchable(String),
    /// The name is not of any accepted form.
    #[error("{0:?} is not a resource name: use plural, plural.group, group/version/plural or Kind")]
    Malformed(String),
    /// Discovery could not be run (the apiserver refused or was unreachable), so no name was looked up.
    #[error("discover apiserver resources")]
    Discovery(#[source] kube::Error),
}

/// The last discovery and when it ran.
type CachedDiscovery = Option<(Instant, Arc<Discovery>)>;

/// Resolves resource names against the apiserver's discovery, cached.
#[derive(Clone)]
pub(crate) struct Resolver {
    client: Client,
    cache: Arc<Mutex<CachedDiscovery>>,
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

    /// Resolves `name` to a resource that supports list and watch.
    pub(crate) async fn resolve(&self, name: &str) -> Result<Resolved, ResolveError> {
        let query = parse(name)?;
        let discovery = self.discovery(false).await?;
        let found = match find(&discovery, &query) {
            Some(found) => Some(found),
            None => find(&*self.discovery(true).await?, &query),
        };
        let (api, caps) = found.ok_or_else(|| ResolveError::NotFound(name.to_owned()))?;
        if !(caps.supports_operation(verbs::LIST) && caps.supports_operation(verbs::WATCH)) {
            return Err(ResolveError::NotWatchable(name.to_owned()));
        }
        Ok(Resolved {
            api: ResourceId { group: api.group, version: api.version, kind: api.kind, plural: api.plural },
            namespaced: caps.scope == Scope::Namespaced,
        })
    }

    /// The cached discovery; with `refresh`, run again unless it ran within `REDISCOVER_AFTER`.
    async fn discovery(&self, refresh: bool) -> Result<Arc<Discovery>, ResolveError> {
        let mut cache = self.cache.lock().await;
        if let Some((at, discovery)) = cache.as_ref()
            && (!refresh || at.elapsed() < REDISCOVER_AFTER)
        {
            return Ok(discovery.clone());
        }
        let discovery = Arc::new(Discovery::new(self.client.clone()).run().await.map_err(ResolveError::Discovery)?);
        *cache = Some((Instant::now(), discovery.clone()));
        Ok(discovery)
    }
}

/// Finds the resource a query names. The core group wins over others with the same plural or kind
/// (as kubectl prefers "events" over "events.events.k8s.io"); otherwise the first group in discovery order.
fn find(discovery: &Discovery, query: &NameForm<'_>) -> Option<(ApiResource, ApiCapabilities)> {
    match *query {
        NameForm::Exact { group, version, plural } => {
            let group = discovery.get(group)?;
            group.versioned_resources(version).into_iter().find(|(ar, _)| ar.plural == plural)
        }
        NameForm::Name { name, group } => {
            let lower = name.to_ascii_lowercase();
            let mut groups: Vec<_> = discovery.groups().filter(|g| group.is_none_or(|want| g.name() == want)).collect();
            groups.sort_by_key(|g| !g.name().is_empty());
            groups.into_iter().find_map(|g| {
                g.recommended_resources()
                    .into_iter()
                    .find(|(ar, _)| ar.plural == name || ar.kind.to_ascii_lowercase() == lower)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
