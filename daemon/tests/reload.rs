//! Config reload against the real apiserver: the config file lives in a directory kept like a ConfigMap
//! volume (kubelet's atomic writer swaps `..data`), and each change reaches the running daemon without a
//! restart: elections added and removed, the member Lease's TTL, the log level, the inbox and outbox
//! bounds, access rules. A field read only at start is reported as needing a restart; a file that does
//! not load keeps the running config, sets the reload metric to 0 and shows in `consistd status`.

use std::time::Duration;

use consistd_client::proto::{Destination, GetOutboxStatusRequest, SendRequest, destination::Target};
use consistd_core::report::Report;
use consistd_testkit::{Daemon, free_port, tls::SecretVolume};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
/// How long a reload may take to show: inotify, the 200 ms settle, a Lease step or renewal.
const WAIT: Duration = Duration::from_secs(30);

/// The config file, with what the test varies.
fn config(ns: &str, (port, listen_port): (u16, u16), elections: &[&str], level: &str, rest: &str) -> String {
    let elections: String = elections.iter().map(|e| format!("- name: {e}\n")).collect();
    format!(
        "identity: reloader\nnamespace: {ns}\npeer:\n  listen: \"127.0.0.1:{listen_port}\"\n  advertise: \"127.0.0.1:{port}\"\n  \
         insecure: true\nelections:\n{elections}log:\n  format: json\n  level: {level}\n{rest}"
    )
}

/// Polls `check` every 100 ms until it answers, failing the test with `what` and the daemon's log.
async fn until<T, F: Future<Output = Option<T>>>(daemon: &Daemon, what: &str, mut check: impl FnMut() -> F) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(answer) = check().await {
            return answer;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {WAIT:?}; log:\n{}", daemon.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn report(daemon: &Daemon) -> Report {
    consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("read the admin report")
}

async fn metric(daemon: &Daemon, name: &str) -> String {
    let body = consistd_server::admin::get(daemon.admin_socket(), "/metrics").await.expect("GET /metrics").1;
    let text = String::from_utf8_lossy(&body).into_owned();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).map(str::to_owned);
    line.unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// The Lease's holder and leaseDurationSeconds, when it exists.
async fn lease(leases: &Api<Lease>, name: &str) -> Option<(String, i32)> {
    let spec = leases.get_opt(name).await.expect("read Lease")?.spec.unwrap_or_default();
    Some((spec.holder_identity.unwrap_or_default(), spec.lease_duration_seconds.unwrap_or_default()))
}

fn send(peer: &str, resource_id: &str) -> SendRequest {
    SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(peer.to_owned())) }),
        resource_id: resource_id.to_owned(),
        event_id: "1".to_owned(),
        payload: b"{}".to_vec(),
        content_type: "application/json".to_owned(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_config_file_is_applied_without_a_restart_and_a_bad_one_changes_nothing() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let leases = Api::<Lease>::namespaced(kube, &ns);
    let dir = tempfile::tempdir().expect("temp dir");
    let (port, other_port) = (free_port(), free_port());
    let v1 =
        config(&ns, (port, port), &["kept", "removed"], "info", "membership:\n  ttl: 30s\ninbox:\n  maxPending: 1\n");
    let volume = SecretVolume::new(&dir.path().join("config"), &[("consistd.yaml", &v1)]);
    let daemon = Daemon::builder(BIN)
        .arg("--config")
        .arg(volume.path("consistd.yaml").display().to_string())
        // Empty counts as unset: the file's log.level decides (info unless it says otherwise).
        .env("CONSISTD_LOG_LEVEL", "")
        .start()
        .await;
    let me = format!("127.0.0.1:{port}");

    // Started: both elections held, the member Lease with the file's TTL, the reload metric at 1.
    for election in ["kept", "removed"] {
        let held = || async { lease(&leases, election).await.filter(|(holder, _)| holder == "reloader") };
        until(&daemon, &format!("Lease {election} held"), held).await;
    }
    // The member Lease is written by a task of its own, not ordered with the elections'.
    let member = until(&daemon, "member Lease kept.member.reloader", || lease(&leases, "kept.member.reloader")).await;
    assert_eq!(member.1, 30);
    assert_eq!(
        metric(&daemon, "consistd_config_last_reload_successful").await,
        "consistd_config_last_reload_successful 1"
    );
    let config_report = report(&daemon).await.config.expect("the config is reported");
    assert!(config_report.last_reload_successful && config_report.error.is_none(), "{config_report:?}");
    assert!(!daemon.logs().contains("\"DEBUG\""), "info level at start:\n{}", daemon.logs());

    // Two messages to this daemon's own inbox, which holds one: the second is refused until it has room.
    let client = daemon.client();
    client.outbox().send(send(&me, "a")).await.expect("Send a");
    client.outbox().send(send(&me, "b")).await.expect("Send b");
    let outbox = client.outbox();
    until(&daemon, "the inbox refusing the second message (inbox.maxPending 1)", || {
        let mut outbox = outbox.clone();
        async move {
            let status = outbox.get_outbox_status(GetOutboxStatusRequest {}).await.expect("status").into_inner();
            let errors = status.destinations.iter().flat_map(|d| &d.pending).map(|m| m.last_error.as_str());
            errors.into_iter().any(|e| e.contains("inbox.maxPending")).then_some(())
        }
    })
    .await;
    // The refusal can come while the first is still being stored (held, not yet pending): wait for it.
    until(&daemon, "the first message stored in the inbox", || async {
        (report(&daemon).await.inbox_pending == 1).then_some(())
    })
    .await;

    // v2: one election removed and one added, a shorter TTL, debug logs, room in the inbox, a tighter
    // outbox, and a new peer.listen, which needs a restart.
    let v2_rest =
        "membership:\n  ttl: 12s\ninbox:\n  maxPending: 10\noutbox:\n  maxPendingPerDestination: 2\n  maxPending: 2\n";
    let v2 = config(&ns, (port, other_port), &["kept", "added"], "consistd=debug,info", v2_rest);
    volume.update(&[("consistd.yaml", &v2)]);

    let released = || async { lease(&leases, "removed").await.filter(|(holder, _)| holder.is_empty()) };
    until(&daemon, "Lease removed released", released).await;
    let added = || async { lease(&leases, "added").await.filter(|(holder, _)| holder == "reloader") };
    until(&daemon, "Lease added held", added).await;
    assert_eq!(lease(&leases, "kept").await.map(|l| l.0).as_deref(), Some("reloader"), "kept stays held");
    // The next renewal (a third of the old TTL after the last) writes the new TTL.
    let renewed = || async { lease(&leases, "kept.member.reloader").await.filter(|(_, ttl)| *ttl == 12) };
    until(&daemon, "the member Lease renewed with ttl 12s", renewed).await;
    let both = || async { (report(&daemon).await.inbox_pending == 2).then_some(()) };
    until(&daemon, "the refused message delivered once the inbox has room", both).await;
    let refused = client.outbox().send(send(&me, "c")).await.expect_err("a third pending message is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("outbox.maxPendingPerDestination"), "{refused:?}");
    assert!(daemon.logs().contains("\"DEBUG\""), "debug level after the reload:\n{}", daemon.logs());
    let config_report = report(&daemon).await.config.expect("config");
    assert_eq!(config_report.restart_needed, ["peer"], "{config_report:?}");
    assert!(config_report.last_reload_successful);
    let applied = daemon.logs().lines().find(|l| l.contains("applied config change")).map(str::to_owned);
    let applied = applied.expect("the reload is logged");
    for field in ["elections", "log.level", "membership.ttl", "inbox", "outbox"] {
        assert!(applied.contains(field), "{field} in {applied}");
    }

    // v3 does not validate: nothing changes, the metric says so, and status names the field.
    let bad = v2.replace("  maxPending: 2\n", "  maxPending: 2\n  maxPayloadBytes: 0\n");
    volume.update(&[("consistd.yaml", &bad)]);
    let refused_report = || async {
        let r = report(&daemon).await.config.expect("config");
        (!r.last_reload_successful).then_some(r)
    };
    let config_report = until(&daemon, "the bad config reported", refused_report).await;
    let error = config_report.error.expect("the error is reported");
    assert!(error.contains("outbox.maxPayloadBytes"), "{error}");
    assert_eq!(
        metric(&daemon, "consistd_config_last_reload_successful").await,
        "consistd_config_last_reload_successful 0"
    );
    let status = consistd_core::report::render(&report(&daemon).await);
    assert!(status.contains("RELOAD REFUSED") && status.contains("outbox.maxPayloadBytes"), "{status}");
    assert_eq!(lease(&leases, "added").await.map(|l| l.0).as_deref(), Some("reloader"), "still held");
    let refused = client.outbox().send(send(&me, "c")).await.expect_err("the v2 bounds still hold");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");

    // v4: valid again, with an access rule that grants LeadershipService only: Send is refused.
    let v4 = format!("{v2}access:\n  rules:\n    - service: leadership\n");
    volume.update(&[("consistd.yaml", &v4)]);
    let fixed = || async { report(&daemon).await.config.filter(|r| r.last_reload_successful).map(|_| ()) };
    until(&daemon, "the fixed config applied", fixed).await;
    assert_eq!(
        metric(&daemon, "consistd_config_last_reload_successful").await,
        "consistd_config_last_reload_successful 1"
    );
    let denied = client.outbox().send(send(&me, "d")).await.expect_err("access.rules now refuse Send");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(report(&daemon).await.config.expect("config").error.is_none());
}
