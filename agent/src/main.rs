//! `gpu-agent`: the gpumesh daemon (`run`) and a local development mesh (`dev`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use gpu_agent::config::{Config, FileConfig, Overrides};
use gpu_agent::tools::dev::DevOptions;
use gpu_agent::tools::footprint::Options as FootprintOptions;
use gpu_agent::tools::restore::RestoreOptions;
use tokio_util::sync::CancellationToken;

/// jemalloc, not glibc's malloc: an agent frees large transient buffers all the time (snapshot
/// builds and installs, catch-up batches), and glibc keeps most of what is freed across its
/// arenas, so RSS only grows; jemalloc hands unused pages back within a second (its settings
/// are built in from `.cargo/config.toml`; docs/benchmarks.md, "A lifetime of a million jobs").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "gpu-agent",
    version = gpu_agent::build_info::LONG_VERSION,
    about = "gpumesh agent: one identical daemon per GPU host"
)]
struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Plain,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent (production). Flags override keys of the config file.
    Run(RunArgs),
    /// Start a complete local mesh of agents on loopback, ready for gpuctl.
    Dev(DevOptions),
    /// Replay a workload trace on a simulated cluster under scheduling policies (offline;
    /// drives the same planner the leader uses, in virtual time).
    Simulate(SimulateArgs),
    /// MIG fragmentation: replay a seeded mixed-size stream of MIG requests on A100-80GB GPUs
    /// with first-fit and with fragmentation-aware packing, side by side (offline).
    SimulateMig(SimulateMigArgs),
    /// Time one scheduler pass over many pending jobs on a large simulated cluster.
    BenchPlan(BenchPlanArgs),
    /// Measure the agent's CPU and memory while it monitors simulated GPUs, beside a baseline
    /// agent that samples hourly.
    BenchFootprint(FootprintOptions),
    /// Build the first member of a new cluster from a backup (`gpuctl cluster snapshot save`)
    /// after the old cluster lost its majority for good; then start it with `run` (same node id,
    /// data directory and address) and join the others to it. See docs/operations.md.
    Restore(RestoreOptions),
    /// Shell completions and man pages generated from this command line (used at install).
    #[command(hide = true, subcommand)]
    Generate(Generate),
    /// Internal: supervise one job run (started by the agent's executor).
    #[command(hide = true)]
    Shim(gpu_agent::executor::shim::ShimArgs),
}

/// `run`'s flags: the config file, and the flags that override its keys (defined with the
/// config, `config::Overrides`).
#[derive(clap::Args)]
struct RunArgs {
    /// TOML configuration file (see deploy/config/agent.example.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: Overrides,
}

#[derive(Subcommand)]
enum Generate {
    /// Completions for SHELL on stdout.
    Completion { shell: clap_complete::Shell },
    /// Man pages (gpu-agent.1 and one per subcommand) into DIR.
    Man { dir: PathBuf },
}

fn generate(what: Generate) -> anyhow::Result<()> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    match what {
        Generate::Completion { shell } => {
            let mut cmd = cmd;
            clap_complete::generate(shell, &mut cmd, "gpu-agent", &mut std::io::stdout());
        }
        Generate::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
        }
    }
    Ok(())
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// Trace CSV: the Philly format (timestamp,duration,num_gpus,gpu_time,cluster) or the
    /// generic one (submit,duration,gpus[,tenant,name,priority,estimate]); see docs/scheduling.md.
    #[arg(long)]
    trace: PathBuf,
    /// NODESxGPUSxMODEL, groups joined with '+', e.g. 56x8xV100-32GB; a group ending in
    /// ':shared' or ':mig=PROFILE,...' has its GPUs partitioned so.
    #[arg(long, default_value = "56x8xV100-32GB")]
    cluster: String,
    /// Policies to compare, ORDERING[+BACKFILL]: ordering fcfs|sjf|priority|fairshare|learned,
    /// backfill strict (default)|easy|greedy|conservative.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fcfs,sjf,priority,fairshare,fcfs+easy,sjf+easy"
    )]
    policy: Vec<String>,
    /// Runtime estimates for SJF and backfill: exact (the real durations) or predicted (from
    /// the history of finished jobs, or the trace's estimate column).
    #[arg(long, value_enum, default_value_t = EstimateArg::Predicted)]
    estimates: EstimateArg,
    /// Drop malformed trace rows (reported on stderr) instead of failing.
    #[arg(long)]
    skip_bad_rows: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG chart (utilization over time, JCT CDF) to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Weights for the learned ordering (JSON like agent/src/scheduler/learned_weights.json)
    /// instead of the shipped ones.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Tenants' weights and quotas, CSV tenant,weight,quota (quota: TYPE=G[:B] joined by ';');
    /// see docs/scheduling.md.
    #[arg(long)]
    tenants: Option<PathBuf>,
    /// Preemption in the replay: off, reclaim (quota reclaim from borrowers) or priority.
    #[arg(long, default_value = "off")]
    preemption: gpu_raft_store::scheduler::Preemption,
    /// Seconds of work a preempted run does again when it resumes from its checkpoint.
    #[arg(long, default_value_t = 60)]
    checkpoint_cost_s: u64,
    /// The gang starvation guard in seconds (0: off): a gang pending this long goes first and
    /// holds the queue with a reservation; with preemption on it may stop single-node runs of
    /// no higher priority.
    #[arg(long, default_value_t = 0)]
    gang_wait_limit_s: u64,
    /// A run placed less than this many seconds ago is never preempted (0: off).
    #[arg(long, default_value_t = 0)]
    preempt_exempt_s: u64,
    /// Output on stdout.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputArg::Table)]
    output: OutputArg,
}

#[derive(clap::Args)]
struct SimulateMigArgs {
    /// A100-80GB GPUs in the pool.
    #[arg(long, default_value_t = 16)]
    gpus: usize,
    /// MIG requests in the workload.
    #[arg(long, default_value_t = 5_000)]
    jobs: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output on stdout.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputArg::Table)]
    output: OutputArg,
}

fn simulate_mig(args: SimulateMigArgs) -> anyhow::Result<()> {
    use gpu_agent::tools::simulate::fragmentation;
    anyhow::ensure!(
        args.gpus > 0 && args.jobs > 0,
        "--gpus and --jobs must be at least 1"
    );
    let reports = fragmentation::compare(args.jobs, args.gpus, args.seed);
    match args.output {
        OutputArg::Table => print!("{}", fragmentation::table(&reports)),
        OutputArg::Json => println!("{}", serde_json::to_string_pretty(&reports)?),
    }
    Ok(())
}

#[derive(Clone, Copy, ValueEnum)]
enum EstimateArg {
    Exact,
    Predicted,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputArg {
    Table,
    Json,
}

#[derive(clap::Args)]
struct BenchPlanArgs {
    #[arg(long, default_value_t = 5000)]
    nodes: u64,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Pending jobs.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Policy spec; default: the agent's default policy.
    #[arg(long)]
    policy: Option<String>,
    /// Passes to time (the best is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    use gpu_agent::tools::simulate::{self, Estimates, Options};
    let opts = Options {
        trace: args.trace,
        cluster: args.cluster,
        policies: args.policy,
        estimates: match args.estimates {
            EstimateArg::Exact => Estimates::Exact,
            EstimateArg::Predicted => Estimates::Predicted,
        },
        skip_bad_rows: args.skip_bad_rows,
        json: args.json,
        svg: args.svg,
        weights: args.weights,
        tenants: args.tenants,
        preemption: args.preemption,
        checkpoint_ms: args.checkpoint_cost_s.saturating_mul(1000),
        gang_wait_limit_s: args.gang_wait_limit_s,
        preempt_exempt_s: args.preempt_exempt_s,
    };
    let summaries = simulate::run(&opts)?;
    match args.output {
        OutputArg::Table => print!("{}", simulate::report::table(&summaries)),
        OutputArg::Json => println!("{}", serde_json::to_string_pretty(&summaries)?),
    }
    Ok(())
}

fn bench_plan(args: BenchPlanArgs) -> anyhow::Result<()> {
    let policy = match args.policy {
        Some(p) => p.parse()?,
        None => gpu_agent::scheduler::Policy::default(),
    };
    let result = gpu_agent::tools::simulate::bench::run(
        args.nodes,
        args.gpus_per_node,
        args.jobs,
        &policy,
        args.repeat,
        args.seed,
    )?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

fn offline(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        Cmd::Shim(args) => return gpu_agent::executor::shim::run(args),
        Cmd::Simulate(args) => return offline(simulate(args)),
        Cmd::SimulateMig(args) => return offline(simulate_mig(args)),
        Cmd::BenchPlan(args) => return offline(bench_plan(args)),
        Cmd::Generate(what) => return offline(generate(what)),
        other => other,
    };
    init_tracing(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(command: Cmd) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        on_signal.cancel();
    });
    match command {
        Cmd::Run(args) => run_agent(args, cancel).await,
        Cmd::Dev(options) => gpu_agent::tools::dev::run(options, cancel).await,
        Cmd::BenchFootprint(options) => gpu_agent::tools::footprint::run(options).await,
        Cmd::Restore(args) => restore(args).await,
        Cmd::Shim(_)
        | Cmd::Simulate(_)
        | Cmd::SimulateMig(_)
        | Cmd::BenchPlan(_)
        | Cmd::Generate(_) => {
            anyhow::bail!("this command runs without the agent runtime")
        }
    }
}

/// `gpu-agent run`: the configuration (file, then flags over it), then the daemon until
/// `cancel`.
async fn run_agent(args: RunArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    let points = gpu_raft_store::failpoint::setup().map_err(anyhow::Error::msg)?;
    if gpu_raft_store::failpoint::ENABLED {
        tracing::warn!(
            ?points,
            "built with the failpoints feature: for chaos tests only"
        );
    }
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let config =
        Config::parse_and_validate(file, args.overrides).context("invalid configuration")?;
    gpu_agent::daemon::run(config, cancel).await
}

/// `gpu-agent restore`: a new first member built from a backup; prints how to start it.
async fn restore(o: RestoreOptions) -> anyhow::Result<()> {
    let r = gpu_agent::tools::restore::run(&o).await?;
    println!(
        "restored index {} of cluster {} ({} jobs, {} nodes) into {}; new CA and admin \
         certificate in {}. Start it: gpu-agent run --node-id {} --data-dir {} ...",
        r.index,
        r.cluster_id,
        r.jobs,
        r.nodes,
        o.data_dir.display(),
        o.credentials_dir.display(),
        o.node_id,
        o.data_dir.display()
    );
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            tokio::signal::ctrl_c().await.ok();
        }
    }
}

/// Logs on stderr, `RUST_LOG` (default: info, and openraft's errors only). ERROR is kept for
/// what needs a human: openraft logs at ERROR every failed RPC to a peer that is down or
/// restarting, which a planned restart must not page anyone for, and a membership change it
/// refused because another is under way, which the agent retries (`routine_error`). That peer
/// shows as unreachable in `gpuctl cluster members`, and a node that stays away is declared
/// Down (a WARN, and an alert) by the leader; a membership change that keeps failing is
/// logged by the agent itself.
///
/// One filter, both conditions (`FilterExt::and`): each call site is then enabled or disabled
/// once and for all. Two filters stacked on the layer would have disagreed on every debug and
/// trace call site (the level filter says never, the other always), which makes each of them,
/// thousands per write in openraft, h2 and tonic, evaluated anew on every call (it cost a
/// quarter of the write path).
fn init_tracing(format: LogFormat) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{FilterExt, LevelFilter};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let levels = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error"));
    let routine = tracing_subscriber::filter::filter_fn(|meta| !routine_error(meta))
        .with_max_level_hint(LevelFilter::TRACE);
    // Colours only on a terminal: journald and log shippers get plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let layer = match format {
        LogFormat::Plain => layer.boxed(),
        LogFormat::Json => layer.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(levels.and(routine)))
        .init();
}

/// openraft's ERROR events that the agent handles: one peer's RPC failing (every one of
/// replication's, a heartbeat or an append to a peer that does not answer, and the core's that
/// name the peer, `target`: a read-index confirmation or a vote request that timed out or
/// failed), and a membership change's step refused (`impl_raft_blocking_write`: the error is
/// also returned to the agent, which retries, as when two nodes join at once).
fn routine_error(meta: &tracing::Metadata<'_>) -> bool {
    *meta.level() == tracing::Level::ERROR
        && (meta.target() == "openraft::replication"
            || meta.target() == "openraft::raft::impl_raft_blocking_write"
            || (meta.target() == "openraft::core::raft_core"
                && meta.fields().field("target").is_some()))
}
