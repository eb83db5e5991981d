//! Mutual TLS between daemons from files that change: `peer.tls`'s certificate, key and CA bundle are
//! read at start and again whenever their directory changes (cert-manager renewing the Secret, kubelet
//! swapping the volume's `..data` link), so every new connection presents the new leaf and trusts the
//! new bundle; connections already up keep what they negotiated. Files that cannot be read or do not
//! match keep the previous material, and say why in the log.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use consistd_core::{config::TlsConfig, mounted::Changes, tasks::Tasks};
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
    client::{
        ResolvesClientCert, WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
    server::{
        ClientHello, ResolvesServerCert, WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
    sign::CertifiedKey,
};

/// The protocol both ends speak inside TLS.
const ALPN_H2: &[u8] = b"h2";

/// Why the peer TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("read peer.tls.{field} {path}")]
    Read {
        /// The config field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file's contents are not what the field needs.
    #[error("load peer.tls.{field} {path}: {reason}")]
    Invalid {
        /// The config field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it, e.g. no certificate in it, or a key that does not parse.
        reason: String,
    },
    /// `peer.tls.serverName` cannot be a server name.
    #[error("peer.tls.serverName {name:?} is not a DNS name or IP address")]
    ServerName {
        /// The name as configured.
        name: String,
        /// rustls' reason.
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    /// The files parse but rustls refuses them together, e.g. a key that does not match the certificate.
    #[error("use peer.tls files")]
    Rustls(#[source] rustls::Error),
}

/// The peer TLS material in use, shared by the server and client configs it made; `reload` swaps it.
#[derive(Clone)]
pub struct PeerTls {
    shared: Arc<Shared>,
}

struct Shared {
    files: TlsConfig,
    server_name: ServerName<'static>,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<Material>>,
}

/// What one reading of the files gives.
struct Material {
    /// The files' bytes (certificate, key, CA bundle), to tell a real change from a touch.
    read: [Vec<u8>; 3],
    key: Arc<CertifiedKey>,
    client_verifier: Arc<dyn ClientCertVerifier>,
    server_verifier: Arc<WebPkiServerVerifier>,
}

impl fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerTls").field("files", &self.shared.files).finish_non_exhaustive()
    }
}

impl PeerTls {
    /// Reads the files `tls` names.
    pub fn load(tls: &TlsConfig) -> Result<Self, TlsError> {
        let server_name = ServerName::try_from(tls.server_name.clone())
            .map_err(|source| TlsError::ServerName { name: tls.server_name.clone(), source })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let material = Material::read(tls, &provider)?;
        let current = RwLock::new(Arc::new(material));
        Ok(Self { shared: Arc::new(Shared { files: tls.clone(), server_name, provider, current }) })
    }

    /// The name peers' server certificates must carry (`peer.tls.serverName`).
    pub(crate) fn server_name(&self) -> ServerName<'static> {
        self.shared.server_name.clone()
    }

    /// The server side: the current certificate, and a client certificate from the current bundle required.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let mut config = ServerConfig::builder_with_provider(self.shared.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?
            .with_client_cert_verifier(Arc::new(self.clone()))
            .with_cert_resolver(Arc::new(self.clone()));
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }

    /// The client side: the current certificate, and the server's checked against the current bundle.
    pub(crate) fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let mut config = ClientConfig::builder_with_provider(self.shared.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(self.clone()))
            .with_client_cert_resolver(Arc::new(self.clone()));
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }

    /// Reads the files again; true when they changed and the new material is in use. On an error the
    /// material in use stays.
    pub(crate) fn reload(&self) -> Result<bool, TlsError> {
        let files = &self.shared.files;
        let read = read_files(files)?;
        if read == self.current().read {
            return Ok(false);
        }
        let material = Material::build(files, read, &self.shared.provider)?;
        *self.shared.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(material);
        Ok(true)
    }

    /// Reloads, as a task of `tasks`, whenever the files' directories change (and every minute regardless)
    /// until the group stops.
    pub fn spawn_watch(&self, tasks: &Tasks) {
        let files = &self.shared.files;
        let mut changes = Changes::watch(&[&files.cert_file, &files.key_file, &files.ca_file], "the peer TLS files");
        let tls = self.clone();
        let shutdown = tasks.signal().clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = changes.next() => {}
                }
                match tls.reload() {
                    Ok(true) => {
                        tracing::info!(cert = %tls.shared.files.cert_file.display(), "reloaded the peer TLS files")
                    }
                    Ok(false) => {}
                    Err(error) => tracing::warn!(
                        error = %consistd_core::error::chain(&error),
                        "could not reload the peer TLS files; keeping the ones in use"
                    ),
                }
            }
        });
    }

    /// The signature checks of handshakes, both sides: the provider's, as the WebPKI verifiers use them.
    fn algorithms(&self) -> &rustls::crypto::WebPkiSupportedAlgorithms {
        &self.shared.provider.signature_verification_algorithms
    }

    fn current(&self) -> Arc<Material> {
        self.shared.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

fn read_files(files: &TlsConfig) -> Result<[Vec<u8>; 3], TlsError> {
    let read = |field: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read { field, path: path.to_owned(), source })
    };
    Ok([read("certFile", &files.cert_file)?, read("keyFile", &files.key_file)?, read("caFile", &files.ca_file)?])
}

impl Material {
    fn read(files: &TlsConfig, provider: &Arc<CryptoProvider>) -> Result<Self, TlsError> {
        Self::build(files, read_files(files)?, provider)
    }

    fn build(files: &TlsConfig, read: [Vec<u8>; 3], provider: &Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let invalid = |field, path: &Path, reason: String| TlsError::Invalid { field, path: path.to_owned(), reason };
        let [cert, key, ca] = &read;
        let chain = certificates(cert).map_err(|r| invalid("certFile", &files.cert_file, r))?;
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| invalid("keyFile", &files.key_file, format!("no private key: {e}")))?;
        let key = provider.key_provider.load_private_key(key).map_err(TlsError::Rustls)?;
        let key = CertifiedKey::new(chain, key);
        key.keys_match().map_err(TlsError::Rustls)?;
        let mut roots = RootCertStore::empty();
        for ca in certificates(ca).map_err(|r| invalid("caFile", &files.ca_file, r))? {
            roots.add(ca).map_err(|e| invalid("caFile", &files.ca_file, format!("not a CA certificate: {e}")))?;
        }
        let roots = Arc::new(roots);
        let client_verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| invalid("caFile", &files.ca_file, e.to_string()))?;
        let server_verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| invalid("caFile", &files.ca_file, e.to_string()))?;
        Ok(Self { read, key: Arc::new(key), client_verifier, server_verifier })
    }
}

/// The certificates of a PEM file; at least one.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no certificate in it".to_owned());
    }
    Ok(certs)
}

impl ResolvesServerCert for PeerTls {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current().key.clone())
    }
}

impl ResolvesClientCert for PeerTls {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current().key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ClientCertVerifier for PeerTls {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional (and these could not outlive a reload): peers present their one certificate.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current().client_verifier.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms().supported_schemes()
    }
}

impl ServerCertVerifier for PeerTls {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.current().server_verifier.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms().supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use consistd_testkit::tls::{Ca, SecretVolume};

    use super::*;

    fn config(volume: &SecretVolume) -> TlsConfig {
        let files = volume.cert_files();
        TlsConfig { cert_file: files.cert, key_file: files.key, ca_file: files.ca, server_name: "consistd".to_owned() }
    }

    #[test]
    fn reload_swaps_on_change_only_and_keeps_the_old_material_when_the_new_files_are_bad() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::new("test CA");
        let first = ca.leaf("consistd", None);
        let volume =
            SecretVolume::new(dir.path(), &[("tls.crt", &first.0), ("tls.key", &first.1), ("ca.crt", ca.pem())]);
        let tls = PeerTls::load(&config(&volume)).expect("load");
        let in_use = || tls.current().key.cert[0].clone();
        let original = in_use();
        assert!(!tls.reload().expect("reload"), "unchanged files change nothing");

        // A key that belongs to another certificate: refused, naming why; the old pair stays.
        let other = ca.leaf("consistd", None);
        volume.update(&[("tls.crt", &first.0), ("tls.key", &other.1), ("ca.crt", ca.pem())]);
        let error = tls.reload().expect_err("mismatched key");
        assert!(matches!(error, TlsError::Rustls(_)), "{error:?}");
        assert_eq!(in_use(), original);

        // No certificate in the bundle: refused, naming the field.
        volume.update(&[("tls.crt", &first.0), ("tls.key", &first.1), ("ca.crt", "not a PEM")]);
        let error = tls.reload().expect_err("empty bundle");
        assert!(error.to_string().starts_with("load peer.tls.caFile"), "{error}");
        assert_eq!(in_use(), original);

        volume.update(&[("tls.crt", &other.0), ("tls.key", &other.1), ("ca.crt", ca.pem())]);
        assert!(tls.reload().expect("reload"), "a renewed pair is taken");
        assert_ne!(in_use(), original);
    }
}
