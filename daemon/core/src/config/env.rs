//! What the daemon reads from its surroundings: `${VAR}` references in the config document, its
//! identity (`POD_NAME`, else the host name), its namespace (`POD_NAMESPACE`, else the service
//! account's) and the address it announces to peers (`POD_IP`), all from the downward API in a pod.
//! Everything is read through an [`Environment`] handed in, so tests never touch the process's.

use std::collections::HashMap;

use serde_yaml::Value;

use super::{Config, ConfigError, schema::describe};

/// Where the service account's namespace is mounted in a pod.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The variables and files the configuration may refer to.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    vars: HashMap<String, String>,
    /// The contents of /etc/hostname.
    hostname: Option<String>,
    /// The namespace of the mounted service account.
    service_account_namespace: Option<String>,
    /// The memory the process may use, in bytes ([`crate::memory::limit`]).
    memory_limit: Option<u64>,
}

/// The variables an injected sidecar gets from the downward API: each with the pod field it comes from and
/// the example value `consistd config check --pod` stands in for it outside a pod.
pub const POD_VARIABLES: [(&str, &str, &str); 3] = [
    ("POD_NAME", "metadata.name", "my-app-0"),
    ("POD_NAMESPACE", "metadata.namespace", "default"),
    ("POD_IP", "status.podIP", "10.0.0.1"),
];

impl Environment {
    /// This environment as a pod's would be: each of [`POD_VARIABLES`] it does not set takes its example
    /// value, so a pod's config can be checked outside the pod.
    #[must_use]
    pub fn as_in_pod(mut self) -> Self {
        for (name, _, example) in POD_VARIABLES {
            self.vars.entry(name.to_owned()).or_insert_with(|| example.to_owned());
        }
        self
    }

    /// The process's environment, /etc/hostname and the mounted service account's namespace, read
    /// once at startup.
    #[allow(clippy::disallowed_methods, reason = "the one place the process environment is read")]
    pub fn of_process() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned());
        Self {
            vars: std::env::vars().collect(),
            hostname: read("/etc/hostname"),
            service_account_namespace: read(SERVICE_ACCOUNT_NAMESPACE),
            memory_limit: crate::memory::limit(),
        }
    }

    /// This environment with `bytes` as the memory the process may use.
    #[must_use]
    pub fn with_memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Only these variables: no host name, no service account.
    pub fn from_vars<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self { vars: vars.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(), ..Self::default() }
    }

    /// The value of variable `name`, which `${name}` in the config expands to; None when unset.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// A variable's value, unless it is unset or empty.
    fn non_empty(&self, name: &str) -> Option<&str> {
        self.var(name).filter(|v| !v.is_empty())
    }
}

impl Config {
    /// The identity to campaign with: `identity`, else `POD_NAME`, else the host name, else "consistd".
    pub fn identity(&self, env: &Environment) -> String {
        self.identity
            .as_deref()
            .or_else(|| env.non_empty("POD_NAME"))
            .or(env.hostname.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("consistd")
            .to_owned()
    }

    /// The namespace for elections that name none: `namespace`, else `POD_NAMESPACE`, else the service
    /// account's, else "default".
    pub fn namespace(&self, env: &Environment) -> String {
        self.namespace
            .as_deref()
            .or_else(|| env.non_empty("POD_NAMESPACE"))
            .or(env.service_account_namespace.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
            .to_owned()
    }

    /// The bytes of watched objects the daemon may hold: `watch.maxCacheBytes`, else half of what the memory
    /// limit leaves after the outbox's and inbox's byte bounds (their payloads are bounded on their own):
    /// 32 MiB of the injector's default 128 MiB. Unbounded only where no limit could be read.
    pub fn watch_budget(&self, env: &Environment) -> u64 {
        let others = (self.outbox.max_pending_bytes as u64).saturating_add(self.inbox.max_pending_bytes as u64);
        self.watch.max_cache_bytes.unwrap_or_else(|| match env.memory_limit {
            Some(limit) => limit.saturating_sub(others) / 2,
            None => u64::MAX,
        })
    }

    /// The address announced to peers: `peer.advertise`, else `POD_IP` with the listen port.
    pub fn advertise(&self, env: &Environment) -> Option<String> {
        if let Some(a) = &self.peer.advertise {
            return Some(a.clone());
        }
        let port = self.peer.listen?.port();
        let ip = env.non_empty("POD_IP")?;
        Some(if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") })
    }
}

/// Replaces `${NAME}` in every string scalar; `$${` writes a literal `${`.
pub(super) fn expand_env(value: &mut Value, path: &mut Vec<String>, env: &Environment) -> Result<(), ConfigError> {
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

fn expand_str(s: &str, env: &Environment) -> Result<String, String> {
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
            let v = env.var(name).ok_or_else(|| format!("${{{name}}} is not set in the environment"))?;
            out.push_str(v);
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

    #[test]
    fn identity_comes_from_the_config_then_pod_name_then_the_host_name() {
        let env = Environment { hostname: Some("node-host".into()), ..Environment::from_vars([("POD_NAME", "web-0")]) };
        assert_eq!(Config::default().identity(&env), "web-0");
        let named = Config { identity: Some("me".into()), ..Config::default() };
        assert_eq!(named.identity(&env), "me");
        let no_pod = Environment { hostname: Some("node-host".into()), ..Environment::from_vars([("POD_NAME", "")]) };
        assert_eq!(Config::default().identity(&no_pod), "node-host");
        assert_eq!(Config::default().identity(&Environment::default()), "consistd");
    }

    #[test]
    fn namespace_comes_from_the_config_then_pod_namespace_then_the_service_account() {
        let sa = Environment { service_account_namespace: Some("from-sa".into()), ..Environment::default() };
        assert_eq!(Config::default().namespace(&sa), "from-sa");
        let pod = Environment {
            service_account_namespace: Some("from-sa".into()),
            ..Environment::from_vars([("POD_NAMESPACE", "apps")])
        };
        assert_eq!(Config::default().namespace(&pod), "apps");
        assert_eq!(Config::default().namespace(&Environment::default()), "default");
    }

    #[test]
    fn the_advertised_address_is_pod_ip_with_the_listen_port_unless_set() {
        let listen = |advertise: Option<&str>| Config {
            peer: crate::config::PeerConfig {
                listen: Some("0.0.0.0:7070".parse().expect("address")),
                advertise: advertise.map(str::to_owned),
                ..Default::default()
            },
            ..Config::default()
        };
        assert_eq!(
            listen(None).advertise(&Environment::from_vars([("POD_IP", "10.1.2.3")])).as_deref(),
            Some("10.1.2.3:7070")
        );
        assert_eq!(
            listen(None).advertise(&Environment::from_vars([("POD_IP", "fd00::1")])).as_deref(),
            Some("[fd00::1]:7070")
        );
        assert_eq!(listen(None).advertise(&Environment::default()), None);
        let set = listen(Some("peer.example:7000"));
        assert_eq!(
            set.advertise(&Environment::from_vars([("POD_IP", "10.1.2.3")])).as_deref(),
            Some("peer.example:7000")
        );
    }

    #[test]
    fn the_watch_budget_is_half_of_what_the_memory_limit_leaves_after_the_outbox_and_inbox() {
        const MIB: u64 = 1024 * 1024;
        let in_128_mib = Environment::default().with_memory_limit(128 * MIB);
        assert_eq!(Config::default().watch_budget(&in_128_mib), 32 * MIB, "(128 - 32 - 32) / 2");
        let small = Environment::default().with_memory_limit(48 * MIB);
        assert_eq!(Config::default().watch_budget(&small), 0, "nothing left: every app's watch is refused");
        let set = Config {
            watch: crate::config::WatchConfig { max_cache_bytes: Some(5 * MIB), ..Default::default() },
            ..Config::default()
        };
        assert_eq!(set.watch_budget(&in_128_mib), 5 * MIB, "watch.maxCacheBytes wins");
        assert_eq!(Config::default().watch_budget(&Environment::default()), u64::MAX, "no limit known");
    }
}
