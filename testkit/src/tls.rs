//! A throwaway PKI for peer mutual TLS: one CA and certificates for the server name daemons check,
//! written as PEM files the way a cert-manager Secret is mounted.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// PEM files of one daemon's certificate.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// tls.crt
    pub cert: PathBuf,
    /// tls.key
    pub key: PathBuf,
    /// ca.crt
    pub ca: PathBuf,
}

impl CertFiles {
    /// The `peer.tls` config block for these files.
    pub fn yaml(&self, server_name: &str) -> String {
        format!(
            "  tls:\n    certFile: {}\n    keyFile: {}\n    caFile: {}\n    serverName: {server_name}\n",
            self.cert.display(),
            self.key.display(),
            self.ca.display()
        )
    }
}

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("CA params: {e}"));
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let cert = params.self_signed(&key).unwrap_or_else(|e| panic!("self-sign CA: {e}"));
        Self { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// Writes a certificate for `server_name` (valid as server and client) and this CA into `dir`.
    pub fn issue(&self, server_name: &str, dir: &Path) -> CertFiles {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let mut params =
            CertificateParams::new(vec![server_name.to_owned()]).unwrap_or_else(|e| panic!("cert params: {e}"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("cert key: {e}"));
        let cert = params.signed_by(&key, &self.issuer).unwrap_or_else(|e| panic!("sign cert: {e}"));
        let files = CertFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key"), ca: dir.join("ca.crt") };
        for (path, pem) in [(&files.cert, cert.pem()), (&files.key, key.serialize_pem()), (&files.ca, self.pem.clone())]
        {
            std::fs::write(path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
        files
    }
}
