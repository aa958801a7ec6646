//! Line charts drawn on the server as inline SVG: one series of (time, value) over a fixed
//! vertical range, with the range and the span written beside it. SVG presentation attributes
//! only (no `style`), so the console's Content-Security-Policy allows it.

use std::fmt::Write;

use maud::{Markup, PreEscaped, html};

const W: f64 = 560.0;
const H: f64 = 150.0;
const PAD_LEFT: f64 = 44.0;
const PAD: f64 = 8.0;

/// A chart of `points` (milliseconds, value) from `low` to `high`, labelled `title` and `unit`.
pub(super) fn line(title: &str, unit: &str, points: &[(u64, f64)], low: f64, high: f64) -> Markup {
    let path = path_of(points, low, high);
    let first = points.first().map_or(0, |p| p.0);
    let last = points.last().map_or(0, |p| p.0);
    let now = points.last().map(|p| p.1);
    html! {
        figure.chart-line {
            figcaption {
                (title) @if let Some(v) = now { " " strong { (format!("{v:.0}")) " " (unit) } }
                span.hint { " last " (super::view::span(last.saturating_sub(first))) }
            }
            svg xmlns="http://www.w3.org/2000/svg" width=(W) height=(H) viewBox={ "0 0 " (W) " " (H) } role="img" {
                rect x=(PAD_LEFT) y=(PAD) width=(W - PAD_LEFT - PAD) height=(H - 2.0 * PAD) fill="#fbfcfe" stroke="#d9dee7" {}
                text x=(PAD_LEFT - 4.0) y=(PAD + 10.0) text-anchor="end" font-size="11" fill="#667085" { (format!("{high:.0}")) }
                text x=(PAD_LEFT - 4.0) y=(H - PAD) text-anchor="end" font-size="11" fill="#667085" { (format!("{low:.0}")) }
                path d=(PreEscaped(path)) fill="none" stroke="#2f5bd3" stroke-width="1.5" {}
            }
        }
    }
}

/// The SVG path of `points`, scaled into the plot area (time left to right).
fn path_of(points: &[(u64, f64)], low: f64, high: f64) -> String {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return String::new();
    };
    let span = (last.0.saturating_sub(first.0)).max(1) as f64;
    let range = (high - low).max(f64::EPSILON);
    let (x0, width) = (PAD_LEFT, W - PAD_LEFT - PAD);
    let (y0, height) = (PAD, H - 2.0 * PAD);
    let mut d = String::new();
    for (i, (at, v)) in points.iter().enumerate() {
        let x = x0 + (at - first.0) as f64 / span * width;
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
        let d = path_of(&[(1_000, 0.0), (2_000, 50.0), (3_000, 150.0)], 0.0, 100.0);
        assert_eq!(d, "M44.0,142.0 L298.0,75.0 L552.0,8.0");
        assert_eq!(path_of(&[], 0.0, 100.0), "");
        let html = line("T <b>", "°C", &[(0, 40.0)], 0.0, 100.0).into_string();
        assert!(html.contains("T &lt;b&gt;"), "{html}");
    }
}
