//! `kubectl consistd rollout status CHANNEL`: the channel's latest version (its ConfigMap
//! `consistd-rollout.<channel>`) and which live members applied the target version, as an exit code
//! scripts can wait on.

use clap::{Args, Subcommand};
use consistd_core::versions::{Versions, VersionsError, config_map_name};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::{
    cluster::Cluster,
    leases::{AppliedBy, MEMBER_OF_LABEL, MemberLease, ago_ms},
    output::{self, Format},
};

/// Exit code when some live member has not applied the target version, or there are no live members.
pub(crate) const EXIT_LAGGING: u8 = 3;

/// `kubectl consistd rollout ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum RolloutCommand {
    /// Show which live members of a channel applied its latest (or a given) version.
    #[command(after_help = "Exit codes:\n  0  every live member applied the target version (or newer)\n  \
                            3  some live member lags behind it, or the channel has no live members\n  \
                            1  an error: the channel's ConfigMap does not exist, or the apiserver refused\n  \
                            2  usage error (bad flags or arguments)")]
    Status(StatusArgs),
}

/// Flags of `kubectl consistd rollout status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The rollout channel (its ConfigMap is consistd-rollout.<CHANNEL> in the namespace).
    pub(crate) channel: String,
    /// The version every member must have applied (default: the latest published).
    #[arg(long, value_name = "N")]
    pub(crate) version: Option<u64>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub(crate) output: Format,
}

/// Why a channel's status could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RolloutError {
    /// Reading the channel's ConfigMap failed (the apiserver refused or could not be reached, or it is malformed).
    #[error("read channel {channel} in namespace {namespace}")]
    Versions {
        /// The channel.
        channel: String,
        /// Its namespace.
        namespace: String,
        /// The daemon library's error, naming the ConfigMap.
        #[source]
        source: VersionsError,
    },
    /// The channel's ConfigMap does not exist: nothing was ever published on it here.
    #[error("channel {channel} not found: no ConfigMap {config_map} in namespace {namespace} (nothing published)")]
    NotFound {
        /// The channel.
        channel: String,
        /// `consistd-rollout.<channel>`.
        config_map: String,
        /// Where it was looked for.
        namespace: String,
    },
    /// Listing the member Leases failed.
    #[error("list member Leases of channel {channel} in namespace {namespace}")]
    Members {
        /// The channel.
        channel: String,
        /// Its namespace.
        namespace: String,
        /// kube's error, with the apiserver's refusal.
        #[source]
        source: kube::Error,
    },
    /// The result could not be written as JSON.
    #[error("write rollout status as JSON")]
    Json {
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
}

/// A channel's status, as printed (`-o json` writes it as is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Status {
    /// The namespace.
    pub(crate) namespace: String,
    /// The channel.
    pub(crate) channel: String,
    /// The ConfigMap holding its latest version.
    pub(crate) config_map: String,
    /// The latest published version.
    pub(crate) latest_version: u64,
    /// When it was published (RFC 3339, as the ConfigMap holds it).
    pub(crate) published_at: String,
    /// The version members are checked against.
    pub(crate) target_version: u64,
    /// Every live member, sorted by identity.
    pub(crate) members: Vec<Member>,
    /// At least one live member, and every one applied the target or newer.
    pub(crate) all_applied: bool,
}

/// One live member of a channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Member {
    /// Its identity.
    pub(crate) member: String,
    /// The newest version its app applied (0: none).
    pub(crate) applied: u64,
    /// Whether it is below the target.
    pub(crate) lagging: bool,
}

/// The live members of `channel` among `leases` at `now`, against `target`. What a member applied is
/// what its own Lease says, or what the channel leader's record (on the leader's member Lease) says of
/// its current run, as the daemon's barrier reads it.
fn members(leases: &[Lease], channel: &str, target: u64, now: Timestamp) -> Vec<Member> {
    let group: Vec<MemberLease> =
        MemberLease::group(leases, now).into_iter().filter(|m| m.election == channel).collect();
    let mut members: Vec<Member> = group
        .iter()
        .filter(|m| m.live)
        .map(|m| {
            let records = group.iter().map(|by| &by.applied_by);
            let applied = AppliedBy::newest(m.applied, records, &m.identity, &m.incarnation);
            Member { lagging: applied < target, member: m.identity.clone(), applied }
        })
        .collect();
    members.sort_by(|a, b| a.member.cmp(&b.member));
    members
}

/// Reads and prints the channel's status; Ok(true) when every live member applied the target.
pub(crate) async fn status(cluster: &Cluster, args: &StatusArgs) -> Result<bool, RolloutError> {
    let (channel, namespace) = (args.channel.clone(), cluster.namespace.clone());
    let latest = Versions::new(cluster.client.clone(), &namespace)
        .latest(&channel)
        .await
        .map_err(|source| RolloutError::Versions { channel: channel.clone(), namespace: namespace.clone(), source })?;
    let Some(latest) = latest else {
        return Err(RolloutError::NotFound { config_map: config_map_name(&channel), channel, namespace });
    };
    let target = args.version.unwrap_or(latest.version);
    let leases = Api::<Lease>::namespaced(cluster.client.clone(), &namespace)
        .list(&ListParams::default().labels(MEMBER_OF_LABEL))
        .await
        .map_err(|source| RolloutError::Members { channel: channel.clone(), namespace: namespace.clone(), source })?;
    let now = Timestamp::now();
    let members = members(&leases.items, &channel, target, now);
    let all_applied = !members.is_empty() && members.iter().all(|m| !m.lagging);
    let status = Status {
        config_map: config_map_name(&channel),
        namespace,
        channel,
        latest_version: latest.version,
        published_at: latest.published_at,
        target_version: target,
        members,
        all_applied,
    };
    match args.output {
        Format::Json => {
            println!("{}", serde_json::to_string_pretty(&status).map_err(|source| RolloutError::Json { source })?);
        }
        Format::Table => print!("{}", render(&status, now)),
    }
    Ok(all_applied)
}

/// The status for people: a summary line, then one row per member.
fn render(s: &Status, now: Timestamp) -> String {
    let published = match s.published_at.parse::<Timestamp>() {
        Ok(at) => format!("{} ({} ago)", s.published_at, output::age(ago_ms(at, now))),
        Err(_) => s.published_at.clone(),
    };
    let mut out = format!(
        "Channel {} in namespace {}: latest version {}, published {published}; target version {}\n",
        s.channel, s.namespace, s.latest_version, s.target_version
    );
    if s.members.is_empty() {
        out += "No live members.\n";
        return out;
    }
    let rows: Vec<Vec<String>> = s
        .members
        .iter()
        .map(|m| {
            let state = if m.lagging { "LAGGING" } else { "applied" };
            vec![m.member.clone(), m.applied.to_string(), state.to_owned()]
        })
        .collect();
    out += &output::table(&["MEMBER", "APPLIED", "STATUS"], &rows);
    let lagging = s.members.iter().filter(|m| m.lagging).count();
    if lagging == 0 {
        out += &format!("All {} live members applied version {}.\n", s.members.len(), s.target_version);
    } else {
        out += &format!("{lagging} of {} live members lag behind version {}.\n", s.members.len(), s.target_version);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leaders_record_counts_for_the_run_of_a_member_it_names() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().expect("timestamp");
        let member = |name: &str, incarnation: &str, applied_by: &str| {
            serde_json::json!({
                "metadata": {"name": format!("config.member.{name}"), "namespace": "ns",
                             "labels": {"consistd.io/member-of": "config"},
                             "annotations": {"consistd.io/election": "config", "consistd.io/member-incarnation": incarnation,
                                             "consistd.io/applied-by": applied_by}},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 3, "renewTime": "2026-01-01T00:00:59.000000Z"}
            })
        };
        // The leader's record says a (this run) and b (an earlier run) applied version 2.
        let leases: Vec<Lease> = serde_json::from_value(serde_json::json!([
            member("leader", "l1", r#"{"a":"2@a1","b":"2@b0","leader":"2@l1"}"#),
            member("a", "a1", "{}"),
            member("b", "b1", "{}"),
        ]))
        .expect("leases");
        let got = members(&leases, "config", 2, now);
        let want = vec![
            Member { member: "a".into(), applied: 2, lagging: false },
            Member { member: "b".into(), applied: 0, lagging: true },
            Member { member: "leader".into(), applied: 2, lagging: false },
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn only_live_members_of_the_channel_count_and_those_below_the_target_lag() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().expect("timestamp");
        let member = |name: &str, election: &str, applied: &str, renewed: &str| {
            serde_json::json!({
                "metadata": {"name": format!("{election}.member.{name}"), "namespace": "ns",
                             "labels": {"consistd.io/member-of": election},
                             "annotations": {"consistd.io/election": election, "consistd.io/applied-version": applied}},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 3, "renewTime": renewed}
            })
        };
        let leases: Vec<Lease> = serde_json::from_value(serde_json::json!([
            member("b", "config", "1", "2026-01-01T00:00:59.000000Z"),
            member("a", "config", "2", "2026-01-01T00:00:59.000000Z"),
            member("dead", "config", "0", "2026-01-01T00:00:00.000000Z"),
            member("other", "web", "0", "2026-01-01T00:00:59.000000Z"),
        ]))
        .expect("leases");
        let got = members(&leases, "config", 2, now);
        let want = vec![
            Member { member: "a".into(), applied: 2, lagging: false },
            Member { member: "b".into(), applied: 1, lagging: true },
        ];
        assert_eq!(got, want);
        let status = Status {
            namespace: "ns".into(),
            channel: "config".into(),
            config_map: "consistd-rollout.config".into(),
            latest_version: 2,
            published_at: "2026-01-01T00:00:30Z".into(),
            target_version: 2,
            members: got,
            all_applied: false,
        };
        assert_eq!(
            render(&status, now),
            "Channel config in namespace ns: latest version 2, published 2026-01-01T00:00:30Z (30s ago); target version 2\n\
             MEMBER   APPLIED   STATUS\n\
             a        2         applied\n\
             b        1         LAGGING\n\
             1 of 2 live members lag behind version 2.\n"
        );
    }
}
