//! Applying a job's life: submission (idempotent per key), cancellation, the executor's
//! reports (started, finished: GPU time accounted, requeued or ended) and scheduler feedback.

use crate::model::audit::RequestMeta;
use crate::model::command::Submission;
use crate::model::job::{Job, JobSpec, JobState, Outcome, RunPhase, retry_delay_s, scoped_key};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::partition;
use crate::model::retention::spec_digest;
use crate::model::state::ClusterState;
use crate::model::validate;
use crate::{JobId, NodeId};

impl ClusterState {
    pub(crate) fn submit(
        &mut self,
        spec: &JobSpec,
        how: Submission<'_>,
        now: u64,
        meta: Option<&RequestMeta>,
    ) -> Result<ApplyResult, Rejection> {
        let key = how.key;
        validate::job_spec(spec).map_err(invalid)?;
        let scoped = match key {
            Some(k) => {
                validate::idempotency_key(k).map_err(invalid)?;
                let scoped = scoped_key(&spec.tenant, k);
                if let Some((job, same)) = self.key_holder(&scoped, spec) {
                    return if same {
                        Ok(ApplyResult::JobSubmitted {
                            job,
                            existing: true,
                        })
                    } else {
                        Err(Rejection::IdempotencyConflict {
                            key: k.to_owned(),
                            job,
                        })
                    };
                }
                Some(scoped)
            }
            None => None,
        };
        self.check_stamped_account(spec, meta)?;
        self.check_mounts(spec)?;
        if let Some(hook) = &spec.notify {
            let tenant_hook = self
                .tenants
                .get(&spec.tenant)
                .and_then(|t| t.webhook.as_ref());
            crate::model::webhook::check_job_webhook(hook, tenant_hook).map_err(invalid)?;
        }
        let jobs = Self::jobs_in(spec);
        self.check_pending_cap(spec, jobs)?;
        let waiting = self.unmet_dependencies(spec)?;
        let id = self.next_job_id.max(1);
        self.next_job_id = id + jobs;
        if let Some(scoped) = scoped {
            self.idempotency.insert(scoped, id);
        }
        self.insert_submitted(id, spec, how, &waiting, now);
        Ok(ApplyResult::JobSubmitted {
            job: id,
            existing: false,
        })
    }

    /// The job the scoped idempotency key `scoped` made, and whether it was made from `spec`:
    /// the job itself while the state holds it, else the digest its archived key kept.
    fn key_holder(&self, scoped: &str, spec: &JobSpec) -> Option<(JobId, bool)> {
        if let Some(&job) = self.idempotency.get(scoped) {
            // The account is the cluster's part of the spec, not the client's: a retry
            // stamped after the mapping changed is still the same request.
            let same = self.jobs.get(&job).is_some_and(|j| {
                j.spec
                    == JobSpec {
                        account: j.spec.account.clone(),
                        ..spec.clone()
                    }
            });
            return Some((job, same));
        }
        let archived = self.archived_keys.get(scoped)?;
        Some((archived.job, archived.spec_digest == spec_digest(spec)))
    }

    /// A tenant with a cap on pending jobs gets no more (`jobs` more) beyond that many.
    pub(super) fn check_pending_cap(&self, spec: &JobSpec, jobs: u64) -> Result<(), Rejection> {
        let Some(cap) = self
            .tenants
            .get(&spec.tenant)
            .and_then(|t| t.max_pending_jobs)
        else {
            return Ok(());
        };
        let pending = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending && j.spec.tenant == spec.tenant)
            .count();
        if pending as u64 + jobs > u64::from(cap) {
            return Err(Rejection::TooManyPending {
                tenant: spec.tenant.clone(),
                cap,
            });
        }
        Ok(())
    }

    /// A container job binds only host paths its tenant's record allows (no record: none).
    fn check_mounts(&self, spec: &JobSpec) -> Result<(), Rejection> {
        let Some(container) = &spec.container else {
            return Ok(());
        };
        let allowed = self
            .tenants
            .get(&spec.tenant)
            .map_or(&[][..], |t| t.allowed_mounts.as_slice());
        crate::model::container::check_allowed(container, allowed)
            .map_err(|message| Rejection::PermissionDenied { message })
    }

    /// An API submission runs as the account the state maps its token (else its tenant) to
    /// at this entry, whatever the API edge read from a replica that may lag: a stamp that
    /// differs is refused, and the edge stamps again from the leader's state. Submissions of
    /// the system (no request, or a `system:` actor) carry what they carry.
    fn check_stamped_account(
        &self,
        spec: &JobSpec,
        meta: Option<&RequestMeta>,
    ) -> Result<(), Rejection> {
        let Some(meta) = meta.filter(|m| !m.actor.starts_with("system:")) else {
            return Ok(());
        };
        let now = self.account_for(&meta.actor, &spec.tenant);
        if spec.account != now {
            return Err(Rejection::AccountChanged { now });
        }
        Ok(())
    }

    pub(crate) fn cancel(&mut self, job: JobId, now: u64) -> Result<ApplyResult, Rejection> {
        let j = self.job_mut(job)?;
        match j.state {
            JobState::Pending => {
                j.cancel_pending(now, None);
                self.job_log.record(job);
            }
            JobState::Bound | JobState::Running => j.cancel_requested = true,
            state => return Err(Rejection::JobFinished { job, state }),
        }
        Ok(ApplyResult::Ok)
    }

    pub(crate) fn started(
        &mut self,
        job: JobId,
        generation: u64,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let j = self.job_mut(job)?;
        match j.state {
            JobState::Bound if j.generation == generation => {
                j.state = JobState::Running;
                j.started_at_ms = Some(now);
                if let Some(run) = j.run_mut(generation) {
                    run.started_at_ms = Some(now);
                }
                self.job_log.record(job);
                Ok(ApplyResult::Ok)
            }
            JobState::Running if j.generation == generation => Ok(ApplyResult::Ok),
            state => Err(Rejection::Stale {
                job,
                generation,
                current: j.generation,
                state,
            }),
        }
    }

    /// The live run's phase (`None`: over). The text is checked here (length, no control
    /// characters): a refused report changes nothing.
    pub(crate) fn run_phase(
        &mut self,
        job: JobId,
        generation: u64,
        phase: Option<&str>,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        if let Some(text) = phase {
            validate::run_phase(text).map_err(invalid)?;
        }
        self.live_run(job, generation)?;
        let j = self.job_mut(job)?;
        let since_ms = j.live_phase().map_or(now, |p| p.since_ms);
        j.phase = phase.map(|text| RunPhase {
            generation,
            text: text.to_owned(),
            since_ms,
        });
        Ok(ApplyResult::Ok)
    }

    /// Job `job`, if run `generation` of it is the live one: a report about any other run (an
    /// earlier placement, or one that already ended) is stale.
    pub(crate) fn live_run(&self, job: JobId, generation: u64) -> Result<&Job, Rejection> {
        let j = self.jobs.get(&job).ok_or(Rejection::UnknownJob { job })?;
        if !j.state.is_live() || j.generation != generation {
            return Err(Rejection::Stale {
                job,
                generation,
                current: j.generation,
                state: j.state,
            });
        }
        Ok(j)
    }

    pub(crate) fn finished(
        &mut self,
        job: JobId,
        generation: u64,
        outcome: &Outcome,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let j = self.live_run(job, generation)?;
        // GPU time of this run, bind to end, by GPU type, in whole-GPU units (a slice counts
        // its fraction: MIG compute slices / 7, a share / 100).
        let held_ms = now.saturating_sub(j.bound_at_ms.unwrap_or(now));
        let slice = j.binding.as_ref().and_then(|b| b.slice.as_ref());
        let types: Vec<(String, (u64, u64))> = j
            .members()
            .flat_map(|b| {
                let node = self.nodes.get(&b.node);
                b.gpus.iter().map(move |&i| {
                    node.and_then(|n| n.gpu(i)).map_or_else(
                        || ("unknown".to_owned(), (1, 1)),
                        |g| {
                            let fraction = partition::normalized(slice, &g.model);
                            (g.gpu_type.clone(), fraction)
                        },
                    )
                })
            })
            .collect();
        let nodes: Vec<NodeId> = j.members().map(|b| b.node).collect();
        for n in nodes {
            if let Some(node) = self.nodes.get_mut(&n) {
                node.allocations.retain(|_, holder| *holder != job);
            }
            self.release_slices(n, job);
        }
        // The binding stays as the record of where the job last ran (for logs and history).
        let j = self.job_mut(job)?;
        for (t, (num, den)) in types {
            *j.gpu_ms.entry(t).or_insert(0) += held_ms.saturating_mul(num) / den.max(1);
        }
        j.outcome = Some(outcome.clone());
        j.phase = None;
        if let Some(run) = j.run_mut(generation) {
            run.outcome = Some(outcome.clone());
            run.finished_at_ms = Some(now);
        }
        let retry = retry_after(j, outcome);
        let requeue_requested = std::mem::take(&mut j.requeue_requested);
        j.cancel_requested = false;
        j.evict_requested = false;
        let requeue = match outcome {
            Outcome::Exited { code: 0 } => Some(JobState::Succeeded),
            Outcome::Cancelled => Some(JobState::Cancelled),
            Outcome::Evicted => {
                j.attempts = j.attempts.saturating_sub(1);
                None
            }
            Outcome::Lost { .. } | Outcome::Fenced if j.attempts < j.spec.max_attempts => None,
            _ if retry.is_some() => None,
            _ => Some(JobState::Failed),
        };
        match requeue {
            Some(terminal) => {
                j.state = terminal;
                j.finished_at_ms = Some(now);
                j.reason = (terminal == JobState::Failed).then(|| outcome.to_string());
            }
            None => {
                j.state = JobState::Pending;
                j.reason = Some(match (outcome, j.preempted_for, retry) {
                    (Outcome::Evicted, Some(by), _) => format!("requeued: preempted for j-{by}"),
                    (Outcome::Evicted, None, _) if requeue_requested => {
                        "requeued on request".to_owned()
                    }
                    (_, _, Some(delay_s)) => {
                        j.not_before_ms = Some(now.saturating_add(delay_s.saturating_mul(1000)));
                        format!("requeued: {outcome}; {}", j.retry_note(delay_s))
                    }
                    _ => format!("requeued: {outcome}"),
                });
            }
        }
        self.job_log.record(job);
        Ok(ApplyResult::Ok)
    }

    /// The scheduler's reasons why pending jobs wait (jobs no longer pending are skipped).
    pub(crate) fn note_unschedulable(&mut self, reasons: &[(JobId, String)]) -> ApplyResult {
        for (id, reason) in reasons {
            if let Some(job) = self
                .jobs
                .get_mut(id)
                .filter(|j| j.state == JobState::Pending)
            {
                job.reason = Some(reason.clone());
            }
        }
        ApplyResult::Ok
    }
}

/// The wait in seconds before the job's next run, when the run that just ended with `outcome`
/// is to be retried: it failed on its own (`Outcome::is_failed_run`), the job has a retry
/// backoff and attempts left, and nobody asked to cancel it. A whole gang is retried as one:
/// the failed member's report ends every member's run.
fn retry_after(j: &Job, outcome: &Outcome) -> Option<u64> {
    let backoff = j.spec.retry_backoff_s?;
    let retry = outcome.is_failed_run() && !j.cancel_requested && j.attempts < j.spec.max_attempts;
    retry.then(|| retry_delay_s(backoff, j.attempts))
}
