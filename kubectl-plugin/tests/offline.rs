//! The plugin's commands that need no cluster: `inject -f` prints exactly what `consistd inject -f`
//! does, completion scripts, and usage errors exit 2.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-consistd");

fn run(bin: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(bin)
        .args(args)
        // No cluster is needed: a kubeconfig that does not exist proves it.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    if let Some(input) = stdin {
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    }
    child.wait_with_output().expect("wait")
}

/// daemon/tests/inject: the offline injector's golden input and output.
fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemon/tests/inject").join(name)
}

#[test]
fn inject_prints_exactly_what_consistd_inject_prints() {
    let consistd = consistd_testkit::consistd_bin();
    let input = golden("workloads.yaml");
    let input = input.to_str().expect("UTF-8 path");
    let ours = run(Path::new(BIN), &["inject", "-f", input], None);
    let theirs = run(&consistd, &["inject", "-f", input], None);
    assert!(ours.status.success(), "{ours:?}");
    assert_eq!(ours, theirs);
    let want = std::fs::read_to_string(golden("workloads.injected.yaml")).expect("golden output");
    assert_eq!(String::from_utf8_lossy(&ours.stdout), want);

    // Standard input and the sidecar flags, the same way.
    let yaml = std::fs::read_to_string(input).expect("read input");
    let flags =
        ["inject", "-f", "-", "--admin-port", "0", "--image", "example.com/consistd:dev", "--peer-port", "7443"];
    let ours = run(Path::new(BIN), &flags, Some(&yaml));
    let theirs = run(&consistd, &flags, Some(&yaml));
    assert!(ours.status.success(), "{ours:?}");
    assert!(String::from_utf8_lossy(&ours.stdout).contains("example.com/consistd:dev"));
    assert_eq!(ours, theirs);

    // A document that cannot be injected: the same refusal and exit code.
    let bad = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    consistd.io/peer-port: nope\nspec:\n  containers:\n  - name: app\n    image: app\n";
    let ours = run(Path::new(BIN), &["inject", "-f", "-"], Some(bad));
    let theirs = run(&consistd, &["inject", "-f", "-"], Some(bad));
    assert_eq!(ours.status.code(), Some(1), "{ours:?}");
    assert!(String::from_utf8_lossy(&ours.stderr).contains("consistd.io/peer-port"), "{ours:?}");
    assert_eq!(ours, theirs);
}

#[test]
fn completion_scripts_know_the_subcommands() {
    let bash = run(Path::new(BIN), &["completion", "bash"], None);
    assert!(bash.status.success(), "{bash:?}");
    let script = String::from_utf8(bash.stdout).expect("UTF-8");
    assert!(script.contains("complete -F _kubectl__consistd") && script.contains("kubectl-consistd"), "{script}");
    for sub in ["elections", "handover", "rollout", "status", "inject", "completion", "outbox", "queues"] {
        assert!(script.contains(sub), "bash completion does not mention {sub}");
    }
    // bash itself parses it.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("kubectl-consistd.bash");
    std::fs::write(&file, &script).expect("write script");
    let parsed = Command::new("bash").arg("-n").arg(&file).output().expect("run bash -n");
    assert!(parsed.status.success(), "bash -n: {}", String::from_utf8_lossy(&parsed.stderr));

    for (shell, marker) in [("zsh", "#compdef kubectl-consistd"), ("fish", "complete -c kubectl-consistd")] {
        let out = run(Path::new(BIN), &["completion", shell], None);
        assert!(out.status.success(), "{out:?}");
        let script = String::from_utf8(out.stdout).expect("UTF-8");
        assert!(script.contains(marker) && script.contains("elections"), "{shell}: {script}");
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["elections", "--bogus"][..],
        &["elections", "-o", "yaml"],
        &["rollout", "status"],
        &["rollout", "status", "config", "--version", "two"],
        &["completion", "powershell"],
        &["inject"],
        &["outbox"],
        &["queues"],
        &["handover", "web"],
        &["handover", "web", "--to", "b", "--wait", "soon"],
        &["nope"],
    ] {
        let out = run(Path::new(BIN), args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("error:"), "{args:?}: {out:?}");
    }
    let help = run(Path::new(BIN), &["rollout", "status", "--help"], None);
    let help = String::from_utf8(help.stdout).expect("UTF-8");
    assert!(help.contains("Exit codes:") && help.contains("3  some live member lags"), "{help}");
}

#[test]
fn without_a_cluster_a_command_fails_naming_what_it_could_not_do() {
    let out = run(Path::new(BIN), &["elections", "--kubeconfig", "/nonexistent/kubeconfig"], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("kubectl consistd elections: load kubeconfig /nonexistent/kubeconfig: "), "{stderr}");
}
