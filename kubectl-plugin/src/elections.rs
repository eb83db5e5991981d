//! `kubectl consistd elections`: one row per election Lease with its holder, fencing term, last renewal
//! and how many live members its group has.

use std::collections::BTreeMap;

use clap::Args;
use consistd_core::lease::{MANAGED_BY, MANAGED_BY_LABEL};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::{
    cluster::Cluster,
    leases::{ElectionLease, MemberLease, ago_ms, is_member},
    output::{self, Format},
};

/// Flags of `kubectl consistd elections`.
#[derive(Debug, Args)]
pub(crate) struct ElectionsArgs {
    /// List elections in every namespace (adds a NAMESPACE column).
    #[arg(short = 'A', long)]
    pub(crate) all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub(crate) output: Format,
}

/// Why the elections could not be listed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ElectionsError {
    /// The apiserver refused the list (RBAC: list leases.coordination.k8s.io) or could not be reached.
    #[error("list Leases in {scope}")]
    List {
        /// "namespace NS" or "all namespaces".
        scope: String,
        /// kube's error, with the apiserver's refusal.
        #[source]
        source: kube::Error,
    },
    /// The result could not be written as JSON.
    #[error("write elections as JSON")]
    Json {
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
}

/// One election, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    /// The Lease's namespace.
    pub(crate) namespace: String,
    /// The election's name.
    pub(crate) election: String,
    /// The live holder; null when none.
    pub(crate) holder: Option<String>,
    /// The fencing term (leaseTransitions + 1).
    pub(crate) term: u64,
    /// Seconds since the last renewal; null when never renewed.
    pub(crate) renewed: Option<u64>,
    /// Live member Leases of the election's group.
    pub(crate) members: usize,
}

/// The rows for these Leases (consistd's) at `now`: every Lease that is not a member Lease, sorted by
/// namespace and name.
pub(crate) fn rows(leases: &[Lease], now: Timestamp) -> Vec<Row> {
    let mut members: BTreeMap<(String, String), usize> = BTreeMap::new();
    for member in MemberLease::group(leases, now).into_iter().filter(|m| m.live) {
        *members.entry((member.namespace, member.election)).or_default() += 1;
    }
    let mut rows: Vec<Row> = leases
        .iter()
        .filter(|l| !is_member(l))
        .map(|l| {
            let e = ElectionLease::read(l, now);
            let members = members.get(&(e.namespace.clone(), e.election.clone())).copied().unwrap_or(0);
            Row {
                renewed: e.renewed.map(|at| ago_ms(at, now) / 1000),
                members,
                namespace: e.namespace,
                election: e.election,
                holder: e.holder,
                term: e.term,
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.election).cmp(&(&b.namespace, &b.election)));
    rows
}

/// Lists and prints the elections.
pub(crate) async fn run(cluster: &Cluster, args: &ElectionsArgs) -> Result<(), ElectionsError> {
    let (api, scope) = if args.all_namespaces {
        (Api::<Lease>::all(cluster.client.clone()), "all namespaces".to_owned())
    } else {
        (
            Api::<Lease>::namespaced(cluster.client.clone(), &cluster.namespace),
            format!("namespace {}", cluster.namespace),
        )
    };
    // consistd's Leases only: not the nodes', the control plane's or other apps' elections.
    let consistd = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let list = api.list(&consistd).await.map_err(|source| ElectionsError::List { scope, source })?;
    let rows = rows(&list.items, Timestamp::now());
    match args.output {
        Format::Json => {
            let json = serde_json::to_string_pretty(&rows).map_err(|source| ElectionsError::Json { source })?;
            println!("{json}");
        }
        Format::Table if rows.is_empty() => {
            if args.all_namespaces {
                eprintln!("No elections found.");
            } else {
                eprintln!("No elections found in {} namespace.", cluster.namespace);
            }
        }
        Format::Table => print!("{}", table(&rows, args.all_namespaces)),
    }
    Ok(())
}

/// The rows as a table; with a NAMESPACE column for `-A`.
fn table(rows: &[Row], namespaces: bool) -> String {
    let mut header = vec!["ELECTION", "HOLDER", "TERM", "RENEWED", "MEMBERS"];
    if namespaces {
        header.insert(0, "NAMESPACE");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.election.clone(),
                r.holder.clone().unwrap_or_else(|| "<none>".to_owned()),
                r.term.to_string(),
                r.renewed.map_or_else(|| "<unknown>".to_owned(), |s| output::age(s * 1000)),
                r.members.to_string(),
            ];
            if namespaces {
                cells.insert(0, r.namespace.clone());
            }
            cells
        })
        .collect();
    output::table(&header, &cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_leases_are_counted_for_their_election_not_listed() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().expect("timestamp");
        let leases: Vec<Lease> = serde_json::from_value(serde_json::json!([
            {"metadata": {"name": "web", "namespace": "b"},
             "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "2026-01-01T00:00:55.000000Z", "leaseTransitions": 1}},
            {"metadata": {"name": "web.member.a", "namespace": "b", "labels": {"consistd.io/member-of": "web"},
                          "annotations": {"consistd.io/election": "web"}},
             "spec": {"holderIdentity": "a", "leaseDurationSeconds": 30, "renewTime": "2026-01-01T00:00:50.000000Z"}},
            {"metadata": {"name": "web.member.gone", "namespace": "b", "labels": {"consistd.io/member-of": "web"},
                          "annotations": {"consistd.io/election": "web"}},
             "spec": {"holderIdentity": "gone", "leaseDurationSeconds": 3, "renewTime": "2026-01-01T00:00:00.000000Z"}},
            {"metadata": {"name": "old", "namespace": "a"},
             "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15, "renewTime": "2026-01-01T00:00:00.000000Z"}}
        ]))
        .expect("leases");
        let rows = rows(&leases, now);
        let want = vec![
            Row { namespace: "a".into(), election: "old".into(), holder: None, term: 1, renewed: Some(60), members: 0 },
            Row {
                namespace: "b".into(),
                election: "web".into(),
                holder: Some("a".into()),
                term: 2,
                renewed: Some(5),
                members: 1,
            },
        ];
        assert_eq!(rows, want);
        assert_eq!(
            table(&rows, true),
            "NAMESPACE   ELECTION   HOLDER   TERM   RENEWED   MEMBERS\n\
             a           old        <none>   1      60s       0\n\
             b           web        a        2      5s        1\n"
        );
    }
}
