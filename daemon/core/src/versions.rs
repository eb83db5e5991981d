//! A channel's versions, kept in the cluster: the ConfigMap `consistd-rollout.<channel>` holds the
//! latest version, its payload and when it was published. The next version is written with the
//! read's resourceVersion as a precondition, so two writers (a leader and one that lost its Lease
//! without knowing yet) can never hand out the same version, and a new leader continues from the last.
//! A guarded publish's claim is kept with its version, and the ConfigMap keeps the newest term each
//! election has published in: checked in that same compare-and-swap, a publish guarded by an older term
//! is refused, however late it arrives.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::ConfigMap};
use kube::api::{Api, PostParams};

use crate::claim::Claim;

/// Label on every channel ConfigMap.
pub const CHANNEL_LABEL: &str = "consistd.io/rollout-channel";
/// The data key of the newest term each election has published in: one line per election, `<lease
/// namespace>/<lease name> <term>`.
const NEWEST_TERMS: &str = "newestTerms";
/// How many times a conflicting write is retried before the allocation gives up.
const MAX_CONFLICTS: usize = 50;

/// One published version of a channel, as its ConfigMap holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Strictly increasing per channel, from 1.
    pub version: u64,
    /// The publisher's bytes, unchanged (the ConfigMap's `binaryData.payload`).
    pub payload: Vec<u8>,
    /// Its MIME type.
    pub content_type: String,
    /// When it was published (RFC 3339).
    pub published_at: String,
    /// The claim of the guarded Publish that made it; None for an unguarded one.
    pub claim: Option<Claim>,
}

/// Why a version could not be assigned or read.
#[derive(Debug, thiserror::Error)]
pub enum VersionsError {
    /// The apiserver refused or could not be reached.
    #[error("{op} {name}")]
    Apiserver {
        /// The step: "read channel ConfigMap" or "write channel ConfigMap".
        op: &'static str,
        /// The ConfigMap's name, `consistd-rollout.<channel>`.
        name: String,
        /// kube's error: the apiserver's refusal, or why it could not be reached.
        #[source]
        source: kube::Error,
    },
    /// Other writers won `MAX_CONFLICTS` (50) writes in a row, each a 409 on the resourceVersion precondition.
    #[error("assign the next version of channel {channel}: {MAX_CONFLICTS} conflicting writes in a row")]
    Contended {
        /// The channel whose next version could not be written.
        channel: String,
    },
    /// A guarded publish whose election has published on the channel in a later term: refused.
    #[error("channel {channel}: {why}")]
    Fenced {
        /// The channel.
        channel: String,
        /// Both terms: the election's newest on the channel, and the publish's.
        why: String,
    },
    /// The ConfigMap exists but does not hold a version.
    #[error("channel ConfigMap {name} is malformed: {why}")]
    Malformed {
        /// The ConfigMap's name, `consistd-rollout.<channel>`.
        name: String,
        /// What it lacks, e.g. "data.version is not a number".
        why: String,
    },
}

/// The versions of channels in one namespace.
#[derive(Clone)]
pub struct Versions {
    api: Api<ConfigMap>,
}

impl std::fmt::Debug for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Versions").finish_non_exhaustive()
    }
}

/// The ConfigMap that holds `channel`'s latest version.
pub fn config_map_name(channel: &str) -> String {
    format!("consistd-rollout.{channel}")
}

impl Versions {
    /// Channels whose ConfigMaps live in `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self { api: Api::namespaced(client, namespace) }
    }

    /// The latest version of `channel`, None before the first publish. Read from the apiserver.
    pub async fn latest(&self, channel: &str) -> Result<Option<Version>, VersionsError> {
        let name = config_map_name(channel);
        let found = self.api.get_opt(&name).await.map_err(|source| VersionsError::Apiserver {
            op: "read channel ConfigMap",
            name: name.clone(),
            source,
        })?;
        found.map(|cm| decode(&name, &cm)).transpose()
    }

    /// Stores `payload` as the next version of `channel` and returns it. A `claim` older than the newest term
    /// its election published in on the channel is refused ([`VersionsError::Fenced`]), in the same write.
    pub async fn publish(
        &self,
        channel: &str,
        payload: Vec<u8>,
        content_type: &str,
        claim: Option<&Claim>,
    ) -> Result<Version, VersionsError> {
        let name = config_map_name(channel);
        for attempt in 0..MAX_CONFLICTS {
            let current = self.api.get_opt(&name).await.map_err(|source| VersionsError::Apiserver {
                op: "read channel ConfigMap",
                name: name.clone(),
                source,
            })?;
            let previous = current.as_ref().map(|cm| decode(&name, cm)).transpose()?.map_or(0, |v| v.version);
            let mut terms = current.as_ref().map(newest_terms).unwrap_or_default();
            if let Some(claim) = claim {
                let newest = terms.entry(claim.election()).or_insert(0);
                let seen = format!("published on channel {channel}");
                if let Some(why) = claim.older_than(*newest, &seen) {
                    return Err(VersionsError::Fenced { channel: channel.to_owned(), why });
                }
                *newest = claim.term;
            }
            let next = Version {
                version: previous + 1,
                payload: payload.clone(),
                content_type: content_type.to_owned(),
                published_at: k8s_openapi::jiff::Timestamp::now().to_string(),
                claim: claim.cloned(),
            };
            let mut cm = encode(&name, channel, &next, &terms);
            let written = match &current {
                // The read's resourceVersion is the precondition: a concurrent writer makes this a 409.
                Some(existing) => {
                    cm.metadata.resource_version = existing.metadata.resource_version.clone();
                    self.api.replace(&name, &PostParams::default(), &cm).await
                }
                None => self.api.create(&PostParams::default(), &cm).await,
            };
            match written {
                Ok(_) => return Ok(next),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tracing::debug!(channel, attempt, "version write conflicted; reading again");
                    tokio::time::sleep(Duration::from_millis(rand::random_range(0..5))).await;
                }
                Err(source) => {
                    return Err(VersionsError::Apiserver { op: "write channel ConfigMap", name, source });
                }
            }
        }
        Err(VersionsError::Contended { channel: channel.to_owned() })
    }
}

fn encode(name: &str, channel: &str, v: &Version, terms: &BTreeMap<String, u64>) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_owned());
    let label = if channel.len() <= 63 { channel.to_owned() } else { String::new() };
    cm.metadata.labels = Some([(CHANNEL_LABEL.to_owned(), label)].into());
    let mut data: BTreeMap<String, String> = [
        ("channel".to_owned(), channel.to_owned()),
        ("version".to_owned(), v.version.to_string()),
        ("contentType".to_owned(), v.content_type.clone()),
        ("publishedAt".to_owned(), v.published_at.clone()),
    ]
    .into();
    if let Some(claim) = &v.claim {
        data.insert("claim".to_owned(), claim.to_string());
    }
    if !terms.is_empty() {
        let lines: Vec<String> = terms.iter().map(|(election, term)| format!("{election} {term}")).collect();
        data.insert(NEWEST_TERMS.to_owned(), lines.join("\n"));
    }
    cm.data = Some(data);
    cm.binary_data = Some([("payload".to_owned(), ByteString(v.payload.clone()))].into());
    cm
}

fn decode(name: &str, cm: &ConfigMap) -> Result<Version, VersionsError> {
    let malformed = |why: &str| VersionsError::Malformed { name: name.to_owned(), why: why.to_owned() };
    let data = cm.data.as_ref().ok_or_else(|| malformed("no data"))?;
    let version = data
        .get("version")
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| malformed("data.version is not a number"))?;
    let payload = cm.binary_data.as_ref().and_then(|b| b.get("payload")).map(|b| b.0.clone()).unwrap_or_default();
    let claim = data
        .get("claim")
        .map(|c| Claim::parse(c))
        .transpose()
        .map_err(|why| malformed(&format!("data.claim: {why}")))?;
    Ok(Version {
        version,
        payload,
        content_type: data.get("contentType").cloned().unwrap_or_default(),
        published_at: data.get("publishedAt").cloned().unwrap_or_default(),
        claim,
    })
}

/// The newest term each election published in, from the ConfigMap's `newestTerms` (lines that do not read
/// are skipped: the next guarded publish of that election writes its line again).
fn newest_terms(cm: &ConfigMap) -> BTreeMap<String, u64> {
    let lines = cm.data.as_ref().and_then(|d| d.get(NEWEST_TERMS)).map(String::as_str).unwrap_or_default();
    lines
        .lines()
        .filter_map(|line| {
            let (election, term) = line.split_once(' ')?;
            Some((election.to_owned(), term.parse().ok()?))
        })
        .collect()
}
