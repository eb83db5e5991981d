//! The webhook's own PKI: a CA and a serving certificate, kept in a Secret so every injector replica and
//! restart serves the same ones, renewed before they expire (a third of their life left), and the CA
//! bundle kept current in the MutatingWebhookConfiguration that the apiserver reads.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    ByteString,
    api::{admissionregistration::v1::MutatingWebhookConfiguration, core::v1::Secret},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;

/// Secret keys, as a kubernetes.io/tls Secret names them, plus the CA's key.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
/// Annotations recording what the Secret's certificates are, so they need no parsing to be judged.
const CA_NOT_AFTER: &str = "consistd.io/ca-not-after";
const CERT_NOT_AFTER: &str = "consistd.io/cert-not-after";
const CERT_NAMES: &str = "consistd.io/cert-names";
/// The CA's common name.
const CA_NAME: &str = "consistd-injector-ca";

/// Why the webhook's certificates could not be made or kept.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Generating a key or signing a certificate failed.
    #[error("{0}")]
    Generate(&'static str, #[source] rcgen::Error),
    /// The stored Secret holds something unusable.
    #[error("Secret {secret}: {message}")]
    StoredPki {
        /// namespace/name of the Secret.
        secret: String,
        /// What is wrong.
        message: String,
    },
    /// An apiserver call failed.
    #[error("{0}")]
    Apiserver(String, #[source] kube::Error),
}

/// The PEMs the webhook serves and the apiserver trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pki {
    /// The serving certificate (leaf only).
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
    /// The CA bundle for `caBundle`: the current CA, then the one before it (kept until the next rotation).
    pub ca_bundle_pem: String,
}

/// Where the PKI lives and what its certificates name.
#[derive(Debug, Clone)]
pub struct CertSettings {
    /// The Secret's namespace (the injector's own).
    pub namespace: String,
    /// The Secret's name.
    pub secret: String,
    /// DNS names and IP addresses the serving certificate names (the Service's names, and any extra).
    pub names: Vec<String>,
    /// How long a serving certificate is valid.
    pub cert_validity: Duration,
    /// How long the CA is valid.
    pub ca_validity: Duration,
}

/// Loads the PKI from its Secret, creating or renewing what is missing or due; returns what to serve.
pub async fn ensure(client: &Client, settings: &CertSettings) -> Result<Pki, CertError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let id = format!("{}/{}", settings.namespace, settings.secret);
    let read = |op: &str, e| CertError::Apiserver(format!("{op} Secret {id}"), e);
    let existing = secrets.get_opt(&settings.secret).await.map_err(|e| read("read", e))?;
    let now = OffsetDateTime::now_utc();
    let stored = existing.as_ref().map(|s| StoredPki::from_secret(s, &id)).transpose()?;
    let (next, changed) = renew(stored, settings, now)?;
    if changed {
        let mut secret = next.to_secret(settings);
        match existing {
            Some(old) => {
                // The resourceVersion makes two replicas renewing at once conflict; the loser reads again.
                secret.metadata.resource_version = old.metadata.resource_version;
                secrets
                    .replace(&settings.secret, &PostParams::default(), &secret)
                    .await
                    .map_err(|e| read("update", e))?;
            }
            None => {
                secrets.create(&PostParams::default(), &secret).await.map_err(|e| read("create", e))?;
            }
        }
        tracing::info!(secret = %id, cert_not_after = next.cert_not_after, ca_not_after = next.ca_not_after, "webhook certificates written");
    }
    Ok(next.pki())
}

/// Sets `caBundle` of every webhook in the named MutatingWebhookConfiguration; true if it changed.
pub async fn publish_ca_bundle(client: &Client, configuration: &str, bundle_pem: &str) -> Result<bool, CertError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let failed = |op: &str, e| CertError::Apiserver(format!("{op} MutatingWebhookConfiguration {configuration}"), e);
    let mut config = api.get(configuration).await.map_err(|e| failed("read", e))?;
    let bundle = ByteString(bundle_pem.as_bytes().to_vec());
    let mut changed = false;
    for webhook in config.webhooks.iter_mut().flatten() {
        if webhook.client_config.ca_bundle.as_ref() != Some(&bundle) {
            webhook.client_config.ca_bundle = Some(bundle.clone());
            changed = true;
        }
    }
    if changed {
        api.replace(configuration, &PostParams::default(), &config).await.map_err(|e| failed("update", e))?;
        tracing::info!(configuration, "caBundle updated");
    }
    Ok(changed)
}

/// What the Secret holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredPki {
    ca_cert_pem: String,
    ca_key_pem: String,
    /// The previous CA, kept in the bundle until it expires.
    previous_ca_pem: Option<String>,
    cert_pem: String,
    key_pem: String,
    /// Unix seconds.
    ca_not_after: i64,
    cert_not_after: i64,
    /// The serving certificate's names, comma-separated.
    names: String,
}

impl StoredPki {
    fn from_secret(secret: &Secret, id: &str) -> Result<Self, CertError> {
        let bad = |message: String| CertError::StoredPki { secret: id.to_owned(), message };
        let data = secret.data.clone().unwrap_or_default();
        let text = |key: &str| {
            data.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .ok_or_else(|| bad(format!("has no {key}")))
        };
        let annotations = secret.metadata.annotations.clone().unwrap_or_default();
        let seconds = |key: &str| {
            annotations
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .ok_or_else(|| bad(format!("annotation {key} missing")))
        };
        // ca.crt holds the current CA first, then the previous one while it is still trusted.
        let bundle = text(CA_CERT)?;
        let (ca_cert_pem, previous_ca_pem) = match bundle.find("-----END CERTIFICATE-----") {
            Some(end) => {
                let split = end + "-----END CERTIFICATE-----".len();
                let rest = bundle[split..].trim();
                (format!("{}\n", bundle[..split].trim()), (!rest.is_empty()).then(|| format!("{rest}\n")))
            }
            None => return Err(bad(format!("{CA_CERT} holds no certificate"))),
        };
        Ok(Self {
            ca_cert_pem,
            ca_key_pem: text(CA_KEY)?,
            previous_ca_pem,
            cert_pem: text(CERT)?,
            key_pem: text(KEY)?,
            ca_not_after: seconds(CA_NOT_AFTER)?,
            cert_not_after: seconds(CERT_NOT_AFTER)?,
            names: annotations.get(CERT_NAMES).cloned().unwrap_or_default(),
        })
    }

    fn to_secret(&self, settings: &CertSettings) -> Secret {
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        Secret {
            metadata: ObjectMeta {
                name: Some(settings.secret.clone()),
                namespace: Some(settings.namespace.clone()),
                annotations: Some(BTreeMap::from([
                    (CA_NOT_AFTER.to_owned(), self.ca_not_after.to_string()),
                    (CERT_NOT_AFTER.to_owned(), self.cert_not_after.to_string()),
                    (CERT_NAMES.to_owned(), self.names.clone()),
                ])),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(BTreeMap::from([
                (CA_CERT.to_owned(), bytes(&self.ca_bundle())),
                (CA_KEY.to_owned(), bytes(&self.ca_key_pem)),
                (CERT.to_owned(), bytes(&self.cert_pem)),
                (KEY.to_owned(), bytes(&self.key_pem)),
            ])),
            ..Secret::default()
        }
    }

    fn ca_bundle(&self) -> String {
        format!("{}{}", self.ca_cert_pem, self.previous_ca_pem.as_deref().unwrap_or_default())
    }

    fn pki(&self) -> Pki {
        Pki { cert_pem: self.cert_pem.clone(), key_pem: self.key_pem.clone(), ca_bundle_pem: self.ca_bundle() }
    }
}

/// Whether a certificate valid for `validity` and expiring at `not_after` is due for renewal at `now`:
/// less than a third of its life left.
fn due(not_after: i64, validity: Duration, now: OffsetDateTime) -> bool {
    let third = i64::try_from(validity.as_secs() / 3).unwrap_or(i64::MAX);
    not_after.saturating_sub(now.unix_timestamp()) < third
}

/// The PKI to keep: `stored` where still good, with a new CA, a new serving certificate, or both where
/// due; true when anything changed.
fn renew(
    stored: Option<StoredPki>,
    settings: &CertSettings,
    now: OffsetDateTime,
) -> Result<(StoredPki, bool), CertError> {
    let names = settings.names.join(",");
    let Some(mut pki) = stored else {
        let (ca_cert_pem, ca_key_pem, ca_not_after) = new_ca(settings.ca_validity, now)?;
        let mut pki = StoredPki {
            ca_cert_pem,
            ca_key_pem,
            previous_ca_pem: None,
            cert_pem: String::new(),
            key_pem: String::new(),
            ca_not_after,
            cert_not_after: 0,
            names,
        };
        issue(&mut pki, settings, now)?;
        return Ok((pki, true));
    };
    let mut changed = false;
    if due(pki.ca_not_after, settings.ca_validity, now) {
        let (ca_cert_pem, ca_key_pem, ca_not_after) = new_ca(settings.ca_validity, now)?;
        // The old CA stays in the bundle until the next rotation, so certificates it signed keep
        // working while every apiserver picks up the new bundle.
        pki.previous_ca_pem = Some(std::mem::replace(&mut pki.ca_cert_pem, ca_cert_pem));
        pki.ca_key_pem = ca_key_pem;
        pki.ca_not_after = ca_not_after;
        pki.cert_not_after = 0;
        changed = true;
    }
    if due(pki.cert_not_after, settings.cert_validity, now) || pki.names != names {
        pki.names = names;
        issue(&mut pki, settings, now)?;
        changed = true;
    }
    Ok((pki, changed))
}

/// A new self-signed CA: certificate PEM, key PEM, expiry (unix seconds).
fn new_ca(validity: Duration, now: OffsetDateTime) -> Result<(String, String, i64), CertError> {
    let key = KeyPair::generate().map_err(|e| CertError::Generate("generate the CA key", e))?;
    let params = ca_params(validity, now);
    let not_after = params.not_after.unix_timestamp();
    let cert = params.self_signed(&key).map_err(|e| CertError::Generate("self-sign the CA", e))?;
    Ok((cert.pem(), key.serialize_pem(), not_after))
}

fn ca_params(validity: Duration, now: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + validity;
    params
}

/// Issues a new serving certificate for `settings.names` from the stored CA.
fn issue(pki: &mut StoredPki, settings: &CertSettings, now: OffsetDateTime) -> Result<(), CertError> {
    let ca_key = KeyPair::from_pem(&pki.ca_key_pem).map_err(|e| CertError::Generate("read the CA key", e))?;
    // The same name and key as the stored CA certificate: what a signature chains to.
    let issuer = Issuer::new(ca_params(settings.ca_validity, now), ca_key);
    let mut params = CertificateParams::new(settings.names.clone())
        .map_err(|e| CertError::Generate("name the serving certificate", e))?;
    params
        .distinguished_name
        .push(DnType::CommonName, settings.names.first().map_or("consistd-injector", String::as_str));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = now - time::Duration::minutes(5);
    params.not_after =
        (now + settings.cert_validity).min(OffsetDateTime::from_unix_timestamp(pki.ca_not_after).unwrap_or(now));
    let key = KeyPair::generate().map_err(|e| CertError::Generate("generate the serving key", e))?;
    let cert = params.signed_by(&key, &issuer).map_err(|e| CertError::Generate("sign the serving certificate", e))?;
    pki.cert_not_after = params.not_after.unix_timestamp();
    pki.cert_pem = cert.pem();
    pki.key_pem = key.serialize_pem();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cert_validity: u64, ca_validity: u64) -> CertSettings {
        CertSettings {
            namespace: "ns".to_owned(),
            secret: "tls".to_owned(),
            names: vec!["consistd-injector.ns.svc".to_owned(), "127.0.0.1".to_owned()],
            cert_validity: Duration::from_secs(cert_validity),
            ca_validity: Duration::from_secs(ca_validity),
        }
    }

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + seconds).expect("a time")
    }

    #[test]
    fn certificates_are_kept_until_a_third_of_their_life_is_left() {
        let settings = settings(300, 3000);
        let (first, created) = renew(None, &settings, at(0)).expect("create");
        assert!(created);
        let (kept, changed) = renew(Some(first.clone()), &settings, at(150)).expect("check");
        assert!(!changed, "half its life left: kept");
        assert_eq!(kept, first);
        let (renewed, changed) = renew(Some(first.clone()), &settings, at(250)).expect("renew");
        assert!(changed, "a sixth of its life left: renewed");
        assert_ne!(renewed.cert_pem, first.cert_pem);
        assert_eq!(renewed.ca_cert_pem, first.ca_cert_pem, "the CA is not due");
        assert_eq!(renewed.cert_not_after, at(250 + 300).unix_timestamp());
    }

    #[test]
    fn a_rotated_ca_keeps_the_old_one_in_the_bundle_and_a_name_change_reissues() {
        let settings = settings(100, 300);
        let (first, _) = renew(None, &settings, at(0)).expect("create");
        let (rotated, changed) = renew(Some(first.clone()), &settings, at(250)).expect("rotate");
        assert!(changed);
        assert_ne!(rotated.ca_cert_pem, first.ca_cert_pem);
        assert_eq!(rotated.previous_ca_pem.as_deref(), Some(first.ca_cert_pem.as_str()));
        assert!(rotated.pki().ca_bundle_pem.starts_with(&rotated.ca_cert_pem));

        let mut more = settings.clone();
        more.names.push("injector.example".to_owned());
        let (reissued, changed) = renew(Some(rotated.clone()), &more, at(251)).expect("reissue");
        assert!(changed && reissued.cert_pem != rotated.cert_pem);
    }

    #[test]
    fn what_is_written_to_the_secret_reads_back_the_same() {
        let settings = settings(100, 300);
        let (first, _) = renew(None, &settings, at(0)).expect("create");
        let (rotated, _) = renew(Some(first), &settings, at(250)).expect("rotate");
        let secret = rotated.to_secret(&settings);
        assert_eq!(StoredPki::from_secret(&secret, "ns/tls").expect("read back"), rotated);
    }
}
