//! `kubectl consistd queues POD`: a pod's reconcile queues (what is ready, held back for consistency,
//! waiting, leased; for a sharded queue, which slots of its ring each member owns and the ring's epoch), read
//! from its sidecar's admin port through the apiserver's pod proxy (`sidecar`).

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

/// The queues as a table: one row each, as client-go's workqueue metrics count them; then each sharded
/// queue's ring, member by member.
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
                match (&q.ring, q.active) {
                    (Some(_), true) => "yes (its slots)",
                    (Some(_), false) => "no (holds no slot)",
                    (None, true) => "yes",
                    (None, false) => "no (not leader)",
                }
                .to_owned(),
                q.ring.as_ref().map_or("-".to_owned(), |r| format!("{}/{}", r.owned, r.slots)),
                q.ring.as_ref().map_or("-".to_owned(), |r| r.epoch.to_string()),
                q.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = table(
        &["NAME", "READY", "HELD", "WAITING", "LEASED", "KEYS", "STREAMS", "ACTIVE", "SLOTS", "EPOCH", "LAST ERROR"],
        &rows,
    );
    let owners: Vec<Vec<String>> = report
        .queues
        .iter()
        .filter_map(|q| q.ring.as_ref().map(|r| (q, r)))
        .flat_map(|(q, r)| {
            let moving = format!("{} moving, {} unowned", r.moving, r.unowned);
            r.members.iter().map(move |(member, slots)| {
                vec![q.name.clone(), r.ring.clone(), member.clone(), slots.to_string(), moving.clone()]
            })
        })
        .collect();
    if !owners.is_empty() {
        out += "\n";
        out += &table(&["QUEUE", "RING", "MEMBER", "SLOTS", "RING STATE"], &owners);
    }
    out
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
            ring: None,
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

    #[test]
    fn a_sharded_queue_shows_its_slots_its_epoch_and_who_owns_what() {
        let ring = consistd_core::report::RingState {
            ring: "ns/web.ring.work".into(),
            slots: 1024,
            owned: 512,
            members: [("pod-a".to_owned(), 512), ("pod-b".to_owned(), 512)].into(),
            epoch: 1_700_000_000_001,
            moving: 3,
            ..Default::default()
        };
        let queue = QueueReport { name: "work".into(), active: true, ring: Some(ring), ..QueueReport::default() };
        let text = render(&QueuesReport { queues: vec![queue] });
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].contains("yes (its slots)") && lines[1].contains("512/1024") && lines[1].contains("1700000000001"),
            "{text}"
        );
        assert!(lines[3].starts_with("QUEUE   RING               MEMBER   SLOTS"), "{text}");
        assert!(lines[4].starts_with("work    ns/web.ring.work   pod-a    512     3 moving, 0 unowned"), "{text}");
        assert!(lines[5].contains("pod-b"), "{text}");
    }
}
