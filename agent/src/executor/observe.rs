//! Observation: the runs this node has, read from its job directories and supervisor
//! processes, and the GPUs those runs keep busy.

use std::collections::HashMap;
use std::time::Duration;

use gpu_raft_store::{Job, JobId};

use super::Executor;
use super::job_dir::{JobDir, Supervisor};
use super::reconcile::Observed;
use super::vm;

/// A supervisor still in start-up may take this long to write its pid.
const START_GRACE: Duration = Duration::from_secs(10);

impl Executor {
    /// Every run in the jobs directory, as the diff sees it. A run whose end was reported is
    /// over: only that is read of it (a node that ran thousands of short jobs keeps their
    /// directories for `jobs.keep_finished_runs`, and every pass looks at each).
    pub(super) fn observe(&self) -> std::io::Result<Vec<Observed>> {
        Ok(JobDir::scan(&self.settings.jobs_dir)?
            .into_iter()
            .map(|d| {
                if d.is_reported() {
                    return Observed {
                        job: d.job,
                        generation: d.generation,
                        alive: false,
                        starting: false,
                        exit: None,
                        stop_requested: false,
                        reported: true,
                    };
                }
                let supervisor = d.supervisor();
                // A vm run has no process: it is live until its exit is recorded.
                let vm = vm::is_vm(&d);
                let alive = if vm {
                    d.exit().is_none()
                } else {
                    supervisor.as_ref().is_some_and(Supervisor::is_running)
                };
                Observed {
                    job: d.job,
                    generation: d.generation,
                    alive,
                    starting: !vm && supervisor.is_none() && d.age() < START_GRACE,
                    exit: d.exit(),
                    stop_requested: d.stop_reason().is_some(),
                    reported: d.is_reported(),
                }
            })
            .collect())
    }

    /// Tell the GPU backend which GPUs a live run of the current generation holds.
    pub(super) fn mark_busy_gpus(&self, jobs: &HashMap<JobId, Job>, observed: &[Observed]) {
        let busy: Vec<u32> = observed
            .iter()
            .filter(|o| o.alive)
            .filter_map(|o| jobs.get(&o.job).filter(|j| j.generation == o.generation))
            .filter_map(|j| j.member_on(self.cluster.id).map(|(_, b)| b))
            .flat_map(|b| b.gpus.iter().copied())
            .collect();
        for device in self.gpus.devices() {
            self.gpus
                .set_busy(device.index, busy.contains(&device.index));
        }
    }
}
