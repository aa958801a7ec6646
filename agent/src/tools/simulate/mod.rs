//! The offline simulator: replay a workload trace on a simulated cluster under one or more
//! scheduling policies, driving the leader's own `scheduler::plan` in virtual time, and report
//! the figures as a table, JSON and an SVG chart. `trace.rs` reads traces, `cluster.rs` builds
//! the cluster, `engine.rs` is the event loop, `metrics.rs`, `report.rs` and `svg.rs` present
//! the results; `bench.rs` times one large planning pass.

pub mod bench;
pub(crate) mod cluster;
pub(crate) mod engine;
pub mod fragmentation;
pub(crate) mod metrics;
pub mod report;
pub(crate) mod svg;
pub(crate) mod trace;

use std::path::PathBuf;

use anyhow::Context;

pub use engine::Estimates;
pub use metrics::Summary;

use crate::scheduler::Policy;

/// A `gpu-agent simulate` run.
#[derive(Debug)]
pub struct Options {
    pub trace: PathBuf,
    pub cluster: String,
    /// Policy specs, e.g. `fcfs`, `sjf+easy`.
    pub policies: Vec<String>,
    pub estimates: Estimates,
    pub skip_bad_rows: bool,
    /// Where to write the JSON document, if anywhere.
    pub json: Option<PathBuf>,
    /// Where to write the SVG chart, if anywhere.
    pub svg: Option<PathBuf>,
}

/// Replay the trace under every policy; write the JSON and SVG files asked for. Returns the
/// summaries and the number of skipped rows (warnings go to stderr).
pub fn run(opts: &Options) -> anyhow::Result<Vec<Summary>> {
    let policies: Vec<(String, Policy)> = opts
        .policies
        .iter()
        .map(|p| Ok((p.clone(), p.parse::<Policy>()?)))
        .collect::<Result<_, crate::scheduler::BadPolicy>>()?;
    if policies.is_empty() {
        anyhow::bail!("no policy to simulate");
    }
    let (cluster, gpus) = cluster::build(&opts.cluster)?;
    let text = std::fs::read_to_string(&opts.trace)
        .with_context(|| format!("reading the trace {}", opts.trace.display()))?;
    let trace = trace::parse(&text, opts.skip_bad_rows)
        .with_context(|| format!("reading the trace {}", opts.trace.display()))?;
    for bad in &trace.skipped {
        eprintln!("warning: skipped {bad}");
    }
    let mut replays = Vec::new();
    for (name, policy) in &policies {
        let replay = engine::replay(&trace.jobs, &cluster, gpus, policy, opts.estimates)
            .with_context(|| format!("replaying under {name}"))?;
        eprintln!(
            "{name}: {} jobs in {:.2} s ({} passes)",
            replay.records.len(),
            replay.wall.as_secs_f64(),
            replay.passes
        );
        replays.push((name.clone(), replay));
    }
    let summaries: Vec<Summary> = replays
        .iter()
        .map(|(name, r)| metrics::summarize(name, r))
        .collect();
    let estimates = match opts.estimates {
        Estimates::Exact => "exact",
        Estimates::Predicted => "predicted",
    };
    if let Some(path) = &opts.json {
        let doc = report::Document {
            trace: opts.trace.display().to_string(),
            cluster: &opts.cluster,
            gpus,
            estimates,
            jobs: trace.jobs.len(),
            skipped_rows: trace.skipped.iter().map(|b| b.line).collect(),
            results: &summaries,
        };
        let text = serde_json::to_string_pretty(&doc).context("encoding the results")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &opts.svg {
        let runs: Vec<(String, &engine::Replay)> =
            replays.iter().map(|(n, r)| (n.clone(), r)).collect();
        let title = format!(
            "{} jobs on {} ({} GPUs), {} estimates",
            trace.jobs.len(),
            opts.cluster,
            gpus,
            estimates
        );
        std::fs::write(path, svg::chart(&title, &runs))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(summaries)
}
