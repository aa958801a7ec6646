//! The telemetry history: one fixed-capacity ring of timestamped samples per GPU. Its memory
//! is bounded by construction (capacity × GPUs); the oldest reading makes room for the newest.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::gpu::GpuSample;

/// One sample of one GPU, with the wall-clock time it was taken.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Reading {
    pub at_ms: u64,
    pub sample: GpuSample,
}

pub(crate) struct History {
    per_gpu: usize,
    gpus: BTreeMap<u32, VecDeque<Reading>>,
}

impl History {
    /// Keeps the last `per_gpu` readings of each GPU (at least one).
    pub(crate) fn new(per_gpu: usize) -> Self {
        Self {
            per_gpu: per_gpu.max(1),
            gpus: BTreeMap::new(),
        }
    }

    /// Adds one sample of each GPU taken at `at_ms`. A reading older than the GPU's newest
    /// (the wall clock stepped back) is still kept, in arrival order.
    pub(crate) fn record(&mut self, at_ms: u64, samples: Vec<GpuSample>) {
        for sample in samples {
            let ring = self.gpus.entry(sample.index).or_default();
            if ring.len() == self.per_gpu {
                ring.pop_front();
            }
            ring.push_back(Reading { at_ms, sample });
        }
    }

    /// The newest reading of each GPU, in index order.
    pub(crate) fn latest(&self) -> impl Iterator<Item = &Reading> {
        self.gpus.values().filter_map(VecDeque::back)
    }

    /// GPU `index`'s readings taken at or after `from_ms`, oldest first.
    pub(crate) fn since(&self, index: u32, from_ms: u64) -> impl Iterator<Item = &Reading> {
        self.gpus
            .get(&index)
            .into_iter()
            .flatten()
            .filter(move |r| r.at_ms >= from_ms)
    }

    /// Readings held, over all GPUs (tests: the memory bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.gpus.values().map(VecDeque::len).sum()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(index: u32, utilization_pct: f32) -> GpuSample {
        GpuSample {
            utilization_pct,
            ..GpuSample::empty(index)
        }
    }

    #[test]
    fn keeps_the_newest_readings_of_each_gpu_within_its_capacity() {
        let mut h = History::new(3);
        assert!(h.is_empty());
        for t in 0..10u64 {
            h.record(t * 1000, vec![sample(0, t as f32), sample(1, 100.0)]);
        }
        assert_eq!(h.len(), 6, "3 per GPU, whatever was recorded");
        let latest: Vec<(u32, u64)> = h.latest().map(|r| (r.sample.index, r.at_ms)).collect();
        assert_eq!(latest, [(0, 9000), (1, 9000)]);
        let since: Vec<f32> = h.since(0, 8000).map(|r| r.sample.utilization_pct).collect();
        assert_eq!(since, [8.0, 9.0]);
        let all: Vec<u64> = h.since(0, 0).map(|r| r.at_ms).collect();
        assert_eq!(all, [7000, 8000, 9000], "the oldest made room");
        assert_eq!(h.since(7, 0).count(), 0, "an unknown GPU has no history");
    }

    #[test]
    fn a_zero_capacity_still_keeps_the_latest() {
        let mut h = History::new(0);
        h.record(1, vec![sample(0, 1.0)]);
        h.record(2, vec![sample(0, 2.0)]);
        assert_eq!(h.len(), 1);
        assert_eq!(h.latest().next().map(|r| r.at_ms), Some(2));
    }
}
