//! The conformance suite (README.md): the same tests for every SDK, each driving the SDK's agent against
//! real daemons and the real control plane. `CONSISTD_CONFORMANCE_AGENT` names the agent; unset, the
//! Rust SDK's.

use std::{path::Path, pin::pin, time::Duration};

use consistd_conformance::{Agent, AgentError, HoldProxy, Stream, WAIT};
use consistd_testkit::{Daemon, consistd_bin, free_port, kube_client, namespace, unix_proxy::UnixProxy};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

const RUST_AGENT: &str = env!("CARGO_BIN_EXE_consistd-conformance-rust");

/// The agent under test, on `socket`.
fn agent(socket: &Path) -> Agent {
    Agent::start(socket, RUST_AGENT)
}

/// A daemon that sends to peers (plaintext, fast resends), its state in `dir` when given.
async fn sender(dir: Option<&Path>) -> Daemon {
    let config =
        "identity: conformance-a\npeer:\n  insecure: true\noutbox:\n  backoff: {initial: 50ms, factor: 2, cap: 1s}\n";
    let builder = Daemon::builder(consistd_bin()).config(config);
    match dir {
        Some(dir) => builder.dir(dir).start().await,
        None => builder.start().await,
    }
}

/// A daemon that receives from peers, and its peer address.
async fn receiver() -> (Daemon, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = format!("identity: conformance-b\npeer:\n  listen: \"{addr}\"\n  insecure: true\n");
    (Daemon::builder(consistd_bin()).config(config).start().await, addr)
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or_else(|| panic!("{key} missing in {value}"))
}

/// Sets data.v of ConfigMap `name` (creating it first if `create`) as a writer other than the app, and
/// returns its resourceVersion.
async fn write(cms: &Api<ConfigMap>, name: &str, value: &str, create: bool) -> String {
    let cm = if create {
        let cm = serde_json::from_value(json!({ "metadata": { "name": name }, "data": { "v": value } })).expect("cm");
        cms.create(&PostParams::default(), &cm).await.expect("create")
    } else {
        cms.patch(name, &PatchParams::default(), &Patch::Merge(json!({ "data": { "v": value } }))).await.expect("patch")
    };
    cm.metadata.resource_version.expect("resourceVersion")
}

/// The next leadership state of `states` that says LEADER; its term.
async fn next_leader(states: &mut Stream) -> u64 {
    loop {
        let state = states.item().await;
        if text(&state, "state") == "LEADER" {
            return state["term"].as_u64().unwrap_or_else(|| panic!("no term in {state}"));
        }
    }
}

/// A watch event as (type, resourceVersion).
fn event(item: &Value) -> (String, String) {
    (text(item, "type").to_owned(), text(item, "resourceVersion").to_owned())
}

#[tokio::test]
async fn a_watch_resumes_after_a_lost_connection_and_delivers_each_change_once() {
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let a = sender(None).await;
    let proxy = UnixProxy::start(a.socket());
    let agent = agent(proxy.path());
    let created = write(&cms, "resumed", "0", true).await;

    let mut events = agent.stream("w");
    let fields = json!({ "stream": "w", "resource": "configmaps", "namespace": ns, "mode": "RAW", "take": true });
    agent.call("watch", fields).await.expect("watch");
    assert_eq!(event(&events.item().await), ("ADDED".into(), created));
    assert_eq!(event(&events.item().await).0, "SYNCED");

    let mut written = vec![write(&cms, "resumed", "1", false).await];
    assert_eq!(event(&events.item().await), ("MODIFIED".into(), written[0].clone()));
    // The app's connection is cut while the object keeps changing.
    proxy.cut();
    for v in 2..=4 {
        written.push(write(&cms, "resumed", &v.to_string(), false).await);
    }
    let mut seen = Vec::new();
    while seen.last() != written.last() {
        let (kind, rv) = event(&events.item().await);
        assert_eq!(kind, "MODIFIED", "after the reconnect: {seen:?} then {kind} {rv}");
        seen.push(rv);
    }
    assert_eq!(seen, written[1..], "each change once, in order");
    assert!(a.calls_started("Subscribe").await >= 2, "the watch subscribed again after the cut");
    let extra = events.next_within(Duration::from_millis(300)).await;
    assert!(extra.is_none(), "nothing after the last change: {extra:?}");
}

#[tokio::test]
async fn a_call_to_a_sidecar_that_is_gone_fails_unavailable() {
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube, &ns);
    write(&cms, "there", "0", true).await;
    let (_b, b_addr) = receiver().await;
    let mut a = sender(None).await;
    let agent = agent(a.socket());
    let get = json!({ "resource": "configmaps", "namespace": ns, "name": "there" });
    agent.call("get", get.clone()).await.expect("get while the sidecar runs");
    let send = json!({ "peer": b_addr, "resourceId": "r", "eventId": "1", "payload": "x" });
    agent.call("send", send.clone()).await.expect("send while the sidecar runs");

    a.signal(Signal::SIGKILL);
    a.wait_exit(WAIT).await;
    for (op, fields) in [("get", get), ("send", send)] {
        let Err(AgentError { code, message }) = agent.call(op, fields).await else {
            panic!("{op} succeeded with no sidecar");
        };
        assert_eq!(code, "UNAVAILABLE", "{op}: {message}");
    }
}

#[tokio::test]
async fn sends_share_one_ordered_stream_and_each_outcome_comes_through_a_timeout_and_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let (b, b_addr) = receiver().await;
    let mut a = sender(Some(dir.path())).await;
    let proxy = UnixProxy::start(a.socket());
    let agent = agent(proxy.path());
    let app_b = b.client();
    let mut deliveries = pin!(app_b.receive());
    let send = |resource: &str, event: &str| json!({ "peer": b_addr, "resourceId": resource, "eventId": event, "payload": format!("{resource}/{event}") });
    let id = |answer: Result<Value, AgentError>| text(&answer.expect("send"), "messageId").to_owned();
    let outcome = async |id: &str, timeout_ms: u64| {
        agent.call("outcome", json!({ "messageId": id, "timeoutMs": timeout_ms })).await
    };

    // Three sends, their outcomes ACKED by b's app.
    let mut ids = Vec::new();
    for r in ["r1", "r2", "r3"] {
        ids.push(id(agent.call("send", send(r, "1")).await));
    }
    for _ in 0..3 {
        let d = tokio::time::timeout(WAIT, deliveries.next()).await.expect("in time").expect("open").expect("delivery");
        d.ack().await.expect("ACK");
    }
    for id in &ids {
        let o = outcome(id, 0).await.expect("outcome");
        assert_eq!((text(&o, "outcome"), text(&o, "peer")), ("ACKED", b_addr.as_str()), "{o}");
    }
    assert_eq!(a.calls_started("SendStream").await, 1, "every send on one SendStream");
    assert_eq!(a.calls_started("Send").await, 0, "no unary Send");

    // An older event is superseded while b's app holds it un-ACKed.
    let older = id(agent.call("send", send("s", "1")).await);
    let held = tokio::time::timeout(WAIT, deliveries.next()).await.expect("in time").expect("open").expect("delivery");
    let newer = id(agent.call("send", send("s", "2")).await);
    assert_eq!(text(&outcome(&older, 0).await.expect("outcome"), "outcome"), "SUPERSEDED");

    // A short timeout ends one wait; a wait that then lasts through a kill -9 and restart of the sidecar
    // gets the ACK b's app gave meanwhile.
    let Err(cut) = outcome(&newer, 300).await else { panic!("no outcome can have come yet") };
    assert_eq!(cut.code, "DEADLINE_EXCEEDED", "{cut:?}");
    let waiting = agent.send("outcome", json!({ "messageId": newer, "timeoutMs": 0 })).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.signal(Signal::SIGKILL);
    a.wait_exit(WAIT).await;
    held.ack().await.expect("ACK of the superseded event");
    let second =
        tokio::time::timeout(WAIT, deliveries.next()).await.expect("in time").expect("open").expect("delivery");
    assert_eq!(second.message.event_id, "2");
    second.ack().await.expect("ACK");
    let mut a = sender(Some(dir.path())).await;
    let o =
        tokio::time::timeout(WAIT, waiting).await.expect("an outcome in time").expect("outcome through the restart");
    assert_eq!(text(&o, "outcome"), "ACKED", "{o}");

    // An outcome from before the sidecar's last start is NOT_FOUND.
    let settled = id(agent.call("send", send("t", "1")).await);
    let d = tokio::time::timeout(WAIT, deliveries.next()).await.expect("in time").expect("open").expect("delivery");
    d.ack().await.expect("ACK");
    let status = consistd_client::proto::GetOutboxStatusRequest {};
    while a.client().outbox().get_outbox_status(status).await.expect("status").into_inner().total_pending > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The store is the daemon's until it has exited: a successor refuses a socket whose lock is held.
    a.signal(Signal::SIGTERM);
    a.wait_exit(WAIT).await;
    let _a = sender(Some(dir.path())).await;
    let Err(gone) = outcome(&settled, 0).await else { panic!("an outcome from before the restart is not known") };
    assert_eq!(gone.code, "NOT_FOUND", "{gone:?}");
}

#[tokio::test]
async fn a_state_sent_before_the_apps_own_write_and_taken_after_it_is_dropped_or_marked() {
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let a = sender(None).await;
    let agent = agent(a.socket());
    let created = write(&cms, "mine", "0", true).await;
    let mut consistent = agent.stream("consistent");
    let mut raw = agent.stream("raw");
    for (stream, mode) in [("consistent", "CONSISTENT"), ("raw", "RAW")] {
        let fields =
            json!({ "stream": stream, "resource": "configmaps", "namespace": ns, "mode": mode, "take": false });
        agent.call("watch", fields).await.expect("watch");
        agent.call("take", json!({ "stream": stream, "count": 2 })).await.expect("take");
    }
    for events in [&mut consistent, &mut raw] {
        assert_eq!(event(&events.item().await), ("ADDED".into(), created.clone()));
        assert_eq!(event(&events.item().await).0, "SYNCED");
    }

    // Another writer changes the object; the daemon sends that state (nothing of the app's is in flight)
    // and it waits in the SDK, not taken, while the app writes.
    let theirs = write(&cms, "mine", "theirs", false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let patch =
        json!({ "resource": "configmaps", "namespace": ns, "name": "mine", "patch": { "data": { "v": "mine" } } });
    let mine = text(&agent.call("patch", patch).await.expect("patch"), "resourceVersion").to_owned();

    agent.call("take", json!({ "stream": "raw", "count": 2 })).await.expect("take");
    let (older, own) = (raw.item().await, raw.item().await);
    assert_eq!((event(&older), older["predatesOwnWrite"].as_bool()), (("MODIFIED".into(), theirs), Some(true)));
    assert_eq!((event(&own), own["predatesOwnWrite"].as_bool()), (("MODIFIED".into(), mine.clone()), Some(false)));
    agent.call("take", json!({ "stream": "consistent", "count": 1 })).await.expect("take");
    let taken = consistent.item().await;
    assert_eq!(event(&taken), ("MODIFIED".into(), mine), "the older state is dropped: {taken}");
}

#[tokio::test]
async fn leadership_says_unknown_at_once_when_the_connection_is_lost_then_leads_again() {
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let a = sender(None).await;
    let proxy = UnixProxy::start(a.socket());
    let agent = agent(proxy.path());
    let mut states = agent.stream("l");
    agent
        .call("campaign", json!({ "stream": "l", "election": "conformance", "namespace": ns }))
        .await
        .expect("campaign");
    let term = next_leader(&mut states).await;
    assert!(term >= 1, "term {term}");

    proxy.cut();
    let lost = states.next_within(Duration::from_secs(2)).await.expect("a state within 2 s of the cut");
    assert_eq!(text(&lost.expect("the stream goes on"), "state"), "UNKNOWN", "UNKNOWN comes first");
    let again = next_leader(&mut states).await;
    assert!(again >= term, "led again in term {again}, before in {term}");
}

#[tokio::test]
async fn a_reconciler_is_handed_each_key_in_its_term_its_writes_are_fenced_and_a_lost_term_ends_them() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    write(&cms, "work", "0", true).await;
    let a = sender(None).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while !a.logs().contains("guarded writes are fenced at the apiserver") {
        assert!(tokio::time::Instant::now() < deadline, "not fenced at the apiserver:\n{}", a.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let agent = agent(a.socket());
    let mut states = agent.stream("l");
    agent
        .call("campaign", json!({ "stream": "l", "election": "conformance", "namespace": ns }))
        .await
        .expect("campaign");
    let term = next_leader(&mut states).await;
    let mut items = agent.stream("q");
    let queue = json!({ "stream": "q", "queue": "conformance", "resource": "configmaps", "namespace": ns,
        "election": "conformance", "electionNamespace": ns });
    agent.call("reconcile", queue).await.expect("reconcile");

    // Handed out in the term it leads; the item's write is fenced at the apiserver, whatever guard the SDK
    // added: it stamped the object with the election and the term.
    let item = items.item().await;
    assert_eq!((text(&item, "name"), item["term"].as_u64()), ("work", Some(term)), "{item}");
    let handle =
        |patch: Value, outcome: &str| json!({ "stream": "q", "name": "work", "patch": patch, "outcome": outcome });
    let written =
        agent.call("handle", handle(json!({ "data": { "v": "agent" } }), "DONE")).await.expect("the item's write");
    let cm = cms.get("work").await.expect("read");
    let stamp = cm.metadata.annotations.unwrap_or_default().remove("consistd.io/fence");
    assert_eq!(stamp, Some(format!("{ns}/conformance/{term}")), "the write stamped the object with its claim");
    assert_eq!(cm.metadata.resource_version.as_deref(), Some(text(&written, "resourceVersion")));
    assert_eq!(cm.data.unwrap_or_default().remove("v").as_deref(), Some("agent"));
    // Whatever passes that write queued end without writing.
    while let Some(line) = items.next_within(Duration::from_secs(2)).await {
        assert_eq!(text(&line.expect("an item"), "name"), "work");
        agent.call("handle", handle(Value::Null, "DONE")).await.expect("a pass without a write");
    }

    // Another writer changes the primary: the key is handed out again, in the same term.
    write(&cms, "work", "theirs", false).await;
    let again = items.item().await;
    assert_eq!((text(&again, "name"), again["term"].as_u64()), ("work", Some(term)), "{again}");

    // The Lease moves to another holder in a later term while that lease is out: its write is refused.
    let leases: Api<Lease> = Api::namespaced(kube, &ns);
    let transitions = leases.get("conformance").await.expect("the Lease").spec.and_then(|s| s.lease_transitions);
    let usurped = LeaseSpec {
        holder_identity: Some("usurper".into()),
        lease_transitions: Some(transitions.unwrap_or(0) + 1),
        lease_duration_seconds: Some(3600),
        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        acquire_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        ..LeaseSpec::default()
    };
    let patch = Patch::Merge(json!({ "spec": usurped }));
    leases.patch("conformance", &PatchParams::default(), &patch).await.expect("another holder takes the Lease");
    let mut state = states.item().await;
    while text(&state, "state") == "LEADER" {
        state = states.item().await;
    }
    let late = agent.call("handle", handle(json!({ "data": { "v": "late" } }), "DONE")).await;
    let refused = late.expect_err("a write for a lease of a term that is over");
    assert_eq!(refused.code, "FAILED_PRECONDITION", "{refused:?}");
    let cm = cms.get("work").await.expect("read");
    assert_eq!(cm.data.unwrap_or_default().remove("v").as_deref(), Some("theirs"), "nothing was written");
}

#[tokio::test]
async fn a_guarded_send_goes_only_in_its_term_and_carries_its_claim() {
    use consistd_client::proto::{ReceiveRequest, WriteGuard};

    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let a = sender(None).await;
    let (b, b_addr) = receiver().await;
    let agent = agent(a.socket());
    let mut states = agent.stream("l");
    agent.call("campaign", json!({ "stream": "l", "election": "guarded", "namespace": ns })).await.expect("campaign");
    let term = next_leader(&mut states).await;
    let send = |event: &str, term: u64| {
        json!({ "peer": b_addr, "resourceId": "r", "eventId": event, "payload": event,
                "guard": { "election": "guarded", "namespace": ns, "term": term } })
    };

    agent.call("send", send("in-term", term)).await.expect("a send guarded by the agent's term");
    let mut inbox = b.client().inbox().receive(ReceiveRequest {}).await.expect("Receive").into_inner();
    let received = tokio::time::timeout(WAIT, inbox.message()).await.expect("the message in time");
    let message = received.expect("stream").and_then(|r| r.message).expect("a message");
    assert_eq!(message.event_id, "in-term");
    let sent_under = WriteGuard { election: "guarded".into(), namespace: ns.clone(), term };
    assert_eq!(message.guard, Some(sent_under), "the claim rode along to the receiver");

    let refused = agent.call("send", send("not-held", term + 1)).await.expect_err("a term the agent does not lead");
    assert_eq!(refused.code, "FAILED_PRECONDITION", "{refused:?}");
    assert!(refused.message.starts_with("guard: "), "{refused:?}");
}

/// Deletes ConfigMap `name` as a writer other than the app.
async fn delete(cms: &Api<ConfigMap>, name: &str) {
    cms.delete(name, &kube::api::DeleteParams::default()).await.expect("delete");
}

/// Changes another object, `probe`, and has a worker of its own take it from newest-state stream `stream`: once
/// it is handed out, the agent's SDK has read every state written before it. `probes` counts the probes so far.
async fn probe(agent: &Agent, cms: &Api<ConfigMap>, stream: &str, probes: &mut usize) {
    let rv = write(cms, "probe", &probes.to_string(), *probes == 0).await;
    *probes += 1;
    let worker = json!({ "stream": stream, "worker": "probe" });
    let item = agent.call("next", worker.clone()).await.expect("next");
    let probe = ("probe", rv.as_str());
    assert_eq!((text(&item, "name"), text(&item, "resourceVersion")), probe, "handed out instead of the probe: {item}");
    agent.call("done", worker).await.expect("done");
}

#[tokio::test]
async fn a_worker_on_the_newest_state_is_handed_no_state_older_than_its_own_write_and_no_object_another_holds() {
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let a = sender(None).await;
    let proxy = HoldProxy::start(a.socket());
    let agent = agent(proxy.path());
    let created = write(&cms, "slow", "0", true).await;
    let latest = json!({ "stream": "l", "resource": "configmaps", "namespace": ns });
    agent.call("latest", latest).await.expect("latest");
    let worker = |name: &str| json!({ "stream": "l", "worker": name });
    let next = async |name: &str| agent.call("next", worker(name)).await.expect("next");
    let done = async |name: &str| agent.call("done", worker(name)).await.expect("done");
    let mut probes = 0;
    let mut probed = async || probe(&agent, &cms, "l", &mut probes).await;

    // w1 is handed `slow`; another writer changes it twice while w1 works on it.
    assert_eq!(event(&next("w1").await), ("ADDED".into(), created));
    write(&cms, "slow", "1", false).await;
    let theirs = write(&cms, "slow", "2", false).await;
    probed().await;
    // w2 asks meanwhile: `slow` is w1's until w1 is done.
    let mut w2 = pin!(agent.send("next", worker("w2")).await);
    let early = tokio::time::timeout(Duration::from_millis(500), &mut w2).await;
    assert!(early.is_err(), "w2 was handed the object w1 holds: {early:?}");

    // w1 writes, and is done, while what the sidecar sends on the watch is held back (a watch event still on
    // its way when the write returns): the state waiting for `slow` is older than w1's write.
    proxy.hold();
    let patch =
        json!({ "resource": "configmaps", "namespace": ns, "name": "slow", "patch": { "data": { "v": "mine" } } });
    let mine = text(&agent.call("patch", patch).await.expect("w1's write"), "resourceVersion").to_owned();
    done("w1").await;
    let stale = tokio::time::timeout(Duration::from_secs(1), &mut w2).await;
    assert!(
        stale.is_err(),
        "w2 was handed a state older than the write w1 made (theirs {theirs}, mine {mine}): {stale:?}"
    );
    // The write's own state comes once the watch goes on.
    proxy.release();
    let handed = tokio::time::timeout(WAIT, w2).await.expect("w2 is handed a state in time").expect("next");
    assert_eq!(event(&handed), ("MODIFIED".into(), mine), "{handed}");

    // Two more changes while w2 works: only the newest is handed out after it.
    write(&cms, "slow", "3", false).await;
    let newest = write(&cms, "slow", "4", false).await;
    probed().await;
    done("w2").await;
    assert_eq!(event(&next("w3").await), ("MODIFIED".into(), newest));

    // A change, then the deletion, while w3 works: the deletion is handed out.
    write(&cms, "slow", "5", false).await;
    delete(&cms, "slow").await;
    probed().await;
    done("w3").await;
    let deleted = next("w4").await;
    assert_eq!((text(&deleted, "type"), text(&deleted, "name")), ("DELETED", "slow"), "{deleted}");
    done("w4").await;
    let extra = tokio::time::timeout(Duration::from_millis(500), agent.call("next", worker("w5"))).await;
    assert!(extra.is_err(), "nothing more to hand out: {extra:?}");
}

#[tokio::test]
async fn a_worker_on_the_newest_state_is_not_handed_back_its_own_write_but_is_handed_anyone_elses_change() {
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let a = sender(None).await;
    let agent = agent(a.socket());
    let created = write(&cms, "own", "0", true).await;
    agent.call("latest", json!({ "stream": "l", "resource": "configmaps", "namespace": ns })).await.expect("latest");
    let worker = |name: &str| json!({ "stream": "l", "worker": name });
    let next = async |name: &str| agent.call("next", worker(name)).await.expect("next");
    let done = async |name: &str| agent.call("done", worker(name)).await.expect("done");
    // The app's write of data.v, through the SDK: its resourceVersion.
    let own_write = async |value: &str| {
        let patch =
            json!({ "resource": "configmaps", "namespace": ns, "name": "own", "patch": { "data": { "v": value } } });
        text(&agent.call("patch", patch).await.expect("the app's write"), "resourceVersion").to_owned()
    };
    let mut probes = 0;
    let mut probed = async || probe(&agent, &cms, "l", &mut probes).await;

    // w1 writes on the state it was handed, nothing else in between: that state is not handed back.
    assert_eq!(event(&next("w1").await), ("ADDED".into(), created));
    let mine = own_write("mine").await;
    done("w1").await;
    probed().await;
    let mut w2 = pin!(agent.send("next", worker("w2")).await);
    let early = tokio::time::timeout(Duration::from_secs(1), &mut w2).await;
    assert!(early.is_err(), "a worker was handed back the state {mine} its own write made: {early:?}");

    // Anyone else's change after it is handed out.
    let theirs = write(&cms, "own", "theirs", false).await;
    let handed = tokio::time::timeout(WAIT, w2).await.expect("w2 is handed a state in time").expect("next");
    assert_eq!(event(&handed), ("MODIFIED".into(), theirs), "{handed}");

    // While w2 works, another writer changes the object and then the app writes on that change: the app's
    // state holds a change no worker saw, so it is handed out after w2.
    write(&cms, "own", "again", false).await;
    probed().await;
    let on_again = own_write("mine-2").await;
    probed().await;
    done("w2").await;
    assert_eq!(event(&next("w3").await), ("MODIFIED".into(), on_again), "the app wrote on a state no worker had");

    // w3 writes on it: again nothing comes back.
    let mine = own_write("mine-3").await;
    done("w3").await;
    probed().await;
    let extra = tokio::time::timeout(Duration::from_secs(1), agent.call("next", worker("w4"))).await;
    assert!(extra.is_err(), "a worker was handed back the state {mine} its own write made: {extra:?}");
}

#[tokio::test]
async fn a_queue_with_a_change_filter_hands_out_only_the_changes_it_names() {
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let a = sender(None).await;
    let agent = agent(a.socket());
    write(&cms, "filtered", "0", true).await;
    let mut items = agent.stream("q");
    let queue = json!({ "stream": "q", "queue": "filtered", "resource": "configmaps", "namespace": ns,
        "changes": { "labels": true } });
    agent.call("reconcile", queue).await.expect("reconcile");
    let done = json!({ "stream": "q", "name": "filtered", "patch": null, "outcome": "DONE" });
    let first = items.item().await;
    assert_eq!(text(&first, "name"), "filtered", "an object's first state is handed out: {first}");
    agent.call("handle", done.clone()).await.expect("handled");

    // A change of the data, which the filter does not name: nothing.
    write(&cms, "filtered", "1", false).await;
    let nothing = items.next_within(Duration::from_secs(2)).await;
    assert!(nothing.is_none(), "a change of nothing the filter names was handed out: {nothing:?}");
    // A change of a label: handed out.
    let labelled = json!({ "metadata": { "labels": { "tier": "web" } } });
    cms.patch("filtered", &PatchParams::default(), &Patch::Merge(labelled)).await.expect("label");
    let again = items.item().await;
    assert_eq!(text(&again, "name"), "filtered", "{again}");
    agent.call("handle", done).await.expect("handled");
}

#[tokio::test]
async fn a_queue_with_a_finalizer_holds_each_object_until_its_finalize_pass_is_done() {
    const FINALIZER: &str = "conformance.consistd.io/cleanup";
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube, &ns);
    let a = sender(None).await;
    let agent = agent(a.socket());
    write(&cms, "held", "0", true).await;
    let mut items = agent.stream("q");
    let queue = json!({ "stream": "q", "queue": "finalized", "resource": "configmaps", "namespace": ns,
        "finalizer": FINALIZER });
    agent.call("reconcile", queue).await.expect("reconcile");
    let handle = |outcome: &str| json!({ "stream": "q", "name": "held", "patch": null, "outcome": outcome });
    let finalizers = |cm: &ConfigMap| cm.metadata.finalizers.clone().unwrap_or_default();

    // The first pass is handed out only once the object carries the finalizer.
    let first = items.item().await;
    assert_eq!((text(&first, "name"), first["finalizing"].as_bool()), ("held", Some(false)), "{first}");
    let cm = cms.get("held").await.expect("read");
    assert_eq!(finalizers(&cm), [FINALIZER], "the finalizer was added before the first pass");
    agent.call("handle", handle("DONE")).await.expect("handled");

    // Deleted, the object stays: it is handed out as a finalize pass. RETRY keeps the finalizer, and the
    // finalize pass comes again.
    cms.delete("held", &DeleteParams::default()).await.expect("delete");
    let finalize = items.item().await;
    assert_eq!((text(&finalize, "name"), finalize["finalizing"].as_bool()), ("held", Some(true)), "{finalize}");
    agent.call("handle", handle("RETRY")).await.expect("handled");
    let again = items.item().await;
    assert_eq!((again["finalizing"].as_bool(), again["attempt"].as_u64()), (Some(true), Some(2)), "{again}");
    let cm = cms.get("held").await.expect("a RETRY of the finalize pass keeps the object");
    assert!(cm.metadata.deletion_timestamp.is_some(), "{cm:?}");
    assert_eq!(finalizers(&cm), [FINALIZER], "a RETRY keeps the finalizer");

    // DONE removes it: the object goes, and nothing more is handed out for it.
    agent.call("handle", handle("DONE")).await.expect("handled");
    let deadline = tokio::time::Instant::now() + WAIT;
    while cms.get_opt("held").await.expect("read").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the finalizer was not removed after the finalize pass");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = items.next_within(Duration::from_secs(2)).await;
    assert!(after.is_none(), "a key was handed out again after its finalize pass removed the finalizer: {after:?}");
}

#[tokio::test]
async fn a_status_condition_set_on_an_item_moves_its_transition_time_only_when_its_status_changes() {
    use kube::api::DynamicObject;

    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let (resource, ar) = consistd_testkit::crd::widgets(&kube, &ns).await;
    let widgets: Api<DynamicObject> = Api::namespaced_with(kube, &ns, &ar);
    let widget = json!({ "apiVersion": ar.api_version, "kind": "Widget", "metadata": { "name": "w" },
        "spec": { "size": 1 } });
    let widget: DynamicObject = serde_json::from_value(widget).expect("widget");
    widgets.create(&PostParams::default(), &widget).await.expect("create the widget");
    let a = sender(None).await;
    let agent = agent(a.socket());
    let mut items = agent.stream("q");
    let queue = json!({ "stream": "q", "queue": "conditions", "resource": resource, "namespace": ns });
    agent.call("reconcile", queue).await.expect("reconcile");
    // Each pass sets a condition through the SDK's helper and ends DONE; the answer says whether it wrote.
    let mut pass = async |status: &str, reason: &str| {
        let item = items.item().await;
        assert_eq!(text(&item, "name"), "w", "{item}");
        let condition = json!({ "type": "Ready", "status": status, "reason": reason, "message": "m" });
        let handle = json!({ "stream": "q", "name": "w", "patch": null, "outcome": "DONE", "condition": condition });
        let answer = agent.call("handle", handle).await.expect("handled");
        let set = &answer["condition"];
        (
            set["changed"].as_bool().unwrap_or_else(|| panic!("no changed in {answer}")),
            text(set, "lastTransitionTime").to_owned(),
        )
    };
    let ready = async || {
        let stored = serde_json::to_value(widgets.get("w").await.expect("read")).expect("json");
        let conditions = stored.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let [ready] = conditions.as_slice() else { panic!("one condition: {stored}") };
        (text(ready, "status").to_owned(), text(ready, "reason").to_owned(), ready["observedGeneration"].as_i64())
    };

    // The first pass sets it, with the generation the item was handed.
    let (changed, created) = pass("False", "Creating").await;
    assert!(changed, "a new condition is written");
    assert_eq!(ready().await, ("False".into(), "Creating".into(), Some(1)));

    // The spec moves the generation: the same condition is written again for it, its transition time kept.
    let spec = Patch::Merge(json!({ "spec": { "size": 2 } }));
    widgets.patch("w", &PatchParams::default(), &spec).await.expect("the spec");
    assert_eq!(pass("False", "Creating").await, (true, created.clone()), "a new generation, the same status");
    assert_eq!(ready().await, ("False".into(), "Creating".into(), Some(2)));

    // A label moves nothing the condition says: nothing is written.
    let label = |v: &str| Patch::Merge(json!({ "metadata": { "labels": { "pass": v } } }));
    widgets.patch("w", &PatchParams::default(), &label("3")).await.expect("a label");
    assert_eq!(pass("False", "Creating").await, (false, created.clone()), "nothing changed");

    // A new status, a second later (the apiserver keeps seconds): the transition time moves.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    widgets.patch("w", &PatchParams::default(), &label("4")).await.expect("a label");
    let (changed, up) = pass("True", "Available").await;
    assert!(changed && up != created, "the status changed at {up}, first set at {created}");
    assert_eq!(ready().await, ("True".into(), "Available".into(), Some(2)));
    // The condition writes were the items' own: they queued no pass.
    let extra = items.next_within(Duration::from_secs(2)).await;
    assert!(extra.is_none(), "a condition write queued a pass: {extra:?}");
}

#[tokio::test]
async fn an_event_recorded_on_an_item_names_its_object_and_a_repeat_joins_its_series() {
    use k8s_openapi::api::events::v1::Event;

    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let cms: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    write(&cms, "evented", "0", true).await;
    let a = sender(None).await;
    let agent = agent(a.socket());
    let mut items = agent.stream("q");
    let queue = json!({ "stream": "q", "queue": "eventful", "resource": "configmaps", "namespace": ns });
    agent.call("reconcile", queue).await.expect("reconcile");
    let event = json!({ "severity": "Warning", "reason": "Drifted", "action": "Reconcile", "note": "data moved" });
    let handle = json!({ "stream": "q", "name": "evented", "patch": null, "outcome": "DONE", "event": event });
    let events: Api<Event> = Api::namespaced(kube, &ns);

    // The first pass records it: an Event about the object, reported by the queue.
    items.item().await;
    let answer = agent.call("handle", handle.clone()).await.expect("handled");
    assert_eq!(answer["event"]["recorded"].as_bool(), Some(true), "{answer}");
    let cm = cms.get("evented").await.expect("read");
    let [recorded] = events.list(&Default::default()).await.expect("list").items.try_into().expect("one Event");
    let regarding = recorded.regarding.clone().expect("regarding");
    assert_eq!((regarding.name.as_deref(), regarding.uid.as_deref()), (Some("evented"), cm.metadata.uid.as_deref()));
    assert_eq!((recorded.type_.as_deref(), recorded.reason.as_deref()), (Some("Warning"), Some("Drifted")));
    assert_eq!((recorded.action.as_deref(), recorded.note.as_deref()), (Some("Reconcile"), Some("data moved")));
    assert_eq!(recorded.reporting_controller.as_deref(), Some("eventful"), "the queue's name");

    // The next pass records it again: the same Event, its series counting two.
    write(&cms, "evented", "1", false).await;
    items.item().await;
    agent.call("handle", handle).await.expect("handled");
    let [again] = events.list(&Default::default()).await.expect("list").items.try_into().expect("still one Event");
    assert_eq!(again.series.map(|s| s.count), Some(2));
}

#[tokio::test]
async fn the_error_that_ends_a_newest_state_watch_reaches_the_worker() {
    let a = sender(None).await;
    let agent = agent(a.socket());
    let latest = json!({ "stream": "l", "resource": "nosuchthings", "namespace": "default" });
    agent.call("latest", latest).await.expect("latest");
    let Err(refused) = agent.call("next", json!({ "stream": "l", "worker": "w" })).await else {
        panic!("a worker was handed a state of a resource that does not exist");
    };
    assert_eq!(refused.code, "NOT_FOUND", "{refused:?}");
}
