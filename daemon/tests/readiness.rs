//! Readiness follows the daemon's jobs, against the real apiserver through a delay proxy: a link slower
//! than the configured probe timeout keeps the daemon ready while its watches deliver (their events are
//! the evidence), a quiet one is judged by the probe and its configured timeout, and an apiserver that
//! cannot be reached turns readiness false with a reason naming it, in /readyz and `consistd status`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use consistd_testkit::{
    Daemon,
    proxy::DelayProxy,
    watch::{Events, raw},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

/// GET /readyz: whether it answered 200, and its body.
async fn readyz(daemon: &Daemon) -> (bool, String) {
    let (status, body) = consistd_server::admin::get(daemon.admin_socket(), "/readyz").await.expect("GET /readyz");
    (status == 200, String::from_utf8_lossy(&body).into_owned())
}

/// Polls the report until `ok` holds, failing the test after `within`.
async fn until_report(
    daemon: &Daemon,
    within: Duration,
    what: &str,
    ok: impl Fn(&consistd_core::report::Report) -> bool,
) -> consistd_core::report::Report {
    let deadline = Instant::now() + within;
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("read admin report");
        if ok(&report) {
            return report;
        }
        assert!(Instant::now() < deadline, "{what} not within {within:?}: {report:#?}\nlog:\n{}", daemon.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `n` a ConfigMap event carries in its data.
fn n_of(event: &consistd_client::proto::SubscribeResponse) -> Option<u64> {
    let json: serde_json::Value = serde_json::from_slice(&event.object.as_ref()?.json).ok()?;
    json["data"]["n"].as_str()?.parse().ok()
}

#[tokio::test]
async fn a_link_slower_than_the_probe_timeout_keeps_the_daemon_ready_while_its_watches_deliver() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    let tick: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "tick"}, "data": {"n": "0"}})).expect("object");
    configmaps.create(&PostParams::default(), &tick).await.expect("create ConfigMap");

    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    // A probe gets 1 s for its answer; the link will take 3 s.
    let config = "health:\n  probeInterval: 5s\n  probeTimeout: 1s\n";
    let daemon = Daemon::builder(BIN).config(config).through(&proxy).start().await;
    until_report(&daemon, Duration::from_secs(20), "ready", |r| r.ready).await;

    let mut events = Events::open(&daemon.client(), raw("configmaps", &ns)).await;
    events.until_synced().await;
    let delivered = Arc::new(AtomicU64::new(0));
    let reader = {
        let delivered = delivered.clone();
        consistd_testkit::spawn(async move {
            loop {
                if let Some(n) = n_of(&events.next().await) {
                    delivered.fetch_max(n, Ordering::SeqCst);
                }
            }
        })
    };
    // Someone else changes the object four times a second, straight to the apiserver.
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let written = written.clone();
        consistd_testkit::spawn(async move {
            for n in 1u64.. {
                let patch = serde_json::json!({"data": {"n": n.to_string()}});
                configmaps.patch("tick", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
                written.store(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while delivered.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the watch delivers nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    proxy.set_delay(Duration::from_secs(3));
    let written_before_delay = written.load(Ordering::SeqCst);
    let mut not_ready = Vec::new();
    let mut polls = 0;
    let window = Instant::now() + Duration::from_secs(15);
    while Instant::now() < window {
        let (ready, body) = readyz(&daemon).await;
        polls += 1;
        if !ready {
            not_ready.push(body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    writer.abort();
    assert!(
        not_ready.is_empty(),
        "not ready {} times of {polls}: {not_ready:?}\nlog:\n{}",
        not_ready.len(),
        daemon.logs()
    );
    let seen = delivered.load(Ordering::SeqCst);
    assert!(
        seen > written_before_delay + 20,
        "the watch kept delivering through the slow link: saw n={seen}, {written_before_delay} written before the delay"
    );
    let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("read report");
    assert_eq!(report.apiserver.heard_via.as_deref(), Some("watch stream"), "{report:#?}");
    assert!(!daemon.logs().contains("apiserver unreachable"), "{}", daemon.logs());

    // With nothing changing, nothing but the probe speaks for the apiserver, and the probe's answer takes
    // longer than its configured timeout.
    let report = until_report(&daemon, Duration::from_secs(30), "not ready once quiet", |r| !r.ready).await;
    let reasons = report.not_ready_reasons.join("; ");
    assert!(
        reasons.contains("the apiserver is not reachable: probe: no answer within 1s (health.probeTimeout)"),
        "{reasons}"
    );
    reader.abort();
}

#[tokio::test]
async fn an_apiserver_that_cannot_be_reached_turns_readiness_false_naming_it_until_it_answers_again() {
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let config = "health:\n  probeInterval: 1s\n  probeTimeout: 2s\n";
    let daemon = Daemon::builder(BIN).config(config).through(&proxy).start().await;
    until_report(&daemon, Duration::from_secs(20), "ready", |r| r.ready).await;
    assert!(readyz(&daemon).await.0);

    proxy.cut(true);
    let report = until_report(&daemon, Duration::from_secs(20), "not ready", |r| !r.ready).await;
    assert!(!report.apiserver.reachable, "{report:#?}");
    assert!(
        report.not_ready_reasons.iter().any(|r| r.starts_with("the apiserver is not reachable: probe: ")),
        "{report:#?}"
    );
    let (ready, body) = readyz(&daemon).await;
    assert!(!ready && body.starts_with("not ready: the apiserver is not reachable"), "{body}");
    let status = std::process::Command::new(BIN)
        .args(["status", "--admin-socket"])
        .arg(daemon.admin_socket())
        .output()
        .expect("run consistd status");
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(!status.status.success(), "consistd status exits non-zero when not ready: {stdout}");
    assert!(stdout.contains("NOT READY") && stdout.contains("not ready:  the apiserver is not reachable"), "{stdout}");

    proxy.cut(false);
    until_report(&daemon, Duration::from_secs(20), "ready again", |r| r.ready).await;
}
