//! The Kopf seed's own timeline (kopf#844) on a slow link, as a new user meets it: a proxy delays what
//! the apiserver sends to consistd (and, in the "both ways" cases, what consistd sends to it) by 0, 0.1,
//! 1 and 3 s; a third party creates ConfigMap `k` with `data.field=s0` and patches it to `p1` a second
//! later; an app patches the annotation `handled=<field>` through ObjectsService whenever the two differ.
//! The app runs twice side by side: on a CONSISTENT Subscribe and on a ReconcileService queue (writes
//! naming the lease). Each value must be handled once, the app's own write delivered marked OWN_WRITE
//! (the queue never hands out a TIMED_OUT item), and every write must take one round trip on the
//! connection that is already open: no new connection, so no TLS handshake through the slow link.

use std::time::Duration;

use consistd_client::proto::{
    Completion, Consistency, DeliveryMode, EventType, KubeObject, ObjectQuery, Outcome, PatchRequest, PatchType,
    QueueSpec, ReconcileRequest, SubscribeRequest, reconcile_request, reconcile_response,
    reconcile_service_client::ReconcileServiceClient,
};
use consistd_testkit::{Daemon, proxy::DelayProxy, watch::Events};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
/// The third party's last value.
const LAST: &str = "p1";
/// How long the apps wait, after the last value was handled, for a duplicate that must not come.
const SETTLE: Duration = Duration::from_secs(2);

/// One of the app's writes: the value it handled, how long the write took, and whether the proxy
/// accepted a new connection while it was in flight.
#[derive(Debug)]
struct Write {
    value: String,
    took: Duration,
    new_connections: u64,
    resource_version: String,
}

/// What one app did: the values it handled in order, its writes, and how each state it was handed was
/// marked ("p1/s0 OWN_WRITE": field p1, annotation s0).
#[derive(Debug, Default)]
struct Run {
    handled: Vec<String>,
    writes: Vec<Write>,
    states: Vec<String>,
}

/// `data.field` and the `handled` annotation of a ConfigMap's JSON.
fn field_and_handled(object: &KubeObject) -> (String, String) {
    let json: Value = serde_json::from_slice(&object.json).expect("object JSON");
    let field = json["data"]["field"].as_str().unwrap_or_default().to_owned();
    let handled = json["metadata"]["annotations"]["handled"].as_str().unwrap_or_default().to_owned();
    (field, handled)
}

/// The app's handler: marks the object handled for `value` through consistd, naming `lease` when the
/// write is made for a work item.
async fn handle(daemon: &Daemon, proxy: &DelayProxy, ns: &str, name: &str, value: &str, lease: &str) -> Write {
    let request = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        name: name.into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "metadata": { "annotations": { "handled": value } } }).to_string().into_bytes(),
        reconcile_lease: lease.into(),
        ..Default::default()
    };
    let connections = proxy.connections();
    let started = Instant::now();
    let response = daemon.client().objects().patch(request).await.expect("the app's patch");
    let took = started.elapsed();
    let object = response.into_inner().object.expect("the patched object");
    Write {
        value: value.to_owned(),
        took,
        new_connections: proxy.connections() - connections,
        resource_version: object.resource_version,
    }
}

/// The app on a CONSISTENT subscription to ConfigMap `name` (saying `ready` once synced): handles each
/// state whose field differs from its annotation, until it has handled [`LAST`] and then been handed
/// nothing for [`SETTLE`] plus a round trip.
async fn stream_app(
    daemon: &Daemon,
    proxy: &DelayProxy,
    ns: &str,
    name: &str,
    ready: oneshot::Sender<()>,
    rtt: Duration,
) -> Run {
    let request = SubscribeRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        field_selector: format!("metadata.name={name}"),
        mode: DeliveryMode::Consistent.into(),
        ..Default::default()
    };
    let mut events = Events::open(&daemon.client(), request).await;
    events.until_synced().await;
    let _ = ready.send(());
    let mut run = Run::default();
    loop {
        let quiet = SETTLE + rtt;
        let event = if run.handled.last().map(String::as_str) == Some(LAST) {
            match tokio::time::timeout(quiet, events.next()).await {
                Ok(event) => event,
                Err(_) => return run,
            }
        } else {
            events.next().await
        };
        if event.r#type() == EventType::Synced {
            continue;
        }
        let object = event.object.as_ref().expect("an object event");
        let (field, handled) = field_and_handled(object);
        run.states.push(format!("{field}/{handled} {}", mark(event.consistency())));
        if field != handled {
            run.handled.push(field.clone());
            run.writes.push(handle(daemon, proxy, ns, name, &field, "").await);
        }
    }
}

/// The app on a reconcile queue of ConfigMap `name` (saying `ready` once started): on each pass, handles
/// the object when its field differs from its annotation (the write naming the lease), then completes
/// DONE; until it has handled [`LAST`] and then been handed nothing for [`SETTLE`] plus a round trip.
async fn queue_app(
    daemon: &Daemon,
    proxy: &DelayProxy,
    ns: &str,
    name: &str,
    ready: oneshot::Sender<()>,
    rtt: Duration,
) -> Run {
    let spec = QueueSpec {
        name: "seed".into(),
        primary: Some(ObjectQuery {
            resource: "configmaps".into(),
            namespace: ns.into(),
            field_selector: format!("metadata.name={name}"),
            ..Default::default()
        }),
        max_leases: 1,
        ..Default::default()
    };
    let (tx, requests) = mpsc::channel(16);
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).await.expect("queue the spec");
    let mut client = ReconcileServiceClient::new(daemon.client().channel());
    let mut answers = client.reconcile(ReceiverStream::new(requests)).await.expect("open the queue").into_inner();
    let mut ready = Some(ready);
    let mut run = Run::default();
    loop {
        let wait =
            if run.handled.last().map(String::as_str) == Some(LAST) { SETTLE + rtt } else { Duration::from_secs(30) };
        let answer = match tokio::time::timeout(wait, answers.message()).await {
            Err(_) if run.handled.last().map(String::as_str) == Some(LAST) => return run,
            Err(_) => panic!("no work item within {wait:?}; so far {run:?}"),
            Ok(answer) => answer.expect("the queue's stream").expect("the queue's stream goes on"),
        };
        let item = match answer.response {
            Some(reconcile_response::Response::Started(_)) => {
                // Started answers the spec before the queue's watch has listed: ready once a subscription
                // of the same query, sharing its upstream watch, is synced, so the list crossed the link
                // before it slowed (else the list can come back after the third party's patch, and the
                // queue rightly hands out only the newest state).
                let request = SubscribeRequest {
                    resource: "configmaps".into(),
                    namespace: ns.into(),
                    field_selector: format!("metadata.name={name}"),
                    mode: DeliveryMode::Raw.into(),
                    ..Default::default()
                };
                Events::open(&daemon.client(), request).await.until_synced().await;
                ready.take().map(|ready| ready.send(()));
                continue;
            }
            Some(reconcile_response::Response::Item(item)) => item,
            other => panic!("expected a work item, got {other:?}"),
        };
        let object = item.object.as_ref().expect("the primary");
        let (field, handled) = field_and_handled(object);
        run.states.push(format!("{field}/{handled} {}", mark(item.consistency())));
        if field != handled {
            run.handled.push(field.clone());
            run.writes.push(handle(daemon, proxy, ns, name, &field, &item.lease_id).await);
        }
        let done = Completion { lease_id: item.lease_id, outcome: Outcome::Done.into(), ..Default::default() };
        tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Complete(done)) })
            .await
            .expect("complete");
    }
}

fn mark(consistency: Consistency) -> &'static str {
    consistency.as_str_name().trim_start_matches("CONSISTENCY_")
}

/// The seed's timeline with `delay` on the link toward the daemon, and toward the apiserver too when
/// `both_ways`: both apps, side by side in one daemon with its default config, each on its own object.
async fn seed_timeline(delay: Duration, both_ways: bool) {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let daemon = Daemon::builder(BIN).through(&proxy).start().await;
    let rtt = if both_ways { delay * 2 } else { delay };

    // The apps open their subscription and queue on an undelayed link, as a pod starts on a healthy one.
    let (stream_ready, stream_attached) = oneshot::channel();
    let (queue_ready, queue_attached) = oneshot::channel();
    let stream = stream_app(&daemon, &proxy, &ns, "k-stream", stream_ready, rtt);
    let queue = queue_app(&daemon, &proxy, &ns, "k-queue", queue_ready, rtt);
    let third_party = async {
        stream_attached.await.expect("the stream app attached");
        queue_attached.await.expect("the queue app attached");
        wait_upstreams(&daemon, 2).await;
        proxy.set_delay(delay);
        if both_ways {
            proxy.set_delay_to_upstream(delay);
        }
        for name in ["k-stream", "k-queue"] {
            let cm = json!({ "metadata": { "name": name }, "data": { "field": "s0" } });
            api.create(&PostParams::default(), &serde_json::from_value(cm).expect("configmap")).await.expect("create");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        for name in ["k-stream", "k-queue"] {
            let patch = json!({ "data": { "field": "p1" } });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("third-party patch");
        }
    };
    let (stream, queue, ()) = tokio::join!(stream, queue, third_party);

    let label = format!("{delay:?} {}", if both_ways { "both ways" } else { "toward the daemon" });
    for (app, run) in [("CONSISTENT stream", &stream), ("reconcile queue", &queue)] {
        assert_eq!(run.handled, ["s0", "p1"], "{label}, {app}: each value handled once; {run:#?}\n{}", daemon.logs());
        assert!(
            run.states.iter().all(|s| !s.ends_with("TIMED_OUT")),
            "{label}, {app}: nothing released for a slow write; {run:#?}"
        );
        for write in &run.writes {
            assert_eq!(
                write.new_connections, 0,
                "{label}, {app}: the write of {} opened a connection; {run:#?}",
                write.value
            );
            // One round trip; a second (a handshake) would take at least twice the round trip.
            let one_round_trip = rtt + rtt / 2 + Duration::from_millis(300);
            if delay >= Duration::from_secs(1) {
                assert!(
                    write.took < one_round_trip,
                    "{label}, {app}: the write of {} took {:?}; {run:#?}",
                    write.value,
                    write.took
                );
            }
        }
    }
    // The CONSISTENT app was handed the state each of its writes made, marked as its own: the first state
    // carrying a write's annotation is that write's.
    for write in &stream.writes {
        let first = stream
            .states
            .iter()
            .find(|s| s.split(' ').next().is_some_and(|fh| fh.ends_with(&format!("/{}", write.value))));
        assert!(first.is_some_and(|s| s.ends_with(" OWN_WRITE")), "{label}: the write of {}: {stream:#?}", write.value);
    }
    assert_eq!(stream.states.last().map(String::as_str), Some("p1/p1 OWN_WRITE"), "{label}: {stream:#?}");
    let last = stream.writes.last().expect("a write");
    let object = api.get("k-stream").await.expect("get");
    assert_eq!(object.metadata.resource_version.as_deref(), Some(last.resource_version.as_str()));
}

/// Waits until the daemon runs `n` upstream watches (its metrics say so).
async fn wait_upstreams(daemon: &Daemon, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let running = daemon.metric("consistd_watch_upstreams", "").await;
        #[allow(clippy::cast_precision_loss, reason = "a count")]
        if running >= Some(n as f64) {
            return;
        }
        assert!(Instant::now() < deadline, "the apps' watches did not start:\n{}", daemon.metrics().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn no_delay() {
    seed_timeline(Duration::ZERO, false).await;
}

#[tokio::test]
async fn a_tenth_of_a_second_toward_the_daemon() {
    seed_timeline(Duration::from_millis(100), false).await;
}

#[tokio::test]
async fn a_tenth_of_a_second_both_ways() {
    seed_timeline(Duration::from_millis(100), true).await;
}

#[tokio::test]
async fn one_second_toward_the_daemon() {
    seed_timeline(Duration::from_secs(1), false).await;
}

#[tokio::test]
async fn one_second_both_ways() {
    seed_timeline(Duration::from_secs(1), true).await;
}

#[tokio::test]
async fn three_seconds_toward_the_daemon() {
    seed_timeline(Duration::from_secs(3), false).await;
}

#[tokio::test]
async fn three_seconds_both_ways() {
    seed_timeline(Duration::from_secs(3), true).await;
}

/// Ten watches of distinct queries, their lists, a read and a write share one connection to the apiserver
/// (HTTP/2, as client-go). With client-go's `DISABLE_HTTP2` switch the daemon still serves them, over
/// HTTP/1.1: a connection per watch.
#[tokio::test]
async fn every_watch_and_write_share_one_connection() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let cm = json!({ "metadata": { "name": "k" }, "data": { "field": "s0" } });
    api.create(&PostParams::default(), &serde_json::from_value(cm).expect("configmap")).await.expect("create");
    let port = consistd_testkit::apiserver_addr().port();
    for http2 in [true, false] {
        let mut builder = Daemon::builder(BIN);
        if !http2 {
            builder = builder.env("DISABLE_HTTP2", "1");
        }
        let daemon = builder.start().await;
        let mut watches = Vec::new();
        for i in 0..10 {
            let request = SubscribeRequest {
                resource: "configmaps".into(),
                namespace: ns.clone(),
                label_selector: format!("query notin (q{i})"),
                mode: DeliveryMode::Raw.into(),
                ..Default::default()
            };
            let mut events = Events::open(&daemon.client(), request).await;
            events.until_synced().await;
            watches.push(events);
        }
        let patch = json!({ "data": { "field": format!("http2-{http2}") } });
        let request = PatchRequest {
            resource: "configmaps".into(),
            namespace: ns.clone(),
            name: "k".into(),
            patch_type: PatchType::Merge.into(),
            patch: patch.to_string().into_bytes(),
            ..Default::default()
        };
        daemon.client().objects().patch(request).await.expect("patch through the daemon");
        for events in &mut watches {
            assert_eq!(events.next().await.r#type(), EventType::Modified, "every watch sees the write");
        }
        let connections = consistd_testkit::tcp_connections(daemon.pid(), port);
        if http2 {
            assert_eq!(connections, 1, "ten watches and a write over HTTP/2");
        } else {
            assert!(connections >= 10, "HTTP/1.1: a connection per watch, {connections}");
        }
    }
}
