//! `kubectl consistd queues POD`: a pod's reconcile queues (what is ready, held back for consistency,
//! waiting, leased), read from its sidecar's admin port through the apiserver's pod proxy (`sidecar`).

use consistd_core::report::QueuesReport;

use crate::{
    cluster::Cluster,
    output::{Format, table},
    sidecar::{self, SidecarError},
};

/// `kubectl consistd queues POD`.
#[derive(Debug, clap::Args)]
pub(crate) struct QueuesArgs {
    /// The pod whose consistd sidecar to ask.
    pub(crate) pod: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub(crate) output: Format,
}

/// Reads and prints the reconcile queues of `args.pod`.
pub(crate) async fn run(cluster: &Cluster, args: &QueuesArgs) -> Result<(), SidecarError> {
    let report: QueuesReport = sidecar::read(cluster, &args.pod, "/queues").await?;
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default()),
        Format::Table => print!("{}", render(&report)),
    }
    Ok(())
}

/// The queues as a table: one row each, as client-go's workqueue metrics count them.
fn render(report: &QueuesReport) -> String {
    if report.queues.is_empty() {
        return "No reconcile queues.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = report
        .queues
        .iter()
        .map(|q| {
            vec![
                q.name.clone(),
                q.depth.to_string(),
                q.held.to_string(),
                q.waiting.to_string(),
                q.leased.to_string(),
                q.keys.to_string(),
                q.streams.to_string(),
                if q.active { "yes" } else { "no (not leader)" }.to_owned(),
                q.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(&["NAME", "READY", "HELD", "WAITING", "LEASED", "KEYS", "STREAMS", "ACTIVE", "LAST ERROR"], &rows)
}

#[cfg(test)]
mod tests {
    use consistd_core::report::QueueReport;

    use super::*;

    #[test]
    fn the_table_shows_each_queue_and_its_last_error() {
        let queue = QueueReport {
            name: "work".into(),
            streams: 2,
            depth: 3,
            held: 1,
            waiting: 4,
            leased: 2,
            keys: 10,
            active: false,
            last_error: Some("ns/a: boom".into()),
        };
        let text = render(&QueuesReport { queues: vec![queue] });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("NAME   READY   HELD   WAITING   LEASED   KEYS   STREAMS"), "{text}");
        assert!(
            lines[1].starts_with("work   3       1      4         2        10     2         no (not leader)"),
            "{text}"
        );
        assert!(lines[1].ends_with("ns/a: boom"), "{text}");
        assert_eq!(render(&QueuesReport { queues: vec![] }), "No reconcile queues.\n");
    }
}
