//! What the apiserver serves, as one table read from aggregated discovery: `/api` and `/apis`, two
//! requests sent together, whatever the number of groups.

use kube::{
    Client,
    core::discovery::v2::{ACCEPT_AGGREGATED_DISCOVERY_V2, APIGroupDiscovery, APIGroupDiscoveryList},
    discovery::{Discovery, Scope, verbs},
};

use super::{NameForm, ResourceId};

/// A resource in a [`Catalog`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Served {
    /// Group, version, kind and plural.
    pub id: ResourceId,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether it supports both list and watch, which every subscription and cached read needs.
    pub watchable: bool,
}

/// Resources by group and version, in the apiserver's order: it lists groups by priority (the core
/// group, then the built-in groups, then custom and aggregated ones) and each group's versions
/// preferred first, which is how an ambiguous name is settled.
#[derive(Debug, Default)]
pub(super) struct Catalog {
    groups: Vec<CatalogGroup>,
}

/// One API group's versions, the preferred first.
#[derive(Debug)]
struct CatalogGroup {
    /// Empty for the core group.
    name: String,
    versions: Vec<CatalogVersion>,
}

/// One version of a group and its top-level resources (no subresources).
#[derive(Debug)]
struct CatalogVersion {
    name: String,
    resources: Vec<Served>,
}

impl Catalog {
    /// A catalog of `served`, grouped in the order each group and version first appears.
    pub(super) fn from_served(served: impl IntoIterator<Item = Served>) -> Self {
        let mut catalog = Self::default();
        for s in served {
            let groups = &mut catalog.groups;
            let g = groups.iter().position(|g| g.name == s.id.group).unwrap_or_else(|| {
                groups.push(CatalogGroup { name: s.id.group.clone(), versions: Vec::new() });
                groups.len() - 1
            });
            let versions = &mut groups[g].versions;
            let v = versions.iter().position(|v| v.name == s.id.version).unwrap_or_else(|| {
                versions.push(CatalogVersion { name: s.id.version.clone(), resources: Vec::new() });
                versions.len() - 1
            });
            let version = &mut versions[v];
            version.resources.push(s);
        }
        catalog
    }

    /// The catalog of the aggregated discovery documents of `/api` (the core group) and `/apis`.
    fn from_aggregated(core: APIGroupDiscoveryList, apis: APIGroupDiscoveryList) -> Self {
        let groups = core.items.into_iter().chain(apis.items).map(|g| {
            let name = group_name(&g);
            let versions = g
                .versions
                .into_iter()
                .map(|v| {
                    let version = v.version.unwrap_or_default();
                    let resources = v
                        .resources
                        .into_iter()
                        .map(|r| Served {
                            id: ResourceId {
                                group: name.clone(),
                                version: version.clone(),
                                kind: r.response_kind.and_then(|k| k.kind).unwrap_or_default(),
                                plural: r.resource.unwrap_or_default(),
                            },
                            namespaced: r.scope.as_deref() == Some("Namespaced"),
                            watchable: [verbs::LIST, verbs::WATCH].iter().all(|verb| r.verbs.iter().any(|v| v == verb)),
                        })
                        .collect();
                    CatalogVersion { name: version, resources }
                })
                .collect();
            CatalogGroup { name, versions }
        });
        Self { groups: groups.collect() }
    }

    /// The catalog of kube's group-by-group discovery, for apiservers without aggregated discovery.
    fn from_discovery(discovery: &Discovery) -> Self {
        let mut groups: Vec<CatalogGroup> = discovery
            .groups()
            .map(|g| {
                let preferred = g.preferred_version_or_latest();
                let mut names: Vec<&str> = g.versions().collect();
                names.sort_by_key(|v| *v != preferred);
                let versions = names
                    .into_iter()
                    .map(|version| CatalogVersion {
                        name: version.to_owned(),
                        resources: g
                            .versioned_resources(version)
                            .into_iter()
                            .map(|(ar, caps)| Served {
                                watchable: caps.supports_operation(verbs::LIST)
                                    && caps.supports_operation(verbs::WATCH),
                                namespaced: caps.scope == Scope::Namespaced,
                                id: ResourceId {
                                    group: ar.group,
                                    version: ar.version,
                                    kind: ar.kind,
                                    plural: ar.plural,
                                },
                            })
                            .collect(),
                    })
                    .collect();
                CatalogGroup { name: g.name().to_owned(), versions }
            })
            .collect();
        groups.sort_by_key(|g| !g.name.is_empty());
        Self { groups }
    }

    /// The resource `query` names. An exact query names group, version and plural. A name (plural or
    /// kind, any case) is looked up in the named group, or else in every group, the core group first
    /// (as kubectl prefers "events" over "events.events.k8s.io"), then in the apiserver's order; within
    /// a group, the preferred version first.
    pub(super) fn find(&self, query: &NameForm<'_>) -> Option<&Served> {
        match *query {
            NameForm::Exact { group, version, plural } => self
                .groups
                .iter()
                .find(|g| g.name == group)?
                .versions
                .iter()
                .find(|v| v.name == version)?
                .resources
                .iter()
                .find(|r| r.id.plural == plural),
            NameForm::Name { name, group } => {
                let mut groups: Vec<&CatalogGroup> =
                    self.groups.iter().filter(|g| group.is_none_or(|want| g.name == want)).collect();
                groups.sort_by_key(|g| !g.name.is_empty());
                groups
                    .into_iter()
                    .flat_map(|g| &g.versions)
                    .flat_map(|v| &v.resources)
                    .find(|r| r.id.plural == name || r.id.kind.eq_ignore_ascii_case(name))
            }
        }
    }

    /// Every resource it holds, each version of each.
    #[cfg(test)]
    pub(super) fn ids(&self) -> impl Iterator<Item = &ResourceId> {
        self.groups.iter().flat_map(|g| &g.versions).flat_map(|v| &v.resources).map(|r| &r.id)
    }
}

fn group_name(group: &APIGroupDiscovery) -> String {
    group.metadata.as_ref().and_then(|m| m.name.clone()).unwrap_or_default()
}

/// Reads the catalog in at most two requests, `/api` and `/apis` in aggregated form, sent together.
/// An apiserver that answers them in the old form (older than Kubernetes 1.26, or with aggregated
/// discovery turned off) is asked group by group instead, as before, and says so in the log.
pub(super) async fn fetch(client: &Client) -> Result<Catalog, kube::Error> {
    let (core, apis) = tokio::try_join!(aggregated(client, "/api"), aggregated(client, "/apis"))?;
    if let (Some(core), Some(apis)) = (core, apis) {
        return Ok(Catalog::from_aggregated(core, apis));
    }
    tracing::warn!("the apiserver does not serve aggregated discovery; discovering group by group, one request each");
    let discovery = Discovery::new(client.clone()).run().await?;
    Ok(Catalog::from_discovery(&discovery))
}

/// The aggregated discovery document at `path`, or None when the apiserver answered in the old form
/// (an APIVersions or APIGroupList, which the Accept header allows as a last resort).
async fn aggregated(client: &Client, path: &str) -> Result<Option<APIGroupDiscoveryList>, kube::Error> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, ACCEPT_AGGREGATED_DISCOVERY_V2)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let text = client.request_text(request).await?;
    let document: serde_json::Value = serde_json::from_str(&text).map_err(kube::Error::SerdeError)?;
    if document.get("kind").and_then(serde_json::Value::as_str) != Some("APIGroupDiscoveryList") {
        return Ok(None);
    }
    serde_json::from_value(document).map(Some).map_err(kube::Error::SerdeError)
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use http::{Request, Response};
    use http_body_util::Full;
    use kube::client::Body;

    use super::*;

    pub(in crate::watch::resolve) const CORE: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[
        {"metadata":{},"versions":[{"version":"v1","resources":[
            {"resource":"configmaps","responseKind":{"group":"","version":"v1","kind":"ConfigMap"},"scope":"Namespaced","verbs":["get","list","watch"]},
            {"resource":"events","responseKind":{"group":"","version":"v1","kind":"Event"},"scope":"Namespaced","verbs":["list","watch"]},
            {"resource":"bindings","responseKind":{"group":"","version":"v1","kind":"Binding"},"scope":"Namespaced","verbs":["create"]}]}]}]}"#;
    pub(in crate::watch::resolve) const APIS: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[
        {"metadata":{"name":"events.k8s.io"},"versions":[{"version":"v1","resources":[
            {"resource":"events","responseKind":{"group":"events.k8s.io","version":"v1","kind":"Event"},"scope":"Namespaced","verbs":["list","watch"]}]}]},
        {"metadata":{"name":"example.com"},"versions":[
            {"version":"v2","resources":[{"resource":"widgets","responseKind":{"kind":"Widget"},"scope":"Cluster","verbs":["list","watch"],
                "subresources":[{"subresource":"status","verbs":["get"]}]}]},
            {"version":"v1","resources":[{"resource":"widgets","responseKind":{"kind":"Widget"},"scope":"Cluster","verbs":["list","watch"]},
                {"resource":"gadgets","responseKind":{"kind":"Gadget"},"scope":"Namespaced","verbs":["list","watch"]}]}]}]}"#;

    /// A client whose "apiserver" answers `/api` and `/apis` with `core` and `apis` and counts requests.
    pub(in crate::watch::resolve) fn apiserver(core: &'static str, apis: &'static str) -> (Client, Arc<AtomicUsize>) {
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            count.fetch_add(1, Ordering::SeqCst);
            let body = match request.uri().path() {
                "/api" => core,
                "/apis" => apis,
                _ => r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#,
            };
            let status = if matches!(request.uri().path(), "/api" | "/apis") { 200 } else { 404 };
            async move {
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
            }
        });
        (Client::new(service, "default"), requests)
    }

    fn id(group: &str, version: &str, kind: &str, plural: &str) -> ResourceId {
        ResourceId { group: group.into(), version: version.into(), kind: kind.into(), plural: plural.into() }
    }

    #[tokio::test]
    async fn aggregated_discovery_is_two_requests_and_names_resolve_by_priority() {
        let (client, requests) = apiserver(CORE, APIS);
        let catalog = fetch(&client).await.expect("fetch the catalog");
        assert_eq!(requests.load(Ordering::SeqCst), 2, "/api and /apis, nothing else");
        assert_eq!(catalog.ids().count(), 7);

        let name = |name, group| catalog.find(&NameForm::Name { name, group }).map(|s| s.id.clone());
        assert_eq!(name("events", None), Some(id("", "v1", "Event", "events")), "the core group wins");
        assert_eq!(name("events", Some("events.k8s.io")), Some(id("events.k8s.io", "v1", "Event", "events")));
        assert_eq!(name("widget", None), Some(id("example.com", "v2", "Widget", "widgets")), "preferred version");
        assert_eq!(name("Gadget", None), Some(id("example.com", "v1", "Gadget", "gadgets")), "any version serving it");
        assert_eq!(name("status", None), None, "subresources are not resources");
        let exact = catalog.find(&NameForm::Exact { group: "example.com", version: "v1", plural: "widgets" });
        assert_eq!(exact.map(|s| (s.id.version.as_str(), s.namespaced)), Some(("v1", false)));
        let binding = catalog.find(&NameForm::Name { name: "bindings", group: None }).expect("bindings");
        assert!(!binding.watchable, "create-only");
        assert!(catalog.find(&NameForm::Name { name: "configmaps", group: None }).is_some_and(|s| s.watchable));
    }

    #[tokio::test]
    async fn an_apiserver_without_aggregated_discovery_is_asked_group_by_group() {
        // The old forms: /api lists versions, /apis lists groups (none here), /api/v1 the resources.
        let core = r#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}"#;
        let apis = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#;
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            count.fetch_add(1, Ordering::SeqCst);
            let body = match request.uri().path() {
                "/api" => core,
                "/apis" => apis,
                _ => {
                    r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[
                    {"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["list","watch"]}]}"#
                }
            };
            async move {
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
            }
        });
        let catalog = fetch(&Client::new(service, "default")).await.expect("fetch the catalog");
        assert!(requests.load(Ordering::SeqCst) > 2, "the old way costs more than two requests");
        let found = catalog.find(&NameForm::Name { name: "ConfigMap", group: None }).expect("found");
        assert_eq!(found.id, id("", "v1", "ConfigMap", "configmaps"));
        assert!(found.namespaced && found.watchable);
    }
}
