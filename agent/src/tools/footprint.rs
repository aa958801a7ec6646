//! `gpu-agent bench-footprint`: the agent's own cost, measured. Two real agents run side by
//! side on loopback, each a one-node cluster with the same simulated GPUs: one sampling at the
//! interval under test, the baseline sampling once an hour (so it differs only by monitoring).
//! After a warm-up, both are measured over the same seconds from /proc: CPU time as a share of
//! one core, and resident memory. Also printed: the bound on the telemetry history's memory.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::host::proc_stat::ProcStat;
use crate::monitor::Reading;

/// What one agent cost over the measured window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// CPU time used / wall time, in percent of one core.
    pub cpu_pct: f64,
    /// Resident memory at the end, and the most seen, in MiB.
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
}

/// `gpu-agent bench-footprint`'s options (also its command line).
#[derive(clap::Args)]
pub struct Options {
    /// Seconds to measure (after a 5 s warm-up).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    #[arg(long, default_value = "8xA100-80GB")]
    pub sim_gpus: String,
    /// Sampling interval under test.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Telemetry history kept (for the memory bound).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub retention: Duration,
}

pub async fn run(opts: Options) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("creating a scratch directory")?;
    let exe = std::env::current_exe().context("locating gpu-agent")?;
    let mut measured = start(&exe, dir.path(), "measured", &opts, opts.interval).await?;
    let mut baseline = start(
        &exe,
        dir.path(),
        "baseline",
        &opts,
        Duration::from_secs(3600),
    )
    .await?;
    println!(
        "agents up (pids {} and {}); warming up for 5 s",
        measured.id().unwrap_or(0),
        baseline.id().unwrap_or(0)
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pids = [pid(&measured)?, pid(&baseline)?];
    let window = Duration::from_secs(opts.seconds);
    let costs = measure(pids, window).await?;
    measured.kill().await.ok();
    baseline.kill().await.ok();

    let gpus = crate::gpu::sim::parse_spec(&opts.sim_gpus)?
        .iter()
        .map(|(_, n)| *n as usize)
        .sum::<usize>();
    let per_gpu = (opts.retention.as_millis() / opts.interval.as_millis().max(1)) as usize;
    let bound_mib = (gpus * per_gpu * reading_bytes()) as f64 / (1024.0 * 1024.0);
    println!(
        "{} simulated GPUs ({}), measured over {} s on this machine",
        gpus, opts.sim_gpus, opts.seconds
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10}",
        "", "CPU %core", "RSS MiB", "peak MiB"
    );
    for (name, c) in [
        (format!("sampling every {:?}", opts.interval), costs[0]),
        ("baseline (hourly)".to_owned(), costs[1]),
    ] {
        println!(
            "{name:<28} {:>10.2} {:>10.1} {:>10.1}",
            c.cpu_pct, c.rss_mib, c.peak_rss_mib
        );
    }
    println!(
        "monitoring's share: {:+.2} % of a core, {:+.1} MiB",
        costs[0].cpu_pct - costs[1].cpu_pct,
        costs[0].rss_mib - costs[1].rss_mib
    );
    println!(
        "telemetry history bound: {gpus} GPUs x {per_gpu} readings x {} B = {bound_mib:.1} MiB \
         (retention {:?})",
        reading_bytes(),
        opts.retention
    );
    Ok(())
}

/// One reading's memory in the history when it holds no XIDs, processes or error (the common
/// case; each process entry adds `size_of::<GpuProcess>()` on the heap).
pub fn reading_bytes() -> usize {
    std::mem::size_of::<Reading>()
}

async fn start(
    exe: &Path,
    dir: &Path,
    name: &str,
    opts: &Options,
    interval: Duration,
) -> anyhow::Result<Child> {
    let data = dir.join(name);
    let config = dir.join(format!("{name}.toml"));
    let listen = free_port()?;
    std::fs::write(
        &config,
        format!(
            "[monitor]\ninterval = \"{}\"\nretention = \"{}\"\n",
            humantime::format_duration(interval),
            humantime::format_duration(opts.retention.max(interval)),
        ),
    )?;
    let mut child = Command::new(exe)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .args([
            "--node-id",
            "1",
            "--listen",
            &listen,
            "--bootstrap",
            "--insecure",
        ])
        .args(["--gpu-backend", "sim", "--sim-gpus", &opts.sim_gpus])
        .arg("--data-dir")
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting an agent")?;
    let up = Instant::now();
    while up.elapsed() < Duration::from_secs(30) {
        if std::fs::metadata(data.join("bootstrap-admin.token")).is_ok() {
            return Ok(child);
        }
        if let Some(status) = child.try_wait()? {
            bail!("the {name} agent exited at start ({status})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the {name} agent did not start within 30 s")
}

fn pid(child: &Child) -> anyhow::Result<u32> {
    child.id().context("the agent has already exited")
}

fn free_port() -> anyhow::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// CPU share and memory of each of `pids` over `window`, sampled once a second.
async fn measure<const N: usize>(pids: [u32; N], window: Duration) -> anyhow::Result<[Cost; N]> {
    let ticks = clock_ticks()?;
    let rss = |pid: u32| -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        rss_kib(&status).with_context(|| format!("parsing /proc/{pid}/status"))
    };
    let start = Instant::now();
    let before: Vec<u64> = pids
        .iter()
        .map(|&p| cpu_ticks(p))
        .collect::<anyhow::Result<_>>()?;
    let mut peak = [0u64; N];
    let mut last = [0u64; N];
    while start.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(1).min(window)).await;
        for (i, &p) in pids.iter().enumerate() {
            last[i] = rss(p)?;
            peak[i] = peak[i].max(last[i]);
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let mut costs = [Cost {
        cpu_pct: 0.0,
        rss_mib: 0.0,
        peak_rss_mib: 0.0,
    }; N];
    for (i, &p) in pids.iter().enumerate() {
        let used = (cpu_ticks(p)? - before[i]) as f64 / ticks as f64;
        costs[i] = Cost {
            cpu_pct: used / wall * 100.0,
            rss_mib: last[i] as f64 / 1024.0,
            peak_rss_mib: peak[i] as f64 / 1024.0,
        };
    }
    Ok(costs)
}

/// The CPU time (user and system) process `pid` has used so far, in clock ticks.
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    ProcStat::of(pid)
        .map(|s| s.cpu_ticks)
        .with_context(|| format!("reading /proc/{pid}/stat"))
}

/// Clock ticks per second: the unit of `/proc/<pid>/stat`'s CPU times.
pub fn clock_ticks() -> anyhow::Result<u64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .context("sysconf(CLK_TCK)")?
        .context("CLK_TCK is not set")?;
    u64::try_from(ticks).context("a negative CLK_TCK")
}

/// `VmRSS` in KiB from `/proc/<pid>/status`.
pub fn rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_from_proc() {
        let status = "Name:\tgpu-agent\nVmPeak:\t  99999 kB\nVmRSS:\t   23456 kB\nThreads:\t9\n";
        assert_eq!(rss_kib(status), Some(23_456));
        assert_eq!(rss_kib("Name:\tx\n"), None);
        let me = std::fs::read_to_string("/proc/self/status").expect("our own status");
        assert!(rss_kib(&me).is_some_and(|k| k > 0));
    }
}
