//! `gpuctl job submit|list|get|logs|wait` (`why`: see `job_why.rs`; `cancel`, `hold` and
//! `release`: `job_bulk.rs`; the interactive `gpuctl run`: `run.rs`).
//!
//! JSON (stable):
//! - a job (`get`, `cancel`, `wait`; `list` prints an array of them) is
//!   `{"id", "name", "tenant" ("" = the default tenant), "state" ("pending"|"bound"|"running"|
//!   "succeeded"|"failed"|"cancelled"|"unknown"), "command": [argv], "env": {k: v}, "workdir"
//!   ("" = the job's own directory), "gpus" (requested count), "gpu_types": [type],
//!   "min_gpu_memory_mib", "node_selector": {k: v}, "priority", "runtime_estimate_s" (null when
//!   not given), "wall_time_limit_s" (null when none), "max_attempts", "cpu_millis" and
//!   "memory_mib" (null when no limit), "idempotency_key",
//!   "nodes" (1, or the gang's size), "submitted_at_ms", "attempts", "generation", "node_id"
//!   (null before placement; a gang's rank-0 node), "gang_nodes": [node id] (a gang's nodes in
//!   rank order; [] otherwise),
//!   "bound_gpus": [index], "gpu_uuids": [uuid], "reason" (why pending or why failed; ""),
//!   "outcome" (how the last run ended, in words; ""), "exit_code", "signal", "bound_at_ms",
//!   "started_at_ms", "finished_at_ms" (each null when unknown), "cancel_requested",
//!   "energy_mj" (what its GPUs used over all its runs, reported every 30 s),
//!   "retry_backoff_s" (null when failed runs are not retried), "not_before_ms" (a job
//!   requeued after a failed run waits until then; null otherwise), "runs": [{"attempt",
//!   "generation", "nodes": [node id, by rank], "bound_at_ms", "started_at_ms",
//!   "finished_at_ms", "outcome" ("" while it runs), "exit_code", "signal"}] (oldest first,
//!   the latest 32), "account" (the Unix account it runs as, decided at submission from the
//!   token's or the tenant's mapping: null (the node's own `jobs.run_as`), or `{"user", "group"
//!   (null: the user's own), "groups"}`), "phase" (what the live run does before its command
//!   starts, as its node last reported it: `"pulling image REF: copying layers (3)"`; "" when
//!   nothing of the kind), "phase_since_ms" (when that phase began; null without one),
//!   "after": ["ok:j-1", …] (the jobs it waits for, as submitted), "singleton", "waiting_for":
//!   [job id] (those of "after" not met yet), "held", "topology" (the level a gang's nodes
//!   must share: "nvlink-domain", "rack" or "block"; null: any)}`;
//! - `submit` prints `{"job_id", "existing"}` (`existing`: the idempotency key had already
//!   created this job);
//! - `logs` writes the job's output bytes unchanged, in both output modes (`--rank`, a gang
//!   member's; `--attempt`, an earlier run's).
//!
//! Exit codes: `wait` exits 0 when the job succeeded, 1 when it failed or was cancelled;
//! everything else exits 0 on success. Errors (and `wait` timing out) exit 2.

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;

use super::job_bulk::{self, Action};
use super::job_view::render_one;
use super::{Answer, Ctx, Failure, job_list, job_logs, job_submit, job_wait, job_why};
use crate::cli::JobVerb;
use crate::ids::JobRef;
use crate::units::now_ms;

pub(crate) async fn run(ctx: &Ctx, verb: JobVerb) -> Result<Answer, Failure> {
    let new = JobServiceClient::new;
    match verb {
        JobVerb::Submit(args) => job_submit::run(ctx, *args).await,
        JobVerb::List(args) => job_list::run(ctx, args).await,
        JobVerb::Get { id, stale } => {
            let req = pb::GetJobRequest {
                id: id.id,
                stale,
                array_index: id.task,
            };
            let job = ctx
                .call(new, req, async |mut c, r| c.get_job(r).await)
                .await?;
            Ok(Answer::ok(render_one(ctx.output, &job)))
        }
        JobVerb::Cancel(selection) => job_bulk::run(ctx, Action::Cancel, selection, now_ms()).await,
        JobVerb::Hold(selection) => job_bulk::run(ctx, Action::Hold, selection, now_ms()).await,
        JobVerb::Update { selection, change } => {
            job_bulk::run(ctx, Action::Update(change), selection, now_ms()).await
        }
        JobVerb::Requeue(selection) => {
            job_bulk::run(ctx, Action::Requeue, selection, now_ms()).await
        }
        JobVerb::Release(selection) => {
            job_bulk::run(ctx, Action::Release, selection, now_ms()).await
        }
        JobVerb::Why { id, stale } => {
            let id = resolve(ctx, id).await?;
            job_why::run(ctx, id, stale, now_ms()).await
        }
        JobVerb::Logs {
            id,
            follow,
            stderr,
            rank,
            attempt,
        } => {
            let source = job_logs::LogSource {
                job_id: resolve(ctx, id).await?,
                stderr,
                follow,
                rank,
                attempt,
            };
            job_logs::run(ctx, source).await
        }
        JobVerb::Wait { id } => job_wait::run(ctx, resolve(ctx, id).await?).await,
    }
}

/// The job id a reference names: the job's own, or (asked of the cluster) an array task's.
pub(super) async fn resolve(ctx: &Ctx, job: JobRef) -> Result<u64, Failure> {
    let Some(index) = job.task else {
        return Ok(job.id);
    };
    let req = pb::GetJobRequest {
        id: job.id,
        stale: false,
        array_index: Some(index),
    };
    let task = JobServiceClient::new;
    let found = ctx
        .call(task, req, async |mut c, r| c.get_job(r).await)
        .await?;
    Ok(found.id)
}
