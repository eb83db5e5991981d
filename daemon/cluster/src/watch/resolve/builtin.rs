//! The built-in resources apps watch most, known without asking the apiserver: built from k8s-openapi's
//! types (pinned to the Kubernetes minor the daemon is tested against), so no name is spelled by hand.

use std::sync::LazyLock;

use k8s_openapi::{
    ClusterResourceScope, ListableResource, NamespaceResourceScope,
    api::{
        apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet},
        autoscaling::v2::HorizontalPodAutoscaler,
        batch::v1::{CronJob, Job},
        coordination::v1::Lease,
        core::v1::{
            ConfigMap, Endpoints, Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
            Service, ServiceAccount,
        },
        discovery::v1::EndpointSlice,
        events::v1::Event as EventsEvent,
        networking::v1::{Ingress, NetworkPolicy},
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};

use super::{
    ResourceId,
    catalog::{Catalog, Served},
};

/// The built-in resources, the core group first (so "events" is the core group's, as on the apiserver).
/// Every one is listable and watchable in every Kubernetes the daemon supports; a resource not here is
/// found through discovery.
pub(super) static BUILTIN: LazyLock<Catalog> = LazyLock::new(|| {
    Catalog::from_served([
        served::<ConfigMap>(),
        served::<Secret>(),
        served::<Pod>(),
        served::<Service>(),
        served::<ServiceAccount>(),
        served::<Namespace>(),
        served::<Node>(),
        served::<Event>(),
        served::<Endpoints>(),
        served::<PersistentVolumeClaim>(),
        served::<PersistentVolume>(),
        served::<Deployment>(),
        served::<StatefulSet>(),
        served::<DaemonSet>(),
        served::<ReplicaSet>(),
        served::<Job>(),
        served::<CronJob>(),
        served::<Lease>(),
        served::<EndpointSlice>(),
        served::<EventsEvent>(),
        served::<Ingress>(),
        served::<NetworkPolicy>(),
        served::<PodDisruptionBudget>(),
        served::<HorizontalPodAutoscaler>(),
        served::<Role>(),
        served::<RoleBinding>(),
        served::<ClusterRole>(),
        served::<ClusterRoleBinding>(),
        served::<CustomResourceDefinition>(),
    ])
});

/// Whether a k8s-openapi scope is namespaced; subresource scopes have no answer, so a subresource type
/// cannot enter the table.
trait Namespaced {
    const NAMESPACED: bool;
}

impl Namespaced for NamespaceResourceScope {
    const NAMESPACED: bool = true;
}

impl Namespaced for ClusterResourceScope {
    const NAMESPACED: bool = false;
}

/// The table entry of the listable resource type `K`.
fn served<K>() -> Served
where
    K: ListableResource,
    K::Scope: Namespaced,
{
    Served {
        id: ResourceId {
            group: K::GROUP.to_owned(),
            version: K::VERSION.to_owned(),
            kind: K::KIND.to_owned(),
            plural: K::URL_PATH_SEGMENT.to_owned(),
        },
        namespaced: K::Scope::NAMESPACED,
        watchable: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::resolve::NameForm;

    fn name<'a>(name: &'a str, group: Option<&'a str>) -> Option<&'static Served> {
        BUILTIN.find(&NameForm::Name { name, group })
    }

    #[test]
    fn core_resources_are_in_the_table_with_their_apiserver_names_and_scopes() {
        let configmaps = name("configmaps", None).expect("configmaps");
        assert_eq!(configmaps.id.group, "");
        assert_eq!(configmaps.id.version, "v1");
        assert_eq!(configmaps.id.kind, "ConfigMap");
        assert_eq!(configmaps.id.plural, "configmaps");
        assert!(configmaps.namespaced && configmaps.watchable);
        for (query, group, version, plural, namespaced) in [
            ("secrets", "", "v1", "secrets", true),
            ("Pod", "", "v1", "pods", true),
            ("service", "", "v1", "services", true),
            ("namespaces", "", "v1", "namespaces", false),
            ("nodes", "", "v1", "nodes", false),
            ("events", "", "v1", "events", true),
            ("Deployment", "apps", "v1", "deployments", true),
            ("leases", "coordination.k8s.io", "v1", "leases", true),
            ("endpointslices", "discovery.k8s.io", "v1", "endpointslices", true),
            ("customresourcedefinitions", "apiextensions.k8s.io", "v1", "customresourcedefinitions", false),
        ] {
            let found = name(query, None).unwrap_or_else(|| panic!("{query} is in the table"));
            assert_eq!(
                (found.id.group.as_str(), found.id.version.as_str(), found.id.plural.as_str(), found.namespaced),
                (group, version, plural, namespaced),
                "{query}"
            );
        }
    }

    #[test]
    fn every_name_form_finds_built_ins_and_the_core_group_wins_unqualified_names() {
        let events = |group| name("events", group).map(|s| s.id.group.as_str());
        assert_eq!(events(None), Some(""), "kubectl's choice too");
        assert_eq!(events(Some("events.k8s.io")), Some("events.k8s.io"));
        assert_eq!(name("leases", Some("coordination.k8s.io")).map(|s| s.id.kind.as_str()), Some("Lease"));
        assert_eq!(name("Deployment", Some("apps")).map(|s| s.id.plural.as_str()), Some("deployments"));
        let exact = |group, version, plural| BUILTIN.find(&NameForm::Exact { group, version, plural }).is_some();
        assert!(exact("", "v1", "configmaps"));
        assert!(exact("apps", "v1", "deployments"));
        assert!(exact("discovery.k8s.io", "v1", "endpointslices"));
        assert!(!exact("apps", "v1beta1", "deployments"), "another version is discovery's to answer");
        assert!(name("widgets", None).is_none(), "custom resources are discovery's to answer");
        assert!(name("deployments", Some("example.com")).is_none(), "a name in another group is not a built-in");
    }

    #[test]
    fn the_table_names_each_resource_once() {
        let ids: Vec<&ResourceId> = BUILTIN.ids().collect();
        let unique: std::collections::HashSet<_> = ids.iter().map(|id| (&id.group, &id.version, &id.plural)).collect();
        assert_eq!(unique.len(), ids.len());
        assert_eq!(ids.len(), 29);
    }
}
