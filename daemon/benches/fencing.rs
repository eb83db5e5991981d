//! Fencing benchmark against the real control plane (`make bench`), with manifests/fencing installed
//! (hack/control-plane.sh applies it), printing:
//!
//! 1. the window that remains: a Lease moves to the next term, and from the moment the apiserver answered
//!    that write, writes claiming the term before it are sent back to back (dry runs, which admission
//!    checks as it checks any write) until the first is refused. The policy reads Leases from the
//!    apiserver's informer, so this is how long the apiserver still admits a term that is over;
//! 2. what fencing costs a write: a guarded patch through the daemon with fencing at the apiserver against
//!    the same patch unguarded, side by side.
//!
//! Not a test: it measures and prints.

use std::time::{Duration, Instant};

use consistd_client::proto::{CampaignRequest, LeadershipState, PatchRequest, PatchType, WriteGuard};
use consistd_testkit::{Daemon, figures};
use http::HeaderValue;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    core::Request,
};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const ROUNDS: usize = 50;
const WRITES: usize = 200;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summary(samples: &mut [f64]) -> String {
    samples.sort_by(f64::total_cmp);
    let q = |q: f64| figures::quantile(samples, q).unwrap_or(f64::NAN);
    format!("p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms", q(0.5), q(0.99), samples.last().copied().unwrap_or(f64::NAN))
}

/// A dry-run merge patch of the ConfigMap, as the admin impersonating itself with a claim of `term`:
/// whether the apiserver admitted it.
async fn admitted(kube: &kube::Client, ns: &str, lease: &str, term: u64) -> bool {
    let pp = PatchParams { dry_run: true, ..PatchParams::default() };
    let body = Patch::Merge(json!({ "data": { "k": "v" } }));
    let mut request = Request::new(format!("/api/v1/namespaces/{ns}/configmaps"))
        .patch("fenced", &pp, &body)
        .expect("build the patch");
    let headers = request.headers_mut();
    let value = |v: &str| HeaderValue::from_str(v).expect("header");
    headers.insert("impersonate-user", value("consistd-admin"));
    headers.insert("impersonate-group", value("system:masters"));
    headers.insert("impersonate-extra-consistd.io%2ffence", value(&format!("{ns}/{lease}/{term}")));
    match kube.request::<ConfigMap>(request).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy 'consistd-fence'") => false,
        Err(e) => panic!("dry-run patch: {e}"),
    }
}

async fn window(kube: &kube::Client, ns: &str) -> Vec<f64> {
    let leases: Api<Lease> = Api::namespaced(kube.clone(), ns);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "window", "labels": { "app.kubernetes.io/managed-by": "consistd" } },
        "spec": { "holderIdentity": "bench", "leaseTransitions": 0 }
    }))
    .expect("Lease");
    leases.create(&PostParams::default(), &lease).await.expect("create the Lease");
    let mut windows = Vec::new();
    let mut stale_admitted = 0;
    for round in 1..=ROUNDS {
        // Wait until the current term is admitted: the policy has seen the Lease as it is now.
        let term = u64::try_from(round).expect("round");
        while !admitted(kube, ns, "window", term).await {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let next = json!({ "spec": { "leaseTransitions": round } });
        leases.patch("window", &PatchParams::default(), &Patch::Merge(next)).await.expect("next term");
        let answered = Instant::now();
        while admitted(kube, ns, "window", term).await {
            stale_admitted += 1;
        }
        windows.push(ms(answered.elapsed()));
        figures::record("fencing-window", "ms", "term over → first refusal", round, ms(answered.elapsed()));
    }
    println!(
        "  writes with the old term admitted after the Lease write was answered: {stale_admitted} in {ROUNDS} rounds"
    );
    windows
}

async fn write_latency(daemon: &Daemon, ns: &str, guard: Option<WriteGuard>) -> Vec<f64> {
    let client = daemon.client();
    let mut samples = Vec::new();
    for i in 0..WRITES {
        let request = PatchRequest {
            resource: "configmaps".into(),
            namespace: ns.into(),
            name: "fenced".into(),
            patch_type: PatchType::Merge.into(),
            patch: json!({ "data": { "k": i.to_string() } }).to_string().into_bytes(),
            guard: guard.clone(),
            ..Default::default()
        };
        let sent = Instant::now();
        client.objects().patch(request).await.expect("patch");
        samples.push(ms(sent.elapsed()));
    }
    samples
}

#[tokio::main]
async fn main() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": "fenced" } })).expect("ConfigMap");
    Api::<ConfigMap>::namespaced(kube.clone(), &ns).create(&PostParams::default(), &cm).await.expect("ConfigMap");

    println!(
        "fencing at the apiserver ({ROUNDS} terms): from a Lease write's answer to the first refusal of the term before it"
    );
    let mut windows = window(&kube, &ns).await;
    println!("  window: {}", summary(&mut windows));

    let daemon = Daemon::builder(BIN).config(format!("identity: bench\nnamespace: {ns}\n")).start().await;
    let request = CampaignRequest { election: "bench".into(), ..Default::default() };
    let mut states = daemon.client().leadership().campaign(request).await.expect("campaign").into_inner();
    let term = loop {
        let s = states.message().await.expect("campaign").expect("a state").status.expect("status");
        if s.state() == LeadershipState::Leader {
            break s.term;
        }
    };
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("consistd status");
        if report.fencing.is_some_and(|f| f.at_apiserver) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let guard = WriteGuard { election: "bench".into(), namespace: String::new(), term };
    println!("a patch through the daemon, {WRITES} in a row:");
    let mut plain = write_latency(&daemon, &ns, None).await;
    figures::record_distribution("fencing-write", "ms", "unguarded", &plain);
    let mut fenced = write_latency(&daemon, &ns, Some(guard)).await;
    figures::record_distribution("fencing-write", "ms", "guarded, fenced at the apiserver", &fenced);
    println!("  unguarded:                        {}", summary(&mut plain));
    println!("  guarded, fenced at the apiserver: {}", summary(&mut fenced));
    drop(states);
}
