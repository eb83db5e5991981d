//! `consistd inject`: the offline injector against golden files (tests/inject/), and manifests/base's
//! sidecar, which must be exactly what the injector adds.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde::Deserialize;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inject")
}

/// `consistd inject -f -` with `input` on standard input; its standard output.
fn inject(input: &str) -> String {
    let mut child = Command::new(BIN)
        .args(["inject", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start consistd inject");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("wait for consistd inject");
    assert!(out.status.success(), "consistd inject failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml).map(|d| Value::deserialize(d).expect("YAML document")).collect()
}

#[test]
fn offline_injection_matches_the_golden_file() {
    let input = std::fs::read_to_string(golden_dir().join("workloads.yaml")).expect("read workloads.yaml");
    let output = inject(&input);
    let golden = golden_dir().join("workloads.injected.yaml");
    #[allow(clippy::disallowed_methods, reason = "a test's switch, not the daemon's configuration")]
    let regenerate = std::env::var_os("CONSISTD_REGENERATE").is_some();
    if regenerate {
        std::fs::write(&golden, &output).expect("write the golden file");
    }
    let expected =
        std::fs::read_to_string(&golden).expect("read workloads.injected.yaml (CONSISTD_REGENERATE=1 writes it)");
    assert_eq!(
        documents(&output),
        documents(&expected),
        "consistd inject -f tests/inject/workloads.yaml changed; if on purpose, run with CONSISTD_REGENERATE=1 and review the diff"
    );
    // Idempotent: injecting the injected output changes nothing.
    assert_eq!(documents(&inject(&output)), documents(&output));
}

/// Removes from a pod template what the injector adds, so only the app remains.
fn strip_sidecar(template: &mut Value) {
    let spec = &mut template["spec"];
    if let Some(init) = spec["initContainers"].as_array_mut() {
        init.retain(|c| c["name"] != "consistd");
    }
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.retain(|v| !v["name"].as_str().unwrap_or_default().starts_with("consistd-"));
    }
    for app in spec["containers"].as_array_mut().into_iter().flatten() {
        if let Some(env) = app["env"].as_array_mut() {
            env.retain(|e| e["name"] != "CONSISTD_SOCKET");
        }
        if let Some(mounts) = app["volumeMounts"].as_array_mut() {
            mounts.retain(|m| m["name"] != "consistd-socket");
        }
    }
}

#[test]
fn manifests_base_runs_the_sidecar_exactly_as_inject_adds_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base/deployment.yaml");
    let base = documents(&std::fs::read_to_string(path).expect("read manifests/base/deployment.yaml")).remove(0);
    let mut app_only = base.clone();
    strip_sidecar(&mut app_only["spec"]["template"]);
    assert_ne!(app_only, base, "the base runs a sidecar to compare");

    let mut injected = documents(&inject(&serde_yaml::to_string(&app_only).expect("YAML"))).remove(0);
    let template = &mut injected["spec"]["template"];
    assert_eq!(template["metadata"]["annotations"]["consistd.io/status"], "injected");
    // The base is written by hand and needs no status annotation.
    template["metadata"].as_object_mut().expect("metadata").remove("annotations");
    assert_eq!(injected, base, "manifests/base/deployment.yaml and `consistd inject` disagree");
}
