//! A watching daemon stopped (SIGSTOP) for 30 s while a third party keeps changing an object, then
//! continued: its subscriber gets every change after it, in order, or a RESYNC_REQUIRED and the state
//! after it; never a gap, never a change twice.

use std::time::Duration;

use consistd_testkit::{
    Daemon,
    watch::{Seen, assert_no_gap, record_counter},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

#[tokio::test]
async fn a_watching_daemon_stopped_30_s_under_a_stream_of_changes_leaves_no_gap() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "busy" }, "data": { "v": "0" } })).expect("cm");
    configmaps.create(&PostParams::default(), &cm).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;

    let (seen, watching) = record_counter(daemon.client(), &ns).await;

    // 20 changes a second for 40 s; the daemon is stopped from 5 s to 35 s.
    let writer = {
        let configmaps = configmaps.clone();
        consistd_testkit::spawn(async move {
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

    let seen = seen.lock().expect("lock").clone();
    assert_no_gap(&seen);
    assert_eq!(seen.last(), Some(&Seen::Value(800)));
}
