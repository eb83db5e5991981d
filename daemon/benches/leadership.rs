//! Leadership benchmark against the real control plane (`make bench`), with client-go's default timing
//! (lease 15 s, renew deadline 10 s, retry period 2 s), printing:
//!
//! 1. graceful handover: the leader's app closes its Campaign stream, until the other app is told LEADER;
//! 2. handover on request: the Lease's `consistd.io/preferred-holder` names the follower (as `kubectl consistd
//!    handover` writes it), until the follower's app is told LEADER (and when the old leader's app was told it
//!    no longer leads, which must come first);
//! 3. crash failover: kill -9 of the leader's daemon, until the other app is told LEADER;
//! 4. notification latency: from the daemon observing a state (its observed_at) to the app receiving it.
//!
//! Not a test: it measures and prints.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use consistd_client::proto::{CampaignRequest, LeadershipState};
use consistd_core::lease::PREFERRED_HOLDER_ANNOTATION;
use consistd_testkit::{Daemon, figures};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use nix::sys::signal::Signal;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const HANDOVERS: usize = 10;

/// Per daemon: whether its app was last told LEADER; how often an app was told LEADER while the other's
/// last state was still LEADER (as this process received them); notification latencies seen (ms).
#[derive(Default)]
struct Seen {
    leader: [bool; 2],
    overlaps: usize,
    latencies_ms: Vec<f64>,
}

type Shared = Arc<Mutex<Seen>>;

async fn open(daemon: &Daemon, i: usize, seen: Shared) -> tokio::task::JoinHandle<()> {
    let request = CampaignRequest { election: "bench".into(), ..Default::default() };
    let mut stream = daemon.client().leadership().campaign(request).await.expect("campaign").into_inner();
    consistd_testkit::spawn(async move {
        while let Ok(Some(m)) = stream.message().await {
            let received = SystemTime::now();
            let s = m.status.expect("status");
            let mut seen = seen.lock().expect("lock");
            let leads = s.state() == LeadershipState::Leader;
            if leads && !seen.leader[i] && seen.leader[1 - i] {
                seen.overlaps += 1;
            }
            seen.leader[i] = leads;
            if let Some(observed) = s.observed_at.and_then(|t| SystemTime::try_from(t).ok())
                && let Ok(latency) = received.duration_since(observed)
            {
                seen.latencies_ms.push(latency.as_secs_f64() * 1e3);
            }
        }
    })
}

async fn wait_leader(seen: &Shared, i: usize) -> Duration {
    let start = Instant::now();
    while !seen.lock().expect("lock").leader[i] {
        assert!(start.elapsed() < Duration::from_secs(60), "daemon {i} never became leader");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    start.elapsed()
}

fn leader(seen: &Shared) -> Option<usize> {
    let s = seen.lock().expect("lock");
    (0..2).find(|&i| s.leader[i])
}

fn summary(v: &[f64]) -> String {
    let p = |q: f64| figures::quantile(v, q).unwrap_or(f64::NAN);
    format!("p50 {:.3} | p99 {:.3} | max {:.3} (n={})", p(0.5), p(0.99), p(1.0), v.len())
}

#[tokio::main]
async fn main() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let config = |id: &str| format!("identity: {id}\nnamespace: {ns}\nlog:\n  level: warn\n");
    let daemons = [
        Daemon::builder(BIN).config(config("bench-a")).start().await,
        Daemon::builder(BIN).config(config("bench-b")).start().await,
    ];
    let seen: Shared = Arc::default();
    let mut streams = [open(&daemons[0], 0, seen.clone()).await, open(&daemons[1], 1, seen.clone()).await];

    // 1. Graceful handovers.
    let mut handovers = Vec::new();
    for _ in 0..HANDOVERS {
        let from = loop {
            if let Some(l) = leader(&seen) {
                break l;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        streams[from].abort();
        seen.lock().expect("lock").leader[from] = false;
        handovers.push(wait_leader(&seen, 1 - from).await.as_secs_f64() * 1e3);
        streams[from] = open(&daemons[from], from, seen.clone()).await;
    }

    // 2. Handovers on request: the Lease asks for the follower.
    let leases: Api<Lease> = Api::namespaced(kube.clone(), &ns);
    let identities = ["bench-a", "bench-b"];
    let mut requested = Vec::new();
    let overlaps_before = seen.lock().expect("lock").overlaps;
    for _ in 0..HANDOVERS {
        let from = loop {
            if let Some(l) = leader(&seen) {
                break l;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let ask =
            serde_json::json!({ "metadata": { "annotations": { PREFERRED_HOLDER_ANNOTATION: identities[1 - from] } } });
        let asked = Instant::now();
        leases.patch("bench", &PatchParams::default(), &Patch::Merge(ask)).await.expect("ask for a handover");
        wait_leader(&seen, 1 - from).await;
        requested.push(asked.elapsed().as_secs_f64() * 1e3);
    }
    let overlapped = seen.lock().expect("lock").overlaps - overlaps_before;

    // 3. Crash failover: kill -9 the leader's daemon.
    let from = leader(&seen).expect("a leader");
    daemons[from].signal(Signal::SIGKILL);
    let failover = wait_leader(&seen, 1 - from).await;

    let latencies = std::mem::take(&mut seen.lock().expect("lock").latencies_ms);
    println!("consistd leadership benchmark (client-go default timing: lease 15 s, renew deadline 10 s, retry 2 s)");
    println!();
    println!("| measure | ms |");
    println!("| --- | --- |");
    if let Some(p50) = figures::median(&handovers) {
        figures::record("handover", "graceful handover p50, ms", "consistd", "2 candidates", p50);
    }
    println!("| graceful handover (stream closed -> other app told LEADER) | {} |", summary(&handovers));
    if let Some(p50) = figures::median(&requested) {
        figures::record("handover", "handover on request p50, ms", "consistd", "2 candidates", p50);
    }
    println!(
        "| handover on request (Lease asks for the follower -> its app told LEADER; told while the other app was still LEADER: {overlapped} of {}) | {} |",
        requested.len(),
        summary(&requested)
    );
    println!("| crash failover (kill -9 -> other app told LEADER) | {:.0} |", failover.as_secs_f64() * 1e3);
    println!("| notification latency (daemon observed -> app received) | {} |", summary(&latencies));
}
