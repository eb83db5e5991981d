//! Who may call, against the real apiserver: peer credentials logged and counted per uid,
//! `socket.allowedUids` / `socket.allowedGids` checked before any handler (with a client running as
//! another uid through setpriv), and `access.rules` refusing what they do not grant, with
//! PERMISSION_DENIED naming what was asked and nothing of it reaching the apiserver (its audit log).

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use consistd_client::proto::{GetLeadershipRequest, ListRequest, PatchRequest, PatchType};
use consistd_testkit::{
    Daemon,
    watch::{Events, raw},
};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");

/// grpcurl, built by hack/tools.sh, copied where another uid may run it.
fn grpcurl_in(dir: &Path) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(repo.join("hack/tools.sh")).arg("grpcurl").output().expect("run hack/tools.sh grpcurl");
    assert!(out.status.success(), "hack/tools.sh grpcurl: {}", String::from_utf8_lossy(&out.stderr));
    let built = PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim());
    let copy = dir.join("grpcurl");
    std::fs::copy(&built, &copy).expect("copy grpcurl");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod grpcurl");
    copy
}

/// Health/Check through grpcurl as `uid`:`gid` (setpriv, util-linux), or as this process without one.
fn health_check_as(grpcurl: &Path, socket: &Path, ids: Option<(u32, u32)>) -> Output {
    let mut command = match ids {
        Some((uid, gid)) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}")).arg(format!("--regid={gid}")).arg("--clear-groups").arg(grpcurl);
            c
        }
        None => Command::new(grpcurl),
    };
    command.args(["-plaintext", "-unix"]).arg(socket).arg("grpc.health.v1.Health/Check");
    command.output().expect("run grpcurl")
}

#[tokio::test]
async fn callers_outside_the_allowed_uids_and_gids_are_refused_and_every_call_is_counted_per_uid() {
    let uid = Command::new("id").arg("-u").output().expect("run id -u").stdout;
    assert_eq!(uid, b"0\n", "this test runs clients as other uids through setpriv: run it as root");
    let dir = tempfile::Builder::new().prefix("consistd-access-").tempdir().expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    let grpcurl = grpcurl_in(dir.path());
    let daemon = Daemon::builder(BIN)
        .dir(dir.path())
        .env("CONSISTD_LOG_LEVEL", "consistd=debug,info")
        .env("CONSISTD_LOG_FORMAT", "json")
        .config("socket:\n  mode: \"0666\"\n  allowedUids: [0]\n  allowedGids: [4242]\n")
        .start()
        .await;

    let root = health_check_as(&grpcurl, daemon.socket(), None);
    assert!(root.status.success(), "root is allowed: {}", String::from_utf8_lossy(&root.stderr));

    let nobody = health_check_as(&grpcurl, daemon.socket(), Some((65534, 65534)));
    let stderr = String::from_utf8_lossy(&nobody.stderr);
    assert!(!nobody.status.success(), "uid 65534 is in neither list, yet was served");
    assert!(stderr.contains("PermissionDenied"), "{stderr}");
    assert!(stderr.contains("uid 65534 (gid 65534) may not call this socket"), "{stderr}");

    let by_group = health_check_as(&grpcurl, daemon.socket(), Some((31337, 4242)));
    assert!(by_group.status.success(), "gid 4242 is allowed: {}", String::from_utf8_lossy(&by_group.stderr));

    let (_, metrics) = consistd_server::admin::get(daemon.admin_socket(), "/metrics").await.expect("GET /metrics");
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(metrics.contains("consistd_api_calls_total{uid=\"0\"}"), "{metrics}");
    assert!(metrics.contains("consistd_api_calls_total{uid=\"31337\"}"), "{metrics}");
    assert!(metrics.contains("consistd_api_calls_refused_total{uid=\"65534\"} "), "{metrics}");
    assert!(!metrics.contains("consistd_api_calls_refused_total{uid=\"31337\"}"), "{metrics}");

    // One debug line per call, with the caller's credentials as fields.
    let logs = daemon.logs();
    let calls: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["level"] == "DEBUG" && line["message"] == "call")
        .collect();
    let by_nobody = calls.iter().find(|c| c["uid"] == 65534).unwrap_or_else(|| panic!("no call by 65534:\n{logs}"));
    assert_eq!(by_nobody["gid"], 65534, "{by_nobody}");
    assert!(by_nobody["pid"].as_u64().is_some_and(|pid| pid > 1), "{by_nobody}");
    // grpcurl asks reflection first, and is refused there.
    assert!(by_nobody["method"].as_str().is_some_and(|m| m.starts_with("/grpc.")), "{by_nobody}");
}

/// Asserts that a call was refused with PERMISSION_DENIED and a message naming `asked`.
fn refused<T>(result: Result<T, tonic::Status>, asked: &str) {
    let Err(status) = result else { panic!("{asked} was allowed") };
    assert_eq!(status.code(), Code::PermissionDenied, "{asked}: {status:?}");
    assert!(status.message().contains(asked), "the refusal names what was asked: {}", status.message());
}

/// Audit log events of requests in namespace `ns`: (verb, resource).
fn audited_in(ns: &str) -> Vec<(String, String)> {
    consistd_testkit::audit_events(0)
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"] == ns)
        .map(|e| {
            let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (field(&e["verb"]), field(&e["objectRef"]["resource"]))
        })
        .collect()
}

#[tokio::test]
async fn access_rules_refuse_what_they_do_not_grant_before_the_apiserver_hears_of_it() {
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let config = format!(
        "access:\n  rules:\n\
         \x20   - service: objects\n      verbs: [list]\n      resources: [configmaps]\n      namespaces: [{ns}]\n\
         \x20   - service: watch\n      resources: [configmaps]\n\
         \x20   - service: leadership\n      uids: [4242]\n"
    );
    let daemon = Daemon::builder(BIN).config(config).start().await;
    let client = daemon.client();
    let list = |resource: &str, namespace: &str| ListRequest {
        resource: resource.into(),
        namespace: namespace.into(),
        ..Default::default()
    };

    // Refused first, so the audit log can later show they never reached the apiserver.
    refused(
        client.objects().list(list("secrets", &ns)).await,
        &format!("objects \"list\" on secrets in namespace \"{ns}\" to uid 0"),
    );
    // The resource is resolved before it is matched: the kind names the same resource.
    refused(client.objects().list(list("Secret", &ns)).await, "on secrets in namespace");
    let patch = PatchRequest {
        resource: "configmaps".into(),
        namespace: ns.clone(),
        name: "x".into(),
        patch_type: PatchType::Merge.into(),
        patch: b"{}".to_vec(),
        ..Default::default()
    };
    refused(client.objects().patch(patch).await, "objects \"patch\" on configmaps");
    refused(client.objects().list(list("configmaps", "")).await, "on configmaps across all namespaces");
    refused(client.watch().subscribe(raw("secrets", &ns)).await, "watch \"watch\" on secrets");
    let observe = GetLeadershipRequest { election: "e".into(), namespace: ns.clone() };
    refused(client.leadership().get_leadership(observe).await, "leadership \"observe\" on e");

    // Granted: the resource in any form that resolves to it.
    client.objects().list(list("configmaps", &ns)).await.expect("list configmaps in the granted namespace");
    client.objects().list(list("ConfigMap", &ns)).await.expect("the kind names the same granted resource");
    Events::open(&client, raw("configmaps", &ns)).await.until_synced().await;

    // The granted calls show up in the audit log; the refused ones never do.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !audited_in(&ns).iter().any(|(_, resource)| resource == "configmaps") {
        assert!(tokio::time::Instant::now() < deadline, "the granted list never appeared in the audit log");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let audited = audited_in(&ns);
    assert!(
        audited.iter().all(|(verb, resource)| resource == "configmaps" && (verb == "list" || verb == "watch")),
        "only granted requests reached the apiserver in {ns}: {audited:?}"
    );
}
