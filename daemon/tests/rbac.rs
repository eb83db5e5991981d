//! manifests/base/rbac.yaml is what consistd needs, no less: daemons run as the base's ServiceAccount
//! (authenticated with a TokenRequest token, as in a pod), bound by the base's RoleBinding to the base's
//! Role, all three read from the repository's files. With that Role every job of the example app works
//! through the daemon's API; with one permission taken out, the job that needs it fails with an error
//! that names the verb and the resource, where a user looks: the call's gRPC status, `consistd status`
//! and /readyz, or the daemon's log for work no call waits on.

use std::{
    path::{Path, PathBuf},
    pin::Pin,
    time::Duration,
};

use consistd_client::{
    Client, Leadership, Watch,
    proto::{
        CampaignRequest, CreateRequest, Destination, EventType, GetOutboxStatusRequest, GetRolloutStatusRequest,
        GetRolloutStatusResponse, LeaseTiming, PatchRequest, PatchType, PublishRequest, ReportAppliedRequest,
        SendRequest, ServiceDestination, SubscribeVersionsRequest, SubscribeVersionsResponse, WaitAppliedRequest,
        WriteGuard, destination::Target,
    },
};
use consistd_testkit::{Daemon, free_port, host_ip};
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Service, ServiceAccount},
    discovery::v1::EndpointSlice,
    rbac::v1::{Role, RoleBinding},
};
use kube::api::{Api, ListParams, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::{Code, Status, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
/// How long any one step may take on a busy 2-core machine.
const WAIT: Duration = Duration::from_secs(20);
/// The example app's election, as in examples/.
const ELECTION: &str = "greeting-operator";
/// The rollout channel the app subscribes to.
const CHANNEL: &str = "config";
/// The ConfigMap the app creates and patches.
const CONFIGMAP: &str = "settings";

/// A manifests/base file's documents.
fn base_documents(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("parse {}: {e}", path.display())))
        .collect()
}

/// A manifest object as its Kubernetes type.
fn parsed<T: serde::de::DeserializeOwned>(kind: &str, object: Value) -> T {
    serde_json::from_value(object).unwrap_or_else(|e| panic!("a {kind}: {e}"))
}

/// One permission taken out of the base Role.
#[derive(Debug, Clone, Copy)]
enum Removal {
    /// One verb on one resource (its rule keeps the others).
    Verb(&'static str, &'static str),
    /// Every verb on one resource.
    Resource(&'static str),
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Removal::Verb(verb, resource) => write!(f, "without {verb} on {resource}"),
            Removal::Resource(resource) => write!(f, "without {resource} at all"),
        }
    }
}

impl Removal {
    /// Takes the permission out of every rule of `role` that grants it, failing the test if none does (the
    /// table below is out of date then).
    fn apply(self, role: &mut Value) {
        let (verb, resource) = match self {
            Removal::Verb(verb, resource) => (Some(verb), resource),
            Removal::Resource(resource) => (None, resource),
        };
        let rules: Vec<Value> = serde_json::from_value(role["rules"].take()).expect("the base Role's rules");
        let mut kept = Vec::new();
        let mut removed = false;
        for mut rule in rules {
            let resources: Vec<Value> = rule["resources"].as_array().cloned().unwrap_or_default();
            if !resources.iter().any(|n| n == resource) {
                kept.push(rule);
                continue;
            }
            // A rule for several resources keeps the others.
            let others: Vec<Value> = resources.into_iter().filter(|n| n != resource).collect();
            if !others.is_empty() {
                let mut rest = rule.clone();
                rest["resources"] = json!(others);
                kept.push(rest);
                rule["resources"] = json!([resource]);
            }
            let Some(verb) = verb else {
                removed = true;
                continue;
            };
            let verbs = rule["verbs"].as_array_mut().unwrap_or_else(|| panic!("a rule for {resource} has no verbs"));
            assert!(!verbs.iter().any(|v| v == "*"), "a rule for {resource} grants every verb");
            let before = verbs.len();
            verbs.retain(|v| v != verb);
            removed |= verbs.len() < before;
            if !verbs.is_empty() {
                kept.push(rule);
            }
        }
        assert!(removed, "the base Role has nothing to take out: {self}");
        role["rules"] = json!(kept);
    }
}

/// A namespace of its own where the base's ServiceAccount is bound by the base's RoleBinding to the
/// base's Role (less one permission), and a kubeconfig that authenticates as that ServiceAccount.
struct Granted {
    /// The namespace: the daemons' own, where the Role grants what it grants.
    ns: String,
    /// A kubeconfig with the ServiceAccount's token.
    kubeconfig: PathBuf,
    /// Holds the kubeconfig.
    _dir: tempfile::TempDir,
}

async fn grant(kube: &kube::Client, removal: Option<Removal>) -> Granted {
    let ns = consistd_testkit::namespace(kube).await;
    let create = PostParams::default();
    let mut account = None;
    for mut object in base_documents("serviceaccount.yaml").into_iter().chain(base_documents("rbac.yaml")) {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        match kind.as_str() {
            "ServiceAccount" => {
                let sa: ServiceAccount = parsed(&kind, object);
                account = sa.metadata.name.clone();
                Api::namespaced(kube.clone(), &ns).create(&create, &sa).await.expect("create the ServiceAccount");
            }
            "Role" => {
                if let Some(removal) = removal {
                    removal.apply(&mut object);
                }
                let role: Role = parsed(&kind, object);
                Api::namespaced(kube.clone(), &ns).create(&create, &role).await.expect("create the Role");
            }
            "RoleBinding" => {
                let binding: RoleBinding = parsed(&kind, object);
                Api::namespaced(kube.clone(), &ns).create(&create, &binding).await.expect("create the RoleBinding");
            }
            other => panic!("manifests/base RBAC: unexpected kind {other:?}"),
        }
    }
    let account = account.unwrap_or_else(|| panic!("manifests/base/serviceaccount.yaml names no ServiceAccount"));
    let dir = tempfile::Builder::new().prefix("consistd-rbac-").tempdir().expect("temp dir");
    let kubeconfig = consistd_testkit::kubeconfig_for_service_account(kube, &ns, &account, dir.path()).await;
    Granted { ns, kubeconfig, _dir: dir }
}

/// The app's daemon: the example's sidecar, as the ServiceAccount, with a peer address (rollout
/// versions and election groups) on loopback and a 3 s membership TTL.
async fn app_daemon(g: &Granted) -> Daemon {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "identity: app\nnamespace: {}\npeer:\n  listen: \"{addr}\"\n  advertise: \"{addr}\"\n  insecure: true\n\
         membership:\n  ttl: 3s\noutbox:\n  backoff: {{initial: 20ms, factor: 2, cap: 500ms}}\n",
        g.ns
    );
    Daemon::builder(BIN).config(config).env("KUBECONFIG", g.kubeconfig.display().to_string()).start().await
}

/// Another replica's daemon, as the same ServiceAccount, receiving on this machine's address (an
/// EndpointSlice may not point at loopback); returns its peer port.
async fn peer_daemon(g: &Granted) -> (Daemon, u16) {
    let port = free_port();
    let config =
        format!("identity: peer\nnamespace: {}\npeer:\n  listen: \"{}:{port}\"\n  insecure: true\n", g.ns, host_ip());
    (Daemon::builder(BIN).config(config).env("KUBECONFIG", g.kubeconfig.display().to_string()).start().await, port)
}

/// The base's headless Service (from manifests/base/service.yaml) and the EndpointSlice its controller
/// would write for one ready replica whose peer port is `port`; returns the Service's name.
async fn service_with_endpoint(kube: &kube::Client, ns: &str, port: u16) -> String {
    let document = base_documents("service.yaml").pop().expect("manifests/base/service.yaml has a Service");
    let service: Service = serde_json::from_value(document).expect("a Service");
    let name = service.metadata.name.clone().expect("the Service has a name");
    Api::namespaced(kube.clone(), ns).create(&PostParams::default(), &service).await.expect("create the Service");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": { "name": format!("{name}-replica"), "labels": { "kubernetes.io/service-name": name } },
        "addressType": "IPv4",
        "ports": [{ "name": "consistd-peer", "port": port, "protocol": "TCP" }],
        "endpoints": [{ "addresses": [host_ip().to_string()], "conditions": { "ready": true } }]
    }))
    .expect("an EndpointSlice");
    Api::namespaced(kube.clone(), ns).create(&PostParams::default(), &slice).await.expect("create the EndpointSlice");
    name
}

/// The gRPC status of an SDK error.
fn status(error: consistd_client::Error) -> Status {
    match error {
        consistd_client::Error::Status(status) => status,
        other => panic!("not an answer from the daemon: {other}"),
    }
}

/// A stream of the Rust SDK, boxed so it can be kept across awaits.
type SdkStream<T> = Pin<Box<dyn Stream<Item = Result<T, consistd_client::Error>> + Send>>;

/// The next item of an SDK stream within [`WAIT`].
async fn next<T>(stream: &mut SdkStream<T>, what: &str) -> Result<T, Status> {
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(item)) => item.map_err(status),
        Ok(None) => panic!("{what}: the stream ended"),
        Err(_) => panic!("{what}: nothing within {WAIT:?}"),
    }
}

/// Watching: list and watch the namespace's ConfigMaps until SYNCED, as the example does.
async fn watch_configmaps(client: &Client, ns: &str) -> Result<SdkStream<consistd_client::Event>, Status> {
    let mut events: SdkStream<consistd_client::Event> =
        Box::pin(client.subscribe(Watch::new("configmaps").namespace(ns)));
    while next(&mut events, "Subscribe configmaps").await?.kind != EventType::Synced {}
    Ok(events)
}

/// Creating the app's ConfigMap through ObjectsService.
async fn create_configmap(client: &Client, ns: &str) -> Result<(), Status> {
    let object = json!({ "metadata": { "name": CONFIGMAP }, "data": { "mode": "a" } });
    let request = CreateRequest {
        resource: "configmaps".into(),
        namespace: ns.to_owned(),
        object: object.to_string().into_bytes(),
        ..Default::default()
    };
    client.objects().create(request).await.map(drop)
}

/// Campaigning in the example's election: the stream of states. `fast`: a 2 s Lease, renewed every
/// 250 ms with a 1 s deadline, where a test waits for Lease steps to fail.
fn campaign(client: &Client, fast: bool) -> SdkStream<Leadership> {
    let timing = fast.then_some(LeaseTiming {
        lease_duration: Some(prost_types::Duration { seconds: 2, nanos: 0 }),
        renew_deadline: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
        retry_period: Some(prost_types::Duration { seconds: 0, nanos: 250_000_000 }),
    });
    Box::pin(client.campaign(CampaignRequest { election: ELECTION.into(), timing, ..Default::default() }))
}

/// Waits for a state `want` says yes to.
async fn until_state(states: &mut SdkStream<Leadership>, want: impl Fn(&Leadership) -> bool) -> Leadership {
    loop {
        let state = next(states, "Campaign").await.unwrap_or_else(|e| panic!("Campaign: {e}"));
        if want(&state) {
            return state;
        }
    }
}

/// A merge patch of the app's ConfigMap guarded by the term the app leads in.
async fn guarded_patch(client: &Client, ns: &str, lead: &Leadership) -> Result<(), Status> {
    let request = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.to_owned(),
        name: CONFIGMAP.into(),
        patch_type: PatchType::Merge.into(),
        patch: br#"{"data":{"mode":"b"}}"#.to_vec(),
        guard: Some(WriteGuard { election: lead.election.clone(), namespace: lead.namespace.clone(), term: lead.term }),
        ..Default::default()
    };
    client.objects().patch(request).await.map(drop)
}

/// Joining the rollout channel: its versions, latest first.
async fn subscribe_versions(client: &Client) -> Streaming<SubscribeVersionsResponse> {
    let request = SubscribeVersionsRequest { channel: CHANNEL.into() };
    client.rollout().subscribe_versions(request).await.expect("SubscribeVersions").into_inner()
}

/// Publishes on the channel once this daemon leads it (it joined a moment ago).
async fn publish(client: &Client, payload: &str) -> Result<u64, Status> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let request = PublishRequest {
            channel: CHANNEL.into(),
            payload: payload.into(),
            content_type: "text/plain".into(),
            ..Default::default()
        };
        match client.rollout().publish(request).await {
            Ok(r) => return Ok(r.into_inner().version),
            // Nobody leads the channel yet.
            Err(e) if e.code() == Code::Unavailable && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn next_version(versions: &mut Streaming<SubscribeVersionsResponse>) -> u64 {
    let item = tokio::time::timeout(WAIT, versions.message()).await.expect("a version in time");
    item.expect("SubscribeVersions").expect("the stream is open").version
}

async fn report_applied(client: &Client, version: u64) -> Result<(), Status> {
    client.rollout().report_applied(ReportAppliedRequest { channel: CHANNEL.into(), version }).await.map(drop)
}

async fn rollout_status(client: &Client, version: u64) -> Result<GetRolloutStatusResponse, Status> {
    let request = GetRolloutStatusRequest { channel: CHANNEL.into(), version };
    client.rollout().get_rollout_status(request).await.map(tonic::Response::into_inner)
}

/// An ACK-tracked send to every ready replica of Service `service`.
fn to_service(service: &str) -> SendRequest {
    SendRequest {
        destination: Some(Destination {
            target: Some(Target::Service(ServiceDestination { namespace: String::new(), name: service.to_owned() })),
        }),
        resource_id: format!("configmaps/{CONFIGMAP}"),
        event_id: "1".into(),
        payload: br#"{"keys":["mode"]}"#.to_vec(),
        content_type: "application/json".into(),
        ..Default::default()
    }
}

/// The member Leases of the namespace's election groups.
async fn member_leases(kube: &kube::Client, ns: &str) -> Vec<String> {
    let leases = Api::<Lease>::namespaced(kube.clone(), ns)
        .list(&ListParams::default().labels("consistd.io/member-of"))
        .await
        .expect("list member Leases");
    leases.items.into_iter().filter_map(|l| l.metadata.name).collect()
}

/// Polls `check` every 100 ms until it answers, failing the test with `what` after [`WAIT`].
async fn until<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(answer) = check().await {
            return answer;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The daemon's log line with `message` that names `expected`, once there is one.
async fn logged(daemon: &Daemon, message: &str, expected: &str) -> String {
    let what = format!("a log line {message:?} naming {expected:?}");
    until(&what, || async {
        daemon.logs().lines().find(|l| l.contains(message) && l.contains(expected)).map(str::to_owned)
    })
    .await
}

/// /readyz once it is 503 naming `expected` (a campaigning election's Lease steps failed for its lease
/// duration); `consistd status` names it for the election too.
async fn unready(daemon: &Daemon, expected: &str) -> String {
    let why = until(&format!("/readyz naming {expected:?}"), || async {
        let (code, body) = consistd_server::admin::get(daemon.admin_socket(), "/readyz").await.expect("GET /readyz");
        let body = String::from_utf8_lossy(&body).into_owned();
        (code == http::StatusCode::SERVICE_UNAVAILABLE && body.contains(expected)).then_some(body)
    })
    .await;
    let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("consistd status");
    let election = report.elections.iter().find(|e| e.election.ends_with(ELECTION)).expect("the election");
    assert!(election.error.as_deref().is_some_and(|e| e.contains(expected)), "{election:?}");
    assert_ne!(election.role, "LEADER", "{election:?}");
    why
}

/// What the apiserver's RBAC says when it refuses `verb` on `resource`.
fn refusal(verb: &str, resource: &str) -> String {
    format!("cannot {verb} resource \"{resource}\"")
}

#[tokio::test]
async fn with_the_base_role_every_job_of_the_example_app_works() {
    let kube = consistd_testkit::kube_client().await;
    let g = grant(&kube, None).await;
    let (peer, peer_port) = peer_daemon(&g).await;
    let service = service_with_endpoint(&kube, &g.ns, peer_port).await;
    let app = app_daemon(&g).await;
    let client = app.client();

    // Watching ConfigMaps (list, watch), then creating one and seeing it arrive.
    let mut events = watch_configmaps(&client, &g.ns).await.expect("Subscribe configmaps");
    create_configmap(&client, &g.ns).await.expect("ObjectsService.Create configmaps");
    let added = next(&mut events, "Subscribe configmaps").await.expect("Subscribe configmaps");
    assert_eq!((added.kind, added.object.map(|o| o.name)), (EventType::Added, Some(CONFIGMAP.to_owned())));

    // Leading the example's election (its Lease created) and writing with the term.
    let mut states = campaign(&client, false);
    let lead = until_state(&mut states, Leadership::is_leader).await;
    assert_eq!(lead.term, 1, "{lead:?}");
    guarded_patch(&client, &g.ns, &lead).await.expect("guarded ObjectsService.Patch configmaps");
    let modified = next(&mut events, "Subscribe configmaps").await.expect("Subscribe configmaps");
    assert_eq!(modified.kind, EventType::Modified);

    // A rollout channel: two versions (the channel's ConfigMap created, then updated), each delivered
    // to the app through the election group and reported applied (the leader, this daemon, records it on
    // its member Lease), and the barrier read from the member Leases.
    let mut versions = subscribe_versions(&client).await;
    for version in 1..=2 {
        assert_eq!(publish(&client, &format!("v{version}")).await.expect("Publish"), version);
        assert_eq!(next_version(&mut versions).await, version);
        report_applied(&client, version).await.expect("ReportApplied");
    }
    let request = WaitAppliedRequest {
        channel: CHANNEL.into(),
        version: 2,
        timeout: Some(prost_types::Duration { seconds: 10, nanos: 0 }),
    };
    let opened = client.rollout().wait_applied(request).await.expect("WaitApplied").into_inner();
    assert!(opened.all_applied, "{opened:?}");
    let standing = rollout_status(&client, 2).await.expect("GetRolloutStatus");
    let members: Vec<(&str, u64, bool)> =
        standing.members.iter().map(|m| (m.member.as_str(), m.applied_version, m.live)).collect();
    assert_eq!(members, vec![("app", 2, true)], "{standing:?}");
    assert!(standing.all_applied, "{standing:?}");

    // An ACK-tracked send to the Service reaches the replica behind its EndpointSlice and is ACKed.
    let mut deliveries: SdkStream<consistd_client::Delivery> = Box::pin(peer.client().receive());
    let sent = client.send(to_service(&service)).await.expect("Send to the Service");
    let delivery = next(&mut deliveries, "Receive").await.expect("Receive");
    assert_eq!(delivery.message.resource_id, format!("configmaps/{CONFIGMAP}"));
    delivery.ack().await.expect("Ack");
    let outcome = tokio::time::timeout(WAIT, sent).await.expect("an outcome in time").expect("the outcome");
    assert!(outcome.is_acked(), "{outcome:?}");

    // Leaving the election and the channel deletes the member Leases.
    assert_eq!(member_leases(&kube, &g.ns).await.len(), 2, "one member Lease per election group");
    drop((states, versions));
    until("member Leases deleted", || async { member_leases(&kube, &g.ns).await.is_empty().then_some(()) }).await;

    // Ready, and nothing was refused along the way, not even in the background.
    let report = consistd_server::admin::fetch_report(app.admin_socket()).await.expect("consistd status");
    assert!(report.ready, "{:?}", report.not_ready_reasons);
    let fencing = report.fencing.expect("consistd status says where guarded writes are fenced");
    assert!(
        fencing.at_apiserver,
        "the base Role and manifests/fencing let the guarded patch be fenced there: {fencing:?}"
    );
    for (name, daemon) in [("app", &app), ("peer", &peer)] {
        let logs = daemon.logs();
        assert!(!logs.contains("is forbidden: User"), "the {name} daemon was refused something:\n{logs}");
    }
}

/// A job of the example app, run where one permission is missing.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// Subscribe to ConfigMaps until SYNCED: the call fails.
    Watch,
    /// Create the app's ConfigMap: the call fails.
    Create,
    /// Lead the election and patch with the term: the patch fails.
    GuardedPatch,
    /// Campaign: never LEADER; `consistd status` and /readyz say why.
    Lead,
    /// Campaign while another holds the Lease and does not renew it: no watch event shows the view
    /// current, so the daemon reads the Lease, which fails; `consistd status` and /readyz say why.
    Follow,
    /// Campaign: LEADER, then not, as renewals fail; `consistd status` and /readyz say why.
    Renew,
    /// Publish two versions: the second (an update of the channel's ConfigMap) fails.
    Publish,
    /// Publish, then report the version applied: the report (the member Lease's write) fails.
    Report,
    /// Read the channel's standing: the call fails.
    Standing,
    /// Campaign, then resign: the member Lease cannot be deleted; the log says why.
    Leave,
    /// Send to the Service: stored, but its endpoints cannot be read; GetOutboxStatus and the log say why.
    Send,
    /// Lead and patch with the term: the patch is checked in this daemon only, and `consistd status` says why.
    Fence,
}

/// Runs `job` as the ServiceAccount granted the base Role `removal`, and returns the error it gave,
/// which must name `verb` on `resource`.
async fn broken(kube: kube::Client, removal: Removal, job: Job, verb: &'static str, resource: &'static str) -> String {
    let g = grant(&kube, Some(removal)).await;
    let app = app_daemon(&g).await;
    let client = app.client();
    let expected = refusal(verb, resource);
    // A refused call: PERMISSION_DENIED, naming the permission.
    let denied = |result: Result<(), Status>| {
        let e = result.err().unwrap_or_else(|| panic!("{removal}: {job:?} succeeded"));
        assert_eq!(e.code(), Code::PermissionDenied, "{removal}: {job:?}: {e:?}");
        assert!(e.message().contains(&expected), "{removal}: {job:?}: the error names {expected:?}: {e:?}");
        e.message().to_owned()
    };
    match job {
        Job::Fence => {
            let configmap: ConfigMap =
                serde_json::from_value(json!({ "metadata": { "name": CONFIGMAP } })).expect("cm");
            Api::namespaced(kube.clone(), &g.ns).create(&PostParams::default(), &configmap).await.expect("create");
            let fencing = until(&format!("{removal}: consistd status saying where writes are fenced"), || async {
                let report = consistd_server::admin::fetch_report(app.admin_socket()).await.expect("consistd status");
                report.fencing.filter(|f| f.detail.contains(&expected))
            })
            .await;
            assert!(!fencing.at_apiserver, "{removal}: {fencing:?}");
            let mut states = campaign(&client, false);
            let lead = until_state(&mut states, Leadership::is_leader).await;
            guarded_patch(&client, &g.ns, &lead).await.expect("a guarded patch checked in this daemon");
            logged(&app, "guarded writes are fenced in this daemon only", &expected).await;
            fencing.detail
        }
        Job::Watch => {
            let message = denied(watch_configmaps(&client, &g.ns).await.map(drop));
            assert!(!message.contains("label_selector"), "{removal}: no selector was given: {message}");
            message
        }
        Job::Create => denied(create_configmap(&client, &g.ns).await),
        Job::GuardedPatch => {
            let configmap: ConfigMap =
                serde_json::from_value(json!({ "metadata": { "name": CONFIGMAP } })).expect("cm");
            Api::namespaced(kube.clone(), &g.ns).create(&PostParams::default(), &configmap).await.expect("create");
            let mut states = campaign(&client, false);
            let lead = until_state(&mut states, Leadership::is_leader).await;
            denied(guarded_patch(&client, &g.ns, &lead).await)
        }
        Job::Lead => {
            let mut states = campaign(&client, true);
            let state = until_state(&mut states, |_| true).await;
            assert!(!state.is_leader(), "{removal}: {state:?}");
            unready(&app, &expected).await
        }
        Job::Follow => {
            let ghost: Lease = serde_json::from_value(json!({
                "metadata": { "name": ELECTION },
                "spec": { "holderIdentity": "ghost", "leaseDurationSeconds": 3600 },
            }))
            .expect("lease");
            Api::namespaced(kube.clone(), &g.ns).create(&PostParams::default(), &ghost).await.expect("create");
            let mut states = campaign(&client, true);
            let campaigning = consistd_testkit::spawn(async move { while states.next().await.is_some() {} });
            let line = unready(&app, &expected).await;
            campaigning.abort();
            line
        }
        Job::Renew => {
            // Without update the daemon creates the Lease but never renews it. Whether it says LEADER before
            // its 1 s renew deadline lapses depends on the machine's load (sixteen daemons start at once
            // here), so the check is where it ends: unready naming the permission, and not LEADER (both in
            // `unready`).
            let mut states = campaign(&client, true);
            let campaigning = consistd_testkit::spawn(async move { while states.next().await.is_some() {} });
            let line = unready(&app, &expected).await;
            campaigning.abort();
            line
        }
        Job::Publish => {
            let _versions = subscribe_versions(&client).await;
            assert_eq!(publish(&client, "v1").await.expect("the first Publish creates the ConfigMap"), 1);
            denied(publish(&client, "v2").await.map(drop))
        }
        Job::Report => {
            let _versions = subscribe_versions(&client).await;
            assert_eq!(publish(&client, "v1").await.expect("Publish"), 1);
            denied(report_applied(&client, 1).await)
        }
        Job::Standing => denied(rollout_status(&client, 0).await.map(drop)),
        Job::Leave => {
            let mut states = campaign(&client, false);
            until_state(&mut states, Leadership::is_leader).await;
            until("the member Lease", || async { (!member_leases(&kube, &g.ns).await.is_empty()).then_some(()) }).await;
            drop(states);
            let line = logged(&app, "could not delete member Lease", &expected).await;
            assert_eq!(member_leases(&kube, &g.ns).await.len(), 1, "{removal}: the member Lease is left to expire");
            line
        }
        Job::Send => {
            let service = service_with_endpoint(&kube, &g.ns, free_port()).await;
            client.send(to_service(&service)).await.expect("Send stores the message");
            logged(&app, "cannot watch the Service's endpoints", &expected).await;
            // What GetOutboxStatus says of the message waiting for the Service.
            until(&format!("{removal}: GetOutboxStatus naming {expected:?}"), || async {
                let status = client.outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status");
                let status = status.into_inner();
                assert_eq!(status.total_pending, 1, "{removal}: the message waits: {status:?}");
                let waiting = status.destinations.first().and_then(|d| d.pending.first());
                waiting.map(|p| p.last_error.clone()).filter(|e| e.contains(&expected))
            })
            .await
        }
    }
}

#[tokio::test]
async fn without_any_one_permission_of_the_base_role_the_job_that_needs_it_fails_naming_it() {
    use Removal::{Resource, Verb};
    let table = [
        (Verb("list", "configmaps"), Job::Watch, "list", "configmaps"),
        (Verb("watch", "configmaps"), Job::Watch, "watch", "configmaps"),
        (Verb("create", "configmaps"), Job::Create, "create", "configmaps"),
        (Verb("patch", "configmaps"), Job::GuardedPatch, "patch", "configmaps"),
        (Verb("update", "configmaps"), Job::Publish, "update", "configmaps"),
        (Verb("get", "configmaps"), Job::Standing, "get", "configmaps"),
        (Verb("get", "leases"), Job::Follow, "get", "leases"),
        (Verb("create", "leases"), Job::Lead, "create", "leases"),
        (Verb("update", "leases"), Job::Renew, "update", "leases"),
        (Verb("patch", "leases"), Job::Report, "patch", "leases"),
        (Verb("list", "leases"), Job::Standing, "list", "leases"),
        (Verb("watch", "leases"), Job::Standing, "watch", "leases"),
        (Verb("delete", "leases"), Job::Leave, "delete", "leases"),
        (Resource("endpointslices"), Job::Send, "list", "endpointslices"),
        (Verb("watch", "endpointslices"), Job::Send, "watch", "endpointslices"),
        (Resource("serviceaccounts"), Job::Fence, "impersonate", "serviceaccounts"),
    ];
    let kube = consistd_testkit::kube_client().await;
    // Every case at once, each in its own namespace with its own daemon; a failing case fails alone.
    let runs: Vec<_> = table
        .iter()
        .map(|&(removal, job, verb, resource)| {
            consistd_testkit::spawn(broken(kube.clone(), removal, job, verb, resource))
        })
        .collect();
    let mut failed = Vec::new();
    for ((removal, job, ..), run) in table.iter().zip(runs) {
        match run.await {
            Ok(error) => eprintln!("{removal}: {job:?}: {error}"),
            Err(e) => {
                let panic = e.try_into_panic().ok();
                let why = panic
                    .as_ref()
                    .and_then(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    })
                    .unwrap_or_else(|| "cancelled".to_owned());
                failed.push(format!("{removal}: {job:?}: {why}"));
            }
        }
    }
    assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), table.len(), failed.join("\n"));
}
