//! `gpu-agent bench-plan`: time one scheduler pass over many pending jobs on a large
//! simulated cluster (the "10,000 jobs onto 5,000 nodes × 8 GPUs in ≤ 1 s" figure).

use std::time::{Duration, Instant};

use gpu_raft_store::{ClusterState, Command, JobSpec, LogEntry};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::cluster;
use crate::scheduler::{PlanEnv, Policy, plan};

/// What one benchmark run measured.
#[derive(Debug, serde::Serialize)]
pub struct BenchResult {
    pub policy: String,
    pub nodes: u64,
    pub gpus: u64,
    pub pending: usize,
    pub placed: usize,
    /// Each pass's wall time, seconds.
    pub passes_s: Vec<f64>,
    pub best_s: f64,
    pub placements_per_s: f64,
}

/// One pass's inputs: `jobs` pending jobs on an idle cluster, the policy as the bench runs it
/// (no limit on binds per pass) and the environment.
pub struct Setup {
    pub state: ClusterState,
    pub gpus: u64,
    pub policy: Policy,
    pub env: PlanEnv,
}

/// `jobs` pending jobs (a seeded mix of 1, 2, 4 and 8 GPUs, half with estimates) on `nodes` ×
/// `gpus_per_node` idle GPUs. Shared by `bench-plan` and the criterion bench.
pub fn setup(
    nodes: u64,
    gpus_per_node: u32,
    jobs: usize,
    policy: &Policy,
    seed: u64,
) -> anyhow::Result<Setup> {
    let spec = format!("{nodes}x{gpus_per_node}xA100-80GB");
    let (mut state, gpus) = cluster::build(&spec)?;
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..jobs {
        let gpus = [1, 1, 1, 1, 2, 2, 4, 8][rng.random_range(0..8)];
        let spec = JobSpec {
            name: format!("bench-{}", i % 50),
            tenant: format!("t{}", rng.random_range(0..10)),
            command: vec!["true".into()],
            gpus,
            priority: rng.random_range(0..3),
            runtime_estimate_s: rng.random_bool(0.5).then(|| rng.random_range(60..86_400)),
            ..JobSpec::default()
        };
        state.apply(&LogEntry {
            proposed_at_ms: i as u64,
            cmd: Command::submit(spec),
            meta: None,
            request: None,
        });
    }
    let policy = Policy {
        max_binds_per_pass: usize::MAX,
        ..policy.clone()
    };
    let env = PlanEnv::from_state(&state, &policy, jobs as u64 + 1_000);
    Ok(Setup {
        state,
        gpus,
        policy,
        env,
    })
}

/// Plan the `setup` jobs `repeat` times.
pub fn run(
    nodes: u64,
    gpus_per_node: u32,
    jobs: usize,
    policy: &Policy,
    repeat: usize,
    seed: u64,
) -> anyhow::Result<BenchResult> {
    let Setup {
        state,
        gpus,
        policy,
        env,
    } = setup(nodes, gpus_per_node, jobs, policy, seed)?;
    let mut passes = Vec::new();
    let mut placed = 0;
    for _ in 0..repeat.max(1) {
        let began = Instant::now();
        let pass = plan(&state, &policy, &env);
        passes.push(began.elapsed());
        placed = pass.binds.len();
    }
    let best = passes.iter().min().copied().unwrap_or(Duration::ZERO);
    Ok(BenchResult {
        policy: policy.spec(),
        nodes,
        gpus,
        pending: jobs,
        placed,
        passes_s: passes.iter().map(Duration::as_secs_f64).collect(),
        best_s: best.as_secs_f64(),
        placements_per_s: placed as f64 / best.as_secs_f64().max(1e-9),
    })
}
