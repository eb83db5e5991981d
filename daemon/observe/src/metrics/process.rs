//! The standard `process_*` metrics of the daemon itself (as client_golang's process collector names
//! them), read from /proc/self at each scrape: resident and virtual memory, open and allowed descriptors,
//! CPU seconds and start time, for dashboards and the soak test to watch for leaks.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// Clock ticks per second of /proc's CPU times (USER_HZ; 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;
/// Page size of /proc/self/stat's rss (4 KiB on the platforms the image is built for).
const PAGE_BYTES: f64 = 4096.0;

/// Reads /proc/self on each scrape.
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

/// One reading of /proc/self.
#[derive(Debug, Default, PartialEq)]
struct Reading {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    start_seconds_after_boot: f64,
    open_fds: f64,
    max_fds: f64,
}

impl Reading {
    fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let mut reading = parse_stat(&stat).unwrap_or_default();
        reading.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0.0, |d| d.count() as f64);
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        reading.max_fds = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
            .unwrap_or(0.0);
        reading
    }
}

/// The fields of /proc/self/stat the metrics need (after the command, which may hold spaces and ')').
fn parse_stat(stat: &str) -> Option<Reading> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some(Reading {
        // utime and stime are the 14th and 15th fields of the line, 12th and 13th after the command.
        cpu_seconds: (field(11)? + field(12)?) / TICKS_PER_SECOND,
        start_seconds_after_boot: field(19)? / TICKS_PER_SECOND,
        virtual_bytes: field(20)?,
        resident_bytes: field(21)? * PAGE_BYTES,
        ..Reading::default()
    })
}

/// Seconds since the epoch at which the machine booted (/proc/stat's btime).
fn boot_time() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok()).unwrap_or(0.0)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = Reading::now();
        let cpu = ConstCounter::new(r.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, value) in [
            ("process_resident_memory_bytes", "Resident memory size in bytes", r.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes", r.virtual_bytes),
            ("process_open_fds", "Number of open file descriptors", r.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors", r.max_fds),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                boot_time() + r.start_seconds_after_boot,
            ),
        ] {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_a_command_with_spaces() {
        let stat = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 1000 2000000 300 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let r = parse_stat(stat).expect("parsed");
        assert_eq!(r.cpu_seconds, 3.0);
        assert_eq!(r.start_seconds_after_boot, 10.0);
        assert_eq!(r.virtual_bytes, 2_000_000.0);
        assert_eq!(r.resident_bytes, 300.0 * 4096.0);
    }

    #[test]
    fn this_process_has_memory_and_descriptors() {
        let r = Reading::now();
        assert!(r.resident_bytes > 0.0 && r.open_fds > 0.0 && r.max_fds >= r.open_fds, "{r:?}");
    }
}
