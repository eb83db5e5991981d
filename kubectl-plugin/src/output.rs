//! How results are printed: aligned tables as kubectl prints them, kubectl's ages (3s, 5m, 2h), or JSON.

use clap::ValueEnum;

/// `-o` / `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum Format {
    /// Columns for people.
    #[default]
    Table,
    /// JSON for scripts.
    Json,
}

/// Rows under a header, each column as wide as its widest cell, separated by three spaces (kubectl's
/// tabwriter); the last column is not padded.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, width)) in cells.zip(&widths).enumerate() {
            if i + 1 == widths.len() {
                out += cell;
            } else {
                out += &format!("{cell:<width$}   ");
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out += &line(&mut row.iter().map(String::as_str));
    }
    out
}

/// A duration as kubectl prints ages (`k8s.io/apimachinery/pkg/util/duration.HumanDuration`).
pub(crate) fn age(millis: u64) -> String {
    let seconds = millis / 1000;
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let (d, h) = (hours / 24, hours % 24);
        return if h == 0 { format!("{d}d") } else { format!("{d}d{h}h") };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    let years = hours / 24 / 365;
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 { format!("{years}y") } else { format!("{years}y{d}d") };
    }
    format!("{years}y")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let cases = [
            (0, "0s"),
            (3_400, "3s"),
            (119_000, "119s"),
            (120_000, "2m"),
            (150_000, "2m30s"),
            (5 * 60_000, "5m"),
            (45 * 60_000, "45m"),
            (2 * 3_600_000, "120m"),
            (3 * 3_600_000, "3h"),
            (3 * 3_600_000 + 20 * 60_000, "3h20m"),
            (30 * 3_600_000, "30h"),
            (3 * 86_400_000 + 5 * 3_600_000, "3d5h"),
            (400 * 86_400_000, "400d"),
            (3 * 365 * 86_400_000, "3y"),
        ];
        for (millis, want) in cases {
            assert_eq!(age(millis), want, "{millis} ms");
        }
    }

    #[test]
    fn tables_align_columns_and_do_not_pad_the_last() {
        let rows = vec![vec!["web".to_owned(), "a".to_owned()], vec!["controller".to_owned(), "<none>".to_owned()]];
        assert_eq!(table(&["ELECTION", "HOLDER"], &rows), "ELECTION     HOLDER\nweb          a\ncontroller   <none>\n");
    }
}
