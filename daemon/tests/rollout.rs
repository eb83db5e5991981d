//! The replica barrier with three daemons on the real control plane: members join by campaigning in the
//! channel's election (a member Lease each), report the version their app applied, and any replica
//! answers "has every live member applied version N?" the same way; a killed member is reported lagging
//! until its membership TTL passes, then dropped. Versions published on a follower reach every member's
//! app through the leader, racing publishes get distinct versions, a late member starts from the latest.

use std::time::{Duration, Instant};

use consistd_client::proto::{
    CampaignRequest, CampaignResponse, GetLeadershipRequest, GetRolloutStatusRequest, GetRolloutStatusResponse,
    PublishRequest, ReportAppliedRequest, SubscribeVersionsRequest, SubscribeVersionsResponse, WaitAppliedRequest,
    WaitAppliedResponse,
};
use consistd_testkit::{Daemon, free_port};
use nix::sys::signal::Signal;
use tonic::{Code, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

/// A daemon in `ns` whose app takes part in channel "config" (campaigning in its election); a 3 s
/// membership TTL.
async fn replica(ns: &str, identity: &str) -> (Daemon, Streaming<CampaignResponse>) {
    replica_with_ttl(ns, identity, "3s").await
}

/// [`replica`] with the membership TTL `ttl`.
async fn replica_with_ttl(ns: &str, identity: &str, ttl: &str) -> (Daemon, Streaming<CampaignResponse>) {
    replica_timed(ns, identity, ttl, None).await
}

/// [`replica_with_ttl`] whose campaign in the channel's election has `timing` (None: the defaults).
async fn replica_timed(
    ns: &str,
    identity: &str,
    ttl: &str,
    timing: Option<consistd_client::proto::LeaseTiming>,
) -> (Daemon, Streaming<CampaignResponse>) {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "identity: {identity}\nnamespace: {ns}\npeer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\nmembership:\n  ttl: {ttl}\n"
    );
    let daemon = Daemon::builder(BIN).config(config).start().await;
    let request = CampaignRequest { election: "config".to_owned(), timing, ..Default::default() };
    let campaign = daemon.client().leadership().campaign(request).await.expect("Campaign").into_inner();
    (daemon, campaign)
}

async fn report(daemon: &Daemon, version: u64) {
    let request = ReportAppliedRequest { channel: "config".to_owned(), version };
    daemon.client().rollout().report_applied(request).await.expect("ReportApplied");
}

async fn status(daemon: &Daemon, version: u64) -> GetRolloutStatusResponse {
    let request = GetRolloutStatusRequest { channel: "config".to_owned(), version };
    daemon.client().rollout().get_rollout_status(request).await.expect("GetRolloutStatus").into_inner()
}

async fn wait(daemon: &Daemon, version: u64, timeout: Duration) -> WaitAppliedResponse {
    let request = WaitAppliedRequest {
        channel: "config".to_owned(),
        version,
        timeout: Some(prost_types::Duration::try_from(timeout).expect("duration")),
    };
    daemon.client().rollout().wait_applied(request).await.expect("WaitApplied").into_inner()
}

/// (member, applied, live) of a status.
fn table(s: &GetRolloutStatusResponse) -> Vec<(String, u64, bool)> {
    s.members.iter().map(|m| (m.member.clone(), m.applied_version, m.live)).collect()
}

#[tokio::test]
async fn the_barrier_opens_when_every_live_member_applied_and_names_the_laggards() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let (a, _a_campaign) = replica(&ns, "a").await;
    let (b, _b_campaign) = replica(&ns, "b").await;
    let (mut c, _c_campaign) = replica(&ns, "c").await;
    let joined = Instant::now();
    while status(&a, 1).await.members.len() < 3 {
        assert!(joined.elapsed() < Duration::from_secs(10), "members did not all join");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = status(&a, 1).await;
    assert_eq!((s.version, s.latest_version, s.all_applied), (1, 0, false));
    let names = |v: &[(&str, u64, bool)]| v.iter().map(|(n, a, l)| ((*n).to_owned(), *a, *l)).collect::<Vec<_>>();
    assert_eq!(table(&s), names(&[("a", 0, true), ("b", 0, true), ("c", 0, true)]));
    // Only published versions can be reported.
    let never = ReportAppliedRequest { channel: "config".to_owned(), version: 1 };
    let e = a.client().rollout().report_applied(never).await.expect_err("never published");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("never published"), "{e:?}");
    assert_eq!(publish(&a, "v1").await, 1);

    // The barrier, waited for on one replica, opens only when the last member reports.
    let c_client = c.client();
    let waiting = consistd_testkit::spawn(async move {
        let request = WaitAppliedRequest {
            channel: "config".to_owned(),
            version: 1,
            timeout: Some(prost_types::Duration { seconds: 20, nanos: 0 }),
        };
        c_client.rollout().wait_applied(request).await.expect("WaitApplied").into_inner()
    });
    report(&a, 1).await;
    report(&b, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the barrier opened before every member applied");
    let last = Instant::now();
    report(&c, 1).await;
    let opened = waiting.await.expect("wait task");
    assert!(opened.all_applied && opened.lagging.is_empty(), "{opened:?}");
    assert!(last.elapsed() < Duration::from_secs(5), "the barrier took {:?} after the last report", last.elapsed());

    // Every replica gives the same answer.
    let answers = [table(&status(&a, 1).await), table(&status(&b, 1).await), table(&status(&c, 1).await)];
    assert_eq!(answers[0], names(&[("a", 1, true), ("b", 1, true), ("c", 1, true)]));
    assert!(answers.iter().all(|t| *t == answers[0]), "{answers:?}");
    // A lower report changes nothing.
    report(&a, 1).await;

    // v2 is published; c is killed before applying it: while its membership lasts it is named as
    // lagging; after its TTL it is dropped.
    assert_eq!(publish(&b, "v2").await, 2);
    c.signal(Signal::SIGKILL);
    c.wait_exit(Duration::from_secs(10)).await;
    let killed = Instant::now();
    report(&a, 2).await;
    report(&b, 2).await;
    // Long enough for a's and b's reports to reach the barrier (through the leader's record, written 200 ms
    // after the first report it holds unwritten; or, when c led, on their own Leases a third of the TTL
    // after noting them), short of c's 3 s TTL.
    let w = wait(&a, 2, Duration::from_secs(1)).await;
    assert!(!w.all_applied, "{w:?}");
    assert_eq!(w.lagging, vec!["c".to_owned()]);
    let w = wait(&b, 2, Duration::from_secs(10)).await;
    assert!(w.all_applied, "{w:?}");
    assert!(killed.elapsed() >= Duration::from_secs(1), "c was dropped {:?} after the kill", killed.elapsed());
    let s = status(&b, 2).await;
    assert_eq!(table(&s), names(&[("a", 2, true), ("b", 2, true), ("c", 1, false)]), "{s:?}");
    assert!(s.all_applied);
}

#[tokio::test]
async fn bad_requests_name_the_field_and_non_members_cannot_report() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let d = Daemon::builder(BIN).config(format!("identity: d\nnamespace: {ns}\n")).start().await;
    let mut rollout = d.client().rollout();
    let e = rollout
        .report_applied(ReportAppliedRequest { channel: "config".into(), version: 1 })
        .await
        .expect_err("not a member");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("not a member"), "{e:?}");
    let e = rollout.report_applied(ReportAppliedRequest { channel: "Bad!".into(), version: 1 }).await.expect_err("bad");
    assert_eq!((e.code(), e.message().starts_with("channel:")), (Code::InvalidArgument, true), "{e:?}");
    let e =
        rollout.report_applied(ReportAppliedRequest { channel: "config".into(), version: 0 }).await.expect_err("v0");
    assert_eq!((e.code(), e.message().starts_with("version:")), (Code::InvalidArgument, true), "{e:?}");
    let no_timeout = WaitAppliedRequest { channel: "config".into(), version: 1, timeout: None };
    let e = rollout.wait_applied(no_timeout).await.expect_err("no timeout");
    assert_eq!((e.code(), e.message().starts_with("timeout:")), (Code::InvalidArgument, true), "{e:?}");
    let e = rollout
        .get_rollout_status(GetRolloutStatusRequest { channel: String::new(), version: 0 })
        .await
        .expect_err("empty");
    assert_eq!((e.code(), e.message().starts_with("channel:")), (Code::InvalidArgument, true), "{e:?}");
    // A channel without members or versions: nothing to wait for, and nothing applied.
    let s = rollout
        .get_rollout_status(GetRolloutStatusRequest { channel: "config".into(), version: 0 })
        .await
        .expect("status");
    let s = s.into_inner();
    assert_eq!((s.version, s.latest_version, s.members.len(), s.all_applied), (0, 0, 0, false));
    // Nobody subscribes to the channel, so nobody leads it.
    let e = rollout
        .publish(PublishRequest { channel: "config".into(), ..Default::default() })
        .await
        .expect_err("no leader");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("channel config") && e.message().contains("no replica leads it"), "{e:?}");
    // Subscribing needs a peer address the leader can send versions to.
    let request = SubscribeVersionsRequest { channel: "config".into() };
    let e = rollout.subscribe_versions(request).await.expect_err("no peer address");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}

/// A replica whose app subscribes to channel "config" (which makes it a member and a candidate).
async fn subscriber(
    ns: &str,
    identity: &str,
    dir: Option<&std::path::Path>,
) -> (Daemon, Streaming<SubscribeVersionsResponse>) {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "identity: {identity}\nnamespace: {ns}\npeer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\nmembership:\n  ttl: 3s\noutbox:\n  backoff: {{initial: 20ms, factor: 2, cap: 500ms}}\n"
    );
    let mut builder = Daemon::builder(BIN).config(config);
    if let Some(dir) = dir {
        builder = builder.dir(dir);
    }
    let daemon = builder.start().await;
    let stream = daemon
        .client()
        .rollout()
        .subscribe_versions(SubscribeVersionsRequest { channel: "config".to_owned() })
        .await
        .expect("SubscribeVersions")
        .into_inner();
    (daemon, stream)
}

async fn next_version(stream: &mut Streaming<SubscribeVersionsResponse>) -> SubscribeVersionsResponse {
    let item = tokio::time::timeout(Duration::from_secs(20), stream.message()).await.expect("a version in time");
    item.expect("SubscribeVersions stream").expect("stream open")
}

async fn publish(daemon: &Daemon, payload: &str) -> u64 {
    let request = PublishRequest {
        channel: "config".to_owned(),
        payload: payload.as_bytes().to_vec(),
        content_type: "text/plain".to_owned(),
        ..Default::default()
    };
    daemon.client().rollout().publish(request).await.expect("Publish").into_inner().version
}

/// Waits until channel "config" has `members` members and a leader, as `daemon` sees it; returns the leader.
async fn channel_formed(daemon: &Daemon, members: usize) -> String {
    let started = Instant::now();
    loop {
        let holder = daemon
            .client()
            .leadership()
            .get_leadership(GetLeadershipRequest { election: "config".to_owned(), ..Default::default() })
            .await
            .ok()
            .and_then(|r| r.into_inner().status)
            .map(|s| s.holder)
            .unwrap_or_default();
        if status(daemon, 0).await.members.len() == members && !holder.is_empty() {
            return holder;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "channel config never got {members} members and a leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_version_published_on_a_follower_reaches_every_member_and_late_members_start_from_the_latest() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let mut replicas = Vec::new();
    for (i, name) in ["r0", "r1", "r2"].iter().enumerate() {
        replicas.push(subscriber(&ns, name, Some(dirs[i].path())).await);
    }
    let holder = channel_formed(&replicas[0].0, 3).await;
    let followers: Vec<usize> = (0..3).filter(|i| format!("r{i}") != holder).collect();
    let (f1, f2) = (followers[0], followers[1]);

    // Published on a follower, waited for on another: every app gets it, and the barrier opens once all
    // of them reported it applied.
    let version = publish(&replicas[f1].0, "v1").await;
    assert_eq!(version, 1);
    let waiter = replicas[f2].0.client();
    let waiting = consistd_testkit::spawn(async move {
        let request = WaitAppliedRequest {
            channel: "config".to_owned(),
            version: 1,
            timeout: Some(prost_types::Duration { seconds: 20, nanos: 0 }),
        };
        waiter.rollout().wait_applied(request).await.expect("WaitApplied").into_inner()
    });
    for (daemon, stream) in &mut replicas {
        let v = next_version(stream).await;
        assert_eq!((v.version, v.payload.as_slice()), (1, b"v1".as_slice()));
        assert!(!waiting.is_finished(), "the barrier opened before every app applied");
        report(daemon, 1).await;
    }
    let opened = waiting.await.expect("wait task");
    assert!(opened.all_applied, "{opened:?}");

    // Two replicas publish at once: distinct versions, in order, and every app ends on the newest.
    let (a, b) = tokio::join!(publish(&replicas[f1].0, "from f1"), publish(&replicas[f2].0, "from f2"));
    let mut both = vec![a, b];
    both.sort_unstable();
    assert_eq!(both, vec![2, 3]);
    for (daemon, stream) in &mut replicas {
        let mut seen = next_version(stream).await.version;
        while seen < 3 {
            let v = next_version(stream).await.version;
            assert!(v > seen, "versions go up: {seen} then {v}");
            seen = v;
        }
        report(daemon, 3).await;
    }
    assert!(wait(&replicas[f1].0, 3, Duration::from_secs(20)).await.all_applied);

    // A payload over the outbox's limit is refused before a version is taken (v4 below is the next).
    let big = PublishRequest {
        channel: "config".into(),
        payload: vec![0; 1024 * 1024 + 1],
        content_type: String::new(),
        ..Default::default()
    };
    let e = replicas[f1].0.client().rollout().publish(big).await.expect_err("too large");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("maxPayloadBytes"), "{e:?}");

    // A member that joins late starts from the latest version, not every one before it.
    let (late, mut late_stream) = subscriber(&ns, "r3", None).await;
    let first = next_version(&mut late_stream).await;
    assert_eq!(
        (first.version, first.payload.as_slice()),
        (3, if a == 3 { b"from f1".as_slice() } else { b"from f2".as_slice() })
    );
    report(&late, 3).await;

    // A follower killed mid-rollout is named as lagging; restarted on its store, it catches up.
    let (killed_daemon, _) = &mut replicas[f2];
    killed_daemon.signal(Signal::SIGKILL);
    killed_daemon.wait_exit(Duration::from_secs(10)).await;
    let v4 = publish(&replicas[f1].0, "v4").await;
    assert_eq!(v4, 4);
    let w = wait(&replicas[f1].0, 4, Duration::from_millis(500)).await;
    assert!(w.lagging.contains(&format!("r{f2}")), "{w:?}");
    let (restarted, mut restarted_stream) = subscriber(&ns, &format!("r{f2}"), Some(dirs[f2].path())).await;
    let caught_up = next_version(&mut restarted_stream).await;
    assert_eq!(caught_up.version, 4);
    report(&restarted, 4).await;
}

#[tokio::test]
async fn leader_failover_in_the_middle_of_a_rollout_loses_no_version_and_reuses_none() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let mut replicas = Vec::new();
    for name in ["f0", "f1", "f2"] {
        replicas.push(subscriber(&ns, name, None).await);
    }
    let leader = channel_formed(&replicas[0].0, 3).await;
    let l = ["f0", "f1", "f2"].iter().position(|n| *n == leader).expect("the leader is one of the replicas");
    let f = (l + 1) % 3;

    // v1 is published; the leader dies before every app has applied it.
    assert_eq!(publish(&replicas[f].0, "v1").await, 1);
    for (_, stream) in &mut replicas {
        assert_eq!(next_version(stream).await.version, 1);
    }
    report(&replicas[f].0, 1).await;
    replicas[l].0.signal(Signal::SIGKILL);
    replicas[l].0.wait_exit(Duration::from_secs(10)).await;

    // A new leader takes over after the Lease expires (15 s); Publish answers once it has.
    let failed_over = Instant::now();
    let v2 = loop {
        let request = PublishRequest {
            channel: "config".to_owned(),
            payload: b"v2".to_vec(),
            content_type: String::new(),
            ..Default::default()
        };
        match replicas[f].0.client().rollout().publish(request).await {
            Ok(r) => break r.into_inner().version,
            Err(e) => {
                assert!(failed_over.elapsed() < Duration::from_secs(40), "no new leader: {e:?}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    assert_eq!(v2, 2, "the new leader continues from the last version and reuses none");
    for (i, (daemon, stream)) in replicas.iter_mut().enumerate() {
        if i == l {
            continue;
        }
        let mut v = next_version(stream).await.version;
        while v < 2 {
            v = next_version(stream).await.version;
        }
        report(daemon, 2).await;
    }
    let w = wait(&replicas[f].0, 2, Duration::from_secs(20)).await;
    assert!(w.all_applied, "the surviving members applied v2 and the dead one was dropped: {w:?}");
}

/// The Lease patches in `ns` logged after `offset`, by Lease name: member Leases (election Leases are
/// written with update).
fn lease_patches(ns: &str, offset: u64) -> std::collections::BTreeMap<String, usize> {
    let mut writes = std::collections::BTreeMap::new();
    for e in consistd_testkit::audit_events(offset) {
        if e["stage"] == "ResponseComplete"
            && e["verb"] == "patch"
            && e["objectRef"]["resource"] == "leases"
            && e["objectRef"]["namespace"] == ns
        {
            *writes.entry(e["objectRef"]["name"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
        }
    }
    writes
}

/// Each member's report goes to the channel's leader as the ACK of the version's message, and the leader
/// records what they all applied on its own member Lease: one Lease write per version for the whole
/// group, where each member once wrote its own (at 100 replicas the barrier took 2 ms per replica).
#[tokio::test]
async fn a_version_costs_one_write_of_the_leaders_record_not_one_per_member() {
    const MEMBERS: usize = 4;
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let mut replicas = Vec::new();
    for i in 0..MEMBERS {
        let addr = format!("127.0.0.1:{}", free_port());
        // A long TTL: no renewal (every 20 s) falls inside what the audit log is read for.
        let config = format!(
            "identity: m{i}\nnamespace: {ns}\npeer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\nmembership:\n  ttl: 60s\n"
        );
        let daemon = Daemon::builder(BIN).config(config).start().await;
        // The app applies each version at once and reports it.
        let client = daemon.client();
        let app = consistd_testkit::spawn(async move {
            let request = SubscribeVersionsRequest { channel: "config".to_owned() };
            let mut stream =
                client.rollout().subscribe_versions(request).await.expect("SubscribeVersions").into_inner();
            while let Ok(Some(v)) = stream.message().await {
                let report = ReportAppliedRequest { channel: "config".to_owned(), version: v.version };
                client.rollout().report_applied(report).await.expect("ReportApplied");
            }
        });
        replicas.push((format!("m{i}"), daemon, app));
    }
    let leader = channel_formed(&replicas[0].1, MEMBERS).await;
    let follower = replicas.iter().find(|(identity, ..)| *identity != leader).map(|(_, d, _)| d).expect("a follower");

    let offset = consistd_testkit::audit_offset();
    for round in 1..=3 {
        let version = publish(follower, &format!("v{round}")).await;
        let opened = wait(follower, version, Duration::from_secs(10)).await;
        assert!(opened.all_applied, "round {round}: {opened:?}");
        let applied: Vec<u64> = opened.members.iter().map(|m| m.applied_version).collect();
        assert_eq!(applied, vec![version; MEMBERS], "round {round}: {opened:?}");
    }
    let mut writes = lease_patches(&ns, offset);
    let leaders = format!("config.member.{leader}");
    let by_leader = writes.remove(&leaders).unwrap_or(0);
    // A write per version would be three per member. A member's periodic renewal (every 20 s until the
    // leader's roll call vouches for it) may fall in this window once, as may the leader's.
    assert!(
        writes.values().all(|n| *n <= 1),
        "members other than the leader wrote their Leases for the versions: {writes:?}"
    );
    // One per version; a second when the last ACK comes later than the record may wait.
    assert!((3..=7).contains(&by_leader), "the leader's record was written {by_leader} times for 3 versions");
    for (_, _, app) in &replicas {
        app.abort();
    }
}

/// The election's leader reaches every member of its group (its roll call) and records whom it reached on
/// its own member Lease, so an idle member writes nothing and still counts. When the leader is killed,
/// the others renew their own Leases before its record lapses: no live member drops out meanwhile.
#[tokio::test]
async fn idle_members_the_leader_reaches_write_nothing_and_outlive_a_killed_leader() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let mut replicas = Vec::new();
    for identity in ["a", "b", "c"] {
        replicas.push((identity.to_owned(), replica(&ns, identity).await));
    }
    let leader = channel_formed(&replicas[0].1.0, 3).await;
    only_the_leader_writes(&ns, &leader).await;
    for (identity, (daemon, _)) in &replicas {
        let s = status(daemon, 0).await;
        assert!(s.members.iter().all(|m| m.live) && s.members.len() == 3, "as {identity} sees it: {s:?}");
    }

    // The leader is killed: for two TTLs, every survivor counts both survivors all the time.
    let index = replicas.iter().position(|(identity, _)| *identity == leader).expect("the leader is a replica");
    let (_, (mut killed, _)) = replicas.remove(index);
    let offset = consistd_testkit::audit_offset();
    killed.signal(Signal::SIGKILL);
    killed.wait_exit(Duration::from_secs(10)).await;
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(6) {
        for (identity, (daemon, _)) in &replicas {
            let s = status(daemon, 0).await;
            let live: Vec<&str> =
                s.members.iter().filter(|m| m.live && m.member != leader).map(|m| m.member.as_str()).collect();
            assert_eq!(
                live.len(),
                2,
                "{:?} after the leader was killed, {identity} counts {live:?}: {s:?}",
                since.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The survivors kept counted by writing, or by the new leader reaching them.
    let writes = lease_patches(&ns, offset);
    assert!(!writes.is_empty(), "nobody wrote a member Lease in the 6 s after the leader was killed");
    let s = status(&replicas[0].1.0, 0).await;
    assert!(s.members.iter().any(|m| m.member == leader && !m.live), "the killed leader is dropped: {s:?}");
}

/// A member that joins a group whose leader calls the roll is written into the leader's record at once and
/// told so a moment later: it writes nothing after creating its Lease, its own first renewal (a third of the
/// TTL after it joined) never coming due. Before, the record waited for the leader's next renewal and each
/// member that joined renewed its own Lease once or twice first: at 100 replicas the scale bench's idle
/// window caught 2.80 such writes a second in one run of two.
#[tokio::test]
async fn a_member_that_joins_is_recorded_by_the_leader_before_its_own_first_renewal() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    // A 9 s TTL: a round every 1.5 s, a member's own renewal 3 s after its last write.
    let mut replicas = Vec::new();
    for identity in ["a", "b"] {
        replicas.push(replica_with_ttl(&ns, identity, "9s").await);
    }
    channel_formed(&replicas[0].0, 2).await;
    let offset = consistd_testkit::audit_offset();
    let joined = replica_with_ttl(&ns, "d", "9s").await;
    channel_formed(&joined.0, 3).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = lease_patches(&ns, offset);
    assert_eq!(
        writes.get("config.member.d"),
        Some(&1),
        "d created its Lease, then the leader's record kept it: {writes:?}"
    );
    let s = status(&replicas[0].0, 0).await;
    assert!(s.members.iter().all(|m| m.live) && s.members.len() == 3, "{s:?}");
}

/// Waits for a 4 s span in which only `leader` wrote a member Lease in `ns`. With a 3 s TTL a member
/// renews every second unless the leader's roll call reaches it: such a span shows the roll call at work
/// (the first seconds go to the record's first write).
async fn only_the_leader_writes(ns: &str, leader: &str) {
    let leaders = format!("config.member.{leader}");
    let started = Instant::now();
    loop {
        let offset = consistd_testkit::audit_offset();
        tokio::time::sleep(Duration::from_secs(4)).await;
        let mut writes = lease_patches(ns, offset);
        let by_leader = writes.remove(&leaders).unwrap_or(0);
        if writes.is_empty() {
            assert!(by_leader >= 3, "the leader renewed {by_leader} times in 4 s with a 3 s TTL");
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "members other than the leader kept writing: {writes:?}");
    }
}

/// A replica's name, its daemon, and its app's campaign (which keeps it a member).
type Replica = (String, (Daemon, Streaming<CampaignResponse>));

/// Three replicas of channel "config" whose leader's roll call keeps the others counted (they have
/// stopped writing): the leader, and the others.
async fn quiet_group(ns: &str) -> (Replica, Vec<Replica>) {
    let mut replicas = Vec::new();
    for identity in ["a", "b", "c"] {
        replicas.push((identity.to_owned(), replica(ns, identity).await));
    }
    let leader = channel_formed(&replicas[0].1.0, 3).await;
    only_the_leader_writes(ns, &leader).await;
    let index = replicas.iter().position(|(identity, _)| *identity == leader).expect("the leader is a replica");
    let leading = replicas.remove(index);
    (leading, replicas)
}

/// Publishes on `daemon`, which forwards to the channel's leader: retried only while `daemon` has not yet
/// seen a new leader take over, never because it counts that leader as gone.
async fn publish_after_handover(daemon: &Daemon, payload: &str) -> u64 {
    let started = Instant::now();
    loop {
        let request = PublishRequest {
            channel: "config".to_owned(),
            payload: payload.as_bytes().to_vec(),
            content_type: "text/plain".to_owned(),
            ..Default::default()
        };
        match daemon.client().rollout().publish(request).await {
            Ok(r) => return r.into_inner().version,
            Err(e)
                if e.code() == Code::Unavailable
                    && !e.message().contains("no live member Lease")
                    && started.elapsed() < Duration::from_secs(5) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("Publish after the leader left: {e:?}"),
        }
    }
}

/// A leader that leaves gracefully deletes its member Lease, and the roll call record on it that kept
/// the other members counted. It first lets them renew their own Leases (they do once they see it
/// release the election), so nobody who reads the group after the Lease is gone finds them stale: the
/// audit log shows each member's renewal complete before the delete arrives. A Publish forwarded to the
/// new leader goes through at once, where before it found that leader "with no live member Lease".
#[tokio::test]
async fn a_leader_that_leaves_lets_the_members_it_vouched_for_renew_before_its_lease_goes() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let ((leader, (mut leaving, _campaign)), others) = quiet_group(&ns).await;

    let offset = consistd_testkit::audit_offset();
    leaving.signal(Signal::SIGTERM);
    // Every reader, all along: both others count.
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(1500) {
        for (identity, (daemon, _)) in &others {
            let s = status(daemon, 0).await;
            let live = s.members.iter().filter(|m| m.live && m.member != leader).count();
            assert_eq!(live, 2, "{:?} after SIGTERM to the leader, {identity} counts {live}: {s:?}", since.elapsed());
        }
    }
    assert!(leaving.wait_exit(Duration::from_secs(10)).await.success(), "{leader} stopped gracefully");

    let events = consistd_testkit::audit_events(offset);
    let leases = |verb: &str, name: &str| -> Vec<serde_json::Value> {
        events
            .iter()
            .filter(|e| {
                e["stage"] == "ResponseComplete"
                    && e["verb"] == verb
                    && e["objectRef"]["resource"] == "leases"
                    && e["objectRef"]["namespace"] == ns.as_str()
                    && e["objectRef"]["name"] == name
            })
            .cloned()
            .collect()
    };
    let deleted = leases("delete", &format!("config.member.{leader}"));
    assert_eq!(deleted.len(), 1, "the leader deleted its member Lease once: {deleted:?}");
    let delete_received = deleted[0]["requestReceivedTimestamp"].as_str().expect("timestamp").to_owned();
    for (identity, _) in &others {
        // When each renewal arrived: the leaver sees it committed (through its watch) a little before the
        // apiserver logs the response complete.
        let renewed: Vec<String> = leases("patch", &format!("config.member.{identity}"))
            .iter()
            .filter_map(|e| e["requestReceivedTimestamp"].as_str().map(str::to_owned))
            .collect();
        // Audit timestamps are RFC 3339 in UTC with microseconds: ordered as strings.
        assert!(
            renewed.iter().any(|arrived| *arrived < delete_received),
            "{identity} renewed at {renewed:?}, not before the leader's Lease was deleted at {delete_received}"
        );
    }
    let version = publish_after_handover(&others[0].1.0, "after the leader left").await;
    assert!(version >= 1, "{version}");
}

/// A member that cannot renew for itself (stopped here) keeps its leader's contact until the contact
/// lapses, even when the leader leaves and deletes the Lease that recorded it: the leaver waits for it
/// only a while, and a WaitApplied already reading the group keeps what the deleted record said. So the
/// barrier does not open without the lagging member before a TTL has passed since it was last reached.
#[tokio::test]
async fn a_barrier_waiting_on_a_member_keeps_its_contact_when_the_leader_that_recorded_it_leaves() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let ((leader, (mut leaving, _campaign)), others) = quiet_group(&ns).await;
    let [(stopped, (lagging, _)), (_, (observer, _))] = &others[..] else { panic!("two others") };
    assert_eq!(publish(&leaving, "v1").await, 1);
    report(&leaving, 1).await;
    report(observer, 1).await;
    let waiting = {
        let request = WaitAppliedRequest {
            channel: "config".to_owned(),
            version: 1,
            timeout: Some(prost_types::Duration { seconds: 10, nanos: 0 }),
        };
        let mut rollout = observer.client().rollout();
        consistd_testkit::spawn(async move {
            let answer = rollout.wait_applied(request).await.expect("WaitApplied").into_inner();
            (answer, std::time::SystemTime::now())
        })
    };
    // The observer's report reaches the leader's record with its next renewal.
    let started = Instant::now();
    let s = loop {
        let s = status(observer, 1).await;
        let lagging: Vec<&str> =
            s.members.iter().filter(|m| m.live && m.applied_version < 1).map(|m| m.member.as_str()).collect();
        if lagging == [stopped.as_str()] {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "only {stopped} should lag: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let last_seen = s.members.iter().find(|m| m.member == *stopped).and_then(|m| m.last_seen).expect("last seen");
    let last_seen = std::time::SystemTime::try_from(last_seen).expect("a time");

    lagging.signal(Signal::SIGSTOP);
    leaving.signal(Signal::SIGTERM);
    let (answer, opened) = waiting.await.expect("the WaitApplied task");
    lagging.signal(Signal::SIGCONT);
    assert!(answer.all_applied, "the stopped {stopped} drops out within a TTL and the barrier opens: {answer:?}");
    let after = opened.duration_since(last_seen).unwrap_or_default();
    assert!(
        after >= Duration::from_millis(2950),
        "the barrier opened without {stopped} {after:?} after it was last seen, within its 3 s TTL: {answer:?}"
    );
    assert!(leaving.wait_exit(Duration::from_secs(10)).await.success(), "{leader} stopped gracefully");
    let version = publish_after_handover(lagging, "after the leader left").await;
    assert!(version >= 1, "{version}");
}

/// The roll call's peer RPC validates what it is asked and answers only for the member it names.
#[tokio::test]
async fn a_roll_call_names_its_bad_fields_and_reaches_only_the_member_it_means() {
    use consistd_proto::peer::v1::{ReachRequest, peer_service_client::PeerServiceClient};
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let (daemon, _campaign) = replica(&ns, "a").await;
    channel_formed(&daemon, 1).await;
    let (addr, incarnation) = member_of_config(&kube, &ns, "a").await;

    let mut peer = PeerServiceClient::connect(format!("http://{addr}")).await.expect("connect to the peer port");
    let reach = |election: &str, namespace: &str, identity: &str| ReachRequest {
        namespace: namespace.to_owned(),
        election: election.to_owned(),
        identity: identity.to_owned(),
        incarnation: incarnation.clone(),
        recorded_contact_age_ms: Some(100),
        recorded_applied_version: 0,
    };
    for (request, code, field) in [
        (reach("config", &ns, ""), Code::InvalidArgument, "identity"),
        (reach("config", "", "a"), Code::InvalidArgument, "namespace"),
        (reach("Not_A_Lease", &ns, "a"), Code::InvalidArgument, "election"),
        (reach("config", &ns, "b"), Code::FailedPrecondition, "not \"b\""),
        (reach("other", &ns, "a"), Code::FailedPrecondition, "not a member"),
    ] {
        let e = peer.reach(request).await.expect_err("refused");
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(field), "{e:?}");
    }
    let answer = peer.reach(reach("config", &ns, "a")).await.expect("Reach").into_inner();
    assert_eq!(answer.incarnation, incarnation);
}

/// A member of channel "config" as its member Lease names it: (peer address, incarnation).
async fn member_of_config(kube: &kube::Client, ns: &str, identity: &str) -> (String, String) {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(kube.clone(), ns);
    let lease = leases.get(&format!("config.member.{identity}")).await.expect("the member Lease");
    let annotations = lease.metadata.annotations.unwrap_or_default();
    (annotations["consistd.io/peer-address"].clone(), annotations["consistd.io/member-incarnation"].clone())
}

/// A forwarded Publish names the leader it means: a daemon with another identity at that address (a new
/// pod given the old leader's address) assigns nothing, and one that does not lead answers UNAVAILABLE too,
/// so the app's daemon and the app ask again. Before, the new pod answered FAILED_PRECONDITION, which
/// clients take as final.
#[tokio::test]
async fn a_forwarded_publish_is_taken_only_by_the_leader_it_names() {
    use consistd_proto::peer::v1::{PublishRequest as Forwarded, peer_service_client::PeerServiceClient};
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let (a, _campaign_a) = replica(&ns, "a").await;
    let (_b, _campaign_b) = replica(&ns, "b").await;
    let leader = channel_formed(&a, 2).await;
    let follower = if leader == "a" { "b" } else { "a" };
    let (at_leader, at_follower) =
        (member_of_config(&kube, &ns, &leader).await.0, member_of_config(&kube, &ns, follower).await.0);
    let forwarded = |to: &str| Forwarded {
        channel: "config".to_owned(),
        payload: b"forwarded".to_vec().into(),
        content_type: "text/plain".to_owned(),
        claim: String::new(),
        leader: to.to_owned(),
    };
    let connect = |addr: String| async move {
        PeerServiceClient::connect(format!("http://{addr}")).await.expect("connect to the peer port")
    };
    for (addr, to, says) in [
        (&at_leader, "gone-pod", format!("this is consistd {leader}, not gone-pod")),
        (&at_follower, follower, "does not lead it".to_owned()),
    ] {
        let e = connect(addr.clone()).await.publish(forwarded(to)).await.expect_err("refused");
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(e.message().contains(&says), "{e:?}");
    }
    let taken = connect(at_leader.clone()).await.publish(forwarded(&leader)).await.expect("the leader it names");
    assert_eq!(taken.into_inner().version, 1, "the refused Publishes took no version");
}

/// A channel's leader whose daemon is killed and starts again with the same identity (a sidecar
/// restarted in its pod) finds the Lease naming itself, held by its previous run. A Publish on it says so
/// at once, UNAVAILABLE, rather than going round to itself and being refused as not the leader; once that
/// holding lapses, a replica leads and the Publish goes through.
#[tokio::test]
async fn a_publish_on_a_restarted_leader_says_its_previous_run_holds_the_channel() {
    use consistd_client::proto::LeaseTiming;
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let secs = |s: i64| Some(prost_types::Duration { seconds: s, nanos: 0 });
    let timing = LeaseTiming { lease_duration: secs(4), renew_deadline: secs(3), retry_period: secs(1) };
    let (first, _campaign) = replica_timed(&ns, "a", "3s", Some(timing)).await;
    assert_eq!(channel_formed(&first, 1).await, "a");
    assert_eq!(publish(&first, "one").await, 1);
    first.signal(Signal::SIGKILL);
    let (again, _campaign) = replica_timed(&ns, "a", "3s", Some(timing)).await;
    let request = || PublishRequest { channel: "config".to_owned(), payload: b"two".to_vec(), ..Default::default() };
    let e = again.client().rollout().publish(request()).await.expect_err("refused while the old run's holding lasts");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("its Lease names this daemon (a)"), "{e:?}");
    let started = Instant::now();
    let version = loop {
        match again.client().rollout().publish(request()).await {
            Ok(r) => break r.into_inner().version,
            Err(e) if e.code() == Code::Unavailable && started.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("Publish once the old run's holding lapsed: {e:?}"),
        }
    };
    assert_eq!(version, 2, "the new run leads and takes the next version");
}
