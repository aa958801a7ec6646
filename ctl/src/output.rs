//! Writing results: aligned tables and key: value blocks for people, stable JSON for programs,
//! raw bytes for streamed logs, a redrawn progress line on stderr. A closed pipe
//! (`gpuctl … | head`) ends the program quietly with success.

use std::io::{IsTerminal, Write};

/// Print `text` to stdout; exit 0 at once if the reader went away.
pub(crate) fn emit(text: &str) {
    emit_bytes(text.as_bytes());
}

/// Write `bytes` to stdout unchanged and flush them, so streamed output appears as it arrives;
/// exit 0 at once if the reader went away.
pub(crate) fn emit_bytes(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing output: {e}");
        std::process::exit(2);
    }
}

/// Write `bytes` to stderr unchanged and flush them (a job's own stderr, streamed by `run`).
/// A closed stderr is not worth stopping for: the bytes are dropped.
pub(crate) fn emit_err_bytes(bytes: &[u8]) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes).and_then(|()| err.flush());
}

pub(crate) fn json(value: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
    s.push('\n');
    s
}

/// A left-aligned table with a header row; cells are sanitised so a hostile label cannot
/// inject terminal escapes or break the layout.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let clean: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| sanitize(c)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &clean {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let parts: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in &clean {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// [`table`] with one row per item, `row` making its cells.
pub(crate) fn table_of<T>(header: &[&str], items: &[T], row: impl Fn(&T) -> Vec<String>) -> String {
    table(header, &items.iter().map(row).collect::<Vec<_>>())
}

/// `Key:  value` lines with the values aligned, sanitised like table cells.
pub(crate) fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let key = format!("{key}:");
        let line = format!("{key:<width$}  {}", sanitize(value));
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// At most `max` characters, the last one an ellipsis when something was cut.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// An `f32` from the wire as the JSON number it prints as (`0.1`, not `0.10000000149011612`);
/// `null` when it is not finite.
pub(crate) fn float(x: f32) -> serde_json::Value {
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// One line on stderr redrawn in place (progress while waiting). Silent unless stderr is a
/// terminal; erased when dropped, so nothing is left behind on any exit path.
pub(crate) struct StatusLine {
    enabled: bool,
    drawn: bool,
}

impl StatusLine {
    pub(crate) fn for_stderr() -> Self {
        Self {
            enabled: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    pub(crate) fn show(&mut self, text: &str) {
        if !self.enabled {
            return;
        }
        // A line wider than the terminal would wrap and could not be redrawn in place.
        let columns = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .unwrap_or(80);
        let text = truncate(&sanitize(text), columns.saturating_sub(1).max(10));
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}").and_then(|()| err.flush());
        self.drawn = true;
    }

    pub(crate) fn clear(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K").and_then(|()| err.flush());
            self.drawn = false;
        }
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        self.clear();
    }
}

fn sanitize(cell: &str) -> String {
    cell.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn tables_align_and_sanitise() {
        let t = table(
            &["ID", "NAME"],
            &[
                vec!["1".into(), "alpha".into()],
                vec!["22".into(), "b\u{1b}[31m".into()],
            ],
        );
        expect![[r#"
            ID  NAME
            1   alpha
            22  b?[31m
        "#]]
        .assert_eq(&t);
    }

    #[test]
    fn fields_align_and_sanitise() {
        let f = fields(&[
            ("ID", "j-1".into()),
            ("Command", "a\nb".into()),
            ("Empty", String::new()),
        ]);
        expect![[r#"
            ID:       j-1
            Command:  a?b
            Empty:
        "#]]
        .assert_eq(&f);
    }

    #[test]
    fn truncation_counts_characters() {
        assert_eq!(truncate("short", 60), "short");
        assert_eq!(truncate("ééééé", 4), "ééé…");
        assert_eq!(truncate("abc", 0), "…");
    }

    #[test]
    fn floats_print_as_written() {
        assert_eq!(float(0.1).to_string(), "0.1");
        assert_eq!(float(95.0).to_string(), "95.0");
        assert_eq!(float(f32::NAN), serde_json::Value::Null);
        assert_eq!(float(f32::INFINITY), serde_json::Value::Null);
    }
}
