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
    let text = std::fs::read_to_string(&opts.trace)
        .with_context(|| format!("reading the trace {}", opts.trace.display()))?;
    let trace = trace::parse(&text, opts.skip_bad_rows)
        .with_context(|| format!("reading the trace {}", opts.trace.display()))?;
    for bad in &trace.skipped {
        eprintln!("warning: skipped {bad}");
    }
    let compared = compare(&trace.jobs, &opts.cluster, &opts.policies, opts.estimates)?;
    for (name, replay) in &compared.replays {
        eprintln!(
            "{name}: {} jobs in {:.2} s ({} passes)",
            replay.records.len(),
            replay.wall.as_secs_f64(),
            replay.passes
        );
    }
    if let Some(path) = &opts.json {
        let doc = report::Document {
            trace: opts.trace.display().to_string(),
            cluster: &opts.cluster,
            gpus: compared.gpus,
            estimates: estimates_name(opts.estimates),
            jobs: trace.jobs.len(),
            skipped_rows: trace.skipped.iter().map(|b| b.line).collect(),
            results: &compared.summaries,
        };
        let text = serde_json::to_string_pretty(&doc).context("encoding the results")?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &opts.svg {
        std::fs::write(path, compared.chart(&opts.cluster))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(compared.summaries)
}

/// Replays of one trace under several policies.
pub(crate) struct Comparison {
    pub replays: Vec<(String, engine::Replay)>,
    pub summaries: Vec<Summary>,
    pub gpus: u64,
    pub jobs: usize,
    pub estimates: Estimates,
}

impl Comparison {
    /// The SVG chart of the replays (utilization over time, the JCT distribution).
    pub(crate) fn chart(&self, cluster: &str) -> String {
        let runs: Vec<(String, &engine::Replay)> =
            self.replays.iter().map(|(n, r)| (n.clone(), r)).collect();
        let title = format!(
            "{} jobs on {} ({} GPUs), {} estimates",
            self.jobs,
            cluster,
            self.gpus,
            estimates_name(self.estimates)
        );
        svg::chart(&title, &runs)
    }
}

/// Replay `jobs` (sorted by submission) on the cluster `cluster` under each of `policies`.
pub(crate) fn compare(
    jobs: &[trace::TraceJob],
    cluster: &str,
    policies: &[String],
    estimates: Estimates,
) -> anyhow::Result<Comparison> {
    let policies: Vec<(String, Policy)> = policies
        .iter()
        .map(|p| Ok((p.clone(), p.parse::<Policy>()?)))
        .collect::<Result<_, crate::scheduler::BadPolicy>>()?;
    if policies.is_empty() {
        anyhow::bail!("no policy to simulate");
    }
    let (state, gpus) = cluster::build(cluster)?;
    let mut replays = Vec::new();
    for (name, policy) in &policies {
        let replay = engine::replay(jobs, &state, gpus, policy, estimates)
            .with_context(|| format!("replaying under {name}"))?;
        replays.push((name.clone(), replay));
    }
    let summaries = replays
        .iter()
        .map(|(name, r)| metrics::summarize(name, r))
        .collect();
    Ok(Comparison {
        replays,
        summaries,
        gpus,
        jobs: jobs.len(),
        estimates,
    })
}

fn estimates_name(e: Estimates) -> &'static str {
    match e {
        Estimates::Exact => "exact",
        Estimates::Predicted => "predicted",
    }
}
