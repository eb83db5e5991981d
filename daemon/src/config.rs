//! The daemon's configuration: one YAML document (the `consistd.yaml` key of a ConfigMap), with
//! `${VAR}` references to the environment (the downward API), overridden by `CONSISTD_*` variables and
//! flags. Every error names the field path that is wrong.

use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Deserializer};
use serde_yaml::Value;

/// Default path of the gRPC socket, in the directory shared with the app containers.
pub const DEFAULT_SOCKET: &str = "/var/run/consistd/consistd.sock";
/// Default directory of the message store (an emptyDir in the pod).
pub const DEFAULT_STORE_DIR: &str = "/var/lib/consistd";
/// The largest payload the outbox can be configured to accept: requests must fit in
/// [`crate::api::MAX_REQUEST_BYTES`] with room for the other fields.
pub const MAX_PAYLOAD_LIMIT: usize = 3 * 1024 * 1024;
/// Default path of the admin HTTP socket (health, readiness, metrics, `consistd status`).
pub const DEFAULT_ADMIN_SOCKET: &str = "/var/run/consistd/admin.sock";

/// A Unix socket path is stored in `sockaddr_un.sun_path`: 108 bytes with the terminating NUL.
const MAX_SOCKET_PATH_BYTES: usize = 107;

/// The whole configuration of one daemon.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// This daemon's identity in elections; default: `POD_NAME` (the downward API), else the host name.
    pub identity: Option<String>,
    /// The namespace for elections that name none; default: `POD_NAMESPACE`, else the service
    /// account's namespace, else "default".
    pub namespace: Option<String>,
    /// The gRPC socket apps connect to.
    pub socket: SocketConfig,
    /// The admin HTTP socket.
    pub admin: AdminConfig,
    /// Elections this daemon campaigns in from boot to shutdown, for apps that only observe.
    pub elections: Vec<ElectionConfig>,
    /// The watch hub.
    pub watch: WatchConfig,
    /// Own-write consistency.
    pub consistency: ConsistencyConfig,
    /// Where durable state (the outbox and inbox) lives.
    pub store: StoreConfig,
    /// The daemon-to-daemon transport of ACK-tracked sends.
    pub peer: PeerConfig,
    /// Election groups (the members of an election, for sends and replica barriers).
    pub membership: MembershipConfig,
    /// ACK-tracked sends from this pod.
    pub outbox: OutboxConfig,
    /// Messages for this pod's app.
    pub inbox: InboxConfig,
    /// How the daemon stops.
    pub shutdown: ShutdownConfig,
    /// Logging.
    pub log: LogConfig,
}

/// Where and how the gRPC socket is created.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SocketConfig {
    /// Socket path; its directory is shared with the app containers (an emptyDir).
    pub path: PathBuf,
    /// Permission bits of the socket file, written in octal ("0660"): owner and group may connect,
    /// others may not.
    pub mode: FileMode,
    /// Numeric group that owns the socket, so app containers running as another user in that group
    /// (the pod's fsGroup) can connect. Unset keeps the daemon's group.
    pub group_id: Option<u32>,
}

/// Where the admin HTTP endpoint listens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AdminConfig {
    /// Socket path for /healthz, /readyz, /metrics and /debug/state.
    pub socket: PathBuf,
}

/// An election started at boot.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ElectionConfig {
    /// The Lease name.
    pub name: String,
    /// The Lease namespace; default: the daemon's namespace.
    #[serde(default)]
    pub namespace: String,
    /// Lease validity after the last renewal (15 s, client-go's default).
    #[serde(default = "default_lease_duration", with = "humantime_serde")]
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops reporting LEADER (10 s, client-go's default).
    #[serde(default = "default_renew_deadline", with = "humantime_serde")]
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew (2 s, client-go's default).
    #[serde(default = "default_retry_period", with = "humantime_serde")]
    pub retry_period: Duration,
}

fn default_lease_duration() -> Duration {
    Duration::from_secs(15)
}
fn default_renew_deadline() -> Duration {
    Duration::from_secs(10)
}
fn default_retry_period() -> Duration {
    Duration::from_secs(2)
}

impl ElectionConfig {
    /// The election's timing.
    pub fn timing(&self) -> Timing {
        Timing {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }
}

/// Election timing, client-go's semantics and defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a Lease stays valid after its last renewal (15 s, client-go's default).
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops reporting LEADER (10 s, client-go's default).
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and leaders renew (2 s, client-go's default).
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timing {
    /// Checks the order client-go requires: 0 < retry period < renew deadline < lease duration, and
    /// whole seconds for the lease duration (the Lease stores seconds).
    pub fn validate(&self) -> Result<(), String> {
        if self.retry_period.is_zero() {
            return Err("retry_period must be greater than 0".to_owned());
        }
        if self.renew_deadline <= self.retry_period {
            return Err(format!(
                "renew_deadline ({:?}) must be greater than retry_period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "renew_deadline ({:?}) must be less than lease_duration ({:?}), so a leader stops before others can take over",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.as_secs() > i32::MAX as u64 {
            return Err(format!("lease_duration ({:?}) must be whole seconds", self.lease_duration));
        }
        Ok(())
    }
}

/// How shared watches are kept.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct WatchConfig {
    /// How long an upstream watch outlives its last subscriber, so an app that reconnects can resume
    /// from its cursor instead of starting over.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Events one subscriber may have queued; a subscriber that falls further behind gets
    /// RESYNC_REQUIRED and a fresh snapshot instead of slowing anyone down.
    pub subscriber_queue: usize,
    /// Events each watch keeps for resuming from a cursor.
    pub history: usize,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self { linger: Duration::from_secs(5), subscriber_queue: 1024, history: 10_000 }
    }
}

/// How long the pod's own writes are waited for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ConsistencyConfig {
    /// How long CONSISTENT subscribers hold older states after a write of this pod before delivering
    /// the latest one marked timed out, and how long read-your-writes reads wait. 5 s: a watch event
    /// normally follows its write within milliseconds; seconds mean the watch is lagging.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for ConsistencyConfig {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(5) }
    }
}

/// Where durable state lives.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct StoreConfig {
    /// Directory of the message store (`consistd.redb`): an emptyDir, so messages survive container
    /// restarts and kill -9.
    pub dir: PathBuf,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { dir: PathBuf::from(DEFAULT_STORE_DIR) }
    }
}

/// The peer transport: gRPC over TCP between daemons.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerConfig {
    /// Address the peer server listens on, e.g. "0.0.0.0:7070". Unset: this daemon receives nothing
    /// from peers (it can still send).
    pub listen: Option<SocketAddr>,
    /// The "host:port" other daemons reach this one at (announced to election groups); default: the
    /// `POD_IP` variable with the listen port.
    pub advertise: Option<String>,
    /// Mutual TLS from mounted certificate files (e.g. a cert-manager Secret).
    pub tls: Option<TlsConfig>,
    /// Plaintext peer traffic, for local development only. Off by default.
    pub insecure: bool,
}

/// Certificate files for mutual TLS between daemons.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsConfig {
    /// PEM certificate (chain) this daemon presents, as server and as client.
    pub cert_file: PathBuf,
    /// PEM private key of that certificate.
    pub key_file: PathBuf,
    /// PEM CA bundle that peers' certificates must chain to.
    pub ca_file: PathBuf,
    /// The name peers' server certificates are checked against (peers are dialled by IP).
    #[serde(default = "default_server_name")]
    pub server_name: String,
}

fn default_server_name() -> String {
    "consistd".to_owned()
}

/// How this daemon appears in election groups.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MembershipConfig {
    /// How long a member counts after its last renewal (it renews every third of this): a member that
    /// was killed is dropped from its groups this long after it was last seen.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        Self { ttl: Duration::from_secs(30) }
    }
}

/// Bounds and retry policy of the outbox.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct OutboxConfig {
    /// Largest payload `Send` accepts (1 MiB).
    pub max_payload_bytes: usize,
    /// Messages one destination may hold un-ACKed (for Service and election destinations: the latest
    /// message of each resource_id) before `Send` answers RESOURCE_EXHAUSTED.
    pub max_pending_per_destination: usize,
    /// Messages the whole outbox may hold.
    pub max_pending: usize,
    /// Resend timing.
    pub backoff: BackoffConfig,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            max_payload_bytes: 1024 * 1024,
            max_pending_per_destination: 10_000,
            max_pending: 100_000,
            backoff: BackoffConfig::default(),
        }
    }
}

/// Exponential backoff with full jitter: attempt n waits a random time in [0, min(cap, initial *
/// factor^(n-1))]. Also paces reconnecting to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct BackoffConfig {
    /// The first delay's upper bound.
    #[serde(with = "humantime_serde")]
    pub initial: Duration,
    /// How much the bound grows per attempt.
    pub factor: f64,
    /// The largest bound.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self { initial: Duration::from_millis(100), factor: 2.0, cap: Duration::from_secs(10) }
    }
}

/// Bounds of the inbox.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct InboxConfig {
    /// Messages waiting for the app's ACK; beyond it peers are told to retry later.
    pub max_pending: usize,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self { max_pending: 100_000 }
    }
}

/// How the daemon stops on SIGTERM.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ShutdownConfig {
    /// How long in-flight calls may take to finish after SIGTERM before they are cut off. 5 s keeps
    /// well inside Kubernetes' default 30 s terminationGracePeriodSeconds.
    #[serde(with = "humantime_serde")]
    pub grace_period: Duration,
}

/// Log output.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LogConfig {
    /// `text` for people, `json` for log pipelines.
    pub format: LogFormat,
    /// A tracing filter directive, e.g. `info` or `consistd=debug,kube=info`.
    pub level: String,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Unix permission bits, parsed from an octal string.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FileMode(pub u32);

impl Default for SocketConfig {
    fn default() -> Self {
        Self { path: PathBuf::from(DEFAULT_SOCKET), mode: FileMode(0o660), group_id: None }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self { socket: PathBuf::from(DEFAULT_ADMIN_SOCKET) }
    }
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace_period: Duration::from_secs(5) }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text, level: "info".to_owned() }
    }
}

impl fmt::Debug for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        // A bare number such as 660 would be read as decimal, so only an octal string is accepted.
        match Value::deserialize(deserializer)? {
            Value::String(s) => parse_mode(&s).map_err(D::Error::custom),
            other => Err(D::Error::custom(format!(
                "expected a quoted octal string such as \"0660\", got {}",
                describe(&other)
            ))),
        }
    }
}

fn parse_mode(s: &str) -> Result<FileMode, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u32::from_str_radix(digits, 8) {
        Ok(bits) if bits <= 0o777 => Ok(FileMode(bits)),
        _ => Err(format!("{s:?} is not an octal permission mode between \"0000\" and \"0777\"")),
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("{s:?}"),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(_) => "a tagged value".to_owned(),
    }
}

/// Values from `CONSISTD_*` variables and flags; each set one replaces the file's value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// `--socket` / `CONSISTD_SOCKET`.
    pub socket: Option<PathBuf>,
    /// `--admin-socket` / `CONSISTD_ADMIN_SOCKET`.
    pub admin_socket: Option<PathBuf>,
    /// `--store-dir` / `CONSISTD_STORE_DIR`.
    pub store_dir: Option<PathBuf>,
    /// `--log-format` / `CONSISTD_LOG_FORMAT`.
    pub log_format: Option<LogFormat>,
    /// `--log-level` / `CONSISTD_LOG_LEVEL`.
    pub log_level: Option<String>,
}

/// Why a configuration was refused. The path names the field (`socket.mode`), or `<document>`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a YAML document.
    #[error("parse config file {path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The YAML parser's message, with line and column.
        message: String,
    },
    /// A field has a wrong value, a wrong type, or is unknown.
    #[error("{field}: {message}")]
    Field {
        /// Dotted path of the field.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Field { field: field.into(), message: message.into() }
    }
}

impl Config {
    /// Reads, expands, parses and validates a config file, then applies the overrides.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut config = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
                Self::parse(&text, &|name| std::env::var(name).ok()).map_err(|e| match e {
                    ConfigError::Syntax { message, .. } => ConfigError::Syntax { path: path.to_owned(), message },
                    other => other,
                })?
            }
            None => Self::default(),
        };
        config.apply(overrides);
        config.validate()?;
        Ok(config)
    }

    /// Parses a YAML document, replacing `${NAME}` in string values with `env(NAME)`. Does not
    /// validate; [`Config::load`] does.
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut doc: Value = serde_yaml::from_str(text)
            .map_err(|e| ConfigError::Syntax { path: PathBuf::new(), message: e.to_string() })?;
        if doc.is_null() {
            // An empty ConfigMap key means "all defaults".
            doc = Value::Mapping(Default::default());
        }
        expand_env(&mut doc, &mut Vec::new(), env)?;
        serde_path_to_error::deserialize(doc).map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." { "<document>".to_owned() } else { field };
            ConfigError::field(field, e.into_inner().to_string())
        })
    }

    fn apply(&mut self, o: &Overrides) {
        if let Some(p) = &o.socket {
            self.socket.path = p.clone();
        }
        if let Some(p) = &o.admin_socket {
            self.admin.socket = p.clone();
        }
        if let Some(d) = &o.store_dir {
            self.store.dir = d.clone();
        }
        if let Some(f) = o.log_format {
            self.log.format = f;
        }
        if let Some(l) = &o.log_level {
            self.log.level = l.clone();
        }
    }

    /// The identity to campaign with.
    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_owned()))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "consistd".to_owned())
    }

    /// The namespace for elections that name none.
    pub fn namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .or_else(|| {
                std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                    .ok()
                    .map(|n| n.trim().to_owned())
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_owned())
    }

    /// Checks what types alone cannot: socket paths, durations, the log filter.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_socket_path("socket.path", &self.socket.path)?;
        check_socket_path("admin.socket", &self.admin.socket)?;
        if self.socket.path == self.admin.socket {
            return Err(ConfigError::field(
                "admin.socket",
                "must differ from socket.path: the admin endpoint needs a socket of its own",
            ));
        }
        for (i, e) in self.elections.iter().enumerate() {
            if e.name.is_empty() {
                return Err(ConfigError::field(format!("elections[{i}].name"), "must not be empty"));
            }
            if let Err(m) = e.timing().validate() {
                return Err(ConfigError::field(format!("elections[{i}]"), m));
            }
        }
        if self.watch.subscriber_queue == 0 {
            return Err(ConfigError::field("watch.subscriberQueue", "must be at least 1"));
        }
        if self.consistency.timeout.is_zero() {
            return Err(ConfigError::field("consistency.timeout", "must be greater than 0s"));
        }
        if !self.store.dir.is_absolute() {
            return Err(ConfigError::field(
                "store.dir",
                format!("{} must be an absolute path", self.store.dir.display()),
            ));
        }
        self.validate_peer()?;
        if self.membership.ttl < Duration::from_secs(3) || self.membership.ttl.subsec_nanos() != 0 {
            return Err(ConfigError::field("membership.ttl", "must be whole seconds, at least 3s"));
        }
        self.validate_outbox()?;
        if self.shutdown.grace_period.is_zero() {
            return Err(ConfigError::field(
                "shutdown.gracePeriod",
                "must be greater than 0s: in-flight calls need time to finish",
            ));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(ConfigError::field("log.level", format!("{:?} is not a tracing filter: {e}", self.log.level)));
        }
        Ok(())
    }
}

impl Config {
    fn validate_peer(&self) -> Result<(), ConfigError> {
        let peer = &self.peer;
        if peer.tls.is_some() && peer.insecure {
            return Err(ConfigError::field("peer.insecure", "must be false when peer.tls is set"));
        }
        if peer.listen.is_some() && !peer.transport_configured() {
            return Err(ConfigError::field(
                "peer.listen",
                "needs peer.tls (mutual TLS), or peer.insecure: true for local development",
            ));
        }
        if let Some(tls) = &peer.tls {
            for (field, path) in [("certFile", &tls.cert_file), ("keyFile", &tls.key_file), ("caFile", &tls.ca_file)] {
                if path.as_os_str().is_empty() {
                    return Err(ConfigError::field(format!("peer.tls.{field}"), "must not be empty"));
                }
            }
            if tls.server_name.is_empty() {
                return Err(ConfigError::field("peer.tls.serverName", "must not be empty"));
            }
        }
        if let Some(a) = &peer.advertise
            && crate::names::check_peer_address(a).is_err()
        {
            return Err(ConfigError::field("peer.advertise", format!("{a:?} is not a host:port address")));
        }
        Ok(())
    }

    fn validate_outbox(&self) -> Result<(), ConfigError> {
        let o = &self.outbox;
        if o.max_payload_bytes == 0 || o.max_payload_bytes > MAX_PAYLOAD_LIMIT {
            return Err(ConfigError::field(
                "outbox.maxPayloadBytes",
                format!("must be between 1 and {MAX_PAYLOAD_LIMIT} (requests are limited to 4 MiB)"),
            ));
        }
        if o.max_pending_per_destination == 0 {
            return Err(ConfigError::field("outbox.maxPendingPerDestination", "must be at least 1"));
        }
        if o.max_pending < o.max_pending_per_destination {
            return Err(ConfigError::field("outbox.maxPending", "must be at least outbox.maxPendingPerDestination"));
        }
        let b = &o.backoff;
        if b.initial.is_zero() {
            return Err(ConfigError::field("outbox.backoff.initial", "must be greater than 0s"));
        }
        if !(b.factor >= 1.0 && b.factor <= 100.0) {
            return Err(ConfigError::field("outbox.backoff.factor", "must be between 1 and 100"));
        }
        if b.cap < b.initial {
            return Err(ConfigError::field("outbox.backoff.cap", "must be at least outbox.backoff.initial"));
        }
        if self.inbox.max_pending == 0 {
            return Err(ConfigError::field("inbox.maxPending", "must be at least 1"));
        }
        Ok(())
    }

    /// The address announced to peers: `peer.advertise`, else `POD_IP` with the listen port.
    pub fn advertise(&self) -> Option<String> {
        if let Some(a) = &self.peer.advertise {
            return Some(a.clone());
        }
        let port = self.peer.listen?.port();
        let ip = std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty())?;
        Some(if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") })
    }
}

impl PeerConfig {
    /// Whether peers can be reached: with mutual TLS, or plaintext by explicit choice.
    pub fn transport_configured(&self) -> bool {
        self.tls.is_some() || self.insecure
    }
}

fn check_socket_path(field: &str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(ConfigError::field(field, "must not be empty"));
    }
    if !path.is_absolute() {
        return Err(ConfigError::field(field, format!("{} must be an absolute path", path.display())));
    }
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_BYTES {
        return Err(ConfigError::field(
            field,
            format!("{} is {len} bytes; a Unix socket path has at most {MAX_SOCKET_PATH_BYTES}", path.display()),
        ));
    }
    Ok(())
}

/// Replaces `${NAME}` in every string scalar; `$${` writes a literal `${`.
fn expand_env(
    value: &mut Value,
    path: &mut Vec<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match value {
        Value::String(s) => {
            if s.contains('$') {
                *s = expand_str(s, env).map_err(|m| ConfigError::field(path.join("."), m))?;
            }
        }
        Value::Mapping(map) => {
            for (key, v) in map.iter_mut() {
                path.push(key.as_str().map(str::to_owned).unwrap_or_else(|| describe(key)));
                expand_env(v, path, env)?;
                path.pop();
            }
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                expand_env(v, path, env)?;
                path.pop();
            }
        }
        Value::Tagged(tagged) => expand_env(&mut tagged.value, path, env)?,
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    Ok(())
}

fn expand_str(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let end = after.find('}').ok_or_else(|| format!("unterminated ${{ in {s:?}"))?;
            let name = &after[..end];
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return Err(format!("${{{name}}} is not a valid environment variable reference"));
            }
            let v = env(name).ok_or_else(|| format!("${{{name}}} is not set in the environment"))?;
            out.push_str(&v);
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn field_error(text: &str) -> (String, String) {
        match Config::parse(text, &no_env).and_then(|c| c.validate().map(|()| c)) {
            Err(ConfigError::Field { field, message }) => (field, message),
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn an_empty_document_means_all_defaults() {
        let config = Config::parse("", &no_env).expect("empty config parses");
        assert_eq!(config, Config::default());
        assert_eq!(config.socket.path, Path::new(DEFAULT_SOCKET));
        assert_eq!(config.socket.mode, FileMode(0o660));
        assert_eq!(config.shutdown.grace_period, Duration::from_secs(5));
    }

    #[test]
    fn a_full_document_parses() {
        let text = r#"
socket:
  path: /run/c/c.sock
  mode: "0600"
  groupId: 2000
admin:
  socket: /run/c/admin.sock
shutdown:
  gracePeriod: 1500ms
log:
  format: json
  level: consistd=debug
"#;
        let config = Config::parse(text, &no_env).expect("valid config parses");
        config.validate().expect("valid config validates");
        assert_eq!(config.socket.path, Path::new("/run/c/c.sock"));
        assert_eq!(config.socket.mode, FileMode(0o600));
        assert_eq!(config.socket.group_id, Some(2000));
        assert_eq!(config.shutdown.grace_period, Duration::from_millis(1500));
        assert_eq!(config.log.format, LogFormat::Json);
    }

    #[test]
    fn unknown_fields_are_errors_naming_the_field() {
        let (field, message) = field_error("socket:\n  mdoe: \"0660\"\n");
        assert_eq!(field, "socket.mdoe");
        assert!(message.contains("unknown field `mdoe`"), "{message}");
        let (field, _) = field_error("sockets: {}\n");
        assert_eq!(field, "sockets");
    }

    #[test]
    fn a_mode_is_octal_and_a_bare_number_is_refused_with_the_reason() {
        // serde_yaml keeps a leading-zero scalar as the string it looks like.
        let config = Config::parse("socket:\n  mode: 0640\n", &no_env).expect("parses");
        assert_eq!(config.socket.mode, FileMode(0o640));
        let (field, message) = field_error("socket:\n  mode: 660\n");
        assert_eq!(field, "socket.mode");
        assert!(message.contains("quoted octal"), "{message}");
        let (field, _) = field_error("socket:\n  mode: \"0999\"\n");
        assert_eq!(field, "socket.mode");
    }

    #[test]
    fn wrong_types_and_values_name_the_field() {
        assert_eq!(field_error("shutdown:\n  gracePeriod: soon\n").0, "shutdown.gracePeriod");
        assert_eq!(field_error("shutdown:\n  gracePeriod: 0s\n").0, "shutdown.gracePeriod");
        assert_eq!(field_error("log:\n  format: xml\n").0, "log.format");
        assert_eq!(field_error("log:\n  level: \"[[\"\n").0, "log.level");
        assert_eq!(field_error("socket:\n  path: relative.sock\n").0, "socket.path");
        assert_eq!(field_error("socket:\n  groupId: -1\n").0, "socket.groupId");
        let long = format!("socket:\n  path: /{}\n", "x".repeat(120));
        assert!(field_error(&long).1.contains("at most 107"));
        let same = "socket:\n  path: /a.sock\nadmin:\n  socket: /a.sock\n";
        assert_eq!(field_error(same).0, "admin.socket");
        assert_eq!(field_error("- 1\n").0, "<document>");
        assert_eq!(field_error("watch:\n  subscriberQueue: 0\n").0, "watch.subscriberQueue");
        assert_eq!(field_error("watch:\n  linger: forever\n").0, "watch.linger");
        assert_eq!(field_error("elections:\n- name: e\n  renewDeadline: 20s\n").0, "elections[0]");
        assert_eq!(field_error("elections:\n- name: \"\"\n").0, "elections[0].name");
        assert_eq!(field_error("elections:\n- name: e\n  leaseDuraton: 5s\n").0, "elections[0].leaseDuraton");
    }

    #[test]
    fn peer_and_outbox_settings_are_checked_naming_the_field() {
        assert_eq!(field_error("peer:\n  listen: 127.0.0.1:7070\n").0, "peer.listen");
        assert_eq!(field_error("peer:\n  listen: nowhere\n").0, "peer.listen");
        let both = "peer:\n  insecure: true\n  tls: {certFile: a, keyFile: b, caFile: c}\n";
        assert_eq!(field_error(both).0, "peer.insecure");
        assert_eq!(field_error("peer:\n  tls: {certFile: a, keyFile: b}\n").0, "peer.tls");
        assert_eq!(field_error("peer:\n  advertise: no-port\n").0, "peer.advertise");
        assert_eq!(field_error("outbox:\n  maxPayloadBytes: 0\n").0, "outbox.maxPayloadBytes");
        assert_eq!(field_error("outbox:\n  maxPayloadBytes: 4194304\n").0, "outbox.maxPayloadBytes");
        assert_eq!(field_error("outbox:\n  maxPending: 5\n").0, "outbox.maxPending");
        assert_eq!(field_error("outbox:\n  backoff: {factor: 0.5}\n").0, "outbox.backoff.factor");
        assert_eq!(field_error("outbox:\n  backoff: {initial: 2s, cap: 1s}\n").0, "outbox.backoff.cap");
        assert_eq!(field_error("store:\n  dir: relative\n").0, "store.dir");
        let ok = "peer:\n  listen: 0.0.0.0:7070\n  insecure: true\noutbox:\n  backoff: {initial: 50ms, factor: 1.5, cap: 2s}\n";
        let config = Config::parse(ok, &no_env).expect("parses");
        config.validate().expect("valid");
        assert_eq!(config.outbox.backoff.cap, Duration::from_secs(2));
        assert!(config.peer.transport_configured());
        assert!(!Config::default().peer.transport_configured());
    }

    #[test]
    fn environment_references_are_expanded() {
        let env = |name: &str| (name == "POD_NAME").then(|| "web-0".to_owned());
        let config = Config::parse("socket:\n  path: /run/${POD_NAME}/c.sock\n", &env).expect("parses");
        assert_eq!(config.socket.path, Path::new("/run/web-0/c.sock"));
        let config = Config::parse("socket:\n  path: /run/$${X}/a$b\n", &env).expect("parses");
        assert_eq!(config.socket.path, Path::new("/run/${X}/a$b"));
    }

    #[test]
    fn a_missing_environment_variable_names_the_field() {
        let (field, message) = match Config::parse("socket:\n  path: /run/${NOPE}.sock\n", &no_env) {
            Err(ConfigError::Field { field, message }) => (field, message),
            other => panic!("expected a field error, got {other:?}"),
        };
        assert_eq!(field, "socket.path");
        assert!(message.contains("${NOPE} is not set"), "{message}");
        assert!(Config::parse("socket:\n  path: /run/${NOPE\n", &no_env).is_err());
        assert!(Config::parse("socket:\n  path: /run/${1X}\n", &no_env).is_err());
    }

    #[test]
    fn overrides_replace_file_values() {
        let mut config = Config::parse("socket:\n  path: /from/file.sock\n", &no_env).expect("parses");
        config.apply(&Overrides {
            socket: Some("/from/flag.sock".into()),
            log_format: Some(LogFormat::Json),
            ..Overrides::default()
        });
        assert_eq!(config.socket.path, Path::new("/from/flag.sock"));
        assert_eq!(config.log.format, LogFormat::Json);
        assert_eq!(config.admin.socket, Path::new(DEFAULT_ADMIN_SOCKET));
    }

    #[test]
    fn timing_must_be_ordered_like_client_go() {
        assert!(Timing::default().validate().is_ok());
        let t = |l, r, p| Timing {
            lease_duration: Duration::from_secs(l),
            renew_deadline: Duration::from_secs(r),
            retry_period: Duration::from_secs(p),
        };
        assert!(t(10, 10, 2).validate().expect_err("renew = lease").contains("renew_deadline"));
        assert!(t(10, 12, 2).validate().is_err());
        assert!(t(15, 10, 10).validate().is_err());
        assert!(t(15, 10, 0).validate().is_err());
        let fractional = Timing { lease_duration: Duration::from_millis(15_500), ..Timing::default() };
        assert!(fractional.validate().expect_err("fraction").contains("whole seconds"));
    }

    #[test]
    fn a_syntax_error_names_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("consistd.yaml");
        std::fs::write(&file, "socket: [unclosed\n").expect("write config");
        let err = Config::load(Some(&file), &Overrides::default()).expect_err("bad YAML is refused");
        assert!(err.to_string().contains("consistd.yaml"), "{err}");
    }
}
