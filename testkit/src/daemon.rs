//! A consistd process for a test: its own sockets and message store in a temp dir, the test control plane's kubeconfig,
//! logs kept for the failure message, killed when dropped.

use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use consistd_client::Client;
use nix::{sys::signal::Signal, unistd::Pid};
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// How long a daemon may take to report SERVING on a busy 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Options for starting a daemon.
#[derive(Debug)]
pub struct DaemonBuilder {
    bin: PathBuf,
    dir: Option<PathBuf>,
    store_dir: Option<PathBuf>,
    max_open_files: Option<u64>,
    cgroup: Option<PathBuf>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    config: Option<String>,
    apiserver: Option<std::net::SocketAddr>,
    wait_ready: bool,
}

/// A running consistd process.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    socket: PathBuf,
    admin_socket: PathBuf,
    log: PathBuf,
    // Keeps the temp dir (sockets, logs) alive as long as the daemon.
    _dir: Option<TempDir>,
}

impl DaemonBuilder {
    /// Puts the sockets and log in `dir` instead of a fresh temp dir (to share a socket path).
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Keeps the message store in `dir` instead of `<dir>/store` (a disk of its own, to fill or fail).
    pub fn store_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.store_dir = Some(dir.into());
        self
    }

    /// Starts the daemon with this many file descriptors at most (RLIMIT_NOFILE, through util-linux's
    /// `prlimit`, which then runs the daemon in its place: the pid is the daemon's).
    pub fn max_open_files(mut self, n: u64) -> Self {
        self.max_open_files = Some(n);
        self
    }

    /// Starts the daemon inside the cgroup at `dir` (its pid written to `cgroup.procs` before it runs, by
    /// a shell that then runs the daemon in its place: the pid is the daemon's), so it reads that cgroup's
    /// limits from its first instruction.
    pub fn cgroup(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cgroup = Some(dir.into());
        self
    }

    /// Adds a command-line argument after `run`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Runs with this YAML as its config file.
    pub fn config(mut self, yaml: impl Into<String>) -> Self {
        self.config = Some(yaml.into());
        self
    }

    /// Reaches the apiserver through `proxy` (a kubeconfig pointing at it is written into the daemon's dir).
    pub fn through(mut self, proxy: &crate::proxy::DelayProxy) -> Self {
        self.apiserver = Some(proxy.addr());
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Returns as soon as the process is spawned, without waiting for SERVING.
    pub fn no_wait(mut self) -> Self {
        self.wait_ready = false;
        self
    }

    /// Starts the daemon and (unless `no_wait`) waits until its health service reports SERVING.
    pub async fn start(self) -> Daemon {
        let (dir, temp) = match self.dir {
            Some(dir) => (dir, None),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("consistd-test-")
                    .tempdir()
                    .unwrap_or_else(|e| panic!("create daemon temp dir: {e}"));
                (temp.path().to_owned(), Some(temp))
            }
        };
        let socket = dir.join("consistd.sock");
        let admin_socket = dir.join("admin.sock");
        let log = dir.join(format!("consistd-{:08x}.log", rand::random::<u32>()));
        let log_file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        // The daemon, run in place by prlimit (a descriptor limit) and before that by a shell that moves
        // itself into the cgroup: whichever are asked for, the pid is the daemon's.
        let mut argv: Vec<std::ffi::OsString> = vec![self.bin.clone().into()];
        if let Some(n) = self.max_open_files {
            argv.splice(0..0, ["prlimit".into(), format!("--nofile={n}:{n}").into(), "--".into()]);
        }
        if let Some(dir) = &self.cgroup {
            let enter = r#"echo $$ > "$0/cgroup.procs" && exec "$@""#;
            argv.splice(0..0, ["sh".into(), "-c".into(), enter.into(), dir.clone().into()]);
        }
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]);
        if let Some(yaml) = &self.config {
            let file = dir.join("consistd.yaml");
            std::fs::write(&file, yaml).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
            command.arg("run").arg("--config").arg(file);
        } else {
            command.arg("run");
        }
        command
            .arg("--socket")
            .arg(&socket)
            .arg("--admin-socket")
            .arg(&admin_socket)
            .arg("--store-dir")
            .arg(self.store_dir.clone().unwrap_or_else(|| dir.join("store")))
            .args(&self.args)
            .env(
                "KUBECONFIG",
                match self.apiserver {
                    Some(addr) => crate::kubeconfig_via(addr, &dir),
                    None => crate::kubeconfig(),
                },
            )
            .env("CONSISTD_LOG_LEVEL", "consistd=debug,info")
            .envs(self.env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true);
        let child = command.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", self.bin.display()));
        let mut daemon = Daemon { child, socket, admin_socket, log, _dir: temp };
        if self.wait_ready {
            let ready = daemon.client().wait_ready(START_TIMEOUT).await;
            if let Err(error) = ready {
                let exited = daemon.child.try_wait().ok().flatten();
                panic!("consistd did not become ready ({error}); exit: {exited:?}; log:\n{}", daemon.logs());
            }
        }
        daemon
    }
}

impl Daemon {
    /// A builder for the consistd binary at `bin` (in integration tests: `env!("CARGO_BIN_EXE_consistd")`).
    pub fn builder(bin: impl Into<PathBuf>) -> DaemonBuilder {
        DaemonBuilder {
            bin: bin.into(),
            dir: None,
            store_dir: None,
            max_open_files: None,
            cgroup: None,
            args: Vec::new(),
            env: Vec::new(),
            config: None,
            apiserver: None,
            wait_ready: true,
        }
    }

    /// A daemon logging warnings only, as `identity` in `namespace`, for a bench's app process `command`,
    /// which is pointed at its socket (CONSISTD_SOCKET).
    pub async fn for_app(
        bin: impl Into<PathBuf>,
        identity: &str,
        namespace: &str,
        command: &mut tokio::process::Command,
    ) -> Daemon {
        let daemon = Daemon::builder(bin)
            .config(format!("identity: {identity}\nnamespace: {namespace}\n"))
            .env("CONSISTD_LOG_LEVEL", "warn")
            .start()
            .await;
        command.env("CONSISTD_SOCKET", daemon.socket());
        daemon
    }

    /// The gRPC socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The admin socket.
    pub fn admin_socket(&self) -> &Path {
        &self.admin_socket
    }

    /// A client for the gRPC socket.
    pub fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    /// How many calls of gRPC `method` (its bare name: "SendStream") the daemon has started, from its
    /// `consistd_grpc_server_started_total`, where every method has a line from the start. Panics if
    /// `method` has none, so a renamed metric or method fails the test rather than reading 0.
    pub async fn calls_started(&self, method: &str) -> u64 {
        let metrics = self.metrics().await;
        let label = format!("grpc_method=\"{method}\"");
        metrics
            .lines()
            .find(|l| l.starts_with("consistd_grpc_server_started_total{") && l.contains(&label))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no started calls of {method} in:\n{metrics}"))
    }

    /// The value of the first sample of metric `name` whose labels contain `labels` (empty: any), if any.
    pub async fn metric(&self, name: &str, labels: &str) -> Option<f64> {
        let metrics = self.metrics().await;
        metrics
            .lines()
            .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
            .find(|l| l.contains(labels))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// The daemon's Prometheus exposition, from `GET /metrics` on its admin socket (HTTP/1.0: the
    /// response ends with the connection).
    pub async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let path = &self.admin_socket;
        let mut stream = tokio::net::UnixStream::connect(path)
            .await
            .unwrap_or_else(|e| panic!("connect to admin socket {}: {e}", path.display()));
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: consistd\r\n\r\n")
            .await
            .unwrap_or_else(|e| panic!("ask {} for /metrics: {e}", path.display()));
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .unwrap_or_else(|e| panic!("read /metrics from {}: {e}", path.display()));
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("/metrics answered {response:?}"));
        assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "/metrics answered {head}");
        body.to_owned()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or_else(|| panic!("daemon already reaped"))
    }

    /// What the daemon has logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends a signal (SIGTERM to stop gracefully, SIGKILL to crash it).
    pub fn signal(&self, signal: Signal) {
        let pid = self.child.id().unwrap_or_else(|| panic!("daemon already reaped"));
        let pid = i32::try_from(pid).unwrap_or_else(|_| panic!("pid {pid} out of range"));
        nix::sys::signal::kill(Pid::from_raw(pid), signal).unwrap_or_else(|e| panic!("send {signal} to consistd: {e}"));
    }

    /// Waits for the process to exit, failing the test after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => panic!("wait for consistd: {e}"),
            Err(_) => panic!("consistd did not exit within {timeout:?}; log:\n{}", self.logs()),
        }
    }
}
