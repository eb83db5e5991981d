//! The two text formats /metrics serves and how a scraper's `Accept` header picks one: OpenMetrics, which
//! prometheus-client writes, or the Prometheus text format 0.0.4 derived from it, which promtool and
//! scrapers that do not ask for OpenMetrics read.

/// A text exposition format /metrics can answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exposition {
    /// OpenMetrics 1.0.0 text: what Prometheus asks for first.
    OpenMetrics,
    /// The Prometheus text format 0.0.4: the default, as in client_golang's `expfmt.Negotiate`.
    PrometheusText,
}

impl Exposition {
    /// The `Content-Type` of a body in this format.
    pub(super) fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// The format an `Accept` header prefers: its media ranges by descending q (ties in the order given),
    /// the first that is `application/openmetrics-text` (version 1.0.0, 0.0.1 or none) or `text/plain`
    /// decides. Anything else, wildcards included (curl sends `*/*`), or no header gets the Prometheus
    /// text format, the format every Prometheus version and promtool read.
    pub(super) fn negotiate(accept: Option<&str>) -> Self {
        let mut ranges: Vec<(f32, Option<Self>)> = accept.unwrap_or_default().split(',').map(media_range).collect();
        // Stable: among equal q the header's order stands.
        ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranges.into_iter().filter(|(q, _)| *q > 0.0).find_map(|(_, format)| format).unwrap_or(Self::PrometheusText)
    }
}

/// One media range of an `Accept` header: its q (1 when absent, 0 when unreadable) and the format it
/// names, if any.
fn media_range(range: &str) -> (f32, Option<Exposition>) {
    let mut parts = range.split(';').map(str::trim);
    let media_type = parts.next().unwrap_or_default().to_ascii_lowercase();
    let (mut q, mut version) = (1.0, None);
    for (key, value) in parts.filter_map(|param| param.split_once('=')) {
        let value = value.trim().trim_matches('"');
        match key.trim().to_ascii_lowercase().as_str() {
            "q" => q = value.parse().unwrap_or(0.0),
            "version" => version = Some(value),
            _ => {}
        }
    }
    let format = match media_type.as_str() {
        // The body is OpenMetrics 1.0.0, which 0.0.1 readers parse the same way; 2.0.0 is another format.
        "application/openmetrics-text" if matches!(version, None | Some("1.0.0" | "0.0.1")) => {
            Some(Exposition::OpenMetrics)
        }
        // Text 1.0.0 only adds quoted UTF-8 names; consistd's names need none, so a 0.0.4 body is valid 1.0.0.
        "text/plain" => Some(Exposition::PrometheusText),
        _ => None,
    };
    (q, format)
}

/// The Prometheus text format 0.0.4 of prometheus-client's OpenMetrics text: `# EOF` and `# UNIT` lines
/// dropped, counter families named by their `_total` samples, info families typed as gauges named by
/// their `_info` samples, `unknown` types `untyped`, exemplars cut from samples. HELP text is copied as
/// is: prometheus-client writes it unescaped.
pub(super) fn prometheus_text(openmetrics: &str) -> String {
    let mut text = String::with_capacity(openmetrics.len());
    // prometheus-client writes a family's HELP line just before its TYPE line, which renames it.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let (suffix, kind) = match kind {
                "counter" => ("_total", "counter"),
                "info" => ("_info", "gauge"),
                "unknown" => ("", "untyped"),
                other => ("", other),
            };
            if let Some((help_name, help_text)) = help.take().filter(|(help_name, _)| *help_name == name) {
                text.push_str(&format!("# HELP {help_name}{suffix} {help_text}\n"));
            }
            text.push_str(&format!("# TYPE {name}{suffix} {kind}\n"));
        } else if line != "# EOF" && !line.starts_with("# UNIT ") {
            text.push_str(without_exemplar(line));
            text.push('\n');
        }
    }
    text
}

/// A sample line without its exemplar (` # {labels} value [timestamp]` after the value), which only
/// OpenMetrics has. Label values may hold `#`, `}` and escaped quotes, so the label set is skipped first.
fn without_exemplar(line: &str) -> &str {
    let mut labels_end = 0;
    if let Some(open) = line.find('{').filter(|open| !line[..*open].contains(' ')) {
        let (mut quoted, mut escaped) = (false, false);
        for (i, c) in line[open..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => quoted = !quoted,
                '}' if !quoted => {
                    labels_end = open + i;
                    break;
                }
                _ => {}
            }
        }
    }
    match line[labels_end..].find(" # ") {
        Some(at) => &line[..labels_end + at],
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Accept header Prometheus 3 scrapes with by default (scrape.acceptHeader over
    /// config.DefaultScrapeProtocols, with its default escaping).
    const PROMETHEUS_3: &str = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.7,\
        application/openmetrics-text;version=0.0.1;q=0.6,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,\
        text/plain;version=0.0.4;q=0.4,*/*;q=0.3";

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_the_text_format() {
        assert_eq!(Exposition::negotiate(Some(PROMETHEUS_3)), Exposition::OpenMetrics);
        assert_eq!(Exposition::negotiate(Some("application/openmetrics-text")), Exposition::OpenMetrics);
        // Prometheus 2's header, before OpenMetrics 1.0.0.
        let prometheus_2 = "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Exposition::negotiate(Some(prometheus_2)), Exposition::OpenMetrics);
        for accept in [None, Some(""), Some("*/*"), Some("text/plain"), Some("text/plain;version=0.0.4"), Some("foo")] {
            assert_eq!(Exposition::negotiate(accept), Exposition::PrometheusText, "{accept:?}");
        }
    }

    #[test]
    fn the_highest_q_decides_and_refused_or_unknown_versions_do_not_count() {
        let prefers_text = "application/openmetrics-text;q=0.5, text/plain;version=0.0.4";
        assert_eq!(Exposition::negotiate(Some(prefers_text)), Exposition::PrometheusText);
        let equal = "application/openmetrics-text, text/plain";
        assert_eq!(Exposition::negotiate(Some(equal)), Exposition::OpenMetrics);
        assert_eq!(Exposition::negotiate(Some("application/openmetrics-text;q=0")), Exposition::PrometheusText);
        let v2 = "application/openmetrics-text;version=2.0.0";
        assert_eq!(Exposition::negotiate(Some(v2)), Exposition::PrometheusText);
    }

    #[test]
    fn openmetrics_becomes_the_prometheus_text_format() {
        let openmetrics = "# HELP consistd_build The consistd version running.\n\
            # TYPE consistd_build info\n\
            consistd_build_info{version=\"0.1.0\"} 1\n\
            # HELP consistd_api_calls Calls on the app socket, per caller uid.\n\
            # TYPE consistd_api_calls counter\n\
            consistd_api_calls_total{uid=\"0\"} 3\n\
            consistd_api_calls_total{uid=\"a}# \\\" # {b\"} 1 # {trace_id=\"x\"} 1.0\n\
            # HELP consistd_lag_seconds Lag.\n\
            # TYPE consistd_lag_seconds histogram\n\
            # UNIT consistd_lag_seconds seconds\n\
            consistd_lag_seconds_sum 0.5\n\
            consistd_lag_seconds_count 1\n\
            consistd_lag_seconds_bucket{le=\"+Inf\"} 1 # {id=\"1\"} 0.5 1700000000.0\n\
            # HELP consistd_up 1 while up.\n\
            # TYPE consistd_up gauge\n\
            consistd_up 1\n\
            # TYPE consistd_other unknown\n\
            consistd_other 2\n\
            # EOF\n";
        let text = prometheus_text(openmetrics);
        assert_eq!(
            text,
            "# HELP consistd_build_info The consistd version running.\n\
            # TYPE consistd_build_info gauge\n\
            consistd_build_info{version=\"0.1.0\"} 1\n\
            # HELP consistd_api_calls_total Calls on the app socket, per caller uid.\n\
            # TYPE consistd_api_calls_total counter\n\
            consistd_api_calls_total{uid=\"0\"} 3\n\
            consistd_api_calls_total{uid=\"a}# \\\" # {b\"} 1\n\
            # HELP consistd_lag_seconds Lag.\n\
            # TYPE consistd_lag_seconds histogram\n\
            consistd_lag_seconds_sum 0.5\n\
            consistd_lag_seconds_count 1\n\
            consistd_lag_seconds_bucket{le=\"+Inf\"} 1\n\
            # HELP consistd_up 1 while up.\n\
            # TYPE consistd_up gauge\n\
            consistd_up 1\n\
            # TYPE consistd_other untyped\n\
            consistd_other 2\n"
        );
    }
}
