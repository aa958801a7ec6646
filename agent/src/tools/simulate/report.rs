//! Printing replay results: an aligned table for people, JSON for tools.

use std::fmt::Write;

use serde::Serialize;

use super::metrics::Summary;

/// The JSON document of one `gpu-agent simulate` run (stable shape).
#[derive(Debug, Serialize)]
pub struct Document<'a> {
    pub trace: String,
    pub cluster: &'a str,
    pub gpus: u64,
    pub estimates: &'a str,
    pub jobs: usize,
    /// Trace lines skipped as malformed (with `--skip-bad-rows`).
    pub skipped_rows: Vec<usize>,
    pub results: &'a [Summary],
}

/// An aligned text table, one row per policy.
pub fn table(rows: &[Summary]) -> String {
    let header = [
        "policy",
        "jobs",
        "avgJCT_h",
        "p50JCT_h",
        "p99JCT_h",
        "avgQ_h",
        "p99Q_h",
        "makespan_h",
        "util",
        "avgBSLD",
        "jain",
        "maxFTF",
        "jainFTF",
        "fragGPU_h",
        "preempt",
        "maxGangQ_h",
        "predCov",
        "predErr",
        "replay_s",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.policy.clone(),
                r.jobs.to_string(),
                format!("{:.2}", r.avg_jct_h),
                format!("{:.2}", r.p50_jct_h),
                format!("{:.1}", r.p99_jct_h),
                format!("{:.2}", r.avg_queue_h),
                format!("{:.1}", r.p99_queue_h),
                format!("{:.0}", r.makespan_h),
                format!("{:.1}%", 100.0 * r.utilization),
                format!("{:.1}", r.avg_bounded_slowdown),
                format!("{:.3}", r.jain_fairness),
                format!("{:.2}", r.max_finish_time_fairness),
                format!("{:.3}", r.finish_time_fairness_jain),
                format!("{:.0}", r.fragmentation_gpu_h),
                r.preemptions.to_string(),
                format!("{:.1}", r.max_gang_queue_h),
                format!("{:.0}%", 100.0 * r.prediction_coverage),
                format!("{:.2}", r.prediction_median_rel_error),
                format!("{:.2}", r.replay_s),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |row: &[String]| {
        let parts: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, v)| {
                if c == 0 {
                    format!("{v:<w$}", w = widths[c])
                } else {
                    format!("{v:>w$}", w = widths[c])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", parts.join("  ").trim_end());
    };
    line(&header.map(str::to_owned));
    for row in &cells {
        line(row);
    }
    out
}
