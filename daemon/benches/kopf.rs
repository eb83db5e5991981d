//! Kopf against Python apps on consistd (`make bench`), on the same job: a handler on changes of a ConfigMap's
//! `data.value` that works a while (0, 100 or 300 ms) and then patches the value it handled back into an
//! annotation, while a third party keeps changing the values on a seeded schedule. Each cell is run on a
//! quiet machine and again with every core kept busy by a CPU hog at normal priority. The sides, each run
//! in a namespace of its own:
//!
//! - Kopf (hack/bench/kopf/kopf_operator.py, `kopf run --standalone`), as it comes;
//! - the consistd Python SDK's reconciler (hack/bench/kopf/consistd_app.py `queue`): the sidecar's work
//!   queue hands out each ConfigMap, consistent with the app's own patches when it is handed out;
//! - the same job on the SDK's CONSISTENT watch (`stream`), with a worker per ConfigMap on the newest state,
//!   as Kopf has; the worker asks `client.predates_own_write` of each state it takes from its buffer;
//! - that stream app without the worker's question (`stream-unchecked`): a control, to show what the figures
//!   look like when states older than the handler's own patch are handled.
//!
//! For each it prints handler executions per change and how many ran on a value already handled (the
//! double execution this project exists to prevent: goal 0), change-to-handler latency (from the third
//! party's PATCH being sent to the handler's start on that value) and the apiserver watches the side opened
//! (from the apiserver's audit log). Every change follows the same seeded schedule on every side.
//!
//! Needs CONSISTD_BENCH_PYTHON: a Python with hack/bench/kopf/requirements.txt and client-sdk/python
//! installed (hack/bench.sh makes one). Not a test: it measures and prints.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use consistd_testkit::{Daemon, figures};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
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
/// How long the handler works before it patches, in ms.
const HANDLER_MS: [u64; 3] = [0, 100, 300];

#[derive(Clone, Copy)]
enum Side {
    Kopf,
    Queue,
    Stream,
    StreamUnchecked,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Kopf => "Kopf",
            Self::Queue => "consistd queue (Python SDK)",
            Self::Stream => "consistd CONSISTENT stream (Python SDK)",
            Self::StreamUnchecked => "the same stream, worker not rechecking (control)",
        }
    }

    /// The consistd app's way of working (hack/bench/kopf/consistd_app.py's argument); None for Kopf.
    fn app(self) -> Option<&'static str> {
        match self {
            Self::Kopf => None,
            Self::Queue => Some("queue"),
            Self::Stream => Some("stream"),
            Self::StreamUnchecked => Some("stream-unchecked"),
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

async fn start(side: Side, ns: &str, handler_ms: u64, dir: &Path, executions: &Path) -> Running {
    let log = std::fs::File::create(dir.join("side.log")).expect("create the side's log");
    let mut command = tokio::process::Command::new(python());
    command
        .env("BENCH_EXECUTIONS", executions)
        .env("BENCH_NAMESPACE", ns)
        .env("BENCH_HANDLER_MS", handler_ms.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .kill_on_drop(true);
    let daemon = if let Some(app) = side.app() {
        let daemon = Daemon::builder(BIN)
            .config(format!("identity: kopf-bench\nnamespace: {ns}\n"))
            .env("CONSISTD_LOG_LEVEL", "warn")
            .start()
            .await;
        command.env("CONSISTD_SOCKET", daemon.socket()).arg(Path::new(SCRIPTS).join("consistd_app.py")).arg(app);
        Some(daemon)
    } else {
        command
            .env("KUBECONFIG", consistd_testkit::kubeconfig())
            .args(["-m", "kopf", "run", "--standalone", "--namespace", ns])
            .arg(Path::new(SCRIPTS).join("kopf_operator.py"));
        None
    };
    let app = command.spawn().expect("start the side's Python process");
    Running { _app: app, _daemon: daemon }
}

/// Waits until every ConfigMap's value `value` was handled (the annotation holds it).
async fn handled(api: &Api<ConfigMap>, value: &str, log: &Path) {
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
        if done == OBJECTS {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {OBJECTS} ConfigMaps handled value {value} after 90 s; the side's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

async fn run(side: Side, handler_ms: u64, load: Load) {
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
    let offset = consistd_testkit::audit_offset();
    let running = start(side, &ns, handler_ms, dir.path(), &executions_file).await;
    let log = dir.path().join("side.log");
    handled(&api, "0", &log).await; // started, and every ConfigMap handled once

    let hog = (load == Load::Busy).then(Hog::start);
    let changes = change(&api, &mut StdRng::seed_from_u64(16)).await;
    handled(&api, &CHANGES.to_string(), &log).await;
    tokio::time::sleep(SETTLE).await;
    drop(hog);
    drop(running);
    let watches = watches_opened(offset);

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
    #[allow(clippy::cast_precision_loss, reason = "counts")]
    let per_change = executions as f64 / changes.len() as f64;
    let watches_total: u64 = watches.values().sum();
    let cell = match load {
        Load::Quiet => format!("{handler_ms} ms"),
        Load::Busy => format!("{handler_ms} ms, hog"),
    };
    let quantile = |q| figures::quantile(&latencies, q).expect("a handled change");
    let (p50, p99) = (quantile(0.5), quantile(0.99));
    let series = side.name();
    figures::record("kopf-executions", "handler executions per change", series, cell.as_str(), per_change);
    #[allow(clippy::cast_precision_loss, reason = "counts")]
    figures::record("kopf-repeats", "executions of a value already handled", series, cell.as_str(), repeated as f64);
    figures::record("kopf-latency-p50", "ms, change -> handler, p50", series, cell.as_str(), p50);
    figures::record("kopf-latency-p99", "ms, change -> handler, p99", series, cell.as_str(), p99);
    #[allow(clippy::cast_precision_loss, reason = "counts")]
    figures::record("kopf-watches", "apiserver watches opened", series, cell.as_str(), watches_total as f64);
    let by_resource: Vec<String> = watches.iter().map(|(r, n)| format!("{r} {n}")).collect();
    println!(
        "| {handler_ms} ms | {} | {series} | {} | {executions} ({per_change:.2}) | {repeated}{timed_out} | {superseded} | \
         {p50:.1} / {p99:.1} ms | {watches_total} ({}) |",
        load.name(),
        changes.len(),
        by_resource.join(", ")
    );
}

#[tokio::main]
async fn main() {
    println!(
        "Kopf {} against consistd: {OBJECTS} ConfigMaps, {CHANGES} changes each by a third party (pauses of \
         {}-{} ms); the handler works a while, then patches each handled value back",
        kopf_version(),
        GAP_MS.start,
        GAP_MS.end
    );
    println!();
    println!(
        "| handler | load | side | changes | handler executions (per change) | of a value already handled | \
         values superseded before a handler saw them | change -> handler p50 / p99 | apiserver watches opened |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for load in [Load::Quiet, Load::Busy] {
        for handler_ms in HANDLER_MS {
            for side in [Side::Kopf, Side::Queue, Side::Stream, Side::StreamUnchecked] {
                run(side, handler_ms, load).await;
            }
        }
    }
}
