//! The daemon as a process against the real control plane: it serves health and reflection on its Unix
//! socket, refuses to take over a live daemon's socket, replaces a stale one, and shuts down cleanly,
//! giving messages not yet ACKed the grace period to leave and stopping every task it started; `admin.listen` serves the probes and metrics over
//! TCP.

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use consistd_client::proto::{
    AckRequest, AckStreamRequest, CampaignRequest, Destination, LeadershipState, ReceiveRequest, SendRequest,
    SendStreamRequest, destination::Target,
};
use consistd_server::SERVICE_NAMES;
use consistd_testkit::{
    Daemon, free_port,
    watch::{self, Events},
};
use nix::sys::signal::Signal;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

async fn health_of(daemon: &Daemon, service: &str) -> ServingStatus {
    let response = daemon
        .client()
        .health()
        .check(HealthCheckRequest { service: service.to_owned() })
        .await
        .unwrap_or_else(|e| panic!("health check of {service:?}: {e}"));
    response.get_ref().status()
}

async fn reflected_services(daemon: &Daemon) -> Vec<String> {
    let mut reflection = ServerReflectionClient::new(daemon.client().channel());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::once(request))
        .await
        .expect("open reflection stream")
        .into_inner();
    let response = responses.message().await.expect("read reflection answer").expect("one answer");
    match response.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => list.service.into_iter().map(|s| s.name).collect(),
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

#[tokio::test]
async fn serves_health_and_reflection_against_the_real_apiserver() {
    let daemon = Daemon::builder(BIN).start().await;

    assert_eq!(health_of(&daemon, "").await, ServingStatus::Serving);
    for name in SERVICE_NAMES {
        assert_eq!(health_of(&daemon, name).await, ServingStatus::Serving, "{name}");
    }

    let services = reflected_services(&daemon).await;
    for name in SERVICE_NAMES.into_iter().chain(["grpc.health.v1.Health"]) {
        assert!(services.iter().any(|s| s == name), "reflection lists {name}: {services:?}");
    }

    // The admin endpoint shows the daemon reached the real apiserver. Ready can come first (anything heard
    // from the apiserver counts, such as the fencing check at start); the version comes with the first
    // probe answered.
    let report = wait_for_report(&daemon, |r| r.ready && r.apiserver.version.is_some()).await;
    assert!(report.apiserver.reachable, "{report:?}");
    let version = report.apiserver.version.unwrap_or_default();
    assert_eq!(version, kubernetes_version(), "the apiserver's version");

    let mode = std::fs::metadata(daemon.socket()).expect("socket exists").permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "socket mode");
    let admin_mode = std::fs::metadata(daemon.admin_socket()).expect("admin socket").permissions().mode() & 0o777;
    assert_eq!(admin_mode, 0o600, "the admin socket has its own mode, the daemon's user only by default");
}

#[tokio::test]
async fn the_admin_socket_takes_its_own_mode_not_the_app_sockets() {
    let daemon = Daemon::builder(BIN).config("socket:\n  mode: \"0600\"\nadmin:\n  mode: \"0640\"\n").start().await;
    let mode_of = |path: &std::path::Path| std::fs::metadata(path).expect("socket exists").permissions().mode() & 0o777;
    assert_eq!(mode_of(daemon.socket()), 0o600);
    assert_eq!(mode_of(daemon.admin_socket()), 0o640);
}

/// The Kubernetes version of the test control plane, as hack/versions.env pins it.
fn kubernetes_version() -> &'static str {
    include_str!("../../hack/versions.env")
        .lines()
        .find_map(|line| line.strip_prefix("KUBERNETES_VERSION="))
        .expect("hack/versions.env pins KUBERNETES_VERSION")
}

async fn wait_for_report(
    daemon: &Daemon,
    ok: impl Fn(&consistd_core::report::Report) -> bool,
) -> consistd_core::report::Report {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("read admin report");
        if ok(&report) || tokio::time::Instant::now() > deadline {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn admin_socket_serves_probes_and_metrics() {
    let daemon = Daemon::builder(BIN).start().await;
    // Ready comes with any answer from the apiserver; its version with the probe's first /version,
    // which may come a moment later.
    wait_for_report(&daemon, |r| r.ready && r.apiserver.version.is_some()).await;
    let get = |path: &'static str| consistd_server::admin::get(daemon.admin_socket(), path);

    let (status, body) = get("/healthz").await.expect("GET /healthz");
    assert_eq!(status, 200, "{body:?}");
    let (status, body) = get("/readyz").await.expect("GET /readyz");
    assert_eq!(status, 200, "{body:?}");
    let (status, body) = get("/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("consistd_apiserver_up 1"), "{text}");
    let (status, _) = get("/nope").await.expect("GET /nope");
    assert_eq!(status, 404);

    let status = std::process::Command::new(BIN)
        .args(["status", "--admin-socket"])
        .arg(daemon.admin_socket())
        .output()
        .expect("run consistd status");
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "consistd status: {stdout}");
    assert!(stdout.contains("ready") && stdout.contains(kubernetes_version()), "{stdout}");
}

#[tokio::test]
async fn a_second_daemon_on_the_same_socket_refuses_to_start() {
    let first = Daemon::builder(BIN).start().await;
    let dir = first.socket().parent().expect("socket dir").to_owned();
    let mut second = Daemon::builder(BIN).dir(&dir).no_wait().start().await;
    let status = second.wait_exit(Duration::from_secs(20)).await;
    assert!(!status.success(), "second daemon must fail, got {status}");
    let logs = second.logs();
    assert!(logs.contains("is in use by a running consistd"), "second daemon says why:\n{logs}");
    assert_eq!(health_of(&first, "").await, ServingStatus::Serving, "first daemon unharmed");
}

#[tokio::test]
async fn a_stale_socket_from_a_killed_daemon_is_replaced() {
    let mut first = Daemon::builder(BIN).start().await;
    let dir = first.socket().parent().expect("socket dir").to_owned();
    first.signal(Signal::SIGKILL);
    first.wait_exit(Duration::from_secs(10)).await;
    assert!(first.socket().exists(), "kill -9 leaves the socket file behind");

    let second = Daemon::builder(BIN).dir(&dir).start().await;
    assert_eq!(health_of(&second, "").await, ServingStatus::Serving);
}

#[tokio::test]
async fn sigterm_drains_streams_within_the_grace_period_and_removes_the_socket() {
    let mut daemon = Daemon::builder(BIN).config("shutdown:\n  gracePeriod: 1s\n").start().await;
    // An open stream that never ends by itself: the health watch.
    let mut watch = daemon
        .client()
        .health()
        .watch(HealthCheckRequest { service: String::new() })
        .await
        .expect("open health watch")
        .into_inner();
    let first = watch.message().await.expect("first health message").expect("a message");
    assert_eq!(first.status(), ServingStatus::Serving);

    daemon.signal(Signal::SIGTERM);
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.expect("told at once");
    assert_eq!(next.expect("watch message").expect("a message").status(), ServingStatus::NotServing);

    let status = daemon.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "exit 0 after SIGTERM, got {status}; log:\n{}", daemon.logs());
    assert!(!daemon.socket().exists(), "socket removed");
    assert!(!daemon.admin_socket().exists(), "admin socket removed");
    assert!(daemon.logs().contains("grace period over"), "the open stream was cut at the grace period");
}

#[tokio::test]
async fn the_socket_path_comes_from_consistd_socket_when_no_flag_is_given() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("from-env.sock");
    let mut child = tokio::process::Command::new(BIN)
        .args(["run", "--admin-socket"])
        .arg(dir.path().join("admin.sock"))
        .env("CONSISTD_SOCKET", &socket)
        .env("CONSISTD_STORE_DIR", dir.path().join("store"))
        .env("KUBECONFIG", consistd_testkit::kubeconfig())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn consistd");
    consistd_client::Client::new(&socket).wait_ready(Duration::from_secs(30)).await.expect("serves on CONSISTD_SOCKET");
    assert!(dir.path().join("store/consistd.redb").exists(), "the store is where CONSISTD_STORE_DIR says");
    child.kill().await.expect("kill");
}

#[test]
fn config_check_names_the_bad_field_and_exits_64() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "socket:\n  mdoe: \"0660\"\n").expect("write config");
    let out = std::process::Command::new(BIN).args(["config", "check"]).arg(&bad).output().expect("run");
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("socket.mdoe") && stderr.contains("unknown field"), "{stderr}");

    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "socket:\n  mode: \"0600\"\n").expect("write config");
    let out = std::process::Command::new(BIN).args(["config", "check"]).arg(&good).output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // A probe timeout of nothing would make every probe fail: named by its field.
    let zero = dir.path().join("zero.yaml");
    std::fs::write(&zero, "health:\n  probeTimeout: 0s\n").expect("write config");
    let out = std::process::Command::new(BIN).args(["config", "check"]).arg(&zero).output().expect("run");
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("health.probeTimeout") && stderr.contains("greater than 0s"), "{stderr}");

    // A pod's config (the base ConfigMap) outside the pod: POD_IP is unset, and the error says how to check
    // it as the pod would read it.
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base/configmap.yaml");
    let check = |pod: bool| {
        let mut command = std::process::Command::new(BIN);
        command.args(["config", "check"]).args(pod.then_some("--pod")).arg(&base);
        command.env_remove("POD_IP").env_remove("POD_NAME").env_remove("POD_NAMESPACE").output().expect("run")
    };
    let out = check(false);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("${POD_IP} is not set") && stderr.contains("config check --pod"), "{stderr}");
    let out = check(true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{} (data.consistd.yaml): ok\n", base.display()));
    // A ConfigMap without the key is named as such.
    let other = dir.path().join("other.yaml");
    std::fs::write(&other, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {other: \"1\"}\n")
        .expect("write ConfigMap");
    let out = std::process::Command::new(BIN).args(["config", "check"]).arg(&other).output().expect("run");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("data.consistd.yaml: missing"), "{out:?}");

    // `run` refuses the same file before touching anything.
    let out = std::process::Command::new(BIN).args(["run", "--config"]).arg(&bad).output().expect("run");
    assert_eq!(out.status.code(), Some(64));
}

#[tokio::test]
async fn consistd_log_format_json_writes_one_json_object_per_line() {
    let mut daemon = Daemon::builder(BIN).env("CONSISTD_LOG_FORMAT", "json").start().await;
    daemon.signal(Signal::SIGTERM);
    daemon.wait_exit(Duration::from_secs(10)).await;
    let logs = daemon.logs();
    let lines: Vec<&str> = logs.lines().collect();
    assert!(!lines.is_empty(), "the daemon logged something");
    for line in &lines {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        assert!(value.get("level").is_some() && value.get("message").is_some(), "{line}");
    }
    assert!(
        lines.iter().any(|l| l.contains("\"message\":\"consistd serving\"") && l.contains("\"socket\":")),
        "structured fields are JSON fields:\n{logs}"
    );
}

/// A daemon that sends to peers in plaintext, with a 3 s shutdown grace period and JSON logs.
async fn sender() -> Daemon {
    let config = "shutdown:\n  gracePeriod: 3s\npeer:\n  insecure: true\nlog:\n  format: json\n";
    Daemon::builder(BIN).config(config).start().await
}

/// A JSON message `{}` about `resource_id`, event `event_id`, for `target`.
fn json_message(target: Target, resource_id: &str, event_id: &str) -> SendRequest {
    SendRequest {
        destination: Some(Destination { target: Some(target) }),
        resource_id: resource_id.to_owned(),
        event_id: event_id.to_owned(),
        payload: b"{}".to_vec(),
        content_type: "application/json".to_owned(),
        ..Default::default()
    }
}

async fn send_to(daemon: &Daemon, peer: &str) {
    let request = json_message(Target::Peer(peer.to_owned()), "last-words", "e1");
    daemon.client().outbox().send(request).await.expect("Send");
}

/// Campaigns for `election` through `daemon` and returns the stream once it says LEADER.
async fn lead(daemon: &Daemon, election: &str) -> tonic::Streaming<consistd_client::proto::CampaignResponse> {
    let request = CampaignRequest { election: election.into(), ..Default::default() };
    let mut campaign = daemon.client().leadership().campaign(request).await.expect("Campaign").into_inner();
    loop {
        let status = campaign.message().await.expect("campaign").expect("open").status.expect("status");
        if status.state() == LeadershipState::Leader {
            return campaign;
        }
    }
}

#[tokio::test]
async fn sigterm_gives_unacked_messages_the_grace_period_and_warns_of_those_left() {
    // The receiving app starts only after the sender got SIGTERM: the message still leaves, and is ACKed.
    let addr = format!("127.0.0.1:{}", free_port());
    let receiver = Daemon::builder(BIN)
        .config(format!("peer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\n"))
        .start()
        .await;
    let mut daemon = sender().await;
    send_to(&daemon, &addr).await;
    daemon.signal(Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut inbox = receiver.client().inbox().receive(ReceiveRequest {}).await.expect("Receive").into_inner();
    let message = inbox.message().await.expect("receive").expect("a message").message.expect("message");
    assert_eq!(message.resource_id, "last-words");
    receiver.client().inbox().ack(AckRequest { message_id: message.message_id }).await.expect("Ack");
    let status = daemon.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "exit 0 after SIGTERM, got {status}; log:\n{}", daemon.logs());
    assert!(!daemon.logs().contains("not yet ACKed"), "nothing was left:\n{}", daemon.logs());

    // Nobody listens: after the grace period the daemon stops and says how many it still holds.
    let mut daemon = sender().await;
    send_to(&daemon, &format!("127.0.0.1:{}", free_port())).await;
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "exit 0 after SIGTERM, got {status}; log:\n{}", daemon.logs());
    let logs = daemon.logs();
    let warning = logs.lines().find(|l| l.contains("not yet ACKed")).unwrap_or_else(|| panic!("no warning:\n{logs}"));
    assert!(warning.contains(r#""held":1"#), "the warning counts the held message: {warning}");
}

#[tokio::test]
async fn sigterm_stops_every_task_the_daemon_started_within_the_grace_period() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let (admin, peer) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    // Each setting keeps a task alive past the grace period unless it stops when asked: an idle watch
    // lingers a minute, the daemon is a member of the groups it campaigns in, and its admin endpoint
    // keeps a scraper's connection open.
    let config = format!(
        "namespace: {ns}\nshutdown:\n  gracePeriod: 2s\nwatch:\n  linger: 60s\nadmin:\n  listen: \"{admin}\"\n\
         peer:\n  listen: {peer}\n  advertise: {peer}\n  insecure: true\n"
    );
    let mut daemon = Daemon::builder(BIN).config(config).start().await;
    let client = daemon.client();

    // A watch that synced and was left: its upstream watch and linger timer stay.
    let mut watch = Events::open(&client, watch::raw("configmaps", &ns)).await;
    watch.until_synced().await;
    drop(watch);
    // An election campaigned for and held: its runner and the member Lease's keeper.
    let leading = lead(&daemon, "tasks").await;
    // A message for a silent peer: its link; one for the election's group: the group's follower.
    send_to(&daemon, &format!("127.0.0.1:{}", free_port())).await;
    let to_group = json_message(Target::Election("tasks".into()), "group", "e1");
    client.outbox().send(to_group).await.expect("Send to the group");
    // An app's SendStream and AckStream, answered and kept open from the app's side: shutdown must not
    // wait for the app to close them.
    let (more_sends, sends) = tokio::sync::mpsc::channel(1);
    let mut sent =
        client.outbox().send_stream(tokio_stream::wrappers::ReceiverStream::new(sends)).await.expect("SendStream");
    let to_silent = json_message(Target::Peer(format!("127.0.0.1:{}", free_port())), "streamed", "e1");
    more_sends.send(SendStreamRequest { message: Some(to_silent) }).await.expect("queue the send");
    let answer = sent.get_mut().message().await.expect("SendStream answer").expect("an answer");
    assert!(answer.refusal.is_none(), "{answer:?}");
    let (more_acks, acks) = tokio::sync::mpsc::channel::<AckStreamRequest>(1);
    let _acking =
        client.inbox().ack_stream(tokio_stream::wrappers::ReceiverStream::new(acks)).await.expect("AckStream");
    // A scraper's keep-alive connection, answered once and left open.
    let mut scraper = tokio::net::TcpStream::connect(&admin).await.expect("connect to admin.listen");
    scraper.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write request");
    let mut first = [0u8; 12];
    scraper.read_exact(&mut first).await.expect("read response");
    assert_eq!(&first, b"HTTP/1.1 200");

    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "exit 0 after SIGTERM, got {status}; log:\n{}", daemon.logs());
    let logs = daemon.logs();
    assert!(!logs.contains("tasks still running"), "a task outlived the grace period:\n{logs}");
    assert!(!logs.contains("grace period over"), "a call outlived the grace period:\n{logs}");
    assert!(logs.contains("consistd stopped"), "{logs}");
    drop((leading, scraper, more_sends, more_acks));
}

/// GETs `path` from `addr` over plain HTTP/1.0: the status code and the body.
async fn http_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect to admin.listen");
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.expect("write request");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read response");
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status code");
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn admin_listen_serves_probes_metrics_and_the_outbox_over_tcp_with_the_leader_gauge() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let config = format!("namespace: {ns}\nadmin:\n  listen: \"{addr}\"\npeer:\n  insecure: true\n");
    let daemon = Daemon::builder(BIN).config(config).start().await;
    assert_eq!(http_get(&addr, "/healthz").await.0, 200);
    // Ready once the apiserver has been heard from, which may come a moment after the socket serves.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let readyz = http_get(&addr, "/readyz").await;
        if readyz == (200, "ok\n".to_owned()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "/readyz over TCP never said ok: {readyz:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = http_get(&addr, "/debug/state").await;
    assert_eq!(status, 404, "the daemon's internals stay on the admin socket: {body}");

    // /outbox: what `kubectl consistd outbox` reads through the pod proxy. A message to a peer nobody
    // listens on stays pending there.
    let send = json_message(Target::Peer("127.0.0.1:1".to_owned()), "r", "1");
    daemon.client().outbox().send(send).await.expect("Send");
    let (status, body) = http_get(&addr, "/outbox").await;
    assert_eq!(status, 200, "{body}");
    let outbox: consistd_core::report::OutboxReport = serde_json::from_str(&body).expect("an outbox report");
    assert_eq!(outbox.pending, 1, "{body}");
    assert_eq!((outbox.peers[0].peer.as_str(), outbox.peers[0].pending), ("127.0.0.1:1", 1), "{body}");

    let campaign = lead(&daemon, "gauged").await;
    let line = format!("consistd_leader_election_master_status{{election=\"{ns}/gauged\"}} 1");
    let (status, metrics) = http_get(&addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains(&line), "{line} in:\n{metrics}");

    // Resigning: the gauge falls to 0, or goes with the election.
    drop(campaign);
    let gone = format!("election=\"{ns}/gauged\"}} 1");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while http_get(&addr, "/metrics").await.1.contains(&gone) {
        assert!(std::time::Instant::now() < deadline, "still 1 after resigning");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
