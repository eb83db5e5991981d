//! The daemon's view of its own health and the rule readiness follows: ready while the gRPC socket is
//! served, the apiserver was heard from recently (by any job or, when all were quiet, the probe), every
//! campaigning election's Lease steps succeed within its lease duration, and the store commits.
//! /readyz, /debug/state and `consistd status` all read this one report; [`probe`] asks the apiserver
//! when nothing else heard from it recently.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use consistd_cluster::{
    client::{ApiContact, Via},
    fencing::{Fencing, Where},
    leadership::{Key, Leadership, Progress},
    reconcile::Reconciler,
    watch::Hub,
};
use consistd_core::{
    config::{FencingMode, HealthConfig},
    report::{
        Apiserver, ConfigReport, ElectionReport, FencingReport, PeerReport, Report, StoreReport, WatchBudgetReport,
        WatchBytesReport,
    },
};
use consistd_messages::{inbox::Inbox, outbox::Outbox, store::Store};
use consistd_observe::metrics::Metrics;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Shared, cheaply cloned handle on the daemon's health.
#[derive(Debug, Clone)]
pub struct Health {
    started: Instant,
    socket: PathBuf,
    config: HealthConfig,
    contact: ApiContact,
    inner: Arc<Mutex<HealthState>>,
}

#[derive(Debug, Default)]
struct HealthState {
    serving: bool,
    url: String,
    /// The apiserver's gitVersion from the last probe that got it.
    version: Option<String>,
    /// When the last probe finished (RFC 3339).
    last_checked: Option<String>,
    /// The latest probe that failed: when it was sent, and why.
    failed_probe: Option<(Instant, String)>,
    parts: Option<(Arc<Hub>, Arc<Leadership>)>,
    messages: Option<(Outbox, Inbox)>,
    reconciler: Option<Arc<Reconciler>>,
    store: Option<Store>,
    config: Option<ConfigReport>,
    fencing: Option<Arc<Fencing>>,
}

impl Health {
    /// A daemon that serves `socket` and talks to the apiserver at `apiserver_url`; `contact` is where its
    /// Kubernetes client notes the apiserver's answers, judged by the probe settings in `config`.
    pub fn new(socket: PathBuf, apiserver_url: String, contact: ApiContact, config: HealthConfig) -> Self {
        Self {
            started: Instant::now(),
            socket,
            config,
            contact,
            inner: Arc::new(Mutex::new(HealthState { url: apiserver_url, ..HealthState::default() })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        // The data is plain values; a panic elsewhere cannot leave it half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The parts whose state the report includes.
    pub fn attach(&self, hub: Arc<Hub>, leadership: Arc<Leadership>) {
        self.lock().parts = Some((hub, leadership));
    }

    /// The outbox and inbox whose state the report includes.
    pub fn attach_messages(&self, outbox: Outbox, inbox: Inbox) {
        self.lock().messages = Some((outbox, inbox));
    }

    /// The reconcile queues whose state the report includes.
    pub fn attach_reconciler(&self, reconciler: Arc<Reconciler>) {
        self.lock().reconciler = Some(reconciler);
    }

    /// The message store whose writability readiness needs.
    pub fn attach_store(&self, store: Store) {
        self.lock().store = Some(store);
    }

    /// Where guarded writes are fenced, for the report.
    pub fn attach_fencing(&self, fencing: Arc<Fencing>) {
        self.lock().fencing = Some(fencing);
    }

    /// Records the config's newest reload.
    pub fn set_config(&self, report: ConfigReport) {
        self.lock().config = Some(report);
    }

    /// Records whether the gRPC server accepts calls.
    pub fn set_serving(&self, serving: bool) {
        self.lock().serving = serving;
    }

    /// Where the apiserver's answers are noted.
    pub(crate) fn contact(&self) -> &ApiContact {
        &self.contact
    }

    /// The probe settings.
    pub(crate) fn config(&self) -> &HealthConfig {
        &self.config
    }

    /// Records a probe's answer: the apiserver's version.
    pub(crate) fn probe_answered(&self, version: String) {
        self.contact.heard(Via::Probe);
        let mut inner = self.lock();
        inner.version = Some(version);
        inner.last_checked = Some(now_rfc3339());
    }

    /// Records a probe sent at `sent` that failed: refused, or no answer within the probe timeout.
    pub(crate) fn probe_failed(&self, sent: Instant, why: String) {
        let mut inner = self.lock();
        inner.failed_probe = Some((sent, why));
        inner.last_checked = Some(now_rfc3339());
    }

    /// Whether the apiserver counts as reachable now, and if not, why.
    pub(crate) fn apiserver_verdict(&self) -> Result<(), String> {
        let failed = self.lock().failed_probe.clone();
        judge_apiserver(Instant::now(), self.contact.last(), failed.as_ref(), &self.config)
    }

    /// Builds the report from the parts' state now, with readiness and the reasons against it.
    pub(crate) fn report(&self) -> Report {
        let now = Instant::now();
        let inner = self.lock();
        let mut reasons = Vec::new();
        if !inner.serving {
            reasons.push(NotReady::NotServing);
        }
        let heard = self.contact.last();
        let verdict = judge_apiserver(now, heard, inner.failed_probe.as_ref(), &self.config);
        if let Err(why) = &verdict {
            reasons.push(NotReady::Apiserver(why.clone()));
        }
        let watch_budget = inner.parts.as_ref().map(|(hub, _)| WatchBudgetReport {
            limit_bytes: hub.budget().limit(),
            used_bytes: hub.budget().used(),
            exhausted: hub.exhausted(),
            watches: hub
                .watch_bytes()
                .into_iter()
                .map(|(w, bytes)| {
                    let mut watch = w.resource;
                    for (name, value) in [
                        ("namespace", w.namespace),
                        ("labels", w.label_selector),
                        ("fields", w.field_selector),
                        ("view", w.view),
                    ] {
                        if !value.is_empty() && value != "full" {
                            watch += &format!(" {name}={value}");
                        }
                    }
                    WatchBytesReport { watch, bytes }
                })
                .collect(),
        });
        let (upstream_watches, elections) = match &inner.parts {
            Some((hub, leadership)) => {
                let elections = leadership.snapshot();
                for (key, _, progress) in &elections {
                    if let Err(why) = judge_election(now, key, progress) {
                        reasons.push(why);
                    }
                }
                (
                    hub.upstream_watches(),
                    elections.into_iter().map(|(k, s, p)| election_report(now, &k, s, p)).collect(),
                )
            }
            None => (0, Vec::new()),
        };
        let store = inner.store.as_ref().map(|store| {
            let writable = store.writable();
            if let Err(why) = &writable {
                reasons.push(NotReady::Store(why.clone()));
            }
            StoreReport { writable: writable.is_ok(), error: writable.err() }
        });
        let (outbox_pending, peers, inbox_pending) = match &inner.messages {
            Some((outbox, inbox)) => {
                let (destinations, held) = outbox.status();
                let peers = destinations
                    .into_iter()
                    .map(|d| PeerReport {
                        destination: d.destination.to_string(),
                        peer: d.peer,
                        connected: d.connected,
                        pending: d.pending.len(),
                    })
                    .collect();
                (held, peers, inbox.pending())
            }
            None => (0, Vec::new(), 0),
        };
        let apiserver = Apiserver {
            url: inner.url.clone(),
            reachable: verdict.is_ok(),
            version: inner.version.clone(),
            last_error: verdict.err(),
            last_checked: inner.last_checked.clone(),
            heard_seconds_ago: heard.map(|(at, _)| seconds(now.saturating_duration_since(at))),
            heard_via: heard.map(|(_, via)| via.name().to_owned()),
        };
        let queues = inner.reconciler.as_ref().map(|r| r.snapshot()).unwrap_or_default();
        let fencing = inner.fencing.as_ref().map(|f| {
            let place = f.place();
            let mode = match f.mode() {
                FencingMode::Auto => "auto",
                FencingMode::Require => "require",
            };
            FencingReport {
                at_apiserver: matches!(place, Where::Apiserver { .. }),
                detail: place.describe(),
                mode: mode.to_owned(),
            }
        });
        Report {
            fencing,
            queues,
            outbox_pending,
            peers,
            inbox_pending,
            store,
            config: inner.config.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            upstream_watches,
            watch_budget,
            elections,
            uptime_seconds: now.saturating_duration_since(self.started).as_secs(),
            socket: self.socket.clone(),
            serving: inner.serving,
            apiserver,
            ready: reasons.is_empty(),
            not_ready_reasons: reasons.iter().map(ToString::to_string).collect(),
        }
    }
}

/// The apiserver counts as reachable while something heard from it and no probe sent since then failed.
/// The probe runs only after `probe_interval` of quiet and fails after `probe_timeout`, so a slow link
/// whose watches still deliver stays reachable whatever its delay; `2 * interval + timeout` of silence
/// with no failed probe (the probe loop stuck) counts as unreachable too.
/// After a failed probe the next one comes this soon (or after the probe interval, if shorter), so
/// readiness recovers fast.
const PROBE_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Probes the apiserver's /version whenever nothing heard from it for `health.probeInterval` (and from
/// the start until one answers, for its version, however much else is heard), each probe bounded by
/// `health.probeTimeout`, until `shutdown`. Keeps the `apiserver_up` metric and logs when reachability
/// changes.
pub async fn probe(client: kube::Client, health: Health, metrics: Metrics, shutdown: CancellationToken) {
    let (interval, timeout) = (health.config().probe_interval, health.config().probe_timeout);
    let mut reachable = false;
    // Whether a probe answered yet (until then the version is unknown).
    let mut answered = false;
    let mut due = Instant::now();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep_until(due) => {}
        }
        let quiet_until = health.contact().last().map(|(at, _)| at + interval);
        match quiet_until {
            // Something else heard from the apiserver recently: no probe needed yet.
            Some(until) if !probe_now(answered, quiet_until, Instant::now()) => due = until,
            _ => {
                let sent = Instant::now();
                match tokio::time::timeout(timeout, client.apiserver_version()).await {
                    Ok(Ok(info)) => {
                        answered = true;
                        health.probe_answered(info.git_version);
                    }
                    Ok(Err(error)) => health.probe_failed(sent, consistd_core::error::chain(&error)),
                    Err(_) => health.probe_failed(sent, format!("no answer within {timeout:?} (health.probeTimeout)")),
                }
                due = Instant::now() + interval.min(PROBE_RETRY_INTERVAL);
            }
        }
        let verdict = health.apiserver_verdict();
        match (&verdict, reachable) {
            (Ok(()), false) => tracing::info!("apiserver reachable"),
            (Err(error), true) => tracing::warn!(%error, "apiserver unreachable"),
            _ => {}
        }
        reachable = verdict.is_ok();
        metrics.apiserver_up.set(i64::from(reachable));
    }
}

/// Whether the probe loop sends a probe now: until one has answered (for the apiserver's version, which
/// only a probe learns, however much else is heard), then whenever nothing was heard from the apiserver for
/// the probe interval (`quiet_until` passed).
fn probe_now(answered: bool, quiet_until: Option<Instant>, now: Instant) -> bool {
    !answered || quiet_until.is_none_or(|until| until <= now)
}

fn judge_apiserver(
    now: Instant,
    heard: Option<(Instant, Via)>,
    failed_probe: Option<&(Instant, String)>,
    config: &HealthConfig,
) -> Result<(), String> {
    let Some((at, via)) = heard else {
        return Err(match failed_probe {
            Some((_, why)) => format!("never heard from it; probe: {why}"),
            None => "not heard from yet".to_owned(),
        });
    };
    let quiet = now.saturating_duration_since(at);
    let last = format!("last heard {} ago ({})", human(quiet), via.name());
    if let Some((sent, why)) = failed_probe
        && *sent > at
    {
        return Err(format!("probe: {why}; nothing else heard from it since ({last})"));
    }
    let limit = config.probe_interval * 2 + config.probe_timeout;
    if quiet > limit {
        return Err(format!("silent for longer than {} ({last})", human(limit)));
    }
    Ok(())
}

/// A campaigning election does its job while reading (and taking or renewing) its Lease succeeds: one
/// that has not succeeded for longer than its lease duration can neither keep nor take leadership.
/// Why the daemon is not ready; each displays the line `/readyz`, `/debug/state` and `consistd status` show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NotReady {
    /// The gRPC server does not accept calls (yet, or any more).
    #[error("the gRPC socket is not served")]
    NotServing,
    /// The apiserver was not heard from recently, and the probe failed; why.
    #[error("the apiserver is not reachable: {0}")]
    Apiserver(String),
    /// A campaigning election's Lease steps have failed for longer than its lease duration.
    #[error(
        "election {election}: no Lease read or renewal succeeded {when}, longer than its lease duration \
         {lease_duration}{why}"
    )]
    Election { election: String, when: String, lease_duration: String, why: String },
    /// The store's newest commit failed; why.
    #[error("the message store is not writable: {0}")]
    Store(String),
}

fn judge_election(now: Instant, key: &Key, progress: &Progress) -> Result<(), NotReady> {
    let quiet = now.saturating_duration_since(progress.since);
    if !progress.campaigning || quiet <= progress.lease_duration {
        return Ok(());
    }
    let when = if progress.succeeded {
        format!("in the last {}", human(quiet))
    } else {
        format!("since its runner started {} ago", human(quiet))
    };
    let why = progress.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
    Err(NotReady::Election { election: key.to_string(), when, lease_duration: human(progress.lease_duration), why })
}

fn election_report(
    now: Instant,
    key: &Key,
    s: consistd_cluster::leadership::Observation,
    p: Progress,
) -> ElectionReport {
    ElectionReport {
        election: key.to_string(),
        role: format!("{:?}", s.role).to_uppercase(),
        holder: s.holder,
        term: s.term,
        campaigning: p.campaigning,
        last_success_seconds_ago: p.succeeded.then(|| seconds(now.saturating_duration_since(p.since))),
        error: p.error,
    }
}

/// Seconds with a tenth, as the report carries them.
fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// A duration as reasons print it: "3.2s".
fn human(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(interval: u64, timeout: u64) -> HealthConfig {
        HealthConfig { probe_interval: Duration::from_secs(interval), probe_timeout: Duration::from_secs(timeout) }
    }

    fn health() -> Health {
        Health::new("/s.sock".into(), "https://127.0.0.1:6443".into(), ApiContact::default(), config(10, 1))
    }

    #[test]
    fn probes_go_on_until_one_answers_then_only_when_the_apiserver_is_quiet() {
        let now = Instant::now();
        let heard_recently = Some(now + Duration::from_secs(5));
        assert!(probe_now(false, heard_recently, now), "a failed first probe is tried again, whatever else is heard");
        assert!(probe_now(false, None, now));
        assert!(!probe_now(true, heard_recently, now), "answered once: other contact spares the probe");
        assert!(probe_now(true, Some(now), now));
        assert!(probe_now(true, None, now));
    }

    #[tokio::test(start_paused = true)]
    async fn ready_only_when_serving_and_the_apiserver_answered() {
        let health = health();
        let report = health.report();
        assert!(!report.ready);
        assert_eq!(report.not_ready_reasons.len(), 2, "{report:?}");

        health.set_serving(true);
        health.probe_answered("v1.35.4".into());
        let report = health.report();
        assert!(report.ready, "{report:?}");
        assert_eq!(report.apiserver.version.as_deref(), Some("v1.35.4"));
        assert_eq!(report.apiserver.heard_via.as_deref(), Some("probe"));

        tokio::time::advance(Duration::from_secs(11)).await;
        health.probe_failed(Instant::now(), "connection refused".into());
        let report = health.report();
        assert!(!report.ready);
        assert!(
            report.not_ready_reasons[0].contains("apiserver")
                && report.not_ready_reasons[0].contains("connection refused")
        );
        assert_eq!(
            report.apiserver.last_error.as_deref(),
            Some(report.not_ready_reasons[0].trim_start_matches("the apiserver is not reachable: "))
        );
        assert_eq!(report.apiserver.version.as_deref(), Some("v1.35.4"), "last known version kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_link_whose_watches_deliver_stays_reachable_though_its_probes_time_out() {
        let health = health();
        health.set_serving(true);
        // A probe sent now gets no answer within its 1 s timeout (the link delays 3 s)...
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(500)).await;
        // ...but a watch event arrives meanwhile: the apiserver works.
        health.contact().heard(Via::WatchStream);
        tokio::time::advance(Duration::from_millis(500)).await;
        health.probe_failed(sent, "no answer within 1s".into());
        assert_eq!(health.apiserver_verdict(), Ok(()));
        // Events keep arriving, seconds apart, for much longer than the probe timeout.
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(3)).await;
            health.contact().heard(Via::WatchStream);
            let report = health.report();
            assert!(report.ready, "{report:?}");
            assert_eq!(report.apiserver.heard_via.as_deref(), Some("watch stream"));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_unanswered_since_the_last_answer_makes_the_apiserver_unreachable_until_anything_answers() {
        let health = health();
        health.contact().heard(Via::Response);
        tokio::time::advance(Duration::from_secs(10)).await;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        health.probe_failed(sent, "no answer within 1s (health.probeTimeout)".into());
        let why = health.apiserver_verdict().expect_err("unreachable");
        assert!(why.contains("health.probeTimeout") && why.contains("11.0s ago (response)"), "{why}");
        // A Lease renewal, a read, a watch frame: any answer counts again.
        health.contact().heard(Via::Response);
        assert_eq!(health.apiserver_verdict(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn silence_longer_than_the_probe_could_take_is_unreachable_even_without_a_failed_probe() {
        let health = health();
        assert_eq!(health.apiserver_verdict(), Err("not heard from yet".to_owned()));
        health.contact().heard(Via::WatchStream);
        // 2 * 10 s interval + 1 s timeout.
        tokio::time::advance(Duration::from_secs(21)).await;
        assert_eq!(health.apiserver_verdict(), Ok(()));
        tokio::time::advance(Duration::from_millis(100)).await;
        let why = health.apiserver_verdict().expect_err("silent too long");
        assert!(why.starts_with("silent for longer than 21.0s"), "{why}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_campaigning_election_fails_readiness_only_once_its_lease_steps_failed_for_a_lease_duration() {
        let key = Key { namespace: "ns".into(), name: "e".into() };
        let mut progress = Progress {
            campaigning: true,
            since: Instant::now(),
            succeeded: true,
            lease_duration: Duration::from_secs(15),
            error: Some("connection refused".into()),
        };
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(judge_election(Instant::now(), &key, &progress), Ok(()));
        tokio::time::advance(Duration::from_millis(100)).await;
        let why = judge_election(Instant::now(), &key, &progress).expect_err("past its lease").to_string();
        assert!(
            why.starts_with("election ns/e: ") && why.contains("lease duration 15.0s: connection refused"),
            "{why}"
        );
        // Only observing: the apiserver's reachability speaks for it.
        progress.campaigning = false;
        assert_eq!(judge_election(Instant::now(), &key, &progress), Ok(()));
    }
}
