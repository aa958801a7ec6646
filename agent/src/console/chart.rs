//! Line charts drawn on the server as inline SVG: one series of (time, value) over a fixed
//! vertical range, with the range and the span written beside it. SVG presentation attributes
//! only (no `style`), so the console's Content-Security-Policy allows it.

use std::fmt::Write;

use maud::{Markup, PreEscaped, html};

const W: f64 = 560.0;
const H: f64 = 150.0;
const PAD_LEFT: f64 = 44.0;
const PAD: f64 = 8.0;

/// Series colours, in order.
const COLOURS: [&str; 6] = [
    "#2f5bd3", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// A chart of `points` (milliseconds, value) from `low` to `high`, labelled `title` and `unit`.
pub(super) fn line(title: &str, unit: &str, points: &[(u64, f64)], low: f64, high: f64) -> Markup {
    let now = points.last().map(|p| p.1);
    let caption =
        html! { (title) @if let Some(v) = now { " " strong { (format!("{v:.0}")) " " (unit) } } };
    lines(caption, &[(String::new(), points.to_vec())], low, high)
}

/// A chart of several named series over one time span (the first series' first point to the
/// last series' last), each in its own colour with a legend.
pub(super) fn lines(
    caption: Markup,
    series: &[(String, Vec<(u64, f64)>)],
    low: f64,
    high: f64,
) -> Markup {
    let first = series
        .iter()
        .filter_map(|(_, p)| p.first())
        .map(|p| p.0)
        .min()
        .unwrap_or(0);
    let last = series
        .iter()
        .filter_map(|(_, p)| p.last())
        .map(|p| p.0)
        .max()
        .unwrap_or(0);
    html! {
        figure.chart-line {
            figcaption { (caption) span.hint { " last " (super::view::span(last.saturating_sub(first))) } }
            svg xmlns="http://www.w3.org/2000/svg" width=(W) height=(H) viewBox={ "0 0 " (W) " " (H) } role="img" {
                rect x=(PAD_LEFT) y=(PAD) width=(W - PAD_LEFT - PAD) height=(H - 2.0 * PAD) fill="#fbfcfe" stroke="#d9dee7" {}
                text x=(PAD_LEFT - 4.0) y=(PAD + 10.0) text-anchor="end" font-size="11" fill="#667085" { (format!("{high:.0}")) }
                text x=(PAD_LEFT - 4.0) y=(H - PAD) text-anchor="end" font-size="11" fill="#667085" { (format!("{low:.0}")) }
                @for (i, (_, points)) in series.iter().enumerate() {
                    path d=(PreEscaped(path_of(points, (first, last), low, high))) fill="none"
                        stroke=(COLOURS[i % COLOURS.len()]) stroke-width="1.5" {}
                }
            }
            @if series.len() > 1 {
                p.legend { @for (i, (name, _)) in series.iter().enumerate() {
                    span class={ "swatch c" (i % COLOURS.len()) } {} " " (name) " "
                } }
            }
        }
    }
}

/// The SVG path of `points`, scaled into the plot area (`from` to `to` left to right).
fn path_of(points: &[(u64, f64)], (from, to): (u64, u64), low: f64, high: f64) -> String {
    let span = to.saturating_sub(from).max(1) as f64;
    let range = (high - low).max(f64::EPSILON);
    let (x0, width) = (PAD_LEFT, W - PAD_LEFT - PAD);
    let (y0, height) = (PAD, H - 2.0 * PAD);
    let mut d = String::new();
    for (i, (at, v)) in points.iter().enumerate() {
        let x = x0 + at.saturating_sub(from) as f64 / span * width;
        let y = y0 + height - (v.clamp(low, high) - low) / range * height;
        let _ = write!(d, "{}{x:.1},{y:.1}", if i == 0 { "M" } else { " L" });
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_scale_into_the_plot_and_out_of_range_values_are_clamped() {
        let points = [(1_000, 0.0), (2_000, 50.0), (3_000, 150.0)];
        let d = path_of(&points, (1_000, 3_000), 0.0, 100.0);
        assert_eq!(d, "M44.0,142.0 L298.0,75.0 L552.0,8.0");
        assert_eq!(path_of(&[], (0, 1), 0.0, 100.0), "");
        let html = line("T <b>", "°C", &[(0, 40.0)], 0.0, 100.0).into_string();
        assert!(html.contains("T &lt;b&gt;"), "{html}");
    }
}
