//! `kubectl consistd handover ELECTION --to IDENTITY`: asks the election's holder to step down for another
//! candidate (the Lease's preferred holder), then waits until that candidate holds it in a new term.

use std::time::{Duration, Instant};

use clap::Args;
use consistd_core::lease::{MANAGED_BY, MANAGED_BY_LABEL, PREFERRED_HOLDER_ANNOTATION};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::api::{Api, Patch, PatchParams};

use crate::{cluster::Cluster, leases::ElectionLease};

/// How often the Lease is read while waiting.
const POLL: Duration = Duration::from_millis(100);

/// Flags of `kubectl consistd handover`.
#[derive(Debug, Args)]
pub(crate) struct HandoverArgs {
    /// The election (its Lease's name).
    pub(crate) election: String,
    /// The candidate to hand over to: its identity, as the election's holder names it (a pod's name by
    /// default).
    #[arg(long)]
    pub(crate) to: String,
    /// How long to wait for the candidate to lead; 0 asks and returns at once.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) wait: Duration,
}

/// Why the handover failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandoverError {
    /// The Lease could not be read.
    #[error("read Lease {name} in namespace {namespace}")]
    Read {
        /// The election.
        name: String,
        /// Its namespace.
        namespace: String,
        /// kube's error, with the apiserver's refusal.
        #[source]
        source: kube::Error,
    },
    /// There is no such election.
    #[error("no election {name} in namespace {namespace} (no Lease of that name)")]
    NotFound {
        /// The election.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// The Lease is not one of consistd's elections.
    #[error(
        "Lease {name} in namespace {namespace} is not a consistd election (no {MANAGED_BY_LABEL}={MANAGED_BY} label)"
    )]
    NotConsistds {
        /// The election.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// The request could not be written.
    #[error("ask for a handover of {name} to {to} (patch the Lease)")]
    Ask {
        /// The election.
        name: String,
        /// The candidate.
        to: String,
        /// kube's error, with the apiserver's refusal.
        #[source]
        source: kube::Error,
    },
    /// Another candidate took the Lease: the one asked for did not come within the lease duration.
    #[error("{to} did not take {name} (is it campaigning?): {holder} took it in term {term}")]
    Lapsed {
        /// The election.
        name: String,
        /// The candidate asked for.
        to: String,
        /// Who holds it now.
        holder: String,
        /// In which term.
        term: u64,
    },
    /// The candidate did not lead within `--wait`.
    #[error("{to} did not take {name} within {wait:?}; it is held by {holder} in term {term}")]
    TimedOut {
        /// The election.
        name: String,
        /// The candidate asked for.
        to: String,
        /// How long it waited.
        wait: Duration,
        /// Who holds it now ("nobody" when free).
        holder: String,
        /// In which term.
        term: u64,
    },
}

/// Asks for the handover and waits for it.
pub(crate) async fn run(cluster: &Cluster, args: &HandoverArgs) -> Result<(), HandoverError> {
    let api = Api::<Lease>::namespaced(cluster.client.clone(), &cluster.namespace);
    let (name, namespace) = (args.election.clone(), cluster.namespace.clone());
    let read = async || match api.get_opt(&args.election).await {
        Ok(Some(lease)) => Ok(lease),
        Ok(None) => Err(HandoverError::NotFound { name: name.clone(), namespace: namespace.clone() }),
        Err(source) => Err(HandoverError::Read { name: name.clone(), namespace: namespace.clone(), source }),
    };
    let lease = read().await?;
    let consistds =
        lease.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)).is_some_and(|v| v == MANAGED_BY);
    if !consistds {
        return Err(HandoverError::NotConsistds { name, namespace });
    }
    let before = ElectionLease::read(&lease, Timestamp::now());
    if before.holder.as_deref() == Some(args.to.as_str()) {
        println!("{} already holds {} (term {})", args.to, args.election, before.term);
        return Ok(());
    }
    // The annotation works on every apiserver; spec.preferredHolder only where the CoordinatedLeaderElection
    // feature gate keeps it (elsewhere the apiserver drops it).
    let ask = serde_json::json!({
        "metadata": { "annotations": { PREFERRED_HOLDER_ANNOTATION: args.to } },
        "spec": { "preferredHolder": args.to },
    });
    let asked = Instant::now();
    api.patch(&args.election, &PatchParams::default(), &Patch::Merge(ask))
        .await
        .map_err(|source| HandoverError::Ask { name: name.clone(), to: args.to.clone(), source })?;
    if args.wait.is_zero() {
        println!(
            "asked {} to hand {} over to {}",
            before.holder.as_deref().unwrap_or("nobody"),
            args.election,
            args.to
        );
        return Ok(());
    }
    loop {
        let now = ElectionLease::read(&read().await?, Timestamp::now());
        if now.term > before.term
            && let Some(holder) = now.holder
        {
            if holder == args.to {
                println!(
                    "{} handed over to {} in term {} ({} ms)",
                    args.election,
                    holder,
                    now.term,
                    asked.elapsed().as_millis()
                );
                return Ok(());
            }
            return Err(HandoverError::Lapsed { name, to: args.to.clone(), holder, term: now.term });
        }
        if asked.elapsed() >= args.wait {
            let holder = now.holder.unwrap_or_else(|| "nobody".to_owned());
            return Err(HandoverError::TimedOut { name, to: args.to.clone(), wait: args.wait, holder, term: now.term });
        }
        tokio::time::sleep(POLL).await;
    }
}
