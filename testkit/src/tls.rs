//! A throwaway PKI for peer mutual TLS: CAs and certificates for the server name daemons check, written
//! as PEM files the way a cert-manager Secret is mounted, and updated the way kubelet's atomic writer
//! updates a Secret volume.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

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
        let (cert, key) = self.leaf(server_name, None);
        let files = CertFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key"), ca: dir.join("ca.crt") };
        for (path, pem) in [(&files.cert, cert), (&files.key, key), (&files.ca, self.pem.clone())] {
            std::fs::write(path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
        files
    }

    /// A certificate for `server_name` (valid as server and client) and its key, as PEM; valid from a
    /// minute ago for `valid_for` from now (rcgen's default, decades, when None).
    pub fn leaf(&self, server_name: &str, valid_for: Option<Duration>) -> (String, String) {
        let mut params =
            CertificateParams::new(vec![server_name.to_owned()]).unwrap_or_else(|e| panic!("cert params: {e}"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        if let Some(valid_for) = valid_for {
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - Duration::from_secs(60);
            params.not_after = now + valid_for;
        }
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("cert key: {e}"));
        let cert = params.signed_by(&key, &self.issuer).unwrap_or_else(|e| panic!("sign cert: {e}"));
        (cert.pem(), key.serialize_pem())
    }

    /// The CA's certificate as PEM (concatenate several for a bundle).
    pub fn pem(&self) -> &str {
        &self.pem
    }
}

/// A directory kept like a Secret or ConfigMap volume: the files are links into `..data`, itself a link to a
/// timestamped directory; an update writes a new directory and swaps `..data` with one rename, so a
/// reader sees all old files or all new ones (kubelet's atomic writer).
#[derive(Debug)]
pub struct SecretVolume {
    dir: PathBuf,
    generation: AtomicUsize,
}

impl SecretVolume {
    /// A volume in `dir` (created) holding `files` (name, contents).
    pub fn new(dir: &Path, files: &[(&str, &str)]) -> Self {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let volume = Self { dir: dir.to_owned(), generation: AtomicUsize::new(0) };
        volume.update(files);
        volume
    }

    /// The path of file `name` in the volume, as a pod sees it.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The `peer.tls` files of a volume holding tls.crt, tls.key and ca.crt.
    pub fn cert_files(&self) -> CertFiles {
        CertFiles { cert: self.path("tls.crt"), key: self.path("tls.key"), ca: self.path("ca.crt") }
    }

    /// Replaces every file at once, as kubelet does when the Secret changes.
    pub fn update(&self, files: &[(&str, &str)]) {
        let fail = |what: &str, e: std::io::Error| panic!("{what} in {}: {e}", self.dir.display());
        let generation = self.generation.fetch_add(1, Ordering::SeqCst);
        let name = format!("..2026_11_23_00_00_00.{generation}");
        let data = self.dir.join(&name);
        std::fs::create_dir(&data).unwrap_or_else(|e| fail("create the data directory", e));
        for (file, contents) in files {
            std::fs::write(data.join(file), contents).unwrap_or_else(|e| fail("write a file", e));
        }
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp).unwrap_or_else(|e| fail("link ..data_tmp", e));
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap_or_else(|e| fail("swap ..data", e));
        for (file, _) in files {
            let link = self.dir.join(file);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(file), &link)
                    .unwrap_or_else(|e| fail("link a file", e));
            }
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap_or_else(|e| fail("remove the old data", e));
        }
    }
}
