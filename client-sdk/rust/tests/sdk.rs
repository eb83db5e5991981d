//! The Rust SDK against real daemons and the real control plane: reconnecting watches, writes that would
//! change nothing answered unchanged, leadership streams, sends with awaitable ACKs and the inbox handler.

use std::{pin::pin, time::Duration};

use consistd_client::{
    Client, Error, Event, Leadership, Watch,
    proto::{
        CampaignRequest, Consistency, CreateRequest, DeliveryMode, EventType, GetOutboxStatusRequest, GetRequest,
        LeadershipState, PatchRequest, PatchType, SendRequest, UpdateRequest,
    },
    to_peer,
};
use consistd_testkit::{Daemon, consistd_bin, free_port, kube_client, namespace, unix_proxy::UnixProxy};
use futures::{Stream, StreamExt as _};
use nix::sys::signal::Signal;

const WAIT: Duration = Duration::from_secs(20);

/// The next item of a stream, failing the test after [`WAIT`].
async fn next<T>(stream: &mut (impl Stream<Item = Result<T, Error>> + Unpin)) -> T {
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(Ok(item))) => item,
        Ok(Some(Err(e))) => panic!("stream failed: {e}"),
        Ok(None) => panic!("stream ended"),
        Err(_) => panic!("nothing within {WAIT:?}"),
    }
}

/// `TYPE name` of an event.
fn describe(e: &Event) -> String {
    let kind = e.kind.as_str_name().trim_start_matches("EVENT_TYPE_");
    e.object.as_ref().map_or_else(|| kind.to_owned(), |o| format!("{kind} {}", o.name))
}

async fn create_configmap(client: &Client, ns: &str, name: &str) {
    let object = serde_json::json!({ "metadata": { "name": name }, "data": { "v": "0" } });
    let request = CreateRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        object: object.to_string().into_bytes(),
        ..Default::default()
    };
    client.objects().create(request).await.unwrap_or_else(|e| panic!("create {ns}/{name}: {e}"));
}

/// Merge-patches `data.v` of a ConfigMap through the daemon; returns the new resourceVersion.
async fn set_value(client: &Client, ns: &str, name: &str, value: &str) -> String {
    let request = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        name: name.into(),
        patch_type: PatchType::Merge.into(),
        patch: serde_json::json!({ "data": { "v": value } }).to_string().into_bytes(),
        ..Default::default()
    };
    let response = client.objects().patch(request).await.unwrap_or_else(|e| panic!("patch {ns}/{name}: {e}"));
    response.into_inner().object.map(|o| o.resource_version).unwrap_or_default()
}

async fn daemon(identity: &str) -> Daemon {
    Daemon::builder(consistd_bin()).config(format!("identity: {identity}")).start().await
}

#[tokio::test]
async fn a_consistent_watch_delivers_the_snapshot_then_this_pods_own_write() {
    let d = daemon("sdk-rust-watch").await;
    let ns = namespace(&kube_client().await).await;
    let client = d.client();
    create_configmap(&client, &ns, "cfg").await;

    let mut events = pin!(client.subscribe(Watch::new("configmaps").namespace(&ns)));
    assert_eq!(describe(&next(&mut events).await), "ADDED cfg");
    assert_eq!(describe(&next(&mut events).await), "SYNCED");

    let rv = set_value(&client, &ns, "cfg", "1").await;
    let own = next(&mut events).await;
    assert_eq!(describe(&own), "MODIFIED cfg");
    assert_eq!(own.consistency, Consistency::OwnWrite);
    assert_eq!(own.object.as_ref().map(|o| o.resource_version.clone()), Some(rv));
    let json = own.json().expect("an object").expect("valid JSON");
    assert_eq!(json["data"]["v"], "1");
}

/// The SDK passes the protocol's requests and answers through: `send_unchanged` as the app set it, `unchanged` as
/// the daemon answered. With a synced watch of the namespace open (the daemon answers a no-op write from a watch's
/// cache only), a merge patch and an update that change nothing come back unchanged, the cached object, which the
/// own-write record takes without holding anything back; with `send_unchanged` the apiserver answers; a patch that
/// changes something is never unchanged, and its state reaches the watch as the pod's own write.
#[tokio::test]
async fn a_write_that_would_change_nothing_comes_back_unchanged_unless_sent_anyway() {
    let d = daemon("sdk-rust-unchanged").await;
    let ns = namespace(&kube_client().await).await;
    let client = d.client();
    create_configmap(&client, &ns, "cfg").await;
    let mut events = pin!(client.subscribe(Watch::new("configmaps").namespace(&ns)));
    while next(&mut events).await.kind != EventType::Synced {}
    let created = client
        .objects()
        .get(GetRequest {
            resource: "configmaps".into(),
            namespace: ns.clone(),
            name: "cfg".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner()
        .object
        .expect("the object");
    let patch = |send_unchanged: bool| PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        name: "cfg".into(),
        patch_type: PatchType::Merge.into(),
        patch: serde_json::json!({ "data": { "v": "0" } }).to_string().into_bytes(),
        send_unchanged,
        ..Default::default()
    };
    let update = |send_unchanged: bool| UpdateRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        name: "cfg".into(),
        object: created.json.to_vec(),
        send_unchanged,
        ..Default::default()
    };

    let patched = client.objects().patch(patch(false)).await.expect("a no-op patch").into_inner();
    assert!(patched.unchanged, "a merge patch that changes nothing is answered from the cache");
    let cached = patched.object.expect("the cached object");
    assert_eq!(cached.resource_version, created.resource_version);
    let updated = client.objects().update(update(false)).await.expect("a no-op update").into_inner();
    assert!(updated.unchanged, "the object as read, written back, changes nothing");
    assert!(!client.predates_own_write(&updated.object.expect("the cached object")), "recorded at its own version");

    let sent = client.objects().patch(patch(true)).await.expect("a patch sent anyway").into_inner();
    assert!(!sent.unchanged, "send_unchanged: the apiserver answered the patch");
    let sent = client.objects().update(update(true)).await.expect("an update sent anyway").into_inner();
    assert!(!sent.unchanged, "send_unchanged: the apiserver answered the update");

    let rv = set_value(&client, &ns, "cfg", "1").await;
    assert!(rv.parse::<u64>().expect("an integer") > created.resource_version.parse().expect("an integer"));
    let own = loop {
        let event = next(&mut events).await;
        if event.object.as_ref().is_some_and(|o| o.resource_version == rv) {
            break event;
        }
    };
    assert_eq!((describe(&own), own.consistency), ("MODIFIED cfg".to_owned(), Consistency::OwnWrite));
}

#[tokio::test]
async fn a_watch_resumes_after_a_lost_connection_without_a_resync_or_a_repeat() {
    let d = daemon("sdk-rust-resume").await;
    let ns = namespace(&kube_client().await).await;
    let direct = d.client();
    create_configmap(&direct, &ns, "cfg").await;
    let proxy = UnixProxy::start(d.socket());
    let through_proxy = Client::new(proxy.path());

    let watch = Watch::new("configmaps").namespace(&ns).mode(DeliveryMode::Raw);
    let mut events = pin!(through_proxy.subscribe(watch));
    assert_eq!(describe(&next(&mut events).await), "ADDED cfg");
    assert_eq!(describe(&next(&mut events).await), "SYNCED");
    set_value(&direct, &ns, "cfg", "1").await;
    assert_eq!(describe(&next(&mut events).await), "MODIFIED cfg");

    proxy.cut();
    // Changes made while the app is cut off arrive after the reconnect, each once, in order.
    let mut written = Vec::new();
    for v in 2..=4 {
        written.push(set_value(&direct, &ns, "cfg", &v.to_string()).await);
    }
    let mut seen = Vec::new();
    while seen.len() < written.len() {
        let e = next(&mut events).await;
        assert_eq!(e.kind, EventType::Modified, "after the cut: {}", describe(&e));
        seen.push(e.object.map(|o| o.resource_version).unwrap_or_default());
    }
    assert_eq!(seen, written);
}

#[tokio::test]
async fn a_watch_surfaces_resync_required_when_the_daemon_restarts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let start = || Daemon::builder(consistd_bin()).dir(dir.path()).config("identity: sdk-rust-restart").start();
    let mut d = start().await;
    let ns = namespace(&kube_client().await).await;
    create_configmap(&d.client(), &ns, "cfg").await;

    let client = Client::new(d.socket());
    let mut events = pin!(client.subscribe(Watch::new("configmaps").namespace(&ns)));
    assert_eq!(describe(&next(&mut events).await), "ADDED cfg");
    assert_eq!(describe(&next(&mut events).await), "SYNCED");

    d.signal(Signal::SIGTERM);
    d.wait_exit(WAIT).await;
    let d = start().await;
    create_configmap(&d.client(), &ns, "later").await;
    // The new daemon cannot resume the old cursor: the app is told, then gets the current state.
    assert_eq!(describe(&next(&mut events).await), "RESYNC_REQUIRED");
    let mut snapshot = vec![describe(&next(&mut events).await), describe(&next(&mut events).await)];
    snapshot.sort();
    assert_eq!(snapshot, ["ADDED cfg", "ADDED later"]);
    assert_eq!(describe(&next(&mut events).await), "SYNCED");
}

#[tokio::test]
async fn a_list_answer_larger_than_4_mib_arrives_whole() {
    let d = daemon("sdk-rust-big-list").await;
    let ns = namespace(&kube_client().await).await;
    let client = d.client();
    let big = "x".repeat(900 * 1024);
    for i in 0..6 {
        let object = serde_json::json!({ "metadata": { "name": format!("big-{i}") }, "data": { "v": big } });
        let request = CreateRequest {
            resource: "configmaps".into(),
            namespace: ns.clone(),
            object: object.to_string().into_bytes(),
            ..Default::default()
        };
        client.objects().create(request).await.unwrap_or_else(|e| panic!("create big-{i}: {e}"));
    }
    let request = consistd_client::proto::ListRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        ..Default::default()
    };
    let listed = client.objects().list(request).await.expect("a List over 4 MiB").into_inner();
    let bytes: usize = listed.objects.iter().map(|o| o.json.len()).sum();
    assert!(bytes > 4 * 1024 * 1024, "the answer is over gRPC's default limit: {bytes} bytes");
    let mut names: Vec<&str> =
        listed.objects.iter().map(|o| o.name.as_str()).filter(|n| n.starts_with("big-")).collect();
    names.sort_unstable();
    assert_eq!(names, ["big-0", "big-1", "big-2", "big-3", "big-4", "big-5"]);
}

#[tokio::test]
async fn errors_keep_their_grpc_code_and_message() {
    let d = daemon("sdk-rust-errors").await;
    let mut events = pin!(d.client().subscribe(Watch::new("")));
    let failure = tokio::time::timeout(WAIT, events.next()).await.expect("an answer").expect("an item");
    let Err(Error::Status(status)) = failure else { panic!("expected a status, got {failure:?}") };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().starts_with("resource"), "{}", status.message());
    assert!(events.next().await.is_none(), "the stream ends after a refusal");
}

fn campaign(election: &str) -> CampaignRequest {
    CampaignRequest { election: election.into(), ..Default::default() }
}

/// The next state that is not `skip`.
async fn next_state(
    states: &mut (impl Stream<Item = Result<Leadership, Error>> + Unpin),
    skip: LeadershipState,
) -> Leadership {
    loop {
        let s = next(states).await;
        if s.state != skip {
            return s;
        }
    }
}

#[tokio::test]
async fn leadership_streams_lead_follow_and_hand_over() {
    let (a, b) = tokio::join!(daemon("sdk-rust-a"), daemon("sdk-rust-b"));
    let election = format!("sdk-rust-{:08x}", rand_suffix());
    let (ca, cb) = (a.client(), b.client());

    let mut on_a = Box::pin(ca.campaign(campaign(&election)));
    let lead = next_state(&mut on_a, LeadershipState::Unknown).await;
    assert!(lead.is_leader(), "{lead:?}");
    assert_eq!((lead.holder.as_str(), lead.identity.as_str()), ("sdk-rust-a", "sdk-rust-a"));

    let mut on_b = pin!(cb.campaign(campaign(&election)));
    let follow = next_state(&mut on_b, LeadershipState::Unknown).await;
    assert_eq!((follow.state, follow.holder.as_str()), (LeadershipState::Follower, "sdk-rust-a"));

    // Dropping the stream resigns: b takes over with a higher term.
    drop(on_a);
    let taken = next_state(&mut on_b, LeadershipState::Follower).await;
    assert!(taken.is_leader(), "{taken:?}");
    assert!(taken.term > lead.term, "{taken:?} after {lead:?}");
    let guard = taken.guard();
    assert_eq!((guard.election.as_str(), guard.term), (election.as_str(), taken.term), "the guard of this term");
    assert_eq!(guard.namespace, taken.namespace);
}

#[tokio::test]
async fn leadership_reports_unknown_at_once_when_the_sidecar_connection_is_lost_then_campaigns_again() {
    let d = daemon("sdk-rust-lost").await;
    let proxy = UnixProxy::start(d.socket());
    let client = Client::new(proxy.path());
    let election = format!("sdk-rust-{:08x}", rand_suffix());
    let mut states = pin!(client.campaign(campaign(&election)));
    assert!(next_state(&mut states, LeadershipState::Unknown).await.is_leader());

    proxy.cut();
    let lost = next(&mut states).await;
    assert_eq!(lost.state, LeadershipState::Unknown, "{lost:?}");
    // The daemon resigns when the first stream goes; the SDK's new campaign may be told so (FOLLOWER while
    // the Lease still names this daemon or nobody) before it leads again. Never another holder.
    loop {
        let again = next(&mut states).await;
        if again.is_leader() {
            break;
        }
        assert!(again.holder.is_empty() || again.holder == "sdk-rust-lost", "campaigns again: {again:?}");
    }
}

#[tokio::test]
async fn a_leader_whose_sidecar_stops_is_demoted_by_the_sdk_before_another_app_leads() {
    let (a, b) = tokio::join!(daemon("sdk-rust-paused"), daemon("sdk-rust-successor"));
    let election = format!("sdk-rust-{:08x}", rand_suffix());
    let request =
        CampaignRequest { election, timing: Some(consistd_testkit::lease_timing(4, 3, 1)), ..Default::default() };
    let mut on_a = pin!(a.client().campaign(request.clone()));
    let lead = next_state(&mut on_a, LeadershipState::Unknown).await;
    let first_until = lead.leader_until().expect("a LEADER state says until when");
    assert!(lead.is_leader(), "{lead:?}");
    let mut on_b = pin!(b.client().campaign(request));
    assert_eq!(next_state(&mut on_b, LeadershipState::Unknown).await.state, LeadershipState::Follower);
    // Renewals (every second) move leader_until on without telling the app anything new.
    let quiet = tokio::time::timeout(Duration::from_secs(3), on_a.next()).await;
    assert!(quiet.is_err(), "a renewal is not news: {quiet:?}");
    let renewed_until = lead.leader_until().expect("still LEADER");
    assert!(renewed_until > first_until && lead.is_leader(), "the state the app holds was renewed: {lead:?}");

    // a's sidecar stops: nothing more comes from it, and the SDK demotes a's app by itself at
    // leader_until, before b's app is told LEADER (once a's Lease has expired for b).
    a.signal(Signal::SIGSTOP);
    let stopped_at = std::time::SystemTime::now();
    let (demoted, successor) = tokio::join!(
        async {
            let demoted = tokio::time::timeout(Duration::from_secs(6), on_a.next()).await;
            (demoted, std::time::SystemTime::now())
        },
        async {
            let lead = next_state(&mut on_b, LeadershipState::Follower).await;
            (lead, std::time::SystemTime::now())
        },
    );
    a.signal(Signal::SIGCONT);
    let (demoted, demoted_at) = demoted;
    let demoted = demoted.expect("demoted within the renew deadline").expect("an item").expect("a state");
    assert_eq!((demoted.state, demoted.term), (LeadershipState::Unknown, lead.term), "{demoted:?}");
    let lapsed = demoted_at.duration_since(stopped_at).unwrap_or_default();
    assert!(lapsed <= Duration::from_millis(3_500), "demoted {lapsed:?} after the stop: at most the renew deadline");
    assert!(demoted_at >= renewed_until, "not before the deadline the last renewal gave");
    assert!(!lead.is_leader(), "the state the app holds says so too");
    let (successor, led_at) = successor;
    assert!(successor.is_leader() && successor.term > lead.term, "{successor:?}");
    assert!(demoted_at < led_at, "a's app was demoted before b's app was told LEADER");
}

/// Two daemons: `a` sends, `b` receives at its peer address.
async fn sender_and_receiver() -> (Daemon, Daemon, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let a = Daemon::builder(consistd_bin()).config(
        "identity: sdk-rust-sender\npeer:\n  insecure: true\noutbox:\n  backoff:\n    initial: 50ms\n    cap: 1s",
    );
    let b = Daemon::builder(consistd_bin())
        .config(format!("identity: sdk-rust-receiver\npeer:\n  listen: \"{addr}\"\n  insecure: true"));
    let (a, b) = tokio::join!(a.start(), b.start());
    (a, b, addr)
}

fn message(to: &str, resource: &str, event: &str) -> SendRequest {
    SendRequest {
        destination: Some(to_peer(to)),
        resource_id: resource.into(),
        event_id: event.into(),
        payload: br#"{"hello":"peer"}"#.to_vec(),
        content_type: "application/json".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_send_is_awaited_until_the_receiving_handler_returns_and_a_failing_handler_gets_it_again() {
    let (a, b, addr) = sender_and_receiver().await;
    let (sender, receiver) = (a.client(), b.client());
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let handler = tokio::spawn(async move {
        receiver
            .serve_inbox(Duration::from_millis(100), move |m| {
                let seen_tx = seen_tx.clone();
                async move {
                    let _ = seen_tx.send((m.resource_id.clone(), m.delivery_attempt));
                    // The first delivery of "flaky" fails: it must be NACKed and come again, even with a
                    // reason longer than the daemon takes (cut by the SDK, inside a 3-byte character).
                    if m.resource_id == "flaky" && m.delivery_attempt == 1 {
                        return Err(format!("not ready yet: {}", "€".repeat(2000)));
                    }
                    Ok(())
                }
            })
            .await
    });

    let sent = sender.send(message(&addr, "steady", "1")).await.expect("stored");
    assert!(!sent.message_id.is_empty());
    let outcome = tokio::time::timeout(WAIT, sent).await.expect("an outcome in time").expect("an outcome");
    assert!(outcome.is_acked(), "{outcome:?}");
    assert_eq!(outcome.peer, addr);
    assert_eq!(seen.recv().await, Some(("steady".into(), 1)));

    let sent = sender.send(message(&addr, "flaky", "1")).await.expect("stored");
    let outcome = tokio::time::timeout(WAIT, sent).await.expect("an outcome in time").expect("an outcome");
    assert!(outcome.is_acked(), "{outcome:?}");
    assert_eq!(seen.recv().await, Some(("flaky".into(), 1)));
    assert_eq!(seen.recv().await, Some(("flaky".into(), 2)), "redelivered after the NACK");
    handler.abort();
}

#[tokio::test]
async fn a_superseded_send_resolves_as_superseded() {
    let (a, b, addr) = sender_and_receiver().await;
    let sender = a.client();
    // Nobody receives at b yet, so the first event is still un-ACKed when the second replaces it.
    let first = sender.send(message(&addr, "res", "1")).await.expect("stored");
    let second = sender.send(message(&addr, "res", "2")).await.expect("stored");
    let outcome = tokio::time::timeout(WAIT, first).await.expect("an outcome in time").expect("an outcome");
    assert_eq!(outcome.kind, consistd_client::proto::AckOutcome::Superseded);

    // b may have stored event 1 before it was superseded; the app sees it first then, and its ACK
    // does not settle event 2.
    let mut deliveries = pin!(b.client().receive());
    loop {
        let delivery = next(&mut deliveries).await;
        let event = delivery.message.event_id.clone();
        delivery.ack().await.expect("ACK stored");
        if event == "2" {
            break;
        }
    }
    let outcome = tokio::time::timeout(WAIT, second).await.expect("an outcome in time").expect("an outcome");
    assert!(outcome.is_acked(), "{outcome:?}");
}

#[tokio::test]
async fn an_awaited_outcome_outlasts_a_timeout_and_a_sidecar_restart_and_a_forgotten_one_is_not_found() {
    let dir = tempfile::tempdir().expect("dir");
    let addr = format!("127.0.0.1:{}", free_port());
    let config =
        "identity: sdk-rust-sender\npeer:\n  insecure: true\noutbox:\n  backoff:\n    initial: 50ms\n    cap: 1s";
    let b = Daemon::builder(consistd_bin())
        .config(format!("identity: sdk-rust-receiver\npeer:\n  listen: \"{addr}\"\n  insecure: true"))
        .start()
        .await;
    let mut a = Daemon::builder(consistd_bin()).config(config).dir(dir.path()).start().await;
    let sender = Client::new(a.socket());
    let mut deliveries = pin!(b.client().receive());

    // A timeout ends one wait, not the message: nobody ACKed it yet.
    let sent = sender.send(message(&addr, "restarted", "1")).await.expect("stored");
    let first = next(&mut deliveries).await;
    assert!(tokio::time::timeout(Duration::from_millis(300), sent.outcome()).await.is_err(), "no outcome yet");

    // The sidecar dies while the app waits and comes back with the message restored; the ACK given
    // while it was down is seen.
    let waiting = tokio::spawn(async move { sent.outcome().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.signal(Signal::SIGKILL);
    a.wait_exit(WAIT).await;
    first.ack().await.expect("ACK stored at b");
    let mut a = Daemon::builder(consistd_bin()).config(config).dir(dir.path()).start().await;
    let outcome = tokio::time::timeout(WAIT, waiting).await.expect("an outcome in time").expect("task");
    let outcome = outcome.expect("the outcome, through the restart");
    assert!(outcome.is_acked(), "{outcome:?}");

    // An outcome that came before the sidecar's last start is no longer known: NOT_FOUND, as the
    // sidecar says it.
    let settled = sender.send(message(&addr, "forgotten", "1")).await.expect("stored");
    next(&mut deliveries).await.ack().await.expect("ACK stored at b");
    while sender.outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status").into_inner().total_pending
        > 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The store is the daemon's until it has exited: a successor refuses a socket whose lock is held.
    a.signal(Signal::SIGTERM);
    a.wait_exit(WAIT).await;
    let _a = Daemon::builder(consistd_bin()).config(config).dir(dir.path()).start().await;
    let Err(Error::Status(status)) = tokio::time::timeout(WAIT, settled.outcome()).await.expect("an answer in time")
    else {
        panic!("an outcome from before the restart must be NOT_FOUND")
    };
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert!(status.message().contains("before this daemon started"), "{status:?}");
}

#[tokio::test]
async fn a_send_the_daemon_refuses_keeps_its_code_and_names_the_field() {
    let (a, _b, addr) = sender_and_receiver().await;
    let Err(Error::Status(status)) = a.client().send(message(&addr, "", "1")).await else {
        panic!("an empty resource_id must be refused")
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().starts_with("resource_id"), "{}", status.message());
}

#[tokio::test]
async fn concurrent_sends_and_acks_go_out_on_one_stream_each_and_a_refused_send_fails_alone() {
    let (a, b, addr) = sender_and_receiver().await;
    let sender = a.client();
    let sends = (0..200).map(|i| {
        let sender = sender.clone();
        let resource = if i == 100 { String::new() } else { format!("r{i}") };
        let request = message(&addr, &resource, "1");
        async move { sender.send(request).await }
    });
    let results = futures::future::join_all(sends).await;
    let mut sent = Vec::new();
    for (i, result) in results.into_iter().enumerate() {
        match result {
            Ok(s) => sent.push(s),
            Err(Error::Status(status)) if i == 100 => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument);
                assert!(status.message().starts_with("resource_id"), "{}", status.message());
            }
            Err(e) => panic!("send {i}: {e}"),
        }
    }
    assert_eq!(sent.len(), 199, "only the refused send failed");

    let receiver = b.client();
    let deliveries: Vec<_> = receiver.receive().take(199).map(|d| d.expect("a delivery")).collect().await;
    let acks = deliveries.into_iter().map(|d| d.ack());
    for acked in futures::future::join_all(acks).await {
        acked.expect("ACK stored");
    }
    for s in sent {
        let outcome = tokio::time::timeout(WAIT, s).await.expect("an outcome in time").expect("an outcome");
        assert!(outcome.is_acked(), "{outcome:?}");
    }
    assert_eq!(a.calls_started("SendStream").await, 1, "every send went out on one SendStream");
    assert_eq!(a.calls_started("Send").await, 0, "no unary Send");
    assert_eq!(b.calls_started("AckStream").await, 1, "every ACK went out on one AckStream");
    assert_eq!(b.calls_started("Ack").await, 0, "no unary Ack");
}

#[tokio::test]
async fn sends_and_acks_open_their_stream_again_after_the_sidecar_connection_is_lost() {
    let (a, b, addr) = sender_and_receiver().await;
    let (to_a, to_b) = (UnixProxy::start(a.socket()), UnixProxy::start(b.socket()));
    let (sender, receiver) = (Client::new(to_a.path()), Client::new(to_b.path()));
    let mut deliveries = pin!(receiver.receive());
    for round in 0..3 {
        let sent = sender.send(message(&addr, "again", &round.to_string())).await.expect("stored");
        let delivery = next(&mut deliveries).await;
        assert_eq!(delivery.message.event_id, round.to_string());
        delivery.ack().await.expect("ACK stored");
        let outcome = tokio::time::timeout(WAIT, sent).await.expect("an outcome in time").expect("an outcome");
        assert!(outcome.is_acked(), "round {round}: {outcome:?}");
        // Every connection of both apps is cut: the next send and ACK open their streams again.
        to_a.cut();
        to_b.cut();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(a.calls_started("SendStream").await, 3, "one SendStream per connection");
    assert_eq!(b.calls_started("AckStream").await, 3, "one AckStream per connection");
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id()
}
