//! Applying preemption: only downward or a reclaim from a borrowing tenant, never for a
//! borrower, re-checked here for every preemption the leader proposes.

use std::collections::BTreeMap;

use crate::model::command::Preempt;
use crate::model::job::{Job, JobState};
use crate::model::outcome::ApplyResult;
use crate::model::scheduler::Preemption;
use crate::model::state::ClusterState;
use crate::model::tenant;

impl ClusterState {
    pub(crate) fn preempt_all(&mut self, preemptions: &[Preempt], now_ms: u64) -> ApplyResult {
        let held = tenant::held_by_type(&self.jobs, &self.nodes);
        let mut preempted = Vec::new();
        let mut rejected = Vec::new();
        for p in preemptions {
            match self.check_preemption(&held, p, now_ms) {
                Ok(_) => {
                    if let Some(j) = self.jobs.get_mut(&p.job) {
                        j.evict_requested = true;
                        j.preempted_for = Some(p.for_job);
                    }
                    preempted.push(p.job);
                }
                Err(reason) => rejected.push((p.job, reason)),
            }
        }
        ApplyResult::Preempted {
            preempted,
            rejected,
        }
    }

    /// Whether preemption `p` is allowed at `now_ms`, and of which kind (`reclaim`,
    /// `starving gang` or `priority`): the rule the leader plans with and `apply` enforces.
    /// Only a live run not already stopping may be preempted, only for a pending job, never so
    /// that a tenant can borrow (hold more than its guarantee of a type the run's GPUs are),
    /// and only to take GPUs back from a tenant borrowing them (reclaim), for a gang pending
    /// longer than the starvation guard's limit from a single-node run of no higher priority
    /// (a starving gang), or, with `priority` preemption on, from a job of strictly lower
    /// priority.
    pub fn check_preemption(
        &self,
        held: &BTreeMap<(String, String), u32>,
        p: &Preempt,
        now_ms: u64,
    ) -> Result<&'static str, String> {
        let mode = self.scheduler.preemption;
        if mode == Preemption::Off {
            return Err("preemption is off".into());
        }
        let victim = self
            .jobs
            .get(&p.job)
            .ok_or_else(|| format!("job j-{} does not exist", p.job))?;
        if !victim.state.is_live() || victim.generation != p.generation {
            return Err(format!(
                "run g{} of j-{} is not live (now {} g{})",
                p.generation, p.job, victim.state, victim.generation
            ));
        }
        if victim.evict_requested || victim.cancel_requested {
            return Err(format!("j-{} is already stopping", p.job));
        }
        let placed_ms = victim.bound_at_ms.unwrap_or(0);
        let from_ms = self.scheduler.preemptible_from_ms(placed_ms);
        if now_ms < from_ms {
            return Err(format!(
                "j-{} was placed {} s ago: runs are exempt from preemption for their first {} s",
                p.job,
                now_ms.saturating_sub(placed_ms) / 1000,
                self.scheduler.preempt_exempt_s
            ));
        }
        let ben = self
            .jobs
            .get(&p.for_job)
            .ok_or_else(|| format!("job j-{} does not exist", p.for_job))?;
        if ben.state != JobState::Pending || ben.spec.gpus == 0 {
            return Err(format!(
                "j-{} is not a pending GPU job, nothing to preempt for",
                p.for_job
            ));
        }
        let held_of = |tenant: &str, t: &str| {
            held.get(&(tenant.to_owned(), t.to_owned()))
                .copied()
                .unwrap_or(0)
        };
        let mut types: Vec<&str> = tenant::bound_types(victim, &self.nodes).collect();
        types.sort_unstable();
        types.dedup();
        let ben_record = self.tenants.get(&ben.spec.tenant);
        let victim_record = self.tenants.get(&victim.spec.tenant);
        for t in &types {
            if let Some(q) = ben_record.and_then(|r| r.quota(t))
                && held_of(&ben.spec.tenant, t).saturating_add(ben.spec.gpus) > q.guaranteed
            {
                return Err(format!(
                    "j-{} would borrow {t} GPUs beyond tenant {}'s guarantee of {}: no job is preempted for a borrower",
                    p.for_job, ben.spec.tenant, q.guaranteed
                ));
            }
        }
        let reclaim = victim.spec.tenant != ben.spec.tenant
            && !types.is_empty()
            && types.iter().all(|t| {
                ben_record.and_then(|r| r.quota(t)).is_some()
                    && victim_record
                        .and_then(|r| r.quota(t))
                        .is_some_and(|q| held_of(&victim.spec.tenant, t) > q.guaranteed)
            });
        if reclaim {
            return Ok("reclaim");
        }
        if self.is_starving_gang(ben, now_ms)
            && victim.spec.nodes <= 1
            && victim.spec.priority <= ben.spec.priority
        {
            return Ok("starving gang");
        }
        if mode == Preemption::Priority && victim.spec.priority < ben.spec.priority {
            return Ok("priority");
        }
        Err(format!(
            "j-{} (priority {}) is not of lower priority than j-{} (priority {}) and its tenant is not borrowing what j-{} is guaranteed",
            p.job, victim.spec.priority, p.for_job, ben.spec.priority, p.for_job
        ))
    }

    /// Whether `job` is a gang (`JobSpec::nodes` > 1) that has been pending longer than the
    /// starvation guard's limit (`SchedulerSettings::gang_wait_limit_s`) at `now_ms`.
    pub fn is_starving_gang(&self, job: &Job, now_ms: u64) -> bool {
        job.state == JobState::Pending
            && job.spec.nodes > 1
            && self
                .scheduler
                .gang_wait_limit_ms()
                .is_some_and(|limit| now_ms.saturating_sub(job.submitted_at_ms) >= limit)
    }
}
