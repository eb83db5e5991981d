//! The Greeting operator of examples/README.md side by side, as Kopf, kube-rs and controller-runtime teach it
//! (hack/bench/operator) and as the consistd examples write it on the reconcile queue: lines of code, passes
//! per change and memory (`hack/with-control-plane.sh cargo bench -p consistd --bench operator`). Each side
//! runs in a namespace of its own on examples/crd.yaml (applied once): GREETINGS Greetings are created and
//! waited for (each Ready with observedGeneration 1 and its ConfigMap saying its message), then each one's spec
//! is changed once and waited for again (observedGeneration 2); then every Greeting is deleted and must go,
//! its ConfigMap deleted by the side's finalize pass (no garbage collector runs here).
//!
//! - Passes: every side prints the consistd examples' `reconciling <ns>/<name> ...` line at the start of each
//!   pass over a Greeting that is not being deleted (a call of its reconciler or handler, or a work item handed
//!   out); they are counted from its stdout SETTLE after each wait. "on create": the passes until then,
//!   divided by GREETINGS; "per spec change": the passes the changes added, divided by GREETINGS.
//! - Memory: VmRSS of the side's process once the changes are counted, and for consistd also its sidecar's
//!   (a daemon of its own per side).
//! - Lines of code: the lines of the side's source files that are neither blank nor comments (`#` lines and
//!   docstrings — a line starting with `"""` opens one, it ends on the line that closes it — in Python; `//`
//!   lines in Rust and Go), build manifests (Cargo.toml, go.mod, requirements.txt) left out. The Kopf,
//!   kube-rs and controller-runtime sides count every source file of theirs; the consistd Rust example every
//!   file of examples/rust/src but receive.rs (the `receive` command); the consistd Python example its one
//!   file less what only the other commands use: the top-level `async def receive` and `async def sharded`
//!   (each from its first line to the next line at column 0) and the constants only `sharded` reads
//!   (OBSERVED_KEYS, HANDLED_BY). The consistd examples' counts include their leader election and their
//!   peer notification, which the framework sides do not have (the bench runs them without a peer).
//!
//! The sides (CONSISTD_BENCH_OPERATOR_SIDES picks some, comma-separated keys):
//! - `kopf`: hack/bench/operator/kopf/greeting_operator.py under `kopf run --standalone --namespace NS`;
//! - `kube-rs`: hack/bench/operator/kube-rs (`kube-rs-greeting-operator`);
//! - `controller-runtime`: hack/bench/operator/controller-runtime;
//! - `python`: `examples/python/greeting_operator.py controller` on a consistd daemon;
//! - `rust`: the Rust example's `greeting-operator controller` on a consistd daemon.
//!
//! Needs what hack/bench.sh builds: the Python of target/bench/venv (CONSISTD_BENCH_PYTHON) with
//! hack/bench/kopf/requirements.txt, hack/bench/operator/kopf/requirements.txt and client-sdk/python installed;
//! `cargo build --release -p consistd-bench-kube-rs-operator -p consistd-example-greeting-operator` (the
//! binaries are taken from the directory of the profile this bench was built with); and the controller-runtime
//! operator built into target/bench/controller-runtime-greeting-operator (CONSISTD_BENCH_CONTROLLER_RUNTIME).
//! Not a test: it measures and prints.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use consistd_testkit::{Daemon, figures};
use futures::StreamExt as _;
use k8s_openapi::{
    api::core::v1::ConfigMap, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Client,
    api::{
        Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    },
};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const GREETINGS: usize = 50;
/// Quiet time after every Greeting was seen Ready, so that the passes its own writes queue are counted too.
const SETTLE: Duration = Duration::from_secs(5);
/// How long the Greetings may take to be Ready, or to go once deleted.
const DEADLINE: Duration = Duration::from_secs(180);
/// How many Greetings are created, changed or deleted at once.
const AT_ONCE: usize = 10;
/// What opens and closes a Python docstring.
const DOCSTRING: &str = "\"\"\"";
/// The label the operators put on the ConfigMaps they make.
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=greeting-operator";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Kopf,
    KubeRs,
    ControllerRuntime,
    ConsistdPython,
    ConsistdRust,
}

/// Every side, in the table's order.
const SIDES: [Side; 5] = [Side::Kopf, Side::KubeRs, Side::ControllerRuntime, Side::ConsistdPython, Side::ConsistdRust];

/// How a source file's comments are written.
#[derive(Clone, Copy)]
enum Language {
    Python,
    Rust,
    Go,
}

/// A source file of a side, and the top-level blocks left out of its count (their first lines' beginnings).
struct Source {
    path: PathBuf,
    language: Language,
    left_out: &'static [&'static str],
}

impl Side {
    /// Its name in CONSISTD_BENCH_OPERATOR_SIDES.
    fn key(self) -> &'static str {
        match self {
            Self::Kopf => "kopf",
            Self::KubeRs => "kube-rs",
            Self::ControllerRuntime => "controller-runtime",
            Self::ConsistdPython => "python",
            Self::ConsistdRust => "rust",
        }
    }

    /// Its name in the table and the figures.
    fn name(self) -> String {
        match self {
            Self::Kopf => format!("Kopf {}", python_package_version("kopf")),
            Self::KubeRs => format!("kube-rs {}", locked_crate_version("kube")),
            Self::ControllerRuntime => {
                format!("controller-runtime {}", go_module_version("sigs.k8s.io/controller-runtime"))
            }
            Self::ConsistdPython => "consistd (Python SDK example)".to_owned(),
            Self::ConsistdRust => "consistd (Rust SDK example)".to_owned(),
        }
    }

    /// Whether it works through a consistd daemon of its own (else it talks to the apiserver itself).
    fn consistd(self) -> bool {
        matches!(self, Self::ConsistdPython | Self::ConsistdRust)
    }

    /// The command that runs it in namespace `ns`.
    fn command(self, ns: &str) -> tokio::process::Command {
        let mut command = match self {
            Self::Kopf => {
                let mut command = tokio::process::Command::new(python());
                command.args(["-m", "kopf", "run", "--standalone", "--namespace", ns]);
                command.arg(Path::new(REPO).join("hack/bench/operator/kopf/greeting_operator.py"));
                command
            }
            Self::KubeRs => tokio::process::Command::new(cargo_binary(
                "kube-rs-greeting-operator",
                "consistd-bench-kube-rs-operator",
            )),
            Self::ControllerRuntime => tokio::process::Command::new(controller_runtime()),
            Self::ConsistdPython => {
                let mut command = tokio::process::Command::new(python());
                command.arg(Path::new(REPO).join("examples/python/greeting_operator.py")).arg("controller");
                command
            }
            Self::ConsistdRust => {
                let mut command = tokio::process::Command::new(cargo_binary(
                    "greeting-operator",
                    "consistd-example-greeting-operator",
                ));
                command.arg("controller");
                command
            }
        };
        command.env("EXAMPLE_NAMESPACE", ns).env("PYTHONUNBUFFERED", "1");
        command
    }

    /// The source files its lines of code are counted in (see the top of this file).
    fn sources(self) -> Vec<Source> {
        let files = |dir: &str, language: Language, extension: &str, skip: &[&str]| -> Vec<Source> {
            let dir = Path::new(REPO).join(dir);
            let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display()));
            let mut paths: Vec<PathBuf> = entries
                .map(|entry| entry.unwrap_or_else(|e| panic!("list {}: {e}", dir.display())).path())
                .filter(|path| path.extension().is_some_and(|ext| ext == extension))
                .filter(|path| !skip.iter().any(|name| path.file_name().is_some_and(|file| file == *name)))
                .collect();
            paths.sort();
            paths.into_iter().map(|path| Source { path, language, left_out: &[] }).collect()
        };
        match self {
            Self::Kopf => files("hack/bench/operator/kopf", Language::Python, "py", &[]),
            Self::KubeRs => files("hack/bench/operator/kube-rs/src", Language::Rust, "rs", &[]),
            Self::ControllerRuntime => files("hack/bench/operator/controller-runtime", Language::Go, "go", &[]),
            Self::ConsistdPython => vec![Source {
                path: Path::new(REPO).join("examples/python/greeting_operator.py"),
                language: Language::Python,
                left_out: &["async def receive(", "async def sharded(", "OBSERVED_KEYS =", "HANDLED_BY ="],
            }],
            Self::ConsistdRust => files("examples/rust/src", Language::Rust, "rs", &["receive.rs"]),
        }
    }
}

/// The sides to run: CONSISTD_BENCH_OPERATOR_SIDES (keys, comma-separated), else all of them.
fn chosen_sides() -> Vec<Side> {
    #[allow(clippy::disallowed_methods, reason = "a benchmark's own switch, not the daemon's environment")]
    let Ok(keys) = std::env::var("CONSISTD_BENCH_OPERATOR_SIDES") else { return SIDES.to_vec() };
    keys.split(',')
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(|key| {
            SIDES.into_iter().find(|side| side.key() == key).unwrap_or_else(|| {
                panic!(
                    "CONSISTD_BENCH_OPERATOR_SIDES: no side {key:?}; the sides are {}",
                    SIDES.map(Side::key).join(", ")
                )
            })
        })
        .collect()
}

/// The Python with Kopf, the Kubernetes client and the consistd SDK: CONSISTD_BENCH_PYTHON, else target/bench/venv's.
fn python() -> PathBuf {
    #[allow(clippy::disallowed_methods, reason = "a benchmark's own switch, not the daemon's environment")]
    let python = std::env::var_os("CONSISTD_BENCH_PYTHON")
        .map_or_else(|| Path::new(REPO).join("target/bench/venv/bin/python"), PathBuf::from);
    assert!(python.exists(), "no Python at {} (hack/bench.sh makes target/bench/venv)", python.display());
    python
}

/// Binary `name` of package `package`, from the profile directory this bench was built in.
fn cargo_binary(name: &str, package: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's own path");
    // <target>/<profile>/deps/operator-<hash>
    let profile = exe.parent().and_then(Path::parent).expect("the bench's profile directory");
    let path = profile.join(name);
    assert!(path.is_file(), "no {} (build it: cargo build --release -p {package})", path.display());
    path
}

/// The controller-runtime operator: CONSISTD_BENCH_CONTROLLER_RUNTIME, else target/bench's.
fn controller_runtime() -> PathBuf {
    #[allow(clippy::disallowed_methods, reason = "a benchmark's own switch, not the daemon's environment")]
    let path = std::env::var_os("CONSISTD_BENCH_CONTROLLER_RUNTIME")
        .map_or_else(|| Path::new(REPO).join("target/bench/controller-runtime-greeting-operator"), PathBuf::from);
    assert!(
        path.is_file(),
        "no {} (build it: cd hack/bench/operator/controller-runtime && GOTOOLCHAIN=local go build -o {} .)",
        path.display(),
        path.display()
    );
    path
}

fn python_package_version(package: &str) -> String {
    let out = std::process::Command::new(python())
        .args(["-c", &format!("import importlib.metadata as m; print(m.version({package:?}))")])
        .output()
        .expect("run the bench's Python");
    assert!(out.status.success(), "{package} is not installed in {}", python().display());
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The version of crate `name` in the workspace's Cargo.lock.
fn locked_crate_version(name: &str) -> String {
    let path = Path::new(REPO).join("Cargo.lock");
    let lock = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let entry = format!("name = \"{name}\"\nversion = \"");
    let at = lock.find(&entry).unwrap_or_else(|| panic!("no crate {name} in {}", path.display())) + entry.len();
    lock[at..].split('"').next().unwrap_or_default().to_owned()
}

/// The version of Go module `module` the controller-runtime operator requires.
fn go_module_version(module: &str) -> String {
    let path = Path::new(REPO).join("hack/bench/operator/controller-runtime/go.mod");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .find_map(|line| line.trim().strip_prefix(module)?.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| panic!("no {module} in {}", path.display()))
}

/// The lines of `source` that are neither blank nor comments, less its left-out top-level blocks.
fn code_lines(source: &Source) -> usize {
    let text = std::fs::read_to_string(&source.path).unwrap_or_else(|e| panic!("read {}: {e}", source.path.display()));
    let (mut count, mut docstring, mut left_out) = (0, false, false);
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        // A line at column 0 (not a bracket closing a statement above) starts a top-level block.
        if !docstring && !line.starts_with(char::is_whitespace) && !line.starts_with([')', ']', '}']) {
            left_out = source.left_out.iter().any(|start| line.starts_with(start));
        }
        let comment = match source.language {
            Language::Python if docstring => {
                docstring = !trimmed.contains(DOCSTRING);
                true
            }
            Language::Python if trimmed.starts_with(DOCSTRING) => {
                docstring = trimmed.len() < 6 || !trimmed.ends_with(DOCSTRING);
                true
            }
            Language::Python => trimmed.starts_with('#'),
            Language::Rust | Language::Go => trimmed.starts_with("//"),
        };
        count += usize::from(!comment && !left_out);
    }
    count
}

/// The Greetings of namespace `ns`.
fn greetings(kube: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("example.consistd.io", "v1", "Greeting");
    Api::namespaced_with(kube.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, "greetings"))
}

/// Applies examples/crd.yaml and waits until Greetings are served.
async fn apply_crd(kube: &Client) {
    let path = Path::new(REPO).join("examples/crd.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()));
    let name = crd.metadata.name.clone().expect("the CRD's name");
    Api::<CustomResourceDefinition>::all(kube.clone())
        .patch(&name, &PatchParams::apply("consistd-operator-bench").force(), &Patch::Apply(&crd))
        .await
        .unwrap_or_else(|e| panic!("apply {}: {e}", path.display()));
    let api = greetings(kube, "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.list(&ListParams::default().limit(1)).await.is_err() {
        assert!(Instant::now() < deadline, "{name} was not served 30 s after it was applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The message of Greeting `i` after `changes` changes of its spec.
fn message(i: usize, changes: usize) -> String {
    if changes == 0 { format!("hello {i}") } else { format!("hello {i}, change {changes}") }
}

fn greeting_name(i: usize) -> String {
    format!("greeting-{i:02}")
}

/// A side's processes (killed when dropped) and where their output goes.
struct Running {
    app: tokio::process::Child,
    daemon: Option<Daemon>,
    stdout: PathBuf,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start(side: Side, ns: &str) -> Self {
        let dir = tempfile::Builder::new().prefix("consistd-operator-bench-").tempdir().expect("temp dir");
        let (stdout, stderr) = (dir.path().join("stdout.log"), dir.path().join("stderr.log"));
        let mut command = side.command(ns);
        command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("create the side's stdout"))
            .stderr(std::fs::File::create(&stderr).expect("create the side's stderr"))
            .kill_on_drop(true);
        let daemon = if side.consistd() {
            Some(Daemon::for_app(BIN, "operator-bench", ns, &mut command).await)
        } else {
            command.env("KUBECONFIG", consistd_testkit::kubeconfig());
            None
        };
        let app = command.spawn().unwrap_or_else(|e| panic!("start {}: {e}", side.name()));
        Self { app, daemon, stdout, stderr, _dir: dir }
    }

    /// The passes over namespace `ns`'s Greetings it printed so far.
    fn passes(&self, ns: &str) -> usize {
        let text = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let start = format!("reconciling {ns}/");
        text.lines().filter(|line| line.starts_with(&start)).count()
    }

    /// The side's output, and its daemon's log, for a failure message.
    fn logs(&self) -> String {
        let tail = |path: &Path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        let daemon = self.daemon.as_ref().map(Daemon::logs).unwrap_or_default();
        format!("stdout:\n{}\nstderr:\n{}\ndaemon:\n{daemon}", tail(&self.stdout), tail(&self.stderr))
    }
}

/// Waits until every Greeting is Ready with observedGeneration `generation` and its ConfigMap says its message
/// after `changes` changes; panics with the side's logs after DEADLINE.
async fn wait_published(kube: &Client, ns: &str, generation: i64, changes: usize, running: &Running) {
    let configmaps: Api<ConfigMap> = Api::namespaced(kube.clone(), ns);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let list = greetings(kube, ns).list(&ListParams::default()).await.expect("list the Greetings");
        let ready = list
            .items
            .iter()
            .filter(|greeting| {
                greeting.data["status"]["conditions"].as_array().is_some_and(|conditions| {
                    conditions.iter().any(|c| {
                        c["type"] == "Ready"
                            && c["status"] == "True"
                            && c["reason"] == "Published"
                            && c["observedGeneration"] == generation
                    })
                })
            })
            .count();
        let maps = configmaps.list(&ListParams::default().labels(MANAGED_BY)).await.expect("list the ConfigMaps");
        let published = (0..GREETINGS)
            .filter(|&i| {
                maps.items.iter().any(|cm| {
                    cm.metadata.name.as_deref() == Some(greeting_name(i).as_str())
                        && cm.data.as_ref().and_then(|d| d.get("message")) == Some(&message(i, changes))
                })
            })
            .count();
        if ready == GREETINGS && published == GREETINGS {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {DEADLINE:?}, {ready} of {GREETINGS} Greetings Ready with observedGeneration {generation} and \
             {published} ConfigMaps saying their message; {}",
            running.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Deletes every Greeting and waits until they and their ConfigMaps are gone (the finalize passes ran).
async fn delete_all(kube: &Client, ns: &str, running: &Running) {
    let api = greetings(kube, ns);
    futures::stream::iter(0..GREETINGS)
        .for_each_concurrent(AT_ONCE, |i| {
            let api = api.clone();
            async move {
                api.delete(&greeting_name(i), &DeleteParams::default()).await.expect("delete a Greeting");
            }
        })
        .await;
    let configmaps: Api<ConfigMap> = Api::namespaced(kube.clone(), ns);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = api.list(&ListParams::default()).await.expect("list the Greetings").items.len();
        let maps = configmaps.list(&ListParams::default().labels(MANAGED_BY)).await.expect("list the ConfigMaps");
        if left == 0 && maps.items.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {DEADLINE:?}, {left} Greetings and {} ConfigMaps are still there; {}",
            maps.items.len(),
            running.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Creates the Greetings (`changes` 0) or changes each one's spec (`changes` 1).
async fn write_greetings(kube: &Client, ns: &str, changes: usize) {
    let api = greetings(kube, ns);
    futures::stream::iter(0..GREETINGS)
        .for_each_concurrent(AT_ONCE, |i| {
            let api = api.clone();
            async move {
                let name = greeting_name(i);
                if changes == 0 {
                    let greeting: DynamicObject = serde_json::from_value(serde_json::json!({
                        "apiVersion": "example.consistd.io/v1",
                        "kind": "Greeting",
                        "metadata": { "name": name },
                        "spec": { "message": message(i, 0) },
                    }))
                    .expect("a Greeting");
                    api.create(&PostParams::default(), &greeting).await.expect("create a Greeting");
                } else {
                    let patch = serde_json::json!({ "spec": { "message": message(i, changes) } });
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await.expect("change a Greeting");
                }
            }
        })
        .await;
}

#[allow(clippy::cast_precision_loss, reason = "counts and KiB")]
async fn run(side: Side, kube: &Client) {
    let series = side.name();
    let loc: usize = side.sources().iter().map(code_lines).sum();
    let ns = consistd_testkit::namespace(kube).await;
    let running = Running::start(side, &ns).await;

    write_greetings(kube, &ns, 0).await;
    wait_published(kube, &ns, 1, 0, &running).await;
    tokio::time::sleep(SETTLE).await;
    let on_create = running.passes(&ns);

    write_greetings(kube, &ns, 1).await;
    wait_published(kube, &ns, 2, 1, &running).await;
    tokio::time::sleep(SETTLE).await;
    let on_change = running.passes(&ns) - on_create;

    let mib = |pid: u32| consistd_testkit::rss_kib(pid) as f64 / 1024.0;
    let rss = mib(running.app.id().expect("the side is running"));
    let sidecar = running.daemon.as_ref().map(|daemon| mib(daemon.pid()));
    delete_all(kube, &ns, &running).await;
    drop(running);

    let per = |passes: usize| passes as f64 / GREETINGS as f64;
    figures::record("operator-loc", "lines of code", &series, "operator", loc as f64);
    figures::record("operator-passes", "passes per Greeting per change", &series, "create", per(on_create));
    figures::record("operator-passes", "passes per Greeting per change", &series, "spec change", per(on_change));
    figures::record("operator-rss", "MiB (VmRSS)", &series, "operator", rss);
    if let Some(sidecar) = sidecar {
        figures::record("operator-rss", "MiB (VmRSS)", &series, "sidecar", sidecar);
    }
    println!(
        "| {series} | {loc} | {:.2} ({on_create}) | {:.2} ({on_change}) | {rss:.1} | {} |",
        per(on_create),
        per(on_change),
        sidecar.map_or_else(|| "-".to_owned(), |mib| format!("{mib:.1}"))
    );
}

#[tokio::main]
async fn main() {
    let sides = chosen_sides();
    let kube = consistd_testkit::kube_client().await;
    apply_crd(&kube).await;
    println!(
        "The Greeting operator side by side: {GREETINGS} Greetings created, then each one's spec changed once; \
         passes per Greeting (in brackets: all passes), counted {} s after every Greeting was Ready",
        SETTLE.as_secs()
    );
    println!();
    println!(
        "| side | lines of code | passes per change on create | passes per spec change | RSS MiB | sidecar RSS MiB |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for side in sides {
        run(side, &kube).await;
    }
}
