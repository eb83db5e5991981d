//! Resolving resource names on a slow link, counted by the real apiserver's own metrics: a
//! built-in resource costs no discovery request, a custom resource at most two (aggregated `/api` and
//! `/apis`), and a custom resource defined after the daemon started is found.
//!
//! The daemon runs as a user of its own, and a FlowSchema sorts that user's discovery requests apart, so
//! the apiserver's flow-control metrics count exactly the daemon's discovery requests. (Like the test
//! namespaces, the cluster-scoped FlowSchema, ClusterRole and binding are left to the throwaway control
//! plane; their names are unique to the run.)

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use consistd_client::proto::{EventType, GetRequest};
use consistd_testkit::{
    Daemon,
    proxy::DelayProxy,
    watch::{Events, raw},
};
use k8s_openapi::{
    api::{
        core::v1::ConfigMap,
        flowcontrol::v1::FlowSchema,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{Api, Client, api::PostParams};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

/// Added to everything the apiserver sends the daemon: enough to make every round trip count, short
/// enough to keep the test quick.
const DELAY: Duration = Duration::from_secs(1);

#[tokio::test]
async fn built_ins_cost_no_discovery_request_and_custom_resources_at_most_two_even_when_defined_later() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let configmap: ConfigMap =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "a" } })).expect("object");
    Api::<ConfigMap>::namespaced(kube.clone(), &ns).create(&PostParams::default(), &configmap).await.expect("create a");
    let group = format!("{ns}.example.com");
    let user = format!("consistd-discovery-{ns}");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = as_user(&kube, &user, &group, dir.path()).await;
    count_discovery_requests(&kube, &user).await;
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    proxy.set_delay(DELAY);
    let kubeconfig = via(&kubeconfig, &proxy);
    let daemon = Daemon::builder(BIN).env("KUBECONFIG", kubeconfig.display().to_string()).start().await;
    let client = daemon.client();

    // Built-in: the watch starts without discovery, and so does a read.
    let before = discovery_requests(&kube, &user).await;
    let mut configmaps = Events::open(&client, raw("configmaps", &ns)).await;
    configmaps.until_synced().await;
    let get =
        GetRequest { resource: "ConfigMap".into(), namespace: ns.clone(), name: "a".into(), ..Default::default() };
    client.objects().get(get).await.expect("get configmap a");
    let built_in = discovery_requests(&kube, &user).await - before;
    eprintln!("discovery requests for configmaps (subscribe and get) with {DELAY:?} delay: {built_in}");
    assert_eq!(built_in, 0, "subscribing to configmaps and reading one made {built_in} discovery requests");

    // A custom resource the daemon has never seen: one aggregated discovery, /api and /apis.
    define(&kube, &group, "widgets", "Widget").await;
    let before = discovery_requests(&kube, &user).await;
    subscribe_until_found(&client, &format!("widgets.{group}"), &ns).await;
    let custom = discovery_requests(&kube, &user).await - before;
    eprintln!("discovery requests for widgets with {DELAY:?} delay: {custom}");
    assert!((1..=2).contains(&custom), "subscribing to widgets made {custom} discovery requests");

    // Defined after the daemon's catalog was fetched: the miss fetches it again, once.
    define(&kube, &group, "gadgets", "Gadget").await;
    let before = discovery_requests(&kube, &user).await;
    subscribe_until_found(&client, &format!("gadgets.{group}"), &ns).await;
    let later = discovery_requests(&kube, &user).await - before;
    eprintln!("discovery requests for gadgets, defined later, with {DELAY:?} delay: {later}");
    assert!((1..=2).contains(&later), "subscribing to gadgets, defined later, made {later} discovery requests");
}

/// Subscribes to `resource` in `ns` and reads SYNCED, retrying while the daemon says it is not found:
/// the daemon fetches discovery again on a miss only every 2 seconds.
async fn subscribe_until_found(client: &consistd_client::Client, resource: &str, ns: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match client.watch().subscribe(raw(resource, ns)).await {
            Ok(stream) => {
                let first = stream.into_inner().message().await.expect("read").expect("an event");
                assert_eq!(first.r#type(), EventType::Synced, "{resource}");
                return;
            }
            Err(status) if status.code() == Code::NotFound && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(status) => panic!("subscribe to {resource}: {status}"),
        }
    }
}

/// Creates the namespaced custom resource `plural.group` (version v1) and waits until the apiserver's
/// aggregated discovery lists it, so the daemon's next discovery finds it (the admin asks: not counted).
async fn define(kube: &Client, group: &str, plural: &str, kind: &str) {
    let singular = kind.to_ascii_lowercase();
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("{plural}.{group}") },
        "spec": {
            "group": group,
            "names": { "plural": plural, "singular": singular, "kind": kind, "listKind": format!("{kind}List") },
            "scope": "Namespaced",
            "versions": [{ "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } } }]
        }
    }))
    .expect("CRD object");
    Api::<CustomResourceDefinition>::all(kube.clone()).create(&PostParams::default(), &crd).await.expect("create CRD");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let apis = kube.list_api_groups_aggregated().await.expect("aggregated discovery of /apis");
        let served = apis.items.iter().any(|g| {
            g.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some(group)
                && g.versions.iter().any(|v| v.resources.iter().any(|r| r.resource.as_deref() == Some(plural)))
        });
        if served {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{plural}.{group} not served 30 s after its CRD was created");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A kubeconfig for `user`, allowed to read and watch configmaps and any resource of `group`, so its
/// requests are not the admin's (which flow control exempts before any FlowSchema of ours could count
/// them).
async fn as_user(kube: &Client, user: &str, group: &str, dir: &Path) -> PathBuf {
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": { "name": user },
        "rules": [
            { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"] },
            { "apiGroups": [group], "resources": ["*"], "verbs": ["get", "list", "watch"] }
        ]
    }))
    .expect("ClusterRole object");
    Api::<ClusterRole>::all(kube.clone()).create(&PostParams::default(), &role).await.expect("create ClusterRole");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": user },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }]
    }))
    .expect("ClusterRoleBinding object");
    Api::<ClusterRoleBinding>::all(kube.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create ClusterRoleBinding");
    consistd_testkit::kubeconfig_for_user(user, dir)
}

/// A copy of `kubeconfig` that reaches the apiserver through `proxy`.
fn via(kubeconfig: &Path, proxy: &DelayProxy) -> PathBuf {
    let text = std::fs::read_to_string(kubeconfig).expect("read kubeconfig");
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.trim_start().strip_prefix("server: ") {
            Some(_) => format!("    server: https://{}", proxy.addr()),
            None => l.to_owned(),
        })
        .collect();
    let path = kubeconfig.with_extension("via-proxy");
    std::fs::write(&path, lines.join("\n")).expect("write kubeconfig");
    path
}

/// Creates a FlowSchema that sorts `user`'s discovery requests (`GET /api`, `/apis` and below, in any
/// form) apart, so the apiserver's `apiserver_flowcontrol_dispatched_requests_total` counts them under the
/// user's name, and waits until it does. `apiserver_request_total` would not do: it counts aggregated
/// discovery (as `resource="", subresource="api"` or `"apis"`) but not the group-by-group requests at all.
async fn count_discovery_requests(kube: &Client, user: &str) {
    let schema: FlowSchema = serde_json::from_value(serde_json::json!({
        "metadata": { "name": user },
        "spec": {
            "matchingPrecedence": 2,
            "priorityLevelConfiguration": { "name": "exempt" },
            "rules": [{
                "subjects": [{ "kind": "User", "user": { "name": user } }],
                "nonResourceRules": [{ "verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*"] }]
            }]
        }
    }))
    .expect("FlowSchema object");
    Api::<FlowSchema>::all(kube.clone()).create(&PostParams::default(), &schema).await.expect("create FlowSchema");
    // Flow control takes up a new FlowSchema in the background: wait until it is no longer dangling
    // and the metrics name it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let schema = Api::<FlowSchema>::all(kube.clone()).get(user).await.expect("read FlowSchema");
        let conditions = schema.status.and_then(|s| s.conditions).unwrap_or_default();
        let dangling = conditions.iter().any(|c| c.type_ == "Dangling" && c.status.as_deref() == Some("True"));
        if !conditions.is_empty() && !dangling {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the apiserver never took up FlowSchema {user}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many of `user`'s discovery requests the apiserver has dispatched, by its own metrics (see
/// [`count_discovery_requests`]).
async fn discovery_requests(kube: &Client, user: &str) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("metrics request");
    let text = kube.request_text(request).await.expect("read the apiserver's /metrics");
    let series = format!("apiserver_flowcontrol_dispatched_requests_total{{flow_schema=\"{user}\",");
    text.lines()
        .filter(|line| line.starts_with(&series))
        .filter_map(|line| line.rsplit_once(' '))
        .map(|(_, value)| value.parse::<u64>().unwrap_or_else(|e| panic!("metric value {value:?}: {e}")))
        .sum()
}
