//! CPU time by thread: where a target's processes spend their CPU, grouped by thread name
//! with its numeric suffix dropped (`sled-io-3` → `sled-io`), read from `/proc` before and
//! after a run. Threads that ended during the run are counted together, as the difference
//! between each process's total and its live threads.

use std::collections::{BTreeMap, HashMap};

use gpu_agent::host::proc_stat::ProcStat;
use gpu_agent::tools::footprint::cpu_ticks;

/// The group of a run's CPU used by threads that ended before it did.
pub const ENDED: &str = "(threads that ended)";

/// One reading: each process's CPU ticks, and each live thread's name and ticks by id.
#[derive(Debug, Default)]
pub struct ThreadTicks {
    total: u64,
    threads: HashMap<u32, (String, u64)>,
}

impl ThreadTicks {
    /// Read the threads of `pids` now (a thread that ends meanwhile is skipped).
    pub fn read(pids: &[u32]) -> anyhow::Result<Self> {
        let mut reading = Self::default();
        for &pid in pids {
            reading.total += cpu_ticks(pid)?;
            for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
                let Some(tid) = task?.file_name().to_str().and_then(|t| t.parse().ok()) else {
                    continue;
                };
                // The thread's own times are under `task/` (`/proc/<tid>/stat` has the
                // whole process's).
                let dir = format!("/proc/{pid}/task/{tid}");
                let name = std::fs::read_to_string(format!("{dir}/comm"));
                let stat = std::fs::read_to_string(format!("{dir}/stat"));
                if let (Ok(name), Some(stat)) = (name, stat.ok().and_then(|s| ProcStat::parse(&s)))
                {
                    reading
                        .threads
                        .insert(tid, (group(name.trim()), stat.cpu_ticks));
                }
            }
        }
        Ok(reading)
    }

    /// The ticks each group used between `before` and this reading.
    pub fn since(&self, before: &ThreadTicks) -> BTreeMap<String, u64> {
        let mut groups = BTreeMap::new();
        let mut live = 0;
        for (tid, (name, ticks)) in &self.threads {
            let earlier = before.threads.get(tid).map_or(0, |(_, t)| *t);
            let used = ticks.saturating_sub(earlier);
            live += used;
            *groups.entry(name.clone()).or_default() += used;
        }
        let ended = self.total.saturating_sub(before.total).saturating_sub(live);
        if ended > 0 {
            groups.insert(ENDED.to_owned(), ended);
        }
        groups
    }
}

/// A thread's group: its name without a trailing number and the separator before it.
fn group(name: &str) -> String {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.len() < name.len() {
        stem.trim_end_matches(['-', '_', ' ']).to_owned()
    } else {
        name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_threads_share_a_group() {
        assert_eq!(group("sled-io-3"), "sled-io");
        assert_eq!(group("sled-io-12"), "sled-io");
        assert_eq!(group("tokio-rt-worker"), "tokio-rt-worker");
        assert_eq!(group("log-flush"), "log-flush");
    }

    #[test]
    fn a_run_counts_new_threads_whole_and_ended_ones_together() {
        let reading = |total, threads: &[(u32, &str, u64)]| ThreadTicks {
            total,
            threads: threads
                .iter()
                .map(|&(tid, name, ticks)| (tid, (name.to_owned(), ticks)))
                .collect(),
        };
        // Thread 2 ended during the run (it had used 5 ticks by then, 3 of them before);
        // thread 3 started during it.
        let before = reading(30, &[(1, "sled-io", 20), (2, "sled-io", 3)]);
        let after = reading(60, &[(1, "sled-io", 40), (3, "log-flush", 8)]);
        let used = after.since(&before);
        assert_eq!(used["sled-io"], 20);
        assert_eq!(used["log-flush"], 8);
        assert_eq!(used[ENDED], 2);
    }
}
