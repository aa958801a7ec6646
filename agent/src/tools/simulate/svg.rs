//! A hand-written SVG chart of replays: GPU utilization over time (left) and the CDF of job
//! completion times on a log scale (right), one colour per policy.

use std::fmt::Write;

use super::engine::Replay;

const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
const PANEL_W: f64 = 520.0;
const PANEL_H: f64 = 300.0;
const MARGIN: f64 = 50.0;
/// Utilization points per curve.
const BUCKETS: usize = 300;
/// CDF points per curve.
const CDF_POINTS: usize = 200;

/// The chart of `runs` (policy name, replay) with a title.
pub(crate) fn chart(title: &str, runs: &[(String, &Replay)]) -> String {
    let width = 2.0 * (PANEL_W + 2.0 * MARGIN);
    let height = PANEL_H + 2.0 * MARGIN + 20.0 * runs.len().div_ceil(4) as f64 + 20.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="15">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    let end_ms = runs
        .iter()
        .filter_map(|(_, r)| r.records.iter().map(|j| j.end_ms).max())
        .max()
        .unwrap_or(1)
        .max(1);
    let left = (MARGIN, MARGIN);
    let right = (PANEL_W + 3.0 * MARGIN, MARGIN);
    axes(
        &mut s,
        left,
        "time (days)",
        "GPU utilization",
        |i| {
            let x = end_ms as f64 / 86_400_000.0 * i as f64 / 4.0;
            format!("{x:.0}")
        },
        |i| format!("{:.0}%", 25.0 * i as f64),
    );
    axes(
        &mut s,
        right,
        "job completion time (hours, log)",
        "fraction of jobs",
        |i| fmt_hours(10f64.powi(i as i32 - 2)),
        |i| format!("{:.2}", 0.25 * i as f64),
    );
    for (k, (name, r)) in runs.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let util = utilization(r, end_ms);
        polyline(
            &mut s,
            colour,
            util.iter().enumerate().map(|(i, u)| {
                (
                    left.0 + PANEL_W * i as f64 / (BUCKETS - 1) as f64,
                    left.1 + PANEL_H * (1.0 - u),
                )
            }),
        );
        polyline(
            &mut s,
            colour,
            jct_cdf(r).into_iter().map(|(hours, frac)| {
                // 0.01 h .. 100 h on a log scale.
                let x = ((hours.max(0.01).log10() + 2.0) / 4.0).clamp(0.0, 1.0);
                (right.0 + PANEL_W * x, right.1 + PANEL_H * (1.0 - frac))
            }),
        );
        let lx = MARGIN + (k % 4) as f64 * 220.0;
        let ly = PANEL_H + 2.0 * MARGIN + 10.0 + 20.0 * (k / 4) as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="14" height="4" fill="{colour}"/><text x="{}" y="{}">{}</text>"#,
            ly - 4.0,
            lx + 20.0,
            ly,
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_hours(h: f64) -> String {
    if h < 1.0 {
        format!("{h}")
    } else {
        format!("{h:.0}")
    }
}

fn axes(
    s: &mut String,
    (x0, y0): (f64, f64),
    xlabel: &str,
    ylabel: &str,
    xtick: impl Fn(usize) -> String,
    ytick: impl Fn(usize) -> String,
) {
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#333"/>"##
    );
    for i in 0..=4 {
        let x = x0 + PANEL_W * i as f64 / 4.0;
        let y = y0 + PANEL_H * (1.0 - i as f64 / 4.0);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            x0 + PANEL_W,
            x0 - 4.0,
            y + 4.0,
            ytick(i)
        );
        let _ = writeln!(
            s,
            r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
            y0 + PANEL_H + 15.0,
            xtick(i)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        x0 + PANEL_W / 2.0,
        y0 + PANEL_H + 32.0,
        escape(xlabel)
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"#,
        x0 - 36.0,
        y0 + PANEL_H / 2.0,
        x0 - 36.0,
        y0 + PANEL_H / 2.0,
        escape(ylabel)
    );
}

fn polyline(s: &mut String, colour: &str, points: impl Iterator<Item = (f64, f64)>) {
    let pts: Vec<String> = points.map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    let _ = writeln!(
        s,
        r#"<polyline fill="none" stroke="{colour}" stroke-width="1.3" points="{}"/>"#,
        pts.join(" ")
    );
}

/// Time-weighted mean utilization in `BUCKETS` equal slices of [0, end].
fn utilization(r: &Replay, end_ms: u64) -> Vec<f64> {
    let slice = end_ms as f64 / BUCKETS as f64;
    let mut busy_ms = vec![0.0; BUCKETS];
    for (k, &(t, busy)) in r.timeline.iter().enumerate() {
        let until = r.timeline.get(k + 1).map_or(end_ms, |&(next, _)| next);
        let (mut a, b) = (t as f64, until.min(end_ms) as f64);
        while a < b {
            let i = ((a / slice) as usize).min(BUCKETS - 1);
            let edge = ((i + 1) as f64 * slice).min(b);
            busy_ms[i] += busy as f64 * (edge - a);
            a = if edge > a { edge } else { b };
        }
    }
    // The timeline counts thousandths of a GPU.
    let milli_gpus = 1000.0 * r.total_gpus.max(1) as f64;
    busy_ms.iter().map(|b| b / (slice * milli_gpus)).collect()
}

/// (JCT in hours, fraction of jobs done by then), `CDF_POINTS` points.
fn jct_cdf(r: &Replay) -> Vec<(f64, f64)> {
    let mut jct: Vec<u64> = r.records.iter().map(|j| j.end_ms - j.submit_ms).collect();
    jct.sort_unstable();
    if jct.is_empty() {
        return Vec::new();
    }
    (1..=CDF_POINTS)
        .map(|i| {
            let frac = i as f64 / CDF_POINTS as f64;
            let idx = ((frac * jct.len() as f64).ceil() as usize).clamp(1, jct.len()) - 1;
            (jct[idx] as f64 / 3_600_000.0, frac)
        })
        .collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
