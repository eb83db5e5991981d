//! File descriptors: a daemon limited to 128 (RLIMIT_NOFILE) that leads an election, then gets 200 app
//! connections at once. It holds at most half its limit of app connections and closes each one past that
//! at once (its client sees the connection end), spins no CPU, keeps renewing its Lease, and takes new
//! connections again once the others close.

use std::time::Duration;

use consistd_client::proto::{CampaignRequest, GetLeadershipRequest, LeadershipState};
use consistd_testkit::Daemon;
use tokio::{io::AsyncReadExt as _, net::UnixStream};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

/// User plus system CPU time of a process so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command (which may hold spaces) start after the last ')'; utime and stime are
    // the 14th and 15th fields of the whole line.
    let rest = &stat[stat.rfind(')').expect("a command") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

#[tokio::test]
async fn with_128_descriptors_200_app_connections_are_refused_cleanly_without_a_busy_loop_and_renewals_go_on() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon =
        Daemon::builder(BIN).config(format!("identity: limited\nnamespace: {ns}\n")).max_open_files(128).start().await;
    let client = daemon.client();
    let request = CampaignRequest {
        election: "limited".into(),
        timing: Some(consistd_testkit::lease_timing(4, 3, 1)),
        ..Default::default()
    };
    let mut states = client.leadership().campaign(request).await.expect("campaign").into_inner();
    loop {
        let s = states.message().await.expect("campaign").expect("a state").status.expect("status");
        if s.state() == LeadershipState::Leader {
            break;
        }
    }

    // 200 connections at once: at most 64 (half of 128) are held, the rest closed at once.
    let mut open = Vec::new();
    for _ in 0..200 {
        open.push(UnixStream::connect(daemon.socket()).await.expect("connect"));
    }
    let mut closed = 0;
    for stream in &mut open {
        let mut byte = [0u8; 1];
        // An accepted connection gets the server's HTTP/2 preface; a refused one ends.
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await {
            closed += 1;
        }
    }
    assert!(closed >= 200 - 64, "{closed} of 200 connections were closed; at most 64 may be held");

    // No busy loop: over 5 s with all of them open, the daemon uses little CPU (a spin would use a core).
    let ticks_per_second = 100; // USER_HZ on Linux
    let before = cpu_ticks(daemon.pid());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let used = cpu_ticks(daemon.pid()) - before;
    assert!(used < 5 * ticks_per_second / 2, "{used} ticks of CPU in 5 s: a busy loop");

    // Renewals went on: still LEADER after more than the renew deadline, asked on the connection held.
    let status = client
        .leadership()
        .get_leadership(GetLeadershipRequest { election: "limited".into(), ..Default::default() })
        .await
        .expect("GetLeadership on a connection opened before")
        .into_inner()
        .status
        .expect("status");
    assert_eq!(status.state(), LeadershipState::Leader, "{status:?}; log:\n{}", daemon.logs());
    assert!(daemon.logs().contains("app connection refused"), "the refusals are logged:\n{}", daemon.logs());

    // Once the others close, a new client is served.
    drop(open);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fresh = consistd_client::Client::new(daemon.socket());
    fresh.wait_ready(Duration::from_secs(10)).await.expect("a new connection is served");
}
