//! Test support shared by consistd's integration tests: the real control plane started by
//! `hack/control-plane.sh`, a fresh namespace for every test, and consistd daemons run as processes.
//!
//! Nothing here fakes Kubernetes: a test that needs the control plane starts the cached one (as envtest
//! does), or, on a machine where it was never built, its test binary says it was skipped and how to run it.

pub mod blackhole;
mod control_plane;
pub mod crd;
mod daemon;
pub mod figures;
pub mod proxy;
pub mod queue;
pub mod tls;
pub mod unix_proxy;
pub mod watch;

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};

pub use control_plane::kubeconfig;
pub use daemon::{Daemon, DaemonBuilder};

/// Election timing in whole seconds (lease duration, renew deadline, retry period), as a CampaignRequest
/// takes it.
pub fn lease_timing(lease: i64, renew: i64, retry: i64) -> consistd_client::proto::LeaseTiming {
    let secs = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
    consistd_client::proto::LeaseTiming {
        lease_duration: secs(lease),
        renew_deadline: secs(renew),
        retry_period: secs(retry),
    }
}

/// The running test control plane's audit log (hack/control-plane.sh writes one line of JSON per
/// request beside the kubeconfig), to prove what did and did not reach the apiserver.
pub fn audit_log() -> PathBuf {
    kubeconfig().with_file_name("audit.log")
}

/// Where the audit log ends now: `audit_events` of it reads only what the apiserver logs afterwards.
pub fn audit_offset() -> u64 {
    let path = audit_log();
    std::fs::metadata(&path).map(|m| m.len()).unwrap_or_else(|e| panic!("audit log {}: {e}", path.display()))
}

/// The audit log's events (one JSON object each) logged after `offset` (from `audit_offset`).
pub fn audit_events(offset: u64) -> Vec<serde_json::Value> {
    let path = audit_log();
    let log = std::fs::read(&path).unwrap_or_else(|e| panic!("read the audit log {}: {e}", path.display()));
    let from = usize::try_from(offset).map_or(log.len(), |from| from.min(log.len()));
    log[from..].split(|&b| b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect()
}

/// The consistd binary for tests outside the daemon's package: `CONSISTD_BIN`, else the workspace's
/// debug build (which `cargo test --workspace` builds).
pub fn consistd_bin() -> PathBuf {
    let path = std::env::var_os("CONSISTD_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/consistd"), PathBuf::from);
    assert!(path.exists(), "no consistd binary at {}: run `cargo build -p consistd` first", path.display());
    path
}

/// A Kubernetes client for the test control plane, with admin rights.
pub async fn kube_client() -> Client {
    let path = kubeconfig();
    let kubeconfig =
        Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("read test kubeconfig {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("load test kubeconfig {}: {e}", path.display()));
    Client::try_from(config).unwrap_or_else(|e| panic!("build Kubernetes client: {e}"))
}

/// Creates a namespace of its own for one test, `consistd-t-<random>`, and returns its name.
///
/// Namespaces are not deleted: the test control plane runs no namespace controller, so a deleted one
/// would stay Terminating anyway, and the whole control plane is thrown away after the run.
pub async fn namespace(client: &Client) -> String {
    let name = format!("consistd-t-{:08x}", rand::random::<u32>());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "consistd.io/test": "true" } }
    }))
    .unwrap_or_else(|e| panic!("build namespace object: {e}"));
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create test namespace {name}: {e}"));
    name
}

/// A kubeconfig for user `user` with no rights beyond what RBAC grants that name, signed by the test
/// control plane's CA with openssl. Written to `dir`; returns its path.
pub fn kubeconfig_for_user(user: &str, dir: &std::path::Path) -> PathBuf {
    let admin = kubeconfig();
    let pki = admin.parent().unwrap_or_else(|| panic!("kubeconfig has no directory")).join("pki");
    let key = dir.join(format!("{user}.key"));
    let csr = dir.join(format!("{user}.csr"));
    let crt = dir.join(format!("{user}.crt"));
    let run = |args: &[&str]| {
        let out =
            std::process::Command::new("openssl").args(args).output().unwrap_or_else(|e| panic!("run openssl: {e}"));
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let (key_s, csr_s, crt_s) = (key.to_string_lossy(), csr.to_string_lossy(), crt.to_string_lossy());
    let subject = format!("/CN={user}");
    run(&["req", "-newkey", "rsa:2048", "-nodes", "-subj", &subject, "-keyout", &key_s, "-out", &csr_s]);
    let (ca_crt, ca_key) = (pki.join("ca.crt"), pki.join("ca.key"));
    // An extension makes it an X.509 v3 certificate, the only kind rustls accepts.
    let ext = dir.join(format!("{user}.ext"));
    std::fs::write(&ext, "extendedKeyUsage=clientAuth\n").unwrap_or_else(|e| panic!("write {}: {e}", ext.display()));
    run(&[
        "x509",
        "-req",
        "-in",
        &csr_s,
        "-CA",
        &ca_crt.to_string_lossy(),
        "-CAkey",
        &ca_key.to_string_lossy(),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &ext.to_string_lossy(),
        "-out",
        &crt_s,
    ]);
    let text = std::fs::read_to_string(&admin).unwrap_or_else(|e| panic!("read {}: {e}", admin.display()));
    let b64 = |p: &std::path::Path| {
        let out =
            std::process::Command::new("base64").arg("-w0").arg(p).output().unwrap_or_else(|e| panic!("base64: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("client-certificate-data:") {
            lines.push(format!("    client-certificate-data: {}", b64(&crt)));
        } else if line.trim_start().starts_with("client-key-data:") {
            lines.push(format!("    client-key-data: {}", b64(&key)));
        } else {
            lines.push(line.to_owned());
        }
    }
    let path = dir.join(format!("{user}.kubeconfig"));
    std::fs::write(&path, lines.join("\n")).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// A kubeconfig for ServiceAccount `name` in namespace `ns` (which must exist), authenticated as a pod
/// is: with a token from the TokenRequest API (one hour), so it has no rights beyond what RBAC grants
/// that ServiceAccount. Written to `dir`; returns its path.
pub async fn kubeconfig_for_service_account(client: &Client, ns: &str, name: &str, dir: &std::path::Path) -> PathBuf {
    use k8s_openapi::api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::ServiceAccount,
    };
    // No audiences: the apiserver's own, which is what it accepts for API calls.
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("request a token for ServiceAccount {ns}/{name}: {e}"));
    let token = answer
        .status
        .and_then(|status| status.token)
        .unwrap_or_else(|| panic!("TokenRequest for {ns}/{name} answered no token"));
    let admin = kubeconfig();
    let text = std::fs::read_to_string(&admin).unwrap_or_else(|e| panic!("read {}: {e}", admin.display()));
    // The admin's cluster and context, with the token in place of the admin's client certificate.
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("client-certificate-data:") {
            lines.push(format!("    token: {token}"));
        } else if !line.trim_start().starts_with("client-key-data:") {
            lines.push(line.to_owned());
        }
    }
    let path = dir.join(format!("{ns}.{name}.kubeconfig"));
    std::fs::write(&path, lines.join("\n")).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// The test apiserver's address, from its kubeconfig's `server:` line.
pub fn apiserver_addr() -> std::net::SocketAddr {
    let text = std::fs::read_to_string(kubeconfig()).unwrap_or_else(|e| panic!("read kubeconfig: {e}"));
    let server = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("server: "))
        .unwrap_or_else(|| panic!("kubeconfig has no server"));
    let hostport = server.trim().trim_start_matches("https://").trim_end_matches('/');
    hostport.parse().unwrap_or_else(|e| panic!("server address {hostport:?}: {e}"))
}

/// A copy of the admin kubeconfig that reaches the apiserver at `addr` (a proxy), written into `dir`.
pub fn kubeconfig_via(addr: std::net::SocketAddr, dir: &std::path::Path) -> PathBuf {
    let text = std::fs::read_to_string(kubeconfig()).unwrap_or_else(|e| panic!("read kubeconfig: {e}"));
    let rewritten: Vec<String> = text
        .lines()
        .map(|l| match l.trim_start().strip_prefix("server: ") {
            // The serving certificate is for 127.0.0.1 whatever the port, so TLS still verifies.
            Some(_) => format!("    server: https://{addr}"),
            None => l.to_owned(),
        })
        .collect();
    let path = dir.join("via-proxy.kubeconfig");
    std::fs::write(&path, rewritten.join("\n")).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// Compacts the test control plane's etcd at its current revision, through etcd's HTTP gateway: every
/// older revision is gone, so a watch resumed from one gets 410 Gone.
pub async fn compact_etcd() {
    let url =
        std::fs::read_to_string(kubeconfig().with_file_name("etcd")).unwrap_or_else(|e| panic!("read etcd url: {e}"));
    let url = url.trim();
    let post = |path: &str, body: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sf", "-X", "POST", &format!("{url}{path}"), "-d", body])
            .output()
            .unwrap_or_else(|e| panic!("run curl: {e}"));
        assert!(out.status.success(), "etcd {path}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_else(|e| panic!("etcd {path} answer: {e}"))
    };
    let status = post("/v3/maintenance/status", "{}");
    let revision =
        status["header"]["revision"].as_str().unwrap_or_else(|| panic!("etcd revision in {status}")).to_owned();
    post("/v3/kv/compaction", &format!(r#"{{"revision":"{revision}","physical":true}}"#));
}

/// The resident memory of process `pid` in KiB (VmRSS), for benchmarks that compare a daemon's memory.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// How many established TCP connections process `pid` has to `port` on loopback: what `ss -tnp state
/// established dst 127.0.0.1:PORT` lists for it, read from /proc (its socket inodes matched against the
/// kernel's TCP table), so no tool is needed.
pub fn tcp_connections(pid: u32, port: u16) -> usize {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap_or_else(|e| panic!("read /proc/{pid}/fd: {e}"));
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_owned))
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/net/tcp: {e}"));
    let remote = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode; st 01 is ESTABLISHED.
        .filter(|f| f.len() > 9 && f[2].ends_with(&remote) && f[3] == "01" && inodes.contains(f[9]))
        .count()
}

/// Starts a test's own task. The daemon's crates ban `tokio::spawn` in their code, tests and benches
/// alike, so that every task of the daemon belongs to a `consistd_core::tasks::Tasks` group that
/// shutdown waits for; a test's or a benchmark's task is not the daemon's and ends with the test.
pub fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(task)
}

/// Creates `count` ConfigMaps through `api`, 32 at a time, the `i`th from `object(i)` (a benchmark's keys).
pub async fn create_configmaps(
    api: &Api<k8s_openapi::api::core::v1::ConfigMap>,
    count: usize,
    object: impl Fn(usize) -> serde_json::Value,
) {
    use futures::StreamExt;
    futures::stream::iter(0..count)
        .map(|i| {
            let cm: k8s_openapi::api::core::v1::ConfigMap =
                serde_json::from_value(object(i)).expect("a ConfigMap's JSON");
            async move { api.create(&PostParams::default(), &cm).await.expect("create a ConfigMap") }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for a daemon's peer listener).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind a free port: {e}"));
    listener.local_addr().unwrap_or_else(|e| panic!("free port address: {e}")).port()
}

/// This machine's non-loopback address, for EndpointSlices (which may not point at loopback): the
/// source address the kernel picks for a route out (no packet is sent).
pub fn host_ip() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap_or_else(|e| panic!("bind UDP socket: {e}"));
    for target in ["10.255.255.255:1", "192.0.2.255:1", "172.31.255.255:1"] {
        if socket.connect(target).is_ok()
            && let Ok(addr) = socket.local_addr()
            && !addr.ip().is_loopback()
            && !addr.ip().is_unspecified()
        {
            return addr.ip();
        }
    }
    panic!("this machine has no non-loopback IPv4 address; EndpointSlice tests need one")
}
