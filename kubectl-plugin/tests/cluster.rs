//! `kubectl consistd elections` and `rollout status` run as the built binary against the real control
//! plane, with real consistd daemons campaigning, publishing and reporting through the Rust SDK.

use std::{
    process::Output,
    time::{Duration, Instant},
};

use consistd_client::proto::{
    CampaignRequest, CampaignResponse, GetLeadershipRequest, LeaseTiming, PublishRequest, ReportAppliedRequest,
};
use consistd_testkit::{Daemon, free_port};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::api::{Api, PostParams};
use serde_json::Value;
use tonic::Streaming;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-consistd");

/// What a run of `kubectl consistd ARGS` came to.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the plugin with the test control plane's kubeconfig (as `KUBECONFIG`, the way kubectl finds it).
async fn kubectl(args: &[&str]) -> Run {
    kubectl_with(args, &consistd_testkit::kubeconfig()).await
}

async fn kubectl_with(args: &[&str], kubeconfig: &std::path::Path) -> Run {
    let Output { status, stdout, stderr } = tokio::process::Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .expect("run kubectl-consistd");
    Run {
        code: status.code().expect("exit code"),
        stdout: String::from_utf8(stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(stderr).expect("UTF-8 stderr"),
    }
}

/// A daemon in `ns` that announces itself to election groups (so it has member Leases), a 3 s membership TTL.
async fn daemon(ns: &str, identity: &str) -> Daemon {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "identity: {identity}\nnamespace: {ns}\npeer:\n  listen: {addr}\n  advertise: {addr}\n  insecure: true\nmembership:\n  ttl: 3s\n"
    );
    Daemon::builder(consistd_testkit::consistd_bin()).config(config).start().await
}

async fn campaign(daemon: &Daemon, election: &str) -> Streaming<CampaignResponse> {
    let secs = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
    let request = CampaignRequest {
        election: election.to_owned(),
        timing: Some(LeaseTiming { lease_duration: secs(4), renew_deadline: secs(3), retry_period: secs(1) }),
        ..Default::default()
    };
    daemon.client().leadership().campaign(request).await.expect("Campaign").into_inner()
}

/// (holder, term) of `election` as `daemon` sees it; holder empty when none.
async fn leadership(daemon: &Daemon, election: &str) -> (String, u64) {
    let request = GetLeadershipRequest { election: election.to_owned(), namespace: String::new() };
    let status = daemon.client().leadership().get_leadership(request).await.expect("GetLeadership").into_inner();
    let status = status.status.expect("status");
    (status.holder, status.term)
}

/// (holder, term) of `election` once `daemon` has seen a holder: a campaigner's view comes from its own
/// runner's last step, which may still be in flight (or retrying a conflict) when the Lease already names
/// the holder.
async fn leadership_seen(daemon: &Daemon, election: &str) -> (String, u64) {
    let started = Instant::now();
    loop {
        let (holder, term) = leadership(daemon, election).await;
        if !holder.is_empty() {
            return (holder, term);
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{election}: the daemon never saw a holder");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `elections -n NS -o json` until `done` holds for election `name`'s object; returns it.
async fn election_json(ns: &str, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let run = kubectl(&["elections", "-n", ns, "-o", "json"]).await;
        assert_eq!(run.code, 0, "{run:?}");
        let rows: Vec<Value> = serde_json::from_str(&run.stdout).expect("elections -o json is a JSON array");
        if let Some(row) = rows.iter().find(|r| r["election"] == name)
            && done(row)
        {
            return row.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "election {name} never came to the state: {rows:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The whitespace-separated cells of the table row whose first cells are `first`.
/// Runs `kubectl consistd ARGS` until `done` says the run shows what it waits for (at most 10 s): a
/// member's report reaches the Leases when the channel's leader records it, a moment after ReportApplied.
async fn kubectl_until(args: &[&str], done: impl Fn(&Run) -> bool) -> Run {
    let started = Instant::now();
    loop {
        let run = kubectl(args).await;
        if done(&run) || started.elapsed() > Duration::from_secs(10) {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn row<'a>(table: &'a str, first: &[&str]) -> Vec<&'a str> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.starts_with(first))
        .unwrap_or_else(|| panic!("no row starting {first:?} in:\n{table}"))
}

#[tokio::test]
async fn elections_show_the_holder_term_and_members_and_none_once_released() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let (a, b) = (daemon(&ns, "a").await, daemon(&ns, "b").await);
    let a_campaign = campaign(&a, "web").await;
    let b_campaign = campaign(&b, "web").await;

    // Both members, one holder: the table and JSON say what the daemons say.
    let json = election_json(&ns, "web", |r| r["holder"].is_string() && r["members"] == 2).await;
    let (holder, term) = leadership_seen(&a, "web").await;
    assert_eq!((json["holder"].as_str(), json["term"].as_u64()), (Some(holder.as_str()), Some(term)), "{json}");
    assert_eq!(term, 1);
    assert!(json["renewed"].as_u64().expect("renewed seconds") < 10, "{json}");
    assert_eq!(json["namespace"], ns.as_str());
    let run = kubectl(&["elections", "-n", &ns]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout.lines().next().map(str::split_whitespace).map(Iterator::collect::<Vec<_>>),
        Some(vec!["ELECTION", "HOLDER", "TERM", "RENEWED", "MEMBERS"]),
        "{}",
        run.stdout
    );
    let cells = row(&run.stdout, &["web"]);
    assert_eq!((cells[1], cells[2], cells[4]), (holder.as_str(), "1", "2"), "{}", run.stdout);
    assert!(cells[3].ends_with('s'), "RENEWED is an age: {}", run.stdout);
    // Member Leases are counted, not listed.
    assert_eq!(run.stdout.lines().count(), 2, "{}", run.stdout);

    // -A: every namespace, with a NAMESPACE column.
    let all = kubectl(&["elections", "-A"]).await;
    assert_eq!(all.code, 0, "{all:?}");
    assert!(all.stdout.starts_with("NAMESPACE"), "{}", all.stdout);
    let cells = row(&all.stdout, &[ns.as_str(), "web"]);
    assert_eq!(cells[2], holder.as_str(), "{}", all.stdout);
    let all_json: Vec<Value> =
        serde_json::from_str(&kubectl(&["elections", "-A", "-o", "json"]).await.stdout).expect("JSON");
    assert!(all_json.iter().any(|r| r["namespace"] == ns.as_str() && r["election"] == "web"), "{all_json:?}");

    // The holder resigns: the other takes over in the next term, one member left.
    let (leader_stream, other, other_stream) =
        if holder == "a" { (a_campaign, &b, b_campaign) } else { (b_campaign, &a, a_campaign) };
    drop(leader_stream);
    let next = if holder == "a" { "b" } else { "a" };
    let json = election_json(&ns, "web", |r| r["holder"] == next && r["members"] == 1).await;
    assert_eq!(json["term"], 2, "{json}");
    assert_eq!(leadership(other, "web").await, (next.to_owned(), 2));
    let cells = row(&kubectl(&["elections", "-n", &ns]).await.stdout, &["web"]).join(" ");
    assert!(cells.starts_with(&format!("web {next} 2 ")) && cells.ends_with(" 1"), "{cells}");

    // The last one resigns: the Lease is released (no holder), no members.
    drop(other_stream);
    let json = election_json(&ns, "web", |r| r["holder"].is_null() && r["members"] == 0).await;
    assert_eq!(json["term"], 2, "{json}");
    let cells = row(&kubectl(&["elections", "-n", &ns]).await.stdout, &["web"]).join(" ");
    assert!(cells.starts_with("web <none> 2 ") && cells.ends_with(" 0"), "{cells}");
}

/// `handover --to` the follower: the leader steps down, the follower leads in the next term, and the plugin
/// says so; asking for the holder itself writes nothing; an election that does not exist, a Lease that is not
/// consistd's and a candidate that never comes fail with exit 1 naming why.
#[tokio::test]
async fn handover_moves_an_election_to_the_candidate_asked_for_in_the_next_term() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let (a, b) = (daemon(&ns, "a").await, daemon(&ns, "b").await);
    let _a_campaign = campaign(&a, "web").await;
    let _b_campaign = campaign(&b, "web").await;
    let (holder, term) = leadership_seen(&a, "web").await;
    let next = if holder == "a" { "b" } else { "a" };

    let run = kubectl(&["handover", "web", "--to", next, "-n", &ns]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.starts_with(&format!("web handed over to {next} in term {}", term + 1)), "{run:?}");
    let json = election_json(&ns, "web", |r| r["holder"] == next).await;
    assert_eq!(json["term"], term + 1, "{json}");
    for daemon in [&a, &b] {
        let started = Instant::now();
        while leadership(daemon, "web").await != (next.to_owned(), term + 1) {
            assert!(started.elapsed() < Duration::from_secs(10), "a daemon did not see {next} lead");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let run = kubectl(&["handover", "web", "--to", next, "-n", &ns]).await;
    assert_eq!((run.code, run.stdout.trim()), (0, format!("{next} already holds web (term {})", term + 1).as_str()));

    let run = kubectl(&["handover", "nosuch", "--to", next, "-n", &ns]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains(&format!("no election nosuch in namespace {ns}")), "{run:?}");
    create_lease(&kube, &ns, "foreign", None, "x", 0, 0).await;
    let run = kubectl(&["handover", "foreign", "--to", "y", "-n", &ns]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("is not a consistd election"), "{run:?}");

    // A candidate that is not campaigning: the holder steps down, and a lease duration (4 s) later a
    // campaigner takes the Lease back in a new term; the plugin names who did.
    let run = kubectl(&["handover", "web", "--to", "gone", "-n", &ns, "--wait", "20s"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("gone did not take web (is it campaigning?)"), "{run:?}");
}

/// The label consistd puts on the Leases it writes, and `elections` lists by.
const CONSISTD: (&str, &str) = ("app.kubernetes.io/managed-by", "consistd");

/// Creates Lease `name` in `ns` held by `holder`, renewed `renewed_ago` seconds ago for 10 s, labelled
/// `label` if any.
async fn create_lease(
    kube: &kube::Client,
    ns: &str,
    name: &str,
    label: Option<(&str, &str)>,
    holder: &str,
    renewed_ago: i64,
    transitions: i32,
) {
    let renewed = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(renewed_ago);
    let labels: serde_json::Map<String, Value> = label.into_iter().map(|(k, v)| (k.to_owned(), v.into())).collect();
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 10, "leaseTransitions": transitions,
                 "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(renewed)}
    }))
    .expect("Lease");
    Api::<Lease>::namespaced(kube.clone(), ns).create(&PostParams::default(), &lease).await.expect("create Lease");
}

#[tokio::test]
async fn only_consistds_leases_are_elections_and_one_written_before_the_label_gets_it_from_its_next_leader() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    // Another app's live election (client-go's, say), and one a consistd wrote before it labelled its
    // Leases, its holder gone.
    create_lease(&kube, &ns, "other-app", None, "someone", 0, 0).await;
    create_lease(&kube, &ns, "legacy", None, "old-daemon", 60, 0).await;
    let none = kubectl(&["elections", "-n", &ns]).await;
    assert_eq!((none.code, none.stdout.as_str()), (0, ""), "{none:?}");
    assert!(none.stderr.contains("No elections found"), "{none:?}");
    let all: Vec<Value> =
        serde_json::from_str(&kubectl(&["elections", "-A", "-o", "json"]).await.stdout).expect("JSON");
    assert!(!all.iter().any(|r| r["namespace"] == ns.as_str()), "{all:?}");
    assert!(!all.iter().any(|r| r["namespace"] == "kube-system"), "the control plane's Leases: {all:?}");

    // A daemon takes the old election over: its renewal labels the Lease, which is listed from then on;
    // its member Lease carries the label too.
    let a = daemon(&ns, "a").await;
    let _campaign = campaign(&a, "legacy").await;
    let json = election_json(&ns, "legacy", |r| r["holder"] == "a" && r["members"] == 1).await;
    assert_eq!(json["term"], 2, "{json}");
    let leases = Api::<Lease>::namespaced(kube.clone(), &ns);
    let labelled = |l: Lease| l.metadata.labels.and_then(|mut m| m.remove(CONSISTD.0));
    let legacy = leases.get("legacy").await.expect("get Lease legacy");
    assert_eq!(labelled(legacy).as_deref(), Some(CONSISTD.1));
    let member = leases.get("legacy.member.a").await.expect("get member Lease");
    assert_eq!(labelled(member).as_deref(), Some(CONSISTD.1));
    // A new election's Lease is created with it.
    let _new = campaign(&a, "new").await;
    election_json(&ns, "new", |r| r["holder"] == "a").await;
    assert_eq!(labelled(leases.get("new").await.expect("get Lease new")).as_deref(), Some(CONSISTD.1));
    let listed = kubectl(&["elections", "-n", &ns]).await;
    assert!(!listed.stdout.contains("other-app"), "{listed:?}");
}

#[tokio::test]
async fn an_expired_lease_has_no_holder_contexts_pick_the_namespace_and_a_refusal_names_the_operation() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    // consistd's Leases: a holder that stopped renewing a minute ago, its 10 s long gone; and one renewed
    // just now.
    for (name, renewed, transitions) in [("stale", 60, 4), ("fresh", 0, 0)] {
        create_lease(&kube, &ns, name, Some(CONSISTD), "ghost", renewed, transitions).await;
    }
    let run = kubectl(&["elections", "-n", &ns]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(row(&run.stdout, &["fresh"])[1..3], ["ghost", "1"], "{}", run.stdout);
    let stale = row(&run.stdout, &["stale"]);
    assert_eq!(stale[1..], ["<none>", "5", "60s", "0"], "{}", run.stdout);
    let json: Vec<Value> =
        serde_json::from_str(&kubectl(&["elections", "-n", &ns, "-o", "json"]).await.stdout).expect("JSON");
    assert_eq!(json[1]["election"], "stale", "sorted: {json:?}");
    assert!(json[1]["holder"].is_null() && json[1]["term"] == 5, "{json:?}");
    assert!((60..65).contains(&json[1]["renewed"].as_u64().expect("seconds")), "{json:?}");

    // The namespace defaults to the context's, and --context / --kubeconfig pick another, as in kubectl.
    let dir = tempfile::tempdir().expect("temp dir");
    let contexts = context_kubeconfig(&ns, dir.path());
    let default_ns = kubectl_with(&["elections"], &contexts).await;
    assert_eq!(default_ns.code, 0, "{default_ns:?}");
    assert_eq!(row(&default_ns.stdout, &["stale"])[1], "<none>", "{default_ns:?}");
    let elsewhere = kubectl_with(&["elections", "--context", "elsewhere", "-o", "json"], &contexts).await;
    assert_eq!(elsewhere.code, 0, "{elsewhere:?}");
    assert!(!elsewhere.stdout.contains("stale"), "{elsewhere:?}");
    let flag = kubectl(&["elections", "--kubeconfig", contexts.to_str().expect("UTF-8 path")]).await;
    assert_eq!(row(&flag.stdout, &["stale"])[1], "<none>", "{flag:?}");

    // A user RBAC grants nothing: exit 1, naming what was refused.
    let nobody = consistd_testkit::kubeconfig_for_user("kubectl-consistd-nobody", dir.path());
    let refused = kubectl_with(&["elections", "-n", &ns], &nobody).await;
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stdout.is_empty(), "{refused:?}");
    let message = refused.stderr.trim();
    assert!(message.starts_with(&format!("kubectl consistd elections: list Leases in namespace {ns}: ")), "{message}");
    assert!(message.contains("forbidden"), "{message}");
}

/// The test kubeconfig with its current context's namespace set to `ns`, and a context "elsewhere" whose
/// namespace is "default"; written to `dir` (as JSON, which kubeconfig files may be).
fn context_kubeconfig(ns: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let admin = kube::config::Kubeconfig::read_from(consistd_testkit::kubeconfig()).expect("read test kubeconfig");
    let mut json = serde_json::to_value(&admin).expect("kubeconfig as JSON");
    let current = json["current-context"].as_str().expect("a current context").to_owned();
    let contexts = json["contexts"].as_array_mut().expect("contexts");
    let mut elsewhere = contexts.iter().find(|c| c["name"] == current.as_str()).expect("current context").clone();
    for c in contexts.iter_mut().filter(|c| c["name"] == current.as_str()) {
        c["context"]["namespace"] = ns.into();
    }
    elsewhere["name"] = "elsewhere".into();
    elsewhere["context"]["namespace"] = "default".into();
    contexts.push(elsewhere);
    let path = dir.join("contexts.kubeconfig");
    std::fs::write(&path, serde_json::to_string(&json).expect("JSON")).expect("write kubeconfig");
    path
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

async fn report(daemon: &Daemon, version: u64) {
    let request = ReportAppliedRequest { channel: "config".to_owned(), version };
    daemon.client().rollout().report_applied(request).await.expect("ReportApplied");
}

#[tokio::test]
async fn rollout_status_exits_0_when_all_applied_and_3_naming_the_laggard() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;

    // Nothing published: the channel does not exist, and the message names its ConfigMap.
    let missing = kubectl(&["rollout", "status", "config", "-n", &ns]).await;
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(missing.stderr.contains("consistd-rollout.config") && missing.stderr.contains(&ns), "{missing:?}");
    assert!(missing.stderr.starts_with("kubectl consistd rollout status: channel config not found"), "{missing:?}");

    let (a, b) = (daemon(&ns, "a").await, daemon(&ns, "b").await);
    let _a_campaign = campaign(&a, "config").await;
    let _b_campaign = campaign(&b, "config").await;
    let started = Instant::now();
    while kube_members(&kube, &ns).await < 2 {
        assert!(started.elapsed() < Duration::from_secs(20), "members did not join");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Publish goes to the channel's leader: until a has seen one, it answers UNAVAILABLE "no replica leads it"
    // (the member Leases are written at join, before either daemon has taken the election's; CI at 75c66d4 did).
    while leadership(&a, "config").await.0.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(20), "a never saw a leader of channel config");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(publish(&a, "v1").await, 1);
    let lagging = kubectl(&["rollout", "status", "config", "-n", &ns]).await;
    assert_eq!(lagging.code, 3, "nobody applied v1 yet: {lagging:?}");
    report(&a, 1).await;
    report(&b, 1).await;

    let run = kubectl_until(&["rollout", "status", "config", "-n", &ns], |run| run.code == 0).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("latest version 1"), "{}", run.stdout);
    assert_eq!(row(&run.stdout, &["a"]), ["a", "1", "applied"], "{}", run.stdout);
    assert_eq!(row(&run.stdout, &["b"]), ["b", "1", "applied"], "{}", run.stdout);
    assert!(!run.stdout.contains("LAGGING"), "{}", run.stdout);

    // v2 is published; only a applies it.
    assert_eq!(publish(&b, "v2").await, 2);
    report(&a, 2).await;
    let run =
        kubectl_until(&["rollout", "status", "config", "-n", &ns], |run| run.stdout.contains("\na        2 ")).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert_eq!(row(&run.stdout, &["a"]), ["a", "2", "applied"], "{}", run.stdout);
    assert_eq!(row(&run.stdout, &["b"]), ["b", "1", "LAGGING"], "{}", run.stdout);
    // An older target: everyone has it.
    let run = kubectl(&["rollout", "status", "config", "-n", &ns, "--version", "1"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    // A target above what b applied, as JSON.
    let run = kubectl(&["rollout", "status", "config", "-n", &ns, "--version", "2", "-o", "json"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    let json: Value = serde_json::from_str(&run.stdout).expect("rollout status -o json");
    assert_eq!(
        (&json["latestVersion"], &json["targetVersion"], &json["allApplied"], &json["configMap"]),
        (&2.into(), &2.into(), &false.into(), &"consistd-rollout.config".into()),
        "{json}"
    );
    let members: Vec<(&str, u64, bool)> = json["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| (m["member"].as_str().expect("member"), m["applied"].as_u64().expect("applied"), m["lagging"] == true))
        .collect();
    assert_eq!(members, [("a", 2, false), ("b", 1, true)], "{json}");

    // Another channel nobody is a member of: no live members is not "all applied".
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "consistd-rollout.lonely"},
        "data": {"channel": "lonely", "version": "1", "contentType": "text/plain", "publishedAt": "2026-01-01T00:00:00Z"}
    }))
    .expect("ConfigMap");
    Api::<ConfigMap>::namespaced(kube.clone(), &ns).create(&PostParams::default(), &cm).await.expect("create");
    let run = kubectl(&["rollout", "status", "lonely", "-n", &ns]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stdout.contains("No live members"), "{run:?}");
}

/// Member Leases in `ns`.
async fn kube_members(kube: &kube::Client, ns: &str) -> usize {
    let params = kube::api::ListParams::default().labels("consistd.io/member-of");
    Api::<Lease>::namespaced(kube.clone(), ns).list(&params).await.expect("list member Leases").items.len()
}

#[tokio::test]
async fn outbox_and_queues_name_what_they_could_not_do_before_the_pod_answers() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(kube, &ns);
    let pod = |name: &str, port: &str| {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "app", "ports": [{"name": port, "containerPort": 7071}]}]},
        }))
        .expect("pod object")
    };
    pods.create(&PostParams::default(), &pod("plain", "http")).await.expect("create pod");
    pods.create(&PostParams::default(), &pod("injected", "consistd-admin")).await.expect("create pod");

    let missing = kubectl(&["outbox", "nope", "-n", &ns]).await;
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(missing.stderr.starts_with(&format!("kubectl consistd outbox: get pod {ns}/nope: ")), "{missing:?}");
    let plain = kubectl(&["outbox", "plain", "-n", &ns]).await;
    assert_eq!(plain.code, 1, "{plain:?}");
    assert!(plain.stderr.contains("has no container port named consistd-admin"), "{plain:?}");
    // The port is there but no kubelet runs the pod (the test control plane has no node): the proxy fails,
    // and says through which pod and port it tried. The real node's test (make e2e) reads a real sidecar.
    let unscheduled = kubectl(&["outbox", "injected", "-n", &ns]).await;
    assert_eq!(unscheduled.code, 1, "{unscheduled:?}");
    let proxied = format!("GET /outbox from pod {ns}/injected through the apiserver's pod proxy");
    assert!(unscheduled.stderr.contains(&proxied), "{unscheduled:?}");
    // `queues` reads the same way, from /queues.
    let queues = kubectl(&["queues", "injected", "-n", &ns]).await;
    assert_eq!(queues.code, 1, "{queues:?}");
    let proxied =
        format!("kubectl consistd queues: GET /queues from pod {ns}/injected through the apiserver's pod proxy");
    assert!(queues.stderr.starts_with(&proxied), "{queues:?}");
    let plain = kubectl(&["queues", "plain", "-n", &ns]).await;
    assert!(plain.stderr.contains("has no container port named consistd-admin"), "{plain:?}");
}
