//! `gpu-chaos`: run named chaos scenarios against real 3- or 5-agent clusters, or a seeded random
//! mix of them for a while (the soak). Prints the seed first and each run's summary, writes
//! every run's files (`report.json`, `timeline.svg`, the history) under `--out`, and exits 0
//! when no checker found anything, 1 on any violation, 2 on error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpu_chaos::catalog::{self, Entry};
use gpu_chaos::netns::Netns;
use gpu_chaos::scenario::{self, Report};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Fault injection against real gpumesh agents, with history checkers.
#[derive(Parser)]
#[command(name = "gpu-chaos", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the named scenarios one after another (`gpu-chaos list` names them).
    Run {
        /// Scenario names: c1, c3, c5, c9, c10-paused, c10-cut, c16, c17.
        #[arg(required = true)]
        scenarios: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Run a seeded random mix of scenarios until the time is up.
    Soak {
        /// Start scenarios until this many minutes have passed.
        #[arg(long, default_value_t = 30)]
        minutes: u64,
        #[command(flatten)]
        common: Common,
    },
    /// List the scenarios.
    List,
}

#[derive(clap::Args)]
struct Common {
    /// The seed (decimal or 0x hex); `run` defaults to each scenario's fixed seed, `soak` to a
    /// random one. `GPUMESH_CHAOS_SEED` is the default for both.
    #[arg(long, env = gpu_chaos::seed::SEED_ENV, value_parser = parse_seed)]
    seed: Option<u64>,
    /// Where each run's directory (`<scenario>-<seed>/`) goes.
    #[arg(long, default_value = "target/gpu-chaos")]
    out: PathBuf,
}

fn parse_seed(s: &str) -> Result<u64, String> {
    gpu_chaos::seed::parse(s).map_err(|e| e.to_string())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.command).await {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("gpu-chaos: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Run the command; the number of violations found.
async fn dispatch(command: Command) -> anyhow::Result<usize> {
    match command {
        Command::List => {
            for e in catalog::ALL {
                let netns = if e.nemesis.needs_netns() {
                    " (network namespaces: needs root)"
                } else {
                    ""
                };
                println!("{:<11} {} seed {}{netns}", e.short, e.name, e.default_seed);
            }
            Ok(0)
        }
        Command::Run { scenarios, common } => {
            let entries = scenarios
                .iter()
                .map(|s| {
                    catalog::find(s).with_context(|| {
                        format!("unknown scenario {s:?} (known: {})", catalog::names())
                    })
                })
                .collect::<anyhow::Result<Vec<Entry>>>()?;
            match common.seed {
                Some(seed) => println!("seed {seed}"),
                None => println!("seed: each scenario's default (--seed N overrides)"),
            }
            check_agent()?;
            let mut violations = 0;
            for e in entries {
                let seed = common.seed.unwrap_or(e.default_seed);
                violations += run_one(e, seed, &common.out).await?;
            }
            Ok(violations)
        }
        Command::Soak { minutes, common } => {
            let seed = common.seed.unwrap_or_else(rand::random);
            println!("seed {seed} (reproduce with --seed {seed})");
            check_agent()?;
            soak(Duration::from_secs(minutes * 60), seed, &common.out).await
        }
    }
}

/// Fail early, with the fix, when `gpu-agent` was not built beside this binary.
fn check_agent() -> anyhow::Result<()> {
    gpu_tests::find_bin("gpu-agent")
        .map(drop)
        .map_err(|missing| {
            anyhow::anyhow!(
                "{} is missing: build the agent with the same profile first \
             (`cargo build --release --bins`)",
                missing.display()
            )
        })
}

/// Run `e` with `seed` (skipped with a message when it needs network namespaces that are not
/// available); print its summary and violations; the number of violations.
async fn run_one(e: Entry, seed: u64, out: &Path) -> anyhow::Result<usize> {
    if e.nemesis.needs_netns()
        && let Some(why) = Netns::unavailable()
    {
        println!("skipping {}: {why}", e.name);
        return Ok(0);
    }
    let report: Report = scenario::run(e.name, seed, e.nemesis, out)
        .await
        .with_context(|| format!("{} (seed {seed}) did not complete", e.name))?;
    println!("{}", report.summary());
    for v in &report.violations {
        println!("  violation {v}");
    }
    println!(
        "  wrote {} and {}",
        report.dir.join("report.json").display(),
        report.dir.join("timeline.svg").display()
    );
    Ok(report.violations.len())
}

/// Start scenarios drawn from `seed` (each with its own drawn seed) until `length` has passed.
async fn soak(length: Duration, seed: u64, out: &Path) -> anyhow::Result<usize> {
    let pool: Vec<Entry> = catalog::ALL
        .iter()
        .copied()
        .filter(|e| !e.nemesis.needs_netns() || Netns::unavailable().is_none())
        .collect();
    if let Some(why) = Netns::unavailable() {
        println!("soak without the partition scenarios: {why}");
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let (mut runs, mut violations) = (0usize, 0usize);
    while start.elapsed() < length {
        let e = pool[rng.random_range(0..pool.len())];
        let run_seed: u64 = rng.random();
        println!(
            "soak {:.0}s/{:.0}s: {} --seed {run_seed}",
            start.elapsed().as_secs_f64(),
            length.as_secs_f64(),
            e.short
        );
        violations += run_one(e, run_seed, out).await?;
        runs += 1;
    }
    println!(
        "soak seed {seed}: {runs} run(s) in {:.0}s, {violations} violation(s)",
        start.elapsed().as_secs_f64()
    );
    Ok(violations)
}
