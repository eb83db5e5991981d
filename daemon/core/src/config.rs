//! The daemon's configuration: one YAML document (the `consistd.yaml` key of a ConfigMap), with
//! `${VAR}` references to the environment (the downward API), overridden by `CONSISTD_*` variables and
//! flags. Every error names the field path that is wrong. The fields are in `schema`, what is read
//! from the environment in `env`, the checks across fields in `validate`, what a reload changes at
//! runtime in `live`.

mod env;
mod live;
mod schema;
mod validate;

use std::path::{Path, PathBuf};

use serde_yaml::Value;

pub use self::{
    env::{Environment, POD_VARIABLES},
    live::{Live, Setter},
    schema::*,
};

/// The key of a ConfigMap that holds consistd's config (mounted as /etc/consistd/consistd.yaml in a pod).
pub const CONFIGMAP_KEY: &str = "consistd.yaml";

/// Values from `CONSISTD_*` variables and flags; each set one replaces the file's value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// `--socket` / `CONSISTD_SOCKET`.
    pub socket: Option<PathBuf>,
    /// `--admin-socket` / `CONSISTD_ADMIN_SOCKET`.
    pub admin_socket: Option<PathBuf>,
    /// `--admin-listen` / `CONSISTD_ADMIN_LISTEN`.
    pub admin_listen: Option<std::net::SocketAddr>,
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
        /// The config file that could not be read.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a YAML document.
    #[error("parse config file {path}: {message}")]
    Syntax {
        /// The config file that is not valid YAML; empty from [`Config::parse`], which has no file.
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
    pub fn load(file: Option<&Path>, overrides: &Overrides, env: &Environment) -> Result<Self, ConfigError> {
        let mut config = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
                Self::parse_file(&text, path, env)?
            }
            None => Self::default(),
        };
        config.apply(overrides);
        config.validate()?;
        Ok(config)
    }

    /// Expands, parses and validates `text`, the contents of config file `path` (`consistd config check`,
    /// which may have taken it out of a ConfigMap manifest).
    pub fn check(text: &str, path: &Path, env: &Environment) -> Result<Self, ConfigError> {
        let config = Self::parse_file(text, path, env)?;
        config.validate()?;
        Ok(config)
    }

    /// [`Config::parse`], a syntax error naming `path`.
    fn parse_file(text: &str, path: &Path, env: &Environment) -> Result<Self, ConfigError> {
        Self::parse(text, env).map_err(|e| match e {
            ConfigError::Syntax { message, .. } => ConfigError::Syntax { path: path.to_owned(), message },
            other => other,
        })
    }

    /// Parses a YAML document, replacing `${NAME}` in string values with the variable's value. Does
    /// not validate; [`Config::load`] does.
    pub fn parse(text: &str, env: &Environment) -> Result<Self, ConfigError> {
        let mut doc: Value = serde_yaml::from_str(text)
            .map_err(|e| ConfigError::Syntax { path: PathBuf::new(), message: e.to_string() })?;
        if doc.is_null() {
            // An empty ConfigMap key means "all defaults".
            doc = Value::Mapping(Default::default());
        }
        env::expand_env(&mut doc, &mut Vec::new(), env)?;
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
        if let Some(a) = o.admin_listen {
            self.admin.listen = Some(a);
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn no_env() -> Environment {
        Environment::default()
    }

    fn field_error(text: &str) -> (String, String) {
        match Config::parse(text, &no_env()).and_then(|c| c.validate().map(|()| c)) {
            Err(ConfigError::Field { field, message }) => (field, message),
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn an_empty_document_means_all_defaults() {
        let config = Config::parse("", &no_env()).expect("empty config parses");
        assert_eq!(config, Config::default());
        assert_eq!(config.socket.path, Path::new(DEFAULT_SOCKET));
        assert_eq!(config.socket.mode, FileMode(0o660));
        assert_eq!(config.shutdown.grace_period, Duration::from_secs(5));
    }

    #[test]
    fn who_may_call_parses_and_every_bad_access_field_is_named() {
        let text = r#"
socket:
  allowedUids: [1000, 1001]
  allowedGids: [2000]
access:
  rules:
    - service: objects
      verbs: [get, patch]
      resources: [configmaps, deployments.apps]
      namespaces: [team-a]
    - service: outbox
      resources: [election/workers, service/web, peer/10.0.0.1:7070]
      uids: [1000]
"#;
        let config = Config::parse(text, &no_env()).expect("valid config parses");
        config.validate().expect("valid config validates");
        assert_eq!((config.socket.allowed_uids, config.socket.allowed_gids), (vec![1000, 1001], vec![2000]));
        assert_eq!(config.access.rules[0].service, Service::Objects);
        assert_eq!(config.access.rules[1].uids, [1000]);
        assert!(Config::default().access.rules.is_empty(), "no rules: everything allowed");

        let rule = |body: &str| field_error(&format!("access:\n  rules:\n    - {body}\n"));
        assert_eq!(rule("service: objects\n      verbs: [watch]").0, "access.rules[0].verbs");
        assert!(rule("service: objects\n      verbs: [watch]").1.contains("get, list, create"));
        assert_eq!(rule("service: nope").0, "access.rules[0].service");
        assert_eq!(rule("verbs: [get]").0, "access.rules[0]", "service is required");
        assert_eq!(rule("service: outbox\n      resources: [workers]").0, "access.rules[0].resources");
        assert_eq!(rule("service: inbox\n      resources: [x]").0, "access.rules[0].resources");
        assert_eq!(rule("service: watch\n      namespaces: [Not_A_Namespace]").0, "access.rules[0].namespaces");
        assert_eq!(rule("service: watch\n      uids: [-1]").0, "access.rules[0].uids[0]");
        assert_eq!(field_error("socket:\n  allowedUids: [root]\n").0, "socket.allowedUids[0]");
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
  mode: "0640"
  groupId: 3000
shutdown:
  gracePeriod: 1500ms
log:
  format: json
  level: consistd=debug
"#;
        let config = Config::parse(text, &no_env()).expect("valid config parses");
        config.validate().expect("valid config validates");
        assert_eq!(config.socket.path, Path::new("/run/c/c.sock"));
        assert_eq!(config.socket.mode, FileMode(0o600));
        assert_eq!(config.socket.group_id, Some(2000));
        // The admin socket has a mode and group of its own, not the app socket's.
        assert_eq!((config.admin.mode, config.admin.group_id), (FileMode(0o640), Some(3000)));
        assert_eq!(Config::default().admin.mode, FileMode(0o600));
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
        let config = Config::parse("socket:\n  mode: 0640\n", &no_env()).expect("parses");
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
        assert_eq!(field_error("admin:\n  mode: 640\n").0, "admin.mode");
        assert_eq!(field_error("admin:\n  groupId: nobody\n").0, "admin.groupId");
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
    fn health_probe_settings_default_parse_and_are_checked_naming_the_field() {
        let defaults = Config::default().health;
        assert_eq!(
            (defaults.probe_interval, defaults.probe_timeout),
            (Duration::from_secs(10), Duration::from_secs(10))
        );
        let config = Config::parse("health:\n  probeInterval: 2s\n  probeTimeout: 500ms\n", &no_env()).expect("parses");
        config.validate().expect("valid");
        assert_eq!(config.health.probe_interval, Duration::from_secs(2));
        assert_eq!(config.health.probe_timeout, Duration::from_millis(500));
        assert_eq!(field_error("health:\n  probeTimeout: 0s\n").0, "health.probeTimeout");
        assert_eq!(field_error("health:\n  probeTimeout: soon\n").0, "health.probeTimeout");
        assert_eq!(field_error("health:\n  probeTimeout: 5\n").0, "health.probeTimeout");
        let (field, message) = field_error("health:\n  probeInterval: 10ms\n");
        assert_eq!(field, "health.probeInterval");
        assert!(message.contains("at least 100ms"), "{message}");
        assert_eq!(field_error("health:\n  probeIntervall: 1s\n").0, "health.probeIntervall");
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
        let config = Config::parse(ok, &no_env()).expect("parses");
        config.validate().expect("valid");
        assert_eq!(config.outbox.backoff.cap, Duration::from_secs(2));
        assert!(config.peer.transport_configured());
        assert!(!Config::default().peer.transport_configured());
    }

    #[test]
    fn environment_references_are_expanded() {
        let env = Environment::from_vars([("POD_NAME", "web-0")]);
        let config = Config::parse("socket:\n  path: /run/${POD_NAME}/c.sock\n", &env).expect("parses");
        assert_eq!(config.socket.path, Path::new("/run/web-0/c.sock"));
        let config = Config::parse("socket:\n  path: /run/$${X}/a$b\n", &env).expect("parses");
        assert_eq!(config.socket.path, Path::new("/run/${X}/a$b"));
    }

    #[test]
    fn a_missing_environment_variable_names_the_field() {
        let (field, message) = match Config::parse("socket:\n  path: /run/${NOPE}.sock\n", &no_env()) {
            Err(ConfigError::Field { field, message }) => (field, message),
            other => panic!("expected a field error, got {other:?}"),
        };
        assert_eq!(field, "socket.path");
        assert!(message.contains("${NOPE} is not set"), "{message}");
        assert!(Config::parse("socket:\n  path: /run/${NOPE\n", &no_env()).is_err());
        assert!(Config::parse("socket:\n  path: /run/${1X}\n", &no_env()).is_err());
    }

    #[test]
    fn overrides_replace_file_values() {
        let mut config = Config::parse("socket:\n  path: /from/file.sock\n", &no_env()).expect("parses");
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
        let err = Config::load(Some(&file), &Overrides::default(), &no_env()).expect_err("bad YAML is refused");
        assert!(err.to_string().contains("consistd.yaml"), "{err}");
    }
}
