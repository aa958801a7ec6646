//! GPU monitoring on every agent: the sampler reads this node's GPUs at a fixed interval into
//! a bounded in-memory history (telemetry is never replicated), which `gpuctl gpu list|stats`
//! and the Prometheus `/metrics` endpoint read.

pub(crate) mod alerting;
pub(crate) mod attribution;
pub(crate) mod foreign;
pub(crate) mod history;
pub(crate) mod metrics_http;
pub(crate) mod power;
pub(crate) mod power_task;
pub(crate) mod prometheus;
pub(crate) mod rules;
pub(crate) mod sampler;
pub(crate) mod webhook;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub(crate) use history::{History, Reading};

use crate::gpu::GpuSample;

/// The telemetry history, shared by the sampler (the one writer) and the readers.
#[derive(Clone)]
pub(crate) struct Telemetry {
    history: Arc<Mutex<History>>,
}

impl Telemetry {
    /// A history keeping the last `per_gpu` samples of each GPU.
    pub(crate) fn new(per_gpu: usize) -> Self {
        Self {
            history: Arc::new(Mutex::new(History::new(per_gpu))),
        }
    }

    pub(crate) fn record(&self, at_ms: u64, samples: Vec<GpuSample>) {
        self.lock().record(at_ms, samples);
    }

    /// The newest reading of every GPU, in index order.
    pub(crate) fn latest(&self) -> Vec<Reading> {
        self.lock().latest().cloned().collect()
    }

    /// GPU `index`'s readings taken at or after `from_ms`, oldest first.
    pub(crate) fn since(&self, index: u32, from_ms: u64) -> Vec<Reading> {
        self.lock().since(index, from_ms).cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
