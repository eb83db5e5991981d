//! The configuration's schema: every section and field, each default beside its struct and saying
//! where it comes from. Parsing and overrides are in `config`, checks across fields in `validate`.

use std::{fmt, net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Deserializer};
use serde_yaml::Value;

/// Default path of the gRPC socket, in the directory shared with the app containers.
pub const DEFAULT_SOCKET: &str = "/var/run/consistd/consistd.sock";
/// Default directory of the message store (an emptyDir in the pod).
pub const DEFAULT_STORE_DIR: &str = "/var/lib/consistd";
/// The largest payload the outbox can be configured to accept: requests must fit in
/// the gRPC API's 4 MiB (`MAX_REQUEST_BYTES` of the server crate's `api`) with room for the other fields.
pub const MAX_PAYLOAD_LIMIT: usize = 3 * 1024 * 1024;
/// Default path of the admin HTTP socket (health, readiness, metrics, `consistd status`).
pub const DEFAULT_ADMIN_SOCKET: &str = "/var/run/consistd/admin.sock";

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
    /// The admin HTTP socket (health, readiness, metrics, `consistd status`).
    pub admin: AdminConfig,
    /// Which resources and verbs apps may use, per service; no rules allow everything.
    pub access: AccessConfig,
    /// Elections this daemon campaigns in from boot to shutdown, for apps that only observe.
    pub elections: Vec<ElectionConfig>,
    /// How upstream watches are shared: how long they linger, subscriber queue and history sizes.
    pub watch: WatchConfig,
    /// How long CONSISTENT subscribers and read-your-writes reads wait for the pod's own writes.
    pub consistency: ConsistencyConfig,
    /// Whether a guarded write the apiserver cannot check may go out, and how often the cluster is asked.
    pub fencing: FencingConfig,
    /// Where durable state (the outbox and inbox) lives.
    pub store: StoreConfig,
    /// The daemon-to-daemon transport of ACK-tracked sends.
    pub peer: PeerConfig,
    /// Election groups (the members of an election, for sends and replica barriers).
    pub membership: MembershipConfig,
    /// Bounds and resend backoff of the ACK-tracked sends from this pod.
    pub outbox: OutboxConfig,
    /// How many messages from peers may wait for this pod's app.
    pub inbox: InboxConfig,
    /// How long in-flight calls get to finish after SIGTERM.
    pub shutdown: ShutdownConfig,
    /// How often the apiserver and the store are probed when nothing else showed they work, and how
    /// long a probe may take before it counts as failed.
    pub health: HealthConfig,
    /// Log format and filter; `--log-format` and `--log-level` override them.
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
    /// User ids that may call, read from each connection's peer credentials (SO_PEERCRED); anyone
    /// else is refused with PERMISSION_DENIED before any handler runs. Empty: whoever can open the
    /// socket (its mode and group decide).
    pub allowed_uids: Vec<u32>,
    /// Group ids that may call (the caller's primary group); with `allowedUids` set too, a caller
    /// passes if either list names it. Empty: no check by group.
    pub allowed_gids: Vec<u32>,
}

impl Default for SocketConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from(DEFAULT_SOCKET),
            mode: FileMode(0o660),
            group_id: None,
            allowed_uids: Vec::new(),
            allowed_gids: Vec::new(),
        }
    }
}

/// Unix permission bits, parsed from an octal string.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FileMode(pub u32);

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

/// A YAML value as an error message names it.
pub(super) fn describe(value: &Value) -> String {
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

/// Where the admin HTTP endpoint listens, and who may connect to it: its own mode and group, not the
/// app socket's, since it serves the daemon's state rather than the app API.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AdminConfig {
    /// Socket path for /healthz, /readyz, /metrics and /debug/state.
    pub socket: PathBuf,
    /// Permission bits of the admin socket, in octal. "0600" by default: kubelet's exec probes and
    /// `consistd status` run in the sidecar's own container, as its user; apps need no access.
    pub mode: FileMode,
    /// Numeric group that owns the admin socket, for a group that may read it. Unset keeps the
    /// daemon's group.
    pub group_id: Option<u32>,
    /// TCP address that also serves /metrics, /healthz and /readyz (not /debug/state), for Prometheus
    /// and kubelet's httpGet probes, e.g. `0.0.0.0:9090`. Unset (the default): the socket only.
    pub listen: Option<SocketAddr>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self { socket: PathBuf::from(DEFAULT_ADMIN_SOCKET), mode: FileMode(0o600), group_id: None, listen: None }
    }
}

/// What apps may do through the socket. With no rules every call is allowed; with rules, a call is
/// allowed only if some rule grants it, and refused with PERMISSION_DENIED naming what was asked.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AccessConfig {
    /// The grants; a call needs one that matches it in every field the rule sets.
    pub rules: Vec<AccessRule>,
}

/// One grant: a service, and optionally the verbs, resources, namespaces and callers it is limited to.
/// A field left empty matches anything.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AccessRule {
    /// The service the rule grants.
    pub service: Service,
    /// The verbs granted (see [`Service::verbs`]); empty grants all of the service's verbs.
    #[serde(default)]
    pub verbs: Vec<String>,
    /// What the verbs may be used on: Kubernetes resources as "plural" or "plural.group"
    /// ("configmaps", "deployments.apps") for watch and objects; election names for leadership;
    /// channel names for rollout; "election/NAME", "service/NAME" or "peer/HOST:PORT" destinations
    /// for outbox. Empty grants all.
    #[serde(default)]
    pub resources: Vec<String>,
    /// The namespaces granted; empty grants all, including calls across all namespaces.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// The callers' user ids the rule is for (peer credentials); empty: every caller.
    #[serde(default)]
    pub uids: Vec<u32>,
}

/// A consistd service, as access rules name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Service {
    /// WatchService.
    Watch,
    /// ObjectsService.
    Objects,
    /// LeadershipService.
    Leadership,
    /// OutboxService.
    Outbox,
    /// InboxService.
    Inbox,
    /// RolloutService.
    Rollout,
}

impl Service {
    /// The verbs a rule may grant on this service, and the calls each covers.
    pub fn verbs(self) -> &'static [&'static str] {
        match self {
            // Subscribe.
            Self::Watch => &["watch"],
            Self::Objects => &["get", "list", "create", "update", "patch", "delete"],
            // Campaign; Observe and GetLeadership.
            Self::Leadership => &["campaign", "observe"],
            // Send and SendStream; WaitOutcome, WatchAcks and GetOutboxStatus.
            Self::Outbox => &["send", "status"],
            // Receive, Ack and Nack.
            Self::Inbox => &["receive"],
            // Publish; SubscribeVersions; ReportApplied; GetRolloutStatus and WaitApplied.
            Self::Rollout => &["publish", "subscribe", "report", "status"],
        }
    }

    /// The name rules and messages use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Watch => "watch",
            Self::Objects => "objects",
            Self::Leadership => "leadership",
            Self::Outbox => "outbox",
            Self::Inbox => "inbox",
            Self::Rollout => "rollout",
        }
    }
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
    Timing::default().lease_duration
}

fn default_renew_deadline() -> Duration {
    Timing::default().renew_deadline
}

fn default_retry_period() -> Duration {
    Timing::default().retry_period
}

impl ElectionConfig {
    /// The three durations as one [`Timing`], as validation and the election runner take them.
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
    /// from its cursor instead of starting over (5 s).
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Events one subscriber may have queued; a subscriber that falls further behind gets
    /// RESYNC_REQUIRED and a fresh snapshot instead of slowing anyone down (1024).
    pub subscriber_queue: usize,
    /// Events each watch keeps for resuming from a cursor (10 000); an older one gets RESYNC_REQUIRED.
    pub history: usize,
    /// Bytes of watched objects the daemon may hold for its apps, across every watch: caches, lists in
    /// progress, histories and subscriber queues. A watch that would pass it is refused (or ended)
    /// RESOURCE_EXHAUSTED instead of the container being OOM-killed. Unset: half of what the container's
    /// memory limit leaves after the outbox's and inbox's byte bounds ([`super::Config::watch_budget`]).
    pub max_cache_bytes: Option<u64>,
    /// How often each watch's staleness is measured: a consistent read of at most one object of its resource
    /// gives the store's version, which the watch's high-water mark must reach (60 s; 0 turns it off). A
    /// request per watch per interval, answered from the apiserver's watch cache.
    #[serde(with = "humantime_serde")]
    pub staleness_check: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            linger: Duration::from_secs(5),
            subscriber_queue: 1024,
            history: 10_000,
            max_cache_bytes: None,
            staleness_check: Duration::from_secs(60),
        }
    }
}

/// How long the pod's own writes are waited for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ConsistencyConfig {
    /// How long CONSISTENT subscribers hold older states after the answer to a write of this pod before
    /// delivering the latest one marked timed out, and how long read-your-writes reads wait. It runs from
    /// the answer, whatever the write's round trip took (a write in flight holds its object's states until
    /// it is answered). 5 s: a watch event normally follows its write within milliseconds; seconds mean
    /// the watch is lagging.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for ConsistencyConfig {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(5) }
    }
}

/// How guarded writes are fenced: at the apiserver where the cluster checks claims (the `consistd-fence`
/// ValidatingAdmissionPolicies of manifests/fencing), else in this daemon only.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FencingConfig {
    /// What a guarded write the apiserver cannot check gets; `auto`.
    pub mode: FencingMode,
    /// How often the cluster is asked again whether it checks claims, for the grants no watch shows (the
    /// policies themselves are watched: a change to them is seen at once). 30 min. A check that gets no
    /// answer changes nothing.
    #[serde(with = "humantime_serde")]
    pub recheck: Duration,
}

impl Default for FencingConfig {
    fn default() -> Self {
        Self { mode: FencingMode::default(), recheck: Duration::from_secs(30 * 60) }
    }
}

/// What a guarded write the apiserver cannot check gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FencingMode {
    /// It goes out checked by this daemon only, and its answer says so (`FENCE_DAEMON`).
    #[default]
    Auto,
    /// It is refused with FAILED_PRECONDITION naming why: for clusters that run the policy, where such a
    /// write means something is wrong.
    Require,
}

/// The message store: where the outbox's and inbox's messages are kept across restarts.
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

impl PeerConfig {
    /// Whether peers can be reached: with mutual TLS, or plaintext by explicit choice.
    pub fn transport_configured(&self) -> bool {
        self.tls.is_some() || self.insecure
    }
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
    /// was killed is dropped from its groups this long after it was last seen (30 s).
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
    /// message of each resource_id) before `Send` answers RESOURCE_EXHAUSTED (10 000).
    pub max_pending_per_destination: usize,
    /// Messages the whole outbox may hold, across destinations, before `Send` answers
    /// RESOURCE_EXHAUSTED (100 000).
    pub max_pending: usize,
    /// Payload bytes the whole outbox may hold, across destinations, before `Send` answers
    /// RESOURCE_EXHAUSTED (32 MiB): what bounds its memory, which holds every message until it is ACKed.
    pub max_pending_bytes: usize,
    /// Waits between resends of a delivery the peer has not answered, and between reconnects to a peer.
    pub backoff: BackoffConfig,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            max_payload_bytes: 1024 * 1024,
            max_pending_per_destination: 10_000,
            max_pending: 100_000,
            max_pending_bytes: 32 * 1024 * 1024,
            backoff: BackoffConfig::default(),
        }
    }
}

/// Exponential backoff with full jitter: attempt n waits a random time in [0, min(cap, initial *
/// factor^(n-1))]. Also paces reconnecting to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct BackoffConfig {
    /// The first delay's upper bound (100 ms).
    #[serde(with = "humantime_serde")]
    pub initial: Duration,
    /// How much the bound grows per attempt (2).
    pub factor: f64,
    /// Where the bound stops growing (10 s); also how long a message the peer answered STORED waits
    /// before it is sent again.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self { initial: Duration::from_millis(100), factor: 2.0, cap: Duration::from_secs(10) }
    }
}

/// How much the inbox holds for the app before it refuses peers' messages.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct InboxConfig {
    /// Messages waiting for the app's ACK; beyond it peers are told to retry later (100 000).
    pub max_pending: usize,
    /// Payload bytes waiting for the app's ACK (32 MiB): what bounds the inbox's memory; beyond it peers
    /// are told to retry later.
    pub max_pending_bytes: usize,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self { max_pending: 100_000, max_pending_bytes: 32 * 1024 * 1024 }
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

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace_period: Duration::from_secs(5) }
    }
}

/// Readiness probes: the daemon's jobs are their own evidence (a watch event or bookmark, a Lease
/// renewal, any answer from the apiserver; a commit to the store), so a probe runs only when nothing
/// else showed within `probeInterval` that the apiserver answers or the store commits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthConfig {
    /// How long the apiserver or the store may stay quiet before a probe asks them (10 s, the
    /// interval of the probe this replaces); after a failed probe the next comes within 1 s.
    #[serde(with = "humantime_serde")]
    pub probe_interval: Duration,
    /// How long a probe waits for its answer before it counts as failed (10 s). Readiness turns false
    /// only when a probe got no answer in this time and nothing else was heard meanwhile, so it must
    /// exceed the slowest round trip of a link that still works.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self { probe_interval: Duration::from_secs(10), probe_timeout: Duration::from_secs(10) }
    }
}

/// How the daemon logs to stderr; `--log-format` and `--log-level` override these.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LogConfig {
    /// `text` for people, `json` for log pipelines.
    pub format: LogFormat,
    /// A tracing filter directive, e.g. `info` or `consistd=debug,kube=info`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text, level: "info".to_owned() }
    }
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
