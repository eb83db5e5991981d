//! The one mutation both injection paths make: consistd added to a pod template as a native sidecar,
//! exactly as manifests/base runs it, with per-pod overrides from annotations; a pod that already has
//! it is left as it is.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
        ExecAction, HTTPGetAction, ObjectFieldSelector, PodSpec, Probe, ResourceRequirements, SecretVolumeSource,
        SecurityContext, Volume, VolumeMount,
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

use crate::{config::POD_VARIABLES, names::is_dns_subdomain};

/// The label that asks for injection (the webhook's objectSelector matches it).
pub const INJECT_LABEL: &str = "consistd.io/inject";
/// The annotation injection sets, so it is never done twice.
pub const STATUS_ANNOTATION: &str = "consistd.io/status";
/// The name of the injected container.
pub const CONTAINER_NAME: &str = "consistd";
/// Where the socket directory is mounted in every container.
pub const SOCKET_DIR: &str = "/var/run/consistd";

/// Annotations that override the injector's defaults for one pod.
pub mod annotations {
    /// The ConfigMap holding `consistd.yaml`.
    pub const CONFIG: &str = "consistd.io/config";
    /// The daemon's log filter (`CONSISTD_LOG_LEVEL`).
    pub const LOG_LEVEL: &str = "consistd.io/log-level";
    /// The sidecar's CPU request.
    pub const CPU_REQUEST: &str = "consistd.io/cpu-request";
    /// The sidecar's memory request.
    pub const MEMORY_REQUEST: &str = "consistd.io/memory-request";
    /// The sidecar's memory limit.
    pub const MEMORY_LIMIT: &str = "consistd.io/memory-limit";
    /// The daemon-to-daemon port.
    pub const PEER_PORT: &str = "consistd.io/peer-port";
    /// The Secret with the peer mTLS certificate, key and CA.
    pub const PEER_TLS_SECRET: &str = "consistd.io/peer-tls-secret";
    /// The TCP port of /metrics, /healthz and /readyz (`admin.listen`); "0" keeps them on the socket.
    pub const ADMIN_PORT: &str = "consistd.io/admin-port";
    /// Where the sidecar exports OpenTelemetry traces (`OTEL_EXPORTER_OTLP_ENDPOINT`, OTLP/gRPC); "" turns
    /// them off for the pod.
    pub const OTEL_ENDPOINT: &str = "consistd.io/otel-endpoint";
}

/// What the sidecar gets unless a pod's annotations say otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    /// The consistd image.
    pub image: String,
    /// The ConfigMap with `consistd.yaml`.
    pub config_map: String,
    /// The daemon-to-daemon port.
    pub peer_port: u16,
    /// The port of /metrics, /healthz and /readyz over TCP, which kubelet's httpGet probes and
    /// Prometheus use; 0: none, and exec probes (`consistd status`, one process each) instead.
    pub admin_port: u16,
    /// The peer mTLS Secret (mounted optionally: a pod without it still starts).
    pub peer_tls_secret: String,
    /// CPU request.
    pub cpu_request: String,
    /// Memory request.
    pub memory_request: String,
    /// Memory limit.
    pub memory_limit: String,
    /// The OTLP/gRPC endpoint sidecars export traces to (e.g. `http://otel-collector.monitoring:4317`);
    /// empty: traces off.
    pub otel_endpoint: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            image: format!("ghcr.io/consistd/consistd:{}", env!("CARGO_PKG_VERSION")),
            config_map: "consistd-config".to_owned(),
            peer_port: 7070,
            admin_port: 7071,
            peer_tls_secret: "consistd-peer-tls".to_owned(),
            cpu_request: "10m".to_owned(),
            memory_request: "32Mi".to_owned(),
            memory_limit: "128Mi".to_owned(),
            otel_endpoint: String::new(),
        }
    }
}

/// An annotation whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: {message}")]
pub struct BadAnnotation {
    /// The annotation's key.
    pub annotation: &'static str,
    /// What is wrong with its value.
    pub message: String,
}

/// What injection did to a pod template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injection {
    /// The sidecar was added.
    Injected,
    /// The pod already had it (injected before, or written by hand): nothing changed.
    AlreadyPresent,
}

/// Adds the sidecar to a pod template's metadata and spec; idempotent.
pub fn inject(meta: &mut ObjectMeta, spec: &mut PodSpec, defaults: &Defaults) -> Result<Injection, BadAnnotation> {
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    let has_container = |list: &[Container]| list.iter().any(|c| c.name == CONTAINER_NAME);
    if annotations.get(STATUS_ANNOTATION).is_some_and(|s| s == "injected")
        || has_container(&spec.containers)
        || spec.init_containers.as_deref().is_some_and(has_container)
    {
        return Ok(Injection::AlreadyPresent);
    }
    let settings = Settings::read(annotations, defaults)?;

    let sidecar = settings.container(defaults);
    spec.init_containers.get_or_insert_with(Vec::new).insert(0, sidecar);
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    for volume in settings.volumes() {
        if !volumes.iter().any(|v| v.name == volume.name) {
            volumes.push(volume);
        }
    }
    for app in &mut spec.containers {
        let mounts = app.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts.iter().any(|m| m.mount_path == SOCKET_DIR) {
            mounts.push(mount("consistd-socket", SOCKET_DIR, false));
        }
        let env = app.env.get_or_insert_with(Vec::new);
        if !env.iter().any(|e| e.name == "CONSISTD_SOCKET") {
            env.push(EnvVar {
                name: "CONSISTD_SOCKET".to_owned(),
                value: Some(format!("{SOCKET_DIR}/consistd.sock")),
                ..EnvVar::default()
            });
        }
    }
    annotations.insert(STATUS_ANNOTATION.to_owned(), "injected".to_owned());
    Ok(Injection::Injected)
}

/// The defaults with one pod's annotations applied, each checked.
struct Settings {
    config_map: String,
    log_level: Option<String>,
    cpu_request: String,
    memory_request: String,
    memory_limit: String,
    peer_port: u16,
    admin_port: u16,
    peer_tls_secret: String,
    otel_endpoint: String,
}

impl Settings {
    fn read(annotations: &BTreeMap<String, String>, defaults: &Defaults) -> Result<Self, BadAnnotation> {
        let get = |key: &str| annotations.get(key).map(String::as_str);
        let bad = |annotation, message: String| BadAnnotation { annotation, message };
        let name = |key: &'static str, default: &str| match get(key) {
            None => Ok(default.to_owned()),
            Some(v) if is_dns_subdomain(v) => Ok(v.to_owned()),
            Some(v) => Err(bad(key, format!("{v:?} is not a valid object name"))),
        };
        let quantity = |key: &'static str, default: &str| match get(key) {
            None => Ok(default.to_owned()),
            Some(v) if is_quantity(v) => Ok(v.to_owned()),
            Some(v) => Err(bad(key, format!("{v:?} is not a quantity such as 100m or 64Mi"))),
        };
        let peer_port = match get(annotations::PEER_PORT) {
            None => defaults.peer_port,
            Some(v) => v
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad(annotations::PEER_PORT, format!("{v:?} is not a port between 1 and 65535")))?,
        };
        let admin_port = match get(annotations::ADMIN_PORT) {
            None => defaults.admin_port,
            Some(v) => v
                .parse::<u16>()
                .map_err(|_| bad(annotations::ADMIN_PORT, format!("{v:?} is not 0 (none) or a port up to 65535")))?,
        };
        if admin_port == peer_port {
            let (annotation, other) = if get(annotations::ADMIN_PORT).is_some() {
                (annotations::ADMIN_PORT, "the peer port")
            } else {
                (annotations::PEER_PORT, "the admin port (set consistd.io/admin-port to another)")
            };
            return Err(bad(annotation, format!("{peer_port} is also {other}")));
        }
        let log_level = match get(annotations::LOG_LEVEL) {
            None => None,
            Some(v) if tracing_subscriber::EnvFilter::try_new(v).is_ok() => Some(v.to_owned()),
            Some(v) => return Err(bad(annotations::LOG_LEVEL, format!("{v:?} is not a log filter such as debug"))),
        };
        let otel_endpoint = get(annotations::OTEL_ENDPOINT).unwrap_or(&defaults.otel_endpoint);
        check_otel_endpoint(otel_endpoint).map_err(|message| bad(annotations::OTEL_ENDPOINT, message))?;
        Ok(Self {
            config_map: name(annotations::CONFIG, &defaults.config_map)?,
            log_level,
            cpu_request: quantity(annotations::CPU_REQUEST, &defaults.cpu_request)?,
            memory_request: quantity(annotations::MEMORY_REQUEST, &defaults.memory_request)?,
            memory_limit: quantity(annotations::MEMORY_LIMIT, &defaults.memory_limit)?,
            peer_port,
            admin_port,
            peer_tls_secret: name(annotations::PEER_TLS_SECRET, &defaults.peer_tls_secret)?,
            otel_endpoint: otel_endpoint.to_owned(),
        })
    }

    /// The native sidecar: an init container that keeps running (restartPolicy Always).
    fn container(&self, defaults: &Defaults) -> Container {
        let field = |name: &str, path: &str| EnvVar {
            name: name.to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector { field_path: path.to_owned(), ..ObjectFieldSelector::default() }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        };
        let mut env: Vec<EnvVar> = POD_VARIABLES.iter().map(|(name, path, _)| field(name, path)).collect();
        let value =
            |name: &str, value: String| EnvVar { name: name.to_owned(), value: Some(value), ..EnvVar::default() };
        if let Some(level) = &self.log_level {
            env.push(value("CONSISTD_LOG_LEVEL", level.clone()));
        }
        if !self.otel_endpoint.is_empty() {
            env.push(value("OTEL_EXPORTER_OTLP_ENDPOINT", self.otel_endpoint.clone()));
            // Which pod's sidecar a span came from (kubelet expands the variables defined above).
            let attributes = "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)";
            env.push(value("OTEL_RESOURCE_ATTRIBUTES", attributes.to_owned()));
        }
        let mut ports = vec![port("consistd-peer", self.peer_port)];
        // Ready when /readyz says so: kubelet GETs it on the admin port, or, without one (kubelet cannot
        // GET over a Unix socket), runs `consistd status`, which reads the admin socket and exits 0 when ready.
        let check = if self.admin_port == 0 {
            Probe {
                exec: Some(ExecAction { command: Some(vec!["/consistd".to_owned(), "status".to_owned()]) }),
                ..Probe::default()
            }
        } else {
            env.push(value("CONSISTD_ADMIN_LISTEN", format!("0.0.0.0:{}", self.admin_port)));
            ports.push(port("consistd-admin", self.admin_port));
            Probe {
                http_get: Some(HTTPGetAction {
                    path: Some("/readyz".to_owned()),
                    port: IntOrString::String("consistd-admin".to_owned()),
                    ..HTTPGetAction::default()
                }),
                ..Probe::default()
            }
        };
        let status_probe =
            |period, failures| Probe { period_seconds: Some(period), failure_threshold: failures, ..check.clone() };
        Container {
            name: CONTAINER_NAME.to_owned(),
            image: Some(defaults.image.clone()),
            restart_policy: Some("Always".to_owned()),
            args: Some(["run", "--config", "/etc/consistd/consistd.yaml"].map(str::to_owned).to_vec()),
            env: Some(env),
            ports: Some(ports),
            startup_probe: Some(status_probe(1, Some(60))),
            readiness_probe: Some(status_probe(10, None)),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity(self.cpu_request.clone())),
                    ("memory".to_owned(), Quantity(self.memory_request.clone())),
                ])),
                limits: Some(BTreeMap::from([("memory".to_owned(), Quantity(self.memory_limit.clone()))])),
                ..ResourceRequirements::default()
            }),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                run_as_group: Some(65532),
                capabilities: Some(Capabilities { drop: Some(vec!["ALL".to_owned()]), ..Capabilities::default() }),
                ..SecurityContext::default()
            }),
            volume_mounts: Some(vec![
                mount("consistd-socket", SOCKET_DIR, false),
                mount("consistd-config", "/etc/consistd", true),
                mount("consistd-store", "/var/lib/consistd", false),
                mount("consistd-peer-tls", "/var/run/secrets/consistd/peer-tls", true),
            ]),
            ..Container::default()
        }
    }

    fn volumes(&self) -> Vec<Volume> {
        let empty_dir = |name: &str| Volume {
            name: name.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        };
        vec![
            empty_dir("consistd-socket"),
            Volume {
                name: "consistd-config".to_owned(),
                config_map: Some(ConfigMapVolumeSource {
                    name: self.config_map.clone(),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            empty_dir("consistd-store"),
            Volume {
                name: "consistd-peer-tls".to_owned(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(self.peer_tls_secret.clone()),
                    // A pod whose config sets no peer TLS needs no Secret to start.
                    optional: Some(true),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            },
        ]
    }
}

/// Checks an OTLP endpoint: empty (off) or an http(s) URL with a host, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes.
pub(crate) fn check_otel_endpoint(endpoint: &str) -> Result<(), String> {
    if endpoint.is_empty() {
        return Ok(());
    }
    let uri: http::Uri = endpoint.parse().map_err(|e| format!("{endpoint:?} is not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(host)) if !host.is_empty() => Ok(()),
        _ => Err(format!(
            "{endpoint:?} is not an http:// or https:// URL with a host, such as http://otel-collector:4317"
        )),
    }
}

fn port(name: &str, number: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(number),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// A Kubernetes quantity as annotations write them: digits with an optional decimal part and suffix.
fn is_quantity(value: &str) -> bool {
    let number_end = value.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(value.len());
    let (number, suffix) = value.split_at(number_end);
    !number.is_empty()
        && number.parse::<f64>().is_ok()
        && ["", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].contains(&suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app_pod() -> (ObjectMeta, PodSpec) {
        let spec = PodSpec {
            containers: vec![Container {
                name: "app".to_owned(),
                image: Some("app:1".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        };
        (ObjectMeta::default(), spec)
    }

    #[test]
    fn the_sidecar_comes_first_and_every_app_container_gets_the_socket() {
        let (mut meta, mut spec) = app_pod();
        assert_eq!(inject(&mut meta, &mut spec, &Defaults::default()), Ok(Injection::Injected));
        let init = spec.init_containers.as_ref().expect("init containers");
        assert_eq!(init[0].name, "consistd");
        assert_eq!(init[0].restart_policy.as_deref(), Some("Always"), "a native sidecar");
        let app = &spec.containers[0];
        assert!(app.volume_mounts.as_ref().expect("mounts").iter().any(|m| m.mount_path == SOCKET_DIR));
        let env = app.env.as_ref().expect("env");
        assert!(env.iter().any(|e| e.name == "CONSISTD_SOCKET"));
        assert_eq!(meta.annotations.expect("annotations")[STATUS_ANNOTATION], "injected");
    }

    #[test]
    fn injecting_twice_changes_nothing_the_second_time() {
        let (mut meta, mut spec) = app_pod();
        inject(&mut meta, &mut spec, &Defaults::default()).expect("inject");
        let (before_meta, before_spec) = (meta.clone(), spec.clone());
        assert_eq!(inject(&mut meta, &mut spec, &Defaults::default()), Ok(Injection::AlreadyPresent));
        assert_eq!((meta, spec), (before_meta, before_spec));
    }

    #[test]
    fn annotations_override_the_defaults_and_bad_ones_are_named() {
        let (mut meta, mut spec) = app_pod();
        meta.annotations = Some(BTreeMap::from([
            (annotations::CONFIG.to_owned(), "my-config".to_owned()),
            (annotations::PEER_PORT.to_owned(), "7171".to_owned()),
            (annotations::ADMIN_PORT.to_owned(), "9191".to_owned()),
            (annotations::MEMORY_LIMIT.to_owned(), "256Mi".to_owned()),
            (annotations::LOG_LEVEL.to_owned(), "consistd=debug".to_owned()),
        ]));
        inject(&mut meta, &mut spec, &Defaults::default()).expect("inject");
        let sidecar = &spec.init_containers.as_ref().expect("init")[0];
        let ports: Vec<i32> = sidecar.ports.as_ref().expect("ports").iter().map(|p| p.container_port).collect();
        assert_eq!(ports, [7171, 9191]);
        let limits = sidecar.resources.as_ref().and_then(|r| r.limits.as_ref()).expect("limits");
        assert_eq!(limits["memory"], Quantity("256Mi".to_owned()));
        let config = spec.volumes.as_ref().expect("volumes").iter().find(|v| v.name == "consistd-config").cloned();
        assert_eq!(config.and_then(|v| v.config_map).map(|c| c.name), Some("my-config".to_owned()));

        for (key, value) in [
            (annotations::PEER_PORT, "0"),
            (annotations::PEER_PORT, "http"),
            (annotations::PEER_PORT, "7071"),
            (annotations::ADMIN_PORT, "7070"),
            (annotations::ADMIN_PORT, "-1"),
            (annotations::CPU_REQUEST, "lots"),
            (annotations::CONFIG, "Not_A_Name"),
            (annotations::LOG_LEVEL, "=="),
            (annotations::OTEL_ENDPOINT, "otel-collector:4317"),
            (annotations::OTEL_ENDPOINT, "grpc://otel-collector:4317"),
        ] {
            let (mut meta, mut spec) = app_pod();
            meta.annotations = Some(BTreeMap::from([(key.to_owned(), value.to_owned())]));
            let error = inject(&mut meta, &mut spec, &Defaults::default()).expect_err("refused");
            assert_eq!(error.annotation, key, "{error}");
            assert!(spec.init_containers.is_none(), "a refused pod is left as it was");
        }
    }

    #[test]
    fn probes_get_readyz_on_the_admin_port_or_run_consistd_status_without_one() {
        let (mut meta, mut spec) = app_pod();
        inject(&mut meta, &mut spec, &Defaults::default()).expect("inject");
        let sidecar = &spec.init_containers.as_ref().expect("init")[0];
        let get = sidecar.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("httpGet");
        assert_eq!(
            (get.path.as_deref(), &get.port),
            (Some("/readyz"), &IntOrString::String("consistd-admin".to_owned()))
        );
        let env = sidecar.env.as_ref().expect("env");
        assert!(env.iter().any(|e| e.name == "CONSISTD_ADMIN_LISTEN" && e.value.as_deref() == Some("0.0.0.0:7071")));

        let (mut meta, mut spec) = app_pod();
        meta.annotations = Some(BTreeMap::from([(annotations::ADMIN_PORT.to_owned(), "0".to_owned())]));
        inject(&mut meta, &mut spec, &Defaults::default()).expect("inject");
        let sidecar = &spec.init_containers.as_ref().expect("init")[0];
        let exec = sidecar.startup_probe.as_ref().and_then(|p| p.exec.as_ref()).expect("exec");
        assert_eq!(exec.command.as_deref(), Some(&["/consistd".to_owned(), "status".to_owned()][..]));
        assert!(!sidecar.env.as_ref().expect("env").iter().any(|e| e.name == "CONSISTD_ADMIN_LISTEN"));
        assert_eq!(sidecar.ports.as_ref().expect("ports").len(), 1, "no admin port");
    }

    #[test]
    fn traces_are_exported_where_the_injector_or_the_pod_says_and_off_by_default() {
        let env_of = |annotation: Option<&str>, default: &str| {
            let (mut meta, mut spec) = app_pod();
            if let Some(endpoint) = annotation {
                meta.annotations = Some(BTreeMap::from([(annotations::OTEL_ENDPOINT.to_owned(), endpoint.to_owned())]));
            }
            let defaults = Defaults { otel_endpoint: default.to_owned(), ..Defaults::default() };
            inject(&mut meta, &mut spec, &defaults).expect("inject");
            let env = spec.init_containers.expect("init").remove(0).env.expect("env");
            let get = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
            (get("OTEL_EXPORTER_OTLP_ENDPOINT"), get("OTEL_RESOURCE_ATTRIBUTES"))
        };
        assert_eq!(env_of(None, ""), (None, None), "off by default");
        let collector = "http://otel-collector.monitoring:4317";
        let (endpoint, attributes) = env_of(None, collector);
        assert_eq!(endpoint.as_deref(), Some(collector), "the injector's default");
        assert_eq!(attributes.as_deref(), Some("k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"));
        assert_eq!(env_of(Some("https://tempo:4317"), collector).0.as_deref(), Some("https://tempo:4317"));
        assert_eq!(env_of(Some(""), collector), (None, None), "a pod can turn them off");
    }

    #[test]
    fn a_pod_that_runs_consistd_by_hand_is_left_alone() {
        let (mut meta, mut spec) = app_pod();
        spec.init_containers = Some(vec![Container { name: "consistd".to_owned(), ..Container::default() }]);
        let before = spec.clone();
        assert_eq!(inject(&mut meta, &mut spec, &Defaults::default()), Ok(Injection::AlreadyPresent));
        assert_eq!(spec, before);
    }
}
