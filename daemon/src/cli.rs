//! Command-line interface: `consistd run`, `consistd config check FILE`, `consistd status`.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};
use consistd_core::{
    config::{self, Config, Environment, LogFormat, Overrides, POD_VARIABLES},
    error,
    inject::SidecarArgs,
    report::render,
    tasks::Tasks,
};
use consistd_server::admin;

use crate::inject::{certs, webhook};

/// Exit code for an invalid configuration (EX_USAGE, as linkerd2-proxy and sysexits use it).
pub const EXIT_INVALID_CONFIG: u8 = 64;

/// How long the injector webhook gives its connections to finish on SIGTERM.
const WEBHOOK_GRACE: Duration = Duration::from_secs(10);

/// consistd: consistent Kubernetes watches, leader elections and ACK-tracked sends for every container
/// in the pod, over gRPC on a Unix socket.
#[derive(Debug, Parser)]
#[command(name = "consistd", version)]
pub struct Cli {
    /// The subcommand to run: `run`, `config check` or `status`.
    #[command(subcommand)]
    pub command: Command,
}

/// What `consistd` can do: run the daemon, check a config file, or show a running daemon's state.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon until SIGTERM.
    Run(RunArgs),
    /// Check configuration files without starting the daemon (`config check FILE`).
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Show a running daemon's state, read from its admin socket; exits 1 unless it is ready.
    Status(StatusArgs),
    /// Add consistd as a native sidecar to pods: `inject -f FILE` rewrites manifests, `inject webhook`
    /// serves the mutating admission webhook.
    Inject(Box<InjectArgs>),
}

/// `consistd inject -f FILE` or `consistd inject webhook`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct InjectArgs {
    /// `webhook`, or none to rewrite a file.
    #[command(subcommand)]
    pub command: Option<InjectCommand>,
    /// The manifests to rewrite ("-" for standard input): Pods, and the pod templates of Deployments,
    /// StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs; the result goes to standard output.
    #[arg(short = 'f', long = "filename", required = true)]
    pub file: Option<PathBuf>,
    /// What the sidecar gets unless a pod's annotations say otherwise.
    #[command(flatten)]
    pub defaults: SidecarArgs,
}

/// `consistd inject` subcommands.
#[derive(Debug, Subcommand)]
pub enum InjectCommand {
    /// Serve the mutating admission webhook until SIGTERM.
    Webhook(WebhookArgs),
}

/// Flags of `consistd inject webhook`.
#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Where to serve HTTPS.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: std::net::SocketAddr,
    /// The injector's namespace (its Secret's, and its Service's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// The Service the apiserver calls; its DNS names go in the serving certificate.
    #[arg(long, default_value = "consistd-injector")]
    pub service: String,
    /// Extra names (DNS names or IP addresses) for the serving certificate.
    #[arg(long = "san")]
    pub extra_names: Vec<String>,
    /// The Secret holding the webhook's CA and serving certificate.
    #[arg(long, default_value = "consistd-injector-tls")]
    pub secret: String,
    /// The MutatingWebhookConfiguration whose caBundle is kept current.
    #[arg(long, default_value = "consistd-injector")]
    pub webhook_configuration: String,
    /// How long a serving certificate is valid; it is renewed with a third of that left.
    #[arg(long, default_value = "90d", value_parser = humantime::parse_duration)]
    pub cert_validity: std::time::Duration,
    /// How long the CA is valid; rotated with a third left, the old one kept in the bundle.
    #[arg(long, default_value = "3650d", value_parser = humantime::parse_duration)]
    pub ca_validity: std::time::Duration,
    /// How often the certificates are checked.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub check_every: std::time::Duration,
    /// Log filter.
    #[arg(long, env = "CONSISTD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// What the sidecar gets unless a pod's annotations say otherwise.
    #[command(flatten)]
    pub defaults: SidecarArgs,
}

impl WebhookArgs {
    /// The webhook's settings: the Service's DNS names first, then the extra names.
    pub fn settings(&self) -> webhook::WebhookSettings {
        let (service, ns) = (&self.service, &self.namespace);
        let mut names =
            vec![format!("{service}.{ns}.svc"), format!("{service}.{ns}.svc.cluster.local"), format!("{service}.{ns}")];
        names.extend(self.extra_names.iter().cloned());
        webhook::WebhookSettings {
            listen: self.listen,
            certs: certs::CertSettings {
                namespace: ns.clone(),
                secret: self.secret.clone(),
                names,
                cert_validity: self.cert_validity,
                ca_validity: self.ca_validity,
            },
            configuration: self.webhook_configuration.clone(),
            check_every: self.check_every,
            defaults: self.defaults.defaults(),
        }
    }
}

/// Flags of `consistd run`; each overrides the config file, and each has a `CONSISTD_*` variable.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The YAML config file (the `consistd.yaml` key of the ConfigMap).
    #[arg(long, env = "CONSISTD_CONFIG")]
    pub config: Option<PathBuf>,
    /// The gRPC socket path.
    #[arg(long, env = "CONSISTD_SOCKET")]
    pub socket: Option<PathBuf>,
    /// The admin HTTP socket path.
    #[arg(long, env = "CONSISTD_ADMIN_SOCKET")]
    pub admin_socket: Option<PathBuf>,
    /// TCP address that also serves /metrics, /healthz and /readyz, e.g. 0.0.0.0:9090.
    #[arg(long, env = "CONSISTD_ADMIN_LISTEN")]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// Directory of the durable message store.
    #[arg(long, env = "CONSISTD_STORE_DIR")]
    pub store_dir: Option<PathBuf>,
    /// How log lines are written: text for people, json for log pipelines; overrides `log.format`.
    #[arg(long, env = "CONSISTD_LOG_FORMAT")]
    pub log_format: Option<LogFormatArg>,
    /// Log filter, e.g. `info` or `consistd=debug`.
    #[arg(long, env = "CONSISTD_LOG_LEVEL")]
    pub log_level: Option<String>,
}

/// `--log-format` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `consistd config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a config file; exits 64 naming the bad field and why.
    Check {
        /// Path of the YAML config file to validate, as `consistd run --config` would read it, or of a
        /// ConfigMap manifest holding it under `data.consistd.yaml`.
        file: PathBuf,
        /// Check it as the injected sidecar would read it: POD_NAME, POD_NAMESPACE and POD_IP (which the
        /// pod gives it from the downward API) take example values where the environment does not set them.
        #[arg(long)]
        pod: bool,
    },
}

/// Flags of `consistd status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The admin socket of the daemon to ask.
    #[arg(long, env = "CONSISTD_ADMIN_SOCKET", default_value = config::DEFAULT_ADMIN_SOCKET)]
    pub admin_socket: PathBuf,
    /// Print the raw JSON report.
    #[arg(long)]
    pub json: bool,
}

impl RunArgs {
    /// Loads the config file (if any) with these flags applied over it.
    pub fn load_config(&self, env: &Environment) -> Result<Config, config::ConfigError> {
        Config::load(self.config.as_deref(), &self.overrides(), env)
    }

    /// The flags and `CONSISTD_*` variables that override the config file.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            socket: self.socket.clone(),
            admin_socket: self.admin_socket.clone(),
            admin_listen: self.admin_listen,
            store_dir: self.store_dir.clone(),
            log_format: self.log_format.map(|f| match f {
                LogFormatArg::Text => LogFormat::Text,
                LogFormatArg::Json => LogFormat::Json,
            }),
            // An empty CONSISTD_LOG_LEVEL counts as unset: the file decides (an empty filter would be silence).
            log_level: self.log_level.clone().filter(|level| !level.is_empty()),
        }
    }
}

/// `consistd config check FILE`.
pub fn config_check(file: &std::path::Path, pod: bool, env: Environment) -> ExitCode {
    let env = if pod { env.as_in_pod() } else { env };
    let (text, within) = match config_text(file) {
        Ok(found) => found,
        Err(message) => {
            eprintln!("{}: {message}", file.display());
            return ExitCode::from(EXIT_INVALID_CONFIG);
        }
    };
    match Config::check(&text, file, &env) {
        Ok(_) => {
            println!("{}{within}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            let message = error::chain(&error);
            eprintln!("{}{within}: {message}", file.display());
            let unset_pod_variable =
                POD_VARIABLES.iter().any(|(name, _, _)| message.contains(&format!("${{{name}}} is not set")));
            if unset_pod_variable && !pod {
                let names: Vec<&str> = POD_VARIABLES.iter().map(|(name, _, _)| *name).collect();
                eprintln!(
                    "hint: the pod gives the sidecar {}; to check a pod's config outside the pod: consistd config \
                     check --pod {}",
                    names.join(", "),
                    file.display()
                );
            }
            ExitCode::from(EXIT_INVALID_CONFIG)
        }
    }
}

/// The config `consistd config check` checks in `file`: the file itself, or the `data.consistd.yaml` of a
/// ConfigMap manifest (returned with " (data.consistd.yaml)" to name where in the file it was); an error
/// names what could not be read.
fn config_text(file: &std::path::Path) -> Result<(String, &'static str), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("read: {e}"))?;
    let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(&text) else {
        return Ok((text, "")); // Config::check names the syntax error
    };
    if doc.get("kind").and_then(serde_yaml::Value::as_str) != Some("ConfigMap") {
        return Ok((text, ""));
    }
    match doc.get("data").and_then(|d| d.get(config::CONFIGMAP_KEY)) {
        Some(serde_yaml::Value::String(config)) => Ok((config.clone(), " (data.consistd.yaml)")),
        Some(_) => Err("data.consistd.yaml: must be a string".to_owned()),
        None => Err("data.consistd.yaml: missing: a ConfigMap holds consistd's config under this key".to_owned()),
    }
}

/// `consistd inject webhook`: serves until SIGTERM or SIGINT.
pub async fn inject_webhook(args: &WebhookArgs) -> ExitCode {
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(error = %error::chain(&error), "consistd inject webhook: connect to the apiserver");
            return ExitCode::FAILURE;
        }
    };
    let tasks = Tasks::new();
    let signals = tasks.clone();
    tasks.spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(error) => return tracing::error!(%error, "listen for SIGTERM"),
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
            () = signals.stopping() => return,
        }
        signals.signal_stop();
    });
    let served = webhook::run(client, args.settings(), &tasks).await;
    let left = tasks.stop(WEBHOOK_GRACE).await;
    if left > 0 {
        tracing::warn!(tasks = left, grace_period = ?WEBHOOK_GRACE, "tasks still running after the grace period; leaving them");
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %error::chain(&error), "consistd inject webhook failed");
            ExitCode::FAILURE
        }
    }
}

/// `consistd status`.
pub async fn status(args: &StatusArgs) -> ExitCode {
    let report = match admin::fetch_report(&args.admin_socket).await {
        Ok(report) => report,
        Err(error) => {
            eprintln!("consistd status: {}", error::chain(&error));
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    } else {
        print!("{}", render(&report));
    }
    if report.ready { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
