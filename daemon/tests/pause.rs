//! A watching daemon stopped (SIGSTOP) for 30 s while a third party keeps changing an object, then
//! continued: its subscriber gets every change after it, in order, or a RESYNC_REQUIRED and the state
//! after it; never a gap, never a change twice.

use std::{
    pin::pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use consistd_client::{
    Watch,
    proto::{DeliveryMode, EventType},
};
use consistd_testkit::Daemon;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

/// What the subscriber saw: a value of data.v, or a resync.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seen {
    Value(u32),
    Resync,
}

#[tokio::test]
async fn a_watching_daemon_stopped_30_s_under_a_stream_of_changes_leaves_no_gap() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "busy" }, "data": { "v": "0" } })).expect("cm");
    configmaps.create(&PostParams::default(), &cm).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;

    let seen = Arc::new(Mutex::new(Vec::new()));
    let synced = Arc::new(tokio::sync::Notify::new());
    let (client, into, ready) = (daemon.client(), seen.clone(), synced.clone());
    let watching = tokio::spawn(async move {
        let watch = Watch::new("configmaps").namespace(&ns).mode(DeliveryMode::Raw);
        let mut events = pin!(client.subscribe(watch));
        while let Some(event) = events.next().await {
            let event = event.expect("the watch");
            let value = |event: &consistd_client::Event| {
                let object: serde_json::Value = event.json().expect("an object").expect("object JSON");
                object["data"]["v"].as_str().and_then(|v| v.parse().ok()).expect("data.v")
            };
            match event.kind {
                EventType::Synced => ready.notify_one(),
                EventType::ResyncRequired => into.lock().expect("lock").push(Seen::Resync),
                EventType::Added | EventType::Modified => into.lock().expect("lock").push(Seen::Value(value(&event))),
                _ => {}
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), synced.notified()).await.expect("synced");

    // 20 changes a second for 40 s; the daemon is stopped from 5 s to 35 s.
    let writer = {
        let configmaps = configmaps.clone();
        tokio::spawn(async move {
            for v in 1..=800u32 {
                let patch = Patch::Merge(json!({ "data": { "v": v.to_string() } }));
                configmaps.patch("busy", &PatchParams::default(), &patch).await.expect("a change");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    daemon.signal(Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(30)).await;
    daemon.signal(Signal::SIGCONT);
    writer.await.expect("the writer");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().expect("lock").last() != Some(&Seen::Value(800)) {
        assert!(tokio::time::Instant::now() < deadline, "the last change never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watching.abort();

    // Each value follows the one before it, except right after a resync, where the state may jump ahead.
    let seen = seen.lock().expect("lock").clone();
    let mut last = 0;
    let mut resynced = false;
    for s in &seen {
        match *s {
            Seen::Resync => resynced = true,
            Seen::Value(v) if resynced => {
                assert!(v >= last, "after a resync the state goes back: {last} then {v}");
                last = v;
                resynced = false;
            }
            Seen::Value(v) => {
                assert!(v == last + 1 || (v == 0 && last == 0), "a gap or a repeat: {last} then {v}");
                last = v;
            }
        }
    }
    assert_eq!(last, 800);
}
