//! Runtime prediction from history: the median of the most recent runs with the same
//! signature (tenant, name, command, GPU count), else of the tenant's recent runs. Used by SJF
//! and backfill for jobs that carry no estimate of their own.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use gpu_raft_store::{ClusterState, JobSpec, JobState};

/// How many recent runs each key remembers.
const KEEP: usize = 32;

/// Recent runtimes per job signature and per tenant, with their medians kept up to date so a
/// prediction is one map lookup.
#[derive(Clone, Debug, Default)]
pub struct RuntimeHistory {
    by_signature: HashMap<u64, Recent, BuildHasherDefault<KeyHasher>>,
    by_tenant: HashMap<u64, Recent, BuildHasherDefault<KeyHasher>>,
}

#[derive(Clone, Debug, Default)]
struct Recent {
    runs_ms: Vec<u64>,
    next: usize,
    median_ms: u64,
}

impl Recent {
    fn push(&mut self, runtime_ms: u64) {
        if self.runs_ms.len() < KEEP {
            self.runs_ms.push(runtime_ms);
        } else {
            self.runs_ms[self.next] = runtime_ms;
        }
        self.next = (self.next + 1) % KEEP;
        let mut sorted = self.runs_ms.clone();
        sorted.sort_unstable();
        self.median_ms = sorted[sorted.len() / 2];
    }
}

impl RuntimeHistory {
    /// Remember that a job with `spec` ran for `runtime_ms`.
    pub fn record(&mut self, spec: &JobSpec, runtime_ms: u64) {
        self.by_signature
            .entry(signature(spec))
            .or_default()
            .push(runtime_ms);
        self.by_tenant
            .entry(tenant_key(spec))
            .or_default()
            .push(runtime_ms);
    }

    /// The predicted runtime of a job with `spec`, if anything like it ran before.
    pub fn predict_ms(&self, spec: &JobSpec) -> Option<u64> {
        self.by_signature
            .get(&signature(spec))
            .or_else(|| self.by_tenant.get(&tenant_key(spec)))
            .map(|r| r.median_ms)
    }

    /// The history of the jobs that succeeded in `state`, in the order they finished.
    pub fn from_state(state: &ClusterState) -> Self {
        let mut runs: Vec<(u64, &JobSpec, u64)> = state
            .jobs
            .values()
            .filter(|j| j.state == JobState::Succeeded)
            .filter_map(|j| {
                let (start, end) = (j.started_at_ms?, j.finished_at_ms?);
                Some((end, &j.spec, end.saturating_sub(start)))
            })
            .collect();
        runs.sort_by_key(|(end, _, _)| *end);
        let mut history = Self::default();
        for (_, spec, runtime) in runs {
            history.record(spec, runtime);
        }
        history
    }
}

/// Jobs are "the same" when tenant, name, command and GPU count match. Running jobs' ends
/// are predicted on every pass that reserves, so keys use foldhash, which hashes a word at a
/// time (the keys come from the replicated state, not from an attacker choosing collisions
/// per agent, and stay on this agent).
fn signature(spec: &JobSpec) -> u64 {
    KEYS.hash_one((&spec.tenant, &spec.name, &spec.command, spec.gpus))
}

fn tenant_key(spec: &JobSpec) -> u64 {
    KEYS.hash_one(&spec.tenant)
}

/// A fixed seed: the same keys in every pass and every replay.
const KEYS: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x6770_756d_6573_6821);

/// 64-bit FNV-1a: the hasher of the scheduler's per-pass tenant maps and job-id sets.
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The maps' keys are already hashes: use them as they are.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testkit::spec;

    #[test]
    fn predicts_the_median_of_the_same_signature_then_of_the_tenant() {
        let mut h = RuntimeHistory::default();
        let train = |name: &str| gpu_raft_store::JobSpec {
            name: name.into(),
            ..spec(1, 0)
        };
        assert_eq!(h.predict_ms(&train("a")), None);
        for ms in [100, 300, 200] {
            h.record(&train("a"), ms);
        }
        h.record(&train("b"), 5_000);
        assert_eq!(h.predict_ms(&train("a")), Some(200));
        assert_eq!(h.predict_ms(&train("b")), Some(5_000));
        // Never seen: the tenant's median over all four runs.
        assert_eq!(h.predict_ms(&train("c")), Some(300));
        let other_tenant = gpu_raft_store::JobSpec {
            tenant: "other".into(),
            ..train("a")
        };
        assert_eq!(h.predict_ms(&other_tenant), None);
    }

    #[test]
    fn only_recent_runs_count() {
        let mut h = RuntimeHistory::default();
        for _ in 0..KEEP {
            h.record(&spec(1, 0), 10);
        }
        for _ in 0..=KEEP / 2 {
            h.record(&spec(1, 0), 99);
        }
        assert_eq!(h.predict_ms(&spec(1, 0)), Some(99));
    }
}
