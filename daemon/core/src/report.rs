//! What a daemon reports about itself: the admin socket's `/debug/state`, `/queues` and `/outbox` answer
//! these as JSON, `consistd status` prints [`render`] of them, and `kubectl consistd` reads them through the
//! apiserver's pod proxy.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What `/debug/state` answers and `consistd status` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// consistd's version.
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_seconds: u64,
    /// The gRPC socket path.
    pub socket: PathBuf,
    /// Whether the gRPC server accepts calls.
    pub serving: bool,
    /// The apiserver as last probed.
    pub apiserver: Apiserver,
    /// Upstream apiserver watches running, one per distinct query however many subscribers share it.
    #[serde(default)]
    pub upstream_watches: usize,
    /// The watches' memory budget and what each watch holds; absent from daemons that do not report it.
    #[serde(default)]
    pub watch_budget: Option<WatchBudgetReport>,
    /// Every election this daemon runs, campaigning or only observing, sorted by Lease.
    #[serde(default)]
    pub elections: Vec<ElectionReport>,
    /// Every reconcile queue running, sorted by name.
    #[serde(default)]
    pub queues: Vec<QueueReport>,
    /// Messages the outbox holds, one per (destination, resource_id), including a group's newest kept
    /// for members that join later.
    #[serde(default)]
    pub outbox_pending: usize,
    /// Per destination and peer: the connection and what that peer has not ACKed.
    #[serde(default)]
    pub peers: Vec<PeerReport>,
    /// Messages waiting for the app's ACK.
    #[serde(default)]
    pub inbox_pending: usize,
    /// The message store; absent from daemons that do not report it.
    #[serde(default)]
    pub store: Option<StoreReport>,
    /// The config file and its newest reload; absent from daemons that do not report it.
    #[serde(default)]
    pub config: Option<ConfigReport>,
    /// Where guarded writes are fenced; absent from daemons that do not report it.
    #[serde(default)]
    pub fencing: Option<FencingReport>,
    /// Ready for traffic: serving, the apiserver heard from recently, every campaigning election's
    /// Lease steps succeeding within its lease duration, the store writable.
    pub ready: bool,
    /// Why not ready; empty when ready.
    pub not_ready_reasons: Vec<String>,
}

/// The bytes of watched objects the daemon may hold for its apps (`watch.maxCacheBytes`), and who holds them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchBudgetReport {
    /// The limit.
    pub limit_bytes: u64,
    /// Held now, across caches, lists in progress, histories and subscriber queues.
    pub used_bytes: u64,
    /// Watches ended or refused RESOURCE_EXHAUSTED since the daemon started.
    pub exhausted: u64,
    /// Each watch running and the bytes its cache holds, largest first.
    pub watches: Vec<WatchBytesReport>,
}

/// One upstream watch's cached bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchBytesReport {
    /// What it watches: resource, namespace, selectors and view (unless the whole object), as one line.
    pub watch: String,
    /// The bytes its cached objects are charged.
    pub bytes: u64,
}

/// Where guarded writes are fenced: by the apiserver (the policy installed, this daemon allowed to claim a
/// term), or in this daemon only, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FencingReport {
    /// Whether the apiserver refuses a guarded write whose term is stale.
    pub at_apiserver: bool,
    /// One line: where, or why only here.
    pub detail: String,
    /// `fencing.mode`: "auto", or "require" (a guarded write the apiserver cannot check is refused).
    #[serde(default)]
    pub mode: String,
}

/// One election as this daemon sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElectionReport {
    /// "namespace/name" of the Lease.
    pub election: String,
    /// LEADER, FOLLOWER or UNKNOWN.
    pub role: String,
    /// The Lease holder's identity; empty when nobody holds it or its Lease expired.
    pub holder: String,
    /// The fencing term: the Lease's leaseTransitions + 1, growing on every change of holder.
    pub term: u64,
    /// Whether this daemon campaigns in it (else it only observes).
    #[serde(default)]
    pub campaigning: bool,
    /// Seconds since reading (and, when campaigning, taking or renewing) the Lease last succeeded; none
    /// while no attempt has succeeded yet.
    #[serde(default)]
    pub last_success_seconds_ago: Option<f64>,
    /// Why the last attempt failed, while attempts fail.
    #[serde(default)]
    pub error: Option<String>,
}

/// What `/queues` answers (also over `admin.listen`, which `kubectl consistd queues POD` reads through the
/// apiserver's pod proxy): the reconcile queues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuesReport {
    /// Every reconcile queue running, sorted by name.
    pub queues: Vec<QueueReport>,
}

impl From<Report> for QueuesReport {
    fn from(r: Report) -> Self {
        Self { queues: r.queues }
    }
}

/// The message store as readiness sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreReport {
    /// Whether its newest commit succeeded.
    pub writable: bool,
    /// Why its newest commit failed, when it did.
    pub error: Option<String>,
}

/// The config as the daemon last read it. A refused reload does not make the daemon unready: it runs on
/// with the config it had.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigReport {
    /// The config file (`--config`); none when the daemon runs on defaults and overrides.
    pub file: Option<PathBuf>,
    /// Whether the newest contents read were applied.
    pub last_reload_successful: bool,
    /// When a config was last applied, at start or by a reload (RFC 3339).
    pub last_applied: Option<String>,
    /// Why the newest contents were refused, naming the field; none when they were applied.
    pub error: Option<String>,
    /// Fields changed in the file that are read only at start: they keep their running values until a restart.
    #[serde(default)]
    pub restart_needed: Vec<String>,
}

/// What `/outbox` answers (also over `admin.listen`, which `kubectl consistd outbox POD` reads through the
/// apiserver's pod proxy): the part of the report about ACK-tracked sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxReport {
    /// Messages the outbox holds (as [`Report::outbox_pending`] counts them).
    pub pending: usize,
    /// Per destination and peer: the connection and what that peer has not ACKed.
    pub peers: Vec<PeerReport>,
}

impl From<Report> for OutboxReport {
    fn from(r: Report) -> Self {
        Self { pending: r.outbox_pending, peers: r.peers }
    }
}

/// One destination's peer as this daemon's outbox sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    /// The destination ("peer 10.0.0.1:7070", "service ns/web", "election ns/group").
    pub destination: String,
    /// The peer address; empty while a group has no member.
    pub peer: String,
    /// Whether a connection is up.
    pub connected: bool,
    /// Messages the peer has not ACKed.
    pub pending: usize,
}

/// The apiserver as the daemon last heard from it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Apiserver {
    /// The apiserver URL the daemon's client uses (in-cluster, or from KUBECONFIG).
    pub url: String,
    /// Whether it counts as reachable: heard from recently, and no probe sent since went unanswered.
    pub reachable: bool,
    /// Its gitVersion, from /version.
    pub version: Option<String>,
    /// Why it does not count as reachable; none while it does.
    pub last_error: Option<String>,
    /// When it was last probed (RFC 3339); probes run only when nothing else heard from it.
    pub last_checked: Option<String>,
    /// Seconds since anything in the daemon last heard from it.
    #[serde(default)]
    pub heard_seconds_ago: Option<f64>,
    /// What heard from it last: "watch stream", "response" or "probe".
    #[serde(default)]
    pub heard_via: Option<String>,
}

/// A queue's state as `consistd status`, `/queues` and `kubectl consistd queues` show it (part of the admin report).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueReport {
    /// The queue's name.
    pub name: String,
    /// Streams (apps) attached.
    pub streams: usize,
    /// Keys ready, including those held back for consistency (client-go's depth).
    pub depth: usize,
    /// Keys held back until the watch shows the pod's writes.
    pub held: usize,
    /// Keys waiting for a requeue's or a retry's time.
    pub waiting: usize,
    /// Keys leased to the app.
    pub leased: usize,
    /// Keys the queue knows.
    pub keys: usize,
    /// Whether it hands out work (false while its election is led by another pod).
    pub active: bool,
    /// The newest error an app completed a lease with ("namespace/name: error").
    #[serde(default)]
    pub last_error: Option<String>,
    /// A sharded queue's ring: who owns what.
    #[serde(default)]
    pub ring: Option<RingState>,
}

/// A sharded queue's ring as one member sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingState {
    /// The ring Lease, "namespace/name".
    pub ring: String,
    /// Slots in the ring.
    pub slots: usize,
    /// Slots this member owns.
    pub owned: usize,
    /// Live members by identity, with the slots each owns.
    pub members: std::collections::BTreeMap<String, usize>,
    /// Slots nobody owns.
    pub unowned: usize,
    /// Slots moving from one owner to the next.
    pub moving: usize,
    /// The highest epoch of any slot: the ring's epoch.
    pub epoch: u64,
    /// Whether this member coordinates the ring (the live member with the first identity).
    pub coordinator: bool,
    /// Slots this member handed on to their next owners since it joined.
    pub handoffs: u64,
}

/// Bytes in MiB for people; "unlimited" for a budget no limit bounds.
fn mib(bytes: u64) -> String {
    if bytes == u64::MAX { "unlimited".to_owned() } else { format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0)) }
}

/// A report as lines for people.
pub fn render(r: &Report) -> String {
    let mut out = format!("consistd {}: {}\n", r.version, if r.ready { "ready" } else { "NOT READY" });
    out += &format!("  socket      {} ({})\n", r.socket.display(), if r.serving { "serving" } else { "not serving" });
    let a = &r.apiserver;
    let version = a.version.as_deref().unwrap_or("version unknown");
    let heard = match (a.heard_seconds_ago, a.heard_via.as_deref()) {
        (Some(ago), Some(via)) => format!(", heard {ago:.1}s ago via {via}"),
        _ => String::new(),
    };
    let reach = if a.reachable {
        format!("reachable{heard}")
    } else {
        format!("UNREACHABLE: {}", a.last_error.as_deref().unwrap_or("not probed yet"))
    };
    out += &format!("  apiserver   {} {version} ({reach})\n", a.url);
    match &r.watch_budget {
        Some(b) => {
            let exhausted = match b.exhausted {
                0 => String::new(),
                n => format!(", {n} ended or refused past it"),
            };
            out += &format!(
                "  watches     {} upstream, {} of {} held (watch.maxCacheBytes){exhausted}\n",
                r.upstream_watches,
                mib(b.used_bytes),
                mib(b.limit_bytes)
            );
            if let Some(largest) = b.watches.first().filter(|w| w.bytes > 0) {
                out += &format!("  watches     largest {} ({})\n", largest.watch, mib(largest.bytes));
            }
        }
        None => out += &format!("  watches     {} upstream\n", r.upstream_watches),
    }
    for e in &r.elections {
        let part = if e.campaigning { "campaigning" } else { "observing" };
        let steps = match (&e.error, e.last_success_seconds_ago) {
            (Some(error), _) => format!(", Lease steps FAILING: {error}"),
            (None, Some(ago)) => format!(", Lease read {ago:.1}s ago"),
            (None, None) => String::new(),
        };
        out += &format!(
            "  election    {} {} (holder {:?}, term {}, {part}{steps})\n",
            e.election, e.role, e.holder, e.term
        );
    }
    for q in &r.queues {
        let active = if q.active { "" } else { ", paused: this pod does not lead its election" };
        let error = q.last_error.as_deref().map_or(String::new(), |e| format!(", last error {e}"));
        out += &format!(
            "  queue       {} {} ready ({} held for consistency), {} waiting, {} leased, {} keys, {} streams{active}{error}\n",
            q.name, q.depth, q.held, q.waiting, q.leased, q.keys, q.streams
        );
        if let Some(ring) = &q.ring {
            let members: Vec<String> = ring.members.iter().map(|(m, n)| format!("{m}={n}")).collect();
            let coordinator = if ring.coordinator { ", coordinator" } else { "" };
            out += &format!(
                "              ring {}: owns {} of {} slots, epoch {}, members {}, {} unowned, {} moving{coordinator}\n",
                ring.ring,
                ring.owned,
                ring.slots,
                ring.epoch,
                members.join(" "),
                ring.unowned,
                ring.moving
            );
        }
    }
    if let Some(store) = &r.store {
        let state = match &store.error {
            None => "writable".to_owned(),
            Some(error) => format!("NOT WRITABLE: {error}"),
        };
        out += &format!("  store       {state}\n");
    }
    if let Some(config) = &r.config {
        let file = config.file.as_ref().map_or("defaults and overrides".to_owned(), |f| f.display().to_string());
        let state = match (&config.error, &config.last_applied) {
            (Some(error), _) => format!("RELOAD REFUSED, running the config before it: {error}"),
            (None, Some(at)) => format!("applied {at}"),
            (None, None) => "applied".to_owned(),
        };
        out += &format!("  config      {file} ({state})\n");
        if !config.restart_needed.is_empty() {
            out += &format!("  config      changed, needs a restart: {}\n", config.restart_needed.join(", "));
        }
    }
    if let Some(fencing) = &r.fencing {
        let mode = if fencing.mode.is_empty() { String::new() } else { format!(" (fencing.mode {})", fencing.mode) };
        out += &format!("  fencing     guarded writes are fenced {}{mode}\n", fencing.detail);
    }
    out += &format!("  outbox      {} pending\n", r.outbox_pending);
    for p in &r.peers {
        let link = if p.peer.is_empty() {
            "no member yet".to_owned()
        } else {
            format!("{} {}", p.peer, if p.connected { "connected" } else { "NOT CONNECTED" })
        };
        out += &format!("  peer        {link}, {} not ACKed ({})\n", p.pending, p.destination);
    }
    out += &format!("  inbox       {} waiting for the app\n", r.inbox_pending);
    out += &format!("  uptime      {}s\n", r.uptime_seconds);
    for reason in &r.not_ready_reasons {
        out += &format!("  not ready:  {reason}\n");
    }
    out
}
