//! Latency summaries: percentiles by the nearest-rank method over recorded samples.

use std::time::Duration;

use serde::Serialize;

/// What a batch of timed operations came to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    /// Summarise `samples` (any order). An empty batch summarises to zeros.
    pub fn of(samples: &[Duration]) -> Summary {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        Summary {
            count: sorted.len(),
            p50_ms: percentile(&sorted, 50.0).map_or(0.0, ms),
            p99_ms: percentile(&sorted, 99.0).map_or(0.0, ms),
            max_ms: sorted.last().copied().map_or(0.0, ms),
        }
    }
}

/// The nearest-rank percentile `p` (0–100] of `sorted` (ascending), `None` when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples = ms(&(1..=100).rev().collect::<Vec<_>>());
        let s = Summary::of(&samples);
        assert_eq!(
            (s.count, s.p50_ms, s.p99_ms, s.max_ms),
            (100, 50.0, 99.0, 100.0)
        );
        let one = Summary::of(&ms(&[7]));
        assert_eq!((one.p50_ms, one.p99_ms, one.max_ms), (7.0, 7.0, 7.0));
    }

    #[test]
    fn an_empty_batch_is_zeros() {
        assert_eq!(Summary::of(&[]), Summary::default());
    }
}
