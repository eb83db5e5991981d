//! Fencing benchmark against the real control plane (`make bench`), with manifests/fencing installed
//! (hack/control-plane.sh applies it), printing:
//!
//! 1. the window that remains: a Lease moves to the next term, and from the moment the apiserver answered
//!    that write, writes claiming the term before it are sent back to back (dry runs, which admission
//!    checks as it checks any write) until the first is refused. The policy reads Leases from the
//!    apiserver's informer, so this is how long the apiserver still admits a term that is over;
//! 2. the Lease check against the token on the object, side by side, under Lease churn: in each of 1,000
//!    rounds a successor moves the Lease to the next term and writes an object (stamping it with its claim)
//!    while a deposed leader's writes claiming the term before race it, back to back, to that object and to
//!    one never stamped (which only the Lease check guards). Counted: old-term writes that landed after the
//!    successor's write (by resourceVersion, on the stamped object) and after the Lease write's answer (on
//!    the other);
//! 3. what fencing costs a write: a guarded patch through the daemon with fencing at the apiserver against
//!    the same patch unguarded, side by side;
//! 4. what an idle follower daemon costs the apiserver with fencing installed: every request its own user
//!    made over [`IDLE`], from the apiserver's audit log, by verb and resource.
//!
//! Not a test: it measures and prints.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

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
/// Rounds of the race between a successor and a deposed leader's writes.
const RACES: u64 = 1_000;
/// Old-term writes sent in each race after the successor's write was answered (each to both objects).
const AFTER: usize = 3;
/// Leases other writers keep patching meanwhile, so the apiserver's Lease informer has work to do.
const CHURN: usize = 50;
/// How long the follower is watched idle.
const IDLE: Duration = Duration::from_secs(240);
/// The user the idle follower daemon authenticates as, so the audit log tells its requests apart.
const FOLLOWER: &str = "consistd-bench-follower";
const WRITES: usize = 200;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summary(samples: &mut [f64]) -> String {
    samples.sort_by(f64::total_cmp);
    let q = |q: f64| figures::quantile(samples, q).unwrap_or(f64::NAN);
    format!("p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms", q(0.5), q(0.99), samples.last().copied().unwrap_or(f64::NAN))
}

/// A merge patch of ConfigMap `name` with `pp`, as the admin impersonating itself with `claim`
/// ("<lease namespace>/<lease>/<term>"): the written object, or `None` when one of the fencing policies
/// refused it.
async fn claimed_patch(
    kube: &kube::Client,
    ns: &str,
    name: &str,
    claim: &str,
    pp: &PatchParams,
    body: serde_json::Value,
) -> Option<ConfigMap> {
    let mut request = Request::new(format!("/api/v1/namespaces/{ns}/configmaps"))
        .patch(name, pp, &Patch::Merge(body))
        .expect("build the patch");
    let headers = request.headers_mut();
    let value = |v: &str| HeaderValue::from_str(v).expect("header");
    headers.insert("impersonate-user", value("consistd-admin"));
    headers.insert("impersonate-group", value("system:masters"));
    headers.insert("impersonate-extra-consistd.io%2ffence", value(claim));
    match kube.request::<ConfigMap>(request).await {
        Ok(cm) => Some(cm),
        Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy 'consistd-fence") => None,
        Err(e) => panic!("claimed patch of {name}: {e}"),
    }
}

/// A dry-run merge patch of the ConfigMap, claiming `term` of election `lease`: whether the apiserver
/// admitted it.
async fn admitted(kube: &kube::Client, ns: &str, lease: &str, term: u64) -> bool {
    let pp = PatchParams { dry_run: true, ..PatchParams::default() };
    let claim = format!("{ns}/{lease}/{term}");
    claimed_patch(kube, ns, "fenced", &claim, &pp, json!({ "data": { "k": "v" } })).await.is_some()
}

/// Creates election Lease `name` (labelled as consistd's, so the Lease policy takes it as a parameter), held
/// by `holder` in term 1.
async fn election_lease(leases: &Api<Lease>, name: &str, holder: &str) {
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app.kubernetes.io/managed-by": "consistd" } },
        "spec": { "holderIdentity": holder, "leaseTransitions": 0 }
    }))
    .expect("Lease");
    leases.create(&PostParams::default(), &lease).await.unwrap_or_else(|e| panic!("create Lease {name}: {e}"));
}

async fn window(kube: &kube::Client, ns: &str) -> Vec<f64> {
    let leases: Api<Lease> = Api::namespaced(kube.clone(), ns);
    election_lease(&leases, "window", "bench").await;
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

/// A real merge patch of ConfigMap `name`, claiming `claim`, setting `body`: the written object's
/// resourceVersion, or `None` when one of the fencing policies refused it.
async fn claimed_write(kube: &kube::Client, ns: &str, name: &str, claim: &str, body: serde_json::Value) -> Option<u64> {
    let written = claimed_patch(kube, ns, name, claim, &PatchParams::default(), body).await?;
    Some(written.metadata.resource_version.and_then(|v| v.parse().ok()).expect("a numeric resourceVersion"))
}

/// Patches [`CHURN`] election Leases in `ns` one after another until `stop`: the apiserver's Lease informer
/// sees a steady stream of events, as in a cluster with many elections and node heartbeats.
async fn churn(kube: kube::Client, ns: String, stop: Arc<AtomicBool>) -> u64 {
    let leases: Api<Lease> = Api::namespaced(kube, &ns);
    for i in 0..CHURN {
        election_lease(&leases, &format!("churn-{i}"), "churn").await;
    }
    let mut writes = 0;
    while !stop.load(Ordering::Relaxed) {
        let i = usize::try_from(writes).expect("count") % CHURN;
        let renew = json!({ "spec": { "holderIdentity": format!("churn-{writes}") } });
        leases.patch(&format!("churn-{i}"), &PatchParams::default(), &Patch::Merge(renew)).await.expect("churn");
        writes += 1;
    }
    writes
}

/// [`RACES`] rounds of a successor's Lease write and stamped write against a deposed leader's writes of the
/// term before, under Lease churn: (old-term writes that landed on the stamped object after the successor's
/// write, old-term writes admitted on the unstamped one after the Lease write's answer, old-term writes sent
/// after the successor's write in all).
async fn race(kube: &kube::Client, ns: &str) -> (u64, u64, u64) {
    let leases: Api<Lease> = Api::namespaced(kube.clone(), ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(kube.clone(), ns);
    election_lease(&leases, "race", "bench").await;
    for name in ["stamped", "unstamped"] {
        let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": name } })).expect("ConfigMap");
        configmaps.create(&PostParams::default(), &cm).await.expect("create a ConfigMap");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churning = consistd_testkit::spawn(churn(kube.clone(), consistd_testkit::namespace(kube).await, stop.clone()));
    let claim = |term: u64| format!("{ns}/race/{term}");
    let (mut landed_on_token, mut admitted_by_lease, mut sent_after) = (0, 0, 0);
    for term in 1..=RACES {
        // The successor: the Lease moves to term + 1, then its write stamps the object with its claim.
        let successor = async {
            let next = json!({ "spec": { "leaseTransitions": term } });
            leases.patch("race", &PatchParams::default(), &Patch::Merge(next)).await.expect("next term");
            let lease_answered = Instant::now();
            let stamp = json!({ "metadata": { "annotations": { "consistd.io/fence": claim(term + 1) } }, "data": { "by": "successor" } });
            let stamped = claimed_write(kube, ns, "stamped", &claim(term + 1), stamp).await;
            (lease_answered, stamped.expect("the successor's write is admitted"), Instant::now())
        };
        // The deposed leader: writes claiming `term`, back to back, until AFTER more once the successor wrote.
        let deposed = async {
            let mut writes = Vec::new();
            let mut after = 0;
            let started = Instant::now();
            while after < AFTER {
                let sent = Instant::now();
                let body = || json!({ "data": { "by": "deposed" } });
                let old = claim(term);
                let (on_token, on_lease) = tokio::join!(
                    claimed_write(kube, ns, "stamped", &old, body()),
                    claimed_write(kube, ns, "unstamped", &old, body()),
                );
                writes.push((sent, on_token, on_lease));
                if on_token.is_none() {
                    after += 1;
                }
                assert!(started.elapsed() < Duration::from_secs(30), "the old term was never refused");
            }
            writes
        };
        let ((lease_answered, stamp_version, stamp_answered), writes) = tokio::join!(successor, deposed);
        for (sent, on_token, on_lease) in writes {
            if on_token.is_some_and(|v| v > stamp_version) {
                landed_on_token += 1;
            }
            if sent > lease_answered && on_lease.is_some() {
                admitted_by_lease += 1;
            }
            if sent > stamp_answered {
                sent_after += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = format!("{RACES} rounds");
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    for (series, count) in [
        ("landed after the successor's write (token on the object)", landed_on_token),
        ("admitted after the Lease write (Lease check only)", admitted_by_lease),
    ] {
        figures::record("fencing-race", "old-term writes", series, rounds.as_str(), count as f64);
    }
    let churned = churning.await.expect("churn");
    println!("  Lease churn meanwhile: {churned} Lease writes to {CHURN} other election Leases");
    (landed_on_token, admitted_by_lease, sent_after)
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

    println!("a successor's write racing a deposed leader's old-term writes, {RACES} rounds, {CHURN} Leases churning:");
    let (landed, admitted, sent_after) = race(&kube, &ns).await;
    println!(
        "  with the token on the object:   {landed} old-term writes landed after the successor's write ({sent_after} sent after it)"
    );
    println!(
        "  with the Lease check only:      {admitted} old-term writes admitted after the Lease write was answered"
    );

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
    idle_follower(&kube, &ns).await;
    drop(states);
}

/// Every request an idle follower daemon (its own user, a cluster admin) makes over [`IDLE`], from the audit
/// log, while the bench's daemon leads the election it campaigns in.
async fn idle_follower(kube: &kube::Client, ns: &str) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;

    let dir = tempfile::tempdir().expect("a directory for the follower's kubeconfig");
    let kubeconfig = consistd_testkit::kubeconfig_for_user(FOLLOWER, dir.path());
    let bindings: Api<ClusterRoleBinding> = Api::all(kube.clone());
    let admin: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": FOLLOWER },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": FOLLOWER }]
    }))
    .expect("ClusterRoleBinding");
    let _ = bindings.delete(FOLLOWER, &kube::api::DeleteParams::default()).await;
    bindings.create(&PostParams::default(), &admin).await.expect("make the follower's user an admin");
    let starting = consistd_testkit::audit_offset();
    let follower = Daemon::builder(BIN)
        .config(format!("identity: follower\nnamespace: {ns}\n"))
        .env("KUBECONFIG", kubeconfig.display().to_string())
        .start()
        .await;
    let request = CampaignRequest { election: "bench".into(), ..Default::default() };
    let mut states = follower.client().leadership().campaign(request).await.expect("campaign").into_inner();
    loop {
        let s = states.message().await.expect("campaign").expect("a state").status.expect("status");
        if s.state() == LeadershipState::Follower {
            break;
        }
    }
    loop {
        let report = consistd_server::admin::fetch_report(follower.admin_socket()).await.expect("consistd status");
        if report.fencing.is_some_and(|f| f.at_apiserver) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let offset = consistd_testkit::audit_offset();
    // Its start, as a check that the audit log tells its requests apart.
    let started: u64 = requests_of(FOLLOWER, starting).values().sum();
    tokio::time::sleep(IDLE).await;
    let requests = requests_of(FOLLOWER, offset);
    let total: u64 = requests.values().sum();
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let per_second = total as f64 / IDLE.as_secs_f64();
    figures::record(
        "fencing-idle",
        "apiserver requests/s",
        "an idle follower, fencing installed",
        "follower",
        per_second,
    );
    println!(
        "an idle follower daemon with fencing installed, {} s: {total} requests ({per_second:.4}/s) {requests:?} \
         (its start: {started} requests)",
        IDLE.as_secs()
    );
    drop(states);
    drop(follower);
    bindings.delete(FOLLOWER, &kube::api::DeleteParams::default()).await.expect("remove the follower's grant");
}

/// The requests `user` made since audit-log offset `from`, counted by verb and resource.
fn requests_of(user: &str, from: u64) -> std::collections::BTreeMap<String, u64> {
    let mut requests = std::collections::BTreeMap::new();
    for event in consistd_testkit::audit_events(from) {
        if event["stage"] == "ResponseComplete" && event["user"]["username"] == user {
            let verb = event["verb"].as_str().unwrap_or("?");
            let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
            *requests.entry(format!("{verb} {resource}")).or_insert(0) += 1;
        }
    }
    requests
}
