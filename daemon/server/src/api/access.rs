//! Applies `access.rules`: a call goes ahead only if some rule grants its service, verb, resource and
//! namespace to its caller; otherwise PERMISSION_DENIED names what was asked, before anything reaches
//! the apiserver. No rules: everything is allowed.

use std::{fmt, sync::Arc};

use consistd_cluster::watch::Hub;
use consistd_core::config::{AccessRule, Live, Service};
use consistd_observe::metrics::Metrics;
use tonic::Status;

use super::{caller::Caller, status};

/// What a call asks for, as rules grant it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    /// The service called.
    pub service: Service,
    /// The verb the call is (one of [`Service::verbs`]).
    pub verb: &'static str,
    /// What it acts on.
    pub resource: Resource<'a>,
    /// The namespace it acts in; None for calls across all namespaces or outside any.
    pub namespace: Option<&'a str>,
}

/// What a call acts on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resource<'a> {
    /// Nothing named (inbox calls).
    None,
    /// A Kubernetes resource as the app named it ("ConfigMap", "v1/configmaps"); rules name it as
    /// "plural" or "plural.group", so it is resolved before it is matched.
    Kube(&'a str),
    /// An election, channel or destination, as rules name it.
    Named(&'a str),
}

/// The access rules and what checking them needs.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    rules: Live<Arc<[AccessRule]>>,
    hub: Arc<Hub>,
    metrics: Metrics,
}

impl Access {
    /// Checks calls against `rules` (as reloads change them: each call reads the rules in force when it
    /// starts), resolving Kubernetes resource names through `hub`'s discovery.
    pub(crate) fn new(rules: Live<Arc<[AccessRule]>>, hub: Arc<Hub>, metrics: Metrics) -> Self {
        Self { rules, hub, metrics }
    }

    /// Ok if a rule grants `ask` to `caller`; PERMISSION_DENIED naming what was asked if none does.
    pub(crate) async fn check(&self, caller: &Caller, ask: Ask<'_>) -> Result<(), Status> {
        let rules = self.rules.get();
        if rules.is_empty() {
            return Ok(());
        }
        let resource = match ask.resource {
            Resource::None => None,
            Resource::Named(name) => Some(name.to_owned()),
            // Resolving may take a discovery round trip: only when a rule of this service names resources.
            Resource::Kube(name) if rules.iter().any(|r| r.service == ask.service && !r.resources.is_empty()) => {
                let resolved = self.hub.resolve(name).await.map_err(|e| status::resource_error(e.into()))?;
                let id = resolved.api;
                Some(if id.group.is_empty() { id.plural } else { format!("{}.{}", id.plural, id.group) })
            }
            Resource::Kube(name) => Some(name.to_owned()),
        };
        let asked = Asked { caller, ask, resource: resource.as_deref() };
        if rules.iter().any(|rule| asked.granted_by(rule)) {
            return Ok(());
        }
        self.metrics.count_refused_call(&caller.uid_label());
        tracing::info!(uid = caller.uid, pid = caller.pid, asked = %asked, "call refused by access.rules");
        Err(status::access_denied(asked))
    }
}

/// A call with its resource in the rules' form.
struct Asked<'a> {
    caller: &'a Caller,
    ask: Ask<'a>,
    resource: Option<&'a str>,
}

impl Asked<'_> {
    fn granted_by(&self, rule: &AccessRule) -> bool {
        let listed = |list: &[String], value: Option<&str>| {
            list.is_empty() || value.is_some_and(|v| list.iter().any(|l| l == v))
        };
        rule.service == self.ask.service
            && (rule.verbs.is_empty() || rule.verbs.iter().any(|v| v == self.ask.verb))
            && listed(&rule.resources, self.resource)
            && listed(&rule.namespaces, self.ask.namespace)
            && (rule.uids.is_empty() || self.caller.uid.is_some_and(|uid| rule.uids.contains(&uid)))
    }
}

impl fmt::Display for Asked<'_> {
    /// e.g. `objects "patch" on configmaps in namespace "team-a" to uid 1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.ask.service.name(), self.ask.verb)?;
        if let Some(resource) = self.resource {
            write!(f, " on {resource}")?;
        }
        match self.ask.namespace {
            Some(namespace) => write!(f, " in namespace {namespace:?}")?,
            None if matches!(self.ask.resource, Resource::Kube(_)) => write!(f, " across all namespaces")?,
            None => {}
        }
        write!(f, " to {}", self.caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(service: Service, verbs: &[&str], resources: &[&str], namespaces: &[&str], uids: &[u32]) -> AccessRule {
        let strings = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
        AccessRule {
            service,
            verbs: strings(verbs),
            resources: strings(resources),
            namespaces: strings(namespaces),
            uids: uids.to_vec(),
        }
    }

    fn asked<'a>(
        caller: &'a Caller,
        service: Service,
        verb: &'static str,
        resource: &'a str,
        ns: Option<&'a str>,
    ) -> Asked<'a> {
        Asked {
            caller,
            ask: Ask { service, verb, resource: Resource::Kube(resource), namespace: ns },
            resource: Some(resource),
        }
    }

    const APP: Caller = Caller { uid: Some(1000), gid: Some(1000), pid: Some(7) };

    #[test]
    fn a_rule_grants_only_what_every_field_it_sets_matches() {
        let patch_in_x = rule(Service::Objects, &["patch"], &["configmaps"], &["x"], &[]);
        assert!(asked(&APP, Service::Objects, "patch", "configmaps", Some("x")).granted_by(&patch_in_x));
        assert!(!asked(&APP, Service::Objects, "patch", "configmaps", Some("y")).granted_by(&patch_in_x));
        assert!(!asked(&APP, Service::Objects, "delete", "configmaps", Some("x")).granted_by(&patch_in_x));
        assert!(!asked(&APP, Service::Objects, "patch", "secrets", Some("x")).granted_by(&patch_in_x));
        assert!(!asked(&APP, Service::Watch, "watch", "configmaps", Some("x")).granted_by(&patch_in_x));
        assert!(
            !asked(&APP, Service::Objects, "patch", "configmaps", None).granted_by(&patch_in_x),
            "a rule limited to namespaces does not grant calls across all of them"
        );
    }

    #[test]
    fn empty_fields_match_anything_and_uids_limit_the_caller() {
        let watch_all = rule(Service::Watch, &[], &[], &[], &[]);
        assert!(asked(&APP, Service::Watch, "watch", "secrets", None).granted_by(&watch_all));
        let root_only = rule(Service::Watch, &[], &[], &[], &[0]);
        assert!(!asked(&APP, Service::Watch, "watch", "secrets", None).granted_by(&root_only));
        let unknown = Caller::default();
        assert!(!asked(&unknown, Service::Watch, "watch", "secrets", None).granted_by(&root_only));
    }

    #[test]
    fn a_refusal_names_what_was_asked() {
        let message = asked(&APP, Service::Objects, "patch", "configmaps", Some("x")).to_string();
        assert_eq!(message, "objects \"patch\" on configmaps in namespace \"x\" to uid 1000 (gid 1000)");
    }
}
