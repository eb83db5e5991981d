//! Figures a benchmark records for the charts in docs/bench (hack/bench/charts.py draws them): one JSON
//! line per point appended to the file named by `CONSISTD_BENCH_FIGURES`; nothing when it is unset.

use std::io::Write as _;

/// Where a point sits on its chart's x axis: a number (a line chart) or a label (a bar chart).
#[derive(Debug, Clone)]
pub enum X {
    /// A point on a numeric axis.
    Number(f64),
    /// A group of bars.
    Label(String),
}

impl From<usize> for X {
    fn from(n: usize) -> Self {
        #[allow(clippy::cast_precision_loss, reason = "chart coordinates")]
        Self::Number(n as f64)
    }
}

impl From<f64> for X {
    fn from(n: f64) -> Self {
        Self::Number(n)
    }
}

impl From<&str> for X {
    fn from(label: &str) -> Self {
        Self::Label(label.to_owned())
    }
}

/// Records `y` at `x` in `series` of `chart` (`chart` names the PNG; `unit` labels its y axis).
pub fn record(chart: &str, unit: &str, series: &str, x: impl Into<X>, y: f64) {
    #[allow(clippy::disallowed_methods, reason = "the benchmark harness's switch, not the daemon's environment")]
    let Some(path) = std::env::var_os("CONSISTD_BENCH_FIGURES") else { return };
    let x = match x.into() {
        X::Number(n) => serde_json::json!(n),
        X::Label(l) => serde_json::json!(l),
    };
    let line = serde_json::json!({ "chart": chart, "unit": unit, "series": series, "x": x, "y": y });
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.to_string_lossy()));
    writeln!(file, "{line}").unwrap_or_else(|e| panic!("write {}: {e}", path.to_string_lossy()));
}

/// Records the distribution of `samples` as its percentiles 0, 1, ..., 99, 99.9 and 100 (x: percentile).
pub fn record_distribution(chart: &str, unit: &str, series: &str, samples: &[f64]) {
    let sorted = sorted(samples);
    let mut at: Vec<f64> = (0..100).map(f64::from).collect();
    at.extend([99.9, 100.0]);
    for p in at {
        if let Some(y) = percentile(&sorted, p / 100.0) {
            record(chart, unit, series, p, y);
        }
    }
}

/// Records a replica barrier's times (Publish -> all applied, ms) for `replicas`: their p50 and p99.
pub fn record_barrier(replicas: usize, times_ms: &[f64]) {
    let sorted = sorted(times_ms);
    for (series, q) in [("p50", 0.5), ("p99", 0.99)] {
        if let Some(y) = percentile(&sorted, q) {
            record("barrier", "Publish -> all applied, ms", series, replicas, y);
        }
    }
}

/// The median of `samples`, or None when there are none.
pub fn median(samples: &[f64]) -> Option<f64> {
    quantile(samples, 0.5)
}

/// The sample at quantile `q` (0..=1) of `samples`, nearest rank, or None when there are none.
pub fn quantile(samples: &[f64], q: f64) -> Option<f64> {
    percentile(&sorted(samples), q)
}

fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// The sample at quantile `q` (0..=1) of sorted samples, nearest rank.
fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "an index into the sorted samples"
    )]
    let index = ((last as f64) * q).round() as usize;
    sorted.get(index).copied()
}
