//! The sidecar's defaults as command-line flags, shared by `consistd inject`, `consistd inject webhook` and
//! `kubectl consistd inject`, and the offline injection of a manifest file they run.

use std::{path::Path, process::ExitCode};

use clap::Args;

use super::{
    offline,
    sidecar::{self, Defaults},
};
use crate::error;

/// The sidecar's defaults, shared by the offline injector and the webhook.
#[derive(Debug, Args)]
pub struct SidecarArgs {
    /// The consistd image (the default is not published yet: build it with `make image` and push it).
    #[arg(long, default_value_t = Defaults::default().image)]
    pub image: String,
    /// The ConfigMap with `consistd.yaml` (annotation consistd.io/config overrides it).
    #[arg(long, default_value_t = Defaults::default().config_map)]
    pub config_map: String,
    /// The daemon-to-daemon port (annotation consistd.io/peer-port).
    #[arg(long, default_value_t = Defaults::default().peer_port)]
    pub peer_port: u16,
    /// The peer mTLS Secret, mounted if it exists (annotation consistd.io/peer-tls-secret).
    #[arg(long, default_value_t = Defaults::default().peer_tls_secret)]
    pub peer_tls_secret: String,
    /// The port of /metrics and the httpGet probes (admin.listen); 0: exec probes, metrics on the
    /// admin socket only (annotation consistd.io/admin-port).
    #[arg(long, default_value_t = Defaults::default().admin_port)]
    pub admin_port: u16,
    /// The OTLP/gRPC endpoint sidecars export traces to, e.g. http://otel-collector.monitoring:4317;
    /// empty: traces off (annotation consistd.io/otel-endpoint).
    #[arg(long, default_value_t = Defaults::default().otel_endpoint, value_parser = otel_endpoint)]
    pub otel_endpoint: String,
}

/// Parses `--otel-endpoint` as the annotation is checked.
fn otel_endpoint(value: &str) -> Result<String, String> {
    sidecar::check_otel_endpoint(value).map(|()| value.to_owned())
}

impl SidecarArgs {
    /// The defaults these flags give.
    pub fn defaults(&self) -> Defaults {
        Defaults {
            image: self.image.clone(),
            config_map: self.config_map.clone(),
            peer_port: self.peer_port,
            admin_port: self.admin_port,
            peer_tls_secret: self.peer_tls_secret.clone(),
            otel_endpoint: self.otel_endpoint.clone(),
            ..Defaults::default()
        }
    }
}

/// `consistd inject -f FILE`: the rewritten manifests on standard output; exit 1 naming the document and
/// field that could not be injected.
pub fn inject_file(file: &Path, defaults: &SidecarArgs) -> ExitCode {
    let read =
        if file.as_os_str() == "-" { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(file) };
    let yaml = match read {
        Ok(yaml) => yaml,
        Err(error) => {
            eprintln!("consistd inject: read {}: {error}", file.display());
            return ExitCode::FAILURE;
        }
    };
    match offline::inject_documents(&yaml, &defaults.defaults()) {
        Ok((out, injected)) => {
            print!("{out}");
            eprintln!("consistd inject: {injected} pod template(s) injected, sidecar image {}", defaults.image);
            if defaults.image == Defaults::default().image {
                eprintln!(
                    "consistd inject: {} is not published yet; build it (make image), push it and pass --image",
                    defaults.image
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("consistd inject: {}: {}", file.display(), error::chain(&error));
            ExitCode::FAILURE
        }
    }
}
