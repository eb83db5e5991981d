//! Finding the test control plane, as envtest does for controller-runtime: the one `make test` runs
//! (`CONSISTD_TEST_KUBECONFIG`), else the one `hack/control-plane.sh` runs, started here from its cached
//! binaries when it is not running. On a machine where those binaries were never built (`cargo test` on a
//! fresh clone) the test binary says its tests were skipped, and how to run them, and exits successfully.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

/// Set (as `make test` does through `hack/with-control-plane.sh`): skipping is never allowed, and a missing
/// control plane fails the test.
const KUBECONFIG_VARIABLE: &str = "CONSISTD_TEST_KUBECONFIG";

/// The kubeconfig of the running test control plane: `CONSISTD_TEST_KUBECONFIG`, else the one
/// `hack/control-plane.sh` runs (started here if its binaries are built), else this test binary stops,
/// saying its tests were skipped.
pub fn kubeconfig() -> PathBuf {
    #[allow(clippy::disallowed_methods, reason = "the test harness's one switch, read once")]
    if let Some(path) = std::env::var_os(KUBECONFIG_VARIABLE).map(PathBuf::from) {
        assert!(
            path.exists(),
            "no test control plane: {KUBECONFIG_VARIABLE}={} does not exist. Start one with \
             `hack/control-plane.sh start`, or unset {KUBECONFIG_VARIABLE} to have the tests start it.",
            path.display()
        );
        return path;
    }
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(find_or_start).clone()
}

/// The running control plane's kubeconfig, starting it first when its binaries are built; exits the test
/// binary (status 0, after saying so) when they are not.
fn find_or_start() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/control-plane.sh");
    if !succeeds(&script, "status") {
        if !succeeds(&script, "built") {
            let test = std::env::args().next().unwrap_or_default();
            // Straight to the stream, not eprintln!: the test harness captures that, and this process ends
            // before the harness would show it.
            let _ = writeln!(
                std::io::stderr(),
                "consistd-testkit: SKIPPED every test of {test}: it needs the real control plane (etcd and \
                 kube-apiserver), whose binaries are not built on this machine. Run the integration tests \
                 with `make test-integration`, which builds and starts it, or build it once with \
                 `make control-plane` and `cargo test` starts it."
            );
            std::process::exit(0);
        }
        let _ = writeln!(
            std::io::stderr(),
            "consistd-testkit: starting the test control plane (hack/control-plane.sh start); it keeps running \
             for later tests: stop it with `hack/control-plane.sh stop`"
        );
        let started = Command::new(&script).arg("start").stdout(Stdio::null()).status();
        assert!(
            started.is_ok_and(|s| s.success()),
            "hack/control-plane.sh start failed: see the lines above, or target/control-plane/*.log"
        );
    }
    let out = Command::new(&script).arg("env").output().unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    let env = String::from_utf8_lossy(&out.stdout);
    let path = env
        .lines()
        .find_map(|line| line.strip_prefix("export KUBECONFIG="))
        .unwrap_or_else(|| panic!("hack/control-plane.sh env printed no KUBECONFIG: {env}"));
    PathBuf::from(path)
}

/// Whether `script command` exits 0 (its output discarded).
fn succeeds(script: &Path, command: &str) -> bool {
    Command::new(script)
        .arg(command)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
