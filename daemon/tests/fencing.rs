//! Fencing at the apiserver, with manifests/fencing installed as a cluster admin would (hack/control-plane.sh
//! applies it): a guarded write that reaches the apiserver after its election has moved on is refused
//! there, whatever held it up on the way — a link that holds traffic, or a stopped daemon — and the app is
//! told FAILED_PRECONDITION naming the term, never OK; the successor's write stays. A guarded send and a
//! guarded Publish carry their claim too: the receiving daemon and the channel refuse an older term than one
//! they have seen, and the sender is told so, naming both terms.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use consistd_client::proto::{CampaignRequest, LeadershipState, PatchRequest, PatchType, WriteGuard};
use consistd_testkit::{Daemon, proxy::DelayProxy};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::PostParams};
use nix::sys::signal::Signal;
use serde_json::json;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
/// The election's name, and the ConfigMap both leaders write.
const ELECTION: &str = "fenced";
/// Lease timing in seconds: lease, renew deadline, retry period.
const TIMING: (i64, i64, i64) = (4, 3, 1);
/// Long enough for a handover on a busy machine.
const WAIT: Duration = Duration::from_secs(30);

/// A daemon campaigning in [`ELECTION`], and the latest (state, holder, term) its stream said.
struct Candidate {
    daemon: Daemon,
    latest: Arc<Mutex<Option<(LeadershipState, String, u64)>>>,
    stream: tokio::task::JoinHandle<()>,
}

impl Candidate {
    /// The app ends its campaign (its stream closes): its daemon gives the Lease up at once.
    fn resign(&self) {
        self.stream.abort();
    }
}

async fn candidate(identity: &str, ns: &str, proxy: Option<&DelayProxy>) -> Candidate {
    candidate_with(identity, ns, proxy, "", TIMING).await
}

/// [`candidate`] with more config (YAML lines) and its own Lease timing.
async fn candidate_with(
    identity: &str,
    ns: &str,
    proxy: Option<&DelayProxy>,
    config: &str,
    timing: (i64, i64, i64),
) -> Candidate {
    let mut builder = Daemon::builder(BIN).config(format!("identity: {identity}\nnamespace: {ns}\n{config}"));
    if let Some(proxy) = proxy {
        builder = builder.through(proxy);
    }
    let daemon = builder.start().await;
    let request = CampaignRequest {
        election: ELECTION.into(),
        timing: Some(consistd_testkit::lease_timing(timing.0, timing.1, timing.2)),
        ..Default::default()
    };
    let mut stream = daemon.client().leadership().campaign(request).await.expect("campaign").into_inner();
    let latest = Arc::new(Mutex::new(None));
    let seen = latest.clone();
    let stream = consistd_testkit::spawn(async move {
        while let Ok(Some(message)) = stream.message().await {
            let s = message.status.expect("status");
            *seen.lock().expect("lock") = Some((s.state(), s.holder.clone(), s.term));
        }
    });
    Candidate { daemon, latest, stream }
}

/// The cast of most tests: A (with more `config`, and its own Lease `timing`) leads through a proxy that can
/// hold its link, B follows on a direct one, both fenced at the apiserver. The proxy, A, A's term and B.
async fn a_leads_behind_a_proxy(
    ns: &str,
    config: &str,
    timing: (i64, i64, i64),
) -> (DelayProxy, Candidate, u64, Candidate) {
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let a = candidate_with("pod-a", ns, Some(&proxy), config, timing).await;
    let term = leads(&a, 1).await;
    let b = candidate("pod-b", ns, None).await;
    fenced_at_apiserver(&a.daemon).await;
    fenced_at_apiserver(&b.daemon).await;
    (proxy, a, term, b)
}

/// Waits until `c` says LEADER in a term of at least `min_term`; returns the term.
async fn leads(c: &Candidate, min_term: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some((LeadershipState::Leader, _, term)) = c.latest.lock().expect("lock").clone()
            && term >= min_term
        {
            return term;
        }
        assert!(tokio::time::Instant::now() < deadline, "not LEADER in term {min_term}+ within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `consistd status` (over the admin socket, never through a proxy) says guarded writes are
/// fenced at the apiserver.
async fn at_apiserver(daemon: &Daemon) -> bool {
    let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("consistd status");
    report.fencing.as_ref().is_some_and(|f| f.at_apiserver)
}

/// Waits until `daemon` has found the policy and may claim terms (`consistd status` says so).
async fn fenced_at_apiserver(daemon: &Daemon) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("consistd status");
        if report.fencing.as_ref().is_some_and(|f| f.at_apiserver) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "fencing not at the apiserver: {:?}", report.fencing);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A merge patch of the ConfigMap's data.by, guarded by `term`.
fn guarded(ns: &str, by: &str, term: u64) -> PatchRequest {
    PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        name: ELECTION.into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "by": by } }).to_string().into_bytes(),
        guard: Some(WriteGuard { election: ELECTION.into(), namespace: String::new(), term }),
        ..Default::default()
    }
}

/// The namespace with the ConfigMap both leaders write, written first by nobody.
async fn setup() -> (Api<ConfigMap>, String) {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(kube, &ns);
    written_by_nobody(&configmaps, &[ELECTION]).await;
    (configmaps, ns)
}

/// Creates the ConfigMaps `names`, each with `data.by` "nobody".
async fn written_by_nobody(configmaps: &Api<ConfigMap>, names: &[&str]) {
    for name in names {
        let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": name }, "data": { "by": "nobody" } }))
            .expect("ConfigMap");
        configmaps.create(&PostParams::default(), &cm).await.unwrap_or_else(|e| panic!("create ConfigMap {name}: {e}"));
    }
}

/// A namespace other than the Lease's, with the ConfigMaps `names` written by nobody: its ConfigMaps, its name,
/// and the cluster's Namespaces (it is one, a cluster-scoped object to write).
async fn another_namespace(names: &[&str]) -> (Api<ConfigMap>, String, Api<k8s_openapi::api::core::v1::Namespace>) {
    let kube = consistd_testkit::kube_client().await;
    let other = consistd_testkit::namespace(&kube).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(kube.clone(), &other);
    written_by_nobody(&configmaps, names).await;
    (configmaps, other, Api::all(kube))
}

/// The app sends `patch` through `daemon` and waits for its answer in the background, while the test
/// makes the handover happen.
fn sent_in_background(daemon: &Daemon, patch: PatchRequest) -> Held {
    let client = daemon.client();
    consistd_testkit::spawn(async move { client.objects().patch(patch).await })
}

/// A patch on its way, and the answer the app will get.
type Held = tokio::task::JoinHandle<Result<tonic::Response<consistd_client::proto::PatchResponse>, tonic::Status>>;

/// A's write, held on its way past the handover from `terms.0` to `terms.1` (B has written since): the
/// apiserver refuses it, the app is told FAILED_PRECONDITION naming both terms, never OK, and B's write stays.
async fn refused_naming_both_terms(held: Held, configmaps: &Api<ConfigMap>, ns: &str, (term, next): (u64, u64)) {
    let refused = tokio::time::timeout(WAIT, held)
        .await
        .expect("A's write answered")
        .expect("join")
        .expect_err("A's write must not be answered OK: the apiserver refuses a term that is over");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(
        refused.message().starts_with("guard: ") && names_both_terms(refused.message(), ns, (term, next)),
        "{refused}"
    );
    assert_eq!(written_by(configmaps).await, "b", "the successor's write stays");
}

/// Whether an apiserver refusal names the election's term `next` and the write's `term`, in the words of
/// whichever policy refused it: the Lease's (consistd-fence) or the object's token's (consistd-fence-object).
fn names_both_terms(message: &str, ns: &str, (term, next): (u64, u64)) -> bool {
    let guarded = format!(", and this write was guarded by term {term}");
    [
        format!("election {ns}/{ELECTION} is in term {next}"),
        format!("election {ns}/{ELECTION} wrote this object in term {next}"),
    ]
    .iter()
    .any(|s| message.contains(&format!("{s}{guarded}")))
}

async fn written_by(configmaps: &Api<ConfigMap>) -> String {
    let cm = configmaps.get(ELECTION).await.expect("read the ConfigMap");
    cm.data.unwrap_or_default().get("by").cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_write_held_by_the_network_past_a_handover_is_refused_by_the_apiserver() {
    let (configmaps, ns) = setup().await;
    let (proxy, a, term, b) = a_leads_behind_a_proxy(&ns, "", TIMING).await;
    assert!(a.daemon.logs().contains("guarded writes are fenced at the apiserver"), "{}", a.daemon.logs());

    // A's link holds traffic: its app's write, checked in A while A still leads, waits on the way.
    proxy.hold(true);
    let held = sent_in_background(&a.daemon, guarded(&ns, "a", term));
    // A cannot renew; once its Lease expires B takes over with the next term and writes.
    let next = leads(&b, term + 1).await;
    assert_eq!(next, term + 1);
    b.daemon.client().objects().patch(guarded(&ns, "b", next)).await.expect("B writes");
    // The link heals: A's write lands after B's, in a term that is over.
    proxy.hold(false);
    refused_naming_both_terms(held, &configmaps, &ns, (term, next)).await;
}

#[tokio::test]
async fn a_daemon_stopped_past_its_lease_gets_no_write_in_with_its_old_term() {
    let (configmaps, ns) = setup().await;
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let a = candidate("pod-a", &ns, Some(&proxy)).await;
    let term = leads(&a, 1).await;
    let b = candidate("pod-b", &ns, None).await;
    fenced_at_apiserver(&a.daemon).await;

    // One write has passed A's check and is on its way (A's link holds it) when A's daemon is stopped.
    proxy.hold(true);
    let on_the_way = sent_in_background(&a.daemon, guarded(&ns, "a-sent", term));
    // Well inside A's renew deadline (3 s from its last renewal, at most 1 s ago): the write is out.
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.daemon.signal(Signal::SIGSTOP);
    // The app, still believing it leads, sends another to the stopped daemon.
    let to_stopped = sent_in_background(&a.daemon, guarded(&ns, "a-stopped", term));
    let next = leads(&b, term + 1).await;
    b.daemon.client().objects().patch(guarded(&ns, "b", next)).await.expect("B writes");
    // The held write reaches the apiserver while A still sleeps; then A continues.
    proxy.hold(false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.daemon.signal(Signal::SIGCONT);

    let answer = |r: Result<Result<_, tonic::Status>, _>, what: &str| {
        r.expect("join").expect_err(&format!("{what}: must not be answered OK in a term that is over"))
    };
    let sent = answer(tokio::time::timeout(WAIT, on_the_way).await.expect("answered"), "the write on its way");
    assert_eq!(sent.code(), Code::FailedPrecondition, "{sent}");
    assert!(names_both_terms(sent.message(), &ns, (term, next)), "refused by the apiserver, naming both terms: {sent}");
    let stopped =
        answer(tokio::time::timeout(WAIT, to_stopped).await.expect("answered"), "the write to the stopped daemon");
    assert_eq!(stopped.code(), Code::FailedPrecondition, "{stopped}");
    assert!(stopped.message().contains(&format!("the guard names term {term}")), "names the term: {stopped}");
    assert_eq!(written_by(&configmaps).await, "b", "the successor's write stays");
}

/// Fencing fails closed: a re-check of the policy that gets no answer (the link to the apiserver cut, as
/// in the very conditions fencing is for) leaves the claim on guarded writes. Here the re-checks run every
/// second and fail for 2.5 s; the next guarded write is held on the way while A's Lease runs out and B
/// leads and writes, and the apiserver refuses it. A daemon that dropped the claim after a failed check
/// sent it bare, and it landed over B's write.
#[tokio::test]
async fn a_recheck_that_gets_no_answer_keeps_the_claim() {
    let (configmaps, ns) = setup().await;
    // A renew deadline well past the cut, so A still leads when its app writes after it.
    let (proxy, a, term, b) = a_leads_behind_a_proxy(&ns, "fencing:\n  recheck: 1s\n", (8, 6, 1)).await;

    proxy.cut(true);
    let cut = tokio::time::Instant::now();
    while cut.elapsed() < Duration::from_millis(2500) {
        assert!(at_apiserver(&a.daemon).await, "a re-check without an answer moved the fence:\n{}", a.daemon.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(a.daemon.logs().contains("fencing check got no answer"), "the re-checks failed:\n{}", a.daemon.logs());
    // Nothing gets through from here until B has written: A's write, its renewals and its re-checks wait.
    proxy.hold(true);
    proxy.cut(false);
    let held = sent_in_background(&a.daemon, guarded(&ns, "a", term));
    let next = leads(&b, term + 1).await;
    b.daemon.client().objects().patch(guarded(&ns, "b", next)).await.expect("B writes");
    proxy.hold(false);
    refused_naming_both_terms(held, &configmaps, &ns, (term, next)).await;
}

/// Every guarded write's answer names its fence, and so does `consistd_guarded_writes_total`: the apiserver
/// for a write to an object in any namespace or cluster-scoped (the object carries the token, checked by
/// consistd-fence-object) and for a create in the Lease's namespace (checked against the Lease), this daemon
/// only for a create elsewhere (no stored object, and the Lease policy reads the Lease from the object's
/// namespace). Under `fencing.mode: require` those creates are refused FAILED_PRECONDITION naming why, and
/// nothing is written.
#[tokio::test]
async fn each_answer_names_its_fence_and_require_refuses_what_the_apiserver_cannot_check() {
    use consistd_client::proto::{CreateRequest, Fence};

    let (configmaps, ns) = setup().await;
    let (elsewhere, other, namespaces) = another_namespace(&[ELECTION]).await;
    let relabel = |by: &str| PatchRequest {
        resource: "namespaces".into(),
        name: other.clone(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "metadata": { "labels": { "by": by } } }).to_string().into_bytes(),
        ..Default::default()
    };

    for (mode, identity) in [("auto", "pod-auto"), ("require", "pod-require")] {
        let c = candidate_with(identity, &ns, None, &format!("fencing:\n  mode: {mode}\n"), TIMING).await;
        let term = leads(&c, 1).await;
        fenced_at_apiserver(&c.daemon).await;
        let guard = Some(WriteGuard { election: ELECTION.into(), namespace: String::new(), term });
        let mut objects = c.daemon.client().objects();

        let here = objects.patch(guarded(&ns, mode, term)).await.expect("a write the policy checks").into_inner();
        assert_eq!(here.fence(), Fence::Apiserver, "{mode}");
        assert_eq!(written_by(&configmaps).await, mode);
        let there = objects.patch(guarded(&other, mode, term)).await.expect("another namespace").into_inner();
        assert_eq!(there.fence(), Fence::Apiserver, "{mode}: the object carries the token");
        assert_eq!(written_by(&elsewhere).await, mode);
        let cluster = objects.patch(PatchRequest { guard: guard.clone(), ..relabel(mode) }).await;
        assert_eq!(cluster.expect("cluster-scoped").into_inner().fence(), Fence::Apiserver, "{mode}");
        let label = namespaces.get(&other).await.expect("namespace").metadata.labels.unwrap_or_default().remove("by");
        assert_eq!(label.as_deref(), Some(mode));
        let created = |namespace: &str, resource: &str, name: String| CreateRequest {
            resource: resource.into(),
            namespace: namespace.into(),
            object: json!({ "metadata": { "name": name, "labels": { "consistd.io/test": "true" } } })
                .to_string()
                .into_bytes(),
            guard: guard.clone(),
            ..Default::default()
        };
        let here = objects.create(created(&ns, "configmaps", format!("{mode}-here"))).await;
        assert_eq!(here.expect("a create the Lease policy checks").into_inner().fence(), Fence::Apiserver);
        let there = objects.create(created(&other, "configmaps", format!("{mode}-there"))).await;
        let cluster = objects.create(created("", "namespaces", format!("{other}-{mode}"))).await;
        if mode == "auto" {
            assert_eq!(there.expect("a create in another namespace").into_inner().fence(), Fence::Daemon);
            assert_eq!(cluster.expect("a cluster-scoped create").into_inner().fence(), Fence::Daemon);
        } else {
            let there = there.expect_err("a create in another namespace under require");
            assert_eq!(there.code(), Code::FailedPrecondition, "{there}");
            let why = format!("the object is in namespace {other}, the election's Lease in {ns}");
            assert!(
                there.message().starts_with("guard: fencing.mode is require") && there.message().contains(&why),
                "{there}"
            );
            let cluster = cluster.expect_err("a cluster-scoped create under require");
            assert_eq!(cluster.code(), Code::FailedPrecondition, "{cluster}");
            assert!(cluster.message().contains("the object is cluster-scoped"), "{cluster}");
            assert!(elsewhere.get_opt("require-there").await.expect("read").is_none(), "nothing was created");
            assert!(namespaces.get_opt(&format!("{other}-require")).await.expect("read").is_none());
        }
        let unguarded = objects.patch(relabel("unguarded")).await.expect("an unguarded write").into_inner();
        assert_eq!(unguarded.fence(), Fence::Unspecified, "no guard, no fence");

        let metrics = c.daemon.metrics().await;
        let count = |fence: &str| format!("consistd_guarded_writes_total{{fence=\"{fence}\"}} ");
        assert!(metrics.contains(&format!("{}4", count("apiserver"))), "{metrics}");
        let (elsewhere_fence, absent) = if mode == "auto" { ("daemon", "refused") } else { ("refused", "daemon") };
        assert!(metrics.contains(&format!("{}2", count(elsewhere_fence))), "{mode}: {metrics}");
        assert!(!metrics.contains(&count(absent)), "{mode}: {metrics}");
        let report = consistd_server::admin::fetch_report(c.daemon.admin_socket()).await.expect("consistd status");
        assert_eq!(report.fencing.map(|f| f.mode).as_deref(), Some(mode));
        // Let the next candidate lead: this one leaves and releases the Lease.
        drop(c);
    }
    namespaces.delete(&format!("{other}-auto"), &kube::api::DeleteParams::default()).await.expect("clean up");
}

/// The token on the object: writes of every kind, held on their way past a handover, to objects in another
/// namespace than the Lease's and to a cluster-scoped one, are refused once the successor has written each
/// object (its write stamped the object with its term), naming both terms, and the successor's writes stay.
/// A merge patch and an update carry the token in their body; a JSON patch, an apply and a /status write
/// stamp the object first (that stamp is what the apiserver refuses); a delete is checked only. Without the
/// token every one of them landed and its app was told OK: the Lease policy reads the Lease from the written
/// object's namespace, and cluster-scoped writes never met it. An unguarded write may not move the token.
#[tokio::test]
async fn held_writes_of_every_kind_to_any_namespace_or_scope_are_refused_once_the_successor_wrote() {
    use consistd_client::proto::{DeleteRequest, UpdateRequest};

    let (_, ns) = setup().await;
    let names = ["merge", "update", "json", "apply", "delete"];
    let (elsewhere, other, namespaces) = another_namespace(&names).await;
    let (proxy, a, term, b) = a_leads_behind_a_proxy(&ns, "", TIMING).await;

    let guard = |term: u64| Some(WriteGuard { election: ELECTION.into(), namespace: String::new(), term });
    let patch = |name: &str, kind: PatchType, body: serde_json::Value, term: u64| PatchRequest {
        resource: "configmaps".into(),
        namespace: other.clone(),
        name: name.into(),
        patch_type: kind.into(),
        patch: body.to_string().into_bytes(),
        field_manager: "app".into(),
        guard: guard(term),
        ..Default::default()
    };
    let by = |who: &str| json!({ "data": { "by": who } });
    let relabel = |subresource: &str, who: &str, term: u64| PatchRequest {
        resource: "namespaces".into(),
        name: other.clone(),
        subresource: subresource.into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "metadata": { "labels": { "by": who } } }).to_string().into_bytes(),
        guard: guard(term),
        ..Default::default()
    };

    // A's link holds traffic: each write passes A's check while A leads, and waits on the way.
    proxy.hold(true);
    let client = a.daemon.client();
    let mut held: Vec<(&str, tokio::task::JoinHandle<Result<(), tonic::Status>>)> = Vec::new();
    let mut send =
        |what: &'static str, write: std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::Status>> + Send>>| {
            held.push((what, consistd_testkit::spawn(write)));
        };
    let mut objects = client.objects();
    let merge = patch("merge", PatchType::Merge, by("a"), term);
    send("merge patch", Box::pin(async move { objects.patch(merge).await.map(drop) }));
    let mut objects = client.objects();
    let update = UpdateRequest {
        resource: "configmaps".into(),
        namespace: other.clone(),
        name: "update".into(),
        object: json!({ "metadata": { "name": "update" }, "data": { "by": "a" } }).to_string().into_bytes(),
        guard: guard(term),
        ..Default::default()
    };
    send("update", Box::pin(async move { objects.update(update).await.map(drop) }));
    let mut objects = client.objects();
    let json_patch =
        patch("json", PatchType::Json, json!([{ "op": "replace", "path": "/data/by", "value": "a" }]), term);
    send("JSON patch", Box::pin(async move { objects.patch(json_patch).await.map(drop) }));
    let mut objects = client.objects();
    let apply =
        json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "apply" }, "data": { "by": "a" } });
    let apply = PatchRequest { force: true, ..patch("apply", PatchType::Apply, apply, term) };
    send("apply", Box::pin(async move { objects.patch(apply).await.map(drop) }));
    let mut objects = client.objects();
    let delete = DeleteRequest {
        resource: "configmaps".into(),
        namespace: other.clone(),
        name: "delete".into(),
        guard: guard(term),
        ..Default::default()
    };
    send("delete", Box::pin(async move { objects.delete(delete).await.map(drop) }));
    let mut objects = client.objects();
    let cluster = relabel("", "a", term);
    send("cluster-scoped merge patch", Box::pin(async move { objects.patch(cluster).await.map(drop) }));
    let mut objects = client.objects();
    let status = relabel("status", "a", term);
    send("cluster-scoped /status patch", Box::pin(async move { objects.patch(status).await.map(drop) }));

    // B takes over with the next term and writes each object once.
    let next = leads(&b, term + 1).await;
    let mut objects = b.daemon.client().objects();
    for name in names {
        objects.patch(patch(name, PatchType::Merge, by("b"), next)).await.expect("B writes");
    }
    objects.patch(relabel("", "b", next)).await.expect("B writes the Namespace");
    // The link heals: every held write reaches the apiserver after B's, in a term that is over.
    proxy.hold(false);
    let says =
        format!("election {ns}/{ELECTION} wrote this object in term {next}, and this write was guarded by term {term}");
    for (what, answer) in held {
        let refused = tokio::time::timeout(WAIT, answer)
            .await
            .unwrap_or_else(|_| panic!("{what}: answered"))
            .expect("join")
            .expect_err(&format!("{what}: must not be answered OK in a term that is over"));
        assert_eq!(refused.code(), Code::FailedPrecondition, "{what}: {refused}");
        assert!(refused.message().starts_with("guard: ") && refused.message().contains(&says), "{what}: {refused}");
    }
    for name in names {
        let cm = elsewhere.get(name).await.unwrap_or_else(|e| panic!("{name} is still there: {e}"));
        assert_eq!(cm.data.unwrap_or_default().get("by").map(String::as_str), Some("b"), "{name}: B's write stays");
    }
    let label = namespaces.get(&other).await.expect("namespace").metadata.labels.unwrap_or_default().remove("by");
    assert_eq!(label.as_deref(), Some("b"), "B's label stays");

    // Only a guarded write moves the token: an unguarded one that carries an older one is refused.
    let mut stale = elsewhere.get("merge").await.expect("read");
    stale
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("consistd.io/fence".into(), format!("{ns}/{ELECTION}/{term}"));
    let refused = elsewhere.replace("merge", &PostParams::default(), &stale).await.expect_err("an unguarded move");
    assert!(refused.to_string().contains("may only be changed by a guarded write"), "{refused}");
}

/// A guarded read-modify-write of /status (the object as read, its resourceVersion its precondition): the
/// apiserver keeps a /status write's metadata, so the daemon stamps the object first, on the version the app
/// read, and the write then names the stamped version. It lands, stamped, at once; the same write again, its
/// version now stale, is refused ABORTED, as it would be without a guard.
#[tokio::test]
async fn a_guarded_status_update_stamps_its_object_and_keeps_its_precondition() {
    use consistd_client::proto::UpdateRequest;

    let (_, ns) = setup().await;
    let (_, other, namespaces) = another_namespace(&[]).await;
    let c = candidate("pod-a", &ns, None).await;
    let term = leads(&c, 1).await;
    fenced_at_apiserver(&c.daemon).await;
    let read = namespaces.get(&other).await.expect("read the Namespace");
    let update = UpdateRequest {
        resource: "namespaces".into(),
        name: other.clone(),
        subresource: "status".into(),
        object: serde_json::to_vec(&read).expect("JSON"),
        guard: Some(WriteGuard { election: ELECTION.into(), namespace: String::new(), term }),
        ..Default::default()
    };
    let mut objects = c.daemon.client().objects();
    objects.update(update.clone()).await.expect("a guarded /status update on the version it read");
    let stamped = namespaces.get(&other).await.expect("read").metadata.annotations.unwrap_or_default();
    assert_eq!(stamped.get("consistd.io/fence"), Some(&format!("{ns}/{ELECTION}/{term}")), "stamped first");
    let stale = objects.update(update).await.expect_err("the same version again");
    assert_eq!(stale.code(), Code::Aborted, "its precondition holds: {stale}");
}

/// A Lease deleted (by an admin, a prune, a namespace cleanup) while its leader's write is held: the
/// successor waits until the deleted holding would have expired, so the two never say LEADER at once, and
/// creates the Lease above every term it saw, so the held write's term is over and the apiserver refuses it.
/// Before, the successor created it at term 1 half a second after the delete: the deposed leader's own term,
/// while it still said LEADER, and its write landed.
#[tokio::test]
async fn a_lease_deleted_and_created_again_never_reuses_a_term() {
    use k8s_openapi::api::coordination::v1::Lease;

    let (configmaps, ns) = setup().await;
    let (proxy, a, term, b) = a_leads_behind_a_proxy(&ns, "", TIMING).await;
    // B follows A before the delete: it has seen A's term.
    let deadline = tokio::time::Instant::now() + WAIT;
    while b.latest.lock().expect("lock").clone().is_none_or(|(s, _, t)| s != LeadershipState::Follower || t != term) {
        assert!(tokio::time::Instant::now() < deadline, "B never followed A");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    proxy.hold(true);
    let held = sent_in_background(&a.daemon, guarded(&ns, "a", term));
    let leases: Api<Lease> = Api::namespaced(consistd_testkit::kube_client().await, &ns);
    leases.delete(ELECTION, &kube::api::DeleteParams::default()).await.expect("an admin deletes the Lease");
    let deadline = tokio::time::Instant::now() + WAIT;
    let next = loop {
        let (sa, sb) = (a.latest.lock().expect("lock").clone(), b.latest.lock().expect("lock").clone());
        let says_leader = |s: &Option<(LeadershipState, String, u64)>| {
            s.as_ref().filter(|(state, _, _)| *state == LeadershipState::Leader).map(|(_, _, t)| *t)
        };
        assert!(says_leader(&sa).is_none() || says_leader(&sb).is_none(), "two LEADERs at once: {sa:?} {sb:?}");
        if let Some(t) = says_leader(&sb) {
            break t;
        }
        assert!(tokio::time::Instant::now() < deadline, "B never led after the delete: {sb:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(next, term + 1, "the Lease created again starts above the term B saw");
    b.daemon.client().objects().patch(guarded(&ns, "b", next)).await.expect("B writes");
    proxy.hold(false);
    refused_naming_both_terms(held, &configmaps, &ns, (term, next)).await;
}

/// A replacement pod with the deposed pod's name (a StatefulSet pod force-deleted on a node cut off): the
/// same identity, another run. It takes the Lease only once A's holding expired, and then in the next term,
/// so A's write held on the way is refused naming both terms. Before, the replacement renewed the Lease as
/// its own at once: both said LEADER in one term, and A's write landed.
#[tokio::test]
async fn a_replacement_pod_with_the_same_name_leads_in_a_new_term_and_the_old_ones_write_is_refused() {
    let (configmaps, ns) = setup().await;
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let a = candidate("pod-0", &ns, Some(&proxy)).await;
    let term = leads(&a, 1).await;
    fenced_at_apiserver(&a.daemon).await;

    proxy.hold(true);
    let held = sent_in_background(&a.daemon, guarded(&ns, "a", term));
    let replacement = candidate("pod-0", &ns, None).await;
    fenced_at_apiserver(&replacement.daemon).await;
    let next = leads(&replacement, term + 1).await;
    assert_eq!(next, term + 1, "a new holding, a new term");
    replacement.daemon.client().objects().patch(guarded(&ns, "b", next)).await.expect("the replacement writes");
    proxy.hold(false);
    refused_naming_both_terms(held, &configmaps, &ns, (term, next)).await;
}

/// A work item's writes are guarded by the daemon itself: the app names the item's lease and sends no
/// guard (as three of the five SDKs did), the write is held on the way past a handover, and the apiserver
/// refuses it, naming both terms. Once the lease is completed, a write naming it is refused before it is
/// sent.
#[tokio::test]
async fn a_work_items_write_is_fenced_by_its_lease_whatever_the_app_sent() {
    use consistd_client::proto::{
        Completion, ElectionRef, Fence, ObjectQuery, Outcome, QueueSpec, ReconcileRequest, reconcile_request,
        reconcile_response, reconcile_service_client::ReconcileServiceClient,
    };
    use tokio_stream::wrappers::ReceiverStream;

    let (configmaps, ns) = setup().await;
    let (proxy, a, term, b) = a_leads_behind_a_proxy(&ns, "", TIMING).await;

    let spec = QueueSpec {
        name: "fenced".into(),
        primary: Some(ObjectQuery { resource: "configmaps".into(), namespace: ns.clone(), ..Default::default() }),
        max_leases: 1,
        election: Some(ElectionRef { election: ELECTION.into(), namespace: String::new() }),
        ..Default::default()
    };
    let (tx, requests) = tokio::sync::mpsc::channel(4);
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).await.expect("spec");
    let mut answers = ReconcileServiceClient::new(a.daemon.client().channel())
        .reconcile(ReceiverStream::new(requests))
        .await
        .expect("open the queue")
        .into_inner();
    let item = loop {
        match tokio::time::timeout(WAIT, answers.message()).await.expect("a work item").expect("stream") {
            Some(m) => match m.response {
                Some(reconcile_response::Response::Item(item)) => break item,
                _ => continue,
            },
            None => panic!("the queue's stream ended"),
        }
    };
    assert_eq!(item.term, term);
    let item_write =
        |by: &str| PatchRequest { reconcile_lease: item.lease_id.clone(), guard: None, ..guarded(&ns, by, term) };
    let first = a.daemon.client().objects().patch(item_write("a-first")).await.expect("the item's write").into_inner();
    assert_eq!(first.fence(), Fence::Apiserver, "the daemon guarded it with the item's term");

    proxy.hold(true);
    let held = sent_in_background(&a.daemon, item_write("a"));
    let next = leads(&b, term + 1).await;
    b.daemon.client().objects().patch(guarded(&ns, "b", next)).await.expect("B writes");
    proxy.hold(false);
    refused_naming_both_terms(held, &configmaps, &ns, (term, next)).await;

    // The lease went back when A's term ended: a write naming it is refused before it is sent.
    let after = a.daemon.client().objects().patch(item_write("a-after")).await.expect_err("a lease not held");
    assert_eq!(after.code(), Code::FailedPrecondition, "{after}");
    assert!(after.message().starts_with("reconcile_lease: lease"), "{after}");
    let done = Completion { lease_id: item.lease_id.clone(), outcome: Outcome::Done.into(), ..Default::default() };
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Complete(done)) }).await.expect("complete");
    assert_eq!(written_by(&configmaps).await, "b");
}

/// The policy's parameters are the election Leases of the written object's namespace, not the member
/// Leases of its election groups: the apiserver evaluates the policy once per parameter on every
/// namespaced write, so counting a group's member Leases made each write of a group of N cost N
/// evaluations (the barrier at 100 replicas took 720 ms instead of 270, docs/BENCHMARKS.md).
#[tokio::test]
async fn the_policy_takes_election_leases_as_parameters_and_leaves_member_leases_out() {
    use k8s_openapi::api::{admissionregistration::v1::ValidatingAdmissionPolicyBinding, coordination::v1::Lease};

    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let binding =
        Api::<ValidatingAdmissionPolicyBinding>::all(kube.clone()).get("consistd-fence").await.expect("binding");
    let selector = binding.spec.param_ref.and_then(|p| p.selector).expect("the binding selects its params");
    // The selector as the apiserver's list takes it.
    let mut terms: Vec<String> =
        selector.match_labels.unwrap_or_default().into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    for e in selector.match_expressions.unwrap_or_default() {
        let values = e.values.unwrap_or_default().join(",");
        terms.push(match e.operator.as_str() {
            "DoesNotExist" => format!("!{}", e.key),
            "Exists" => e.key,
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            other => panic!("unknown operator {other}"),
        });
    }
    let leases: Api<Lease> = Api::namespaced(kube, &ns);
    for (name, labels) in [
        ("election", json!({ "app.kubernetes.io/managed-by": "consistd" })),
        (
            "election.member.pod-0",
            json!({ "app.kubernetes.io/managed-by": "consistd", "consistd.io/member-of": "election" }),
        ),
        ("someone-elses", json!({})),
    ] {
        let lease: Lease =
            serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } })).expect("lease");
        leases.create(&PostParams::default(), &lease).await.expect("create Lease");
    }
    let params = leases.list(&kube::api::ListParams::default().labels(&terms.join(","))).await.expect("list params");
    let names: Vec<String> = params.items.into_iter().filter_map(|l| l.metadata.name).collect();
    assert_eq!(names, ["election"], "the policy's parameters, selected by {terms:?}");
}

/// Lines of config for a daemon that sends to peers (plaintext) and, with `listen`, receives on that address
/// and tells others to reach it at `advertise`.
fn peers(listen: Option<std::net::SocketAddr>, advertise: Option<std::net::SocketAddr>) -> String {
    let mut config = "peer:\n  insecure: true\n".to_owned();
    if let Some(listen) = listen {
        config += &format!("  listen: \"{listen}\"\n");
    }
    if let Some(advertise) = advertise {
        config += &format!("  advertise: \"{advertise}\"\n");
    }
    config + "outbox:\n  backoff: {initial: 20ms, factor: 2, cap: 500ms}\nmembership:\n  ttl: 3s\n"
}

/// A guarded send held on its way to its receiver past a handover: the receiver has stored the successor's
/// message of the next term, so it refuses the late one for good; its sender's outcome is FAILED naming both
/// terms, and the receiving app never sees it. Once deposed, the old leader's guarded Send is refused at once.
#[tokio::test]
async fn a_send_held_past_a_handover_is_refused_by_its_receiver_and_failed_naming_both_terms() {
    use consistd_client::proto::{
        AckOutcome, Destination, ReceiveRequest, SendRequest, WaitOutcomeRequest, destination::Target,
    };

    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let c_addr = std::net::SocketAddr::from(([127, 0, 0, 1], consistd_testkit::free_port()));
    let c = Daemon::builder(BIN)
        .config(format!("identity: pod-c\nnamespace: {ns}\n{}", peers(Some(c_addr), None)))
        .start()
        .await;
    let link = DelayProxy::start(c_addr).await;
    let a = candidate_with("pod-a", &ns, None, &peers(None, None), TIMING).await;
    let term = leads(&a, 1).await;
    let b = candidate_with("pod-b", &ns, None, &peers(None, None), TIMING).await;
    let send = |to: String, event: &str, term: u64| SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(to)) }),
        resource_id: "config".into(),
        event_id: event.into(),
        payload: event.as_bytes().to_vec(),
        guard: Some(WriteGuard { election: ELECTION.into(), namespace: String::new(), term }),
        ..Default::default()
    };

    // A's message, sent while A leads, waits on the link; A's term ends, and B's message arrives first.
    link.hold(true);
    let late = a.daemon.client().outbox().send(send(link.addr().to_string(), "a", term)).await.expect("A sends");
    let late = late.into_inner().message_id;
    a.resign();
    let next = leads(&b, term + 1).await;
    b.daemon.client().outbox().send(send(c_addr.to_string(), "b", next)).await.expect("B sends");
    let mut inbox = c.client().inbox().receive(ReceiveRequest {}).await.expect("Receive").into_inner();
    let first = tokio::time::timeout(WAIT, inbox.message()).await.expect("B's message").expect("stream");
    assert_eq!(first.and_then(|r| r.message).map(|m| m.event_id).as_deref(), Some("b"));
    let deposed = a.daemon.client().outbox().send(send(c_addr.to_string(), "a2", term)).await;
    let deposed = deposed.expect_err("A no longer leads");
    assert_eq!(deposed.code(), Code::FailedPrecondition, "{deposed}");
    assert!(deposed.message().starts_with("guard: "), "{deposed}");

    link.hold(false);
    let outcome = tokio::time::timeout(
        WAIT,
        a.daemon.client().outbox().wait_outcome(WaitOutcomeRequest { message_id: late.clone() }),
    )
    .await
    .expect("A's message has an outcome")
    .expect("WaitOutcome")
    .into_inner()
    .outcome
    .expect("outcome");
    assert_eq!(outcome.outcome(), AckOutcome::Failed, "{outcome:?}");
    let both = format!(
        "election {ns}/{ELECTION} sent this daemon a message in term {next}, and this was guarded by term {term}"
    );
    assert!(outcome.reason.contains(&both), "{outcome:?}");
    // Each copy that reached it is refused (the sender resent the message while the link held it).
    let metrics = c.metrics().await;
    let fenced = metrics
        .lines()
        .find_map(|l| l.strip_prefix("consistd_inbox_fenced_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(fenced >= 1.0, "the receiver counted it: {fenced}");
}

/// A guarded Publish held on its way to the channel's leader past a handover: the successor has published
/// on the channel in the next term, so the channel refuses the late one in its own compare-and-swap, and the
/// app is told FAILED_PRECONDITION naming both terms; the successor's version stays the latest.
#[tokio::test]
async fn a_publish_held_past_a_handover_is_refused_by_the_channel_naming_both_terms() {
    use consistd_client::proto::{PublishRequest, SubscribeVersionsRequest};

    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let a = candidate_with("pod-a", &ns, None, &peers(None, None), TIMING).await;
    let term = leads(&a, 1).await;
    // C leads the channel; others reach it through a link that can hold traffic.
    let c_addr = std::net::SocketAddr::from(([127, 0, 0, 1], consistd_testkit::free_port()));
    let link = DelayProxy::start(c_addr).await;
    let c = candidate_with("pod-c", &ns, None, &peers(Some(c_addr), Some(link.addr())), TIMING).await;
    let subscribe = SubscribeVersionsRequest { channel: "config".into() };
    let _member = c.daemon.client().rollout().subscribe_versions(subscribe).await.expect("C joins the channel");
    let publish = |payload: &str, term: u64| PublishRequest {
        channel: "config".into(),
        payload: payload.as_bytes().to_vec(),
        guard: Some(WriteGuard { election: ELECTION.into(), namespace: String::new(), term }),
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while let Err(e) = a.daemon.client().rollout().publish(publish("a1", term)).await {
        assert!(tokio::time::Instant::now() < deadline, "A's first publish: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    link.hold(true);
    let before = link.connections();
    let client = a.daemon.client();
    let held = consistd_testkit::spawn(async move { client.rollout().publish(publish("a2", term)).await });
    // Past A's guard, on its way to C.
    while link.connections() == before {
        assert!(tokio::time::Instant::now() < deadline, "A's publish never left");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.resign();
    let next = leads(&c, term + 1).await;
    let c_version = c.daemon.client().rollout().publish(publish("c", next)).await.expect("C publishes").into_inner();
    link.hold(false);

    let refused = tokio::time::timeout(WAIT, held)
        .await
        .expect("A's publish answered")
        .expect("join")
        .expect_err("a publish of a term that is over must not be answered OK");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    let both = format!(
        "election {ns}/{ELECTION} published on channel config in term {next}, and this was guarded by term {term}"
    );
    assert!(refused.message().contains(&both), "{refused}");
    let versions = consistd_core::versions::Versions::new(kube, &ns);
    let latest = versions.latest("config").await.expect("read the channel").expect("published");
    assert_eq!(latest.version, c_version.version, "the successor's version stays the latest");
    assert_eq!(latest.claim.map(|c| c.term), Some(next));
}

/// A sharded queue's owner whose link holds: its hold lapses on its own, and only then is the key's slot
/// given to the other member, in the next epoch; the old owner refuses a write naming its lease from then
/// on, and its write that was already on its way, claiming the slot's old epoch, is refused by the
/// apiserver once the new owner has written the object (the token names the slot, not the group).
#[tokio::test]
async fn a_sharded_owner_cut_off_stops_before_its_slot_moves_and_its_late_write_is_refused() {
    use consistd_client::proto::{
        ElectionRef, ObjectQuery, QueueSpec, ReconcileRequest, ReconcileResponse, WorkItem, reconcile_request,
        reconcile_response, reconcile_service_client::ReconcileServiceClient,
    };
    use tokio_stream::wrappers::ReceiverStream;

    /// Opens the sharded queue on `daemon` and waits for its first item.
    async fn first_item(
        daemon: &Daemon,
        ns: &str,
    ) -> (tokio::sync::mpsc::Sender<ReconcileRequest>, tonic::Streaming<ReconcileResponse>, WorkItem) {
        let spec = QueueSpec {
            name: "work".into(),
            primary: Some(ObjectQuery { resource: "configmaps".into(), namespace: ns.into(), ..Default::default() }),
            max_leases: 1,
            election: Some(ElectionRef { election: ELECTION.into(), namespace: String::new() }),
            sharded: true,
            ..Default::default()
        };
        let (tx, requests) = tokio::sync::mpsc::channel(4);
        tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).await.expect("spec");
        let mut answers = ReconcileServiceClient::new(daemon.client().channel())
            .reconcile(ReceiverStream::new(requests))
            .await
            .expect("open the queue")
            .into_inner();
        loop {
            let message =
                tokio::time::timeout(WAIT * 2, answers.message()).await.expect("a work item").expect("stream");
            match message.and_then(|m| m.response) {
                Some(reconcile_response::Response::Item(item)) => return (tx, answers, item),
                Some(_) => {}
                None => panic!("the queue's stream ended"),
            }
        }
    }

    let (configmaps, ns) = setup().await;
    let proxy = DelayProxy::start(consistd_testkit::apiserver_addr()).await;
    let config = |identity: &str| format!("identity: {identity}\nnamespace: {ns}\nmembership:\n  ttl: 3s\n");
    let a = Daemon::builder(BIN).config(config("pod-a")).through(&proxy).start().await;
    let b = Daemon::builder(BIN).config(config("pod-b")).start().await;
    fenced_at_apiserver(&a).await;
    fenced_at_apiserver(&b).await;
    let (_a_requests, _a_answers, item) = first_item(&a, &ns).await;
    let item_write = |item: &WorkItem, by: &str| PatchRequest {
        reconcile_lease: item.lease_id.clone(),
        ..guarded(&ns, by, item.term)
    };
    // B joins, and sees A renew for a while: the key's slot stays A's, or moves once A's lease ends.
    let b = std::sync::Arc::new(b);
    let b_first = {
        let (b, ns) = (b.clone(), ns.clone());
        consistd_testkit::spawn(async move { first_item(&b, &ns).await })
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let report = consistd_server::admin::fetch_report(b.admin_socket()).await.expect("consistd status");
        let members = report.queues.iter().find_map(|q| q.ring.as_ref()).map(|r| r.members.len()).unwrap_or(0);
        if members == 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "B never saw both members: {:?}", report.queues);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A's link holds: its app's write for the item waits on the way, and A can no longer renew.
    proxy.hold(true);
    let held = sent_in_background(&a, item_write(&item, "a"));
    let (_b_requests, _b_answers, taken) =
        tokio::time::timeout(WAIT * 2, b_first).await.expect("B's item").expect("join");
    assert_eq!(taken.name, ELECTION);
    assert!(taken.term > item.term, "the slot moved in a later epoch: {} then {}", item.term, taken.term);
    // A's hold ended before B was given the slot: A refuses its lease at once, sending nothing.
    let after = tokio::time::timeout(Duration::from_secs(5), a.client().objects().patch(item_write(&item, "a-after")))
        .await
        .expect("A answers a write naming its lease without sending it: A still held the key when B was given it")
        .expect_err("a lease not held");
    assert_eq!(after.code(), Code::FailedPrecondition, "{after}");
    assert!(after.message().starts_with("reconcile_lease: lease"), "{after}");
    b.client().objects().patch(item_write(&taken, "b")).await.expect("B writes under its item");

    // The link heals: A's write lands after B's, claiming the slot's old epoch.
    proxy.hold(false);
    let refused = tokio::time::timeout(WAIT, held)
        .await
        .expect("A's write answered")
        .expect("join")
        .expect_err("A's late write must not be answered OK");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    let expected =
        format!("wrote this object in term {}, and this write was guarded by term {}", taken.term, item.term);
    assert!(refused.message().contains(&format!("election {ns}/{ELECTION}.ring.work.slot-")), "{refused}");
    assert!(refused.message().contains(&expected), "{refused}");
    assert_eq!(written_by(&configmaps).await, "b", "the new owner's write stays");
}
