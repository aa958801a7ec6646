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

use gpu_raft_store::{ApplyResult, Command, Preempt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::raft::{Cluster, ClusterError};
use crate::scheduler::{
    EnvCache, PendingCache, Plan, Policy, Reslice, plan_pending, preemptions, reslice,
};

pub(crate) struct Scheduler {
    pub cluster: Cluster,
    /// The base policy; ordering, backfill and their knobs come from the replicated
    /// `ClusterState::scheduler` at every pass.
    pub policy: Policy,
    pub tick: Duration,
}

/// What one pass decided.
struct Decisions {
    pass: Plan,
    preempt: Vec<Preempt>,
    reslices: Vec<Reslice>,
}

impl Scheduler {
    pub(crate) async fn run(self, cancel: CancellationToken) {
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
            let decisions = self.decide(&mut env, &mut pending, on_tick);
            self.carry_out(decisions).await;
        }
    }

    /// Plan one pass over the applied state with the replicated settings and the leader's
    /// clock as "now".
    fn decide(&self, env: &mut EnvCache, pending: &mut PendingCache, on_tick: bool) -> Decisions {
        let now_ms = crate::clock::now_ms();
        self.cluster.state.read(|s| {
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
            Decisions {
                pass,
                preempt,
                reslices,
            }
        })
    }

    /// Propose the pass's decisions: re-slicings first, then preemptions, placements and the
    /// reasons of what stays pending.
    async fn carry_out(&self, d: Decisions) {
        let Decisions {
            pass,
            preempt,
            reslices,
        } = d;
        for r in reslices {
            let what = format!("re-slicing n{}/{} to {}", r.node, r.gpu, r.partition);
            let cmd = Command::SetGpuPartition {
                node: r.node,
                gpu: r.gpu,
                partition: r.partition,
                if_idle: true,
            };
            if self.propose(&what, cmd).await {
                info!(
                    node_id = r.node,
                    gpu = r.gpu,
                    "re-sliced an idle GPU for the queue"
                );
            }
        }
        if !preempt.is_empty() {
            let cmd = Command::PreemptJobs {
                preemptions: preempt,
            };
            self.propose("preemptions", cmd).await;
        }
        if !pass.binds.is_empty() {
            let cmd = Command::BindJobs { binds: pass.binds };
            self.propose("placements", cmd).await;
        }
        if !pass.slice_binds.is_empty() {
            let cmd = Command::BindSlices {
                binds: pass.slice_binds,
            };
            self.propose("slice placements", cmd).await;
        }
        if !pass.unschedulable.is_empty() {
            let cmd = Command::NoteUnschedulable {
                reasons: pass.unschedulable,
            };
            self.propose("pending reasons", cmd).await;
        }
    }

    /// Propose one of the pass's decisions and log how apply answered it. Apply re-checks
    /// every decision, so a refusal is the normal end of a stale one, not an error. True when
    /// it applied as a whole.
    async fn propose(&self, what: &str, cmd: Command) -> bool {
        match self.cluster.write(cmd).await {
            Ok(ApplyResult::Ok) => return true,
            Ok(ApplyResult::Bound { bound, rejected }) => {
                debug!(
                    what,
                    bound = bound.len(),
                    rejected = rejected.len(),
                    "applied"
                );
                for (job_id, reason) in rejected {
                    debug!(what, job_id, %reason, "refused by apply");
                }
            }
            Ok(ApplyResult::Preempted {
                preempted,
                rejected,
            }) => {
                info!(?preempted, rejected = rejected.len(), "preempting");
                for (job_id, reason) in rejected {
                    debug!(what, job_id, %reason, "refused by apply");
                }
            }
            Ok(other) => warn!(what, ?other, "unexpected apply result"),
            Err(ClusterError::Rejected(why)) => debug!(what, %why, "refused by apply"),
            Err(e) => warn!(what, error = %e, "could not propose"),
        }
        false
    }
}
