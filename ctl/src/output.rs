//! Writing results: aligned tables for people, stable JSON for programs. A closed pipe
//! (`gpuctl … | head`) ends the program quietly with success.

use std::io::Write;

/// Print `text` to stdout; exit 0 at once if the reader went away.
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing output: {e}");
        std::process::exit(2);
    }
}

pub fn json(value: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
    s.push('\n');
    s
}

/// A left-aligned table with a header row; cells are sanitised so a hostile label cannot
/// inject terminal escapes or break the layout.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
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
}
