//! `kubectl consistd outbox POD`: what a pod's sidecar has not had ACKed yet, per destination and peer,
//! read from its admin port through the apiserver's pod proxy (`sidecar`).

use consistd_core::report::OutboxReport;

use crate::{
    cluster::Cluster,
    output::{Format, table},
    sidecar::{self, SidecarError},
};

/// `kubectl consistd outbox POD`.
#[derive(Debug, clap::Args)]
pub(crate) struct OutboxArgs {
    /// The pod whose consistd sidecar to ask.
    pub(crate) pod: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub(crate) output: Format,
}

/// Reads and prints the outbox of `args.pod`.
pub(crate) async fn run(cluster: &Cluster, args: &OutboxArgs) -> Result<(), SidecarError> {
    let report: OutboxReport = sidecar::read(cluster, &args.pod, "/outbox").await?;
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default()),
        Format::Table => print!("{}", render(&report)),
    }
    Ok(())
}

/// The report as a table, then a summary line.
fn render(report: &OutboxReport) -> String {
    let rows: Vec<Vec<String>> = report
        .peers
        .iter()
        .map(|p| {
            let peer = if p.peer.is_empty() { "<no member yet>".to_owned() } else { p.peer.clone() };
            let connected = if p.connected { "yes" } else { "no" };
            vec![p.destination.clone(), peer, connected.to_owned(), p.pending.to_string()]
        })
        .collect();
    let mut out = table(&["DESTINATION", "PEER", "CONNECTED", "NOT ACKED"], &rows);
    out += &format!("{} message(s) held by the outbox.\n", report.pending);
    out
}

#[cfg(test)]
mod tests {
    use consistd_core::report::PeerReport;

    use super::*;

    #[test]
    fn the_table_names_each_peer_and_what_it_has_not_acked() {
        let peer = |destination: &str, peer: &str, connected, pending| PeerReport {
            destination: destination.to_owned(),
            peer: peer.to_owned(),
            connected,
            pending,
        };
        let report = OutboxReport {
            pending: 2,
            peers: vec![peer("service ns/web", "10.0.0.1:7070", true, 0), peer("service ns/web", "", false, 0)],
        };
        let out = render(&report);
        assert_eq!(
            out,
            "DESTINATION      PEER              CONNECTED   NOT ACKED\n\
             service ns/web   10.0.0.1:7070     yes         0\n\
             service ns/web   <no member yet>   no          0\n\
             2 message(s) held by the outbox.\n"
        );
    }
}
