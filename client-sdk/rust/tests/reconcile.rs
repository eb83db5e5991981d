//! The reconciler against a real daemon and the real control plane: each key once, one more pass for a
//! change during a handler and never two at once for a key, RETRY / REQUEUE / TERMINAL from how the
//! handler ends, writes naming the lease, a queue with an election and its guarded writes, a refused
//! spec, a lost connection and a graceful shutdown.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use consistd_client::{
    Action, Client, Leadership, ReconcileError, ReconcileSpec, Reconciler, Related, WorkItem,
    proto::{
        CampaignRequest, Consistency, GetRequest, LeadershipState, PatchRequest, PatchType, ReadSource, WriteGuard,
    },
};
use consistd_testkit::{
    Daemon, apiserver_addr, consistd_bin, kube_client, namespace, proxy::DelayProxy, unix_proxy::UnixProxy,
};
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::{
    sync::{Semaphore, mpsc},
    task::JoinHandle,
    time::Instant,
};

/// How long a test waits for a pass before failing.
const WAIT: Duration = Duration::from_secs(20);
/// How long a test watches for a pass that must not come.
const QUIET: Duration = Duration::from_secs(2);

/// One call of the handler, as it saw its item.
#[derive(Debug, Clone)]
struct Pass {
    name: String,
    attempt: u32,
    last_error: Option<String>,
    lease: String,
    term: u64,
    guard: Option<WriteGuard>,
    data: Value,
    at: Instant,
}

impl Pass {
    fn of(item: &WorkItem) -> Self {
        let data = item.json().map(|j| j.expect("the object's JSON")["data"].clone()).unwrap_or(Value::Null);
        Self {
            name: item.name.clone(),
            attempt: item.attempt,
            last_error: item.last_error.clone(),
            lease: item.lease_id.clone(),
            term: item.term,
            guard: item.guard.clone(),
            data,
            at: Instant::now(),
        }
    }
}

/// The passes a handler reports, in the order they started.
struct Passes(mpsc::UnboundedReceiver<Pass>);

impl Passes {
    fn new() -> (mpsc::UnboundedSender<Pass>, Self) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Self(rx))
    }

    async fn next(&mut self) -> Pass {
        match tokio::time::timeout(WAIT, self.0.recv()).await {
            Ok(Some(pass)) => pass,
            Ok(None) => panic!("the handler is gone"),
            Err(_) => panic!("no pass within {WAIT:?}"),
        }
    }

    async fn none_within(&mut self, wait: Duration, why: &str) {
        if let Ok(Some(pass)) = tokio::time::timeout(wait, self.0.recv()).await {
            panic!("{why}: {pass:?}");
        }
    }
}

/// Counts the handlers running per key, and whether two ever ran at once for one.
#[derive(Clone, Default)]
struct PerKey {
    running: Arc<Mutex<HashMap<String, usize>>>,
    overlapped: Arc<Mutex<Vec<String>>>,
}

impl PerKey {
    fn enter(&self, key: &str) {
        let mut running = self.running.lock().expect("lock");
        let n = running.entry(key.to_owned()).or_default();
        *n += 1;
        if *n > 1 {
            self.overlapped.lock().expect("lock").push(key.to_owned());
        }
    }

    fn leave(&self, key: &str) {
        *self.running.lock().expect("lock").entry(key.to_owned()).or_default() -= 1;
    }

    fn overlaps(&self) -> Vec<String> {
        self.overlapped.lock().expect("lock").clone()
    }
}

struct Setup {
    daemon: Daemon,
    api: Api<ConfigMap>,
    ns: String,
}

/// A daemon, a namespace of its own and ConfigMaps `names` in it (data v = "0"), created directly
/// through the apiserver.
async fn setup(names: &[&str]) -> Setup {
    setup_with(Daemon::builder(consistd_bin()), names).await
}

async fn setup_with(daemon: consistd_testkit::DaemonBuilder, names: &[&str]) -> Setup {
    let kube = kube_client().await;
    let ns = namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube, &ns);
    for name in names {
        api.create(&PostParams::default(), &configmap(name, json!({ "v": "0" }), json!({}))).await.expect("create");
    }
    Setup { daemon: daemon.start().await, api, ns }
}

fn configmap(name: &str, data: Value, labels: Value) -> ConfigMap {
    serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels }, "data": data })).expect("configmap")
}

async fn set(api: &Api<ConfigMap>, name: &str, value: &str) -> u64 {
    let patch = json!({ "data": { "v": value } });
    let cm = api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    cm.metadata.resource_version.expect("rv").parse().expect("an integer resourceVersion")
}

/// Runs the reconciler in a task of its own; aborted when the handle is dropped.
struct Running(JoinHandle<Result<(), consistd_client::Error>>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn spawn(reconciler: impl Future<Output = Result<(), consistd_client::Error>> + Send + 'static) -> Running {
    Running(tokio::spawn(reconciler))
}

#[tokio::test]
async fn each_key_is_handed_to_the_handler_once() {
    let s = setup(&["a", "b", "c"]).await;
    let (tx, mut passes) = Passes::new();
    let spec = ReconcileSpec::new("each", "configmaps").namespace(&s.ns).max_leases(3);
    let _r = spawn(s.daemon.client().reconcile(spec, move |item| {
        let _ = tx.send(Pass::of(&item));
        async { Ok(Action::done()) }
    }));
    let mut names = Vec::new();
    for _ in 0..3 {
        let pass = passes.next().await;
        assert_eq!(pass.attempt, 1);
        names.push(pass.name);
    }
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
    passes.none_within(QUIET, "a key came twice").await;
}

#[tokio::test]
async fn a_change_during_a_handler_gives_exactly_one_more_pass_and_never_two_at_once() {
    let s = setup(&["a"]).await;
    let (tx, mut passes) = Passes::new();
    let per_key = PerKey::default();
    let gate = Arc::new(Semaphore::new(0));
    let spec = ReconcileSpec::new("once-more", "configmaps").namespace(&s.ns).max_leases(4);
    let (keys, held) = (per_key.clone(), gate.clone());
    let _r = spawn(s.daemon.client().reconcile(spec, move |item| {
        let (tx, keys, gate) = (tx.clone(), keys.clone(), held.clone());
        async move {
            keys.enter(&item.name);
            let _ = tx.send(Pass::of(&item));
            if item.json().is_some_and(|j| j.expect("JSON")["data"]["v"] == "0") {
                // The first pass is busy until the test lets it end.
                gate.acquire().await.expect("gate").forget();
            }
            keys.leave(&item.name);
            Ok(Action::done())
        }
    }));
    let first = passes.next().await;
    assert_eq!((first.name.as_str(), &first.data["v"]), ("a", &json!("0")));
    for v in 1..=3 {
        set(&s.api, "a", &v.to_string()).await;
    }
    passes.none_within(QUIET, "a second pass while the first runs").await;
    gate.add_permits(1);
    let again = passes.next().await;
    assert_eq!((again.name.as_str(), &again.data["v"]), ("a", &json!("3")), "the state when the pass began");
    assert_ne!(again.lease, first.lease);
    passes.none_within(QUIET, "one more pass, not one per change").await;
    assert_eq!(per_key.overlaps(), Vec::<String>::new(), "two handlers at once for one key");
}

#[tokio::test]
async fn an_error_is_retried_after_the_backoff_with_its_attempt_and_text() {
    let s = setup(&["a"]).await;
    let (tx, mut passes) = Passes::new();
    // Longer than the daemon takes: the SDK cuts it to 4096 bytes, inside a 3-byte character.
    let error = format!("the backend said no: {}", "€".repeat(2000));
    let spec = ReconcileSpec::new("retries", "configmaps")
        .namespace(&s.ns)
        .retry_backoff(Duration::from_millis(300), Duration::from_secs(10));
    let text = error.clone();
    let _r = spawn(s.daemon.client().reconcile(spec, move |item| {
        let _ = tx.send(Pass::of(&item));
        let text = text.clone();
        async move {
            if item.attempt == 1 {
                return Err(std::io::Error::other(text).into());
            }
            Ok(Action::done())
        }
    }));
    let first = passes.next().await;
    assert_eq!((first.attempt, first.last_error), (1, None));
    let second = passes.next().await;
    assert!(second.at - first.at >= Duration::from_millis(300), "after its backoff: {:?}", second.at - first.at);
    assert_eq!(second.attempt, 2);
    let sent = second.last_error.expect("the error of the first attempt");
    assert!(sent.len() <= 4096 && sent.len() > 4000, "{} bytes", sent.len());
    assert!(error.starts_with(&sent), "{sent}");
    passes.none_within(QUIET, "done after the second attempt").await;
}

#[tokio::test]
async fn requeue_hands_the_key_out_again_after_its_delay() {
    let s = setup(&["a"]).await;
    let (tx, mut passes) = Passes::new();
    let spec = ReconcileSpec::new("requeues", "configmaps").namespace(&s.ns);
    let ended = Arc::new(Mutex::new(None));
    let end = ended.clone();
    let _r = spawn(s.daemon.client().reconcile(spec, move |item| {
        let _ = tx.send(Pass::of(&item));
        let end = end.clone();
        async move {
            let mut end = end.lock().expect("lock");
            if end.is_some() {
                return Ok(Action::done());
            }
            *end = Some(Instant::now());
            Ok(Action::requeue(Duration::from_millis(300)))
        }
    }));
    let first = passes.next().await;
    let again = passes.next().await;
    let ended = ended.lock().expect("lock").expect("the first pass ended");
    assert!(again.at - ended >= Duration::from_millis(300), "requeued after {:?}", again.at - ended);
    assert_eq!((again.name.as_str(), again.attempt, again.last_error), ("a", 1, None), "not a failure");
    assert_ne!(again.lease, first.lease);
    passes.none_within(QUIET, "done after the requeued pass").await;
}

#[tokio::test]
async fn a_terminal_error_waits_until_the_object_changes() {
    let s = setup(&["a"]).await;
    let (tx, mut passes) = Passes::new();
    let spec = ReconcileSpec::new("terminal", "configmaps")
        .namespace(&s.ns)
        .retry_backoff(Duration::from_millis(5), Duration::from_millis(50));
    let _r = spawn(s.daemon.client().reconcile(spec, move |item| {
        let _ = tx.send(Pass::of(&item));
        async move {
            if item.json().is_some_and(|j| j.expect("JSON")["data"]["v"] == "0") {
                return Err(ReconcileError::terminal("data.v: 0 cannot be reconciled"));
            }
            Ok(Action::done())
        }
    }));
    let first = passes.next().await;
    assert_eq!(first.data["v"], "0");
    passes.none_within(QUIET, "a terminal failure was retried").await;
    set(&s.api, "a", "1").await;
    let changed = passes.next().await;
    assert_eq!((changed.name.as_str(), &changed.data["v"]), ("a", &json!("1")));
    passes.none_within(QUIET, "done after the change").await;
}

/// The key's next pass waits until the watch shows what a pass wrote naming its lease: here a related
/// object (a Secret that names the primary ConfigMap in a label), which the next pass reads back from the
/// daemon's cache. During each pass a third party changes the primary, so the key is ready again the
/// moment the pass ends, and clogs the daemon's watch of Secrets (an unrelated Secret's event held 2 s by
/// a delaying proxy in front of the apiserver, and every event after it on that connection with it), so
/// the pass's own write is answered at once while its watch event comes late.
#[tokio::test]
async fn writes_naming_the_lease_are_seen_by_the_keys_next_pass() {
    let proxy = Arc::new(DelayProxy::start(apiserver_addr()).await);
    let daemon = Daemon::builder(consistd_bin()).config("consistency:\n  timeout: 10s\n").through(&proxy);
    let s = setup_with(daemon, &["primary"]).await;
    let secrets: Api<Secret> = Api::namespaced(s.api.clone().into_client(), &s.ns);
    for (name, labels) in [("child", json!({ "owner": "primary" })), ("clog", json!({}))] {
        let secret =
            serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } })).expect("a Secret");
        secrets.create(&PostParams::default(), &secret).await.expect("create a Secret");
    }
    const ROUNDS: u64 = 4;
    // Per pass: the child's version the pass read from the cache, where from, the version it wrote, and
    // the item's consistency.
    let (tx, mut seen) = mpsc::unbounded_channel::<(u64, ReadSource, Option<u64>, Consistency)>();
    let spec = ReconcileSpec::new("leased-writes", "configmaps")
        .namespace(&s.ns)
        .related(Related::by_label("secrets", "owner").namespace(&s.ns));
    let (api, ns, delays) = (s.api.clone(), s.ns.clone(), proxy.clone());
    let rounds = Arc::new(Mutex::new(0_u64));
    let _r = spawn(s.daemon.client().reconcile(spec, move |item| {
        let (tx, api, secrets, ns, rounds, proxy) =
            (tx.clone(), api.clone(), secrets.clone(), ns.clone(), rounds.clone(), delays.clone());
        async move {
            let mut objects = item.objects();
            let get = GetRequest {
                resource: "secrets".into(),
                namespace: ns.clone(),
                name: "child".into(),
                ..Default::default()
            };
            let read = objects.get(get).await?.into_inner();
            let source = read.source();
            let read_rv = read.object.expect("the child").resource_version.parse().expect("integer");
            let round = {
                let mut rounds = rounds.lock().expect("lock");
                *rounds += 1;
                *rounds
            };
            if round > ROUNDS {
                let _ = tx.send((read_rv, source, None, item.consistency));
                return Ok(Action::done());
            }
            // A third party changes the primary; its event reaches the daemon: one more pass.
            let third = json!({ "data": { "third": round.to_string() } });
            api.patch("primary", &PatchParams::default(), &Patch::Merge(&third)).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            // The clog: what the daemon's watch of Secrets reads next is held 2 s, and all after it.
            proxy.set_delay(Duration::from_secs(2));
            let clog = json!({ "metadata": { "annotations": { "round": round.to_string() } } });
            secrets.patch("clog", &PatchParams::default(), &Patch::Merge(&clog)).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            proxy.set_delay(Duration::ZERO);
            let write = PatchRequest {
                resource: "secrets".into(),
                namespace: ns,
                name: "child".into(),
                patch_type: PatchType::Merge.into(),
                patch: json!({ "metadata": { "annotations": { "round": round.to_string() } } })
                    .to_string()
                    .into_bytes(),
                ..Default::default()
            };
            let written = objects.patch(write).await?.into_inner().object.expect("the child");
            let written = Some(written.resource_version.parse().expect("integer"));
            let _ = tx.send((read_rv, source, written, item.consistency));
            Ok(Action::done())
        }
    }));
    let next = async |seen: &mut mpsc::UnboundedReceiver<_>| {
        tokio::time::timeout(WAIT, seen.recv()).await.expect("a pass in time").expect("a pass")
    };
    let (_, _, mut written, _) = next(&mut seen).await;
    for round in 1..=ROUNDS {
        let (read, source, wrote, consistency) = next(&mut seen).await;
        assert_eq!(source, ReadSource::Cache, "round {round}: the child was not read from the daemon's cache");
        let before = written.expect("the previous pass wrote");
        assert!(read >= before, "round {round}: the pass read the child at {read}, older than its write {before}");
        assert_eq!(consistency, Consistency::Consistent, "round {round}");
        written = wrote;
    }
}

/// The first state of a leadership stream that is `want`.
async fn until(
    states: &mut (impl Stream<Item = Result<Leadership, consistd_client::Error>> + Unpin),
    want: LeadershipState,
) -> Leadership {
    let wanted = async {
        while let Some(state) = states.next().await {
            let state = state.expect("a leadership state");
            if state.state == want {
                return state;
            }
        }
        panic!("the leadership stream ended");
    };
    tokio::time::timeout(WAIT, wanted).await.unwrap_or_else(|_| panic!("not {want:?} within {WAIT:?}"))
}

/// A merge patch of `data.v` of the ConfigMap `ns/name`, with `guard`.
fn guarded(ns: &str, name: &str, value: &str, guard: Option<WriteGuard>) -> PatchRequest {
    PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.into(),
        name: name.into(),
        patch_type: PatchType::Merge.into(),
        patch: json!({ "data": { "v": value } }).to_string().into_bytes(),
        guard,
        ..Default::default()
    }
}

/// A queue with an election hands out work only while this daemon leads it (its app campaigns through
/// the SDK; another daemon leads before and after), each item with the term it was granted in and that
/// term's guard, which the handler's write passes. Once the other daemon has taken the Lease over, a write
/// with that guard is refused. The election's namespace is empty (the daemons' own), as in the guard.
#[tokio::test]
async fn a_queue_with_an_election_works_only_while_this_pod_leads_and_guards_writes_with_the_items_term() {
    let ours = Daemon::builder(consistd_bin()).config("identity: sdk-rust-elected-a");
    let other = Daemon::builder(consistd_bin()).config("identity: sdk-rust-elected-b").start();
    let (s, other) = tokio::join!(setup_with(ours, &["a"]), other);
    // Named after the test's namespace, so no other test campaigns in it.
    let election = s.ns.clone();
    let campaign = CampaignRequest { election: election.clone(), ..Default::default() };
    let client = s.daemon.client();
    let mut on_other = Box::pin(other.client().campaign(campaign.clone()));
    let first_term = until(&mut on_other, LeadershipState::Leader).await.term;

    let (tx, mut passes) = Passes::new();
    let (wrote, mut writes) = mpsc::unbounded_channel::<Result<(), tonic::Status>>();
    let spec = ReconcileSpec::new("elected", "configmaps").namespace(&s.ns).election(&election, "");
    let ns = s.ns.clone();
    let _r = spawn(client.reconcile(spec, move |item| {
        let (tx, wrote, ns) = (tx.clone(), wrote.clone(), ns.clone());
        async move {
            let pass = Pass::of(&item);
            let _ = tx.send(pass.clone());
            if pass.data["v"] == "0" {
                let written = item.objects().patch(guarded(&ns, &item.name, "led", item.guard.clone())).await;
                let _ = wrote.send(written.map(drop));
            }
            Ok(Action::done())
        }
    }));
    let mut on_ours = Box::pin(client.campaign(campaign.clone()));
    until(&mut on_ours, LeadershipState::Follower).await;
    passes.none_within(QUIET, "work while another pod leads the election").await;

    // The other daemon resigns: this one leads, in a later term, and the key is handed out.
    drop(on_other);
    let led = until(&mut on_ours, LeadershipState::Leader).await;
    assert!(led.term > first_term, "{led:?} after term {first_term}");
    let first = passes.next().await;
    let guard = WriteGuard { election: election.clone(), namespace: String::new(), term: led.term };
    assert_eq!((first.name.as_str(), first.term), ("a", led.term), "granted in the term this pod leads");
    assert_eq!(first.guard.as_ref(), Some(&guard));
    let written = tokio::time::timeout(WAIT, writes.recv()).await.expect("a write in time").expect("a write");
    written.expect("the write with the item's guard");
    // The write was the item's own: no pass for it. Anyone else's change: one more pass, in the same term.
    passes.none_within(QUIET, "a pass for the handler's own write").await;
    set(&s.api, "a", "third").await;
    let again = passes.next().await;
    assert_eq!((&again.data["v"], again.term, again.guard.as_ref()), (&json!("third"), led.term, Some(&guard)));

    // The other daemon takes the Lease over: no more work here, and the old term's guard is refused.
    let mut on_other = Box::pin(other.client().campaign(campaign));
    until(&mut on_other, LeadershipState::Follower).await;
    drop(on_ours);
    let taken = until(&mut on_other, LeadershipState::Leader).await;
    assert!(taken.term > led.term, "{taken:?} after {led:?}");
    set(&s.api, "a", "changed").await;
    passes.none_within(QUIET, "work after another pod took the election over").await;
    let refused = client.objects().patch(guarded(&s.ns, "a", "late", Some(guard))).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(writes.try_recv().is_err(), "the handler wrote again");
}

#[tokio::test]
async fn a_spec_the_daemon_refuses_ends_the_reconciler_with_its_status_naming_the_field() {
    let s = setup(&[]).await;
    let client = s.daemon.client();
    let refused = async |spec: ReconcileSpec| {
        let run = client.reconcile(spec, |_item| async { Ok(Action::done()) });
        match tokio::time::timeout(WAIT, run).await.expect("an answer in time") {
            Err(consistd_client::Error::Status(status)) => status,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    let status = refused(ReconcileSpec::new("bad", "configmaps").namespace(&s.ns).max_leases(0)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert!(status.message().starts_with("spec.max_leases"), "{status}");
    let status = refused(ReconcileSpec::new("Not_A_Label", "configmaps").namespace(&s.ns)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert!(status.message().starts_with("spec.name"), "{status}");
    let status = refused(ReconcileSpec::new("bad", "nosuchthings").namespace(&s.ns)).await;
    assert_eq!(status.code(), tonic::Code::NotFound, "{status}");
    assert!(status.message().starts_with("spec.primary"), "{status}");
}

#[tokio::test]
async fn a_lost_connection_reopens_the_queue_drops_the_old_completions_and_never_runs_a_key_twice_at_once() {
    let s = setup(&["a"]).await;
    let proxy = UnixProxy::start(s.daemon.socket());
    let client = Client::new(proxy.path());
    let (tx, mut passes) = Passes::new();
    let per_key = PerKey::default();
    let gate = Arc::new(Semaphore::new(0));
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let (keys, held, refused) = (per_key.clone(), gate.clone(), refusals.clone());
    let spec = ReconcileSpec::new("reconnects", "configmaps").namespace(&s.ns).max_leases(2);
    let reconciler = Reconciler::new(&client, spec).on_refused(move |lease, status| {
        refused.lock().expect("lock").push(format!("{lease}: {status}"));
    });
    let mut calls = 0;
    let _r = spawn(reconciler.run(move |item| {
        let (tx, keys, gate) = (tx.clone(), keys.clone(), held.clone());
        calls += 1;
        let first = calls == 1;
        async move {
            keys.enter(&item.name);
            let _ = tx.send(Pass::of(&item));
            if first {
                // Busy until the test lets it end, across the lost connection.
                gate.acquire().await.expect("gate").forget();
            }
            keys.leave(&item.name);
            Ok(Action::done())
        }
    }));
    let first = passes.next().await;
    proxy.cut();
    // The daemon returned the lease when the stream broke and hands the key to the new stream, but its
    // handler waits until the old one ends.
    passes.none_within(QUIET, "a second handler for the key while the first runs").await;
    gate.add_permits(1);
    let again = passes.next().await;
    assert_eq!(again.name, "a");
    assert_ne!(again.lease, first.lease, "a lease of the new stream");
    passes.none_within(QUIET, "the key was done").await;
    assert_eq!(per_key.overlaps(), Vec::<String>::new(), "two handlers at once for one key");
    assert_eq!(*refusals.lock().expect("lock"), Vec::<String>::new(), "a completion went out on the wrong stream");
}

#[tokio::test]
async fn a_graceful_shutdown_lets_the_running_handler_complete_its_lease() {
    let s = setup(&["a"]).await;
    let client = s.daemon.client();
    let (tx, mut passes) = Passes::new();
    let gate = Arc::new(Semaphore::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let spec = ReconcileSpec::new("shutdown", "configmaps").namespace(&s.ns);
    let held = gate.clone();
    let reconciler = Reconciler::new(&client, spec.clone()).graceful_shutdown_on(async {
        let _ = stopped.await;
    });
    let mut run = tokio::spawn(reconciler.run(move |item| {
        let (tx, gate) = (tx.clone(), held.clone());
        async move {
            let _ = tx.send(Pass::of(&item));
            gate.acquire().await.expect("gate").forget();
            Ok(Action::done())
        }
    }));
    passes.next().await;
    // Another stream of the queue, attached while the key is leased: it is handed the key only if the
    // lease goes back to the queue instead of being completed.
    let (tx, mut after) = Passes::new();
    let _r = spawn(client.reconcile(spec, move |item| {
        let _ = tx.send(Pass::of(&item));
        async { Ok(Action::done()) }
    }));
    after.none_within(QUIET, "the other stream was handed the leased key").await;
    stop.send(()).expect("signal");
    assert!(tokio::time::timeout(QUIET, &mut run).await.is_err(), "returned while its handler was running");
    gate.add_permits(1);
    let ended = tokio::time::timeout(WAIT, run).await.expect("returned in time").expect("joined");
    assert!(ended.is_ok(), "{ended:?}");
    // The lease was completed DONE, not returned to the queue: the other stream gets nothing.
    after.none_within(QUIET, "the key came again after its handler completed").await;
}
