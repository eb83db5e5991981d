//! The gRPC server metrics and the watch delivery latency histogram, read from /metrics after real calls
//! against the real apiserver: calls counted when they start and when they end with their code, timed,
//! a stream whose client left counted as Canceled, and every live watch delivery timed per mode.

use std::time::Duration;

use consistd_client::proto::{
    DeliveryMode, Destination, EventType, GetOutboxStatusRequest, SendRequest, SubscribeRequest,
};
use consistd_testkit::Daemon;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::PostParams};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

async fn metrics(daemon: &Daemon) -> String {
    let body = consistd_server::admin::get(daemon.admin_socket(), "/metrics").await.expect("GET /metrics").1;
    String::from_utf8_lossy(&body).into_owned()
}

/// The value of the sample of `name` whose labels include all of `labels` (`key="value"` each).
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        let pairs: Vec<&str> = set.split(',').collect();
        labels.iter().all(|l| pairs.contains(l)).then(|| value.split(' ').next()?.parse().ok()).flatten()
    })
}

fn subscribe(ns: &str, mode: DeliveryMode) -> SubscribeRequest {
    SubscribeRequest {
        resource: "configmaps".to_owned(),
        namespace: ns.to_owned(),
        mode: mode.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_counted_by_code_and_timed_and_watch_deliveries_are_timed_per_mode() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).config("peer:\n  insecure: true\n").start().await;
    let client = daemon.client();
    let outbox = ["grpc_service=\"consistd.v1.OutboxService\"", "grpc_type=\"unary\""];
    let status = [outbox[0], outbox[1], "grpc_method=\"GetOutboxStatus\""];
    let send = [outbox[0], outbox[1], "grpc_method=\"Send\""];

    // Every method's series exists at 0 before its first call.
    let before = metrics(&daemon).await;
    assert_eq!(sample(&before, "consistd_grpc_server_started_total", &send), Some(0.0), "{before}");

    client.outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("GetOutboxStatus");
    client.outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("GetOutboxStatus");
    let bad = SendRequest { destination: Some(Destination { target: None }), ..Default::default() };
    let refused = client.outbox().send(bad).await.expect_err("a Send without a target is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    // Two watches on the same query, one per mode; each sees a ConfigMap created after it synced.
    let mut streams = Vec::new();
    for mode in [DeliveryMode::Raw, DeliveryMode::Consistent] {
        let mut stream = client.watch().subscribe(subscribe(&ns, mode)).await.expect("Subscribe").into_inner();
        let synced = stream.message().await.expect("stream").expect("open");
        assert_eq!(synced.r#type(), EventType::Synced, "an empty namespace syncs at once");
        streams.push(stream);
    }
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": "timed"}})).expect("object");
    Api::<ConfigMap>::namespaced(kube, &ns).create(&PostParams::default(), &cm).await.expect("create");
    for stream in &mut streams {
        let added = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("in time");
        assert_eq!(added.expect("stream").expect("open").r#type(), EventType::Added);
    }
    // The clients leave: their streams end as Canceled.
    drop(streams);

    let watch =
        ["grpc_service=\"consistd.v1.WatchService\"", "grpc_method=\"Subscribe\"", "grpc_type=\"server_stream\""];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = metrics(&daemon).await;
        let canceled = [watch[0], watch[1], watch[2], "grpc_code=\"Canceled\""];
        if sample(&text, "consistd_grpc_server_handled_total", &canceled) == Some(2.0) {
            break text;
        }
        assert!(tokio::time::Instant::now() < deadline, "both watches ended as Canceled:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let count = |name: &str, labels: &[&str]| sample(&text, name, labels);
    assert_eq!(count("consistd_grpc_server_started_total", &status), Some(2.0), "{text}");
    let ok = [status[0], status[1], status[2], "grpc_code=\"OK\""];
    assert_eq!(count("consistd_grpc_server_handled_total", &ok), Some(2.0), "{text}");
    assert_eq!(count("consistd_grpc_server_handling_seconds_count", &status), Some(2.0), "{text}");
    let invalid = [send[0], send[1], send[2], "grpc_code=\"InvalidArgument\""];
    assert_eq!(count("consistd_grpc_server_handled_total", &invalid), Some(1.0), "{text}");
    assert_eq!(count("consistd_grpc_server_started_total", &watch), Some(2.0), "{text}");
    assert_eq!(count("consistd_grpc_server_handling_seconds_count", &watch), Some(2.0), "{text}");
    // One live delivery per mode: the ADDED (snapshots and SYNCED are not deliveries of a change).
    for mode in ["raw", "consistent"] {
        let label = format!("mode=\"{mode}\"");
        assert_eq!(count("consistd_watch_delivery_latency_seconds_count", &[&label]), Some(1.0), "{mode}: {text}");
        let sum = count("consistd_watch_delivery_latency_seconds_sum", &[&label]).expect("a sum");
        assert!(sum > 0.0 && sum < 10.0, "{mode}: delivered {sum} s after receipt: {text}");
    }
}
