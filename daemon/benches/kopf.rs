//! Kopf and the Java Operator SDK against apps on consistd (`make bench`), on the same job: a handler on changes
//! of a ConfigMap's `data.value` that works a while (0, 100 or 300 ms) and then patches the value it handled back
//! into an annotation, while a third party keeps changing the values on a seeded schedule. Each cell is run on a
//! quiet machine and again with every core kept busy by a CPU hog at normal priority. The sides, each run
//! in a namespace of its own:
//!
//! - Kopf (hack/bench/kopf/kopf_operator.py, `kopf run --standalone`), as it comes;
//! - the Java Operator SDK (hack/bench/josdk, `java -jar … josdk`): a `Reconciler<ConfigMap>` written the way
//!   its docs recommend, the annotation written by returning `UpdateControl.patchResource` (server-side apply),
//!   its own writes' events filtered by JOSDK itself (5.3 and later);
//! - the consistd Python SDK's reconciler (hack/bench/kopf/consistd_app.py `queue`): the sidecar's work
//!   queue hands out each ConfigMap, consistent with the app's own patches when it is handed out;
//! - the consistd Java SDK's reconciler on the same queue (hack/bench/josdk, `java -jar … consistd`);
//! - the same job on the Python SDK's newest state per object (`stream`: `client.watch_latest` on a CONSISTENT
//!   watch), with a worker per ConfigMap, as Kopf has; the SDK applies the own-write rule when it hands a state
//!   to a worker;
//! - a CONSISTENT stream into a buffer of the app's own, its workers not asking `client.predates_own_write`
//!   (`stream-unchecked`): a control, to show what the figures look like when states older than the handler's
//!   own patch are handled.
//!
//! For each it prints passes per change (a pass: a call of the side's reconciler or handler, or a work item
//! handed to it, whether or not it found work to do; each side appends one line per pass to BENCH_PASSES),
//! handler executions per change and how many ran on a value already handled (the double execution this
//! project exists to prevent: goal 0), change-to-handler latency (from the third party's PATCH being sent to
//! the handler's start on that value), the apiserver writes per change (from the apiserver's audit log: every
//! write request to the side's namespace from anyone but the third party, which the log tells apart by its user
//! agent, counted from just before the third party's first change; ConfigMaps in the figure, writes to other
//! resources, such as Kopf's Events, beside it in the table) and the apiserver watches the side opened. Every
//! change follows the same seeded schedule on every side.
//!
//! Needs CONSISTD_BENCH_PYTHON for the Python sides: a Python with hack/bench/kopf/requirements.txt and
//! client-sdk/python installed; and CONSISTD_BENCH_JOSDK_JAR for the Java sides: the jar of hack/bench/josdk
//! (hack/bench.sh makes both, and installs the consistd Java SDK the jar is built with). Not a test: it
//! measures and prints.
//!
//! CONSISTD_BENCH_KOPF_CELLS runs a part of the table: clauses `dimension=value,value` separated by `;`, the
//! dimensions `side` (kopf, josdk, queue, java-queue, stream, stream-unchecked), `handler` (ms) and `load`
//! (quiet, hog); a dimension left out is run whole. `CONSISTD_BENCH_KOPF_CELLS='handler=300;load=quiet'` runs
//! every side with the 300 ms handler on a quiet machine.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use consistd_testkit::{Daemon, figures};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Client,
    api::{Api, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/bench/kopf");
const OBJECTS: usize = 10;
const CHANGES: usize = 20;
/// The third party's pause before each change of one ConfigMap, drawn from this range (ms).
const GAP_MS: std::ops::Range<u64> = 50..400;
const LABEL: &str = "bench.consistd.io/kopf";
const HANDLED: &str = "bench.consistd.io/handled";
/// Quiet time after every ConfigMap's last change was handled, longer than Kopf's default
/// consistency_timeout (5 s), so a late execution is still counted.
const SETTLE: Duration = Duration::from_secs(6);
/// Quiet time between the first handling of every ConfigMap and the third party's first change, so that a
/// side's writes that trail its first passes (Kopf's own bookkeeping) are not counted as the changes' writes.
const SETTLE_BEFORE: Duration = Duration::from_secs(1);
/// How long the handler works before it patches, in ms.
const HANDLER_MS: [u64; 3] = [0, 100, 300];
/// The third party's user agent: the audit log tells its writes from the side's by it.
const THIRD_PARTY: &str = "consistd-kopf-bench-third-party";
/// The verbs of a write, as the audit log names them.
const WRITES: [&str; 6] = ["create", "update", "patch", "apply", "delete", "deletecollection"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Kopf,
    Josdk,
    Queue,
    JavaQueue,
    Stream,
    StreamUnchecked,
}

/// Every side, in the table's order.
const SIDES: [Side; 6] = [Side::Kopf, Side::Josdk, Side::Queue, Side::JavaQueue, Side::Stream, Side::StreamUnchecked];

impl Side {
    /// The series name in the table and the figures; `versions` names the Java Operator SDK's.
    fn name(self, versions: &Versions) -> String {
        match self {
            Self::Kopf => "Kopf".to_owned(),
            Self::Josdk => format!("Java Operator SDK {}", versions.josdk),
            Self::Queue => "consistd queue (Python SDK)".to_owned(),
            Self::JavaQueue => "consistd queue (Java SDK)".to_owned(),
            Self::Stream => "consistd newest state per ConfigMap (Python SDK watch_latest)".to_owned(),
            Self::StreamUnchecked => "a CONSISTENT stream into the app's own buffer, no recheck (control)".to_owned(),
        }
    }

    /// Its name in CONSISTD_BENCH_KOPF_CELLS.
    fn key(self) -> &'static str {
        match self {
            Self::Kopf => "kopf",
            Self::Josdk => "josdk",
            Self::Queue => "queue",
            Self::JavaQueue => "java-queue",
            Self::Stream => "stream",
            Self::StreamUnchecked => "stream-unchecked",
        }
    }

    /// Whether it runs on the JVM (hack/bench/josdk's jar) rather than on CONSISTD_BENCH_PYTHON.
    fn java(self) -> bool {
        matches!(self, Self::Josdk | Self::JavaQueue)
    }

    /// Whether it works through a consistd daemon of its own (else it talks to the apiserver itself).
    fn consistd(self) -> bool {
        !matches!(self, Self::Kopf | Self::Josdk)
    }

    /// The program's arguments after the runtime, for namespace `ns`: the script or jar and its way of working.
    fn args(self, ns: &str) -> Vec<std::ffi::OsString> {
        let script = |name: &str| Path::new(SCRIPTS).join(name).into_os_string();
        let app = |how: &str| vec![script("consistd_app.py"), how.into()];
        let jar = |how: &str| vec!["-jar".into(), josdk_jar().into_os_string(), how.into()];
        match self {
            Self::Kopf => ["-m", "kopf", "run", "--standalone", "--namespace", ns]
                .into_iter()
                .map(Into::into)
                .chain([script("kopf_operator.py")])
                .collect(),
            Self::Josdk => jar("josdk"),
            Self::Queue => app("queue"),
            Self::JavaQueue => jar("consistd"),
            Self::Stream => app("stream"),
            Self::StreamUnchecked => app("stream-unchecked"),
        }
    }
}

/// Whether something else keeps the cores busy meanwhile.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    Quiet,
    Busy,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Self::Quiet => "quiet",
            Self::Busy => "CPU hog",
        }
    }

    /// Its name in CONSISTD_BENCH_KOPF_CELLS.
    fn key(self) -> &'static str {
        match self {
            Self::Quiet => "quiet",
            Self::Busy => "hog",
        }
    }
}

/// The part of the table to run: CONSISTD_BENCH_KOPF_CELLS (see the top of this file), else all of it.
struct Cells {
    sides: Vec<Side>,
    handlers: Vec<u64>,
    loads: Vec<Load>,
}

impl Cells {
    const VARIABLE: &str = "CONSISTD_BENCH_KOPF_CELLS";

    fn from_env() -> Self {
        #[allow(clippy::disallowed_methods, reason = "a benchmark's own switch, not the daemon's environment")]
        let spec = std::env::var(Self::VARIABLE).unwrap_or_default();
        Self::parse(&spec).unwrap_or_else(|error| {
            panic!(
                "{}={spec:?}: {error}; write clauses `dimension=value,value` separated by `;`, the dimensions side \
                 ({}), handler (ms) and load (quiet, hog), e.g. 'handler=300;load=quiet'",
                Self::VARIABLE,
                SIDES.map(Side::key).join(", ")
            )
        })
    }

    fn parse(spec: &str) -> Result<Self, String> {
        let mut cells =
            Self { sides: SIDES.to_vec(), handlers: HANDLER_MS.to_vec(), loads: vec![Load::Quiet, Load::Busy] };
        for clause in spec.split(';').map(str::trim).filter(|c| !c.is_empty()) {
            let (dimension, values) = clause.split_once('=').ok_or_else(|| format!("{clause:?} has no `=`"))?;
            let values: Vec<&str> = values.split(',').map(str::trim).filter(|v| !v.is_empty()).collect();
            if values.is_empty() {
                return Err(format!("{clause:?} names no value"));
            }
            match dimension.trim() {
                "side" => {
                    cells.sides = values
                        .iter()
                        .map(|v| SIDES.into_iter().find(|s| s.key() == *v).ok_or_else(|| format!("no side {v:?}")))
                        .collect::<Result<_, _>>()?;
                }
                "handler" => {
                    cells.handlers = values
                        .iter()
                        .map(|v| v.trim_end_matches("ms").parse().map_err(|_| format!("handler {v:?} is not ms")))
                        .collect::<Result<_, _>>()?;
                }
                "load" => {
                    cells.loads = values
                        .iter()
                        .map(|v| {
                            [Load::Quiet, Load::Busy]
                                .into_iter()
                                .find(|l| l.key() == *v)
                                .ok_or_else(|| format!("no load {v:?}"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                other => return Err(format!("no dimension {other:?}")),
            }
        }
        Ok(cells)
    }
}

/// The versions the table names: "not run" for a runtime no selected side needs.
struct Versions {
    kopf: String,
    josdk: String,
}

/// A busy loop per core, at normal priority, for as long as it lives.
struct Hog(Vec<std::process::Child>);

impl Hog {
    fn start() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        Self(
            (0..cores)
                .map(|_| {
                    std::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("start a CPU hog")
                })
                .collect(),
        )
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A side's processes; killed when dropped.
struct Running {
    _app: tokio::process::Child,
    _daemon: Option<Daemon>,
}

/// One change the third party made: ConfigMap `name` got `value` at `at` (wall-clock seconds).
struct Change {
    name: String,
    value: String,
    at: f64,
}

/// The writes that reached the apiserver in the side's namespace, from anyone but the third party.
#[derive(Default)]
struct Writes {
    /// To ConfigMaps (any subresource), the figure.
    configmaps: usize,
    /// Of those, the ones the apiserver refused (a conflict, say): they cost it a request all the same.
    refused: usize,
    /// To anything else, by resource (Kopf's Events).
    others: BTreeMap<String, usize>,
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_secs_f64()
}

fn python() -> PathBuf {
    #[allow(clippy::disallowed_methods, reason = "a benchmark's own switch, not the daemon's environment")]
    let python = std::env::var_os("CONSISTD_BENCH_PYTHON").unwrap_or_else(|| {
        panic!(
            "CONSISTD_BENCH_PYTHON: set it to a Python with hack/bench/kopf/requirements.txt and \
             client-sdk/python installed (hack/bench.sh makes one)"
        )
    });
    PathBuf::from(python)
}

/// The Java sides' jar (hack/bench/josdk).
fn josdk_jar() -> PathBuf {
    #[allow(clippy::disallowed_methods, reason = "a benchmark's own switch, not the daemon's environment")]
    let jar = std::env::var_os("CONSISTD_BENCH_JOSDK_JAR").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "CONSISTD_BENCH_JOSDK_JAR: set it to the jar of hack/bench/josdk (hack/bench.sh builds it: \
             target/bench/josdk/kopf-bench-java.jar, after installing client-sdk/java), or leave the Java sides \
             out with CONSISTD_BENCH_KOPF_CELLS"
        )
    });
    assert!(jar.is_file(), "CONSISTD_BENCH_JOSDK_JAR={}: no such file (hack/bench.sh builds it)", jar.display());
    jar
}

fn kopf_version() -> String {
    let out = std::process::Command::new(python())
        .args(["-c", "import importlib.metadata as m; print(m.version('kopf'))"])
        .output()
        .expect("run CONSISTD_BENCH_PYTHON");
    assert!(
        out.status.success(),
        "kopf is not installed in CONSISTD_BENCH_PYTHON: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn josdk_version() -> String {
    let out = std::process::Command::new("java")
        .arg("-jar")
        .arg(josdk_jar())
        .arg("version")
        .output()
        .expect("run java (the Java sides need a JDK 17 or newer on PATH)");
    assert!(
        out.status.success(),
        "java -jar CONSISTD_BENCH_JOSDK_JAR version failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn start(side: Side, ns: &str, handler_ms: u64, dir: &Path, executions: &Path, passes: &Path) -> Running {
    let log = std::fs::File::create(dir.join("side.log")).expect("create the side's log");
    let mut command = tokio::process::Command::new(if side.java() { PathBuf::from("java") } else { python() });
    command
        .args(side.args(ns))
        .env("BENCH_EXECUTIONS", executions)
        .env("BENCH_PASSES", passes)
        .env("BENCH_NAMESPACE", ns)
        .env("BENCH_HANDLER_MS", handler_ms.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .kill_on_drop(true);
    let daemon = if side.consistd() {
        Some(Daemon::for_app(BIN, "kopf-bench", ns, &mut command).await)
    } else {
        command.env("KUBECONFIG", consistd_testkit::kubeconfig());
        None
    };
    let app = command.spawn().expect("start the side's process");
    Running { _app: app, _daemon: daemon }
}

/// Waits until every ConfigMap's value `value` was handled (the annotation holds it), at most 90 s; how many
/// were.
async fn handled(api: &Api<ConfigMap>, value: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let list = api.list(&ListParams::default().labels(&format!("{LABEL}=true"))).await.expect("list ConfigMaps");
        let done = list
            .items
            .iter()
            .filter(|cm| {
                cm.metadata.annotations.as_ref().and_then(|a| a.get(HANDLED)).map(String::as_str) == Some(value)
            })
            .count();
        if done == OBJECTS || Instant::now() >= deadline {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client for the third party: the test control plane's admin, with a user agent of its own so that the audit
/// log tells its writes from the side's.
async fn third_party_client() -> Client {
    let path = consistd_testkit::kubeconfig();
    let kubeconfig =
        Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("read test kubeconfig {}: {e}", path.display()));
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("load test kubeconfig {}: {e}", path.display()));
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(THIRD_PARTY)));
    Client::try_from(config).unwrap_or_else(|e| panic!("build the third party's Kubernetes client: {e}"))
}

/// The third party: every ConfigMap changes CHANGES times, after pauses drawn from `rng`.
async fn change(api: &Api<ConfigMap>, rng: &mut StdRng) -> Vec<Change> {
    let schedules: Vec<Vec<u64>> =
        (0..OBJECTS).map(|_| (0..CHANGES).map(|_| rng.random_range(GAP_MS)).collect()).collect();
    let tasks: Vec<_> = schedules
        .into_iter()
        .enumerate()
        .map(|(i, gaps)| {
            let api = api.clone();
            consistd_testkit::spawn(async move {
                let mut changes = Vec::new();
                for (k, gap) in gaps.into_iter().enumerate() {
                    tokio::time::sleep(Duration::from_millis(gap)).await;
                    let change = Change { name: format!("cm-{i}"), value: (k + 1).to_string(), at: now() };
                    let patch = serde_json::json!({ "data": { "value": change.value } });
                    api.patch(&change.name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .expect("third-party patch");
                    changes.push(change);
                }
                changes
            })
        })
        .collect();
    let mut changes = Vec::new();
    for task in tasks {
        changes.extend(task.await.expect("third party"));
    }
    changes
}

/// The watches the apiserver started serving since audit-log offset `from` to anyone but itself, by resource.
fn watches_opened(from: u64) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for event in consistd_testkit::audit_events(from) {
        if event["verb"] == "watch"
            && event["stage"] == "ResponseStarted"
            && event["user"]["username"] != "system:apiserver"
        {
            let resource = event["objectRef"]["resource"].as_str().unwrap_or("?").to_owned();
            *counts.entry(resource).or_insert(0) += 1;
        }
    }
    counts
}

/// The writes that reached the apiserver in namespace `ns` since audit-log offset `from`, from anyone but the
/// third party (told apart by its user agent).
fn writes(from: u64, ns: &str) -> Writes {
    let mut writes = Writes::default();
    for event in consistd_testkit::audit_events(from) {
        let verb = event["verb"].as_str().unwrap_or_default();
        if event["stage"] != "ResponseComplete"
            || !WRITES.contains(&verb)
            || event["objectRef"]["namespace"] != ns
            || event["userAgent"] == THIRD_PARTY
        {
            continue;
        }
        let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
        if resource == "configmaps" {
            writes.configmaps += 1;
            writes.refused += usize::from(event["responseStatus"]["code"].as_u64().is_some_and(|code| code >= 300));
        } else {
            *writes.others.entry(resource.to_owned()).or_insert(0) += 1;
        }
    }
    writes
}

/// The passes a side recorded in `file`, of the values the third party wrote: (passes, of them executing nothing).
fn passes(file: &Path) -> (usize, usize) {
    // A side that never recorded a pass wrote no file.
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let (mut passes, mut idle) = (0, 0);
    for line in text.lines() {
        let pass: serde_json::Value = serde_json::from_str(line).expect("a pass line");
        if pass["value"] != "0" {
            passes += 1;
            idle += usize::from(pass["executed"] == false);
        }
    }
    (passes, idle)
}

async fn run(side: Side, versions: &Versions, handler_ms: u64, load: Load) {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let api: Api<ConfigMap> = Api::namespaced(kube.clone(), &ns);
    for i in 0..OBJECTS {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": { "name": format!("cm-{i}"), "labels": { LABEL: "true" } },
            "data": { "value": "0" },
        }))
        .expect("ConfigMap");
        api.create(&PostParams::default(), &cm).await.expect("create ConfigMap");
    }
    let dir = tempfile::Builder::new().prefix("consistd-kopf-bench-").tempdir().expect("temp dir");
    let executions_file = dir.path().join("executions.jsonl");
    let passes_file = dir.path().join("passes.jsonl");
    let offset = consistd_testkit::audit_offset();
    let running = start(side, &ns, handler_ms, dir.path(), &executions_file, &passes_file).await;
    let log = dir.path().join("side.log");
    // Started, and every ConfigMap handled once.
    let started = handled(&api, "0").await;
    assert!(
        started == OBJECTS,
        "{started} of {OBJECTS} ConfigMaps handled their first value after 90 s; the side's log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    tokio::time::sleep(SETTLE_BEFORE).await;
    let changes_offset = consistd_testkit::audit_offset();

    let hog = (load == Load::Busy).then(Hog::start);
    let third_party: Api<ConfigMap> = Api::namespaced(third_party_client().await, &ns);
    let changes = change(&third_party, &mut StdRng::seed_from_u64(16)).await;
    // A side that never handles an object's last value lost a change: it is counted, not waited for.
    let lost = OBJECTS - handled(&api, &CHANGES.to_string()).await;
    if lost > 0 {
        eprintln!(
            "kopf bench: {} never handled the last value of {lost} ConfigMap(s) within 90 s; its log:\n{}",
            side.name(versions),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    tokio::time::sleep(SETTLE).await;
    drop(hog);
    drop(running);
    let watches = watches_opened(offset);
    let writes = writes(changes_offset, &ns);
    let (passes, idle) = passes(&passes_file);

    // Executions of the values the third party wrote (value "0", handled before it started, is left out).
    let text = std::fs::read_to_string(&executions_file).expect("read the executions");
    let mut runs: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    // Executions on a state the sidecar handed out after giving up waiting for the app's own write (consistd
    // only: the consistency timeout, the safety valve Kopf's consistency_timeout also is).
    let mut timed_out = 0;
    for line in text.lines() {
        let e: serde_json::Value = serde_json::from_str(line).expect("an execution line");
        let (name, value) = (e["name"].as_str().expect("name"), e["value"].as_str().expect("value"));
        if value != "0" {
            runs.entry((name.to_owned(), value.to_owned())).or_default().push(e["at"].as_f64().expect("at"));
            timed_out += usize::from(e["consistency"] == "TIMED_OUT");
        }
    }
    let executions: usize = runs.values().map(Vec::len).sum();
    let repeated: usize = runs.values().map(|r| r.len() - 1).sum();
    let timed_out =
        if timed_out > 0 { format!(" ({timed_out} executions on a timed-out state)") } else { String::new() };
    let latencies: Vec<f64> = changes
        .iter()
        .filter_map(|c| runs.get(&(c.name.clone(), c.value.clone())).map(|r| (r[0] - c.at) * 1e3))
        .collect();
    let superseded = changes.len() - latencies.len();
    let lost = if lost > 0 {
        format!(" ({lost} of them the last value of its ConfigMap: a change lost)")
    } else {
        String::new()
    };
    #[allow(clippy::cast_precision_loss, reason = "counts")]
    let per_change = |n: usize| n as f64 / changes.len() as f64;
    let watches_total: u64 = watches.values().sum();
    let cell = match load {
        Load::Quiet => format!("{handler_ms} ms"),
        Load::Busy => format!("{handler_ms} ms, hog"),
    };
    let quantile = |q| figures::quantile(&latencies, q).expect("a handled change");
    let (p50, p99) = (quantile(0.5), quantile(0.99));
    let series = side.name(versions);
    let series = series.as_str();
    figures::record("kopf-executions", "handler executions per change", series, cell.as_str(), per_change(executions));
    #[allow(clippy::cast_precision_loss, reason = "counts")]
    figures::record("kopf-repeats", "executions of a value already handled", series, cell.as_str(), repeated as f64);
    figures::record("kopf-latency-p50", "ms, change -> handler, p50", series, cell.as_str(), p50);
    figures::record("kopf-latency-p99", "ms, change -> handler, p99", series, cell.as_str(), p99);
    #[allow(clippy::cast_precision_loss, reason = "counts")]
    figures::record("kopf-watches", "apiserver watches opened", series, cell.as_str(), watches_total as f64);
    figures::record("kopf-passes", "passes per change", series, cell.as_str(), per_change(passes));
    figures::record(
        "kopf-writes",
        "apiserver writes to ConfigMaps per change",
        series,
        cell.as_str(),
        per_change(writes.configmaps),
    );
    let by_resource: Vec<String> = watches.iter().map(|(r, n)| format!("{r} {n}")).collect();
    let mut written = format!("{} ({:.2})", writes.configmaps, per_change(writes.configmaps));
    if writes.refused > 0 {
        written.push_str(&format!(", {} refused", writes.refused));
    }
    for (resource, n) in &writes.others {
        written.push_str(&format!("; {resource} {n}"));
    }
    println!(
        "| {handler_ms} ms | {} | {series} | {} | {passes} ({:.2}; {idle} with nothing to do) | {executions} ({:.2}) | \
         {repeated}{timed_out} | {superseded}{lost} | {p50:.1} / {p99:.1} ms | {written} | {watches_total} ({}) |",
        load.name(),
        changes.len(),
        per_change(passes),
        per_change(executions),
        by_resource.join(", ")
    );
}

#[tokio::main]
async fn main() {
    let cells = Cells::from_env();
    let versions = Versions {
        kopf: if cells.sides.iter().any(|s| !s.java()) { kopf_version() } else { "not run".to_owned() },
        josdk: if cells.sides.iter().any(|s| s.java()) { josdk_version() } else { "not run".to_owned() },
    };
    println!(
        "Kopf {} and the Java Operator SDK {} against consistd: {OBJECTS} ConfigMaps, {CHANGES} changes each by a \
         third party (pauses of {}-{} ms); the handler works a while, then patches each handled value back",
        versions.kopf, versions.josdk, GAP_MS.start, GAP_MS.end
    );
    println!();
    println!(
        "| handler | load | side | changes | passes (per change; with nothing to do) | handler executions (per \
         change) | of a value already handled | values superseded before a handler saw them | change -> handler \
         p50 / p99 | apiserver writes to ConfigMaps (per change; to other resources) | apiserver watches opened |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for &load in &cells.loads {
        for &handler_ms in &cells.handlers {
            for &side in &cells.sides {
                run(side, &versions, handler_ms, load).await;
            }
        }
    }
}
