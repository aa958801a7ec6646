//! The sampling task: every `interval`, read all of this node's GPUs (off the async runtime,
//! since NVML calls block) into the telemetry history. A read that takes longer than `timeout`
//! (a hung driver) is abandoned: no new read starts until it returns, which is logged once, and
//! sampling resumes by itself. A GPU's read errors are logged when they start and when they stop,
//! not every second.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Telemetry;
use crate::clock::now_ms;
use crate::gpu::{GpuBackend, GpuSample};

pub(crate) struct Sampler {
    pub gpus: Arc<dyn GpuBackend>,
    pub telemetry: Telemetry,
    pub interval: Duration,
    pub timeout: Duration,
}

impl Sampler {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut stuck: Option<JoinHandle<Vec<GpuSample>>> = None;
        let mut errors = ErrorLog::default();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if let Some(read) = &stuck {
                if !read.is_finished() {
                    continue;
                }
                info!("the GPU read that hung has returned; sampling resumes");
                stuck = None;
            }
            let gpus = self.gpus.clone();
            let mut read = tokio::task::spawn_blocking(move || gpus.sample());
            match tokio::time::timeout(self.timeout, &mut read).await {
                Ok(Ok(samples)) => {
                    errors.note(&samples);
                    self.telemetry.record(now_ms(), samples);
                }
                Ok(Err(panicked)) => warn!(error = %panicked, "reading the GPUs failed"),
                Err(_) => {
                    warn!(
                        timeout = ?self.timeout,
                        "reading the GPUs takes too long (a hung driver?); no new read starts \
                         until it returns"
                    );
                    stuck = Some(read);
                }
            }
        }
    }
}

/// The read error each GPU last reported, so a persistent one is logged once.
#[derive(Default)]
struct ErrorLog {
    last: BTreeMap<u32, String>,
}

impl ErrorLog {
    fn note(&mut self, samples: &[GpuSample]) {
        for s in samples {
            match (&s.error, self.last.get(&s.index)) {
                (Some(now), Some(before)) if now == before => {}
                (Some(now), _) => {
                    warn!(gpu = s.index, error = %now, "reading the GPU failed");
                    self.last.insert(s.index, now.clone());
                }
                (None, Some(_)) => {
                    info!(gpu = s.index, "the GPU reads cleanly again");
                    self.last.remove(&s.index);
                }
                (None, None) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;
    use crate::gpu::{Fault, GpuDevice, GpuError};

    /// A backend whose reads block while `hang` is set, counting the reads that started.
    struct Hanging {
        hang: AtomicBool,
        reads: AtomicU32,
    }

    impl GpuBackend for Hanging {
        fn name(&self) -> &'static str {
            "hanging"
        }
        fn devices(&self) -> Vec<GpuDevice> {
            Vec::new()
        }
        fn sample(&self) -> Vec<GpuSample> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            while self.hang.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            vec![GpuSample::empty(0)]
        }
        fn set_busy(&self, _: u32, _: bool) {}
        fn set_power_limit(&self, _: u32, _: u32) -> Result<(), GpuError> {
            Ok(())
        }
        fn inject(&self, _: u32, _: Fault) -> Result<(), GpuError> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_read_is_abandoned_and_not_piled_on_then_sampling_resumes() {
        let backend = Arc::new(Hanging {
            hang: AtomicBool::new(true),
            reads: AtomicU32::new(0),
        });
        let telemetry = Telemetry::new(100);
        let sampler = Sampler {
            gpus: backend.clone(),
            telemetry: telemetry.clone(),
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(20),
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(sampler.run(cancel.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            backend.reads.load(Ordering::SeqCst),
            1,
            "one hung read, no pile-up"
        );
        assert!(telemetry.latest().is_empty());

        backend.hang.store(false, Ordering::SeqCst);
        let mut waited = 0;
        while telemetry.latest().is_empty() && waited < 500 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waited += 1;
        }
        assert_eq!(telemetry.latest().len(), 1, "sampling resumed");
        cancel.cancel();
        task.await.expect("the sampler ends on cancel");
    }

    #[test]
    fn a_persistent_error_is_noted_once() {
        let failing = |index: u32, error: Option<&str>| GpuSample {
            error: error.map(str::to_owned),
            ..GpuSample::empty(index)
        };
        let mut log = ErrorLog::default();
        log.note(&[
            failing(0, Some("power usage: Unknown Error")),
            failing(1, None),
        ]);
        assert_eq!(log.last.len(), 1);
        log.note(&[failing(0, Some("power usage: Unknown Error"))]);
        assert_eq!(
            log.last.get(&0).map(String::as_str),
            Some("power usage: Unknown Error")
        );
        log.note(&[failing(0, None)]);
        assert!(log.last.is_empty());
    }
}
