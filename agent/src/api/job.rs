//! Public `JobService`: submit, inspect, cancel jobs, and read their output from the node that
//! ran them.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use gpu_proto::internal::v1::ReadRunLogRequest;
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_server::JobService;
use gpu_raft_store::retention::ArchivedJob;
use gpu_raft_store::{
    ApplyResult, ClusterState, Command, Job, JobId, JobSpec, JobState, JobUpdate, Rejection,
    slice_fit, tenant, validate,
};
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use crate::api::auth::rbac::Action;
use crate::api::auth::{Auth, Caller};
use crate::api::from_proto;
use crate::api::job_filter::JobFilter;
use crate::api::job_list::{DEFAULT_PAGE, MAX_PAGE, fold, page_newest_first, page_of};
use crate::api::job_watch::{self, WatchStream};
use crate::api::log_target;
use crate::api::logs::{self, LogRequest, LogStream};
use crate::api::status::{invalid, rejected};
use crate::api::to_proto;
use crate::clock::now_ms;
use crate::raft::archive_fill::{archive_complete, archive_failed};
use crate::raft::peer_client::with_deadline;
use crate::raft::{Cluster, ClusterError};
use crate::scheduler::{self, PlanEnv, Policy};

pub(crate) struct JobApi {
    pub cluster: Cluster,
    pub auth: Auth,
    /// Where this agent keeps its jobs' directories (for local log reads).
    pub jobs_dir: std::path::PathBuf,
    /// The most tasks one array may have (`api.max_array_tasks`).
    pub max_array_tasks: u64,
    /// The open `WatchJobs` streams (`job_watch::MAX_WATCHERS` at most).
    pub watchers: Arc<Semaphore>,
}

/// A job as the API shows it, with the UUIDs of its GPUs.
pub(crate) fn job_view(state: &ClusterState, job: &Job) -> pb::Job {
    let uuids: BTreeMap<u32, String> = job
        .binding
        .as_ref()
        .and_then(|b| state.nodes.get(&b.node))
        .map(|n| {
            n.inventory
                .gpus
                .iter()
                .map(|g| (g.index, g.uuid.clone()))
                .collect()
        })
        .unwrap_or_default();
    pb::Job {
        energy_mj: state.energy.by_job.get(&job.id).copied().unwrap_or(0),
        ..to_proto::job(job, &uuids)
    }
}

/// An archived job as the API shows it: the energy it took with it.
fn archived_view(state: &ClusterState, archived: &ArchivedJob) -> pb::Job {
    pb::Job {
        energy_mj: archived.energy_mj,
        ..job_view(state, &archived.job)
    }
}

impl JobApi {
    fn get(&self, id: JobId) -> Result<pb::Job, Status> {
        if let Some(job) = self
            .cluster
            .state
            .read(|s| s.jobs.get(&id).map(|j| job_view(s, j)))
        {
            return Ok(job);
        }
        let archived = self.archived(id)?;
        Ok(self.cluster.state.read(|s| archived_view(s, &archived)))
    }

    /// Job `id` as it was archived. Looked for after the state: a job leaves the state and
    /// enters the archive under one lock, so one read or the other finds it.
    fn archived(&self, id: JobId) -> Result<ArchivedJob, Status> {
        let found = (self.cluster.state.archive().job(id)).map_err(archive_failed)?;
        match found {
            Some(archived) => Ok(archived),
            None => {
                archive_complete(&self.cluster.state)?;
                Err(rejected(Rejection::UnknownJob { job: id }))
            }
        }
    }

    /// Job `id`, from the state or the archive.
    fn job(&self, id: JobId) -> Result<Job, Status> {
        match self.cluster.state.read(|s| s.jobs.get(&id).cloned()) {
            Some(job) => Ok(job),
            None => self.archived(id).map(|a| a.job),
        }
    }

    /// The `wanted` jobs that finished at `since_ms` or later, at most `limit`: the archive's,
    /// then the state's, each in the order they finished (the archive takes the earliest
    /// finished first, so the whole is in that order but for clock skew between leaders).
    fn finished_since(
        &self,
        since_ms: u64,
        limit: usize,
        wanted: impl Fn(&Job) -> bool,
    ) -> Result<Vec<pb::Job>, Status> {
        archive_complete(&self.cluster.state)?;
        let finished_at = |j: &Job| j.finished_at_ms.unwrap_or(j.submitted_at_ms);
        // The state first: a job archived after this read is then in the archive, and one
        // archived before it is not in this copy (no job is listed twice or missed).
        let mut kept: Vec<Job> = self.cluster.state.read(|s| {
            (s.jobs.values())
                .filter(|j| j.state.is_terminal() && finished_at(j) >= since_ms && wanted(j))
                .cloned()
                .collect()
        });
        kept.sort_by_key(|j| (finished_at(j), j.id));
        let in_state: HashSet<JobId> = kept.iter().map(|j| j.id).collect();
        let mut archived = Vec::new();
        for a in self.cluster.state.archive().finished_since(since_ms) {
            let a = a.map_err(archive_failed)?;
            if archived.len() == limit {
                break;
            }
            if wanted(&a.job) && !in_state.contains(&a.job.id) {
                archived.push(a);
            }
        }
        Ok(self.cluster.state.read(|s| {
            let archived = archived.iter().map(|a| archived_view(s, a));
            let kept = kept.iter().map(|j| job_view(s, j));
            archived.chain(kept).take(limit).collect()
        }))
    }

    /// The tenant a job belongs to, for authorization. A job's tenant never changes, so a local
    /// hit is final; a miss may only mean this replica lags (the job was just submitted through
    /// another agent), so it is confirmed with a linearizable read before saying "not found".
    async fn tenant_of(&self, id: JobId) -> Result<String, Status> {
        let local = || {
            self.cluster
                .state
                .read(|s| s.jobs.get(&id).map(|j| j.spec.tenant.clone()))
        };
        if let Some(tenant) = local() {
            return Ok(tenant);
        }
        self.cluster.linearizable_read().await?;
        match local() {
            Some(tenant) => Ok(tenant),
            None => self.archived(id).map(|a| a.job.spec.tenant),
        }
    }

    /// The preamble of every request about one job: authenticate the caller (default deny)
    /// for `verb`, with `fresh` wait for a linearizable read, then check that the caller may
    /// `access` the job's tenant.
    async fn caller_for_job<T>(
        &self,
        req: &Request<T>,
        verb: &str,
        id: JobId,
        access: Access,
        fresh: bool,
    ) -> Result<Caller, Status> {
        let caller = self
            .auth
            .authenticate(req, verb, &format!("job/j-{id}"))
            .await?;
        if fresh {
            self.cluster.linearizable_read().await?;
        }
        let tenant = self.tenant_of(id).await?;
        let action = match access {
            Access::Read => Action::ReadJob(&tenant),
            Access::Write => Action::WriteJob(&tenant),
        };
        self.auth.require(&caller, action).await?;
        Ok(caller)
    }

    /// Hold or release a job or a whole array, answering with the job (the array's first
    /// task) as it is afterwards.
    async fn set_hold(
        &self,
        req: Request<pb::HoldJobRequest>,
        hold: bool,
    ) -> Result<Response<pb::Job>, Status> {
        let pb::HoldJobRequest { id, array_index } = *req.get_ref();
        let verb = if hold { "job.hold" } else { "job.release" };
        let caller = self
            .caller_for_job(&req, verb, id, Access::Write, false)
            .await?;
        let (id, command) = match self.target(id, array_index)? {
            Target::Job(job) => (job, Command::HoldJob { job, hold }),
            Target::Array(array) => (array, Command::HoldArray { array, hold }),
        };
        self.cluster.write_as(command, caller.on_behalf()).await?;
        Ok(Response::new(self.get(id)?))
    }

    /// What a request's job id and task index name: with an index, that task of array `id`;
    /// without, the whole array when `id` is one (Slurm's `scancel 7`), else job `id`. Called
    /// after `caller_for_job(id)`, which has seen the job (a task's tenant is its array's).
    fn target(&self, id: JobId, array_index: Option<u32>) -> Result<Target, Status> {
        let job = self.job(id)?;
        if let Some(index) = array_index {
            return task_of(&job, index).map(Target::Job);
        }
        let head = job.array_task.is_some_and(|t| t.array == id);
        Ok(if head {
            Target::Array(id)
        } else {
            Target::Job(id)
        })
    }
}

/// The id of the task of index `index` of the array `head` names (its first task).
fn task_of(head: &Job, index: u32) -> Result<JobId, Status> {
    let id = head.id;
    let position = (head.array_task.filter(|t| t.array == id))
        .and(head.spec.array.as_ref())
        .and_then(|a| a.position(index))
        .ok_or_else(|| {
            rejected(Rejection::Invalid {
                message: format!("j-{id} is not an array with a task of index {index}"),
            })
        })?;
    Ok(id + position)
}

/// A job, or every task of an array.
enum Target {
    Job(JobId),
    Array(JobId),
}

impl Target {
    /// The id, and whether it stands for a whole array.
    fn parts(self) -> (JobId, bool) {
        match self {
            Target::Job(job) => (job, false),
            Target::Array(array) => (array, true),
        }
    }
}

/// Whether a request reads a job or changes it.
#[derive(Clone, Copy)]
enum Access {
    Read,
    Write,
}

#[tonic::async_trait]
impl JobService for JobApi {
    async fn submit_job(
        &self,
        req: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        // Who first (default deny), then what: the spec is only looked at for a known caller.
        let mut caller = self
            .auth
            .authenticate(&req, "job.submit", "job/new")
            .await?;
        let r = req.into_inner();
        let mut wire = r.spec.ok_or_else(|| invalid("spec is required"))?;
        // A job that names no tenant is its token's tenant's, else the default tenant's.
        if wire.tenant.is_empty()
            && let Some(own) = &caller.identity.tenant
        {
            wire.tenant.clone_from(own);
        }
        let priority_unset = wire.priority.is_none();
        let mut spec = from_proto::spec(wire).map_err(invalid)?;
        let role = caller.identity.role;
        let priority_allowed = self.cluster.state.read(|s| {
            if priority_unset {
                // A job without a priority of its own gets its tenant's default (0 without a
                // record), decided here so the log carries the value the job runs with.
                spec.priority = s
                    .tenants
                    .get(&spec.tenant)
                    .map_or(0, |t| t.default_priority);
            }
            // Who it runs as is the cluster's decision, never the client's (the wire spec has
            // no such field): the token's mapping, else the tenant's default, else none (the
            // executing node's own `jobs.run_as`). Stamped here, so the log carries it and
            // every node runs the job as the same account.
            spec.account = s.account_for(&caller.identity.token_id, &spec.tenant);
            tenant::check_priority(spec.priority, s.tenants.get(&spec.tenant), role)
        });
        priority_allowed.map_err(invalid)?;
        validate::job_spec(&spec).map_err(invalid)?;
        if let Some(array) = &spec.array {
            array
                .validate(self.max_array_tasks)
                .map_err(|e| invalid(format!("{e} (api.max_array_tasks)")))?;
        }
        // A slice no GPU of the cluster (of the requested type) can hold would wait forever.
        self.cluster
            .state
            .read(|s| {
                slice_fit::check_inventory(
                    &spec,
                    s.nodes.values().flat_map(|n| n.inventory.gpus.iter()),
                )
            })
            .map_err(invalid)?;
        let key = (!r.idempotency_key.is_empty()).then_some(r.idempotency_key);
        if let Some(k) = &key {
            validate::idempotency_key(k).map_err(invalid)?;
        }
        caller.meta.object = format!("job/{}", spec.name);
        self.auth
            .require(&caller, Action::WriteJob(&spec.tenant))
            .await?;
        let submit = |spec: JobSpec| Command::SubmitJob {
            spec: Box::new(spec),
            idempotency_key: key.clone(),
            hold: r.hold,
            owner: None,
        };
        let written = match self
            .cluster
            .write_as(submit(spec.clone()), caller.on_behalf())
            .await
        {
            // This replica lagged behind a change of the account mapping: `apply` stamps
            // nothing itself but refuses a stale stamp, so stamp again from the leader's
            // state (a linearizable read) and submit once more.
            Err(ClusterError::Rejected(Rejection::AccountChanged { .. })) => {
                self.cluster.linearizable_read().await?;
                spec.account = self
                    .cluster
                    .state
                    .read(|s| s.account_for(&caller.identity.token_id, &spec.tenant));
                self.cluster
                    .write_as(submit(spec), caller.on_behalf())
                    .await?
            }
            other => other?,
        };
        match written {
            ApplyResult::JobSubmitted { job, existing } => {
                Ok(Response::new(pb::SubmitJobResponse {
                    job_id: job,
                    existing,
                }))
            }
            other => Err(Status::internal(format!(
                "unexpected submit result {other:?}"
            ))),
        }
    }

    async fn get_job(&self, req: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        let pb::GetJobRequest {
            id,
            stale,
            array_index,
        } = *req.get_ref();
        self.caller_for_job(&req, "job.get", id, Access::Read, !stale)
            .await?;
        let id = match array_index {
            Some(index) => task_of(&self.job(id)?, index)?,
            None => id,
        };
        Ok(Response::new(self.get(id)?))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let caller = self.auth.authenticate(&req, "job.list", "job/*").await?;
        let req = req.into_inner();
        let filter = JobFilter::of(&req).map_err(invalid)?;
        if !req.stale {
            self.cluster.linearizable_read().await?;
        }
        let page = match req.page_size {
            0 => DEFAULT_PAGE,
            n => (n as usize).min(MAX_PAGE),
        };
        let limit = match req.limit {
            0 => page,
            n => (n as usize).min(page),
        };
        let visible = |tenant: &str| caller.identity.may(Action::ReadJob(tenant)).is_ok();
        let wanted = |j: &Job| visible(&j.spec.tenant) && filter.matches(j);
        if req.newest_first && req.finished_since_ms.is_none() {
            let (jobs, next_before_id) = self.cluster.state.read(|s| {
                let view = |j: &Job| job_view(s, j);
                page_newest_first(s, req.before_id, limit, req.fold_arrays, &wanted, view)
            });
            return Ok(Response::new(pb::ListJobsResponse {
                jobs,
                next_after_id: None,
                next_before_id,
            }));
        }
        let (jobs, next_after_id) = match req.finished_since_ms {
            None => self.cluster.state.read(|s| {
                let view = |j: &Job| job_view(s, j);
                page_of(s, req.after_id, limit, req.fold_arrays, &wanted, view)
            }),
            Some(since) if req.fold_arrays => {
                // Lines, not jobs, are limited: an array's tasks are all read to be counted.
                let views = self.finished_since(since, usize::MAX, wanted)?;
                let of = |v: &pb::Job| (v.array_id, from_proto::job_state(v.state));
                (fold(views.into_iter(), limit, of, |v| v), None)
            }
            Some(since) => (self.finished_since(since, limit, wanted)?, None),
        };
        Ok(Response::new(pb::ListJobsResponse {
            jobs,
            next_after_id,
            next_before_id: None,
        }))
    }

    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let pb::CancelJobRequest { id, array_index } = *req.get_ref();
        let caller = self
            .caller_for_job(&req, "job.cancel", id, Access::Write, false)
            .await?;
        let (id, command) = match self.target(id, array_index)? {
            Target::Job(job) => (job, Command::CancelJob { job }),
            Target::Array(array) => (array, Command::CancelArray { array }),
        };
        match self.cluster.write_as(command, caller.on_behalf()).await {
            // Cancelling is idempotent: a job already cancelled is what was asked for, whether
            // an earlier request did it or this one, retried at a new leader after its first
            // try had committed.
            Ok(_)
            | Err(ClusterError::Rejected(Rejection::JobFinished {
                state: JobState::Cancelled,
                ..
            })) => Ok(Response::new(self.get(id)?)),
            Err(e) => Err(e.into()),
        }
    }

    async fn hold_job(
        &self,
        req: Request<pb::HoldJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        self.set_hold(req, true).await
    }

    async fn release_job(
        &self,
        req: Request<pb::HoldJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        self.set_hold(req, false).await
    }

    async fn update_job(
        &self,
        req: Request<pb::UpdateJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let pb::UpdateJobRequest {
            id,
            array_index,
            priority,
            wall_time_limit_s,
            gpus,
        } = *req.get_ref();
        let caller = self
            .caller_for_job(&req, "job.update", id, Access::Write, false)
            .await?;
        let update = JobUpdate {
            priority,
            wall_time_limit_s,
            gpus,
        };
        let (id, array) = self.target(id, array_index)?.parts();
        let job = self.job(id)?;
        let checked = self.cluster.state.read(|s| {
            if let Some(p) = priority {
                let record = s.tenants.get(&job.spec.tenant);
                tenant::check_priority(p, record, caller.identity.role)?;
            }
            let spec = update.applied_to(&job.spec)?;
            slice_fit::check_inventory(
                &spec,
                s.nodes.values().flat_map(|n| n.inventory.gpus.iter()),
            )
        });
        checked.map_err(invalid)?;
        let command = Command::UpdateJob {
            job: id,
            array,
            update,
        };
        self.cluster.write_as(command, caller.on_behalf()).await?;
        Ok(Response::new(self.get(id)?))
    }

    async fn requeue_job(
        &self,
        req: Request<pb::RequeueJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let pb::RequeueJobRequest { id, array_index } = *req.get_ref();
        let caller = self
            .caller_for_job(&req, "job.requeue", id, Access::Write, false)
            .await?;
        let (id, array) = self.target(id, array_index)?.parts();
        let command = Command::RequeueJob { job: id, array };
        self.cluster.write_as(command, caller.on_behalf()).await?;
        Ok(Response::new(self.get(id)?))
    }

    type JobLogsStream = LogStream;

    async fn job_logs(
        &self,
        req: Request<pb::JobLogsRequest>,
    ) -> Result<Response<LogStream>, Status> {
        let id = req.get_ref().job_id;
        self.caller_for_job(&req, "job.logs", id, Access::Read, false)
            .await?;
        let req = req.into_inner();
        let target = log_target::resolve(&self.job(req.job_id)?, req.rank, req.attempt)?;
        if target.node == self.cluster.id {
            let local = LogRequest::of(&req, target.generation);
            let stream = logs::stream(&self.jobs_dir, self.cluster.clone(), local)?;
            return Ok(Response::new(stream));
        }
        let node = target.node;
        let (addr, protocol) = self
            .cluster
            .state
            .read(|s| s.nodes.get(&node).map(|n| (n.addr.clone(), n.protocol)))
            .ok_or_else(|| Status::unavailable(format!("node n{node} is not registered")))?;
        let mut client = self.cluster.peers.get(&addr)?;
        let deadline = if req.follow {
            std::time::Duration::from_secs(24 * 3600)
        } else {
            std::time::Duration::from_secs(30)
        };
        // An agent from before protocol 3 serves only the rank-0 log of the latest run.
        let upstream = if protocol >= gpu_raft_store::PROTOCOL_3 {
            let run = ReadRunLogRequest {
                job_id: req.job_id,
                generation: target.generation,
                stream: req.stream,
                follow: req.follow,
                offset: req.offset,
            };
            client.read_run_log(with_deadline(run, deadline)).await?
        } else if target.rank == 0 && target.latest {
            client.read_job_log(with_deadline(req, deadline)).await?
        } else {
            return Err(Status::failed_precondition(format!(
                "node n{node} runs an agent too old to serve any log but the latest run's rank 0; upgrade it"
            )));
        };
        Ok(Response::new(Box::pin(upstream.into_inner())))
    }

    type WatchJobsStream = WatchStream;

    async fn watch_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let caller = self.auth.authenticate(&req, "job.watch", "job/*").await?;
        let filter = JobFilter::of(req.get_ref()).map_err(invalid)?;
        let permit = job_watch::admit(&self.watchers)?;
        let state = self.cluster.state.clone();
        let stream = job_watch::watch(state, filter, caller.identity, permit, job_view);
        Ok(Response::new(stream))
    }

    async fn explain_job(
        &self,
        req: Request<pb::ExplainJobRequest>,
    ) -> Result<Response<pb::JobExplanation>, Status> {
        let pb::ExplainJobRequest { id, stale } = *req.get_ref();
        self.caller_for_job(&req, "job.why", id, Access::Read, !stale)
            .await?;
        // Copy under the lock, run the planner forward outside it (and off the async workers).
        let copy = self.cluster.state.read(scheduler::planning_copy);
        let now = now_ms();
        let explained = tokio::task::spawn_blocking(move || {
            let policy = Policy::default().with_settings(&copy.scheduler);
            let env = PlanEnv::from_state(&copy, &policy, now);
            scheduler::explain(&copy, &policy, &env, id).map(|e| (e, policy.spec()))
        })
        .await
        .map_err(|e| Status::internal(format!("explaining job j-{id}: {e}")))?;
        let (e, policy) = explained.ok_or_else(|| rejected(Rejection::UnknownJob { job: id }))?;
        Ok(Response::new(to_proto::job_explanation(id, &e, policy)))
    }
}
