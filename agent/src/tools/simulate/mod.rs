//! The offline simulator: replay a workload trace on a simulated cluster under one or more
//! scheduling policies, driving the leader's own `scheduler::plan` in virtual time, and report
//! the figures as a table, JSON and an SVG chart. `trace.rs` reads traces, `cluster.rs` builds
//! the cluster, `engine.rs` is the event loop, `metrics.rs`, `report.rs` and `svg.rs` present
//! the results; `bench.rs` times one large planning pass.

pub mod bench;
pub(crate) mod cluster;
pub(crate) mod engine;
pub(crate) mod fairness;
pub mod fragmentation;
pub(crate) mod metrics;
pub mod report;
pub(crate) mod svg;
pub(crate) mod tenants;
pub(crate) mod trace;

use std::path::PathBuf;

use anyhow::Context;

pub use engine::Estimates;
pub use fairness::TenantFairness;
pub use metrics::Summary;

use gpu_raft_store::scheduler::Preemption;

use crate::scheduler::{LearnedWeights, Policy};

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
    /// A weights file for the learned ordering instead of the shipped weights.
    pub weights: Option<PathBuf>,
    /// Tenants' weights and quotas (`tenants.rs`); none: every tenant unlimited, weight 1.
    pub tenants: Option<PathBuf>,
    /// The preemption the replay's leader runs (off, reclaim or priority).
    pub preemption: Preemption,
    /// Work a preempted run does again when it resumes from its checkpoint, milliseconds.
    pub checkpoint_ms: u64,
    /// The gang starvation guard's limit in seconds (`SchedulerSettings::gang_wait_limit_s`;
    /// 0: off).
    pub gang_wait_limit_s: u64,
    /// How long a run is exempt from preemption once placed, in seconds
    /// (`SchedulerSettings::preempt_exempt_s`; 0: off).
    pub preempt_exempt_s: u64,
}

/// What every replay of a comparison shares besides the trace: the cluster, its tenants,
/// preemption and the gang starvation guard, and the learned ordering's weights.
#[derive(Clone, Debug, Default)]
pub(crate) struct Setup {
    pub cluster: String,
    /// The tenants file's text, if any.
    pub tenants: Option<String>,
    pub preemption: Preemption,
    pub checkpoint_ms: u64,
    pub gang_wait_limit_s: u64,
    pub preempt_exempt_s: u64,
    pub learned: Option<LearnedWeights>,
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
    let learned = match &opts.weights {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the weights {}", path.display()))?;
            let weights = crate::scheduler::parse_learned_weights(&text)
                .map_err(|e| anyhow::anyhow!("reading the weights {}: {e}", path.display()))?;
            Some(weights)
        }
        None => None,
    };
    let tenants = match &opts.tenants {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the tenants {}", path.display()))?,
        ),
        None => None,
    };
    let setup = Setup {
        cluster: opts.cluster.clone(),
        tenants,
        preemption: opts.preemption,
        checkpoint_ms: opts.checkpoint_ms,
        gang_wait_limit_s: opts.gang_wait_limit_s,
        preempt_exempt_s: opts.preempt_exempt_s,
        learned,
    };
    let compared = compare(&trace.jobs, &setup, &opts.policies, opts.estimates)?;
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

/// Replay `jobs` (sorted by submission) under each of `policies`, as `setup` says.
pub(crate) fn compare(
    jobs: &[trace::TraceJob],
    setup: &Setup,
    policies: &[String],
    estimates: Estimates,
) -> anyhow::Result<Comparison> {
    let policies: Vec<(String, Policy)> = policies
        .iter()
        .map(|p| {
            let mut policy = p.parse::<Policy>()?;
            if let Some(weights) = setup.learned {
                policy.learned = weights;
            }
            Ok((p.clone(), policy))
        })
        .collect::<Result<_, crate::scheduler::BadPolicy>>()?;
    if policies.is_empty() {
        anyhow::bail!("no policy to simulate");
    }
    let (mut state, gpus) = cluster::build(&setup.cluster)?;
    if let Some(text) = &setup.tenants {
        tenants::register(&mut state, text)?;
    }
    state.scheduler.preemption = setup.preemption;
    state.scheduler.gang_wait_limit_s = setup.gang_wait_limit_s;
    state.scheduler.preempt_exempt_s = setup.preempt_exempt_s;
    state
        .scheduler
        .validate()
        .map_err(|e| anyhow::anyhow!("the scheduler settings: {e}"))?;
    let mut replays = Vec::new();
    for (name, policy) in &policies {
        let replay = engine::replay(jobs, &state, gpus, policy, estimates, setup.checkpoint_ms)
            .with_context(|| format!("replaying under {name}"))?;
        replays.push((name.clone(), replay));
    }
    let ideal = fairness::Ideal::new(jobs, gpus, |t| {
        state.tenants.get(t).map_or(1.0, |r| f64::from(r.weight))
    });
    let summaries = replays
        .iter()
        .map(|(name, r)| metrics::summarize(name, r, &ideal))
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
