//! The control plane failing under running daemons: etcd paused 20 s, then kube-apiserver killed and
//! started again on its port (`hack/control-plane.sh restart-apiserver`). A watch through the daemon
//! delivers every change made around them once, in order, with no gap; while Lease writes cannot land
//! the leader stops saying LEADER and nobody says it, and once the control plane is back one leads again.
//! This binary holds one test only: it stops the shared control plane for a while.

use std::{
    path::PathBuf,
    pin::pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use consistd_client::{
    Watch,
    proto::{CampaignRequest, EventType, LeadershipState},
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
const WAIT: Duration = Duration::from_secs(60);
/// Lease timing in seconds: lease, renew deadline, retry period.
const TIMING: (i64, i64, i64) = (4, 3, 1);

type States = Arc<Mutex<Vec<Option<LeadershipState>>>>;

async fn campaign(daemon: &Daemon, i: usize, states: States) -> tokio::task::JoinHandle<()> {
    let request = CampaignRequest {
        election: "through-outages".into(),
        timing: Some(consistd_testkit::lease_timing(TIMING.0, TIMING.1, TIMING.2)),
        ..Default::default()
    };
    let mut stream = daemon.client().leadership().campaign(request).await.expect("campaign").into_inner();
    consistd_testkit::spawn(async move {
        while let Ok(Some(m)) = stream.message().await {
            states.lock().expect("lock")[i] = Some(m.status.expect("status").state());
        }
    })
}

fn leaders(states: &States) -> usize {
    states.lock().expect("lock").iter().filter(|s| **s == Some(LeadershipState::Leader)).count()
}

async fn one_leader(states: &States, what: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while leaders(states) != 1 {
        assert!(tokio::time::Instant::now() < deadline, "{what}: no leader within {WAIT:?}: {states:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sets data.v, retrying while the control plane is coming back.
async fn write(configmaps: &Api<ConfigMap>, v: u32) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let patch = Patch::Merge(json!({ "data": { "v": v.to_string() } }));
    while let Err(e) = configmaps.patch("watched", &PatchParams::default(), &patch).await {
        assert!(tokio::time::Instant::now() < deadline, "write v={v}: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn seen_up_to(seen: &Arc<Mutex<Vec<u32>>>, v: u32) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.lock().expect("lock").last() != Some(&v) {
        assert!(tokio::time::Instant::now() < deadline, "v={v} not delivered: {:?}", seen.lock().expect("lock"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn control_plane_dir() -> PathBuf {
    consistd_testkit::kubeconfig().parent().expect("the control plane's directory").to_owned()
}

fn signal_etcd(signal: Signal) {
    let pid = std::fs::read_to_string(control_plane_dir().join("etcd.pid")).expect("etcd.pid");
    let pid = nix::unistd::Pid::from_raw(pid.trim().parse().expect("a pid"));
    nix::sys::signal::kill(pid, signal).expect("signal etcd");
}

/// Resumes etcd if the test stops before it does (a paused etcd would stop every later test).
struct ResumeEtcd;

impl Drop for ResumeEtcd {
    fn drop(&mut self) {
        signal_etcd(Signal::SIGCONT);
    }
}

#[tokio::test]
async fn etcd_paused_and_the_apiserver_restarted_lose_no_change_and_never_tell_two_leaders() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "watched" }, "data": { "v": "0" } })).expect("cm");
    configmaps.create(&PostParams::default(), &cm).await.expect("create");

    let config = format!("namespace: {ns}\n");
    let a = Daemon::builder(BIN).config(format!("identity: a\n{config}")).start().await;
    let b = Daemon::builder(BIN).config(format!("identity: b\n{config}")).start().await;
    let states: States = Arc::new(Mutex::new(vec![None, None]));
    let _a = campaign(&a, 0, states.clone()).await;
    let _b = campaign(&b, 1, states.clone()).await;
    one_leader(&states, "at start").await;

    // Every change of data.v the watch through daemon a delivers, in order, once it has synced.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let synced = Arc::new(tokio::sync::Notify::new());
    let (client, into, ready) = (a.client(), seen.clone(), synced.clone());
    let watching = consistd_testkit::spawn(async move {
        let mut events = pin!(client.subscribe(Watch::new("configmaps").namespace(&ns)));
        while let Some(event) = events.next().await {
            let event = event.expect("the watch through daemon a");
            match event.kind {
                EventType::Synced => ready.notify_one(),
                EventType::Modified => {
                    let object: serde_json::Value = event.json().expect("an object").expect("object JSON");
                    let v = object["data"]["v"].as_str().and_then(|v| v.parse().ok()).expect("data.v");
                    into.lock().expect("lock").push(v);
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(WAIT, synced.notified()).await.expect("the watch synced");
    for v in 1..=3 {
        write(&configmaps, v).await;
    }
    seen_up_to(&seen, 3).await;

    // etcd paused 20 s: Lease writes cannot land. Past the renew deadline (3 s from the last renewal,
    // which began at most a retry period before the pause) nobody says LEADER.
    let resume = ResumeEtcd;
    signal_etcd(Signal::SIGSTOP);
    let paused = tokio::time::Instant::now();
    while paused.elapsed() < Duration::from_secs(20) {
        if paused.elapsed() > Duration::from_secs(TIMING.1 as u64 + TIMING.2 as u64) {
            assert_eq!(leaders(&states), 0, "a LEADER while etcd is paused, {:?} in", paused.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(resume);
    one_leader(&states, "after etcd resumed").await;
    for v in 4..=6 {
        write(&configmaps, v).await;
    }
    seen_up_to(&seen, 6).await;

    // kube-apiserver killed and started again on its port.
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../hack/control-plane.sh");
    let out = std::process::Command::new(script)
        .arg("restart-apiserver")
        .env("CONSISTD_CP_DIR", control_plane_dir())
        .output()
        .expect("run hack/control-plane.sh restart-apiserver");
    assert!(out.status.success(), "restart-apiserver: {}", String::from_utf8_lossy(&out.stderr));
    one_leader(&states, "after the apiserver restarted").await;
    for v in 7..=9 {
        write(&configmaps, v).await;
    }
    seen_up_to(&seen, 9).await;

    assert_eq!(*seen.lock().expect("lock"), (1..=9).collect::<Vec<u32>>(), "every change once, in order");
    watching.abort();
}
