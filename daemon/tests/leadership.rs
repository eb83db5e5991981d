//! LeadershipService with several daemons on one election against the real apiserver: one leader and
//! followers that know it, handover on resign (stream closed), SIGTERM and kill -9, UNKNOWN when the
//! apiserver is lost, guarded writes, and bad input.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use consistd_client::proto::{
    CampaignRequest, CreateRequest, GetLeadershipRequest, LeadershipState, LeaseTiming, ObserveRequest, WriteGuard,
};
use consistd_testkit::{Daemon, proxy::DelayProxy};
use nix::sys::signal::Signal;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

fn secs(s: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds: s, nanos: 0 })
}

/// Latest state seen on one daemon's Campaign stream.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    state: LeadershipState,
    holder: String,
    term: u64,
}

struct Candidate {
    daemon: Daemon,
    identity: String,
    latest: Arc<Mutex<Option<Seen>>>,
    stream: tokio::task::JoinHandle<()>,
}

async fn candidate(identity: &str, ns: &str, election: &str, lease: i64, renew: i64, retry: i64) -> Candidate {
    let daemon = Daemon::builder(BIN).config(format!("identity: {identity}\nnamespace: {ns}\n")).start().await;
    let latest = Arc::new(Mutex::new(None));
    let stream = campaign(&daemon, election, lease, renew, retry, latest.clone()).await;
    Candidate { daemon, identity: identity.to_owned(), latest, stream }
}

async fn campaign(
    daemon: &Daemon,
    election: &str,
    lease: i64,
    renew: i64,
    retry: i64,
    latest: Arc<Mutex<Option<Seen>>>,
) -> tokio::task::JoinHandle<()> {
    let request = CampaignRequest {
        election: election.into(),
        timing: Some(LeaseTiming {
            lease_duration: secs(lease),
            renew_deadline: secs(renew),
            retry_period: secs(retry),
        }),
        ..Default::default()
    };
    let mut stream = daemon.client().leadership().campaign(request).await.expect("campaign").into_inner();
    consistd_testkit::spawn(async move {
        while let Ok(Some(message)) = stream.message().await {
            let s = message.status.expect("status");
            *latest.lock().expect("lock") = Some(Seen { state: s.state(), holder: s.holder.clone(), term: s.term });
        }
    })
}

fn seen(c: &Candidate) -> Option<Seen> {
    c.latest.lock().expect("lock").clone()
}

/// Waits until exactly one candidate says LEADER and every other says FOLLOWER of it; returns the index.
async fn settled(candidates: &[&Candidate]) -> (usize, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let states: Vec<Option<Seen>> = candidates.iter().map(|c| seen(c)).collect();
        let leaders: Vec<usize> = states
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| s.state == LeadershipState::Leader))
            .map(|(i, _)| i)
            .collect();
        if let [leader] = leaders.as_slice() {
            let name = &candidates[*leader].identity;
            let term = states[*leader].as_ref().map_or(0, |s| s.term);
            let followers_agree = states.iter().enumerate().filter(|(i, _)| i != leader).all(|(_, s)| {
                s.as_ref().is_some_and(|s| s.state == LeadershipState::Follower && &s.holder == name && s.term == term)
            });
            if followers_agree {
                return (*leader, term);
            }
        }
        assert!(leaders.len() <= 1, "two candidates told LEADER at once: {states:?}");
        assert!(Instant::now() < deadline, "no settled leadership within 30 s: {states:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn three_daemons_elect_one_leader_and_hand_over_on_resign_and_sigterm() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    // Lease 15 s, so a handover well under it proves the Lease was released, not left to expire.
    let a = candidate("pod-a", &ns, "e", 15, 10, 1).await;
    let b = candidate("pod-b", &ns, "e", 15, 10, 1).await;
    let c = candidate("pod-c", &ns, "e", 15, 10, 1).await;
    let (first, term) = settled(&[&a, &b, &c]).await;
    assert_eq!(term, 1, "the first leader of a new election is in term 1; 0 is never a term");

    // GetLeadership on every daemon agrees with the streams.
    for cand in [&a, &b, &c] {
        let s = cand
            .daemon
            .client()
            .leadership()
            .get_leadership(GetLeadershipRequest { election: "e".into(), namespace: String::new() })
            .await
            .expect("get")
            .into_inner()
            .status
            .expect("status");
        assert_eq!(s.term, term);
        assert_eq!(s.holder, [&a, &b, &c][first].identity);
    }

    // 1. The leader's app closes its Campaign stream: the daemon resigns and another takes over fast.
    let leader = [&a, &b, &c][first];
    let resigned_at = Instant::now();
    leader.stream.abort();
    leader.latest.lock().expect("lock").take();
    let rest: Vec<&Candidate> =
        [&a, &b, &c].into_iter().enumerate().filter(|(i, _)| *i != first).map(|(_, c)| c).collect();
    let (second, term2) = settled(&rest).await;
    let handover = resigned_at.elapsed();
    assert!(term2 > term, "the term grows on every change of holder ({term} -> {term2})");
    assert!(handover < Duration::from_secs(8), "resign released the Lease: handover took {handover:?}");

    // 2. SIGTERM of the new leader: graceful shutdown releases the Lease too.
    let second_leader = rest[second];
    let remaining: Vec<&Candidate> = rest.iter().copied().filter(|c| c.identity != second_leader.identity).collect();
    let stopped_at = Instant::now();
    second_leader.daemon.signal(Signal::SIGTERM);
    let (_, term3) = settled(&remaining).await;
    let handover = stopped_at.elapsed();
    assert!(term3 > term2);
    assert!(handover < Duration::from_secs(8), "SIGTERM released the Lease: handover took {handover:?}");
}

#[tokio::test]
async fn kill_9_of_the_leader_fails_over_within_lease_duration_plus_retry() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let a = candidate("pod-a", &ns, "k", 4, 3, 1).await;
    let b = candidate("pod-b", &ns, "k", 4, 3, 1).await;
    let (first, term) = settled(&[&a, &b]).await;
    let (leader, follower) = if first == 0 { (&a, &b) } else { (&b, &a) };
    let killed_at = Instant::now();
    leader.daemon.signal(Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = seen(follower)
            && s.state == LeadershipState::Leader
        {
            assert!(s.term > term);
            break;
        }
        assert!(Instant::now() < deadline, "no failover: {:?}", seen(follower));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failover = killed_at.elapsed();
    // The Lease must expire first (4 s from the last renewal, judged from the follower's observation),
    // then the next retry (1 s) takes it; slack for a busy machine.
    assert!(failover < Duration::from_secs(4 + 1 + 3), "failover took {failover:?}");
    assert!(failover > Duration::from_secs(2), "a killed leader cannot release; took only {failover:?}");
}

#[tokio::test]
async fn a_leader_that_loses_the_apiserver_reports_unknown_before_its_lease_expires() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let daemon =
        Daemon::builder(BIN).config(format!("identity: lonely\nnamespace: {ns}\n")).through(&proxy).start().await;
    let latest = Arc::new(Mutex::new(None));
    let _stream = campaign(&daemon, "u", 6, 4, 1, latest.clone()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while latest.lock().expect("lock").as_ref().is_none_or(|s: &Seen| s.state != LeadershipState::Leader) {
        assert!(Instant::now() < deadline, "never became leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cut_at = Instant::now();
    proxy.cut(true);
    loop {
        let state = latest.lock().expect("lock").as_ref().map(|s| s.state);
        if state == Some(LeadershipState::Unknown) {
            break;
        }
        assert!(cut_at.elapsed() < Duration::from_secs(6), "still {state:?} when the lease could expire for others");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_follower_judges_the_lease_from_its_watch_and_says_unknown_once_it_cannot_show_it_current() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let a = candidate("pod-a", &ns, "w", 6, 4, 1).await;
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let b_daemon =
        Daemon::builder(BIN).config(format!("identity: pod-b\nnamespace: {ns}\n")).through(&proxy).start().await;
    let b_latest = Arc::new(Mutex::new(None));
    let b_stream = campaign(&b_daemon, "w", 6, 4, 1, b_latest.clone()).await;
    let b = Candidate { daemon: b_daemon, identity: "pod-b".into(), latest: b_latest, stream: b_stream };
    // pod-a campaigned first, alone: it created the Lease and leads; pod-b follows behind the proxy.
    let (first, _) = settled(&[&a, &b]).await;
    assert_eq!(first, 0, "pod-a, first to campaign, leads");

    // 1. Idle, over longer than the renew deadline: the follower keeps following from the watch (the
    //    leader renews every second), and nobody reads the Lease: the leader renews from what it wrote.
    let offset = consistd_testkit::audit_offset();
    let idle = Instant::now();
    while idle.elapsed() < Duration::from_secs(6) {
        let s = seen(&b).expect("follower");
        assert_eq!((s.state, s.holder.as_str()), (LeadershipState::Follower, "pod-a"), "while idle: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let on_the_lease = |verb: &str| -> Vec<serde_json::Value> {
        consistd_testkit::audit_events(offset)
            .into_iter()
            .filter(|e| {
                e["stage"] == "ResponseComplete"
                    && e["verb"] == verb
                    && e["objectRef"]["resource"] == "leases"
                    && e["objectRef"]["namespace"] == ns.as_str()
                    && e["objectRef"]["name"] == "w"
            })
            .collect()
    };
    let renewals = on_the_lease("update").len();
    assert!(renewals >= 3, "the audit log shows the leader's renewals (6 s at 1 s each): {renewals}");
    let reads: Vec<String> = on_the_lease("get").iter().map(|e| e["requestReceivedTimestamp"].to_string()).collect();
    assert!(reads.is_empty(), "the election Lease was read {} times while the watch showed it: {reads:?}", reads.len());

    // 2. The follower loses the apiserver, watch and all: once it cannot show its view is current (no
    //    event within the renew deadline, 4 s) it says UNKNOWN, although the Lease it last saw is live.
    let cut_at = Instant::now();
    proxy.cut(true);
    while seen(&b).is_some_and(|s| s.state == LeadershipState::Follower) {
        assert!(cut_at.elapsed() < Duration::from_secs(4 + 2), "still FOLLOWER {:?} after the cut", cut_at.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen(&b).map(|s| s.state), Some(LeadershipState::Unknown));
    assert!(cut_at.elapsed() >= Duration::from_secs(2), "UNKNOWN at once: the last event was under 4 s ago");
    assert_eq!(seen(&a).map(|s| s.state), Some(LeadershipState::Leader), "the leader kept the Lease");

    // 3. Back on the apiserver, it follows the same leader again.
    proxy.cut(false);
    let (first, _) = settled(&[&a, &b]).await;
    assert_eq!(first, 0, "pod-a still leads");
}

#[tokio::test]
async fn guarded_writes_need_the_current_term() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let a = candidate("pod-a", &ns, "g", 15, 10, 1).await;
    let b = candidate("pod-b", &ns, "g", 15, 10, 1).await;
    let (first, term) = settled(&[&a, &b]).await;
    let (leader, follower) = if first == 0 { (&a, &b) } else { (&b, &a) };
    let write = |name: &str, term: u64| CreateRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        object: format!(r#"{{"metadata":{{"name":"{name}"}}}}"#).into_bytes(),
        guard: Some(WriteGuard { election: "g".into(), namespace: String::new(), term }),
        ..Default::default()
    };
    leader.daemon.client().objects().create(write("ok", term)).await.expect("the leader in its term may write");
    let stale = leader.daemon.client().objects().create(write("stale", term + 1)).await.expect_err("wrong term");
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale}");
    let not_leader = follower.daemon.client().objects().create(write("follower", term)).await.expect_err("follower");
    assert_eq!(not_leader.code(), Code::FailedPrecondition, "{not_leader}");
    assert!(not_leader.message().contains("Follower"), "{not_leader}");
    // Term 0 is what an unset WriteGuard.term reads as: refused as a bad field, never taken for a term.
    let unset = leader.daemon.client().objects().create(write("unset", 0)).await.expect_err("term 0");
    assert_eq!(unset.code(), Code::InvalidArgument, "{unset}");
    assert!(unset.message().starts_with("guard.term:"), "{unset}");
}

#[tokio::test]
async fn bad_election_requests_are_refused_naming_the_field_and_a_malformed_lease_is_taken_over() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN).config(format!("identity: fixer\nnamespace: {ns}\n")).start().await;
    let client = daemon.client();
    let refuse = |request: CampaignRequest| {
        let client = client.clone();
        async move { client.leadership().campaign(request).await.expect_err("refused") }
    };
    let s = refuse(CampaignRequest::default()).await;
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().starts_with("election:"), "{s}");
    let s = refuse(CampaignRequest { election: "Not_Valid".into(), ..Default::default() }).await;
    assert!(s.message().starts_with("election:"), "{s}");
    let s = refuse(CampaignRequest {
        election: "x".into(),
        timing: Some(LeaseTiming { lease_duration: secs(10), renew_deadline: secs(10), retry_period: secs(2) }),
        ..Default::default()
    })
    .await;
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().starts_with("timing:"), "{s}");

    // A Lease someone left with a holder but no duration: observers say UNKNOWN, a candidate repairs it.
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(kube, &ns);
    let malformed = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "broken" }, "spec": { "holderIdentity": "ghost" }
    }))
    .expect("lease");
    leases.create(&kube::api::PostParams::default(), &malformed).await.expect("create malformed lease");
    let mut observe = client
        .leadership()
        .observe(ObserveRequest { election: "broken".into(), namespace: String::new() })
        .await
        .expect("observe")
        .into_inner();
    let first = observe.message().await.expect("read").expect("status").status.expect("status");
    assert_ne!(first.state(), LeadershipState::Leader);
    let latest = Arc::new(Mutex::new(None));
    let _stream = campaign(&daemon, "broken", 4, 3, 1, latest.clone()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while latest.lock().expect("lock").as_ref().is_none_or(|s: &Seen| s.state != LeadershipState::Leader) {
        assert!(
            Instant::now() < deadline,
            "the malformed Lease was not taken over: {:?}",
            latest.lock().expect("lock")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health = daemon.client().health().check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await;
    assert_eq!(
        health.expect("health").into_inner().status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
}

#[tokio::test]
async fn an_election_from_the_config_is_campaigned_from_boot_and_observed_by_apps() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let config = format!(
        "identity: booted\nnamespace: {ns}\nelections:\n- name: from-config\n  leaseDuration: 4s\n  renewDeadline: 3s\n  retryPeriod: 1s\n"
    );
    let daemon = Daemon::builder(BIN).config(config).start().await;
    let mut observe = daemon
        .client()
        .leadership()
        .observe(ObserveRequest { election: "from-config".into(), namespace: String::new() })
        .await
        .expect("observe")
        .into_inner();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = observe.message().await.expect("read").expect("a message").status.expect("status");
        if s.state() == LeadershipState::Leader {
            assert_eq!(s.holder, "booted");
            assert_eq!(s.namespace, ns);
            // The state is updated before anyone is told: a Get right after the notification agrees.
            let got = daemon
                .client()
                .leadership()
                .get_leadership(GetLeadershipRequest { election: "from-config".into(), namespace: String::new() })
                .await
                .expect("get")
                .into_inner()
                .status
                .expect("status");
            assert_eq!((got.state(), got.holder, got.term), (LeadershipState::Leader, s.holder.clone(), s.term));
            // `consistd status` shows the election too.
            let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("report");
            let election = format!("{ns}/from-config");
            assert!(
                report.elections.iter().any(|e| e.election == election && e.role == "LEADER" && e.holder == "booted"),
                "{report:?}"
            );
            assert!(report.upstream_watches >= 1, "the Lease is watched: {report:?}");
            break;
        }
        assert!(Instant::now() < deadline, "never leader: {s:?}");
    }
}

/// Per daemon: (seconds since start, told LEADER) for every Campaign message.
type StateLog = Arc<Mutex<[Vec<(f64, bool)>; 2]>>;

/// 100 forced handovers between two daemons, every state recorded with its arrival time: at no moment
/// were both told LEADER.
#[tokio::test]
async fn a_hundred_handovers_never_tell_two_apps_leader_at_once() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemons = [
        Daemon::builder(BIN).config(format!("identity: pod-a\nnamespace: {ns}\n")).start().await,
        Daemon::builder(BIN).config(format!("identity: pod-b\nnamespace: {ns}\n")).start().await,
    ];
    let start = Instant::now();
    // Per daemon: (seconds since start, is LEADER) for every message of every Campaign stream.
    let log: StateLog = Arc::default();
    let request = CampaignRequest {
        election: "flip".into(),
        timing: Some(LeaseTiming {
            lease_duration: secs(2),
            renew_deadline: secs(1),
            retry_period: Some(prost_types::Duration { seconds: 0, nanos: 100_000_000 }),
        }),
        ..Default::default()
    };
    let open = |i: usize| {
        let (client, log, request) = (daemons[i].client(), log.clone(), request.clone());
        // The reader's JoinHandle is kept to abort it (closing the stream), never awaited.
        #[allow(clippy::async_yields_async)]
        async move {
            let mut stream = client.leadership().campaign(request).await.expect("campaign").into_inner();
            consistd_testkit::spawn(async move {
                while let Ok(Some(m)) = stream.message().await {
                    let leader = m.status.expect("status").state() == LeadershipState::Leader;
                    log.lock().expect("lock")[i].push((start.elapsed().as_secs_f64(), leader));
                }
            })
        }
    };
    let mut streams = [open(0).await, open(1).await];
    let leader_now = |log: &StateLog| {
        let log = log.lock().expect("lock");
        (0..2).find(|&i| log[i].last().is_some_and(|(_, leader)| *leader))
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    for handover in 0..100 {
        // Wait for a leader, then force the handover: its app closes the stream (the end of its LEADER
        // time, recorded now); once the other one leads, it campaigns again as a follower.
        let leader = loop {
            assert!(Instant::now() < deadline, "only {handover} handovers in 120 s");
            if let Some(leader) = leader_now(&log) {
                break leader;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        streams[leader].abort();
        log.lock().expect("lock")[leader].push((start.elapsed().as_secs_f64(), false));
        while leader_now(&log) != Some(1 - leader) {
            assert!(Instant::now() < deadline, "handover {handover} did not happen");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        streams[leader] = open(leader).await;
    }
    drop(streams);

    // LEADER intervals per daemon, from the recorded streams; no two may overlap.
    let log = log.lock().expect("lock").clone();
    let intervals = |entries: &[(f64, bool)]| {
        let mut out = Vec::new();
        let mut since = None;
        for &(t, leader) in entries {
            match (leader, since) {
                (true, None) => since = Some(t),
                (false, Some(s)) => {
                    out.push((s, t));
                    since = None;
                }
                _ => {}
            }
        }
        if let Some(s) = since {
            out.push((s, f64::INFINITY));
        }
        out
    };
    let (a, b) = (intervals(&log[0]), intervals(&log[1]));
    assert!(a.len() + b.len() >= 100, "{} + {} LEADER intervals", a.len(), b.len());
    for &(s1, e1) in &a {
        for &(s2, e2) in &b {
            assert!(e1 <= s2 || e2 <= s1, "pod-a LEADER {s1:.3}..{e1:.3} overlaps pod-b LEADER {s2:.3}..{e2:.3}");
        }
    }
}

/// A term is never shared by two runs of one identity: a replacement pod with the departed pod's name (a
/// StatefulSet pod force-deleted on a node that was cut off), or two daemons configured with one identity.
/// The second run does not take the first's holding as its own: it follows while the first renews, takes
/// the Lease only once it expired, in the next term, and the first, back, steps down. They never both say
/// LEADER, which they did when the holder identity alone made a holding "ours".
#[tokio::test]
async fn a_second_run_of_one_identity_never_shares_its_term() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let first = candidate("pod-0", &ns, "same", 4, 3, 1).await;
    let (_, term) = settled(&[&first]).await;
    let second = candidate("pod-0", &ns, "same", 4, 3, 1).await;
    // Several retry periods: the second run sees the Lease held, renewed by the first, and follows.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        let (a, b) = (seen(&first), seen(&second));
        assert!(
            b.as_ref().is_none_or(|b| b.state != LeadershipState::Leader),
            "the replacement said LEADER while the first run holds the Lease: {a:?} {b:?}"
        );
        assert_eq!(a.map(|a| (a.state, a.term)), Some((LeadershipState::Leader, term)), "the first run keeps leading");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen(&second).is_some_and(|b| b.state == LeadershipState::Follower && b.holder == "pod-0"));

    // The first run stops (a node cut off): the second takes over once the Lease expired, in a new term.
    first.daemon.signal(Signal::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(30);
    let next = loop {
        if let Some(b) = seen(&second).filter(|b| b.state == LeadershipState::Leader) {
            break b.term;
        }
        assert!(Instant::now() < deadline, "the replacement never led: {:?}", seen(&second));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(next, term + 1, "a new holding, a new term");
    // Back, the first run finds its Lease held by the other run and steps down.
    first.daemon.signal(Signal::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if seen(&first).is_some_and(|a| a.state != LeadershipState::Leader) {
            break;
        }
        assert!(Instant::now() < deadline, "the first run still says LEADER: {:?}", seen(&first));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen(&second).map(|b| (b.state, b.term)), Some((LeadershipState::Leader, next)));
}

/// Waits until `c` says LEADER in a term above `above`, never seeing two candidates say LEADER at once;
/// returns the term.
async fn leads_after(c: &Candidate, all: &[&Candidate], above: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let states: Vec<Option<Seen>> = all.iter().map(|c| seen(c)).collect();
        let leaders = states.iter().flatten().filter(|s| s.state == LeadershipState::Leader).count();
        assert!(leaders <= 1, "two candidates told LEADER at once: {states:?}");
        if let Some(s) = seen(c).filter(|s| s.state == LeadershipState::Leader && s.term > above) {
            return s.term;
        }
        assert!(Instant::now() < deadline, "{} did not lead above term {above} within 30 s: {states:?}", c.identity);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A handover on request: the Lease's spec.preferredHolder names a follower, and the leader steps down for
/// it at once (well within the lease duration, so the Lease was released, not left to expire); the follower
/// leads in a new term and clears the request. A request for a candidate that never comes: the leader still
/// steps down, a lease duration later a candidate takes the Lease and clears it, and nothing flaps after.
#[tokio::test]
async fn a_handover_on_request_moves_the_lease_to_the_preferred_candidate_in_a_new_term() {
    use consistd_core::lease::PREFERRED_HOLDER_ANNOTATION;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, Patch, PatchParams};
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let a = candidate("pod-a", &ns, "e", 4, 3, 1).await;
    let b = candidate("pod-b", &ns, "e", 4, 3, 1).await;
    let all = [&a, &b];
    let (first, term) = settled(&all).await;
    let (leader, other) = (all[first], all[1 - first]);
    let leases: Api<Lease> = Api::namespaced(kube, &ns);
    // The annotation: the test control plane, as most clusters, drops spec.preferredHolder (it needs the
    // CoordinatedLeaderElection feature gate); the elector's unit tests read the field.
    let prefer = |who: &str| {
        Patch::Merge(serde_json::json!({ "metadata": { "annotations": { PREFERRED_HOLDER_ANNOTATION: who } } }))
    };
    let requested = |lease: Lease| lease.metadata.annotations.unwrap_or_default().remove(PREFERRED_HOLDER_ANNOTATION);

    let asked = Instant::now();
    leases.patch("e", &PatchParams::default(), &prefer(&other.identity)).await.expect("ask for a handover");
    let term2 = leads_after(other, &all, term).await;
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(3), "the handover took {took:?}: the Lease (4 s) was left to expire");
    let (now, term_now) = settled(&all).await;
    assert_eq!(
        (all[now].identity.as_str(), term_now),
        (other.identity.as_str(), term2),
        "{leader:?} follows",
        leader = leader.identity
    );
    let lease = leases.get("e").await.expect("the Lease");
    assert_eq!(lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()), Some(other.identity.as_str()));
    assert_eq!(requested(lease), None, "the request is done");

    // A candidate that never comes: the Lease is kept for it a lease duration, then taken and the request
    // cleared; whoever leads then keeps leading.
    leases.patch("e", &PatchParams::default(), &prefer("pod-gone")).await.expect("ask for a missing candidate");
    let deadline = Instant::now() + Duration::from_secs(30);
    let term3 = loop {
        let (now, term_now) = settled(&all).await;
        if term_now > term2 {
            break (now, term_now);
        }
        assert!(Instant::now() < deadline, "nobody took the Lease back after pod-gone never came");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(requested(leases.get("e").await.expect("the Lease")), None, "the request lapsed and was cleared");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = settled(&all).await;
    assert_eq!(after, term3, "no flapping once the request lapsed");
}
