//! The message store's disk failing under a running daemon: full (the store on a small tmpfs) and fsync
//! failing (strace's fault injection). Send answers UNAVAILABLE naming the store, readiness says why, and
//! once the disk works again the daemon recovers without a restart: every message Send accepted, before
//! and after, is delivered exactly once. Needs root (mount, ptrace); the host is restored (umount, strace
//! detached) whatever happens.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use consistd_client::proto::{AckRequest, Destination, ReceiveRequest, SendRequest, destination::Target};
use consistd_testkit::{Daemon, free_port};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const WAIT: Duration = Duration::from_secs(30);

/// A tmpfs mounted for the test's store, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::Builder::new().prefix("consistd-disk-").tempdir().expect("temp dir");
        run("mount", &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", &path(dir.path())]);
        Self { dir }
    }

    fn resize(&self, size: &str) {
        run("mount", &["-o", &format!("remount,size={size}"), &path(self.dir.path())]);
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn path(p: &Path) -> String {
    p.to_str().expect("a UTF-8 path").to_owned()
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// strace attached to every thread of a process, failing its fsync and fdatasync calls with EIO until
/// dropped (which detaches it).
struct FailingFsync(Child);

impl FailingFsync {
    fn attach(pid: u32) -> Self {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = Command::new(repo.join("hack/tools.sh")).arg("strace").output().expect("hack/tools.sh strace");
        assert!(out.status.success(), "hack/tools.sh strace: {}", String::from_utf8_lossy(&out.stderr));
        let strace = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let child = Command::new(strace)
            .args(["-f", "-qq", "-e", "trace=fsync,fdatasync", "-e", "inject=fsync,fdatasync:error=EIO"])
            .args(["-o", "/dev/null", "-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn strace");
        Self(child)
    }
}

impl Drop for FailingFsync {
    fn drop(&mut self) {
        // SIGTERM makes strace detach, leaving the traced process running.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).expect("pid")),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

fn to_peer(peer: &str, resource: &str, payload: Vec<u8>) -> SendRequest {
    SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(peer.to_owned())) }),
        resource_id: resource.to_owned(),
        event_id: "e".to_owned(),
        payload,
        content_type: "application/octet-stream".to_owned(),
        ..Default::default()
    }
}

/// A sender whose store is in `store` (or its own directory), sending to a peer that is not up yet.
async fn sender(store: Option<&Path>) -> Daemon {
    let config =
        "identity: sender\npeer:\n  insecure: true\noutbox:\n  backoff: {initial: 20ms, factor: 2, cap: 500ms}\n";
    let mut builder = Daemon::builder(BIN).config(config);
    if let Some(store) = store {
        builder = builder.store_dir(store);
    }
    builder.start().await
}

/// Waits until `consistd status` says ready or not; returns its reasons.
async fn until_ready(daemon: &Daemon, ready: bool) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let report = consistd_server::admin::fetch_report(daemon.admin_socket()).await.expect("consistd status");
        if report.ready == ready {
            return report.not_ready_reasons;
        }
        assert!(tokio::time::Instant::now() < deadline, "ready is not {ready} within {WAIT:?}: {report:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts the peer the messages were sent to and checks its app receives exactly `accepted`, once each.
async fn delivered_exactly_once(peer: &str, accepted: &[String]) {
    let b = Daemon::builder(BIN)
        .config(format!("identity: b\npeer:\n  listen: \"{peer}\"\n  insecure: true\n"))
        .start()
        .await;
    let mut messages = b.client().inbox().receive(ReceiveRequest {}).await.expect("Receive").into_inner();
    let mut got: HashMap<String, usize> = HashMap::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while got.len() < accepted.len() {
        let item = tokio::time::timeout_at(deadline, messages.message()).await;
        let m = item.unwrap_or_else(|_| panic!("{} of {} accepted messages arrived", got.len(), accepted.len()));
        let m = m.expect("Receive").expect("stream open").message.expect("message");
        b.client().inbox().ack(AckRequest { message_id: m.message_id.clone() }).await.expect("Ack");
        *got.entry(m.resource_id).or_default() += 1;
    }
    // Anything more would be a duplicate, or a message whose Send was refused.
    let more = tokio::time::timeout(Duration::from_secs(2), messages.message()).await;
    assert!(more.is_err(), "a message beyond those accepted: {more:?}");
    let mut ids: Vec<&String> = got.keys().collect();
    ids.sort();
    let mut want: Vec<&String> = accepted.iter().collect();
    want.sort();
    assert_eq!(ids, want, "exactly the accepted messages");
    assert!(got.values().all(|&n| n == 1), "each once: {got:?}");
}

#[tokio::test]
async fn a_full_disk_refuses_sends_naming_the_store_and_the_daemon_recovers_once_space_returns() {
    let disk = Tmpfs::mount("2m");
    let a = sender(Some(disk.path())).await;
    let peer = format!("127.0.0.1:{}", free_port());
    let client = a.client();
    let mut accepted = Vec::new();
    let refused = loop {
        assert!(accepted.len() < 200, "2 MiB took 200 messages of 64 KiB");
        let id = format!("before-{}", accepted.len());
        match client.outbox().send(to_peer(&peer, &id, vec![b'x'; 64 * 1024])).await {
            Ok(_) => accepted.push(id),
            Err(status) => break status,
        }
    };
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert!(
        refused.message().contains("message store") && refused.message().contains("No space left on device"),
        "the refusal names the store and why: {refused}"
    );
    let reasons = until_ready(&a, false).await;
    assert!(reasons.iter().any(|r| r.contains("message store")), "readiness names the store: {reasons:?}");

    // Space returns; the daemon takes writes again without a restart.
    disk.resize("64m");
    until_ready(&a, true).await;
    for i in 0..5 {
        let id = format!("after-{i}");
        client.outbox().send(to_peer(&peer, &id, vec![b'y'; 64 * 1024])).await.expect("Send once space returned");
        accepted.push(id);
    }
    assert!(a.logs().contains("the message store is open again after an I/O error"), "{}", a.logs());
    delivered_exactly_once(&peer, &accepted).await;
}

#[tokio::test]
async fn a_failing_fsync_refuses_sends_naming_the_store_and_the_daemon_recovers_once_it_works() {
    let a = sender(None).await;
    let peer = format!("127.0.0.1:{}", free_port());
    let client = a.client();
    let mut accepted = Vec::new();
    for i in 0..3 {
        let id = format!("before-{i}");
        client.outbox().send(to_peer(&peer, &id, b"kept".to_vec())).await.expect("Send");
        accepted.push(id);
    }
    let failing = FailingFsync::attach(a.pid());
    // strace attaches in the background: until it does, a Send may still be stored.
    let refused = tokio::time::timeout(WAIT, async {
        for i in 0.. {
            let id = format!("during-{i}");
            match client.outbox().send(to_peer(&peer, &id, b"maybe".to_vec())).await {
                Ok(_) => accepted.push(id),
                Err(status) => return status,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!()
    })
    .await
    .expect("a Send refused once fsync fails");
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert!(refused.message().contains("message store"), "the refusal names the store: {refused}");
    let reasons = until_ready(&a, false).await;
    assert!(reasons.iter().any(|r| r.contains("message store")), "readiness names the store: {reasons:?}");

    drop(failing);
    until_ready(&a, true).await;
    for i in 0..3 {
        let id = format!("after-{i}");
        client.outbox().send(to_peer(&peer, &id, b"kept".to_vec())).await.expect("Send once fsync works");
        accepted.push(id);
    }
    delivered_exactly_once(&peer, &accepted).await;
}
