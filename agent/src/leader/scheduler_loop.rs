//! The leader-only scheduling loop: plan on every applied change and on a tick with the
//! replicated scheduler settings and the leader's clock as "now", propose the placements as
//! one `BindJobs` entry; when nothing could be placed and preemption is on, the runs to stop
//! as one `PreemptJobs`.
//!
//! A pass on an applied change places as soon as it can and nothing more. The tick's pass also
//! explains what stays pending (one `NoteUnschedulable` for the reasons that changed) and
//! rebuilds the usage and history terms from the finished jobs: both cost time in the number
//! of jobs, and doing them on every entry made each submission cost a second Raft entry and a
//! scan of the whole history. Reasons and usage are therefore at most one tick old.

use std::time::Duration;

use gpu_raft_store::{ApplyResult, Command};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::raft::Cluster;
use crate::scheduler::{EnvCache, PendingCache, Policy, plan_pending, preemptions, reslice};

pub struct Scheduler {
    pub cluster: Cluster,
    /// The base policy; ordering, backfill and their knobs come from the replicated
    /// `ClusterState::scheduler` at every pass.
    pub policy: Policy,
    pub tick: Duration,
}

impl Scheduler {
    pub async fn run(self, cancel: CancellationToken) {
        let mut applied = self.cluster.state.subscribe();
        // An interval, not a sleep raced against changes: under a steady stream of writes a
        // fresh sleep would never fire.
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut env = EnvCache::default();
        let mut pending = PendingCache::default();
        loop {
            let on_tick = tokio::select! {
                () = cancel.cancelled() => return,
                _ = applied.changed() => false,
                _ = tick.tick() => true,
            };
            if !self.cluster.view().is_leader {
                env = EnvCache::default();
                pending = PendingCache::default();
                continue;
            }
            let now_ms = crate::clock::now_ms();
            let (pass, preempt, reslices) = self.cluster.state.read(|s| {
                // The replicated settings decide ordering and backfill; `self.policy` keeps
                // the agent-local knobs (batch size).
                let mut policy = self.policy.with_settings(&s.scheduler);
                policy.explain &= on_tick;
                let env = env.get(s, &policy, now_ms, on_tick);
                let pending = pending.get(s, policy.ordering);
                let pass = plan_pending(s, &policy, env, pending);
                // Preempt only when nothing can be placed the ordinary way.
                let preempt = if pass.binds.is_empty() && pass.slice_binds.is_empty() {
                    preemptions(s, &policy, env, pending)
                } else {
                    Vec::new()
                };
                let reslices = reslice(s, &pass, pending);
                (pass, preempt, reslices)
            });
            for r in reslices {
                let cmd = Command::SetGpuPartition {
                    node: r.node,
                    gpu: r.gpu,
                    partition: r.partition.clone(),
                    if_idle: true,
                };
                match self.cluster.write(cmd).await {
                    Ok(ApplyResult::Ok) => {
                        info!(node_id = r.node, gpu = r.gpu, partition = %r.partition, "re-sliced an idle GPU for the queue");
                    }
                    Ok(other) => warn!(?other, "unexpected result for a re-slicing"),
                    Err(crate::raft::ClusterError::Rejected(why)) => {
                        debug!(%why, "re-slicing refused by apply (the GPU is busy)");
                    }
                    Err(e) => warn!(error = %e, "could not propose a re-slicing"),
                }
            }
            if !preempt.is_empty() {
                match self
                    .cluster
                    .write(Command::PreemptJobs {
                        preemptions: preempt,
                    })
                    .await
                {
                    Ok(ApplyResult::Preempted {
                        preempted,
                        rejected,
                    }) => {
                        info!(?preempted, rejected = rejected.len(), "preempting");
                        for (job_id, reason) in rejected {
                            debug!(job_id, %reason, "preemption refused by apply");
                        }
                    }
                    Ok(other) => warn!(?other, "unexpected result for a preemption batch"),
                    Err(e) => warn!(error = %e, "could not propose preemptions"),
                }
            }
            if !pass.binds.is_empty() {
                match self
                    .cluster
                    .write(Command::BindJobs { binds: pass.binds })
                    .await
                {
                    Ok(ApplyResult::Bound { bound, rejected }) => {
                        debug!(
                            bound = bound.len(),
                            rejected = rejected.len(),
                            "scheduler pass"
                        );
                        for (job_id, reason) in rejected {
                            debug!(job_id, %reason, "placement refused by apply");
                        }
                    }
                    Ok(other) => warn!(?other, "unexpected result for a bind batch"),
                    Err(e) => warn!(error = %e, "could not propose placements"),
                }
            }
            if !pass.slice_binds.is_empty() {
                match self
                    .cluster
                    .write(Command::BindSlices {
                        binds: pass.slice_binds,
                    })
                    .await
                {
                    Ok(ApplyResult::Bound { bound, rejected }) => {
                        debug!(
                            bound = bound.len(),
                            rejected = rejected.len(),
                            "slice placements"
                        );
                        for (job_id, reason) in rejected {
                            debug!(job_id, %reason, "slice placement refused by apply");
                        }
                    }
                    Ok(other) => warn!(?other, "unexpected result for a slice bind batch"),
                    Err(e) => warn!(error = %e, "could not propose slice placements"),
                }
            }
            if !pass.unschedulable.is_empty()
                && let Err(e) = self
                    .cluster
                    .write(Command::NoteUnschedulable {
                        reasons: pass.unschedulable,
                    })
                    .await
            {
                warn!(error = %e, "could not record pending reasons");
            }
        }
    }
}
