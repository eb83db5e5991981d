//! Config reload: the config file's directory is watched (kubelet swaps a ConfigMap volume's `..data`
//! link) and a changed file is applied while the daemon runs. What can change at runtime takes effect at
//! once; fields read only at start are reported as needing a restart and keep their running values; a
//! file that does not load changes nothing, and says why in the log, the metrics and `consistd status`.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use consistd_cluster::leadership::{Campaign, Key, Leadership, LeadershipError};
use consistd_core::mounted::Changes;
use consistd_core::{
    config::{
        AccessRule, Config, ElectionConfig, Environment, FencingConfig, InboxConfig, OutboxConfig, Overrides, Setter,
    },
    error,
    report::ConfigReport,
};
use consistd_observe::{metrics::Metrics, telemetry::LogLevel};
use consistd_server::{api::Allowlist, health::Health};
use tokio_util::sync::CancellationToken;

/// Where the running config came from, so that a change to its file can be applied the same way.
#[derive(Debug)]
pub struct ConfigSource {
    /// The config file (`--config`); None: defaults and overrides only, nothing to reload.
    pub file: Option<PathBuf>,
    /// The flags and variables that override the file, at start and in every reload.
    pub overrides: Overrides,
    /// Where a new `log.level` goes.
    pub log: LogLevel,
}

/// The settings the daemon's parts read live; each part holds a [`consistd_core::config::Live`] of one.
#[derive(Debug)]
pub(crate) struct Tunables {
    /// `outbox`: payload and pending bounds, backoff.
    pub outbox: Setter<OutboxConfig>,
    /// `inbox`: its bounds.
    pub inbox: Setter<InboxConfig>,
    /// `consistency.timeout`.
    pub consistency_timeout: Setter<Duration>,
    /// `fencing`: its mode and recheck period.
    pub fencing: Setter<FencingConfig>,
    /// `membership.ttl`.
    pub membership_ttl: Setter<Duration>,
    /// `access.rules`.
    pub access: Setter<Arc<[AccessRule]>>,
    /// `socket.allowedUids` and `socket.allowedGids`.
    pub allowlist: Setter<Arc<Allowlist>>,
    /// `shutdown.gracePeriod`.
    pub grace_period: Setter<Duration>,
}

impl Tunables {
    /// The settings of `config`.
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            outbox: Setter::new(config.outbox.clone()).0,
            inbox: Setter::new(config.inbox.clone()).0,
            consistency_timeout: Setter::new(config.consistency.timeout).0,
            fencing: Setter::new(config.fencing.clone()).0,
            membership_ttl: Setter::new(config.membership.ttl).0,
            access: Setter::new(config.access.rules.clone().into()).0,
            allowlist: Setter::new(Arc::new(allowlist(config))).0,
            grace_period: Setter::new(config.shutdown.grace_period).0,
        }
    }

    /// Sets every setting from `config`; returns the fields that changed.
    fn apply(&self, config: &Config) -> Vec<&'static str> {
        let changed = [
            ("outbox", self.outbox.set(config.outbox.clone())),
            ("inbox", self.inbox.set(config.inbox.clone())),
            ("consistency.timeout", self.consistency_timeout.set(config.consistency.timeout)),
            ("fencing", self.fencing.set(config.fencing.clone())),
            ("membership.ttl", self.membership_ttl.set(config.membership.ttl)),
            ("access.rules", self.access.set(config.access.rules.clone().into())),
            ("socket.allowedUids/allowedGids", self.allowlist.set(Arc::new(allowlist(config)))),
            ("shutdown.gracePeriod", self.grace_period.set(config.shutdown.grace_period)),
        ];
        changed.into_iter().filter_map(|(field, changed)| changed.then_some(field)).collect()
    }
}

fn allowlist(config: &Config) -> Allowlist {
    Allowlist { uids: config.socket.allowed_uids.clone(), gids: config.socket.allowed_gids.clone() }
}

/// The elections the config campaigns in, from start until shutdown or until a reload removes them.
#[derive(Debug)]
pub(crate) struct Elections {
    leadership: Arc<Leadership>,
    running: HashMap<Key, (ElectionConfig, Campaign)>,
}

impl Elections {
    /// None yet: [`Elections::sync`] starts them.
    pub(crate) fn new(leadership: Arc<Leadership>) -> Self {
        Self { leadership, running: HashMap::new() }
    }

    /// Campaigns in the elections of `wanted` not run yet, stops those no longer wanted (releasing a held
    /// Lease), and takes new timing for the others without letting go of them. True when anything changed.
    pub(crate) fn sync(&mut self, wanted: &[ElectionConfig]) -> Result<bool, LeadershipError> {
        let mut keyed = HashMap::new();
        for e in wanted {
            keyed.insert(self.leadership.key(&e.name, &e.namespace)?, e);
        }
        let before = self.running.len();
        self.running.retain(|key, _| keyed.contains_key(key));
        let mut changed = self.running.len() != before;
        for (key, e) in keyed {
            if self.running.get(&key).is_some_and(|(running, _)| running == e) {
                continue;
            }
            // The new campaign joins before the old one (if any) leaves, so a leader keeps its Lease.
            let (campaign, _) = self.leadership.campaign(&key, "", e.timing())?;
            tracing::info!(election = %e.name, namespace = %key.namespace, "campaigning from config");
            self.running.insert(key, (e.clone(), campaign));
            changed = true;
        }
        Ok(changed)
    }

    /// Stops every campaign, releasing held Leases.
    pub(crate) fn stop(&mut self) {
        self.running.clear();
    }
}

/// Fields read only at start: a reload that changes one keeps its running value and reports it.
fn restart_only(running: &Config, new: &mut Config) -> Vec<&'static str> {
    fn keep<T: PartialEq + Clone>(fields: &mut Vec<&'static str>, field: &'static str, running: &T, new: &mut T) {
        if running != new {
            fields.push(field);
            new.clone_from(running);
        }
    }
    let mut fields = Vec::new();
    keep(&mut fields, "identity", &running.identity, &mut new.identity);
    keep(&mut fields, "namespace", &running.namespace, &mut new.namespace);
    keep(&mut fields, "socket.path", &running.socket.path, &mut new.socket.path);
    keep(&mut fields, "socket.mode", &running.socket.mode, &mut new.socket.mode);
    keep(&mut fields, "socket.groupId", &running.socket.group_id, &mut new.socket.group_id);
    keep(&mut fields, "admin", &running.admin, &mut new.admin);
    keep(&mut fields, "watch", &running.watch, &mut new.watch);
    keep(&mut fields, "store.dir", &running.store, &mut new.store);
    keep(&mut fields, "peer", &running.peer, &mut new.peer);
    keep(&mut fields, "health", &running.health, &mut new.health);
    keep(&mut fields, "log.format", &running.log.format, &mut new.log.format);
    fields
}

/// Applies changes of the config file to the running daemon.
#[derive(Debug)]
pub(crate) struct Reloader {
    source: ConfigSource,
    env: Environment,
    running: Config,
    /// The file's contents last read, applied or not: the same contents are not tried again.
    read: Option<Vec<u8>>,
    tunables: Tunables,
    elections: Elections,
    report: ConfigReport,
    health: Health,
    metrics: Metrics,
}

/// What a reload did.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Applied {
    /// Fields now in effect with their new values.
    pub changed: Vec<&'static str>,
    /// Fields that changed in the file but keep their running values until a restart.
    pub restart_needed: Vec<&'static str>,
}

/// Why a changed config file was not applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    /// The file did not load (unreadable, not YAML, or a field is wrong).
    #[error("load the changed config file")]
    Load(#[source] consistd_core::config::ConfigError),
    /// An election of the new file could not be started.
    #[error("start configured election")]
    Election(#[source] LeadershipError),
}

impl Reloader {
    /// A reloader for the daemon running `config`, which came from `source` with `env`; the config's
    /// elections are campaigned in through `elections`, already in sync with it.
    pub(crate) fn new(
        config: Config,
        (source, env): (ConfigSource, Environment),
        tunables: Tunables,
        elections: Elections,
        (health, metrics): (Health, Metrics),
    ) -> Self {
        let read = source.file.as_ref().and_then(|f| std::fs::read(f).ok());
        let report = ConfigReport { file: source.file.clone(), ..ConfigReport::default() };
        let mut reloader = Self { source, env, running: config, read, tunables, elections, report, health, metrics };
        reloader.report(Ok(&Applied::default()));
        reloader
    }

    /// Watches the config file and applies its changes until `shutdown` (the daemon draining), then stops
    /// the config's campaigns (releasing held Leases).
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let Some(file) = self.source.file.clone() else {
            shutdown.cancelled().await;
            self.elections.stop();
            return;
        };
        let mut changes = Changes::watch(&[&file], "the config file");
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = changes.next() => {}
            }
            self.check();
        }
        self.elections.stop();
    }

    /// Reads the file and applies it if its contents changed since the last read (a file gone missing
    /// counts as a change, and is refused).
    fn check(&mut self) {
        let Some(file) = self.source.file.clone() else { return };
        let read = std::fs::read(&file).ok();
        if read == self.read {
            return;
        }
        self.read = read;
        let outcome = self.reload().map_err(|e| error::chain(&e));
        match &outcome {
            Ok(applied) => {
                tracing::info!(file = %file.display(), changed = ?applied.changed, "applied config change");
                if !applied.restart_needed.is_empty() {
                    tracing::warn!(
                        fields = ?applied.restart_needed,
                        "these config fields are read only at start: they keep their running values until a restart"
                    );
                }
            }
            Err(error) => {
                tracing::warn!(file = %file.display(), %error, "config change refused; the running config stays as it was")
            }
        }
        self.report(outcome.as_ref().map_err(String::as_str));
    }

    fn reload(&mut self) -> Result<Applied, ReloadError> {
        let mut new =
            Config::load(self.source.file.as_deref(), &self.source.overrides, &self.env).map_err(ReloadError::Load)?;
        let restart_needed = restart_only(&self.running, &mut new);
        let mut changed = Vec::new();
        if self.elections.sync(&new.elections).map_err(ReloadError::Election)? {
            changed.push("elections");
        }
        if new.log.level != self.running.log.level {
            match self.source.log.set(&new.log.level) {
                Ok(()) => changed.push("log.level"),
                Err(error) => tracing::warn!(error, "could not change the log level"),
            }
        }
        changed.extend(self.tunables.apply(&new));
        self.running = new;
        Ok(Applied { changed, restart_needed })
    }

    /// Records the outcome of the newest read for `consistd status` and the metrics.
    fn report(&mut self, outcome: Result<&Applied, &str>) {
        let report = &mut self.report;
        match outcome {
            Ok(applied) => {
                let now = SystemTime::now();
                report.last_reload_successful = true;
                report.error = None;
                report.restart_needed = applied.restart_needed.iter().map(|f| (*f).to_owned()).collect();
                report.last_applied = Some(humantime::format_rfc3339_seconds(now).to_string());
                let seconds = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
                self.metrics.config_last_reload_successful.set(1);
                self.metrics.config_last_reload_success_timestamp_seconds.set(seconds);
            }
            Err(error) => {
                report.last_reload_successful = false;
                report.error = Some(error.to_owned());
                self.metrics.config_last_reload_successful.set(0);
            }
        }
        self.health.set_config(report.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_only_fields_keep_their_running_values_and_are_named() {
        let running = Config::default();
        let mut new = Config::default();
        new.socket.path = "/elsewhere.sock".into();
        new.peer.listen = Some("0.0.0.0:7070".parse().expect("address"));
        new.watch.linger = Duration::from_secs(99);
        new.socket.allowed_uids = vec![1000];
        new.outbox.max_pending = 7;
        new.log.level = "debug".to_owned();
        let fields = restart_only(&running, &mut new);
        assert_eq!(fields, ["socket.path", "watch", "peer"]);
        assert_eq!(new.socket.path, running.socket.path);
        assert_eq!((new.peer.listen, new.watch.linger), (None, running.watch.linger));
        assert_eq!(new.socket.allowed_uids, [1000], "the allowlist is live");
        assert_eq!((new.outbox.max_pending, new.log.level.as_str()), (7, "debug"));
        assert!(restart_only(&running, &mut Config::default()).is_empty());
    }

    #[test]
    fn tunables_name_what_changed_and_every_reader_sees_it() {
        let config = Config::default();
        let tunables = Tunables::new(&config);
        let (outbox, inbox, ttl) = (tunables.outbox.live(), tunables.inbox.live(), tunables.membership_ttl.live());
        assert!(tunables.apply(&config).is_empty());
        let mut new = config.clone();
        new.outbox.backoff.cap = Duration::from_secs(3);
        new.inbox.max_pending = 5;
        new.membership.ttl = Duration::from_secs(12);
        new.socket.allowed_gids = vec![2000];
        assert_eq!(tunables.apply(&new), ["outbox", "inbox", "membership.ttl", "socket.allowedUids/allowedGids"]);
        assert_eq!(
            (outbox.get().backoff.cap, inbox.get().max_pending, ttl.get()),
            (Duration::from_secs(3), 5, new.membership.ttl)
        );
        assert_eq!(tunables.allowlist.live().get().gids, [2000]);
    }
}
