//! GPU energy in the replicated state: what each job's GPUs used, and what each node's GPUs
//! used in all (jobs and idle), plus the GPU time spent under a green-mode power cap. Agents
//! measure (NVML's energy counter, or the simulator's model) and report deltas; each report
//! carries a sequence number so a retried proposal is counted once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{JobId, NodeId};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnergyBook {
    /// Millijoules used by each job's GPUs, over all its runs.
    #[serde(default)]
    pub by_job: BTreeMap<JobId, u64>,
    #[serde(default)]
    pub by_node: BTreeMap<NodeId, NodeEnergy>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEnergy {
    /// Millijoules used by the node's GPUs, busy or idle, since they were first reported.
    pub gpu_mj: u64,
    /// GPU-milliseconds spent idle under a green-mode power cap.
    pub green_capped_ms: u64,
    /// The last report counted (reports with this or a lower number are retries).
    pub last_seq: u64,
}

/// One agent's measurements since its previous report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnergyReport {
    pub node: NodeId,
    /// Increasing per node (the agent uses its clock in milliseconds).
    pub seq: u64,
    pub gpu_mj: u64,
    #[serde(default)]
    pub green_capped_ms: u64,
    /// (job, millijoules its GPUs used). A list: integer map keys do not survive the tagged
    /// JSON encoding of `Command`.
    #[serde(default)]
    pub jobs: Vec<(JobId, u64)>,
}

impl EnergyBook {
    /// Count `r` unless it was counted before. Returns whether it was new.
    pub fn record(&mut self, r: &EnergyReport) -> bool {
        let node = self.by_node.entry(r.node).or_default();
        if r.seq <= node.last_seq {
            return false;
        }
        node.last_seq = r.seq;
        node.gpu_mj = node.gpu_mj.saturating_add(r.gpu_mj);
        node.green_capped_ms = node.green_capped_ms.saturating_add(r.green_capped_ms);
        for (job, mj) in &r.jobs {
            let used = self.by_job.entry(*job).or_default();
            *used = used.saturating_add(*mj);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_add_up_and_a_retry_counts_once() {
        let mut book = EnergyBook::default();
        let report = EnergyReport {
            node: 2,
            seq: 10,
            gpu_mj: 5_000,
            green_capped_ms: 1_000,
            jobs: vec![(7, 3_000), (8, 1_000)],
        };
        assert!(book.record(&report));
        assert!(!book.record(&report), "the same report again");
        assert!(book.record(&EnergyReport {
            seq: 11,
            jobs: vec![(7, 500)],
            ..report.clone()
        }));
        assert_eq!(book.by_job[&7], 3_500);
        assert_eq!(book.by_job[&8], 1_000);
        assert_eq!(book.by_node[&2].gpu_mj, 10_000);
        assert_eq!(book.by_node[&2].green_capped_ms, 2_000);
        assert!(
            !book.record(&EnergyReport { seq: 9, ..report }),
            "an older report"
        );
    }
}
