//! `gpuctl job cancel|hold|release|update|requeue`: one action on every job selected by id and by filter
//! (name glob, state, tenant), one request per job; each job's answer is printed, and a job
//! the cluster refused makes the command fail after the others were tried.
//!
//! JSON (stable): one id and no filter prints the job (as `job get`); otherwise an array of
//! the jobs acted on.

use gpu_proto::glob_matches;
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;

use super::job_view::{job_json, jobs_table, render_one, state_of};
use super::{Answer, Ctx, Failure};
use crate::cli::{JobChange, JobSelection, JobStateArg};
use crate::client::CallError;
use crate::ids::JobRef;

/// What to do to each selected job.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Action {
    Cancel,
    Hold,
    Release,
    Update(JobChange),
    Requeue,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Cancel => "cancel",
            Action::Hold => "hold",
            Action::Release => "release",
            Action::Update(_) => "update",
            Action::Requeue => "requeue",
        }
    }
}

pub(crate) async fn run(
    ctx: &Ctx,
    action: Action,
    selection: JobSelection,
    now_ms: u64,
) -> Result<Answer, Failure> {
    let filtered =
        selection.name.is_some() || !selection.states.is_empty() || selection.tenant.is_some();
    if selection.ids.is_empty() && !filtered {
        return Err(Failure::Usage(format!(
            "job {}: name the jobs (ids, or --name, --state, --tenant)",
            action.verb()
        )));
    }
    let mut refs = selection.ids.clone();
    if filtered {
        let found = matching(ctx, &selection).await?;
        refs.extend(found.into_iter().map(|id| JobRef { id, task: None }));
    }
    refs.sort_unstable_by_key(|r| (r.id, r.task));
    refs.dedup();
    let single = selection.ids.len() == 1 && !filtered;
    let mut done = Vec::new();
    let mut refused = Vec::new();
    for job in refs {
        match act(ctx, action, job).await {
            Ok(answer) => done.push(answer),
            Err(e) => refused.push(format!("{}: {e}", name(job))),
        }
    }
    if !refused.is_empty() {
        // What was done is still worth saying before the failure.
        if !done.is_empty() {
            print!("{}", jobs_table(&done, now_ms));
        }
        return Err(Failure::Usage(format!(
            "job {} refused for {} of {} jobs:\n{}",
            action.verb(),
            refused.len(),
            refused.len() + done.len(),
            refused.join("\n")
        )));
    }
    if single && let [job] = done.as_slice() {
        return Ok(Answer::ok(render_one(ctx.output, job)));
    }
    Ok(ctx.answer_list(&done, job_json, |jobs| jobs_table(jobs, now_ms)))
}

/// `j-7` or `j-7[3]`.
fn name(job: JobRef) -> String {
    match job.task {
        Some(task) => format!("j-{}[{task}]", job.id),
        None => format!("j-{}", job.id),
    }
}

async fn act(ctx: &Ctx, action: Action, job: JobRef) -> Result<pb::Job, CallError> {
    let new = JobServiceClient::new;
    let (id, array_index) = (job.id, job.task);
    match action {
        Action::Cancel => {
            let req = pb::CancelJobRequest { id, array_index };
            ctx.call(new, req, async |mut c, r| c.cancel_job(r).await)
                .await
        }
        Action::Hold => {
            let req = pb::HoldJobRequest { id, array_index };
            ctx.call(new, req, async |mut c, r| c.hold_job(r).await)
                .await
        }
        Action::Release => {
            let req = pb::HoldJobRequest { id, array_index };
            ctx.call(new, req, async |mut c, r| c.release_job(r).await)
                .await
        }
        Action::Update(change) => {
            let req = pb::UpdateJobRequest {
                id,
                array_index,
                priority: change.priority,
                wall_time_limit_s: change.wall_time,
                gpus: change.gpus,
            };
            ctx.call(new, req, async |mut c, r| c.update_job(r).await)
                .await
        }
        Action::Requeue => {
            let req = pb::RequeueJobRequest { id, array_index };
            ctx.call(new, req, async |mut c, r| c.requeue_job(r).await)
                .await
        }
    }
}

/// The unfinished jobs that match every filter of `selection` (every task of an array).
async fn matching(ctx: &Ctx, selection: &JobSelection) -> Result<Vec<u64>, CallError> {
    let states: Vec<i32> = if selection.states.is_empty() {
        [
            JobStateArg::Pending,
            JobStateArg::Bound,
            JobStateArg::Running,
        ]
        .into_iter()
        .map(|s| state_of(s) as i32)
        .collect()
    } else {
        (selection.states.iter())
            .map(|s| state_of(*s) as i32)
            .collect()
    };
    let req = pb::ListJobsRequest {
        states,
        tenant: selection.tenant.clone().unwrap_or_default(),
        name: selection.name.clone().unwrap_or_default(),
        fold_arrays: false,
        ..Default::default()
    };
    let jobs = super::job_pages::list_all(ctx, req).await?;
    // Checked again: an agent from before the name filter ignores it.
    let name = selection.name.as_deref();
    Ok(jobs
        .iter()
        .filter(|j| {
            name.is_none_or(|glob| {
                glob_matches(glob, j.spec.as_ref().map_or("", |s| s.name.as_str()))
            })
        })
        .map(|j| j.id)
        .collect())
}
