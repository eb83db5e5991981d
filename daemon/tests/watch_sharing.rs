//! 64 subscribers to the same query cost the apiserver one watch, counted by the apiserver itself
//! (apiserver_longrunning_requests), and the watch stops shortly after the last subscriber leaves.
//! A test binary of its own, so no other test's watches run while it counts.

use std::time::Duration;

use consistd_testkit::{
    Daemon,
    watch::{Events, describe, raw},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const SUBSCRIBERS: usize = 64;

/// Namespaced WATCH requests on configmaps that the apiserver is serving now.
async fn apiserver_configmap_watches(kube: &Client) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("metrics request");
    let text = kube.request_text(request).await.expect("read apiserver metrics");
    text.lines()
        .find(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains("resource=\"configmaps\"")
                && l.contains("scope=\"namespace\"")
                && l.contains("verb=\"WATCH\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().expect("metric value"))
}

async fn daemon_metric(daemon: &Daemon, name: &str) -> u64 {
    let value = daemon.metric(name, "").await.unwrap_or_else(|| panic!("metric {name} missing"));
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a count")]
    let count = value as u64;
    count
}

async fn eventually(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ok().await {
        assert!(tokio::time::Instant::now() < deadline, "{what} did not happen within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn sixty_four_subscribers_share_one_apiserver_watch_that_stops_after_the_last_leaves() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let before = apiserver_configmap_watches(&kube).await;
    let daemon = Daemon::builder(BIN).config("watch:\n  linger: 500ms\n").start().await;
    let client = daemon.client();

    let mut subscribers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut events = Events::open(&client, raw("configmaps", &ns)).await;
        assert_eq!(describe(&events.next().await), "SYNCED");
        subscribers.push(events);
    }
    assert_eq!(daemon_metric(&daemon, "consistd_watch_upstreams").await, 1);
    assert_eq!(daemon_metric(&daemon, "consistd_watch_subscribers").await, SUBSCRIBERS as u64);
    eventually("the apiserver counting exactly one more watch", async || {
        apiserver_configmap_watches(&kube).await == before + 1
    })
    .await;

    let cm =
        ConfigMap { metadata: ObjectMeta { name: Some("shared".into()), ..Default::default() }, ..Default::default() };
    Api::<ConfigMap>::namespaced(kube.clone(), &ns).create(&PostParams::default(), &cm).await.expect("create");
    for events in &mut subscribers {
        assert_eq!(describe(&events.next().await), "ADDED shared", "every subscriber gets the event");
    }

    drop(subscribers);
    eventually("the daemon stopping its upstream watch", async || {
        daemon_metric(&daemon, "consistd_watch_upstreams").await == 0
    })
    .await;
    assert_eq!(daemon_metric(&daemon, "consistd_watch_subscribers").await, 0);
    eventually("the apiserver seeing the watch end", async || apiserver_configmap_watches(&kube).await == before).await;
}
