//! Checks across fields that types alone cannot make: socket paths, election timing, peer and outbox
//! settings, health probes, the log filter. Each error names the field.

use std::{path::Path, time::Duration};

use super::{Config, ConfigError, MAX_PAYLOAD_LIMIT};

/// A Unix socket path is stored in `sockaddr_un.sun_path`: 108 bytes with the terminating NUL.
const MAX_SOCKET_PATH_BYTES: usize = 107;
/// Probing a quiet apiserver or store more often than this would be load for nothing.
const MIN_PROBE_INTERVAL: Duration = Duration::from_millis(100);

impl Config {
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
        if self.watch.max_cache_bytes == Some(0) {
            return Err(ConfigError::field(
                "watch.maxCacheBytes",
                "must be at least 1 (leave it unset for the default)",
            ));
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
        self.validate_access()?;
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
        self.validate_health()?;
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(ConfigError::field("log.level", format!("{:?} is not a tracing filter: {e}", self.log.level)));
        }
        Ok(())
    }

    fn validate_access(&self) -> Result<(), ConfigError> {
        for (i, rule) in self.access.rules.iter().enumerate() {
            let field = |name: &str| format!("access.rules[{i}].{name}");
            let known = rule.service.verbs();
            if let Some(verb) = rule.verbs.iter().find(|v| !known.contains(&v.as_str())) {
                return Err(ConfigError::field(
                    field("verbs"),
                    format!("{verb:?} is not a verb of {}; it has {}", rule.service.name(), known.join(", ")),
                ));
            }
            if rule.resources.iter().any(String::is_empty) {
                return Err(ConfigError::field(field("resources"), "must not hold an empty name"));
            }
            let destination = |r: &&String| ["election/", "service/", "peer/"].iter().any(|p| r.starts_with(p));
            if rule.service == super::Service::Outbox
                && let Some(bad) = rule.resources.iter().find(|r| !destination(r))
            {
                return Err(ConfigError::field(
                    field("resources"),
                    format!("{bad:?} is not a destination: write election/NAME, service/NAME or peer/HOST:PORT"),
                ));
            }
            if rule.service == super::Service::Inbox && !rule.resources.is_empty() {
                return Err(ConfigError::field(field("resources"), "inbox has no resources to grant; leave it empty"));
            }
            if let Some(ns) = rule.namespaces.iter().find(|ns| !crate::names::is_namespace_name(ns)) {
                return Err(ConfigError::field(field("namespaces"), format!("{ns:?} is not a namespace name")));
            }
        }
        Ok(())
    }

    fn validate_health(&self) -> Result<(), ConfigError> {
        let h = &self.health;
        if h.probe_interval < MIN_PROBE_INTERVAL {
            return Err(ConfigError::field(
                "health.probeInterval",
                format!("{:?} is too short: at least {MIN_PROBE_INTERVAL:?}", h.probe_interval),
            ));
        }
        if h.probe_timeout.is_zero() {
            return Err(ConfigError::field(
                "health.probeTimeout",
                "must be greater than 0s: a probe needs time for its answer to travel back",
            ));
        }
        Ok(())
    }

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
            if rustls_pki_types::ServerName::try_from(tls.server_name.as_str()).is_err() {
                return Err(ConfigError::field(
                    "peer.tls.serverName",
                    format!("{:?} is not a DNS name or IP address", tls.server_name),
                ));
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
        if o.max_pending_bytes < o.max_payload_bytes {
            return Err(ConfigError::field("outbox.maxPendingBytes", "must be at least outbox.maxPayloadBytes"));
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
        if self.inbox.max_pending_bytes < self.outbox.max_payload_bytes {
            return Err(ConfigError::field("inbox.maxPendingBytes", "must be at least outbox.maxPayloadBytes"));
        }
        Ok(())
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
