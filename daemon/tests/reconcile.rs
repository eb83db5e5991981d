//! ReconcileService against the real apiserver: keys handed out once each and never twice at a time,
//! one more pass for a change during a lease and none for the app's own write under it, the app's own
//! write seen by the key's next pass (through a delaying network), retries, leases returned by a vanished
//! app, work only while the pod leads its election, a deletion handed out once, changes a filter passes
//! over, bad input refused naming the field, metrics and status.

use std::time::Duration;

use consistd_client::proto::{
    CampaignRequest, ChangeFilter, Completion, CreateRequest, ElectionRef, LeadershipState, ObjectQuery, ObjectView,
    Outcome, PatchRequest, PatchType, QueueSpec, RelatedQuery, RetryPolicy, WorkItem, reconcile_request,
    reconcile_response, related_query,
};
use consistd_testkit::{Daemon, proxy::DelayProxy, queue::open};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
/// How long a test waits for one message before failing.
const WAIT: Duration = Duration::from_secs(20);

fn spec(name: &str, ns: &str, max_leases: u32) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        primary: Some(ObjectQuery { resource: "configmaps".into(), namespace: ns.into(), ..Default::default() }),
        max_leases,
        ..Default::default()
    }
}

fn configmap(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({ "metadata": { "name": name }, "data": data })).expect("configmap")
}

fn data(item: &WorkItem) -> Value {
    let object = item.object.as_ref().expect("an object");
    serde_json::from_slice::<Value>(&object.json).expect("json")["data"].clone()
}

fn rv(item: &WorkItem) -> u64 {
    item.object.as_ref().expect("an object").resource_version.parse().expect("an integer resourceVersion")
}

#[tokio::test]
async fn each_key_is_leased_once_at_a_time_and_a_change_during_a_lease_gives_one_more_pass() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &configmap(name, json!({ "v": "0" }))).await.expect("create");
    }
    let daemon = Daemon::builder(BIN).start().await;
    let mut queue = open(&daemon, spec("work", &ns, 10)).await.expect("open");
    let mut keys = Vec::new();
    for _ in 0..3 {
        let item = queue.item().await;
        assert_eq!(item.namespace, ns);
        assert_eq!(item.attempt, 1);
        keys.push(item);
    }
    let mut names: Vec<&str> = keys.iter().map(|i| i.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "b", "c"], "each key once");
    // Changes to a leased key: no second lease while the first is out, however many arrive.
    let a = keys.iter().find(|i| i.name == "a").expect("a");
    for v in 1..=3 {
        let patch = json!({ "data": { "v": v.to_string() } });
        api.patch("a", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    }
    assert!(queue.item_within(Duration::from_secs(2)).await.is_none(), "never two leases out for one key");
    queue.complete(a, Outcome::Done).await;
    let again = queue.item().await;
    assert_eq!(again.name, "a");
    assert_eq!(data(&again)["v"], "3", "read from the cache when granted, not when the event came");
    queue.complete(&again, Outcome::Done).await;
    assert!(queue.item_within(Duration::from_secs(2)).await.is_none(), "one more pass, not one per change");
}

/// The seed's promise where the app handles the key: a third party changes the object during the lease,
/// the app writes it and completes; the key's next pass is never older than that write. Each round makes
/// the race likely: the third party's first change reaches the daemon (the key is ready again the moment
/// the lease ends); its second is held 2 s by the delaying proxy, and everything after it on the daemon's
/// one apiserver connection with it: the app's write, sent after the clog, is answered once it clears,
/// with the second change and the write's own event right behind. A queue that granted from its cache as
/// soon as the lease ended would hand out a state older than the app's write.
#[tokio::test]
async fn the_next_pass_of_a_key_never_carries_a_state_older_than_the_write_its_lease_made() {
    const ROUNDS: usize = 3;
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("obj", json!({ "v": "0" }))).await.expect("create");
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let daemon = Daemon::builder(BIN).config("consistency:\n  timeout: 10s\n").through(&proxy).start().await;
    let client = daemon.client();
    let mut queue = open(&daemon, spec("own", &ns, 1)).await.expect("open");
    let mut item = queue.item().await;
    for round in 0..ROUNDS {
        let third = |n: usize| json!({ "data": { "third": format!("{round}.{n}") } });
        api.patch("obj", &PatchParams::default(), &Patch::Merge(&third(1))).await.expect("third-party patch");
        tokio::time::sleep(Duration::from_millis(300)).await; // its event reached the daemon: one more pass
        proxy.set_delay(Duration::from_secs(2)); // the clog: the next event the watch reads is held 2 s
        api.patch("obj", &PatchParams::default(), &Patch::Merge(&third(2))).await.expect("third-party patch");
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.set_delay(Duration::ZERO);
        let own = PatchRequest {
            resource: "configmaps".into(),
            namespace: ns.clone(),
            name: "obj".into(),
            patch_type: PatchType::Merge.into(),
            patch: json!({ "data": { "handled": round.to_string() } }).to_string().into_bytes(),
            reconcile_lease: item.lease_id.clone(),
            ..Default::default()
        };
        let written = client.objects().patch(own).await.expect("the app's patch").into_inner().object.expect("object");
        queue.complete(&item, Outcome::Done).await;
        item = queue.item().await;
        let written: u64 = written.resource_version.parse().expect("integer");
        assert!(rv(&item) >= written, "round {round}: granted {} before the app's own write {written}", rv(&item));
        assert_eq!(data(&item)["handled"], round.to_string(), "round {round}");
        assert_eq!(item.consistency(), consistd_client::proto::Consistency::Consistent, "round {round}");
    }
    let metrics = daemon.metrics().await;
    assert!(metrics.contains("consistd_workqueue_consistency_holds_total{name=\"own\"}"), "{metrics}");
}

/// The same promise when the app ends its lease while its write is still on its way (a write from another
/// task of the app, or a DONE sent too early): the next pass waits for the write's answer and its watch.
#[tokio::test]
async fn a_write_still_in_flight_when_its_lease_ends_holds_the_next_pass_until_the_watch_shows_it() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("obj", json!({ "v": "0" }))).await.expect("create");
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let daemon = Daemon::builder(BIN).config("consistency:\n  timeout: 10s\n").through(&proxy).start().await;
    let client = daemon.client();
    let mut queue = open(&daemon, spec("inflight", &ns, 1)).await.expect("open");
    let item = queue.item().await;
    proxy.set_delay(Duration::from_secs(1));
    let third = json!({ "data": { "third": "yes" } });
    api.patch("obj", &PatchParams::default(), &Patch::Merge(&third)).await.expect("third-party patch");
    tokio::time::sleep(Duration::from_millis(1500)).await; // its event reached the daemon: one more pass
    let own = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        name: "obj".into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "handled": "yes" } }).to_string().into_bytes(),
        ..Default::default()
    };
    let mut objects = client.objects();
    let write = consistd_testkit::spawn(async move { objects.patch(own).await });
    tokio::time::sleep(Duration::from_millis(300)).await; // the write is in flight: its answer is delayed 1 s
    queue.complete(&item, Outcome::Done).await;
    let next = queue.item().await;
    let written = write.await.expect("join").expect("the app's patch").into_inner().object.expect("object");
    let written: u64 = written.resource_version.parse().expect("integer");
    assert!(rv(&next) >= written, "granted {} while the app's write {written} was in flight", rv(&next));
    assert_eq!(data(&next)["handled"], "yes");
    assert_eq!(next.consistency(), consistd_client::proto::Consistency::Consistent);
}

/// A write the app makes under a lease (naming it) queues no pass of its key by itself: each round's
/// patch is answered, the lease ends DONE, and nothing follows. A third party's change during a lease that
/// also wrote still gives one more pass, exactly one.
#[tokio::test]
async fn a_write_under_a_lease_queues_no_pass_but_a_change_by_anyone_else_still_does() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("obj", json!({ "v": "0" }))).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;
    let client = daemon.client();
    let mut queue = open(&daemon, spec("lean", &ns, 1)).await.expect("open");
    let own = |item: &WorkItem, value: String| PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        name: "obj".into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "handled": value } }).to_string().into_bytes(),
        reconcile_lease: item.lease_id.clone(),
        ..Default::default()
    };
    let mut item = queue.item().await;
    for round in 0..3 {
        client.objects().patch(own(&item, round.to_string())).await.expect("the app's patch");
        queue.complete(&item, Outcome::Done).await;
        assert!(
            queue.item_within(Duration::from_secs(2)).await.is_none(),
            "round {round}: the lease's own write queued a pass"
        );
        // Anyone else's change queues one.
        let third = json!({ "data": { "third": round.to_string() } });
        api.patch("obj", &PatchParams::default(), &Patch::Merge(&third)).await.expect("third-party patch");
        item = queue.item().await;
        assert_eq!(data(&item)["third"], round.to_string(), "round {round}");
    }
    // During a lease: a third party's change, then the app's own write.
    let third = json!({ "data": { "third": "during" } });
    api.patch("obj", &PatchParams::default(), &Patch::Merge(&third)).await.expect("third-party patch");
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.objects().patch(own(&item, "during".into())).await.expect("the app's patch");
    queue.complete(&item, Outcome::Done).await;
    let again = queue.item().await;
    assert_eq!(data(&again)["third"], "during", "the third party's change during the lease was lost");
    assert_eq!(data(&again)["handled"], "during", "granted with the app's own write");
    queue.complete(&again, Outcome::Done).await;
    assert!(queue.item_within(Duration::from_secs(2)).await.is_none(), "one more pass, not two");
}

/// Issue 46: a handler that writes unconditionally costs nothing on a pass with nothing to do: its write,
/// which would change nothing, is answered from the cache (`unchanged`), never reaches the apiserver, and
/// queues no pass; a third party's change is handed out next, consistent.
#[tokio::test]
async fn a_write_under_a_lease_that_would_change_nothing_is_not_sent_and_queues_nothing() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("obj", json!({ "v": "0" }))).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;
    let client = daemon.client();
    let mut queue = open(&daemon, spec("unchanged", &ns, 1)).await.expect("open");
    let handle = |item: &WorkItem| PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        name: "obj".into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "handled": "yes" } }).to_string().into_bytes(),
        reconcile_lease: item.lease_id.clone(),
        ..Default::default()
    };
    let first = queue.item().await;
    let wrote = client.objects().patch(handle(&first)).await.expect("the first pass's patch").into_inner();
    assert!(!wrote.unchanged, "the first pass changes the object");
    queue.complete(&first, Outcome::Done).await;
    for round in 0..3 {
        let third = json!({ "data": { "third": round.to_string() } });
        api.patch("obj", &PatchParams::default(), &Patch::Merge(&third)).await.expect("third-party patch");
        let item = queue.item().await;
        assert_eq!(data(&item)["third"], round.to_string(), "round {round}");
        assert_ne!(item.consistency(), consistd_client::proto::Consistency::TimedOut, "round {round}");
        let offset = consistd_testkit::audit_offset();
        let again = client.objects().patch(handle(&item)).await.expect("the handler's patch").into_inner();
        assert!(again.unchanged, "round {round}: the object already shows it");
        queue.complete(&item, Outcome::Done).await;
        assert!(queue.item_within(Duration::from_secs(1)).await.is_none(), "round {round}: no pass follows");
        let sent = consistd_testkit::audit_events(offset)
            .iter()
            .filter(|e| {
                e["stage"] == "ResponseComplete" && e["verb"] == "patch" && e["objectRef"]["namespace"] == ns.as_str()
            })
            .count();
        assert_eq!(sent, 0, "round {round}: the unchanged write reached the apiserver");
    }
}

/// Issue 46: a write the queue's quiet watch will never show holds the key's next pass only until the
/// apiserver's next bookmark on that watch, not for `consistency.timeout`. The app, under a lease, creates an
/// Opaque Secret; the queue's related watch of Secrets selects `type=kubernetes.io/tls`, a field the daemon
/// cannot judge, so the next pass waits until that watch is past the write; nothing else happens in the
/// namespace, so only a bookmark (the apiserver sends one about every minute) can show it is. With a timeout
/// of 150 s, the pass is handed out CONSISTENT, never TIMED_OUT: kube's watcher drops bookmarks, and without
/// the daemon's own handling of them this test waits the whole timeout and fails. (It takes up to a minute.)
#[tokio::test]
async fn a_quiet_watch_holds_a_key_only_until_its_next_bookmark() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("obj", json!({ "v": "0" }))).await.expect("create");
    let daemon = Daemon::builder(BIN).config("consistency:\n  timeout: 150s\n").start().await;
    let client = daemon.client();
    let mut s = spec("bookmarks", &ns, 1);
    s.related = vec![RelatedQuery {
        query: Some(ObjectQuery {
            resource: "secrets".into(),
            namespace: ns.clone(),
            field_selector: "type=kubernetes.io/tls".into(),
            ..Default::default()
        }),
        maps_by: Some(related_query::MapsBy::Label("owner".into())),
        priority: 0,
    }];
    let mut queue = open(&daemon, s).await.expect("open");
    let first = queue.item().await;
    // The Secrets watch is through its list (its position is the list's version) before the write: only a
    // later bookmark can show it past the write.
    let listed = |metrics: &str| {
        metrics.lines().any(|l| {
            l.starts_with("consistd_watch_resource_version{resource=\"v1/secrets\"")
                && l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n > 0)
        })
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while !listed(&daemon.metrics().await) {
        assert!(tokio::time::Instant::now() < deadline, "the Secrets watch listed within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secret = json!({ "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": { "name": "child", "labels": { "owner": "obj" } }, "stringData": { "k": "v" } });
    client
        .objects()
        .create(CreateRequest {
            resource: "secrets".into(),
            namespace: ns.clone(),
            object: secret.to_string().into_bytes(),
            reconcile_lease: first.lease_id.clone(),
            ..Default::default()
        })
        .await
        .expect("the app's Secret");
    queue.complete(&first, Outcome::Done).await;
    let third = json!({ "data": { "v": "1" } });
    api.patch("obj", &PatchParams::default(), &Patch::Merge(&third)).await.expect("third-party patch");
    let next = match queue.message(Duration::from_secs(140)).await {
        Some(reconcile_response::Response::Item(item)) => item,
        other => panic!("expected the next pass within 140 s, got {other:?}"),
    };
    assert_eq!(data(&next)["v"], "1");
    assert_eq!(
        next.consistency(),
        consistd_client::proto::Consistency::Consistent,
        "handed out once a bookmark showed the watch past the app's write, before the timeout"
    );
    let metrics = daemon.metrics().await;
    let bookmarks = metrics
        .lines()
        .find_map(|l| l.strip_prefix("consistd_watch_bookmarks_total "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .expect("consistd_watch_bookmarks_total");
    assert!(bookmarks >= 2, "the list's end and a bookmark after the write: {bookmarks}");
}

/// Waits until queue `name` of `daemon` has `keys` keys ready (`consistd_workqueue_depth`), failing the test
/// after [`WAIT`].
async fn ready_keys(daemon: &Daemon, name: &str, keys: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let label = format!("name=\"{name}\"");
    #[allow(clippy::cast_precision_loss, reason = "a handful of keys")]
    let want = keys as f64;
    while daemon.metric("consistd_workqueue_depth", &label).await != Some(want) {
        assert!(tokio::time::Instant::now() < deadline, "queue {name} never had {keys} keys ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 46: priorities. A related query's changes queue their primary at its priority, a completion's pass
/// goes at the completion's, and a higher priority is handed out first (one lease at a time, so the order is
/// the queue's): a Secret of `c` (priority 10) goes before a change of `b` (0) made earlier, and `c`'s
/// REQUEUE at priority 20 goes before a change of `a` made before it came due.
#[tokio::test]
async fn a_higher_priority_is_handed_out_first_from_a_related_query_or_a_completion() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &configmap(name, json!({ "v": "0" }))).await.expect("create");
    }
    let daemon = Daemon::builder(BIN).start().await;
    let mut s = spec("priorities", &ns, 1);
    s.related = vec![RelatedQuery {
        query: Some(ObjectQuery { resource: "secrets".into(), namespace: ns.clone(), ..Default::default() }),
        maps_by: Some(related_query::MapsBy::Label("owner".into())),
        priority: 10,
    }];
    let mut queue = open(&daemon, s).await.expect("open");
    for _ in 0..3 {
        let listed = queue.item().await;
        queue.complete(&listed, Outcome::Done).await;
    }
    let change = |name: &str, v: &str| {
        let api = api.clone();
        let (name, patch) = (name.to_owned(), json!({ "data": { "v": v } }));
        async move { api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch") }
    };
    change("a", "1").await;
    let a = queue.item().await;
    assert_eq!(a.name, "a");
    // While the one lease is out: b changes, then a Secret of c's.
    change("b", "1").await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(kube, &ns);
    let secret =
        serde_json::from_value(json!({ "metadata": { "name": "s", "labels": { "owner": "c" } } })).expect("secret");
    secrets.create(&PostParams::default(), &secret).await.expect("create the Secret");
    ready_keys(&daemon, "priorities", 2).await; // both seen by the queue's watches, waiting for the one lease
    queue.complete(&a, Outcome::Done).await;
    let c = queue.item().await;
    assert_eq!(c.name, "c", "the related query's priority 10 goes before b's change at 0");
    // c asks to come back in 300 ms at priority 20; b is handed out meanwhile.
    let requeue = Completion {
        lease_id: c.lease_id.clone(),
        outcome: Outcome::Requeue.into(),
        requeue_after: Some(prost_types::Duration { seconds: 0, nanos: 300_000_000 }),
        priority: 20,
        ..Default::default()
    };
    queue.send(reconcile_request::Request::Complete(requeue)).await;
    let b = queue.item().await;
    assert_eq!(b.name, "b");
    // The gauge is reported a little later than the queue changes: none ready (c waits), then a's change
    // and c's requeue due.
    ready_keys(&daemon, "priorities", 0).await;
    change("a", "2").await;
    ready_keys(&daemon, "priorities", 2).await;
    queue.complete(&b, Outcome::Done).await;
    let next = queue.item().await;
    assert_eq!(next.name, "c", "the requeue at 20 goes before a's change at 0");
    queue.complete(&next, Outcome::Done).await;
    assert_eq!(queue.item().await.name, "a");
}

/// Issue 46: a REQUEUE's time and a TERMINAL mark survive a restart of the daemon (kept in its store).
/// Before the restart: `a` asks to come back in an hour, `b` fails for good, `c` and `d` are done. While the
/// daemon is down, `d` changes. After it, the queue hands out `c` (every key once more, as a new queue's list
/// does) and `d` (changed), but not `a` (its hour is not up) nor `b` (unchanged since it failed); a change of
/// `b` then hands it out with its error.
#[tokio::test]
async fn a_requeue_and_a_terminal_mark_survive_a_restart_of_the_daemon() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    for name in ["a", "b", "c", "d"] {
        api.create(&PostParams::default(), &configmap(name, json!({ "v": "0" }))).await.expect("create");
    }
    let store = tempfile::tempdir().expect("store dir");
    let mut daemon = Daemon::builder(BIN).store_dir(store.path()).start().await;
    let mut queue = open(&daemon, spec("durable", &ns, 4)).await.expect("open");
    for _ in 0..4 {
        let item = queue.item().await;
        let (outcome, requeue_after, error) = match item.name.as_str() {
            "a" => (Outcome::Requeue, Some(prost_types::Duration { seconds: 3600, nanos: 0 }), ""),
            "b" => (Outcome::Terminal, None, "bad spec"),
            _ => (Outcome::Done, None, ""),
        };
        let c = Completion {
            lease_id: item.lease_id.clone(),
            outcome: outcome.into(),
            requeue_after,
            error: error.into(),
            ..Default::default()
        };
        queue.send(reconcile_request::Request::Complete(c)).await;
    }
    assert!(queue.item_within(Duration::from_secs(1)).await.is_none(), "nothing more before the restart");
    drop(queue);
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(daemon.wait_exit(Duration::from_secs(20)).await.success(), "a clean stop");
    drop(daemon);
    let changed = json!({ "data": { "v": "1" } });
    api.patch("d", &PatchParams::default(), &Patch::Merge(&changed)).await.expect("patch d while the daemon is down");

    let daemon = Daemon::builder(BIN).store_dir(store.path()).start().await;
    let mut queue = open(&daemon, spec("durable", &ns, 4)).await.expect("open again");
    let mut handed = Vec::new();
    while let Some(item) = queue.item_within(Duration::from_secs(3)).await {
        handed.push(item.name.clone());
        queue.complete(&item, Outcome::Done).await;
    }
    handed.sort();
    assert_eq!(handed, ["c", "d"], "a waits for its hour and b for a change, as before the restart");
    api.patch("b", &PatchParams::default(), &Patch::Merge(&changed)).await.expect("patch b");
    let b = queue.item().await;
    assert_eq!((b.name.as_str(), b.last_error.as_str()), ("b", "bad spec"), "b, changed, with its error");
}

#[tokio::test]
async fn a_retry_comes_back_with_its_attempt_and_error_and_the_queue_shows_in_metrics_and_status() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("a", json!({}))).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;
    let mut s = spec("retries", &ns, 1);
    s.retry = Some(RetryPolicy {
        base_delay: Some(prost_types::Duration { seconds: 0, nanos: 200_000_000 }),
        ..Default::default()
    });
    let mut queue = open(&daemon, s).await.expect("open");
    let first = queue.item().await;
    let failed = Completion {
        lease_id: first.lease_id.clone(),
        outcome: Outcome::Retry.into(),
        error: "the backend said no".into(),
        ..Default::default()
    };
    let sent = tokio::time::Instant::now();
    queue.send(reconcile_request::Request::Complete(failed)).await;
    let second = queue.item().await;
    assert!(sent.elapsed() >= Duration::from_millis(200), "after its backoff: {:?}", sent.elapsed());
    assert_eq!((second.attempt, second.last_error.as_str()), (2, "the backend said no"));
    let metrics = daemon.metrics().await;
    for line in [
        "consistd_workqueue_retries_total{name=\"retries\"} 1",
        "consistd_workqueue_adds_total{name=\"retries\"}",
        "consistd_workqueue_work_duration_seconds_count{name=\"retries\"} 1",
        "consistd_workqueue_longest_running_processor_seconds{name=\"retries\"}",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    // The report is brought up to date within a quarter of a second.
    let report = loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("report");
        let leased = report.queues.iter().any(|q| q.name == "retries" && q.leased == 1);
        if leased || sent.elapsed() > WAIT {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let q = report.queues.iter().find(|q| q.name == "retries").expect("the queue in the report");
    assert_eq!((q.leased, q.streams, q.active), (1, 1, true));
    assert_eq!(q.last_error, Some(format!("{ns}/a: the backend said no")));
    assert!(
        consistd_core::report::render(&report).contains("queue       retries"),
        "{}",
        consistd_core::report::render(&report)
    );
    // /queues (what `kubectl consistd queues` reads through the pod proxy) says the same.
    let (status, body) = consistd_server::admin::get(daemon.admin_socket(), "/queues").await.expect("GET /queues");
    assert!(status.is_success(), "{status}");
    let queues: consistd_core::report::QueuesReport = serde_json::from_slice(&body).expect("a queues report");
    assert_eq!(queues.queues, report.queues);
}

#[tokio::test]
async fn a_vanished_app_returns_its_leases_to_the_other_stream_of_the_queue() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("a", json!({}))).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;
    let mut first = open(&daemon, spec("shared", &ns, 5)).await.expect("open");
    let item = first.item().await;
    let mut second = open(&daemon, spec("shared", &ns, 5)).await.expect("join the same queue");
    assert!(second.item_within(Duration::from_secs(1)).await.is_none(), "a is leased to the first stream");
    drop(first);
    let again = second.item().await;
    assert_eq!(again.name, "a");
    assert_ne!(again.lease_id, item.lease_id);
    // A third stream asking for the same name with another spec is refused.
    let status = open(&daemon, spec("shared", "default", 5)).await.err().expect("refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert!(status.message().starts_with("spec: "), "{status}");
}

/// An app that (re)starts on a queue its last app left is handed every key once, behind live changes, as
/// an app starting on an informer sees every object; an app joining a queue another app is attached to is
/// not handed again what that app already did.
#[tokio::test]
async fn an_app_attaching_to_a_deserted_queue_is_handed_every_key_once_more() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    for name in ["a", "b"] {
        api.create(&PostParams::default(), &configmap(name, json!({}))).await.expect("create");
    }
    let daemon = Daemon::builder(BIN).start().await;
    let mut first = open(&daemon, spec("restarted", &ns, 5)).await.expect("open");
    for _ in 0..2 {
        let item = first.item().await;
        first.complete(&item, Outcome::Done).await;
    }
    let mut joined = open(&daemon, spec("restarted", &ns, 5)).await.expect("join the same queue");
    assert!(joined.item_within(Duration::from_secs(1)).await.is_none(), "a and b were done by the first app");
    drop((first, joined));
    // The daemon has seen both streams go (the queue lingers, with no stream attached).
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("report");
        if report.queues.iter().any(|q| q.name == "restarted" && q.streams == 0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the streams never left the queue: {report:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut restarted = open(&daemon, spec("restarted", &ns, 5)).await.expect("open again");
    let mut names = vec![restarted.item().await.name, restarted.item().await.name];
    names.sort();
    assert_eq!(names, ["a", "b"]);
}

/// A lease id of an earlier run of the sidecar (an app's completion or write sent after its sidecar
/// restarted) never names a lease of the new run.
#[tokio::test]
async fn lease_ids_of_a_restarted_sidecar_never_repeat_those_of_its_earlier_run() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("a", json!({}))).await.expect("create");
    let first = Daemon::builder(BIN).start().await;
    let mut queue = open(&first, spec("restarts", &ns, 1)).await.expect("open");
    let old = queue.item().await;
    drop((queue, first));
    let second = Daemon::builder(BIN).start().await;
    let mut queue = open(&second, spec("restarts", &ns, 1)).await.expect("open");
    let new = queue.item().await;
    assert_ne!(new.lease_id, old.lease_id, "the same key's first lease of each run");
    queue.complete(&old, Outcome::Done).await;
    let (code, message) = queue.refusal().await;
    assert_eq!(code, Code::FailedPrecondition, "{message}");
    queue.complete(&new, Outcome::Done).await;
    assert!(queue.item_within(Duration::from_secs(1)).await.is_none(), "the new lease was the one completed");
}

#[tokio::test]
async fn work_is_handed_out_only_while_this_pod_leads_and_carries_the_term() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("a", json!({}))).await.expect("create");
    let daemon = Daemon::builder(BIN).config(format!("identity: me\nnamespace: {ns}\n")).start().await;
    let mut s = spec("led", &ns, 1);
    s.election = Some(ElectionRef { election: "led".into(), namespace: String::new() });
    let mut queue = open(&daemon, s).await.expect("open");
    assert!(queue.item_within(Duration::from_secs(2)).await.is_none(), "nobody campaigns: no work");
    let campaign = CampaignRequest { election: "led".into(), ..Default::default() };
    let mut leading = daemon.client().leadership().campaign(campaign).await.expect("campaign").into_inner();
    let term = loop {
        let status = leading.message().await.expect("campaign stream").expect("status").status.expect("status");
        if status.state() == LeadershipState::Leader {
            break status.term;
        }
    };
    let item = queue.item().await;
    assert_eq!(item.term, term);
    assert!(term >= 1);
}

#[tokio::test]
async fn owned_objects_queue_their_controller_and_a_deletion_is_handed_out_once() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let owner = api.create(&PostParams::default(), &configmap("owner", json!({}))).await.expect("create");
    let daemon = Daemon::builder(BIN).start().await;
    let mut s = spec("owners", &ns, 5);
    s.primary = Some(ObjectQuery {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        field_selector: "metadata.name=owner".into(),
        ..Default::default()
    });
    s.related = vec![RelatedQuery {
        query: Some(ObjectQuery {
            resource: "configmaps".into(),
            namespace: ns.clone(),
            label_selector: "role=child".into(),
            ..Default::default()
        }),
        maps_by: Some(related_query::MapsBy::ControllerOwner(true)),
        priority: 0,
    }];
    let mut queue = open(&daemon, s).await.expect("open");
    let first = queue.item().await;
    assert_eq!(first.name, "owner");
    queue.complete(&first, Outcome::Done).await;
    let uid = owner.metadata.uid.clone().expect("uid");
    let child: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "child", "labels": { "role": "child" },
            "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "controller": true }]
        }
    }))
    .expect("child");
    api.create(&PostParams::default(), &child).await.expect("create the child");
    let by_child = queue.item().await;
    assert_eq!(by_child.name, "owner", "the child's change queues its controller");
    queue.complete(&by_child, Outcome::Done).await;
    api.delete("owner", &DeleteParams::default()).await.expect("delete");
    let gone = queue.item().await;
    assert!(gone.deleted, "{gone:?}");
    assert_eq!(gone.object.as_ref().expect("last state").uid, uid);
    queue.complete(&gone, Outcome::Done).await;
    assert!(queue.item_within(Duration::from_secs(2)).await.is_none(), "a deletion once");
}

#[tokio::test]
async fn a_queue_hands_out_primaries_in_its_view_and_a_projected_related_query_keeps_what_it_maps_by() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("owner", json!({ "field": "s0", "other": "o" })))
        .await
        .expect("create");
    let daemon = Daemon::builder(BIN).start().await;
    let projected = |fields: &[&str]| {
        Some(ObjectView { fields: fields.iter().map(|f| (*f).to_owned()).collect(), ..Default::default() })
    };
    let mut s = spec("views", &ns, 1);
    s.primary = Some(ObjectQuery {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        field_selector: "metadata.name=owner".into(),
        view: projected(&["data.field"]),
        ..Default::default()
    });
    // The related projection does not name the label it maps by: the daemon keeps it too.
    s.related = vec![RelatedQuery {
        query: Some(ObjectQuery {
            resource: "configmaps".into(),
            namespace: ns.clone(),
            label_selector: "role=child".into(),
            view: projected(&["data.x"]),
            ..Default::default()
        }),
        maps_by: Some(related_query::MapsBy::Label("owner-name".into())),
        priority: 0,
    }];
    let mut queue = open(&daemon, s).await.expect("open");
    let first = queue.item().await;
    assert_eq!((first.name.as_str(), data(&first)), ("owner", json!({ "field": "s0" })), "only the named field");
    queue.complete(&first, Outcome::Done).await;
    let child: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "child", "labels": { "role": "child", "owner-name": "owner" } },
        "data": { "x": "1" }
    }))
    .expect("child");
    api.create(&PostParams::default(), &child).await.expect("create the child");
    let by_child = queue.item().await;
    assert_eq!(by_child.name, "owner", "the child's label, kept for the mapping, queues its primary");
    queue.complete(&by_child, Outcome::Done).await;

    // Metadata alone has no data.owner to map by.
    let mut by_field = spec("views-bad", &ns, 1);
    by_field.related = vec![RelatedQuery {
        query: Some(ObjectQuery {
            resource: "configmaps".into(),
            namespace: ns.clone(),
            view: Some(ObjectView { metadata_only: true, ..Default::default() }),
            ..Default::default()
        }),
        maps_by: Some(related_query::MapsBy::Field("data.owner".into())),
        priority: 0,
    }];
    let status = open(&daemon, by_field).await.err().expect("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().starts_with("spec.related[0].query.view.metadata_only: "), "{status}");
    let mut bad_path = spec("views-bad", &ns, 1);
    bad_path.primary.as_mut().expect("primary").view = projected(&["data..x"]);
    let status = open(&daemon, bad_path).await.err().expect("refused");
    assert!(status.message().starts_with("spec.primary.view.fields[0]: "), "{status}");
}

#[tokio::test]
async fn bad_specs_and_completions_are_refused_naming_the_field() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).start().await;
    let refused = |s: QueueSpec| {
        let daemon = &daemon;
        async move { open(daemon, s).await.err().expect("refused") }
    };
    let status = refused(spec("bad", &ns, 0)).await;
    assert_eq!((status.code(), status.message().split(':').next()), (Code::InvalidArgument, Some("spec.max_leases")));
    let status = refused(spec("Not_A_Label", &ns, 1)).await;
    assert_eq!((status.code(), status.message().split(':').next()), (Code::InvalidArgument, Some("spec.name")));
    let mut unknown = spec("bad", &ns, 1);
    unknown.primary.as_mut().expect("primary").resource = "nosuchthings".into();
    let status = refused(unknown).await;
    assert!(status.message().starts_with("spec.primary: "), "{status}");
    assert_eq!(status.code(), Code::NotFound, "{status}");
    let mut selector = spec("bad", &ns, 1);
    selector.primary.as_mut().expect("primary").label_selector = "a in (".into();
    let status = refused(selector).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().starts_with("spec.primary: list configmaps (label_selector)"), "{status}");
    let mut unmapped = spec("bad", &ns, 1);
    unmapped.related = vec![RelatedQuery { query: unmapped.primary.clone(), maps_by: None, priority: 0 }];
    let status = refused(unmapped).await;
    assert!(status.message().starts_with("spec.related[0].maps_by: "), "{status}");
    let mut unnamed = spec("bad", &ns, 1);
    unnamed.primary.as_mut().expect("primary").changes = Some(ChangeFilter::default());
    let status = refused(unnamed).await;
    assert_eq!(
        (status.code(), status.message().split(':').next()),
        (Code::InvalidArgument, Some("spec.primary.changes"))
    );

    // In a running stream: a second spec, an unknown lease and an unset outcome are refused, and the
    // stream goes on.
    let mut queue = open(&daemon, spec("good", &ns, 1)).await.expect("open");
    queue.send(reconcile_request::Request::Spec(spec("good", &ns, 1))).await;
    let (code, message) = queue.refusal().await;
    assert_eq!((code, message.split(':').next()), (Code::FailedPrecondition, Some("spec")));
    let unknown = Completion { lease_id: "good.999.1".into(), outcome: Outcome::Done.into(), ..Default::default() };
    queue.send(reconcile_request::Request::Complete(unknown)).await;
    let (code, message) = queue.refusal().await;
    assert_eq!((code, message.split(':').next()), (Code::FailedPrecondition, Some("complete.lease_id")));
    let unset = Completion { lease_id: "good.1.1".into(), ..Default::default() };
    queue.send(reconcile_request::Request::Complete(unset)).await;
    let (code, message) = queue.refusal().await;
    assert_eq!((code, message.split(':').next()), (Code::InvalidArgument, Some("complete.outcome")));
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    api.create(&PostParams::default(), &configmap("late", json!({}))).await.expect("create");
    assert_eq!(queue.item().await.name, "late", "the stream still works");
}

/// A queue of Deployments that asks for generation changes only: a write of the status subresource (the
/// generation stays) and one of labels queue nothing; a change of the spec does. Nothing runs Deployments on
/// the test control plane, so only these writes move them.
#[tokio::test]
async fn a_queue_asking_for_generation_changes_passes_over_status_and_label_writes() {
    use k8s_openapi::api::apps::v1::Deployment;
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let deployments: Api<Deployment> = Api::namespaced(kube, &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "web", "image": "example.invalid/web:1" }] }
            }
        }
    }))
    .expect("deployment");
    deployments.create(&PostParams::default(), &deployment).await.expect("create the deployment");
    let daemon = Daemon::builder(BIN).start().await;
    let mut s = spec("generations", &ns, 1);
    s.primary = Some(ObjectQuery {
        resource: "deployments.apps".into(),
        namespace: ns.clone(),
        changes: Some(ChangeFilter { generation: true, ..Default::default() }),
        ..Default::default()
    });
    let mut q = open(&daemon, s).await.expect("queue opens");
    let first = q.item().await;
    q.complete(&first, Outcome::Done).await;

    let patch = |value: Value| Patch::Merge(value);
    let status = deployments
        .patch_status("web", &PatchParams::default(), &patch(json!({ "status": { "observedGeneration": 1 } })))
        .await
        .expect("write the status");
    let labelled = deployments
        .patch("web", &PatchParams::default(), &patch(json!({ "metadata": { "labels": { "seen": "yes" } } })))
        .await
        .expect("write a label");
    assert_eq!(status.metadata.generation, labelled.metadata.generation, "neither moved the generation");
    let nothing = q.item_within(Duration::from_secs(3)).await;
    assert!(nothing.is_none(), "a status or label write queued a pass: {nothing:?}");

    let scaled = deployments
        .patch("web", &PatchParams::default(), &patch(json!({ "spec": { "replicas": 2 } })))
        .await
        .expect("change the spec");
    let item = q.item().await;
    assert_eq!(
        item.object.as_ref().map(|o| o.resource_version.clone()),
        scaled.metadata.resource_version,
        "the spec's change is handed out"
    );
    q.complete(&item, Outcome::Done).await;
}
