//! Closed-loop load: N clients, each issuing one write after another for a fixed time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use gpu_agent::tools::footprint::clock_ticks;
use serde::Serialize;

use crate::stats::Summary;
use crate::target::Target;
use crate::thread_cpu::ThreadTicks;

/// The outcome of one load run.
#[derive(Clone, Debug, Serialize)]
pub struct LoadResult {
    pub clients: usize,
    pub acked: usize,
    pub errors: usize,
    pub seconds: f64,
    pub writes_per_s: f64,
    pub latency: Summary,
    /// CPU time (user and system) the target's processes spent per acked write, in
    /// milliseconds; the clients' own is not counted.
    pub cpu_ms_per_write: f64,
    /// The same, by group of the target's threads (`thread_cpu`).
    pub cpu_ms_per_write_by_thread: BTreeMap<String, f64>,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

/// Run `clients` clients against `target` for `run_for`; `run` numbers the run so sequence
/// numbers never repeat across runs.
pub async fn closed_loop<T: Target>(
    target: &T,
    clients: usize,
    run_for: Duration,
    run: u64,
) -> anyhow::Result<LoadResult> {
    let mut conns = Vec::with_capacity(clients);
    for c in 0..clients {
        conns.push(target.connect(c).await?);
    }
    let pids = target.pids();
    let cpu_before = ThreadTicks::read(&pids)?;
    let start = Instant::now();
    let deadline = start + run_for;
    let loops = conns
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| async move {
            let mut latencies = Vec::new();
            let mut errors = Vec::new();
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let id = (run << 48) | ((c as u64) << 32) | seq;
                let t = Instant::now();
                match target.write(&mut conn, id).await {
                    Ok(()) => latencies.push(t.elapsed()),
                    Err(e) => errors.push(format!("{e:#}")),
                }
                seq += 1;
            }
            (latencies, errors)
        });
    let per_client = join_all(loops).await;
    let seconds = start.elapsed().as_secs_f64();
    let cpu = ThreadTicks::read(&pids)?.since(&cpu_before);
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    for (l, e) in per_client {
        latencies.extend(l);
        errors.extend(e);
    }
    let ticks_per_s = clock_ticks()? as f64;
    let ms_per_write =
        |ticks: u64| ticks as f64 * 1000.0 / ticks_per_s / latencies.len().max(1) as f64;
    Ok(LoadResult {
        clients,
        acked: latencies.len(),
        errors: errors.len(),
        seconds,
        writes_per_s: latencies.len() as f64 / seconds,
        latency: Summary::of(&latencies),
        cpu_ms_per_write: ms_per_write(cpu.values().sum()),
        cpu_ms_per_write_by_thread: cpu
            .into_iter()
            .map(|(group, ticks)| (group, ms_per_write(ticks)))
            .collect(),
        first_error: errors.into_iter().next(),
    })
}
