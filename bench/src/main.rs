//! `gpu-bench run`: replicated writes, placement latency and failover of a 3-agent gpumesh
//! mesh, each beside a 3-member etcd on the same machine in the same run, plus the disk's fsync
//! floor, and the agents' memory, backup size and restart time as finished jobs pile up. Build with `--release`; `--quick` is the CI smoke run (figures meaningless).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpu_bench::etcd::{Etcd, Security};
use gpu_bench::mesh::{self, Mesh};
use gpu_bench::report::{Report, WriteRow};
use gpu_bench::{failover, fsync, load, placement, state_growth};

#[derive(Parser)]
#[command(name = "gpu-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every benchmark and print the report (Markdown).
    Run {
        /// A few seconds in all: checks the benchmarks work; the figures mean nothing.
        #[arg(long)]
        quick: bool,
        /// Measure gpumesh alone (no etcd installed and none wanted).
        #[arg(long)]
        skip_etcd: bool,
        /// Also write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Jobs submitted and finished by the last measurement of the state's growth (the first is a
        /// tenth of it).
        #[arg(long, default_value_t = 100_000)]
        state_jobs: usize,
    },
    /// A mesh's lifetime: jobs submitted and finished (cancelled at once) by the million, each
    /// agent's resident memory sampled as they go; then the backup's size and a `kill -9`ed
    /// follower's catch-up. A fresh mesh with the agents' default retention.
    Lifetime {
        #[arg(long, default_value_t = 1_000_000)]
        jobs: usize,
        /// Memory samples over the run.
        #[arg(long, default_value_t = 40)]
        samples: usize,
        /// Also draw the memory over the run here (SVG).
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Also write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Only the replicated writes, in rounds that alternate the targets (gpumesh, etcd,
    /// gpumesh, …): for comparing builds and changes to the write path quickly.
    Writes {
        /// Measure gpumesh alone.
        #[arg(long)]
        skip_etcd: bool,
        /// Closed-loop clients of each run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,64")]
        clients: Vec<usize>,
        /// Seconds each run lasts.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Rounds over every client count.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
    },
    /// Where one write's time goes, layer by layer, beside etcd (plain and with mutual TLS):
    /// a request that writes nothing, a write on 1 member, a write on 3; one client at the
    /// leader.
    Layers {
        /// Measure gpumesh alone.
        #[arg(long)]
        skip_etcd: bool,
        /// Seconds each run lasts.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// Where one write's time goes, stage by stage: a 3-member mesh that stamps each stage of
    /// every write (`GPUMESH_WRITE_TRACE`), one client at the leader.
    Stages {
        #[arg(long, default_value_t = 500)]
        writes: usize,
    },
    /// One job array of `true` tasks on a mesh of 4 agents × 8 simulated GPUs: the submission
    /// (`gpuctl job submit --array`, process start to exit) and the drain (until every task
    /// has ended).
    Array {
        #[arg(long, default_value_t = 10_000)]
        tasks: u64,
    },
    /// MessagePack against JSON on a snapshot of `jobs` jobs and on log entries: bytes, encode
    /// and decode times (no mesh, no etcd).
    Codec {
        #[arg(long, default_value_t = 20_000)]
        jobs: u64,
        /// Rounds of the snapshot (entries run a hundred times as many).
        #[arg(long, default_value_t = 20)]
        rounds: usize,
    },
}

/// How long and how often each part runs.
struct Plan {
    write_run: Duration,
    clients: [usize; 2],
    fsync_rounds: usize,
    placed_jobs: usize,
    failover_trials: usize,
    /// Jobs submitted and finished at each measurement of the state's growth.
    state_checkpoints: Vec<usize>,
}

impl Plan {
    fn new(quick: bool, state_jobs: usize) -> Plan {
        if quick {
            Plan {
                write_run: Duration::from_millis(500),
                clients: [1, 64],
                fsync_rounds: 10,
                placed_jobs: 5,
                failover_trials: 1,
                state_checkpoints: vec![20, 50],
            }
        } else {
            Plan {
                write_run: Duration::from_secs(10),
                clients: [1, 64],
                fsync_rounds: 200,
                placed_jobs: 100,
                failover_trials: 10,
                state_checkpoints: vec![state_jobs / 10, state_jobs],
            }
        }
    }
}

/// Clients beside the placement measurement "under load".
const LOAD_CLIENTS: usize = 16;
/// Clients filling the state with finished jobs.
const FILL_CLIENTS: usize = 64;
/// The pace of placeable submissions.
const PLACE_EVERY: Duration = Duration::from_millis(20);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (quick, skip_etcd, json, state_jobs) = match Cli::parse().command {
        Cmd::Run {
            quick,
            skip_etcd,
            json,
            state_jobs,
        } => (quick, skip_etcd, json, state_jobs),
        Cmd::Writes {
            skip_etcd,
            clients,
            seconds,
            rounds,
        } => return writes_only(skip_etcd, &clients, Duration::from_secs(seconds), rounds).await,
        Cmd::Layers { skip_etcd, seconds } => {
            let layers =
                gpu_bench::layers::measure(Duration::from_secs(seconds), skip_etcd).await?;
            println!("Machine: {}.\n", gpu_bench::report::machine());
            print!("{}", gpu_bench::report::layers_markdown(&layers));
            return Ok(());
        }
        Cmd::Stages { writes } => {
            let stages = gpu_bench::stages::measure(writes).await?;
            println!("Machine: {}.\n", gpu_bench::report::machine());
            print!("{}", gpu_bench::report::stages_markdown(&stages));
            return Ok(());
        }
        Cmd::Lifetime {
            jobs,
            samples,
            svg,
            json,
        } => return lifetime(jobs, samples, svg, json).await,
        Cmd::Codec { jobs, rounds } => {
            let figures = gpu_bench::codec::measure(jobs, rounds)?;
            println!("Machine: {}.\n", gpu_bench::report::machine());
            println!("{}", gpu_bench::report::codec_table(&figures.rows));
            println!(
                "A snapshot's copy of the state under its lock, {jobs} jobs: {:.1} ms (median of {rounds}).",
                figures.copy.as_secs_f64() * 1000.0
            );
            return Ok(());
        }
        Cmd::Array { tasks } => {
            anyhow::ensure!(tasks > 0, "--tasks must be at least 1");
            let run = gpu_bench::array::measure(tasks, 4, 8).await?;
            println!("Machine: {}.", gpu_bench::report::machine());
            println!(
                "{} tasks on {} agents × {} GPUs: submitted in {:.3} s, drained in {:.1} s ({} succeeded)",
                run.tasks,
                run.agents,
                run.gpus_per_agent,
                run.submit.as_secs_f64(),
                run.drain.as_secs_f64(),
                run.succeeded
            );
            return Ok(());
        }
    };
    let plan = Plan::new(quick, state_jobs);
    let report = run(&plan, quick, skip_etcd).await?;
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    print!("{}", report.markdown());
    Ok(())
}

async fn lifetime(
    jobs: usize,
    samples: usize,
    svg: Option<PathBuf>,
    json: Option<PathBuf>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        samples > 0 && jobs >= samples,
        "--jobs must be at least --samples (> 0)"
    );
    let mut mesh = Mesh::start(3).await;
    let checkpoints: Vec<usize> = (1..=samples).map(|i| jobs * i / samples).collect();
    eprintln!("{jobs} jobs, memory sampled every {} …", jobs / samples);
    let growth = state_growth::measure(&mut mesh, &checkpoints, FILL_CLIENTS).await?;
    if let Some(path) = svg {
        let title = format!(
            "gpumesh: resident memory of each of 3 agents over {} jobs",
            gpu_bench::report::thousands(jobs)
        );
        std::fs::write(
            &path,
            gpu_bench::svg::rss_chart(&growth, &title, LIFETIME_RSS_MIB),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_vec_pretty(&growth)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("Machine: {}.", gpu_bench::report::machine());
    print!("{}", gpu_bench::report::state_markdown(&growth));
    Ok(())
}

/// The most resident memory an agent should hold at the end of a lifetime run.
const LIFETIME_RSS_MIB: f64 = 150.0;

async fn writes_only(
    skip_etcd: bool,
    clients: &[usize],
    run_for: Duration,
    rounds: usize,
) -> anyhow::Result<()> {
    let mesh = Mesh::start(3).await;
    let write_bytes = mesh::submission_bytes();
    let etcd = if skip_etcd {
        None
    } else {
        Some(Etcd::start(3, write_bytes.saturating_sub(22), Security::Plain).await?)
    };
    for round in 0..rounds {
        let mut writes = Vec::new();
        for (i, &c) in clients.iter().enumerate() {
            let run = (round * clients.len() + i) as u64;
            let gpumesh = load::closed_loop(&mesh, c, run_for, run).await?;
            let etcd = match &etcd {
                Some(e) => Some(load::closed_loop(e, c, run_for, run).await?),
                None => None,
            };
            writes.push(WriteRow { gpumesh, etcd });
        }
        println!("Round {}:\n", round + 1);
        print!(
            "{}",
            gpu_bench::report::writes_markdown(write_bytes, &writes)
        );
        println!();
    }
    Ok(())
}

async fn run(plan: &Plan, quick: bool, skip_etcd: bool) -> anyhow::Result<Report> {
    eprintln!("fsync floor…");
    let scratch = tempfile::tempdir()?;
    let fsync = fsync::floor(scratch.path(), plan.fsync_rounds)?;

    eprintln!("starting a 3-agent mesh and a 3-member etcd…");
    let mut mesh = Mesh::start(3).await;
    let write_bytes = mesh::submission_bytes();
    let mut etcd = if skip_etcd {
        None
    } else {
        // The key ("bench/" + 16 hex digits) and value together weigh one submission.
        Some(Etcd::start(3, write_bytes.saturating_sub(22), Security::Plain).await?)
    };

    let mut writes = Vec::new();
    for (run, &clients) in plan.clients.iter().enumerate() {
        eprintln!("replicated writes, {clients} clients…");
        let gpumesh = load::closed_loop(&mesh, clients, plan.write_run, run as u64).await?;
        let etcd_run = match &etcd {
            Some(e) => Some(load::closed_loop(e, clients, plan.write_run, run as u64).await?),
            None => None,
        };
        writes.push(WriteRow {
            gpumesh,
            etcd: etcd_run,
        });
    }

    eprintln!("submit → bound / running…");
    let placement_idle = placement::measure(&mesh, 0, plan.placed_jobs, PLACE_EVERY, 0).await?;
    let placing = PLACE_EVERY * plan.placed_jobs as u32 + Duration::from_secs(1);
    let (placement_loaded, placement_load) = tokio::join!(
        placement::measure(&mesh, 0, plan.placed_jobs, PLACE_EVERY, 1),
        load::closed_loop(&mesh, LOAD_CLIENTS, placing, 9),
    );

    eprintln!("failover…");
    let failover_gpumesh = failover::trials(&mut mesh, plan.failover_trials).await?;
    let failover_etcd = match &mut etcd {
        Some(e) => Some(failover::trials(e, plan.failover_trials).await?),
        None => None,
    };

    eprintln!(
        "state growth to {:?} finished jobs…",
        plan.state_checkpoints
    );
    let state = state_growth::measure(&mut mesh, &plan.state_checkpoints, FILL_CLIENTS).await?;
    Ok(Report {
        machine: gpu_bench::report::machine(),
        quick,
        write_bytes,
        fsync,
        writes,
        placement_idle,
        placement_loaded: placement_loaded?,
        placement_load: placement_load?,
        failover_gpumesh,
        failover_etcd,
        state,
    })
}
