//! Memory bounds: a daemon in a 128 MiB memory cgroup (the injector's default limit for the sidecar),
//! sent 200 messages of 1 MiB for a peer that is not up, answers RESOURCE_EXHAUSTED naming
//! outbox.maxPendingBytes once its outbox holds that many bytes, and is never OOM-killed, also after a
//! restart reloads everything it had accepted; asked to watch more than its memory holds, it refuses the
//! watch (or ends it as it grows) RESOURCE_EXHAUSTED naming watch.maxCacheBytes, while its election and its
//! other watches go on. Needs root (a cgroup of its own, removed afterwards).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use consistd_client::proto::{
    Destination, EventType, GetLeadershipRequest, GetOutboxStatusRequest, LeadershipState, ObjectQuery, ObserveRequest,
    QueueSpec, ReconcileRequest, ReconcileResponse, SendRequest, SubscribeRequest, destination::Target,
    reconcile_request, reconcile_response, reconcile_service_client::ReconcileServiceClient,
};
use consistd_testkit::{
    Daemon, free_port,
    watch::{Events, raw},
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use nix::sys::signal::Signal;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const LIMIT: &str = "134217728"; // 128 MiB
const MIB: usize = 1024 * 1024;

/// A memory cgroup of its own (v2 if the host has it, else v1's memory controller), removed when dropped.
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    fn new(limit: &str) -> Self {
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
        let name = format!("consistd-test-{:08x}", rand::random::<u32>());
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let parent = if v2 {
            let path = own.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup v2 path");
            PathBuf::from(format!("/sys/fs/cgroup{path}"))
        } else {
            let path = own
                .lines()
                .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
                .expect("a cgroup v1 memory controller");
            PathBuf::from(format!("/sys/fs/cgroup/memory{path}"))
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create cgroup {}: {e}", dir.display()));
        let cgroup = Self { dir, v2 };
        cgroup.write(if v2 { "memory.max" } else { "memory.limit_in_bytes" }, limit);
        cgroup
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("write {value} to {}: {e}", path.display()));
    }

    fn add(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    /// How many times the kernel's OOM killer killed a process of this cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = std::fs::read_to_string(self.dir.join(file)).expect("read the cgroup's OOM counts");
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    #[allow(clippy::disallowed_methods, reason = "Drop cannot await; it runs once the test's daemons are gone")]
    fn drop(&mut self) {
        // Its processes are gone once the daemons are reaped; a moment may pass before the kernel agrees.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A daemon whose store is `store`, moved into `cgroup` once it serves.
async fn daemon_in(cgroup: &MemoryCgroup, store: &Path) -> Daemon {
    let config =
        "identity: bounded\npeer:\n  insecure: true\noutbox:\n  backoff: {initial: 20ms, factor: 2, cap: 500ms}\n";
    let daemon = Daemon::builder(BIN).config(config).store_dir(store).start().await;
    cgroup.add(daemon.pid());
    daemon
}

fn mib_for(peer: &str, i: usize) -> SendRequest {
    SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(peer.to_owned())) }),
        resource_id: format!("r{i}"),
        event_id: "e".to_owned(),
        payload: vec![b'x'; MIB],
        content_type: "application/octet-stream".to_owned(),
        ..Default::default()
    }
}

fn alive(daemon: &Daemon) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(daemon.pid()).expect("pid")), None).is_ok()
}

#[tokio::test]
async fn a_daemon_in_128_mib_sent_200_messages_of_1_mib_refuses_at_the_byte_limit_and_is_never_oom_killed() {
    let cgroup = MemoryCgroup::new(LIMIT);
    let store = tempfile::tempdir().expect("store dir");
    let peer = format!("127.0.0.1:{}", free_port());
    let mut a = daemon_in(&cgroup, store.path()).await;
    let client = a.client();
    let mut accepted = 0;
    for i in 0..200 {
        match client.outbox().send(mib_for(&peer, i)).await {
            Ok(_) => {
                assert_eq!(accepted, i, "refused before, accepted after: message {i}");
                accepted += 1;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "message {i}: {status}; log:\n{}", a.logs());
                assert!(status.message().contains("outbox.maxPendingBytes"), "names the byte limit: {status}");
            }
        }
    }
    // 32 MiB by default: 32 messages of 1 MiB.
    assert_eq!(accepted, 32, "accepted up to outbox.maxPendingBytes");
    assert!(alive(&a), "the daemon lives; log:\n{}", a.logs());
    assert_eq!(cgroup.oom_kills(), 0, "never OOM-killed");

    // A restart reloads all it had accepted, and still refuses more.
    a.signal(Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(30)).await;
    let b = daemon_in(&cgroup, store.path()).await;
    let status = b.client().outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status").into_inner();
    assert_eq!(status.total_pending, 32, "every accepted message reloaded");
    let refused = b.client().outbox().send(mib_for(&peer, 200)).await.expect_err("still at the byte limit");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
    assert!(alive(&b), "the restarted daemon lives; log:\n{}", b.logs());
    assert_eq!(cgroup.oom_kills(), 0, "never OOM-killed");
}

/// How big each ConfigMap of the large watches is: 2,000 of them hold about 128 MiB, the cgroup's limit.
const OBJECT_BYTES: usize = 64 * 1024;

/// Creates `count` ConfigMaps of [`OBJECT_BYTES`] in `api`, the first `in_a` labelled part=a and the rest
/// part=b, 16 at a time.
async fn fill(api: &Api<ConfigMap>, count: usize, in_a: usize) {
    let value = "x".repeat(OBJECT_BYTES);
    futures::stream::iter(0..count)
        .for_each_concurrent(16, |i| {
            let (api, value) = (api.clone(), value.clone());
            async move {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": { "name": format!("big-{i}"), "labels": { "part": if i < in_a { "a" } else { "b" } } },
                    "data": { "v": value },
                }))
                .expect("configmap");
                api.create(&PostParams::default(), &cm).await.unwrap_or_else(|e| panic!("create big-{i}: {e}"));
            }
        })
        .await;
}

/// Reads `events` until its stream ends with a status, counting the objects it was sent; fails on an end
/// without one.
async fn until_refused(events: &mut Events) -> (tonic::Status, usize) {
    let mut objects = 0;
    loop {
        match events.next_result().await {
            Ok(Some(event)) => objects += usize::from(event.object.is_some()),
            Ok(None) => panic!("the watch ended without a status after {objects} objects"),
            Err(status) => return (status, objects),
        }
    }
}

#[tokio::test]
async fn a_daemon_in_128_mib_asked_to_watch_more_refuses_it_resource_exhausted_and_keeps_its_election() {
    let cgroup = MemoryCgroup::new(LIMIT);
    let kube = consistd_testkit::kube_client().await;
    let (ns, big_ns) = (consistd_testkit::namespace(&kube).await, consistd_testkit::namespace(&kube).await);
    let big: Api<ConfigMap> = Api::namespaced(kube.clone(), &big_ns);
    fill(&big, 2_000, 300).await;
    // The election on client-go's timings (15 s / 10 s / 2 s, the daemon's defaults), as a pod would run it:
    // with a 3 s renew deadline, two fresh-clone CI runs saw a renewal go unanswered for 3 s ("election step
    // timed out", then "renew deadline passed") while the apiserver served this test's 128 MiB of lists beside
    // the other integration lanes on 2 cores. An OOM kill or a daemon stalled past 10 s still fails the test.
    let config = format!("identity: bounded-watch\nnamespace: {ns}\nelections:\n- name: held\n");
    // Inside the cgroup from its start, so its budget follows the cgroup's limit.
    let daemon = Daemon::builder(BIN).config(config).cgroup(&cgroup.dir).start().await;
    let client = daemon.client();
    let mut observe = client
        .leadership()
        .observe(ObserveRequest { election: "held".into(), namespace: String::new() })
        .await
        .expect("observe")
        .into_inner();
    let term = loop {
        let status = tokio::time::timeout(Duration::from_secs(30), observe.message())
            .await
            .expect("leads within 30 s")
            .expect("observe stream")
            .expect("a state")
            .status
            .expect("status");
        if status.state() == LeadershipState::Leader {
            break status.term;
        }
    };
    let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("report");
    let budget = report.watch_budget.expect("the report shows the watch budget");
    assert_eq!(budget.limit_bytes, 32 * MIB as u64, "(128 MiB - the outbox's and inbox's 32 MiB each) / 2");

    // A small watch of another namespace, to show it goes on.
    let small: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    let mut others = Events::open(&client, raw("configmaps", &ns)).await;
    others.until_synced().await;

    // Part a fits: 300 objects of 64 KiB, about 19 MiB.
    let mut part_a =
        Events::open(&client, SubscribeRequest { label_selector: "part=a".into(), ..raw("configmaps", &big_ns) }).await;
    let listed = part_a.until_synced().await.iter().filter(|e| e.object.is_some()).count();
    assert_eq!(listed, 300, "the part that fits is served whole");

    // The whole namespace, about 128 MiB, is refused at its first list, naming the limit and what it needed.
    let mut whole = Events::open(&client, raw("configmaps", &big_ns)).await;
    let (refused, sent) = until_refused(&mut whole).await;
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}; log:\n{}", daemon.logs());
    assert!(refused.message().contains("watch.maxCacheBytes is 33554432 bytes"), "names the limit: {refused}");
    assert!(refused.message().contains("needed"), "names what it needed: {refused}");
    assert_eq!(sent, 0, "nothing of a list that does not fit is sent");

    // A reconcile queue over it (its own watch: another selector) is started, then ends the same way,
    // naming its query.
    let (tx, requests) = tokio::sync::mpsc::channel(4);
    let spec = QueueSpec {
        name: "too-big".into(),
        primary: Some(ObjectQuery {
            resource: "configmaps".into(),
            namespace: big_ns.clone(),
            label_selector: "part in (a,b)".into(),
            ..Default::default()
        }),
        max_leases: 1,
        ..Default::default()
    };
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).await.expect("queue the spec");
    let mut queue = ReconcileServiceClient::new(client.channel())
        .reconcile(tokio_stream::wrappers::ReceiverStream::new(requests))
        .await
        .expect("the queue starts")
        .into_inner();
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(60), queue.message()).await.expect("an answer within 60 s") {
            Ok(Some(ReconcileResponse { response: Some(reconcile_response::Response::Started(_)) })) => {}
            Ok(other) => panic!("expected STARTED then the end, got {other:?}"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended}");
    assert!(ended.message().starts_with("spec.primary: watch.maxCacheBytes"), "names the query: {ended}");
    drop(tx);

    // Part a grows past the budget: its watch ends for its subscriber, who is told why.
    let relabel = serde_json::json!({ "metadata": { "labels": { "part": "a" } } });
    let part_b = big.list(&ListParams::default().labels("part=b").limit(300)).await.expect("list part b");
    futures::stream::iter(part_b.items)
        .for_each_concurrent(16, |cm| {
            let (big, relabel) = (big.clone(), relabel.clone());
            async move {
                let name = cm.metadata.name.expect("name");
                // Once the watch has ended nothing more is asked of it; a patch failing is the test's own.
                big.patch(&name, &PatchParams::default(), &Patch::Merge(&relabel)).await.expect("relabel");
            }
        })
        .await;
    let (ended, _) = until_refused(&mut part_a).await;
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended}");
    assert!(ended.message().contains("watch.maxCacheBytes"), "{ended}");

    // Through all of it: the election held, in its term; the other watch delivers; nothing was OOM-killed.
    while let Ok(told) = tokio::time::timeout(Duration::from_millis(200), observe.message()).await {
        let status = told.expect("observe stream").expect("a state").status.expect("status");
        let election: Vec<String> = daemon
            .logs()
            .lines()
            .filter(|l| l.contains("election") || l.contains("Lease"))
            .map(str::to_owned)
            .collect();
        assert_eq!(
            (status.state(), status.term),
            (LeadershipState::Leader, term),
            "never anything but leading; the daemon's log of its election:\n{}",
            election.join("\n")
        );
    }
    let current = client
        .leadership()
        .get_leadership(GetLeadershipRequest { election: "held".into(), namespace: String::new() })
        .await
        .expect("get")
        .into_inner()
        .status
        .expect("status");
    assert_eq!((current.state(), current.term), (LeadershipState::Leader, term), "still leading in its term");
    small
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "after"}})).expect("cm"),
        )
        .await
        .expect("create");
    let event = others.next().await;
    assert_eq!((event.r#type(), event.object.map(|o| o.name)), (EventType::Added, Some("after".to_owned())));
    assert!(alive(&daemon), "the daemon lives; log:\n{}", daemon.logs());
    assert_eq!(cgroup.oom_kills(), 0, "never OOM-killed");
    let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("report");
    let status = consistd_core::report::render(&report);
    assert!(status.contains("of 32.0 MiB held (watch.maxCacheBytes), 3 ended or refused past it"), "{status}");
    let budget = report.watch_budget.expect("budget");
    assert_eq!(budget.exhausted, 3, "the refused watch, the queue's and the ended one: {budget:?}");
    assert!(budget.used_bytes <= budget.limit_bytes, "{budget:?}");
    let metrics = daemon.metrics().await;
    assert!(metrics.contains("consistd_watch_exhausted_total 3"), "{metrics}");
    assert!(metrics.contains("consistd_watch_budget_bytes 33554432"), "{metrics}");
}
