//! Memory bounds: a daemon in a 128 MiB memory cgroup (the injector's default limit for the sidecar),
//! sent 200 messages of 1 MiB for a peer that is not up, answers RESOURCE_EXHAUSTED naming
//! outbox.maxPendingBytes once its outbox holds that many bytes, and is never OOM-killed, also after a
//! restart reloads everything it had accepted. Needs root (a cgroup of its own, removed afterwards).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use consistd_client::proto::{Destination, GetOutboxStatusRequest, SendRequest, destination::Target};
use consistd_testkit::{Daemon, free_port};
use nix::sys::signal::Signal;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const LIMIT: &str = "134217728"; // 128 MiB
const MIB: usize = 1024 * 1024;

/// A memory cgroup of its own (v2 if the host has it, else v1's memory controller), removed when dropped.
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    fn new(limit: &str) -> Self {
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
        let name = format!("consistd-test-{:08x}", rand::random::<u32>());
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let parent = if v2 {
            let path = own.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup v2 path");
            PathBuf::from(format!("/sys/fs/cgroup{path}"))
        } else {
            let path = own
                .lines()
                .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
                .expect("a cgroup v1 memory controller");
            PathBuf::from(format!("/sys/fs/cgroup/memory{path}"))
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create cgroup {}: {e}", dir.display()));
        let cgroup = Self { dir, v2 };
        cgroup.write(if v2 { "memory.max" } else { "memory.limit_in_bytes" }, limit);
        cgroup
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("write {value} to {}: {e}", path.display()));
    }

    fn add(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    /// How many times the kernel's OOM killer killed a process of this cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = std::fs::read_to_string(self.dir.join(file)).expect("read the cgroup's OOM counts");
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    #[allow(clippy::disallowed_methods, reason = "Drop cannot await; it runs once the test's daemons are gone")]
    fn drop(&mut self) {
        // Its processes are gone once the daemons are reaped; a moment may pass before the kernel agrees.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A daemon whose store is `store`, moved into `cgroup` once it serves.
async fn daemon_in(cgroup: &MemoryCgroup, store: &Path) -> Daemon {
    let config =
        "identity: bounded\npeer:\n  insecure: true\noutbox:\n  backoff: {initial: 20ms, factor: 2, cap: 500ms}\n";
    let daemon = Daemon::builder(BIN).config(config).store_dir(store).start().await;
    cgroup.add(daemon.pid());
    daemon
}

fn mib_for(peer: &str, i: usize) -> SendRequest {
    SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(peer.to_owned())) }),
        resource_id: format!("r{i}"),
        event_id: "e".to_owned(),
        payload: vec![b'x'; MIB],
        content_type: "application/octet-stream".to_owned(),
        ..Default::default()
    }
}

fn alive(daemon: &Daemon) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(daemon.pid()).expect("pid")), None).is_ok()
}

#[tokio::test]
async fn a_daemon_in_128_mib_sent_200_messages_of_1_mib_refuses_at_the_byte_limit_and_is_never_oom_killed() {
    let cgroup = MemoryCgroup::new(LIMIT);
    let store = tempfile::tempdir().expect("store dir");
    let peer = format!("127.0.0.1:{}", free_port());
    let mut a = daemon_in(&cgroup, store.path()).await;
    let client = a.client();
    let mut accepted = 0;
    for i in 0..200 {
        match client.outbox().send(mib_for(&peer, i)).await {
            Ok(_) => {
                assert_eq!(accepted, i, "refused before, accepted after: message {i}");
                accepted += 1;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "message {i}: {status}; log:\n{}", a.logs());
                assert!(status.message().contains("outbox.maxPendingBytes"), "names the byte limit: {status}");
            }
        }
    }
    // 32 MiB by default: 32 messages of 1 MiB.
    assert_eq!(accepted, 32, "accepted up to outbox.maxPendingBytes");
    assert!(alive(&a), "the daemon lives; log:\n{}", a.logs());
    assert_eq!(cgroup.oom_kills(), 0, "never OOM-killed");

    // A restart reloads all it had accepted, and still refuses more.
    a.signal(Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(30)).await;
    let b = daemon_in(&cgroup, store.path()).await;
    let status = b.client().outbox().get_outbox_status(GetOutboxStatusRequest {}).await.expect("status").into_inner();
    assert_eq!(status.total_pending, 32, "every accepted message reloaded");
    let refused = b.client().outbox().send(mib_for(&peer, 200)).await.expect_err("still at the byte limit");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
    assert!(alive(&b), "the restarted daemon lives; log:\n{}", b.logs());
    assert_eq!(cgroup.oom_kills(), 0, "never OOM-killed");
}
