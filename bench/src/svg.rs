//! A line chart of each agent's resident memory over a run, as a standalone SVG (no
//! dependencies, readable on GitHub): `gpu-bench lifetime --svg`.

use std::fmt::Write;

use crate::report::thousands;
use crate::state_growth::StateGrowth;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];

/// RSS in MiB of every agent (one line each) against jobs finished, with a dashed line at
/// `limit_mib`.
pub fn rss_chart(growth: &StateGrowth, title: &str, limit_mib: f64) -> String {
    let max_jobs = growth.checkpoints.last().map_or(1, |c| c.jobs).max(1) as f64;
    let highest = (growth.checkpoints.iter())
        .flat_map(|c| c.rss_mib.iter().copied())
        .fold(limit_mib, f64::max);
    let top_mib = (highest * 1.1 / 50.0).ceil() * 50.0;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |jobs: f64| LEFT + jobs / max_jobs * plot_w;
    let y = |mib: f64| TOP + plot_h - mib / top_mib * plot_h;

    let mut svg = String::new();
    let s = &mut svg;
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    for i in 0..=5 {
        let mib = top_mib * f64::from(i) / 5.0;
        let jobs = max_jobs * f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{mib:.0}</text>"##,
            LEFT + plot_w,
            LEFT - 8.0,
            y(mib) + 4.0,
            y = y(mib)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0,
            thousands(jobs as usize),
            x = x(jobs)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">jobs submitted and finished</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 14.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">resident memory (MiB)</text>"#,
        TOP + plot_h / 2.0
    );
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{}" y1="{ly:.1}" y2="{ly:.1}" stroke="#888" stroke-dasharray="6 4"/><text x="{}" y="{:.1}" fill="#555">{limit_mib:.0} MiB</text>"##,
        LEFT + plot_w,
        LEFT + plot_w + 6.0,
        y(limit_mib) + 4.0,
        ly = y(limit_mib)
    );
    let agents = growth.checkpoints.first().map_or(0, |c| c.rss_mib.len());
    for agent in 0..agents {
        let color = COLORS[agent % COLORS.len()];
        let points: Vec<String> = (growth.checkpoints.iter())
            .filter_map(|c| {
                let mib = c.rss_mib.get(agent)?;
                Some(format!("{:.1},{:.1}", x(c.jobs as f64), y(*mib)))
            })
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        let ly = TOP + 10.0 + 20.0 * agent as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">agent n{}</text>"#,
            LEFT + plot_w + 20.0,
            LEFT + plot_w + 44.0,
            LEFT + plot_w + 50.0,
            ly + 4.0,
            agent + 1
        );
    }
    let _ = writeln!(s, "</svg>");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_growth::Checkpoint;

    #[test]
    fn one_line_per_agent_through_every_checkpoint() {
        let growth = StateGrowth {
            checkpoints: (0..=4)
                .map(|i| Checkpoint {
                    jobs: i * 1000,
                    rss_mib: vec![60.0 + i as f64, 70.0, 80.0],
                })
                .collect(),
            pairs_per_s: 1.0,
            snapshot_bytes: 0,
            restart_ms: 0.0,
        };
        let svg = rss_chart(&growth, "a <run>", 150.0);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        let first = svg
            .lines()
            .find(|l| l.starts_with("<polyline"))
            .expect("a line");
        assert_eq!(first.matches(',').count(), 5, "{first}");
        assert!(svg.contains("a &lt;run&gt;"));
    }
}
