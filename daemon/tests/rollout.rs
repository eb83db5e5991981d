//! The replica barrier with three daemons on the real control plane: members join by campaigning in the
//! channel's election (a member Lease each), report the version their app applied, and any replica
//! answers "has every live member applied version N?" the same way; a killed member is reported lagging
//! until its membership TTL passes, then dropped. Publish and SubscribeVersions are not built yet.

use std::time::{Duration, Instant};

use consistd_client::proto::{
    CampaignRequest, CampaignResponse, GetRolloutStatusRequest, GetRolloutStatusResponse, PublishRequest,
    ReportAppliedRequest, WaitAppliedRequest, WaitAppliedResponse,
};
use consistd_testkit::{Daemon, free_port};
use nix::sys::signal::Signal;
use tonic::{Code, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

/// A daemon in `ns` whose app takes part in channel "config" (campaigning in its election); a 3 s
/// membership TTL.
async fn replica(ns: &str, identity: &str) -> (Daemon, Streaming<CampaignResponse>) {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "identity: {identity}\nnamespace: {ns}\npeer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\nmembership:\n  ttl: 3s\n"
    );
    let daemon = Daemon::builder(BIN).config(config).start().await;
    let request = CampaignRequest { election: "config".to_owned(), ..Default::default() };
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

    // The barrier, waited for on one replica, opens only when the last member reports.
    let c_client = c.client();
    let waiting = tokio::spawn(async move {
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

    // c is killed: while its membership lasts it is named as lagging; after its TTL it is dropped.
    c.signal(Signal::SIGKILL);
    c.wait_exit(Duration::from_secs(10)).await;
    let killed = Instant::now();
    report(&a, 2).await;
    report(&b, 2).await;
    let w = wait(&a, 2, Duration::from_millis(300)).await;
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
    let e = rollout
        .publish(PublishRequest { channel: "config".into(), ..Default::default() })
        .await
        .expect_err("not built");
    assert_eq!(e.code(), Code::Unimplemented);
}
