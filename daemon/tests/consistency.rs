//! The Kopf seed's timeline against the real apiserver, through a proxy that delays everything the
//! apiserver sends to consistd: a third party patches the object, the app reacts to what it saw by
//! patching through consistd. The CONSISTENT subscriber sees the state that triggers its handler once
//! and never the third party's intermediate state without the app's own patch; the RAW subscriber sees
//! every state. Also without delay, and when the own write takes longer than consistency.timeout to be
//! answered (the timeout runs from the answer). The seed's timeline at every delay, on the CONSISTENT
//! stream and the reconcile queue, is `slow_link.rs`.

use std::time::Duration;

use consistd_client::proto::{DeliveryMode, EventType, PatchRequest, PatchType, SubscribeResponse};
use consistd_testkit::{Daemon, proxy::DelayProxy, watch::Events};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

/// A daemon whose apiserver traffic goes through a delay proxy.
async fn daemon_behind_proxy(config: Option<&str>) -> (Daemon, DelayProxy) {
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let mut daemon = Daemon::builder(BIN).through(&proxy);
    if let Some(config) = config {
        daemon = daemon.config(config);
    }
    let daemon = daemon.start().await;
    (daemon, proxy)
}

fn subscribe(ns: &str, mode: DeliveryMode) -> consistd_client::proto::SubscribeRequest {
    consistd_client::proto::SubscribeRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        field_selector: "metadata.name=obj".into(),
        mode: mode.into(),
        ..Default::default()
    }
}

/// "a", "b" or "c": which of the seed's states an event carries.
fn state(event: &SubscribeResponse) -> String {
    let json: Value = serde_json::from_slice(&event.object.as_ref().expect("object").json).expect("json");
    let data = &json["data"];
    match (data["p1"].is_string(), data["handled"].is_string()) {
        (false, false) => "a",
        (true, false) => "b",
        (true, true) => "c",
        (false, true) => "a+p2",
    }
    .to_owned()
}

fn label(event: &SubscribeResponse) -> String {
    let kind = event.r#type().as_str_name().trim_start_matches("EVENT_TYPE_");
    let consistency = event.consistency().as_str_name().trim_start_matches("CONSISTENCY_");
    format!("{kind} {} {consistency}", state(event))
}

/// Reads object events until one carries the app's own patch.
async fn until_handled(events: &mut Events) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let event = events.next().await;
        if event.r#type() == EventType::Synced {
            continue;
        }
        seen.push(label(&event));
        if state(&event) == "c" {
            return seen;
        }
    }
}

/// The app's handler: mark the object handled, through consistd.
async fn handle(client: &consistd_client::Client, ns: &str) -> SubscribeResponseStub {
    let request = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        name: "obj".into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "handled": "yes" } }).to_string().into_bytes(),
        ..Default::default()
    };
    let object = client.objects().patch(request).await.expect("the app's patch").into_inner().object.expect("object");
    SubscribeResponseStub { resource_version: object.resource_version }
}

struct SubscribeResponseStub {
    resource_version: String,
}

async fn third_party_patch(api: &Api<ConfigMap>) {
    let patch = json!({ "data": { "p1": "yes" } });
    api.patch("obj", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("third-party patch");
}

fn initial() -> ConfigMap {
    serde_json::from_value(json!({ "metadata": { "name": "obj" }, "data": { "s0": "yes" } })).expect("configmap")
}

#[tokio::test]
async fn seed_timeline_with_a_three_second_delay() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    // The proxy delays the write's response too: the write takes the 3 s round trip on the connection
    // already open, and the default consistency.timeout counts from its answer.
    let (daemon, proxy) = daemon_behind_proxy(None).await;
    let client = daemon.client();
    let mut consistent = Events::open(&client, subscribe(&ns, DeliveryMode::Consistent)).await;
    let mut raw = Events::open(&daemon.client(), subscribe(&ns, DeliveryMode::Raw)).await;
    consistent.until_synced().await;
    raw.until_synced().await;

    proxy.set_delay(Duration::from_secs(3));
    // t=0: the object is created (state a); t=1: a third party patches it (state b).
    api.create(&PostParams::default(), &initial()).await.expect("create");
    tokio::time::sleep(Duration::from_secs(1)).await;
    third_party_patch(&api).await;

    // t≈3: the app sees state a and reacts by patching through consistd (state c, answered at t≈6).
    let first = consistent.next().await;
    assert_eq!(label(&first), "ADDED a CONSISTENT");
    // RAW marks a state when it is delivered, so state a is read off the RAW stream before the handler
    // writes: read after, a RAW stream that lagged the CONSISTENT one would rightly mark it as predating
    // the write in flight.
    let mut raw_seen = vec![label(&raw.next().await)];
    let written = handle(&client, &ns).await;

    let rest = until_handled(&mut consistent).await;
    assert_eq!(rest, ["MODIFIED c OWN_WRITE"], "never the intermediate state b; log:\n{}", daemon.logs());
    raw_seen.extend(until_handled(&mut raw).await);
    assert_eq!(raw_seen[..2], ["ADDED a CONSISTENT", "MODIFIED b AWAITING_OWN_WRITE"], "RAW sees every state at once");
    // RAW marks each state as known when it is delivered: the app's own state may arrive before the
    // write's response tells the daemon it is its own.
    assert!(raw_seen[2] == "MODIFIED c OWN_WRITE" || raw_seen[2] == "MODIFIED c AWAITING_OWN_WRITE", "{raw_seen:?}");
    assert_eq!(raw_seen.len(), 3);

    // Nothing else follows for the CONSISTENT subscriber: the app goes idle.
    let c = api.get("obj").await.expect("get").metadata.resource_version.expect("rv");
    assert_eq!(c, written.resource_version);
}

#[tokio::test]
async fn seed_timeline_without_delay() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let daemon = Daemon::builder(BIN).start().await;
    let client = daemon.client();
    let mut consistent = Events::open(&client, subscribe(&ns, DeliveryMode::Consistent)).await;
    let mut raw = Events::open(&daemon.client(), subscribe(&ns, DeliveryMode::Raw)).await;
    consistent.until_synced().await;
    raw.until_synced().await;

    api.create(&PostParams::default(), &initial()).await.expect("create");
    assert_eq!(label(&consistent.next().await), "ADDED a CONSISTENT");
    third_party_patch(&api).await;
    handle(&client, &ns).await;

    let rest = until_handled(&mut consistent).await;
    // Without delay the third party's state may arrive before the app's write was sent, and then it is
    // consistent; either way each state is delivered once and the own write ends it.
    assert!(rest == ["MODIFIED c OWN_WRITE"] || rest == ["MODIFIED b CONSISTENT", "MODIFIED c OWN_WRITE"], "{rest:?}");
    let raw_seen: Vec<String> =
        until_handled(&mut raw).await.iter().map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(raw_seen, ["ADDED a", "MODIFIED b", "MODIFIED c"]);
}

#[tokio::test]
async fn a_write_slower_than_the_consistency_timeout_holds_older_states_until_its_answer() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &initial()).await.expect("create");
    let (daemon, proxy) = daemon_behind_proxy(Some("consistency:\n  timeout: 2s\n")).await;
    let client = daemon.client();
    let mut consistent = Events::open(&client, subscribe(&ns, DeliveryMode::Consistent)).await;
    let snapshot: Vec<String> =
        consistent.until_synced().await.iter().filter(|e| e.object.is_some()).map(label).collect();
    assert_eq!(snapshot, ["ADDED a CONSISTENT"]);

    // Everything from the apiserver now takes 4 s; the consistency timeout is 2 s.
    proxy.set_delay(Duration::from_secs(4));
    third_party_patch(&api).await; // t=0: b, seen at t=4
    tokio::time::sleep(Duration::from_secs(3)).await;
    // t=3: the app writes; its answer arrives at t=7, 4 s after it was sent, twice the timeout. b arrives at
    // t=4, while the write is in flight, and is held until the answer says which version is the pod's: the
    // timeout runs from the answer. (It used to run from the send, releasing b TIMED_OUT at t=5.)
    let app = {
        let client = client.clone();
        let ns = ns.clone();
        consistd_testkit::spawn(async move { handle(&client, &ns).await })
    };
    let own = consistent.next().await;
    assert_eq!(label(&own), "MODIFIED c OWN_WRITE", "b is superseded by the pod's own state, never released");
    let written = app.await.expect("app write");
    assert_eq!(own.object.as_ref().map(|o| o.resource_version.clone()), Some(written.resource_version));
    // Nothing more for the subscriber: a later change is the next thing it sees.
    third_party_patch_again(&api).await;
    let next = consistent.next().await;
    assert_eq!(next.r#type(), EventType::Modified);
    assert_ne!(
        next.object.as_ref().map(|o| o.resource_version.clone()),
        own.object.as_ref().map(|o| o.resource_version.clone()),
        "c was not delivered twice"
    );
}

async fn third_party_patch_again(api: &Api<ConfigMap>) {
    let patch = json!({ "data": { "later": "yes" } });
    api.patch("obj", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("later patch");
}
